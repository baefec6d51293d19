"""Benchmark of `saturate optimize`: the whole CLI on one core, per-stage times, medians of runs.

    python bench/optimize_speed.py [--runs 3] [--models resnet18,resnet50,chain-200,chain-2000]

Each model is first written to an .onnx file, so `import` is ONNX parsing as a user sees it.
Targets: ResNet-18 < 1 s, ResNet-50 < 2 s, chain-2000 < 30 s, time per node growing < 2x
from chain-200 to chain-2000.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGES = ("import", "encode", "saturate", "extract", "fold", "export")
DEFAULT_MODELS = "resnet18,resnet50,chain-200,chain-2000"


def run_once(model: Path, workdir: Path, one_core: bool) -> dict:
    """One CLI run; returns wall time, per-stage times and the report."""
    report = workdir / "report.json"
    cmd = [sys.executable, "-m", "saturate", "optimize", str(model), "-o", str(workdir / "out.onnx"),
           "--report", str(report)]
    if one_core and shutil.which("taskset"):
        cmd = ["taskset", "-c", "0"] + cmd
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{model.name}: saturate optimize failed:\n{done.stderr}")
    data = json.loads(report.read_text())
    return {"wall": wall, **{s: data["times"].get(s, 0.0) for s in STAGES}, "report": data}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--all-cores", action="store_true", help="do not pin to one core")
    args = parser.parse_args()

    from saturate.frontend import examples, save_graph

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in args.models.split(","):
            graph = examples.build(name)
            model = work / f"{name}.onnx"
            save_graph(graph, str(model))
            runs = [run_once(model, work, not args.all_cores) for _ in range(args.runs)]
            med = {k: statistics.median(r[k] for r in runs) for k in ("wall", *STAGES)}
            last = runs[-1]["report"]
            rows.append((name, len(graph.nodes), med, last))

    head = f"{'model':<12}{'nodes':>7}{'total s':>9}" + "".join(f"{s:>10}" for s in STAGES)
    head += f"{'ms/node':>9}  {'iters':>5} {'e-nodes':>8}  stop"
    print(head)
    print("-" * len(head))
    per_node = {}
    for name, nodes, med, rep in rows:
        per_node[name] = med["wall"] / nodes
        print(f"{name:<12}{nodes:>7}{med['wall']:>9.2f}" + "".join(f"{med[s]:>10.3f}" for s in STAGES)
              + f"{1000 * per_node[name]:>9.2f}  {rep['iterations']:>5} {rep['egraph_sizes'][-1]:>8}"
              + f"  {rep['stop_reason']}")
    if "chain-200" in per_node and "chain-2000" in per_node:
        print(f"\ntime per node, chain-2000 / chain-200: {per_node['chain-2000'] / per_node['chain-200']:.2f}x")
    print(f"(median of {args.runs} runs, whole CLI, {'all cores' if args.all_cores else '1 core'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
