"""Benchmark of when saturation stops: iterations, stop reason, peak e-graph and optimize time
of corpus models, for this checkout and optionally another one side by side.

    python bench/saturation_stop.py [--runs 3] [--models densenet121-ts,mixnet_s-ts] [--before DIR] [--after DIR]

`--before DIR` runs the same CLI with DIR first on PYTHONPATH (a `git worktree add DIR REV` of
an earlier revision), interleaved with the runs of `--after DIR` (default: the installed
checkout) so that load on a shared machine falls on both alike. Times are medians of `--runs` runs of `saturate optimize --check 0`:
wall time of the process and saturate's own `saturate` stage; nodes are the written graph's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_name

DEFAULT_MODELS = ("densenet121-ts,densenet121-dynamo,mixnet_s-ts,mixnet_s-dynamo,"
                  "googlenet-ts,shufflenet_v2_x1_0-ts,swin_tiny-ts")


def run_once(model: str, workdir: Path, pythonpath: str | None) -> dict:
    """One CLI run of `model` (a corpus name); its wall time and report."""
    report = workdir / "report.json"
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "saturate", "optimize", f"corpus:{model}", "-o", str(workdir / "out.onnx"),
           "--check", "0", "--report", str(report)]
    start = time.perf_counter()
    # Run from workdir: `python -m` puts the current directory before PYTHONPATH.
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{model}: saturate optimize failed:\n{done.stderr}")
    data = json.loads(report.read_text())
    return {"wall": wall, "saturate": data["times"].get("saturate", 0.0), "iterations": data["iterations"],
            "stop": data["stop_reason"], "peak": data["peak_egraph_nodes"],
            "nodes": sum(data["ops_after"].values())}


def summary(runs: list[dict]) -> dict:
    last = runs[-1]
    return {"wall": statistics.median(r["wall"] for r in runs),
            "saturate": statistics.median(r["saturate"] for r in runs),
            "iterations": last["iterations"], "stop": last["stop"], "peak": last["peak"], "nodes": last["nodes"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--before", metavar="DIR", help="another checkout to compare with")
    parser.add_argument("--after", metavar="DIR", help="the checkout compared (default: the installed one)")
    args = parser.parse_args()
    sides = ([("before", str(Path(args.before).resolve()))] if args.before else []) + [
        ("after", str(Path(args.after).resolve()) if args.after else None)]

    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; medians of {args.runs} runs of "
          "`saturate optimize corpus:NAME --check 0`")
    head = f"{'model':<22} {'side':<7} {'wall s':>7} {'saturate s':>10} {'iters':>5} {'stop':<16} {'peak e-nodes':>12} {'nodes':>6}"
    print(head)
    print("-" * len(head))
    with tempfile.TemporaryDirectory(prefix="saturate-bench-") as tmp:
        for model in args.models.split(","):
            runs: dict[str, list[dict]] = {name: [] for name, _ in sides}
            for _ in range(args.runs):
                for name, path in sides:
                    runs[name].append(run_once(model, Path(tmp), path))
            for name, _ in sides:
                s = summary(runs[name])
                print(f"{model:<22} {name:<7} {s['wall']:>7.2f} {s['saturate']:>10.2f} {s['iterations']:>5} "
                      f"{s['stop']:<16} {s['peak']:>12} {s['nodes']:>6}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
