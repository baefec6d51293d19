"""C backend, benchmark stage: reference interpreter, ONNX Runtime and compiled C side by side."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from saturate.backend.segments import partition
from saturate.core.errors import SaturateError
from saturate.core.ir import Graph, ValueInfo

# The peak a "% peak" column divides by: one core running the conv micro-kernel on operands in L1 (the
# AVX-512 8x32 tile where the build has it, else the 6x16 tile of pgemm.h), measured by a probe
# built with the models' own flags, best of its timed batches, cached per kernels, flags, compiler and CPU.
PROBE_SOURCE = r"""
#include <stdio.h>
#include <time.h>
#include "kernels.h"

static double sat_probe_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(void) {
    double best = 0.0;
#ifdef SAT_HAVE_PACKED_GEMM
    static float a[SAT_KC * SAT_MR] __attribute__((aligned(64))), b[SAT_KC * SAT_NR] __attribute__((aligned(64)));
    static float c[SAT_MR * SAT_NR] __attribute__((aligned(64)));
    for (int i = 0; i < SAT_KC * SAT_MR; i++) a[i] = 1e-3f * (float)(i % 7);
    for (int i = 0; i < SAT_KC * SAT_NR; i++) b[i] = 1e-3f * (float)(i % 5);
    const double flops = 2.0 * SAT_MR * SAT_NR * SAT_KC;
    for (int rep = 0; rep < 30; rep++) {
        const double t = sat_probe_now();
        for (int i = 0; i < 400; i++) sat_kernel_8x32(SAT_KC, a, b, c, SAT_NR, 1, SAT_MR, SAT_NR);
        const double g = 400 * flops / (sat_probe_now() - t);
        best = g > best ? g : best;
    }
    const float check = c[0];
#else
    /* the SAT_PR x SAT_PN tile of the packed convs (pgemm.h, 6 x 16 on AVX2), one SAT_PKC-step reduction
       on panels in L1, as a conv's inner loop runs it; b runs on for the SAT_PK_FAR floats the tile fetches
       ahead, as a real panel has the weights after it (fetches into pages not mapped cost what those do not:
       94 vs 118 GFLOP/s, avx2 build on the Zen 4) */
    static float a[SAT_PKC * SAT_PR] __attribute__((aligned(64))),
        b[SAT_PKC * SAT_PN + SAT_PK_FAR] __attribute__((aligned(64)));
    static float c[SAT_PR * SAT_PN] __attribute__((aligned(64)));
    for (int i = 0; i < SAT_PKC * SAT_PR; i++) a[i] = 1e-3f * (float)(i % 7);
    for (int i = 0; i < SAT_PKC * SAT_PN; i++) b[i] = 1e-3f * (float)(i % 5);
    const double flops = 2.0 * SAT_PR * SAT_PN * SAT_PKC;
    for (int rep = 0; rep < 30; rep++) {
        const double t = sat_probe_now();
        for (int i = 0; i < 400; i++) sat_ukr(SAT_PKC, a, b, c, SAT_PN, SAT_PR, SAT_PN, 1, 1);
        const double g = 400 * flops / (sat_probe_now() - t);
        best = g > best ? g : best;
    }
    const float check = c[0];
#endif
    printf("%.3f %g\\n", best / 1e9, (double)check);
    return 0;
}
"""


def peak_gflops() -> float:
    """One core's measured peak GFLOP/s (see PROBE_SOURCE), probed once per build setup and cached."""
    import hashlib
    import json
    import math
    import subprocess
    import tempfile
    from pathlib import Path

    from saturate.backend import build
    from saturate.backend.cache import cache_root, mark_support_used, read_small

    inc, libdir, lib = build.openblas()
    cc = build.compiler()
    flags = build.compile_flags()
    kernels = b"".join(p.read_bytes() for p in sorted(build.KERNELS_DIR.glob("*.h")))
    facts = "\n".join([PROBE_SOURCE, " ".join(flags), build.compiler_version(cc), build.cpu_features()])
    key = hashlib.sha256(kernels + facts.encode()).hexdigest()[:24]
    cached = cache_root() / f"peak-{key}.json"
    try:
        gflops = float(json.loads(read_small(cached))["gflops"])
        if math.isfinite(gflops) and gflops > 0:
            mark_support_used(cached)
            return gflops
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        pass
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "probe.c", Path(tmp) / "probe"
        src.write_text(PROBE_SOURCE)
        cmd = [cc, *flags, f"-I{build.KERNELS_DIR}", f"-I{inc}", str(src), str(build.kernel_library()), "-o", str(exe),
               f"-L{libdir}", f"-l{lib}",
               f"-Wl,-rpath,{libdir}", "-lm"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SaturateError(f"peak probe failed to compile: {(proc.stderr.strip().splitlines() or ['?'])[0]}")
        out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    gflops = float(out[0])
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp_path.write_text(json.dumps({"gflops": gflops, "cpu": build.cpu_features().splitlines()[0]}) + "\n")
    os.replace(tmp_path, cached)
    return gflops


@dataclass
class Row:
    """One runtime's result: median latency (ms), ratio to ONNX Runtime, GFLOP/s, max relative error."""

    name: str
    median_ms: float
    ratio_to_ort: float | None
    gflops: float
    rel_error: float | None
    threads: int = 1


def graph_flops(graph: Graph, input_shapes: dict | None = None) -> int:
    """Arithmetic operations of one inference, from static shapes (targets.flops per node)."""
    from saturate.targets.target import flops

    part = partition(graph, input_shapes)
    shapes = part.shapes
    total = 0
    for n in part.graph.nodes:  # folded nodes cost nothing at run time; data-dependent shapes are not counted
        if shapes.get(n.outputs[0]) is None or any(i and shapes.get(i) is None for i in n.inputs):
            continue
        infos = [ValueInfo("float32", shapes[i]) if i else None for i in n.inputs]
        total += flops(n.op, n.attrs, infos, ValueInfo("float32", shapes[n.outputs[0]]))
    return total


def all_cores() -> int:
    """The cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def limit_blas_threads(threads: int) -> list[str]:
    """Give every OpenBLAS loaded in this process (numpy's too) `threads` threads, so the numpy
    reference runs at the thread count of the others; returns the libraries it set."""
    import ctypes

    names = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
             "scipy_openblas_set_num_threads")
    done = []
    with open("/proc/self/maps", encoding="utf-8") as maps:
        libs = sorted({line.split()[-1] for line in maps if "openblas" in line.split()[-1].lower()})
    for path in libs:
        lib = ctypes.CDLL(path)
        for name in names:
            if hasattr(lib, name):
                getattr(lib, name)(threads)
                done.append(path)
                break
    return done


def ort_session(graph: Graph, threads: int, onnx_bytes: bytes | None = None, spinning: bool = False):
    """An ONNX Runtime session with every graph optimization, `threads` intra-op threads.

    Its intra-op threads do not spin between runs unless `spinning`: runs interleaved with the compiled C,
    ORT's threads spinning on after a run took a core from the C run that followed (MobileNetV2 at 2
    threads on 2 cores: C 4.6 ms alone, 8.7 ms right after a spinning ORT run, 5.2 ms after a
    non-spinning one), and from ORT's own next run (7.1 ms spinning, 3.5 ms not)."""
    from saturate.core.extras import need

    ort = need("onnxruntime", "bench", "saturate bench")
    if onnx_bytes is None:
        from saturate.frontend.onnx_io import export_model

        onnx_bytes = export_model(graph).SerializeToString()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    if not spinning:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(onnx_bytes, opts, providers=["CPUExecutionProvider"])


def random_input(rng, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Standard normal floats; small non-negative integers for index-like inputs (token ids)."""
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 2, shape).astype(dtype)
    if np.dtype(dtype).kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.standard_normal(shape).astype(dtype)


def max_rel_error(got: dict, ref: dict) -> float:
    """Largest |got - ref| over the largest |ref|, across outputs."""
    worst = 0.0
    for k, r in ref.items():
        scale = max(float(np.abs(r).max()), 1e-12) if r.size else 1.0
        worst = max(worst, float(np.abs(np.asarray(got[k], np.float64) - r).max()) / scale if r.size else 0.0)
    return worst


def benchmark(graph: Graph, threads: int = 1, runs: int = 10, onnx_bytes: bytes | None = None,
              reference: bool = True, seed: int = 0, progress: Callable[[str], None] | None = None) -> list[Row]:
    """Time every runtime on the same random input, interleaving their runs so drift hits all alike;
    `progress` is told each stage as it starts (compile, warm-up, run k/N).

    In each of the `runs` rounds every runtime runs twice and the second run is timed: a run right after
    another runtime's finds its weights and buffers evicted from the caches, and that costs the runtimes
    unequally (ResNet-50 on a Xeon with a 480 MB L3: ONNX Runtime 42 ms against 31 back to back, the
    compiled C 24 against 22), so timing every run of a one-by-one interleaving measured the
    eviction more than the kernels. The second run is what a program calling one model in a loop sees."""
    say = progress or (lambda stage: None)
    from saturate.backend.runtime import compile_graph
    from saturate.interp.interpreter import run_graph

    if runs < 1:
        raise SaturateError(f"--runs must be at least 1, got {runs}")
    say("compile")
    model = compile_graph(graph, threads=threads)
    limit_blas_threads(threads)
    rng = np.random.default_rng(seed)
    feed = {name: random_input(rng, shape, model.input_dtypes[name]) for name, shape in model.inputs}
    sess = ort_session(graph, threads, onnx_bytes)
    names = [o.name for o in sess.get_outputs()]
    runners = {"onnxruntime": lambda: dict(zip(names, sess.run(None, feed))), "compiled C": lambda: model(feed)}
    if reference:
        runners["numpy reference"] = lambda: run_graph(graph, feed)
    say("warm-up")
    # The warm-up runs ONNX Runtime in a thread a signal can stop (a model may loop for ever, and ORT's run
    # returns to Python only when done); the timed runs, on the same input, take as long and run directly.
    from saturate.simplifier import run_interruptibly

    warm = {**runners, "onnxruntime": lambda: dict(zip(names, run_interruptibly(sess, names, feed)))}
    results = {k: f() for k, f in warm.items()}  # warm-up, and the outputs compared below
    times: dict[str, list[float]] = {k: [] for k in runners}
    for run in range(runs):
        say(f"run {run + 1}/{runs}")
        for k, f in runners.items():
            f()
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    work = graph_flops(graph)
    ort_ms = float(np.median(times["onnxruntime"])) * 1e3
    truth = {k: np.asarray(v, np.float64) for k, v in results["onnxruntime"].items()}
    rows = []
    for k in ["numpy reference", "onnxruntime", "compiled C"]:
        if k not in times:
            continue
        ms = float(np.median(times[k])) * 1e3
        err = None if k == "onnxruntime" else max_rel_error(results[k], truth)
        rows.append(Row(k, ms, ms / ort_ms, work / ms / 1e6, err, threads))
    return rows


def format_table(rows: list[Row], title: str = "", peak: float | None = None) -> str:
    """Aligned text table of benchmark rows; "% peak" is of `peak` GFLOP/s per core (measured by
    peak_gflops() unless given) times the row's threads."""
    peak = peak_gflops() if peak is None else peak
    lines = [title] if title else []
    lines.append(f"{'runtime':<16} {'median ms':>10} {'vs ORT':>8} {'GFLOP/s':>9} {'% peak':>7} {'max rel err':>12}")
    for r in rows:
        err = "-" if r.rel_error is None else f"{r.rel_error:.2e}"
        lines.append(f"{r.name:<16} {r.median_ms:>10.2f} {r.ratio_to_ort:>7.2f}x {r.gflops:>9.1f} "
                     f"{100 * r.gflops / (peak * r.threads):>6.1f}% {err:>12}")
    return "\n".join(lines)


@dataclass
class Overhead:
    """What one call costs beyond the kernels, for one model at one thread count: microseconds per call,
    each the median over interleaved batches of back-to-back calls.

    call_us: the public path, CompiledModel.__call__ on the arrays (`saturate.compile_graph(g)(x)`);
    call_dict_us: the same with one {name: array} dict; run_us: the Cython module's Model.run([x]);
    sat_run_us: sat_run called back to back in a C loop on the same buffers (Model.time_sat_run), the time
    inside sat_run: the kernels plus sat_run's own few nanoseconds of set-up; ort_us: ONNX Runtime's
    session.run on the same graph and dict, for reference. overhead_us (run_overhead_us) is the median
    over batches of call_us (run_us) minus sat_run_us of the same batch: what the call from Python adds."""

    model: str
    threads: int
    clock: str
    calls_per_batch: int
    batches: int
    call_us: float
    call_dict_us: float
    run_us: float
    sat_run_us: float
    ort_us: float | None
    overhead_us: float
    run_overhead_us: float
    load: float


def identity_graph(shape: tuple[int, ...] = (1, 3, 32, 32)) -> Graph:
    """One Identity node: a compiled call that copies its input to its output and does nothing else."""
    from saturate.core.ir import Node

    g = Graph(inputs=["x"], outputs=["y"], opset=17, name="identity")
    g.values["x"] = ValueInfo("float32", tuple(shape))
    g.nodes = [Node("Identity", ["x"], ["y"], name="identity")]
    return g


def call_overhead(graph: Graph, name: str = "", threads: int = 1, batches: int = 41, batch_seconds: float = 2e-3,
                  ort: bool = True, seed: int = 0) -> Overhead:
    """Per-call times of one compiled model (see Overhead), measured in this process with every runner's
    batches interleaved (the order rotating each batch), so drift and other processes hit all alike.

    At one thread every kernel runs on the calling thread and the clock is that thread's CPU time, which
    time slices lost to other processes do not inflate; at more threads it is wall time."""
    from saturate.backend.runtime import compile_graph

    model = compile_graph(graph, threads=threads)
    if len(model.segments) != 1 or model.fallback_ops:
        raise SaturateError(f"{name or graph.name}: not one C segment; the overhead is measured on whole-C models")
    module = model.segments[0].model
    rng = np.random.default_rng(seed)
    feed = {n: random_input(rng, shape, model.input_dtypes[n]) for n, shape in model.inputs}
    xs = list(feed.values())
    cpu = threads == 1
    clock = time.thread_time_ns if cpu else time.perf_counter_ns

    def timed(fn):
        def batch(k: int) -> float:
            t = clock()
            for _ in range(k):
                fn()
            return (clock() - t) * 1e-9
        return batch

    runners = {"call": timed(lambda: model(*xs)), "call_dict": timed(lambda: model(feed)),
               "run": timed(lambda: module.run(xs)),
               "sat_run": lambda k: module.time_sat_run(xs, k, threads, cpu)}
    if ort:
        sess = ort_session(graph, threads)
        runners["ort"] = timed(lambda: sess.run(None, feed))
    for f in runners.values():  # warm-up: first-call costs (pool threads, page faults, caches)
        f(20)
    k = max(1, min(5000, round(batch_seconds / max(runners["call"](50) / 50, 1e-9))))
    times: dict[str, list[float]] = {r: [] for r in runners}
    order = list(runners)
    load = os.getloadavg()[0]
    for b in range(batches):
        for r in order[b % len(order):] + order[:b % len(order)]:
            times[r].append(runners[r](k) / k * 1e6)
    med = {r: float(np.median(v)) for r, v in times.items()}
    over = [c - s for c, s in zip(times["call"], times["sat_run"])]
    run_over = [c - s for c, s in zip(times["run"], times["sat_run"])]
    return Overhead(name or graph.name, threads, "thread CPU" if cpu else "wall", k, batches, med["call"],
                    med["call_dict"], med["run"], med["sat_run"], med.get("ort"), float(np.median(over)),
                    float(np.median(run_over)), max(load, os.getloadavg()[0]))


def format_overhead(rows: list[Overhead]) -> str:
    """Aligned text table of call_overhead rows."""
    lines = [f"{'model':<20} {'threads':>7} {'call(x)':>8} {'call({})':>8} {'run':>8} {'sat_run':>9} "
             f"{'overhead':>8} {'run ovh':>8} {'ORT':>8} {'load':>5}  (us per call)"]
    for r in rows:
        ort = "-" if r.ort_us is None else f"{r.ort_us:.2f}"
        lines.append(f"{r.model:<20} {r.threads:>7} {r.call_us:>8.2f} {r.call_dict_us:>8.2f} {r.run_us:>8.2f} "
                     f"{r.sat_run_us:>9.2f} {r.overhead_us:>8.2f} {r.run_overhead_us:>8.2f} {ort:>8} {r.load:>5.2f}")
    return "\n".join(lines)
