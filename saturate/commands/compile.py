"""CLI `saturate compile`: emit C for a model, compile it, and report the workspace it needs."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from saturate.core.errors import SaturateError, one_line
from saturate.progress import add_quiet_flag, status

NAME = "compile"
HELP = ("emit C for a model and compile it to a shared library with a C header and a Python extension module "
        "(model.c, model.h, weights.bin, model.so, saturate_model.*.so); ops without a C kernel run in the numpy "
        "interpreter between C segments (DIR/segK/ per segment plus DIR/manifest.json)")


def parse_shapes(specs: list[str]) -> dict[str, tuple[int, ...]]:
    """`name=1x3x224x224` (or onnxsim's spelling, `name:1,3,224,224`) pairs to a dict of shapes."""
    out = {}
    for spec in specs:
        # A name may hold ':' (onnx::input_0): the onnxsim form splits at the last one.
        name, _, dims = spec.partition("=") if "=" in spec else spec.rpartition(":")
        try:
            out[name] = tuple(int(d) for d in re.split(r"[x,]", dims.lower()))
        except ValueError:
            raise SaturateError(f"bad --input-shape '{spec}': expected NAME=D1xD2x... or NAME:D1,D2,...") from None
        if not name or any(d < 1 for d in out[name]):
            raise SaturateError(f"bad --input-shape '{spec}': expected NAME=D1xD2x... or NAME:D1,D2,... "
                                f"with positive sizes")
    return out


def check_shapes(graph, shapes: dict[str, tuple[int, ...]]) -> None:
    """Every --input-shape names an input fed at run time and keeps its static dims."""
    inputs = [i for i in graph.inputs if i not in graph.constants]
    for name, dims in shapes.items():
        if name not in inputs:
            raise SaturateError(f"--input-shape '{name}': the model has no input '{name}'; its inputs are "
                                + ", ".join(f"'{i}'" for i in inputs))
        known = graph.info(name).shape
        if known is None:
            continue
        if len(known) != len(dims):
            raise SaturateError(f"--input-shape '{name}': input '{name}' has rank {len(known)} "
                                f"({'x'.join(map(str, known))}), not {len(dims)}")
        for k, (d, given) in enumerate(zip(known, dims)):
            if isinstance(d, int) and d != given:
                raise SaturateError(f"--input-shape '{name}': dim {k} of input '{name}' is static, {d}, "
                                    f"not {given}")


def check_static(graph, shapes: dict[str, tuple[int, ...]], command: str) -> None:
    """Every input fed at run time has a static shape, its own or from --input-shape: a symbolic
    one is refused naming the option that fixes it."""
    for name in graph.inputs:
        shape = graph.info(name).shape
        if name in graph.constants or name in shapes or shape is None or all(isinstance(d, int) for d in shape):
            continue
        example = ",".join(str(d) if isinstance(d, int) else "1" for d in shape)
        raise SaturateError(f"input '{name}' has shape ({', '.join(map(str, shape))}); {command} needs a static "
                            f"one: --input-shape {name}:{example}")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a .onnx file, a text graph (.sat) or example:NAME")
    parser.add_argument("-o", "--output", required=True, metavar="DIR",
                        help="directory for model.c, model.h, weights.bin, model.so and the extension module, built "
                             "beside it and renamed into place (an earlier compiled model there is replaced); a graph "
                             "cut by interpreter ops gets one such set per C segment in DIR/seg0, DIR/seg1, ... and "
                             "DIR/manifest.json (run order) with DIR/graph.onnx")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME=1x3x224x224",
                        help="static shape for an input whose shape is symbolic (repeatable)")
    add_quiet_flag(parser)


def run(args: argparse.Namespace) -> int:
    from saturate.frontend import load_graph
    from saturate.backend import compile_graph
    from saturate.backend.runtime import check_output_dir

    check_output_dir(Path(args.output))  # before any work
    with status(args.quiet, "load") as shown:
        graph = load_graph(args.model)
        shapes = parse_shapes(args.input_shape)
        check_shapes(graph, shapes)
        check_static(graph, shapes, "saturate compile")
        shown.stage("compile")
        model = compile_graph(graph, out_dir=args.output, input_shapes=shapes)
    from saturate.backend.build import BLAS_FILE, EXTENSION

    segs = model.segments
    if model.emitted is not None:
        print(f"wrote {model.directory}/model.c, model.h, weights.bin, model.so, {EXTENSION}, {BLAS_FILE}")
    else:
        print(f"wrote {model.directory}/manifest.json and {len(segs)} C segment(s)"
              + "".join(f"{', ' if k else ': '}{s.directory.name}/model.so" for k, s in enumerate(segs)))
    plans = [s.emitted.plan for s in segs]
    steps = sum(len(p.steps) for p in plans)
    fused = sum(len(s.chain) for p in plans for s in p.steps)
    c_nodes = sum(len(p.nodes) for p in model.partition.pieces if p.kind == "c")
    print(f"{len(graph.nodes)} nodes: {c_nodes} in C as {steps} kernel steps ({fused} fused into epilogues), "
          f"{len(model.partition.fallback)} in the interpreter, the rest folded at compile time")
    if model.fallback_ops:
        # Node names come from the model: escaped, so a terminal escape or line break in one prints as text.
        listed = "; ".join(f"{op} x{n} ({', '.join(names[:5])}{', ...' if n > 5 else ''})"
                           for op, n, names in model.fallback_ops)
        print(one_line(f"interpreter fallback: {listed}"))
    peak = sum(p.peak_bytes for p in plans)
    # Kernels allocate scratch of their own per extra thread: measured, it joins the workspace reported.
    cores = os.cpu_count() or 1
    own = {t: model.scratch_bytes(t) for t in sorted({1, cores})}
    at = ", ".join(f"{peak + b} bytes at {t} thread{'s' if t > 1 else ''}" for t, b in own.items())
    print(f"peak workspace: {at} ({(peak + own[cores]) / 2**20:.2f} MiB; arena {sum(p.arena_bytes for p in plans)}, "
          f"conv scratch {sum(p.scratch_bytes for p in plans)}, kernels' own scratch "
          f"{' / '.join(str(b) for b in own.values())} (measured); one buffer per value would take "
          f"{sum(p.naive_bytes for p in plans)})")
    return 0
