"""Quantized (QDQ) models: the interpreter runs the quantization ops at every opset from 10 as ONNX
Runtime does, and rules/quant.rules folds quantize_static's QDQ graphs into QLinearConv and
QLinearMatMul with outputs within one quantization step of ONNX Runtime on the original."""

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from saturate.core.ir import Node
from saturate.interp.interpreter import eval_node

RNG = np.random.default_rng(7)


def ort_node(op, inputs, attrs, opset, n_out=1):
    """One node in ONNX Runtime: inputs[0] fed, the rest initializers (None: omitted)."""
    names = [f"i{k}" if a is not None else "" for k, a in enumerate(inputs)]
    node = helper.make_node(op, names, [f"o{k}" for k in range(n_out)], **attrs)
    inits = [numpy_helper.from_array(np.asarray(a), n) for a, n in zip(inputs[1:], names[1:]) if a is not None]
    x = inputs[0]
    graph = helper.make_graph([node], "one", [helper.make_tensor_value_info(
        "i0", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
        [onnx.ValueInfoProto(name=f"o{k}") for k in range(n_out)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"i0": x})


def ours(op, inputs, attrs, opset, n_out=1):
    node = Node(op, [f"i{k}" if a is not None else "" for k, a in enumerate(inputs)],
                [f"o{k}" for k in range(n_out)], dict(attrs), name="n")
    return eval_node(node, inputs, opset)


def assert_same(op, inputs, attrs, opset, n_out=1):
    want = ort_node(op, inputs, attrs, opset, n_out)
    got = ours(op, inputs, attrs, opset, n_out)
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


X = (RNG.standard_normal((2, 3, 5, 5)) * 3).astype(np.float32)
CHANNEL_SCALES = np.array([0.01, 0.1, 0.2], np.float32)


@pytest.mark.parametrize("opset", [10, 13, 19, 21])
@pytest.mark.parametrize("zero_point", [np.uint8(128), np.int8(-3), np.uint8(0)])
def test_quantize_dequantize_per_tensor_match_ort(opset, zero_point):
    # Halves of the scale land on ties: rounding must go to even, then saturate.
    x = np.concatenate([X.ravel(), np.arange(-8, 9, dtype=np.float32) * 0.025, [1e6, -1e6]]).astype(np.float32)
    assert_same("QuantizeLinear", [x, np.float32(0.05), zero_point], {}, opset)
    q = ours("QuantizeLinear", [x, np.float32(0.05), zero_point], {}, opset)[0]
    assert_same("DequantizeLinear", [q, np.float32(0.05), zero_point], {}, opset)


@pytest.mark.parametrize("opset", [19, 21])
def test_bfloat16_quantizes_as_float16_does_in_onnx_runtime(opset):
    # ONNX Runtime has no bfloat16 QuantizeLinear; its float16 one divides in float32, so bfloat16
    # (widened exactly to float32) takes the same path: the results equal float32 inputs' results.
    bf16 = np.dtype("bfloat16")
    x = np.concatenate([X.ravel(), np.arange(-8, 9) * 0.25, [1e6, -1e6]]).astype(bf16)
    scale, zp = np.array(0.375, bf16), np.int8(-3)
    q = ours("QuantizeLinear", [x, scale, zp], {}, opset)[0]
    want = ort_node("QuantizeLinear", [x.astype(np.float32), np.float32(0.375), zp], {}, opset)[0]
    assert q.dtype == np.int8
    np.testing.assert_array_equal(q, want)
    y = ours("DequantizeLinear", [q, scale, zp], {}, opset)[0]
    assert y.dtype == bf16
    np.testing.assert_array_equal(y, ((q.astype(np.float32) + 3) * 0.375).astype(bf16))


@pytest.mark.parametrize("opset", [13, 21])
def test_quantize_dequantize_per_axis_match_ort(opset):
    zp = np.array([1, -5, 7], np.int8)
    assert_same("QuantizeLinear", [X, CHANNEL_SCALES, zp], {"axis": 1}, opset)
    q = ours("QuantizeLinear", [X, CHANNEL_SCALES, zp], {"axis": 1}, opset)[0]
    assert_same("DequantizeLinear", [q, CHANNEL_SCALES, zp], {"axis": 1}, opset)
    # int32 values (a quantized bias) dequantize without a zero point.
    bias = np.array([-70000, 3, 12345], np.int32)
    assert_same("DequantizeLinear", [bias, CHANNEL_SCALES], {"axis": 0}, opset)


def test_blocked_quantization_matches_ort():
    # Opset 21: one scale and zero point per block of 3 along axis 1.
    x = (RNG.standard_normal((4, 6)) * 3).astype(np.float32)
    scale = RNG.uniform(0.05, 0.2, (4, 2)).astype(np.float32)
    zp = RNG.integers(-5, 5, (4, 2)).astype(np.int8)
    attrs = {"axis": 1, "block_size": 3}
    assert_same("QuantizeLinear", [x, scale, zp], attrs, 21)
    q = ours("QuantizeLinear", [x, scale, zp], attrs, 21)[0]
    assert_same("DequantizeLinear", [q, scale, zp], attrs, 21)


@pytest.mark.parametrize("opset", [10, 21])
@pytest.mark.parametrize("per_channel", [False, True])
def test_integer_ops_match_ort(opset, per_channel):
    x = RNG.integers(0, 256, (1, 4, 6, 6)).astype(np.uint8)
    w = RNG.integers(-128, 128, (6, 2, 3, 3)).astype(np.int8)
    ws = RNG.uniform(0.01, 0.03, 6).astype(np.float32) if per_channel else np.float32(0.02)
    wz = np.zeros(6, np.int8) if per_channel else np.int8(0)
    bias = RNG.integers(-1000, 1000, 6).astype(np.int32)
    attrs = {"group": 2, "pads": [1, 1, 0, 0], "strides": [2, 1]}
    assert_same("QLinearConv", [x, np.float32(0.03), np.uint8(120), w, ws, wz, np.float32(0.5), np.uint8(100), bias],
                attrs, opset)
    assert_same("ConvInteger", [x, w, np.uint8(3)], attrs, opset)
    a = RNG.integers(0, 256, (2, 3, 5)).astype(np.uint8)
    b = RNG.integers(-128, 128, (5, 4)).astype(np.int8)
    bs = RNG.uniform(0.01, 0.03, 4).astype(np.float32) if per_channel else np.float32(0.02)
    bz = np.zeros(4, np.int8) if per_channel else np.int8(0)
    assert_same("QLinearMatMul", [a, np.float32(0.03), np.uint8(120), b, bs, bz, np.float32(0.5), np.uint8(100)],
                {}, opset)
    assert_same("MatMulInteger", [a, b, np.uint8(3), np.int8(-2)], {}, opset)


def test_dynamic_quantize_matches_ort():
    assert_same("DynamicQuantizeLinear", [X.ravel()], {}, 13, n_out=3)


# ---- folding quantize_static's QDQ graphs ---------------------------------------------------------

def _float_model(opset):
    """Conv(+bias) -> Relu -> 1x1 Conv -> residual Add -> pool -> Flatten -> MatMul + bias."""
    def init(name, *shape, scale=0.3):
        return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"]),
             helper.make_node("Add", ["c2", "r1"], ["s"]),
             helper.make_node("GlobalAveragePool", ["s"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "wm"], ["mm"]),
             helper.make_node("Add", ["mm", "bm"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
                              [init("w1", 8, 3, 3, 3), init("b1", 8, scale=1), init("w2", 8, 8, 1, 1),
                               init("b2", 8, scale=1), init("wm", 8, 5), init("bm", 5, scale=1)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _quantized(tmp_path, opset, per_channel):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(1)
            self.feeds = iter([{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.feeds, None)

    src, out = tmp_path / "float.onnx", tmp_path / "qdq.onnx"
    onnx.save(_float_model(opset), src)
    quantize_static(str(src), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return out


@pytest.mark.parametrize("opset,per_channel,check", [(10, False, "1"), (13, True, "1"), (21, True, "0")])
def test_optimize_folds_qdq_into_qlinear(tmp_path, opset, per_channel, check):
    from saturate.frontend.onnx_io import import_model
    from saturate.interp import run_graph

    src = _quantized(tmp_path, opset, per_channel)
    dst = tmp_path / "opt.onnx"
    subprocess.run([sys.executable, "-m", "saturate", "optimize", str(src), "-o", str(dst), "--check", check],
                   check=True, capture_output=True)
    ops = [n.op_type for n in onnx.load(dst).graph.node]
    assert ops.count("QLinearConv") == 2 and ops.count("QLinearMatMul") == 1
    assert "Conv" not in ops and "MatMul" not in ops
    assert len(ops) <= 17 < len(onnx.load(src).graph.node)
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    # One step of the output's quantization (the last DequantizeLinear's scale).
    step = next(float(numpy_helper.to_array(t)) for t in onnx.load(src).graph.initializer if t.name == "y_scale")
    assert np.abs(got - want).max() <= step * 1.001
    # The interpreter runs both graphs as ONNX Runtime does.
    for path, ref in ((src, want), (dst, got)):
        mine = run_graph(import_model(onnx.load(path)), {"x": x})
        np.testing.assert_allclose(next(iter(mine.values())), ref, atol=step * 1.001)


@pytest.mark.parametrize("zp_dtype", ["uint8", "int8", "uint16", "int16"])
def test_same_quant_allows_a_pair_only_where_quantize_undoes_dequantize(zp_dtype):
    # Every integer of the type, through DequantizeLinear and back: where the guard lets dq-q drop
    # the pair, no value may change; the common float32 and float16 8-bit cases must stay allowed.
    from saturate.lang.quant_builtins import same_quant

    rng = np.random.default_rng(11)
    info = np.iinfo(zp_dtype)
    q = np.arange(info.min, info.max + 1).astype(zp_dtype)
    allowed = {}
    for scale_dtype in ("float32", "float16", "bfloat16"):
        scales = np.concatenate([[1 + 2.0 ** -7, 0.5, 1e-4, 1e-6, 300.0, 1e30], rng.uniform(1e-3, 2, 20)])
        for scale in scales.astype(scale_dtype):
            zp = np.array(rng.integers(info.min, info.max, endpoint=True), zp_dtype)
            if not same_quant(scale, zp, scale, zp):
                continue
            allowed.setdefault(scale_dtype, 0)
            allowed[scale_dtype] += 1
            node = {"axis": 1}
            back = ours("QuantizeLinear", [ours("DequantizeLinear", [q, scale, zp], node, 21)[0], scale, zp], node, 21)[0]
            np.testing.assert_array_equal(back, q, err_msg=f"{scale_dtype} scale {scale}, zero point {zp}")
    assert allowed.get("float32", 0) >= 20
    assert "bfloat16" not in allowed
    assert (allowed.get("float16", 0) >= 15) == (info.bits == 8)


def test_check_quant_rules_pass():
    done = subprocess.run([sys.executable, "-m", "saturate", "check", "rules/quant.rules", "--examples", "5",
                           "--seed", "0"], capture_output=True, text=True,
                          cwd=__import__("pathlib").Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "13 of 13 rules pass" in done.stdout


def _shifted(shift):
    """x -> Q -> DQ, the quantized values moved by `shift` steps (Q's zero point against DQ's)."""
    from saturate.core.ir import Graph, ValueInfo

    g = Graph(name="q", opset=13, inputs=["x"], outputs=["y"])
    g.values["x"] = ValueInfo("float32", (2, 3))
    g.constants.update({"s": np.float32(0.5), "zq": np.int8(shift), "z": np.int8(0)})
    g.nodes += [Node("QuantizeLinear", ["x", "s", "zq"], ["q"], {}, name="quant"),
                Node("DequantizeLinear", ["q", "s", "z"], ["y"], {}, name="dequant")]
    return g


def test_optimize_check_allows_one_quantization_step_on_dequantized_outputs():
    from saturate.simplifier import check_outputs

    assert check_outputs(_shifted(0), _shifted(1), samples=2) is None
    failure = check_outputs(_shifted(0), _shifted(2), samples=2)
    assert failure is not None and failure.step == 0.5
    assert "differs by 2 quantization steps of 0.5 (allowed 1)" in str(failure)


def test_quantized_bert_keeps_its_weights_stored_as_integers():
    # Folding a DequantizeLinear of a constant stores the weight as float, four times its size
    # (fold-any would, where it lets MatMul and Add become one Gemm): the model must not grow.
    from saturate.frontend import corpus
    from saturate.frontend.onnx_io import import_model
    from saturate.pipeline import optimize

    before = import_model(corpus.load_model("bert-qdq"))
    after, _ = optimize(before)
    assert after.op_counts()["QLinearMatMul"] == 12

    def stored(g):
        return sum(np.asarray(c).nbytes for c in g.constants.values())
    assert stored(after) <= stored(before)
