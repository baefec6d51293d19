"""saturate.simplify: onnxsim's API (a model in, (model, ok) out), checked against ONNX Runtime,
and a result that is the input model, changed only where a rule folded it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import saturate
from saturate.core.errors import SaturateError

IR = min(onnx.IR_VERSION, 14)
DROP_RELU = "ruleset bad level 1\nrule drop-relu Relu(x) => x\n"


def conv_bn_relu(batch: int | str = 1, ir_version: int = IR) -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu -> Flatten, with names, doc strings and metadata set."""
    rng = np.random.default_rng(0)
    weights = {"conv.weight": rng.standard_normal((4, 3, 3, 3)), "bn.scale": rng.random(4) + 0.5,
               "bn.bias": rng.standard_normal(4), "bn.mean": rng.standard_normal(4), "bn.var": rng.random(4) + 0.5}
    nodes = [helper.make_node("Conv", ["x", "conv.weight"], ["c"], name="/conv/Conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["b"],
                              name="/bn/BatchNormalization", doc_string="the batch norm"),
             helper.make_node("Relu", ["b"], ["r"], name="/relu/Relu", doc_string="kept"),
             helper.make_node("Flatten", ["r"], ["y"], name="/flatten/Flatten")]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 100])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
                              doc_string="the graph's doc")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="exporter",
                              producer_version="2.1", doc_string="the model's doc", model_version=3,
                              domain="org.example")
    model.ir_version = ir_version
    helper.set_model_props(model, {"author": "someone", "license": "MIT"})
    return model


def ort_outputs(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_a_model_in_gives_the_folded_model_and_ok_and_leaves_the_input_alone():
    model = conv_bn_relu()
    before = model.SerializeToString()
    out, ok = saturate.simplify(model)
    assert ok is True and isinstance(out, onnx.ModelProto)
    assert model.SerializeToString() == before
    assert [n.op_type for n in out.graph.node] == ["Conv", "Relu", "Flatten"]
    onnx.checker.check_model(out, full_check=True)
    x = np.random.default_rng(1).standard_normal((1, 3, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(ort_outputs(out, x), ort_outputs(model, x), rtol=1e-4, atol=1e-5)


def test_a_path_works_as_a_model(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), path)
    out, ok = saturate.simplify(str(path), check_n=2)
    assert ok and [n.op_type for n in out.graph.node] == ["Conv", "Relu", "Flatten"]


def test_the_check_finds_a_rule_that_changes_outputs(tmp_path):
    rules = tmp_path / "bad.rules"
    rules.write_text(DROP_RELU)
    out, ok = saturate.simplify(conv_bn_relu(), rules=[str(rules)])
    assert not ok and "Relu" not in [n.op_type for n in out.graph.node]
    assert saturate.simplify(conv_bn_relu(), check_n=0, rules=[str(rules)])[1] is True


def test_skip_rules_leaves_that_fold_out_and_an_unknown_name_is_an_error():
    out, ok = saturate.simplify(conv_bn_relu(), skip_rules=["batchnorm"])
    assert ok and "BatchNormalization" in [n.op_type for n in out.graph.node]
    with pytest.raises(SaturateError, match="no rule named 'batchnrom'"):
        saturate.simplify(conv_bn_relu(), skip_rules=["batchnrom"])


def test_overwrite_input_shapes_makes_a_dynamic_input_static():
    out, ok = saturate.simplify(conv_bn_relu(batch="N"), overwrite_input_shapes={"x": [2, 3, 5, 5]})
    assert ok
    dims = lambda vi: [d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim]
    assert dims(out.graph.input[0]) == [2, 3, 5, 5] and dims(out.graph.output[0]) == [2, 100]
    with pytest.raises(SaturateError, match="no input 'z'"):
        saturate.simplify(conv_bn_relu(batch="N"), overwrite_input_shapes={"z": [1]})


def test_the_result_keeps_names_producer_ir_version_docs_and_metadata():
    model = conv_bn_relu()
    out, _ = saturate.simplify(model, check_n=0)
    assert (out.producer_name, out.producer_version, out.ir_version) == ("exporter", "2.1", IR)
    assert (out.doc_string, out.graph.doc_string, out.model_version, out.domain) == \
        ("the model's doc", "the graph's doc", 3, "org.example")
    assert {p.key: p.value for p in out.metadata_props} == {"author": "someone", "license": "MIT"}
    assert [(o.domain, o.version) for o in out.opset_import] == [("", 17)]
    names = {n.op_type: n.name for n in out.graph.node}
    # The Conv that computes what the batch norm did is named after the node it replaced.
    assert names == {"Conv": "/bn/BatchNormalization", "Relu": "/relu/Relu", "Flatten": "/flatten/Flatten"}
    assert {n.name: n.doc_string for n in out.graph.node}["/relu/Relu"] == "kept"
    assert {n.name: n.doc_string for n in out.graph.node}["/bn/BatchNormalization"] == ""  # now a Conv
    folded = sorted(t.name for t in out.graph.initializer)
    assert folded == ["bn.bias_folded", "conv.weight_folded"]


def test_an_old_ir_version_stays_and_one_the_opset_needs_is_raised_to():
    out, _ = saturate.simplify(conv_bn_relu(ir_version=8), check_n=0)
    assert out.ir_version == 8
    out, _ = saturate.simplify(conv_bn_relu(ir_version=4), check_n=0)
    assert out.ir_version == helper.find_min_ir_version_for([helper.make_opsetid("", 17)])


def test_not_a_model_is_one_error():
    with pytest.raises(SaturateError, match="onnx.ModelProto or a path"):
        saturate.simplify(b"\x08\x07")


def test_bad_input_shapes_are_one_error():
    for dims in (["a"], [0, 3, 5, 5], 5):
        with pytest.raises(SaturateError, match="expected positive sizes"):
            saturate.simplify(conv_bn_relu(batch="N"), overwrite_input_shapes={"x": dims})


def test_a_model_onnx_runtime_cannot_run_is_optimized_with_a_warning():
    node = helper.make_node("Foo", ["x"], ["y"], domain="com.example", name="foo")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    with pytest.warns(UserWarning, match="not checked against ONNX Runtime.*com.example:Foo"):
        out, ok = saturate.simplify(model)
    assert ok and [n.name for n in out.graph.node] == ["foo"]


def test_a_kernel_error_of_onnx_runtime_is_one_line_without_its_log_or_cpp_signature(tmp_path):
    """An Attention whose mask is shorter than its keys: ONNX Runtime's kernel refuses it at run time.
    Its own error log is not printed beside saturate's note, and the note keeps ONNX Runtime's message
    without the C++ file and function signature it starts with."""
    import subprocess
    import sys

    f = TensorProto.FLOAT
    shapes = {"Q": [2, 3, 4, 8], "K": [2, 3, 6, 8], "V": [2, 3, 6, 10], "mask": [2, 3, 4, 4]}
    graph = helper.make_graph([helper.make_node("Attention", ["Q", "K", "V", "mask"], ["Y"])], "g",
                              [helper.make_tensor_value_info(k, f, s) for k, s in shapes.items()],
                              [helper.make_tensor_value_info("Y", f, [2, 3, 4, 10])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)]), tmp_path / "m.onnx")
    proc = subprocess.run([sys.executable, "-m", "saturate", "optimize", str(tmp_path / "m.onnx"), "-o",
                           str(tmp_path / "o.onnx")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("saturate: note: "), proc.stderr
    assert "Status Message: " in proc.stderr and "total_sequence_length" in proc.stderr
    assert "onnxruntime::" not in proc.stderr and ".h:" not in proc.stderr, proc.stderr


def test_a_model_over_strings_is_checked_on_strings():
    """The check feeds a string input words and compares string outputs for equality: numbers
    written as strings and concatenated ('0.12' + '0.64') were read back as floats, a traceback."""
    from saturate.simplifier import _relative_error

    s = TensorProto.STRING
    graph = helper.make_graph([helper.make_node("StringConcat", ["x", "y"], ["xy"]),
                               helper.make_node("StringSplit", ["xy"], ["parts", "n"], delimiter=",")], "g",
                              [helper.make_tensor_value_info("x", s, [3]), helper.make_tensor_value_info("y", s, [3])],
                              [helper.make_tensor_value_info("parts", s, None),
                               helper.make_tensor_value_info("n", TensorProto.INT64, [3])])
    out, ok = saturate.simplify(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]))
    assert ok and [n.op_type for n in out.graph.node] == ["StringConcat", "StringSplit"]
    words = np.array(["a", "b,c"], object)
    assert _relative_error(words, words.copy()) == 0.0
    assert _relative_error(words, np.array(["a", "b;c"], object)) == float("inf")
