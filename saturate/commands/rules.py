"""CLI `saturate rules`: list every rule a run would use, with its level, set and file:line."""

from __future__ import annotations

import argparse

from saturate.core.errors import SaturateError, one_line

NAME = "rules"
HELP = "list the rules of the pipeline (standard library and --rules files): name, level, set, file:line"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--level", type=int, default=3, help="list the rules at or below this level 0-3 (default 3)")
    parser.add_argument("--rules", nargs="+", action="extend", default=[], metavar="FILE_OR_DIR",
                        help="more .rules files or directories, loaded beside the standard library")
    parser.add_argument("--no-std", action="store_true", help="do not load the standard rules (only --rules)")
    parser.add_argument("--only", nargs="+", action="extend", default=None, metavar="NAME",
                        help="list only these rules (a rule above --level is an error)")
    parser.add_argument("--no-pattern", action="store_true", help="leave out the pattern column")


def run(args: argparse.Namespace) -> int:
    from saturate.lang.parser import LEVELS, RULES_DIR, format_rule, load_rules

    if args.no_std and not args.rules:
        raise SaturateError("--no-std needs --rules FILE_OR_DIR")
    paths = ([] if args.no_std else [RULES_DIR]) + list(args.rules)
    rules = load_rules(paths, level=args.level, names=args.only)
    header = ("NAME", "LEVEL", "RULESET", "WHERE") + (() if args.no_pattern else ("PATTERN",))
    # A file's path (an include names it) may hold a terminal escape or line break: printed escaped.
    rows = [tuple(map(one_line, (r.name, str(r.level), r.ruleset, str(r.loc))
                      + (() if args.no_pattern else (format_rule(r),))))
            for r in sorted(rules, key=lambda r: (r.level, r.ruleset, r.loc.file, r.loc.line))]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    levels = ", ".join(f"{n} {LEVELS[n]}" for n in sorted(LEVELS) if n <= args.level)
    print(f"{len(rules)} rules at level <= {args.level} ({levels})")
    return 0
