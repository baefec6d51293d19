"""Benchmark of the C backend: ResNet-18 and VGG-11-BN, original and BN-folded, at 1 and 2 threads.

Run: python bench/backend_speed.py [--runs 10] [--models resnet18,vgg11bn] [--json out.json]
Each table comes from one process, the runtimes interleaved run by run.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from saturate.frontend import load_graph
from saturate import optimize
from saturate.backend.bench import benchmark, format_table
from saturate.backend.build import openblas_core


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--models", default="resnet18,vgg11bn")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--json", help="also write every row as JSON")
    args = parser.parse_args(argv)
    print(f"OpenBLAS kernels: {openblas_core()}")
    results = []
    for name in args.models.split(","):
        original = load_graph(f"example:{name}")
        folded, _ = optimize(original.copy())
        for label, graph in (("original", original), ("BN-folded", folded)):
            for threads in (int(t) for t in args.threads.split(",")):
                rows = benchmark(graph, threads=threads, runs=args.runs)
                print(format_table(rows, f"\n{name} {label} ({len(graph.nodes)} nodes), {threads} thread(s):"))
                sys.stdout.flush()
                results += [dict(model=name, graph=label, threads=threads, **asdict(r)) for r in rows]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
