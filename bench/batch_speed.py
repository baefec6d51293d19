"""Benchmark of batch mode: the whole `saturate optimize MODELS -o DIR --jobs N` CLI for each N.

    python bench/batch_speed.py [--runs 3] [--jobs 1,2] [--models 'corpus:*-ts']

The runs of the different --jobs values are interleaved (1, 2, 1, 2, ...), so a machine whose load
drifts slows them alike; the table gives each one's median wall time and its speed-up over the
first, the CPU seconds of all its models, and the speed-up its models' CPU seconds allow on N
free cores (the largest first, as the batch schedules them: what imbalance leaves). Target: N
jobs close to N times faster on N free cores.

On a shared machine, wall time says little: the load average is printed before and after, and
under Linux's scheduler autogroups (/proc/sys/kernel/sched_autogroup_enabled) each terminal
session gets one share of the CPU, however many processes it runs, so while other sessions are
busy a batch's workers split the share of the session that started it.
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


def makespan(seconds: list[float], workers: int) -> float:
    """When the last of these jobs ends on `workers` free cores, the largest started first."""
    ends = [0.0] * workers
    for s in sorted(seconds, reverse=True):
        ends[ends.index(min(ends))] += s
    return max(ends)


def autogroups() -> bool:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


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
    print(f"{len(models)} models; {os.cpu_count()} cores; scheduler autogroups "
          f"{'on' if autogroups() else 'off'}; load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    walls: dict[int, list[float]] = {n: [] for n in counts}
    cpus: dict[int, list[list[float]]] = {n: [] for n in counts}
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            for n in counts:
                wall, summary = run_once(models, n, Path(tmp) / f"jobs{n}")
                walls[n].append(wall)
                cpus[n].append([r["cpu_seconds"] for r in summary["results"]])
                print(f"  run {run + 1}: --jobs {n}: {wall:.1f} s", file=sys.stderr, flush=True)
    base = statistics.median(walls[counts[0]])
    print(f"{'jobs':>4} | {'wall s':>8} | {'speed-up':>8} | {'model cpu s':>11} | {'free-core speed-up':>18}")
    for n in counts:
        med = statistics.median(walls[n])
        # Per model, the median of its CPU seconds over the runs: one noisy run moves nothing.
        per_model = [statistics.median(run[k] for run in cpus[n]) for k in range(len(models))]
        bound = sum(per_model) / makespan(per_model, n)
        print(f"{n:>4} | {med:>8.1f} | {base / med:>7.2f}x | {sum(per_model):>11.1f} | {bound:>17.2f}x")
    print(f"medians of {args.runs} interleaved runs; load average after: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
