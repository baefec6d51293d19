"""Benchmark of batch mode: the whole `saturate optimize MODELS -o DIR --jobs N` CLI for each N.

    python bench/batch_speed.py [--runs 3] [--jobs 1,2] [--models 'corpus:*-ts']

The runs of the different --jobs values are interleaved (1, 2, 1, 2, ...), so a machine whose load
drifts slows them alike; the table gives each one's median wall time and its speed-up over the
first. It also prints the load average before and after: on a shared machine, quote it with the
figures. Target: N jobs close to N times faster on N free cores.
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


def run_once(models: list[str], jobs: int, outdir: Path) -> tuple[float, dict]:
    """One CLI run; returns its wall time and its summary.json."""
    cmd = [sys.executable, "-m", "saturate", "optimize", *models, "-o", str(outdir), "--jobs", str(jobs), "--quiet"]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"--jobs {jobs}: saturate optimize failed:\n{done.stderr}")
    return wall, json.loads((outdir / "summary.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", default=f"1,{os.cpu_count() or 1}", help="comma-separated --jobs values")
    parser.add_argument("--models", nargs="+", default=["corpus:*-ts"],
                        help="models, directories or globs, as optimize takes them (default: corpus:*-ts)")
    args = parser.parse_args()
    counts = [int(j) for j in args.jobs.split(",")]

    from saturate.batch import expand_models

    models = expand_models(args.models)
    print(f"{len(models)} models; {os.cpu_count()} cores; load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    walls: dict[int, list[float]] = {n: [] for n in counts}
    model_seconds: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            for n in counts:
                wall, summary = run_once(models, n, Path(tmp) / f"jobs{n}")
                walls[n].append(wall)
                model_seconds[n] = sum(r["seconds"] for r in summary["results"])
                print(f"  run {run + 1}: --jobs {n}: {wall:.1f} s", file=sys.stderr, flush=True)
    base = statistics.median(walls[counts[0]])
    print(f"{'jobs':>4} | {'wall s':>8} | {'speed-up':>8} | {'sum of model s':>14}")
    for n in counts:
        med = statistics.median(walls[n])
        print(f"{n:>4} | {med:>8.1f} | {base / med:>7.2f}x | {model_seconds[n]:>14.1f}")
    print(f"medians of {args.runs} interleaved runs; load average after: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
