"""Benchmark of the C backend against ONNX Runtime on the corpus models, at 1 thread and at all cores.

Run: python bench/backend_speed.py [--runs 15] [--models resnet18-ts,example:resnet50,...] [--threads 1,all] [--load]
                                   [--avx2-only] [--json out.json] [--overhead | --no-overhead] [--batches 41]

The header names the CPU, the instruction set the C kernels were built for ($SATURATE_ISA: an "avx2 build on
an AVX-512 CPU" is the AVX2 kernels measured on a machine that has wider ones, not an AVX2 machine's figure),
OpenBLAS's kernel family and the micro-kernel's measured peak.

First comes the per-call overhead table (alone with --overhead): what a call from Python costs beyond
the kernels, on an identity model (one Identity node on a 1x3x32x32 input: the call copies 12 KB and
does nothing else) and on the tiny example:mobilenet (optimized). Per call, in microseconds: the public
path `saturate.compile_graph(graph)(x)` (CompiledModel.__call__, with the array and with a {name: array}
dict), the Cython module's Model.run([x]), and sat_run called back to back in a C loop on the same
buffers: the time inside sat_run, which is the kernels plus a few nanoseconds of sat_run's own set-up
(a per-step profile cannot serve: its clock reads cost about a microsecond each on this machine, more
than what is measured). "overhead" is call(x) minus sat_run, "run ovh" Model.run minus sat_run: medians
over batches of back-to-back calls, every runner's batches interleaved in one process (the order
rotating), the difference taken batch by batch. At 1 thread the clock is the calling thread's CPU time,
which time slices lost to other processes do not inflate (every kernel runs on that thread); at more
threads it is wall time, and only meaningful when the load is below the spare cores. ORT is
session.run on the same graph and dict, for reference. See saturate.backend.bench.call_overhead.

Models are corpus entries (frontend/corpus: their vision models are 96x96 exports), built-in examples
(example:NAME, as `saturate bench` takes them: example:resnet18 and example:resnet50 are torchvision's at
224x224, where the early layers' maps leave L2) or KIND-SEQ transformers built without torch at sequence
length SEQ (bench/transformer_models.py: bert, gpt2, llama). Each model is optimized (saturate.optimize), then compiled C and ONNX Runtime (every graph optimization, the
same intra-op thread count, its threads not spinning between runs: see saturate.backend.bench.ort_session)
run on the same input, interleaved in one process, each timed run right after an untimed one of the same
runtime (saturate.backend.bench.benchmark: a run right after the other runtime's measures cache
eviction, which cost ONNX Runtime far more than the C); the table gives their medians and C/ORT. The
load average is printed with each row: the machine may be shared, and multi-thread figures only mean something when the load is below the spare cores. "% peak" is of the
micro-kernel's measured peak (saturate.backend.bench.peak_gflops) times the threads, counting each conv's
direct-convolution FLOPs: Winograd convs do 2.25x fewer multiplies, so a model of mostly 3x3 convs
(vgg11_bn) can read above 100%.

--avx2-only (an AVX-512 CPU standing in for an AVX2 machine): the AVX2 build against ONNX Runtime's AVX2
kernels, AVX-512 hidden from CPUID for the whole process by bench/avx2_only.c (Linux, CPUs with CPUID
faulting), so numpy and OpenBLAS take their AVX2 kernels too. Still not an AVX2 machine's figure: the
core, its caches and its clock are the AVX-512 CPU's, and the header says so.

--load runs a process spinning on one core beside both runtimes for the whole table: the pool's loss under
load reads off as C/ORT against the same row without --load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from saturate import optimize
from saturate.backend.bench import all_cores, benchmark, call_overhead, format_overhead, identity_graph, peak_gflops
from saturate.backend.toolchain import openblas_core
from saturate.frontend import load_graph

import transformer_models
import machine

# ResNet-18, ResNet-50, MobileNetV2, EfficientNet-B0, VGG-11-BN (96x96), ResNet-18 and ResNet-50 at 224x224, a
# ViT, the corpus's transformer encoder, and BERT-, GPT-2- and Llama-style models at sequence lengths 128 and 512.
MODELS = ("resnet18-ts,resnet50-ts,mobilenet_v2-ts,efficientnet_b0-ts,vgg11_bn-ts,example:resnet18,example:resnet50,"
          "deit_tiny-ts,encoder-ts,bert-128,bert-512,gpt2-128,gpt2-512,llama-128,llama-512")


def load(name: str):
    """A bench model by name: KIND-SEQ from transformer_models, example:NAME, else a corpus entry."""
    if transformer_models.is_spec(name):
        return transformer_models.graph(name)
    if name.startswith("example:"):
        return load_graph(name)
    return load_graph(f"corpus:{name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="interleaved runs per runtime (default 15)")
    parser.add_argument("--models", default=MODELS, help="corpus entries, example:NAME or KIND-SEQ, comma-separated")
    parser.add_argument("--threads", default="1,all", help="thread counts, comma-separated; 'all' is every core")
    parser.add_argument("--load", action="store_true", help="a process spinning on one core beside every run")
    parser.add_argument("--json", help="also write every row as JSON")
    parser.add_argument("--avx2-only", action="store_true",
                        help="the AVX2 build against ONNX Runtime's AVX2 kernels: on an AVX-512 CPU, AVX-512 is "
                             "hidden from CPUID for the whole run (Linux, CPUs with CPUID faulting)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--overhead", action="store_true", help="only the per-call overhead table")
    which.add_argument("--no-overhead", action="store_true", help="skip the per-call overhead table")
    parser.add_argument("--batches", type=int, default=41, help="interleaved batches of the overhead table (default 41)")
    args = parser.parse_args(argv)
    if args.avx2_only and not machine.avx2_only():
        machine.exec_avx2_only(sys.argv[1:] if argv is None else argv)
    if machine.avx2_only():
        machine.check_avx2_only()
    counts = [all_cores() if t == "all" else int(t) for t in args.threads.split(",")]
    overhead = []
    if not args.no_overhead:
        print(f"per-call overhead: median of {args.batches} interleaved batches (thread CPU time at 1 thread, "
              f"wall time at more)")
        models = [("identity", identity_graph()), ("example:mobilenet", optimize(load_graph("example:mobilenet"))[0])]
        print(format_overhead([]))
        for name, graph in models:
            for threads in counts:
                row = call_overhead(graph, name, threads, args.batches)
                print(format_overhead([row]).splitlines()[1])
                sys.stdout.flush()
                overhead.append(asdict(row))
        print()
        if args.overhead:
            if args.json:
                with open(args.json, "w", encoding="utf-8") as f:
                    json.dump({"overhead": overhead}, f, indent=2)
            return 0
    peak = peak_gflops()
    label = machine.build_label()
    print(f"{machine.cpu_name()}, {all_cores()} cores; {label}; OpenBLAS {openblas_core()}; measured peak {peak:.1f} "
          f"GFLOP/s per core")
    print(f"median of {args.runs} interleaved runs, each after an untimed one"
          f"{'; a process spinning on one core beside every run (--load)' if args.load else ''}")
    print(f"{'model':<20} {'threads':>7} {'C ms':>9} {'ORT ms':>9} {'C/ORT':>6} {'C % peak':>8} {'load':>5}")
    results = []
    with machine.Spinner(args.load):
        for name in args.models.split(","):
            graph, _ = optimize(load(name))
            for threads in counts:
                load_avg = os.getloadavg()[0]
                rows = {r.name: r for r in benchmark(graph, threads=threads, runs=args.runs, reference=False)}
                c, ort = rows["compiled C"], rows["onnxruntime"]
                print(f"{name:<20} {threads:>7} {c.median_ms:>9.2f} {ort.median_ms:>9.2f} {c.ratio_to_ort:>6.2f} "
                      f"{100 * c.gflops / (peak * threads):>7.1f}% {load_avg:>5.2f}")
                sys.stdout.flush()
                results += [dict(model=name, load=load_avg, **asdict(r)) for r in rows.values()]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cpu": machine.cpu_name(), "build": label, "spinning_load": args.load, "peak_gflops": peak,
                       "rows": results, "overhead": overhead}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
