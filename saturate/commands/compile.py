"""CLI `saturate compile`: emit C for a model, compile it, and report the workspace it needs."""

from __future__ import annotations

import argparse

from saturate.core.errors import SaturateError

NAME = "compile"
HELP = "emit C for a model and compile it to a shared library (model.c, weights.bin, model.so)"


def parse_shapes(specs: list[str]) -> dict[str, tuple[int, ...]]:
    """`name=1x3x224x224` pairs to a dict of shapes."""
    out = {}
    for spec in specs:
        name, _, dims = spec.partition("=")
        try:
            out[name] = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            raise SaturateError(f"bad --input-shape '{spec}': expected NAME=D1xD2x...") from None
        if not name or any(d < 1 for d in out[name]):
            raise SaturateError(f"bad --input-shape '{spec}': expected NAME=D1xD2x... with positive sizes")
    return out


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a .onnx file, a text graph (.sat) or example:NAME")
    parser.add_argument("-o", "--output", required=True, metavar="DIR", help="directory for model.c, weights.bin, model.so")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME=1x3x224x224",
                        help="static shape for an input whose shape is symbolic (repeatable)")


def run(args: argparse.Namespace) -> int:
    from saturate.frontend import load_graph
    from saturate.backend import compile_graph

    graph = load_graph(args.model)
    model = compile_graph(graph, out_dir=args.output, input_shapes=parse_shapes(args.input_shape))
    pl = model.emitted.plan
    print(f"wrote {model.directory}/model.c, weights.bin, model.so")
    print(f"{len(graph.nodes)} nodes in {len(pl.steps)} kernel steps "
          f"({sum(len(s.chain) for s in pl.steps)} fused into epilogues)")
    print(f"peak workspace: {pl.peak_bytes} bytes ({pl.peak_bytes / 2**20:.2f} MiB; arena {pl.arena_bytes}, "
          f"conv scratch {pl.scratch_bytes}; one buffer per value would take {pl.naive_bytes})")
    return 0
