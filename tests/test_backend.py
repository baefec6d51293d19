"""C backend: example models, each op family, fusion, memory planning, errors and the CLI."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from backend_util import check_three_way, feed_for, make, rel_error, side_by_side
from saturate.core.errors import SaturateError
from saturate.core.ir import Node

pytestmark = pytest.mark.compiler
rng = np.random.default_rng(1)


def w(*shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name", ["mlp", "vgg", "resnet18", "mobilenet", "chain-6"])
def test_examples_match_reference_and_ort(name):
    from saturate.frontend import load_graph

    check_three_way(load_graph(f"example:{name}"))


@pytest.mark.slow
# chain-450 passes LARGE_STEPS (400), so the large-program flags are built and run; chain-2000
# took gcc ten minutes on an empty cache.
@pytest.mark.parametrize("name", ["vgg11bn", "resnet50", "chain-450"])
def test_large_examples_match_reference_and_ort(name):
    from saturate.frontend import load_graph

    check_three_way(load_graph(f"example:{name}"))


def test_folded_graph_matches_original():
    from saturate.frontend import load_graph
    from saturate import compile_graph, optimize
    from saturate.interp.interpreter import run_graph

    g = load_graph("example:mobilenet")
    folded, _ = optimize(g.copy())
    assert folded.op_counts()["BatchNormalization"] < g.op_counts()["BatchNormalization"]
    feed = feed_for(g)
    ref = run_graph(g, feed)
    got = compile_graph(folded)(feed)
    for k in g.outputs:
        assert rel_error(got[k], ref[k]) <= 1e-4


CONV_VARIANTS = [
    ({"group": 4, "pads": [1, 0, 2, 1], "strides": [2, 1]}, (8, 2, 3, 3), (2, 8, 9, 7)),   # grouped, asymmetric
    ({"group": 6, "pads": [1, 1, 1, 1]}, (6, 1, 3, 3), (1, 6, 8, 8)),                       # depthwise
    ({"group": 3, "strides": [2, 2], "pads": [1, 1, 1, 1]}, (6, 1, 3, 3), (1, 3, 9, 9)),    # channel multiplier 2
    ({"dilations": [2, 3], "pads": [2, 3, 2, 3]}, (5, 3, 3, 3), (1, 3, 11, 12)),            # dilated
    ({}, (7, 5, 1, 1), (2, 5, 6, 6)),                                                      # direct 1x1
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, (4, 3, 4, 4), (1, 3, 9, 10)),
    ({"strides": [3], "pads": [1, 2]}, (4, 3, 5), (2, 3, 17)),                              # 1-D
]


# The cases of one list side by side in one build (output cK_y is case K): each node is planned alone,
# and one build saves a compiler start a case.
def test_conv_variants():
    graphs = [make([Node("Conv", ["x", "w", "b"], ["y"], attrs)], {"x": xshape}, {"w": w(*wshape), "b": w(wshape[0])})
              for attrs, wshape, xshape in CONV_VARIANTS]
    check_three_way(side_by_side(graphs))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("wshape,xshape,group", [
    ((88, 16, 3, 3), (1, 16, 7, 7), 1),     # 49 pixels: 7 pixel panels, the last channel panel 24 wide
    ((128, 20, 3, 3), (2, 40, 14, 14), 2),  # 196 pixels per image, two images, grouped
    ((64, 300, 1, 1), (1, 300, 13, 13), 1), # stride 2 1x1 over several k-blocks, 7x7 out
])
def test_conv_small_outputs_run_transposed(wshape, xshape, group, threads):
    from saturate.backend.emit_nn import transposed_product
    from saturate.backend.shapes import conv_window

    attrs = {"group": group, "pads": [1, 1, 1, 1]} if wshape[2] == 3 else {"strides": [2, 2]}
    conv = Node("Conv", ["x", "w", "b"], ["c"], attrs)
    nodes = [conv, Node("Relu", ["c"], ["y"])]  # bias and relu run in the transposed path's epilogue
    g = make(nodes, {"x": xshape}, {"w": w(*wshape), "b": w(wshape[0])})
    assert transposed_product(xshape, wshape, conv_window(conv, xshape, wshape), group)
    check_three_way(g, ort=threads == 1, threads=threads)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("tail", [
    # per-channel steps run before the direct conv's transpose, the rest after it on 8-pixel runs
    lambda: ([Node("Mul", ["c", "s"], ["m"]), Node("Add", ["m", "r"], ["a"]), Node("Clip", ["a", "lo", "hi"], ["y"])],
             {"s": w(40, 1, 1), "lo": np.float32(-0.5), "hi": np.float32(0.6)}),
    # an operand per image and channel (batch of 2), then a per-pixel one, then relu
    lambda: ([Node("Add", ["c", "pn"], ["m"]), Node("Sub", ["r", "m"], ["a"]), Node("Relu", ["a"], ["y"])],
             {"pn": w(2, 40, 1, 1)}),
    # a step without a vector form: the whole chain falls back to the scalar epilogue
    lambda: ([Node("Add", ["c", "r"], ["a"]), Node("Sigmoid", ["a"], ["y"])], {}),
])
def test_direct_conv_epilogue_forms(tail, threads):
    nodes, consts = tail()
    conv = Node("Conv", ["x", "w", "b"], ["c"], {"pads": [1, 1, 1, 1], "strides": [1, 2]})
    g = make([conv, *nodes], {"x": (2, 12, 9, 13), "r": (2, 40, 9, 7)}, {"w": w(40, 12, 3, 3), "b": w(40), **consts})
    check_three_way(g, ort=threads == 1, threads=threads)


POOLS = [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("MaxPool", {"kernel_shape": [3, 3], "dilations": [2, 2]}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("AveragePool", {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    ("GlobalAveragePool", {}),
]


def test_pools():
    check_three_way(side_by_side([make([Node(op, ["x"], ["y"], attrs)], {"x": (2, 3, 9, 10)}) for op, attrs in POOLS]))


STRIDE_TWO_MAX_POOLS = [
    # max pools at column stride 2 on rows of whole and partial 16- and 8-output blocks (sat_pool_max_s2)
    ((1, 4, 48, 48), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # ResNet's: 16 + 8
    ((2, 3, 11, 70), {"kernel_shape": [2, 2], "strides": [2, 2]}),                       # VGG's: 35 columns
    ((1, 2, 9, 37), {"kernel_shape": [3, 4], "strides": [1, 2], "pads": [0, 2, 1, 3], "ceil_mode": 1}),
    ((1, 2, 5, 9), {"kernel_shape": [3, 3], "strides": [2, 2]}),                          # 4 columns: one part block
]


def test_max_pools_at_column_stride_two():
    check_three_way(side_by_side([make([Node("MaxPool", ["x"], ["y"], attrs)], {"x": xshape})
                                  for xshape, attrs in STRIDE_TWO_MAX_POOLS]))


def test_gemm_matmul_and_layout_ops():
    nodes = [
        Node("Gemm", ["a", "b", "c"], ["g"], {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}),
        Node("MatMul", ["g", "m"], ["mm"]),                      # (4, 5) x (5, 3)
        Node("MatMul", ["t", "bt"], ["bm"]),                     # batched with broadcasting
        Node("Transpose", ["bm"], ["tr"], {"perm": [2, 0, 3, 1]}),
        Node("Softmax", ["tr"], ["sm"], {"axis": 1}),
        Node("Concat", ["mm", "mm2"], ["cat"], {"axis": 1}),
        Node("Flatten", ["bm"], ["fl"], {"axis": 2}),
        Node("Reshape", ["fl", "shape"], ["rs"]),
    ]
    consts = {"b": w(5, 6), "c": w(5), "m": w(5, 3), "bt": w(2, 1, 4, 3), "shape": np.array([0, -1], np.int64)}
    g = make(nodes, {"a": (6, 4), "t": (3, 5, 4), "mm2": (4, 2)}, consts, outputs=["sm", "cat", "rs", "g"])
    check_three_way(g)


def test_elementwise_and_batchnorm_chain():
    nodes = [
        Node("BatchNormalization", ["x", "s", "bb", "mu", "var"], ["bn"], {"epsilon": 1e-3}),
        Node("Sub", ["k", "bn"], ["d"]),                           # constant on the left
        Node("Div", ["d", "q"], ["e"]),                            # broadcast over (1, W)
        Node("Clip", ["e", "lo", "hi"], ["c"]),
        Node("LeakyRelu", ["c"], ["l"], {"alpha": 0.2}),
        Node("Sigmoid", ["l"], ["s1"]),
        Node("Tanh", ["x"], ["t1"]),
        Node("Erf", ["t1"], ["e1"]),
        Node("Mul", ["s1", "e1"], ["y"]),
    ]
    consts = {"s": w(4), "bb": w(4), "mu": w(4), "var": np.abs(w(4)) + 0.5, "k": w(4, 1, 1),
              "q": np.abs(w(1, 5)) + 1, "lo": np.float32(-0.5), "hi": np.float32(0.7)}
    check_three_way(make(nodes, {"x": (2, 4, 3, 5)}, consts))


@pytest.mark.parametrize("threads", [1, 2])
def test_elementwise_steps_of_long_runs_are_shared_in_pieces(threads):
    """Elementwise steps whose runs are longer than a work item are cut into pieces of a run: BERT's GELU
    (one run: the divisor is a scalar), an operand per row of 40000 elements (runs of a row), one along the
    rows, and a run whose length is no multiple of the piece."""
    from saturate.backend.emit import emit

    gelu = make([Node("Div", ["x", "r2"], ["d"]), Node("Erf", ["d"], ["e"]), Node("Add", ["e", "one"], ["a"]),
                 Node("Mul", ["x", "a"], ["m"]), Node("Mul", ["m", "half"], ["y"])], {"x": (1, 128, 1536)},
                {"r2": np.float32(1.4142135), "one": np.float32(1.0), "half": np.float32(0.5)})
    rows = make([Node("Mul", ["x", "p"], ["m"]), Node("Add", ["m", "q"], ["y"])], {"x": (1, 3, 40000)},
                {"p": w(1, 3, 1), "q": w(1, 1, 40000)})
    odd = make([Node("Sub", ["x", "p"], ["y"])], {"x": (20011,)}, {"p": np.float32(0.25)})
    g = side_by_side([gelu, rows, odd])
    counts = [int(c) for c in re.findall(r"sat_parallel\((\d+), pw_\d+_items", emit(g).source)]
    assert len(counts) == 3 and min(counts) > 1, counts
    check_three_way(g, threads=threads)


def test_two_threads_agree_with_one():
    from saturate.frontend import load_graph

    check_three_way(load_graph("example:resnet18"), ort=False, threads=2)


def test_threads_beside_busy_processes_agree_with_one():
    """Two processes that never sleep take both cores: the caller loses its core to the worker it wakes, the
    next runs keep the threads apart, and those losing it too are the caller's alone (pool.h's SAT_APART_NS
    and SAT_FEWER_NS), then shared again. Every call's result, free, apart or alone, is the one-thread
    result."""
    from saturate.backend import compile_graph
    from saturate.frontend import load_graph

    g = load_graph("example:resnet18")
    feed = feed_for(g, 0)
    want = compile_graph(g, threads=1)(feed)
    model = compile_graph(g, threads=2)
    with _spinning(2):
        got = [model(feed) for _ in range(12)]
    _all_agree(got, want)


@contextlib.contextmanager
def _spinning(processes: int):
    """That many processes that never sleep, for as long as the block runs."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def _all_agree(got: list[dict], want: dict) -> None:
    for out in got:
        for k, v in want.items():
            assert rel_error(out[k], np.asarray(v, np.float64)) <= 1e-5, k


def _cpus_of_threads() -> dict[int, frozenset[int]]:
    """Each thread of this process: the CPUs it may run on (/proc's Cpus_allowed_list)."""
    import os

    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                text = f.read()
        except OSError:  # the thread ended
            continue
        spec = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Cpus_allowed_list"))
        cpus = set()
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
        out[int(tid)] = frozenset(cpus)
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="threads are kept apart by Linux CPU affinity, on 2 or more CPUs")
def test_threads_apart_beside_a_busy_core_and_back_after_every_call():
    """Beside processes spinning on all the caller's CPUs but one, a run with the threads free loses the
    caller's core and the next runs keep them apart: the caller on its CPU alone, the worker on the others
    (seen in /proc while the calls run); after every call each thread may use the CPUs it could before, and
    every result is the one-thread result."""
    import threading
    import time

    from saturate.backend import compile_graph
    from saturate.frontend import load_graph

    g = load_graph("example:resnet18")
    feed = feed_for(g, 0)
    want = compile_graph(g, threads=1)(feed)
    model = compile_graph(g, threads=2)
    model(feed)  # the worker exists from the first run on
    allowed = frozenset(os.sched_getaffinity(0))
    caller = threading.get_native_id()
    seen, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            seen.append(_cpus_of_threads())
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample)
    with _spinning(len(allowed) - 1):
        sampler.start()
        try:
            got = []
            for _ in range(40):
                got.append(model(feed))
                assert frozenset(os.sched_getaffinity(0)) == allowed
        finally:
            stop.set()
            sampler.join()
    _all_agree(got, want)
    apart = [m for m in seen if len(m.get(caller, allowed)) == 1
             and any(cpus == allowed - m[caller] for t, cpus in m.items() if t != caller)]
    assert apart, "the threads were never kept apart"
    assert all(cpus == allowed for cpus in _cpus_of_threads().values())


def test_fusion_follows_single_consumers():
    from saturate.backend.plan import fuse
    from saturate.backend.shapes import infer_shapes

    # c has two consumers (relu and the output add): it must stay a buffer; r is fused into Add.
    nodes = [Node("Conv", ["x", "w"], ["c"], {"pads": [1, 1, 1, 1]}), Node("Relu", ["c"], ["r"]),
             Node("Add", ["r", "c"], ["a"]), Node("Relu", ["a"], ["y"])]
    g = make(nodes, {"x": (1, 2, 5, 5)}, {"w": w(3, 2, 3, 3)})
    steps, _ = fuse(g, infer_shapes(g, {"x": (1, 2, 5, 5)}))
    assert [(s.anchor.op, [n.op for n in s.chain]) for s in steps] == [("Conv", []), ("Relu", ["Add", "Relu"])]
    check_three_way(g)


def test_memory_plan_reuses_buffers_without_overlap():
    from saturate.frontend import load_graph
    from saturate.backend.emit import emit

    e = emit(load_graph("example:resnet18"))
    pl, sh = e.plan, e.shapes
    assert pl.arena_bytes < pl.naive_bytes
    life = {}
    for k, s in enumerate(pl.steps):
        life.setdefault(s.out, [k, k])
        for v in s.reads():
            r = pl.root(v)
            if r in life:
                life[r][1] = max(life[r][1], k)
    for a in pl.offsets:
        for b in pl.offsets:
            if a < b and not (life[a][1] < life[b][0] or life[b][1] < life[a][0]):
                ea, eb = pl.offsets[a] + 4 * np.prod(sh[a]), pl.offsets[b] + 4 * np.prod(sh[b])
                assert ea <= pl.offsets[b] or eb <= pl.offsets[a], (a, b)


def test_bad_inputs_raise_clear_errors():
    from saturate import compile_graph

    g = make([Node("Relu", ["x"], ["y"])], {"x": (2, 3)})
    model = compile_graph(g)
    with pytest.raises(SaturateError, match="shape"):
        model(np.zeros((3, 2), np.float32))
    with pytest.raises(SaturateError, match="float64"):
        model(np.zeros((2, 3)))
    with pytest.raises(SaturateError, match="missing input 'x'"):
        model({})
    assert np.array_equal(model(x=-np.ones((2, 3), np.float32))["y"], np.zeros((2, 3), np.float32))


def test_unknown_op_fails_at_compile_time_naming_node_and_op():
    from saturate import compile_graph

    # A custom-domain op has neither a kernel nor an interpreter implementation.
    g = make([Node("Relu", ["x"], ["r"]), Node("Frob", ["r"], ["y"], name="hs1", domain="com.example")], {"x": (2, 3)})
    with pytest.raises(SaturateError, match=r"node 'hs1' \(Frob\).*'Frob'"):
        compile_graph(g)
    g = make([Node("Relu", ["x"], ["y"])], {"x": ("N", 3)})
    with pytest.raises(SaturateError, match="static"):
        compile_graph(g)


def test_cli_compile_run_and_bench(tmp_path, capsys):
    from saturate.cli import main

    assert main(["compile", "example:mlp", "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "peak workspace" in out
    from saturate.backend.build import BUILD_FILES

    assert {p.name for p in (tmp_path / "out").iterdir()} == set(BUILD_FILES)  # model.h and the module too
    # Weights live in the binary file, not in C array literals.
    assert (tmp_path / "out" / "model.c").stat().st_size < (tmp_path / "out" / "weights.bin").stat().st_size
    assert main(["bench", "example:mlp", "--runs", "2"]) == 0
    table = capsys.readouterr().out
    for row in ("numpy reference", "onnxruntime", "compiled C", "GFLOP/s"):
        assert row in table
    assert main(["compile", "example:nonesuch", "-o", str(tmp_path / "x")]) == 2


def test_cli_run_with_c_backend_matches_numpy(tmp_path, capsys):
    from saturate.cli import main

    x = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    for backend in ("numpy", "c"):
        assert main(["run", "example:vgg", "--backend", backend, "--input", str(tmp_path / "x.npy"),
                     "-o", str(tmp_path / f"{backend}.npy")]) == 0
    assert rel_error(np.load(tmp_path / "c.npy"), np.load(tmp_path / "numpy.npy").astype(np.float64)) <= 1e-4
    np.save(tmp_path / "bad.npy", x[:, :, :16])
    assert main(["run", "example:vgg", "--backend", "c", "--input", str(tmp_path / "bad.npy")]) == 2
    assert "expects (1, 3, 32, 32)" in capsys.readouterr().err


def test_edge_graphs_identity_runtime_weights_duplicate_outputs():
    check_three_way(make([Node("Identity", ["x"], ["y"])], {"x": (2, 3)}), ort=False)
    # Runtime conv weights take the BLAS path; an output that is also read later is never fused away.
    g = make([Node("Conv", ["x", "k"], ["c"], {"pads": [1, 1, 1, 1]}), Node("Relu", ["c"], ["r"]),
              Node("Add", ["r", "c"], ["y"])], {"x": (1, 4, 6, 6), "k": (5, 4, 3, 3)}, outputs=["y", "c", "r"])
    for threads in (1, 2):
        check_three_way(g, ort=False, threads=threads)
    g = make([Node("Reshape", ["wf", "shp"], ["k"]), Node("Conv", ["x", "k"], ["y"], {"group": 2})],
             {"x": (1, 4, 5, 5)}, {"wf": w(8 * 2 * 9), "shp": np.array([8, 2, 3, 3], np.int64)})
    check_three_way(g)
    assert list(check_three_way(make([Node("Relu", ["x"], ["y"])], {"x": (3,)}, outputs=["y", "y"]), ort=False)) == ["y"]
