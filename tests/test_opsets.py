"""Opsets: models from opset 9 to the newest import (old ones converted), optimize, export and run."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import saturate
from saturate.core.errors import SaturateError
from saturate.frontend.onnx_io import MAX_OPSET, MIN_OPSET, export_model, import_model
from saturate.interp import run_graph

NEWEST = onnx.defs.onnx_opset_version()


def _const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def conv_net(opset: int) -> onnx.ModelProto:
    """conv+bn+relu, clip, pool, reshape, squeeze/unsqueeze, split, reduce-mean, pad, gemm,
    softmax (and gelu from 20), each written in the form its opset defines."""
    rng = np.random.default_rng(opset)
    c = 4
    inits = [_const("W", rng.standard_normal((c, 3, 3, 3)) * 0.3), _const("g", rng.uniform(0.5, 2, c)),
             _const("b", rng.standard_normal(c)), _const("m", rng.standard_normal(c) * 0.1),
             _const("v", rng.uniform(0.5, 2, c)), _const("shape", [0, -1], np.int64),
             _const("G", rng.standard_normal((10, c * 4 * 4)) * 0.2), _const("Gb", rng.standard_normal(10))]
    nodes = [helper.make_node("Conv", ["x", "W"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "g", "b", "m", "v"], ["bn"], epsilon=1e-5),
             helper.make_node("Relu", ["bn"], ["r"])]
    # Clip's bounds became inputs at 11.
    if opset < 11:
        nodes.append(helper.make_node("Clip", ["r"], ["cl"], min=0.0, max=4.0))
    else:
        inits += [_const("lo", 0.0), _const("hi", 4.0)]
        nodes.append(helper.make_node("Clip", ["r", "lo", "hi"], ["cl"]))
    nodes.append(helper.make_node("MaxPool", ["cl"], ["p"], kernel_shape=[2, 2], strides=[2, 2]))
    # Pad's pads and value became inputs at 11.
    if opset < 11:
        nodes.append(helper.make_node("Pad", ["p"], ["pd"], pads=[0, 0, 0, 0, 0, 0, 0, 0], value=0.0))
    else:
        inits.append(_const("pads", [0] * 8, np.int64))
        nodes.append(helper.make_node("Pad", ["p", "pads"], ["pd"]))
    # Split's sizes: attribute, then an input at 13, or num_outputs from 18.
    if opset < 13:
        nodes.append(helper.make_node("Split", ["pd"], ["s0", "s1"], axis=1, split=[2, 2]))
    elif opset < 18:
        inits.append(_const("split", [2, 2], np.int64))
        nodes.append(helper.make_node("Split", ["pd", "split"], ["s0", "s1"], axis=1))
    else:
        nodes.append(helper.make_node("Split", ["pd"], ["s0", "s1"], axis=1, num_outputs=2))
    nodes.append(helper.make_node("Concat", ["s1", "s0"], ["cat"], axis=1))
    # ReduceMean's axes became an input at 18.
    if opset < 18:
        nodes.append(helper.make_node("ReduceMean", ["cat"], ["mean"], axes=[2, 3], keepdims=1))
    else:
        inits.append(_const("raxes", [2, 3], np.int64))
        nodes.append(helper.make_node("ReduceMean", ["cat", "raxes"], ["mean"], keepdims=1))
    nodes.append(helper.make_node("Add", ["cat", "mean"], ["cm"]))
    # Squeeze/Unsqueeze axes became inputs at 13.
    if opset < 13:
        nodes += [helper.make_node("Unsqueeze", ["cm"], ["u"], axes=[0]),
                  helper.make_node("Squeeze", ["u"], ["sq"], axes=[0])]
    else:
        inits.append(_const("uaxes", [0], np.int64))
        nodes += [helper.make_node("Unsqueeze", ["cm", "uaxes"], ["u"]),
                  helper.make_node("Squeeze", ["u", "uaxes"], ["sq"])]
    nodes += [helper.make_node("Reshape", ["sq", "shape"], ["flat"]),
              helper.make_node("Gemm", ["flat", "G", "Gb"], ["logits"], transB=1)]
    last = "logits"
    if opset >= 20:
        nodes.append(helper.make_node("Gelu", ["logits"], ["gelu"], approximate="tanh"))
        last = "gelu"
    # Softmax: before 13 it flattens at `axis` and normalizes the 2-D rows (same thing on 2-D).
    nodes.append(helper.make_node("Softmax", [last], ["y"], axis=1))
    graph = helper.make_graph(nodes, f"net{opset}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = helper.find_min_ir_version_for(model.opset_import)
    onnx.checker.check_model(model, full_check=True)
    return model


def softmax_4d(opset: int) -> onnx.ModelProto:
    """Softmax over a 4-D input: opset < 13 normalizes over axes 1.. together, 13 over axis 1 alone."""
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=1)], "sm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 2, 2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


def run_reference_runtime(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """ONNX Runtime when it takes the model, else onnx.reference (opsets newer than ORT knows)."""
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:
        return ReferenceEvaluator(model).run(None, feeds)
    return sess.run(None, feeds)


def assert_close(got, want):
    for g, w in zip(got, want, strict=True):
        assert np.isfinite(w).all()
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("opset", [9, 11, 13, 14, 18, 21, NEWEST])
def test_model_imports_optimizes_exports_and_runs(opset):
    model = conv_net(opset)
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)}
    expected = run_reference_runtime(model, feeds)
    graph = import_model(model)
    assert graph.opset == max(opset, MIN_OPSET)
    assert_close([run_graph(graph, feeds)["y"]], expected)
    optimized, _ = saturate.optimize(graph)
    # The rules fold batch-norm into the conv whatever the opset.
    assert "BatchNormalization" not in optimized.op_counts()
    exported = export_model(optimized)
    assert {(o.domain, o.version) for o in exported.opset_import} == {("", max(opset, MIN_OPSET))}
    onnx.checker.check_model(exported, full_check=True)
    assert_close(run_reference_runtime(exported, feeds), expected)


@pytest.mark.parametrize("opset", [9, 11, 12])
def test_old_softmax_keeps_its_meaning_through_conversion(opset):
    model = softmax_4d(opset)
    x = np.random.default_rng(2).standard_normal((2, 3, 2, 2)).astype(np.float32)
    # ONNX Runtime, not onnx.reference: the latter runs every Softmax with the opset-13 meaning.
    expected = run_reference_runtime(model, {"x": x})
    graph = import_model(model)
    assert [n.op for n in graph.nodes] == ["Shape", "Flatten", "Softmax", "Reshape"]
    assert_close([run_graph(graph, {"x": x})["y"]], expected)
    # Normalized over channels and space together, as opset < 13 says.
    assert np.allclose(run_graph(graph, {"x": x})["y"].sum(axis=(1, 2, 3)), 1, atol=1e-5)



@pytest.mark.parametrize("opset", [9, 10])
def test_deprecated_scatter_runs_as_scatter_elements(opset):
    # onnx.reference has no Scatter; an opset this old converts to 14 on import, where it is
    # ScatterElements.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])
    indices = _const("i", [[1, 0, 2, 0], [2, 2, 1, 1]], np.int64)
    updates = _const("u", np.arange(8).reshape(2, 4) + 10)
    node = helper.make_node("Scatter", ["x", "i", "u"], ["y"], axis=0)
    model = helper.make_model(helper.make_graph([node], "scatter", [x], [y], [indices, updates]),
                              opset_imports=[helper.make_opsetid("", opset)])
    feeds = {"x": np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)}
    expected = run_reference_runtime(model, feeds)
    graph = import_model(model)
    assert [n.op for n in graph.nodes] == ["ScatterElements"]
    assert_close([run_graph(graph, feeds)["y"]], expected)

def test_model_newer_than_ort_with_unchanged_ops_is_accepted():
    # Opset 22+ changed no semantics of these ops (only added types).
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["a"]),
             helper.make_node("Mul", ["a", "two"], ["m2"]), helper.make_node("Relu", ["m2"], ["y"])]
    inits = [_const("w", rng.standard_normal((4, 3))), _const("b", rng.standard_normal(3)), _const("two", 2.0)]
    for opset in range(22, NEWEST + 1):
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], initializer=inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        feeds = {"x": rng.standard_normal((2, 4)).astype(np.float32)}
        g = import_model(model)
        optimized, _ = saturate.optimize(g)
        exported = export_model(optimized)
        onnx.checker.check_model(exported, full_check=True)
        assert exported.opset_import[0].version == opset
        assert_close(run_reference_runtime(exported, feeds), ReferenceEvaluator(model).run(None, feeds))


def test_opset_bounds_follow_the_installed_onnx():
    assert (MIN_OPSET, MAX_OPSET) == (14, NEWEST)
    model = conv_net(13)
    model.opset_import[0].version = NEWEST + 1
    with pytest.raises(SaturateError, match=rf"^unsupported ONNX opset {NEWEST + 1}: saturate supports opsets 1 to"):
        import_model(model)


def test_failed_conversion_is_one_line_naming_the_op():
    # Per-activation batch-norm (spatial=0, before opset 9) has no later form to convert to.
    scale = _const("s", np.ones((1, 2, 2)))
    node = helper.make_node("BatchNormalization", ["x", "s", "s", "s", "s"], ["y"], spatial=0, name="bn0")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2, 2])], initializer=[scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)], ir_version=4)
    with pytest.raises(SaturateError, match=r"^cannot convert the model from opset 7 to 14 at node 'bn0' "
                                            r"\(BatchNormalization\): [^\n]*spatial[^\n]*$"):
        import_model(model)


def test_old_model_with_large_weights_converts_and_keeps_them():
    # The converter sees the model without its large weights; they come back as initializers,
    # and an initializer also listed as an input (keep_initializers_as_inputs) stays an input.
    rng = np.random.default_rng(4)
    w, b = _const("w", rng.standard_normal((128, 64))), _const("b", rng.standard_normal(64))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["a"]),
             helper.make_node("Unsqueeze", ["a"], ["y"], axes=[0])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 128]),
                                           helper.make_tensor_value_info("b", TensorProto.FLOAT, [64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 64])], initializer=[w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=6)
    feeds = {"x": rng.standard_normal((2, 128)).astype(np.float32)}
    g = import_model(model)
    assert g.opset == MIN_OPSET and g.inputs == ["x", "b"] and set(g.constants) >= {"w", "b"}
    assert g.constants["w"].shape == (128, 64)
    assert_close([run_graph(g, feeds)["y"]], run_reference_runtime(model, feeds))
    exported = export_model(g)
    onnx.checker.check_model(exported, full_check=True)
    assert_close(run_reference_runtime(exported, feeds), run_reference_runtime(model, feeds))


def test_conversion_keeps_local_functions_and_preserve_marks():
    # The converter drops model-local functions and node metadata: import inlines and reads
    # the marks first.
    from saturate.frontend.onnx_io import mark_nodes

    body = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Relu", ["s"], ["c"])]
    fn = helper.make_function("accel", "AddRelu", ["a", "b"], ["c"], body, [helper.make_opsetid("", 11)])
    nodes = [helper.make_node("AddRelu", ["x", "x"], ["r"], domain="accel"),
             helper.make_node("Neg", ["r"], ["y"], name="keep")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11), helper.make_opsetid("accel", 1)],
                              functions=[fn], ir_version=8)
    mark_nodes(model, ["keep"])
    g = import_model(model)
    assert g.opset == MIN_OPSET and [n.op for n in g.nodes] == ["Add", "Relu", "Neg"]
    assert g.meta["preserve"] == ["keep"]
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    assert np.array_equal(run_graph(g, {"x": x})["y"], -np.maximum(2 * x, 0))
