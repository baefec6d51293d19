"""C backend, benchmark stage: reference interpreter, ONNX Runtime and compiled C side by side."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from saturate.backend.partition import partition
from saturate.core.errors import SaturateError
from saturate.core.ir import Graph, ValueInfo

PEAK_GFLOPS = 263.0  # one core's AVX-512 FMA peak on the reference machine


@dataclass
class Row:
    """One runtime's result: median latency (ms), ratio to ONNX Runtime, GFLOP/s, max relative error."""

    name: str
    median_ms: float
    ratio_to_ort: float | None
    gflops: float
    rel_error: float | None


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


def ort_session(graph: Graph, threads: int, onnx_bytes: bytes | None = None):
    """An ONNX Runtime session with every graph optimization, `threads` intra-op threads."""
    import onnxruntime as ort

    if onnx_bytes is None:
        from saturate.frontend.onnx_io import export_model

        onnx_bytes = export_model(graph).SerializeToString()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
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
    `progress` is told each stage as it starts (compile, warm-up, run k/N)."""
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
    results = {k: f() for k, f in runners.items()}  # warm-up, and the outputs compared below
    times: dict[str, list[float]] = {k: [] for k in runners}
    for run in range(runs):
        say(f"run {run + 1}/{runs}")
        for k, f in runners.items():
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
        rows.append(Row(k, ms, ms / ort_ms, work / ms / 1e6, err))
    return rows


def format_table(rows: list[Row], title: str = "") -> str:
    """Aligned text table of benchmark rows."""
    lines = [title] if title else []
    lines.append(f"{'runtime':<16} {'median ms':>10} {'vs ORT':>8} {'GFLOP/s':>9} {'% peak':>7} {'max rel err':>12}")
    for r in rows:
        err = "-" if r.rel_error is None else f"{r.rel_error:.2e}"
        lines.append(f"{r.name:<16} {r.median_ms:>10.2f} {r.ratio_to_ort:>7.2f}x {r.gflops:>9.1f} "
                     f"{100 * r.gflops / PEAK_GFLOPS:>6.1f}% {err:>12}")
    return "\n".join(lines)
