"""Which ONNX ops `saturate check` can check a rule over: for every op of ONNX's default domain at
the newest opset, the rule `Identity(Op(x...)) => Op(x...)` (sound, so anything but PASS is the
checker's gap), checked on a few examples.

    python bench/check_coverage.py [--examples 10] [--jobs 2]

Prints a table: each status with its count, then every op that did not pass with the reason the
checker gave. Ops the interpreter does not run at all (none with onnx 1.23) are counted apart,
with the reason.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

import onnx.defs

from machine import cpu_name
from saturate.check import check_rules
from saturate.interp.reference import unsupported_reason
from saturate.interp.sequences import OPTIONAL_OPS, SEQUENCE_OPS
from saturate.lang.parser import load_rules
from saturate.ops.schema import newest_opset


# Ops whose required inputs alone do not run (Resize needs scales or sizes; an Optional without
# its input needs a `type`, which is not drawn) or do nothing (a NonMaxSuppression without a count
# keeps no box): checked with the optional inputs they need.
INPUTS = {"Resize": 3, "NonMaxSuppression": 5, "Optional": 1}


def default_domain_ops(opset: int) -> dict[str, onnx.defs.OpSchema]:
    ops: dict[str, onnx.defs.OpSchema] = {}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain in ("", "ai.onnx") and not s.deprecated and s.since_version <= opset:
            if s.name not in ops or s.since_version > ops[s.name].since_version:
                ops[s.name] = s
    return ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=None)
    args = parser.parse_args()
    opset = newest_opset()
    ops = default_domain_ops(opset)
    # The sequence and optional ops run on the interpreter's own kernels (unsupported_reason keeps
    # them from the constant folder, which cannot hold a sequence or an optional).
    refused = {name: unsupported_reason(name, opset) for name in ops
               if unsupported_reason(name, opset) and name not in SEQUENCE_OPS and name not in OPTIONAL_OPS}
    lines = ["ruleset coverage level 1"]
    for name, s in sorted(ops.items()):
        if name not in refused:
            operands = ", ".join(f"x{k}" for k in range(INPUTS.get(name, s.min_input)))
            lines.append(f"rule op-{name} Identity({name}({operands})) => {name}({operands})")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "coverage.rules"
        path.write_text("\n".join(lines) + "\n")
        results = check_rules(load_rules([str(path)]), examples=args.examples, seed=0, jobs=args.jobs)
    counts = Counter(r.status for r in results)
    print(f"{cpu_name()}; ONNX opset {opset}, {len(ops)} default-domain ops, {args.examples} examples each\n")
    print("| status | ops |\n|---|---|")
    for status in ("PASS", "NOGEN", "FAIL", "ERROR"):
        print(f"| {status} | {counts.get(status, 0)} |")
    print(f"| not run by the interpreter | {len(refused)} |\n")
    print("| op | status | reason |\n|---|---|---|")
    for r in results:
        if r.status != "PASS":
            reason = (r.message or (r.counterexample.reason if r.counterexample else "")).splitlines()
            print(f"| {r.rule.name[3:]} | {r.status} | {reason[0][:140] if reason else ''} |")
    for name, why in sorted(refused.items()):
        print(f"| {name} | not run | {why} |")


if __name__ == "__main__":
    main()
