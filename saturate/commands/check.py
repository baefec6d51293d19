"""CLI: `saturate check RULES...` property-tests the soundness of every rule in the given files."""

from __future__ import annotations

import argparse
import time

from saturate.core.errors import SaturateError
from saturate.progress import add_quiet_flag, status

NAME = "check"
HELP = "property-test the soundness of every rule: PASS, or a shrunk counterexample"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rules", nargs="+", metavar="RULES", help=".rules files or directories of them")
    parser.add_argument("--examples", type=int, default=200, metavar="N",
                        help="examples drawn per rule (default 200)")
    parser.add_argument("--seed", type=int, default=None, metavar="S",
                        help="seed for the drawing: the same seed gives the same run")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="rules checked at once, each in its own process (default: every core)")
    add_quiet_flag(parser)


def run(args: argparse.Namespace) -> int:
    from saturate.core.extras import need

    _hypothesis_storage_beside_our_caches()
    need("hypothesis", "check", "saturate check")
    from saturate.check.checker import check_rules, format_result
    from saturate.lang.parser import load_rulesets

    if args.examples < 1:
        raise SaturateError("--examples must be at least 1")
    if args.jobs is not None and args.jobs < 1:
        raise SaturateError("--jobs must be at least 1")
    # Every level: a rule is checked whether or not a default run would use it.
    rules = [rule for ruleset in load_rulesets(args.rules) for rule in ruleset.rules]
    if not rules:
        raise SaturateError(f"no rules in {', '.join(args.rules)}")
    with status(args.quiet, "check", total=len(rules), unit="rule") as shown:
        def done(result) -> None:
            shown.write(format_result(result))
            shown.step(1, result.rule.name)
        start = time.perf_counter()
        results = check_rules(rules, args.examples, args.seed, progress=done, jobs=args.jobs)
    failed = [r for r in results if r.status != "PASS"]
    seconds = time.perf_counter() - start
    print(f"{len(results) - len(failed)} of {len(results)} rules pass ({seconds:.1f}s)")
    return 1 if failed else 0


def _hypothesis_storage_beside_our_caches() -> None:
    """hypothesis keeps a cache of its own, by default in a .hypothesis folder of the working
    directory: run in a user's folder, the command would leave one there. It goes beside saturate's
    caches instead (a HYPOTHESIS_STORAGE_DIRECTORY the user set stays), or without a home into a
    temporary folder removed at exit. The checking processes inherit the variable."""
    import os

    from saturate.lang.rule_cache import cache_dir

    if os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        return
    rules = cache_dir()
    if rules is not None:
        where = str(rules.parent / "hypothesis")
    else:
        import atexit
        import shutil
        import tempfile

        where = tempfile.mkdtemp(prefix="saturate-hypothesis-")
        atexit.register(shutil.rmtree, where, True)
    os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = where
