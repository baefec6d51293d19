"""Benchmark of the C backend against ONNX Runtime on the corpus models, at 1 thread and at all cores.

Run: python bench/backend_speed.py [--runs 15] [--models resnet18-ts,...] [--threads 1,all] [--json out.json]

Each model is optimized (saturate.optimize), then compiled C and ONNX Runtime (every graph optimization, the
same intra-op thread count, its threads not spinning between runs: see saturate.backend.bench.ort_session)
run on the same input, interleaved run by run in one process; the table gives
their medians and C/ORT. The load average is printed with each row: the machine may be shared, and
multi-thread figures only mean something when the load is below the spare cores. "% peak" is of the
micro-kernel's measured peak (saturate.backend.bench.peak_gflops) times the threads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from saturate import optimize
from saturate.backend.bench import all_cores, benchmark, peak_gflops
from saturate.backend.build import isa, openblas_core
from saturate.frontend import load_graph

# The list: ResNet-18, ResNet-50, MobileNetV2, EfficientNet-B0, VGG-11-BN and a ViT.
MODELS = "resnet18-ts,resnet50-ts,mobilenet_v2-ts,efficientnet_b0-ts,vgg11_bn-ts,deit_tiny-ts"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="interleaved runs per runtime (default 15)")
    parser.add_argument("--models", default=MODELS, help="corpus entries, comma-separated")
    parser.add_argument("--threads", default="1,all", help="thread counts, comma-separated; 'all' is every core")
    parser.add_argument("--json", help="also write every row as JSON")
    args = parser.parse_args(argv)
    counts = [all_cores() if t == "all" else int(t) for t in args.threads.split(",")]
    peak = peak_gflops()
    print(f"cores {all_cores()}, build {isa()}, OpenBLAS {openblas_core()}, measured peak {peak:.1f} GFLOP/s "
          f"per core; median of {args.runs} interleaved runs")
    print(f"{'model':<20} {'threads':>7} {'C ms':>9} {'ORT ms':>9} {'C/ORT':>6} {'C % peak':>8} {'load':>5}")
    results = []
    for name in args.models.split(","):
        graph, _ = optimize(load_graph(f"corpus:{name}"))
        for threads in counts:
            load = os.getloadavg()[0]
            rows = {r.name: r for r in benchmark(graph, threads=threads, runs=args.runs, reference=False)}
            c, ort = rows["compiled C"], rows["onnxruntime"]
            print(f"{name:<20} {threads:>7} {c.median_ms:>9.2f} {ort.median_ms:>9.2f} {c.ratio_to_ort:>6.2f} "
                  f"{100 * c.gflops / (peak * threads):>7.1f}% {load:>5.2f}")
            sys.stdout.flush()
            results += [dict(model=name, load=load, **asdict(r)) for r in rows.values()]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"peak_gflops": peak, "rows": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
