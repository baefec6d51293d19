"""C backend: int8 models. QDQ graphs (QuantizeLinear/DequantizeLinear around float ops) and the QLinearConv /
QLinearMatMul forms compiled to C and compared with ONNX Runtime with its graph rewrites off (the graph as
written). Quantized outputs are compared as integers: equal, or one step apart where a float sum lands
within rounding of a half (ORT's own kernels differ from its reference by as much); dequantized outputs
within one quantization step."""

from __future__ import annotations

import numpy as np
import pytest

from backend_util import make
from saturate.core.ir import Node, ValueInfo

pytestmark = pytest.mark.compiler


def arr(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def ints(seed: int, shape, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max + 1, shape).astype(dtype)


def ort_plain(graph, feed) -> dict:
    import onnxruntime as ort

    from saturate.frontend.onnx_io import export_model

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(export_model(graph).SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))


def run_c(graph, feed, all_c: bool = True, threads: int = 1) -> dict:
    from saturate.backend import compile_graph

    model = compile_graph(graph, threads=threads)
    if all_c:
        assert model.fallback_ops == [], model.fallback_ops
    return model(feed)


def assert_steps(got: np.ndarray, want: np.ndarray, step: float, exact_share: float = 0.99) -> None:
    """Within one step everywhere, and equal almost everywhere (integers: `step` 1)."""
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    assert diff.max() <= step * 1.0001, diff.max()
    assert np.mean(diff <= step * 1e-3) >= exact_share, np.mean(diff <= step * 1e-3)


def qdq_cnn(dtype: str, per_channel: bool, opset: int):
    """x -> Q/DQ -> Conv(DQ(w), bias) -> Relu -> Q/DQ -> depthwise Conv -> Q/DQ -> Flatten... -> MatMul(DQ(w))
    -> Q/DQ: the shape of quantize_static's QDQ output, weights quantized symmetric per tensor or per channel."""
    zp_dtype = np.dtype(dtype)
    zp = np.array(128 if dtype == "uint8" else 3, zp_dtype)
    w1, w2, w3 = arr(1, (8, 3, 3, 3)), arr(2, (8, 1, 3, 3)), arr(3, (8 * 4 * 4, 10))
    consts = {"sa": np.float32(0.05), "za": zp, "sb": np.float32(0.04), "zb": zp, "sc": np.float32(0.03),
              "zc": zp, "sd": np.float32(0.2), "zd": zp, "b1": arr(4, (8,)), "b2": arr(5, (8,))}
    nodes = [Node("QuantizeLinear", ["x", "sa", "za"], ["xq"]), Node("DequantizeLinear", ["xq", "sa", "za"], ["xd"])]
    for k, (w, axis) in enumerate(((w1, 0), (w2, 0), (w3, 1))):
        ax = tuple(d for d in range(w.ndim) if d != axis)
        s = (np.abs(w).max(axis=ax) / 127).astype(np.float32) if per_channel else np.float32(np.abs(w).max() / 127)
        shape = [1] * w.ndim
        shape[axis] = -1
        consts[f"w{k}"] = np.clip(np.rint(w / np.reshape(s, shape) if per_channel else w / s), -127, 127).astype(np.int8)
        consts[f"ws{k}"] = s
        consts[f"wz{k}"] = np.zeros(np.shape(s), np.int8)
        nodes.append(Node("DequantizeLinear", [f"w{k}", f"ws{k}", f"wz{k}"], [f"wd{k}"], {"axis": axis}))
    nodes += [Node("Conv", ["xd", "wd0", "b1"], ["c1"], {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
              Node("Relu", ["c1"], ["r1"]),
              Node("QuantizeLinear", ["r1", "sb", "zb"], ["r1q"]), Node("DequantizeLinear", ["r1q", "sb", "zb"], ["r1d"]),
              Node("Conv", ["r1d", "wd1", "b2"], ["c2"], {"pads": [1, 1, 1, 1], "group": 8}),
              Node("QuantizeLinear", ["c2", "sc", "zc"], ["c2q"]), Node("DequantizeLinear", ["c2q", "sc", "zc"], ["c2d"]),
              Node("Flatten", ["c2d"], ["f"]), Node("MatMul", ["f", "wd2"], ["m"]),
              Node("QuantizeLinear", ["m", "sd", "zd"], ["mq"]), Node("DequantizeLinear", ["mq", "sd", "zd"], ["y"])]
    g = make(nodes, {"x": (1, 3, 8, 8)}, consts, outputs=["y", "c2q"], opset=opset)
    g.values["c2q"] = ValueInfo(dtype, (1, 8, 4, 4))
    return g, float(consts["sd"])


@pytest.mark.parametrize("dtype,per_channel,opset", [("uint8", False, 13), ("int8", True, 19)])
def test_qdq_cnn_runs_in_c_like_ort(dtype, per_channel, opset):
    graph, step = qdq_cnn(dtype, per_channel, opset)
    feed = {"x": arr(0, (1, 3, 8, 8)) * 2}
    got, want = run_c(graph, feed), ort_plain(graph, feed)
    assert_steps(got["c2q"], want["c2q"], 1)
    assert_steps(got["y"], want["y"], step)


def qlinear_conv(xdtype, wdtype, cin, cout, hw, kernel, attrs, bias=True, per_channel=True):
    x_zp = np.array(120 if xdtype == np.uint8 else -5, xdtype)
    w = ints(1, (cout, cin // attrs.get("group", 1), kernel, kernel), wdtype)
    w_zp = (np.full(cout, 7, wdtype) if per_channel else np.array(7, wdtype)) if wdtype == np.uint8 \
        else (np.zeros(cout, wdtype) if per_channel else np.array(0, wdtype))
    w_s = (np.linspace(0.002, 0.01, cout).astype(np.float32) if per_channel else np.float32(0.004))
    consts = {"xs": np.float32(0.05), "xz": x_zp, "w": w, "ws": w_s, "wz": w_zp, "ys": np.float32(0.7),
              "yz": np.array(100 if xdtype == np.uint8 else 10, xdtype)}
    ins = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    if bias:
        consts["b"] = np.random.default_rng(2).integers(-3000, 3000, cout).astype(np.int32)
        ins.append("b")
    g = make([Node("QLinearConv", ins, ["y"], attrs)], {"x": (2, cin, hw, hw)}, consts)
    g.values["x"] = ValueInfo(np.dtype(xdtype).name, (2, cin, hw, hw))
    g.values["y"] = ValueInfo(np.dtype(xdtype).name, None)
    return g, {"x": ints(0, (2, cin, hw, hw), xdtype)}


@pytest.mark.parametrize("xdtype,wdtype,cin,cout,hw,kernel,attrs,bias,per_channel", [
    (np.uint8, np.int8, 16, 20, 9, 3, {"pads": [1, 1, 1, 1]}, True, True),
    (np.int8, np.int8, 8, 8, 10, 3, {"group": 8, "strides": [2, 2], "pads": [1, 0, 1, 1]}, True, False),
    (np.uint8, np.int8, 6, 6, 23, 3, {"group": 6, "strides": [2, 2], "pads": [1, 1, 0, 1]}, True, True),
    (np.uint8, np.uint8, 12, 34, 7, 1, {"group": 2}, False, True),
    (np.uint8, np.uint8, 6, 6, 9, 3, {"group": 6, "dilations": [2, 2], "pads": [2, 1, 2, 3]}, True, True),
    (np.int8, np.int8, 3, 5, 11, 5, {"strides": [2, 1], "dilations": [1, 2], "pads": [2, 2, 2, 2]}, True, True),
    (np.uint8, np.int8, 16, 100, 4, 3, {"pads": [1, 1, 1, 1]}, True, True),  # 2 threads: channel chunks
])
def test_qlinearconv_matches_ort(xdtype, wdtype, cin, cout, hw, kernel, attrs, bias, per_channel):
    graph, feed = qlinear_conv(xdtype, wdtype, cin, cout, hw, kernel, attrs, bias, per_channel)
    got = run_c(graph, feed)["y"]
    assert_steps(got, ort_plain(graph, feed)["y"], 1)
    # two threads share the input's padded copy by rows and the products by pixel tiles
    assert np.array_equal(run_c(graph, feed, threads=2)["y"], got)


@pytest.mark.parametrize("ashape,k,n,adtype,bdtype", [((7, 40), 40, 24, np.uint8, np.int8),
                                                       ((2, 3, 5, 33), 33, 17, np.int8, np.int8),
                                                       ((4, 16), 16, 9, np.uint8, np.uint8),
                                                       ((3, 50), 50, 150, np.uint8, np.int8)])
def test_qlinearmatmul_matches_ort(ashape, k, n, adtype, bdtype):
    consts = {"as": np.float32(0.03), "az": np.array(7, adtype), "b": ints(3, (k, n), bdtype),
              "bs": np.linspace(0.01, 0.02, n).astype(np.float32) if bdtype == np.int8 else np.float32(0.01),
              "bz": np.zeros(n, bdtype) if bdtype == np.int8 else np.array(130, bdtype),
              "ys": np.float32(0.9), "yz": np.array(3, adtype)}
    g = make([Node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])], {"a": ashape}, consts)
    g.values["a"] = ValueInfo(np.dtype(adtype).name, ashape)
    g.values["y"] = ValueInfo(np.dtype(adtype).name, None)
    feed = {"a": ints(4, ashape, adtype)}
    got = run_c(g, feed)["y"]
    assert_steps(got, ort_plain(g, feed)["y"], 1)
    assert np.array_equal(run_c(g, feed, threads=2)["y"], got)  # 150 channels: chunks of panels on 2 threads


@pytest.mark.parametrize("isa,march", [("avx2", ["-march=x86-64-v3"]), ("portable", [])])
def test_int8_loops_without_vnni_match_ort(tmp_path, isa, march):
    """An AVX2 build (no VNNI: qgemm.h's 16-bit lanes) and a portable one (its scalar loop) of a QLinearConv
    and a QLinearMatMul, each in a process of its own (the ISA is read when the backend is imported)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    script = (
        "import numpy as np\n"
        "import test_backend_quant as t\n"
        "g, feed = t.qlinear_conv(np.int8, np.int8, 8, 20, 6, 3, {'pads': [1, 1, 1, 1], 'group': 2})\n"
        "t.assert_steps(t.run_c(g, feed)['y'], t.ort_plain(g, feed)['y'], 1)\n"
        "t.test_qlinearmatmul_matches_ort((5, 37), 37, 18, np.uint8, np.int8)\n"
        "from saturate.backend.build import compile_flags\n"
        f"assert [f for f in compile_flags() if f.startswith('-march')] == {march!r}\n"
        "print('portable ok')\n")
    env = dict(os.environ, SATURATE_ISA=isa,
               PYTHONPATH=os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and "portable ok" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.parametrize("adtype,bdtype,az,bz,ashape,bshape,extreme", [
    (np.int8, np.int8, -3, 3, (1, 4, 16, 16), (1, 4, 16, 16), False),  # attention's scores
    (np.uint8, np.int8, 128, 0, (2, 3, 7, 40), (2, 3, 40, 5), False),
    (np.uint8, np.uint8, 0, 255, (5, 258), (258, 6), True),  # K |a - az| |b - bz| = 2^24 - 766
    (np.int8, np.int8, -128, 127, (1, 259), (259, 4), False),  # 259 x 255 x 255: past 2^24, the interpreter's
])
def test_qlinearmatmul_of_two_activations_runs_in_c(adtype, bdtype, az, bz, ashape, bshape, extreme):
    """A QLinearMatMul whose B is an activation too (an int8 transformer's attention products) runs in C as
    float ops on the integers (dequantized with scale 1, a float MatMul, requantized): its sums are exact
    while K |a - az| |b - bz| < 2^24, so the outputs are ONNX Runtime's; past that bound it stays in the
    interpreter."""
    from saturate.backend import compile_graph

    consts = {"as": np.float32(0.03), "az": np.array(az, adtype), "bs": np.float32(0.011),
              "bz": np.array(bz, bdtype), "ys": np.float32(0.7 if not extreme else 2000.0),
              "yz": np.array(1, adtype)}
    g = make([Node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])],
             {"a": ashape, "b": bshape}, consts)
    g.values["a"], g.values["b"] = ValueInfo(np.dtype(adtype).name, ashape), ValueInfo(np.dtype(bdtype).name, bshape)
    g.values["y"] = ValueInfo(np.dtype(adtype).name, None)
    feed = {"a": ints(5, ashape, adtype), "b": ints(6, bshape, bdtype)}
    if extreme:  # every product (255 - 0)(0 - 255): the largest sum the bound allows
        feed = {"a": np.full(ashape, 255, adtype), "b": np.zeros(bshape, bdtype)}
    model = compile_graph(g)
    bounded = ashape[-1] * max(abs(az - np.iinfo(adtype).min), abs(np.iinfo(adtype).max - az)) * \
        max(abs(bz - np.iinfo(bdtype).min), abs(np.iinfo(bdtype).max - bz)) < 2 ** 24
    assert [op for op, _, _ in model.fallback_ops] == ([] if bounded else ["QLinearMatMul"])
    got, want = model(feed)["y"], ort_plain(g, feed)["y"]
    if extreme:
        assert np.array_equal(got, want) and len(np.unique(got)) == 1 and got.reshape(-1)[0] != 1
    assert_steps(got, want, 1)


def test_int8_values_move_in_c_and_keep_their_dtype():
    """Transpose, Slice, Concat, Expand, Gather and Split copy the integers C holds as floats (an int8
    transformer transposes its quantized heads): one C segment, an int8 output given back as int8."""
    from saturate.backend import compile_graph

    nodes = [Node("QuantizeLinear", ["x", "s", "z"], ["q"]), Node("Transpose", ["q"], ["t"], {"perm": [0, 2, 1, 3]}),
             Node("Slice", ["t", "st", "en", "ax"], ["sl"]), Node("Concat", ["sl", "t"], ["c"], {"axis": 1}),
             Node("Expand", ["c", "shape"], ["e"]), Node("Gather", ["e", "idx"], ["g"], {"axis": 3}),
             Node("Split", ["g"], ["p0", "p1"], {"axis": 2, "num_outputs": 2}),
             Node("DequantizeLinear", ["p1", "s", "z"], ["y"])]
    consts = {"s": np.float32(0.05), "z": np.array(-4, np.int8), "st": np.array([1], np.int64),
              "en": np.array([3], np.int64), "ax": np.array([1], np.int64), "shape": np.array([2, 1, 1, 1], np.int64),
              "idx": np.array([4, 2, 0], np.int64)}
    g = make(nodes, {"x": (1, 3, 4, 5)}, consts, outputs=["p0", "y"], opset=18)
    g.values["p0"] = ValueInfo("int8", None)
    model = compile_graph(g)
    assert model.fallback_ops == [] and len(model.segments) == 1
    feed = {"x": arr(7, (1, 3, 4, 5)) * 4}
    got, want = model(feed), ort_plain(g, feed)
    assert got["p0"].dtype == np.int8 and np.array_equal(got["p0"], want["p0"])
    assert np.array_equal(got["y"], want["y"])


@pytest.mark.parametrize("case,reason", [
    ("runtime scale", "to be a constant"), ("zero scale", "positive, finite scales"),
    ("axis mismatch", "3 scales for axis 1"), ("runtime weights", "'b' to be a constant"),
])
def test_quantized_nodes_c_cannot_run_fall_back_with_a_reason(case, reason):
    """Parameters from a model are checked before C takes a node: what C cannot run goes to the interpreter
    with the reason the partition reports (never an error at emit or a wrong kernel)."""
    from saturate.backend.segments import partition

    consts = {"s": np.float32(0.1), "z": np.array(0, np.uint8)}
    inputs = {"x": (2, 4)}
    if case == "runtime weights":
        # a reduction of 259: past what a float product of two uint8 activations sums exactly
        # (test_qlinearmatmul_of_two_activations_runs_in_c)
        consts.update({"ys": np.float32(0.5)})
        g = make([Node("QLinearMatMul", ["xq", "s", "z", "b", "s", "z", "ys", "z"], ["y"])],
                 {"xq": (2, 259), "b": (259, 3)}, consts)
        g.values["xq"], g.values["b"] = ValueInfo("uint8", (2, 259)), ValueInfo("uint8", (259, 3))
    else:
        if case == "zero scale":
            consts["s"] = np.float32(0.0)
        if case == "axis mismatch":
            consts["s"], consts["z"] = np.full(3, 0.1, np.float32), np.zeros(3, np.uint8)
        if case == "runtime scale":
            del consts["s"]
            inputs["s"] = ()
        g = make([Node("QuantizeLinear", ["x", "s", "z"], ["y"], {"axis": 1})], inputs, consts)
    part = partition(g)
    assert [n.op for n, _ in part.fallback] == [g.nodes[0].op]
    assert reason in part.fallback[0][1], part.fallback[0][1]


def test_qlinearconv_whose_sums_may_pass_32_bits_stays_in_the_interpreter():
    """The kernels add a conv's sums, bias included, in 32-bit lanes: a bias that, with the taps' largest sum,
    could pass 2^31 keeps the node out of C (a bias 1000 smaller runs there)."""
    from saturate.backend.segments import partition

    graph, _ = qlinear_conv(np.uint8, np.int8, 4, 3, 5, 3, {"pads": [1, 1, 1, 1]})
    taps = 4 * 3 * 3 * 255 * 255
    for bias, falls_back in ((2**31 - taps, True), (2**31 - taps - 1000, False)):
        graph.constants["b"] = np.array([5, -bias, 7], np.int32)
        fallback = partition(graph).fallback
        assert [n.op for n, _ in fallback] == (["QLinearConv"] if falls_back else [])
        if falls_back:
            assert "sums that fit 32 bits" in fallback[0][1]


def test_compiled_directory_of_an_int8_model_takes_and_gives_integers(tmp_path):
    """A directory `saturate compile` writes for a model with uint8 input and output loads and runs on
    uint8 arrays (its graph.onnx keeps the dtypes the C segment's float interface drops)."""
    from saturate.backend import compile_graph
    from saturate.backend.runtime import load

    graph, feed = qlinear_conv(np.uint8, np.uint8, 12, 34, 7, 1, {"group": 2}, False, True)
    compile_graph(graph, out_dir=tmp_path / "m")
    model = load(tmp_path / "m")
    assert model.fallback_ops == []
    got = model(feed)["y"]
    assert_steps(got, ort_plain(graph, feed)["y"], 1)
