"""CLI `saturate bench`: numpy reference, ONNX Runtime and compiled C timed side by side."""

from __future__ import annotations

import argparse

from saturate.progress import add_quiet_flag, status

NAME = "bench"
HELP = "time a model on the numpy reference, ONNX Runtime and the compiled C backend"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a .onnx file, a text graph (.sat) or example:NAME")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for ORT and C, any count (default: every core this process may use)")
    parser.add_argument("--runs", type=int, default=10, help="timed runs per runtime (default 10)")
    parser.add_argument("--optimize", action="store_true", help="run saturate.optimize first (fold BN etc.)")
    parser.add_argument("--no-reference", action="store_true", help="skip the (slow) numpy reference")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME:1,3,224,224",
                        help="static shape for an input whose shape is symbolic (repeatable; NAME=1x3x224x224 "
                             "as compile takes it works too)")
    add_quiet_flag(parser)


def run(args: argparse.Namespace) -> int:
    from saturate.backend.bench import all_cores, format_table
    from saturate.commands.compile import parse_shapes
    from saturate.core.errors import SaturateError

    args.input_shape = parse_shapes(args.input_shape)     # a bad one is refused before any work
    if args.threads is None:
        args.threads = all_cores()
    if args.threads < 1:
        raise SaturateError(f"--threads must be at least 1, got {args.threads}")
    with status(args.quiet, "load") as shown:
        graph, rows = _bench(args, shown)
    title = (f"{args.model}{' (optimized)' if args.optimize else ''}: {len(graph.nodes)} nodes, "
             f"{args.threads} thread(s), median of {args.runs} interleaved runs, each after an untimed one")
    print(format_table(rows, title))
    return 0


def _bench(args: argparse.Namespace, shown):
    """Load (and optimize) the model, then time it, naming each stage on the progress line."""
    from pathlib import Path

    from saturate.backend.bench import benchmark
    from saturate.commands.compile import check_static
    from saturate.frontend import load_graph

    graph = load_graph(args.model)
    if args.input_shape:
        from saturate.simplifier import with_input_shapes

        graph = with_input_shapes(graph, args.input_shape)
    check_static(graph, {}, "saturate bench")
    onnx_bytes = None
    if args.model.endswith(".onnx") and not args.optimize:
        onnx_bytes = Path(args.model).read_bytes()
        import onnx

        # ORT cannot resolve external weights from bytes: such a model goes to ORT re-exported whole.
        skeleton = onnx.load_from_string(onnx_bytes)  # from bytes, external data stays unresolved
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in skeleton.graph.initializer):
            onnx_bytes = None
    if args.optimize:
        from saturate import optimize

        shown.stage("optimize")
        graph, _ = optimize(graph)
    rows = benchmark(graph, threads=args.threads, runs=args.runs, onnx_bytes=onnx_bytes,
                     reference=not args.no_reference, progress=shown.stage)
    return graph, rows

