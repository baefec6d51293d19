"""CLI `saturate targets`: list the shipped targets, one per line, name first."""

from __future__ import annotations

import argparse

from saturate.targets.target import list_targets, load_target

NAME = "targets"
HELP = "list the available targets (rules/targets/*.target): name, then a short description"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="?", help="show one target (name or .target path) in detail")


def run(args: argparse.Namespace) -> int:
    if args.target:
        t = load_target(args.target)
        print(f"{t.name}  {t.description}")
        print(f"  file:       {t.file}")
        print(f"  domain:     {t.domain}")
        print(f"  native ops: {', '.join(op for op in sorted(t.costs) if t.costs[op] is not None) or '-'}")
        print(f"  other ops:  {'unsupported' if t.default is None else 'default cost'}")
        print(f"  preserve:   {', '.join(t.preserve) or '-'}" + ("" if t.fold_preserved else " (no folding inside)"))
        for op, c in t.composite_ops.items():
            print(f"  composite:  {c.name}  (e-node {op}, {c.loc})")
        return 0
    targets = list_targets()
    width = max((len(t.name) for t in targets), default=0)
    for t in targets:
        print(f"{t.name:<{width}}  {t.description}")
    return 0
