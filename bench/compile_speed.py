"""Compile time and run time of the C backend: this checkout against the code at --before (by default commit
4349dae, the monolithic build that compiled every kernel with each model; the precompiled headers came after
db6eb25).

Run: python bench/compile_speed.py [--models resnet18,resnet50,mobilenet_v2-ts] [--runs 15] [--compiles 3]
                                   [--before 4349dae]

Each model is saved as .onnx first (example:NAME or a corpus entry, optimized), so both versions compile the
same file. The old version runs from `git archive BEFORE` on PYTHONPATH, the new one from this checkout; both
as `python -m saturate compile MODEL.onnx -o DIR` in a subprocess, wall time. "new model" is a compile into a
cache that holds what every model shares (the Cython binding object, and for the library build the kernel
library, and where the version has them the precompiled headers) but not this model: the time a user waits for a model not compiled before. "cold" starts from an
empty cache (the library build included). Compile columns are medians of --compiles runs ("cold" one run).

Run time: both compiled models loaded in one process at 1 thread, their calls interleaved, median of --runs
calls each on the same input, timed on the calling thread's CPU clock (every kernel runs on that thread, and
time slices lost to other processes do not count), with the largest relative difference of their outputs. The header names the
CPU, the build's instruction set and the load average: figures from a loaded machine are noisy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

from machine import build_label, cpu_name

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "frontend" / "corpus"  # entries are loaded as corpus:NAME, which fills in their weights


def save_model(name: str, path: Path) -> None:
    """example:NAME as it is, or the corpus entry NAME optimized (what a user compiles), saved to `path`."""
    from saturate import optimize
    from saturate.frontend import load_graph, save_graph

    if (CORPUS / f"{name}.onnx").is_file():
        graph, _ = optimize(load_graph(f"corpus:{name}"))
    else:
        graph = load_graph(f"example:{name}")
    save_graph(graph, str(path))


def old_tree(commit: str, into: Path) -> Path:
    """The package at `commit`, unpacked from `git archive` (its .h files and rules as they were)."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True).stdout
    tar = into / "old.tar"
    tar.write_bytes(data)
    with tarfile.open(tar) as t:
        t.extractall(into / "old", filter="data")
    return into / "old"


def compile_once(tree: Path | None, model: Path, out: Path, cache: Path) -> float:
    """Wall seconds of one `saturate compile` by the package in `tree` (None: this checkout)."""
    env = dict(os.environ, SATURATE_CACHE=str(cache))
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "saturate", "compile", str(model), "-o", str(out), "--quiet"], env=env,
                   check=True, capture_output=True, cwd=str(tree or ROOT))
    return time.perf_counter() - start


def shared_entries(cache: Path) -> list[Path]:
    """What every model's build shares in a cache: the binding object, the kernel library (with digests) and
    the precompiled headers (a folder)."""
    return [p for p in cache.iterdir() if p.name.startswith(("binding-", "libsat-", "prelude-"))]


def compile_times(tree: Path | None, model: Path, work: Path, compiles: int) -> tuple[float, float, Path]:
    """(median new-model seconds, cold seconds, the compiled directory)."""
    cold_cache = work / "cold"
    shutil.rmtree(cold_cache, ignore_errors=True)
    out = work / "out"
    cold = compile_once(tree, model, out, cold_cache)
    warm = []
    for k in range(compiles):
        cache = work / f"warm{k}"
        cache.mkdir()
        for p in shared_entries(cold_cache):
            if p.is_dir():
                shutil.copytree(p, cache / p.name)
            else:
                shutil.copyfile(p, cache / p.name)
        warm.append(compile_once(tree, model, work / f"w{k}", cache))
    return statistics.median(warm), cold, out


def run_times(dirs: list[Path], runs: int) -> tuple[list[float], float]:
    """Median CPU milliseconds per call of each compiled directory at 1 thread, interleaved; the largest relative
    difference between their outputs."""
    from saturate.backend.runtime import load

    models = [load(d, threads=1) for d in dirs]
    feed = {name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)
            for name, shape in models[0].segments[0].inputs}
    outs = [m(feed) for m in models]
    diff = max(float(np.abs(outs[0][k] - o[k]).max() / max(np.abs(outs[0][k]).max(), 1e-12))
               for o in outs[1:] for k in outs[0])
    times: list[list[float]] = [[] for _ in models]
    for _ in range(runs):
        for t, m in zip(times, models):
            start = time.thread_time()
            m(feed)
            t.append(time.thread_time() - start)
    return [1e3 * statistics.median(t) for t in times], diff


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,resnet50,mobilenet_v2-ts")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--compiles", type=int, default=3)
    ap.add_argument("--before", default="4349dae")
    args = ap.parse_args()
    print(f"# compile and run time, the code at {args.before} (before) vs this checkout (after)")
    print(f"# CPU: {cpu_name()}, {os.cpu_count()} cores; {build_label()}; load average at start "
          f"{os.getloadavg()[0]:.2f}")
    print(f"# compile: wall s of `saturate compile`, median of {args.compiles} (cold: 1); "
          f"run: median CPU ms of {args.runs} calls at 1 thread")
    head = ("model", "new model: before", "after", "cold: before", "after", "run ms: before", "after", "rel diff")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    with tempfile.TemporaryDirectory(prefix="compile-speed-") as tmp:
        tmp = Path(tmp)
        old = old_tree(args.before, tmp)
        for name in args.models.split(","):
            model = tmp / f"{name}.onnx"
            save_model(name, model)
            (tmp / name / "old").mkdir(parents=True)
            (tmp / name / "new").mkdir(parents=True)
            old_warm, old_cold, old_dir = compile_times(old, model, tmp / name / "old", args.compiles)
            new_warm, new_cold, new_dir = compile_times(None, model, tmp / name / "new", args.compiles)
            (old_ms, new_ms), diff = run_times([old_dir, new_dir], args.runs)
            print(f"| {name} | {old_warm:.2f} | {new_warm:.2f} | {old_cold:.2f} | {new_cold:.2f} | {old_ms:.2f} | "
                  f"{new_ms:.2f} | {diff:.1e} |", flush=True)
    print(f"# load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
