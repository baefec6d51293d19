"""CLI stage: `saturate show MODEL` prints a graph in the text form, then its op counts."""

from __future__ import annotations

import argparse

from saturate.core.fileio import check_outputs, model_files, write_atomic, written_together
from saturate.core.ir import op_count_table
from saturate.progress import add_quiet_flag, status

NAME = "show"
HELP = "print a model (.onnx, .sat or example:NAME) in the readable text form, then its op counts"


def configure(parser: argparse.ArgumentParser) -> None:
    from saturate.frontend.examples import EXAMPLES

    parser.add_argument("model", help=f"a .onnx file, a .sat text graph, or example:NAME ({', '.join(EXAMPLES)})")
    parser.add_argument("--full", action="store_true", help="print every constant in full (text that parses back)")
    parser.add_argument("--hex", action="store_true", help="print constant data as raw little-endian hex")
    parser.add_argument("--elements", type=int, default=6, metavar="K",
                        help="constant values shown before '...' when not --full (default 6)")
    parser.add_argument("--svg", metavar="OUT.svg",
                        help="also draw the graph as an SVG picture (layout by Graphviz dot if installed, "
                             "else grandalf)")
    add_quiet_flag(parser)


def run(args: argparse.Namespace) -> int:
    from saturate.frontend import load_graph
    from saturate.frontend.text import print_graph

    inputs = model_files(args.model)
    check_outputs([("--svg", args.svg)], inputs)
    with status(args.quiet, "load") as shown, written_together(inputs):
        graph = load_graph(args.model)
        if args.svg:
            from saturate.report.html import graph_svg_file
            shown.stage("draw")
            text = graph_svg_file(graph).encode("utf-8")
            write_atomic(args.svg, lambda f: f.write(text))
    limit = None if args.full else max(args.elements, 0)
    print(print_graph(graph, max_elements=limit, hex_data=args.hex), end="")
    if not args.full:
        counts = graph.op_counts()
        print(f"\n# {len(graph.nodes)} nodes, {len(graph.constants)} constants "
              f"({sum(a.size for a in graph.constants.values())} values)")
        print("\n".join("#" + line for line in op_count_table(counts.items()).splitlines()))
    return 0
