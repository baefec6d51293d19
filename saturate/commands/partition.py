"""CLI `saturate partition`: optimize for a target with its composites as rules; each composite
extraction chose becomes a call of an ONNX local function."""

from __future__ import annotations

import argparse

from saturate.commands.optimize import _refuse_invalid_input, command_inputs
from saturate.core.errors import SaturateError
from saturate.core.fileio import check_outputs, written_together
from saturate.frontend import load_graph
from saturate.partition import check_output, optimize_for_target, partition, save_model, summary
from saturate.progress import add_quiet_flag, saturation_callback, status
from saturate.targets.preserve import split_names
from saturate.targets.target import load_target

NAME = "partition"
HELP = ("optimize MODEL for a target with its composite patterns as rules; each composite extraction "
        "chooses becomes a call to an ONNX local function (constants lifted to arguments)")


def split(text: str) -> tuple[str, ...]:
    """`A,B , C` -> ('A', 'B', 'C')."""
    return tuple(s.strip() for s in (text or "").split(",") if s.strip())


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="model: .onnx, .sat or example:NAME")
    parser.add_argument("--target", "-t", default="cpu", help="target name or .target file (default: cpu)")
    parser.add_argument("-o", "--output", required=True, help="output .onnx file")
    parser.add_argument("--keep-constants", action="store_true",
                        help="keep constants inside function bodies instead of lifting them to arguments")
    parser.add_argument("--no-optimize", action="store_true", help="run the composite rules alone (no folding), then write the functions")
    parser.add_argument("--level", type=int, default=3, help="rule level for the optimization (default 3)")
    parser.add_argument("--rules", nargs="+", action="extend", default=[], metavar="FILE_OR_DIR",
                        help="more .rules files or directories, loaded beside the standard library")
    parser.add_argument("--no-std", action="store_true", help="do not load the standard rules (only --rules)")
    parser.add_argument("--preserve", metavar="NAME[,NAME]", default="",
                        help="ops or nodes (by name) no rewrite may change, on top of the target's list; "
                             "an ONNX model may also mark nodes with metadata saturate.preserve=1")
    add_quiet_flag(parser)


def run(args: argparse.Namespace) -> int:
    check_output(args.output)  # before any work
    rules = [] if args.no_optimize else args.rules  # --no-optimize reads no rules
    inputs = command_inputs([args.model], rules, not args.no_std and not args.no_optimize, args.target)
    check_outputs([("-o", args.output)], inputs)
    target = load_target(args.target)
    with status(args.quiet, "load") as shown, written_together(inputs):
        graph = load_graph(args.model)
        ops, nodes = split_names(graph, split(args.preserve) + tuple(graph.meta.get("preserve", ())))
        if args.no_optimize:
            shown.stage("partition")
            out = partition(graph, target, keep_constants=args.keep_constants, leave=ops + nodes)
        else:
            from saturate.lang.parser import RULES_DIR, load_rules

            rules = load_rules(([] if args.no_std else [RULES_DIR]) + list(args.rules), level=args.level)
            shown.stage("saturate")
            out, _ = optimize_for_target(graph, target, ops, nodes, partition_graph=True,
                                         keep_constants=args.keep_constants, rules=rules, level=args.level,
                                         progress=saturation_callback(shown))
        shown.stage("export")
        try:
            save_model(out, args.output)
        except SaturateError:
            _refuse_invalid_input(args.model, graph)
            raise
    lines = summary(out)
    calls = sum(1 for n in out.nodes if n.domain == target.domain)
    print(f"{args.output}: {calls} calls to {len(lines)} functions in domain '{target.domain}'")
    for line in lines:
        print("  " + line)
    return 0
