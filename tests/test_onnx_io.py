"""ONNX import/export: round trips through ONNX Runtime, attributes, conv bias by rule, bad input."""

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import saturate
from saturate.lang.parser import load_rules
from onnx import TensorProto, helper, numpy_helper

from saturate.frontend import load_graph, save_graph
from saturate.frontend.examples import build, build_model, random_inputs
from saturate.frontend.onnx_io import export_model, import_model
from saturate.core.errors import SaturateError
from saturate.core.ir import OpaqueAttr


def run_ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def make_model(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=()):
    graph = helper.make_graph(nodes, "t", inputs, outputs, initializer=list(inits))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def tensor_in(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def check_same_as_original(name: str):
    original = build_model(name)
    graph = import_model(original)
    exported = export_model(graph)
    onnx.checker.check_model(exported, full_check=True)
    feeds = random_inputs(graph, seed=7)
    expected = run_ort(original, feeds)
    got = run_ort(exported, feeds)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        assert np.isfinite(e).all()
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["vgg", "resnet18", "mobilenet", "mlp", "chain-4"])
def test_examples_round_trip_through_onnx_runtime(name):
    check_same_as_original(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "vgg11bn", "chain-2000"])
def test_big_examples_round_trip_through_onnx_runtime(name):
    check_same_as_original(name)


def test_imported_weights_are_written_back_with_their_own_bytes():
    model = export_model(build("resnet18"))
    graph = import_model(model)
    again = export_model(graph)
    raw = {t.name: t.raw_data for t in model.graph.initializer}
    assert raw and all(t.raw_data == raw[t.name] for t in again.graph.initializer)
    # A weight computed from them is written from its own values.
    first = model.graph.initializer[0]
    graph.constants[first.name] = graph.constants[first.name] * 2
    doubled = {t.name: numpy_helper.to_array(t) for t in export_model(graph).graph.initializer}
    np.testing.assert_array_equal(doubled[first.name], numpy_helper.to_array(first) * 2)


def test_import_types_every_value():
    g = build("resnet18")
    for n in g.nodes:
        for o in n.outputs:
            assert g.info(o).is_static(), o
    assert g.info("x").shape == (1, 3, 224, 224)
    assert g.info(g.outputs[0]).shape == (1, 1000)


def test_constant_nodes_become_constants_and_symbolic_dims_stay():
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.arange(3, dtype=np.float32))),
             helper.make_node("Constant", [], ["k"], value_ints=[1, 2]),
             helper.make_node("Add", ["x", "c"], ["y"])]
    m = make_model(nodes, [tensor_in("x", ["N", 3])], [tensor_in("y", None)])
    g = import_model(m)
    assert [n.op for n in g.nodes] == ["Add"]
    np.testing.assert_array_equal(g.constants["c"], np.arange(3, dtype=np.float32))
    assert g.constants["k"].dtype == np.int64
    assert g.info("y").shape == ("N", 3)
    out = run_ort(export_model(g), {"x": np.ones((2, 3), np.float32)})[0]
    np.testing.assert_array_equal(out, np.ones((2, 3)) + np.arange(3))


def test_attributes_keep_their_python_types():
    nodes = [helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.25),
             helper.make_node("Transpose", ["a"], ["b"], perm=[1, 0]),
             helper.make_node("Softmax", ["b"], ["c"], axis=0),
             helper.make_node("ConstantOfShape", ["s"], ["z"], value=numpy_helper.from_array(np.array([2.5], np.float32))),
             helper.make_node("Shape", ["c"], ["s"])]
    m = make_model([nodes[0], nodes[1], nodes[2], nodes[4], nodes[3]], [tensor_in("x", [2, 3])],
                   [tensor_in("c", None), tensor_in("z", None)])
    g = import_model(m)
    attrs = {n.op: n.attrs for n in g.nodes}
    assert attrs["LeakyRelu"]["alpha"] == 0.25 and isinstance(attrs["LeakyRelu"]["alpha"], float)
    assert attrs["Transpose"]["perm"] == [1, 0]
    assert isinstance(attrs["Softmax"]["axis"], int)
    assert isinstance(attrs["ConstantOfShape"]["value"], np.ndarray)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    for e, got in zip(run_ort(m, {"x": x}), run_ort(export_model(g), {"x": x})):
        np.testing.assert_array_equal(e, got)


def test_unknown_ops_custom_domains_and_subgraphs_survive():
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [], [tensor_in("t", [2])])
    else_g = helper.make_graph([helper.make_node("Relu", ["x"], ["e"])], "else", [], [tensor_in("e", [2])])
    nodes = [helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g, name="branch"),
             helper.make_node("MyOp", ["x"], ["z"], domain="com.example", gain=3, tag="hi")]
    m = make_model(nodes, [tensor_in("cond", [], TensorProto.BOOL), tensor_in("x", [2])],
                   [tensor_in("y", [2]), tensor_in("z", None)], extra_opsets=[("com.example", 1)])
    g = import_model(m)
    branch, custom = g.nodes
    assert isinstance(branch.attrs["then_branch"], OpaqueAttr)
    assert (custom.op, custom.domain, custom.attrs) == ("MyOp", "com.example", {"gain": 3, "tag": "hi"})
    assert g.meta["opset_imports"] == {"com.example": 1}
    out = export_model(g)
    assert {(o.domain, o.version) for o in out.opset_import} == {("", 17), ("com.example", 1)}
    assert out.graph.node[1].domain == "com.example"
    # ONNX Runtime cannot run MyOp; run the If part alone to check the subgraphs came back intact.
    g.nodes = [branch]
    g.outputs = ["y"]
    x = np.array([1.0, -2.0], np.float32)
    assert run_ort(export_model(g), {"cond": np.array(True), "x": x})[0].tolist() == [-1.0, 2.0]
    assert run_ort(export_model(g), {"cond": np.array(False), "x": x})[0].tolist() == [1.0, 0.0]


def test_several_outputs_and_shared_values():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "r"], ["a"]),
             helper.make_node("Mul", ["r", "x"], ["m"])]
    m = make_model(nodes, [tensor_in("x", [4])], [tensor_in("a", [4]), tensor_in("m", [4]), tensor_in("r", [4])])
    g = import_model(m)
    assert g.outputs == ["a", "m", "r"]
    x = np.array([1, -1, 2, -3], np.float32)
    for e, got in zip(run_ort(m, {"x": x}), run_ort(export_model(g), {"x": x})):
        np.testing.assert_array_equal(e, got)


# ---- Conv + per-channel Add -> Conv bias on export -----------------------------------------
def conv_add_model(const_shape, swap=False, extra_use=False, conv_bias=False, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    c = rng.standard_normal(const_shape).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")]
    conv_in = ["x", "w"]
    if conv_bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"))
        conv_in.append("b")
    nodes = [helper.make_node("Conv", conv_in, ["v"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "v"] if swap else ["v", "c"], ["y"])]
    outputs = [tensor_in("y", None)]
    if extra_use:
        nodes.append(helper.make_node("Relu", ["v"], ["r"]))
        outputs.append(tensor_in("r", None))
    return make_model(nodes, [tensor_in("x", [1, 3, 4, 4])], outputs, inits)


@pytest.mark.parametrize("shape,swap", [((4, 1, 1), False), ((1, 4, 1, 1), False), ((1, 4, 1, 1), True),
                                        ((1,), False), ((), True)])
def test_per_channel_add_becomes_conv_bias_by_rule_only(shape, swap):
    m = conv_add_model(shape, swap)
    assert [n.op_type for n in export_model(import_model(m)).graph.node] == ["Conv", "Add"]
    folded, _ = saturate.optimize(import_model(m))
    exported = export_model(folded)
    onnx.checker.check_model(exported, full_check=True)
    assert [n.op_type for n in exported.graph.node] == ["Conv"]
    assert len(exported.graph.node[0].input) == 3
    x = np.random.default_rng(1).standard_normal((1, 3, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(run_ort(exported, {"x": x})[0], run_ort(m, {"x": x})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs", [dict(const_shape=(4,)), dict(const_shape=(1, 4, 4, 4)),
                                    dict(const_shape=(1, 4, 1, 1), extra_use=True),
                                    dict(const_shape=(1, 4, 1, 1), conv_bias=True),
                                    dict(const_shape=(2, 4, 1, 1))])
def test_other_adds_stay_adds(kwargs):
    m = conv_add_model(**kwargs)
    folded, _ = saturate.optimize(import_model(m), rules=[r for r in load_rules(None) if r.name == "conv-bias"])
    exported = export_model(folded)
    assert "Add" in [n.op_type for n in exported.graph.node]
    x = np.random.default_rng(1).standard_normal((1, 3, 4, 4)).astype(np.float32)
    for e, got in zip(run_ort(m, {"x": x}), run_ort(exported, {"x": x})):
        np.testing.assert_allclose(got, e, rtol=1e-5, atol=1e-6)


# ---- bad input -------------------------------------------------------------------------------
def test_unsupported_opset_is_rejected():
    newest = onnx.defs.onnx_opset_version()
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor_in("x", [2])], [tensor_in("y", [2])],
                   opset=newest + 1)
    with pytest.raises(SaturateError, match=f"unsupported ONNX opset {newest + 1}: saturate supports opsets 1 to {newest}"):
        import_model(m)


def test_invalid_model_is_one_line_error():
    m = make_model([helper.make_node("Relu", ["nowhere"], ["y"])], [tensor_in("x", [2])], [tensor_in("y", [2])])
    with pytest.raises(SaturateError, match="invalid ONNX model") as err:
        import_model(m)
    assert "\n" not in str(err.value)


def test_file_errors(tmp_path):
    with pytest.raises(SaturateError, match="no such file"):
        load_graph(str(tmp_path / "missing.onnx"))
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\xffnot a protobuf at all\x12")
    with pytest.raises(SaturateError, match="junk.onnx: not an ONNX model"):
        load_graph(str(junk))
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(SaturateError, match="not an ONNX model"):
        load_graph(str(empty))


def test_save_and_load_onnx_file(tmp_path):
    g = build("mobilenet")
    path = tmp_path / "m.onnx"
    save_graph(g, str(path))
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]  # no temp file left behind
    back = load_graph(str(path))
    assert back.op_counts() == g.op_counts()
    feeds = random_inputs(g)
    np.testing.assert_array_equal(run_ort(onnx.load(str(path)), feeds)[0], run_ort(build_model("mobilenet"), feeds)[0])


def _saved(graph, path):
    save_graph(graph, str(path))
    return onnx.load(str(path))


def test_saved_file_is_the_exported_model_whatever_the_weights(tmp_path):
    """save_graph writes each weight from its array after the rest of the model; a reader merges
    the pieces into exactly the model export_model returns, for any dtype, byte order or layout."""
    g = build("mlp")
    weights = {"scalar": np.array(2.5, np.float32), "half": np.arange(6, dtype=np.float16).reshape(2, 3),
               "empty": np.zeros((0, 3), np.int64), "flags": np.array([True, False, True]),
               "big_endian": np.arange(6, dtype=">f4").reshape(2, 3),
               "transposed": np.arange(12, dtype=np.float64).reshape(3, 4).T, "small": np.arange(-2, 3, dtype=np.int8)}
    g.constants.update(weights)
    saved = _saved(g, tmp_path / "m.onnx")
    assert saved == export_model(g)
    back = {t.name: numpy_helper.to_array(t) for t in saved.graph.initializer}
    for name, value in weights.items():
        assert back[name].shape == value.shape and back[name].dtype == value.dtype.newbyteorder("=")
        np.testing.assert_array_equal(back[name], value)
    feeds = random_inputs(g)
    np.testing.assert_array_equal(run_ort(saved, feeds)[0], run_ort(build_model("mlp"), feeds)[0])


def test_saved_file_infers_missing_output_shapes_from_the_weights(tmp_path):
    g = build("mlp")
    out = g.outputs[0]
    g.values[out] = dataclasses.replace(g.values[out], shape=None)
    saved = _saved(g, tmp_path / "m.onnx")
    assert saved == export_model(g)
    assert saved.graph.output[0].type.tensor_type.HasField("shape")


def test_save_into_missing_directory_fails_cleanly(tmp_path):
    with pytest.raises(SaturateError, match="does not exist"):
        save_graph(build("mlp"), str(tmp_path / "nope" / "m.onnx"))


def test_local_functions_are_inlined_on_import():
    # A model-local function in a custom domain (what `saturate partition` writes).
    body = [helper.make_node("Mul", ["a", "s"], ["m"]), helper.make_node("Relu", ["m"], ["r"])]
    fn = helper.make_function("acme", "scaled_relu", ["a", "s"], ["r"], body,
                              [helper.make_opsetid("", 17)])
    call = helper.make_node("scaled_relu", ["x", "s"], ["y"], domain="acme")
    scale = numpy_helper.from_array(np.array([2.0, -1.0, 0.5], np.float32), "s")
    graph = helper.make_graph([call], "g", [tensor_in("x", [2, 3])], [tensor_in("y", [2, 3])], [scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("acme", 1)],
                              functions=[fn])
    model.ir_version = 8
    g = import_model(model)
    assert [n.op for n in g.nodes] == ["Mul", "Relu"]
    exported = export_model(g)
    assert {o.domain for o in exported.opset_import} == {""}
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(run_ort(exported, {"x": x})[0], run_ort(model, {"x": x})[0], rtol=1e-6)


def test_a_graph_onnx_would_refuse_is_not_written(tmp_path):
    # A MatMul turned into a Tile whose repeats are float weights: ONNX Runtime refuses the file,
    # so saving it is an error naming the node and op, and nothing is left behind.
    g = build("mlp")
    node = g.nodes[0]
    g.nodes[0] = dataclasses.replace(node, op="Tile")
    out = tmp_path / "m.onnx"
    with pytest.raises(SaturateError, match="not a valid ONNX model.*Tile.*matmul2"):
        save_graph(g, str(out))
    assert list(tmp_path.iterdir()) == []


def test_an_op_onnx_cannot_infer_strictly_still_imports_and_saves(tmp_path):
    # ONNX's strict inference fails inside MeanVarianceNormalization's function body on any
    # model: such an op falls back to ordinary inference instead of refusing a valid model.
    x = tensor_in("x", [3, 3, 3, 1])
    node = helper.make_node("MeanVarianceNormalization", ["x"], ["y"])
    model = helper.make_model(helper.make_graph([node], "g", [x], [tensor_in("y", [3, 3, 3, 1])]),
                              opset_imports=[helper.make_opsetid("", 17)])
    out = tmp_path / "m.onnx"
    save_graph(import_model(model), str(out))
    assert onnx.load(str(out)).graph.node[0].op_type == "MeanVarianceNormalization"


@pytest.mark.parametrize("op, declared", [("Relu", (TensorProto.INT64, [2, 3])), ("Softmax", (TensorProto.FLOAT, [7])),
                                          ("LeakyRelu", (TensorProto.FLOAT, [2, 3, 1]))])
def test_an_op_with_a_function_body_whose_declared_output_contradicts_it_is_refused(op, declared):
    # Relu, Softmax and LeakyRelu have function bodies too, but strict inference fails on the
    # node itself, not inside its body: ONNX Runtime refuses the model, and so must import (it was
    # read, and optimize wrote it with its int64 output on a Relu of floats).
    node = helper.make_node(op, ["x"], ["y"])
    y = helper.make_tensor_value_info("y", *declared)
    model = helper.make_model(helper.make_graph([node], "g", [tensor_in("x", [2, 3])], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(SaturateError, match=f"op_type:{op}, node name: y"):
        import_model(model)


def test_an_input_that_is_also_an_output_keeps_its_input_type(tmp_path):
    # The output's declaration, without a shape, replaced the input's dims on import, and the
    # model written declared its input shapeless.
    x = tensor_in("x", [2, 3])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                                                [tensor_in("y", [2, 3]), helper.make_tensor_value_info("x", TensorProto.FLOAT, None)]),
                              opset_imports=[helper.make_opsetid("", 17)])
    g = import_model(model)
    assert g.values["x"].shape == (2, 3)
    out = tmp_path / "m.onnx"
    save_graph(g, str(out))
    dims = onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [2, 3]


def _if_on(cond_type):
    branches = {k: helper.make_graph([helper.make_node("Constant", [], [f"{k}_o"], value=numpy_helper.from_array(
        np.array([v], np.float32)))], k, [], [tensor_in(f"{k}_o", [1])]) for k, v in (("then", 1.0), ("els", 2.0))}
    node = helper.make_node("If", ["c"], ["y"], then_branch=branches["then"], else_branch=branches["els"])
    return [node], [helper.make_tensor_value_info("c", cond_type, [])], [tensor_in("y", [1])]


@pytest.mark.parametrize("case, message", [
    ("add", "(op_type:Add, node name: z): B has inconsistent type tensor(int64)"),
    ("relu", "(op_type:Relu, node name: z): X typestr: T, has unsupported type: tensor(string)"),
    ("if", "(op_type:If, node name: y): cond typestr: B, has unsupported type: tensor(float)"),
    ("inner", "(op_type:Relu, node name: t_o): X typestr: T, has unsupported type: tensor(bool)"),
])
def test_a_node_given_element_types_its_op_does_not_take_is_refused_naming_it(tmp_path, capsys, case, message):
    """ONNX Runtime refuses these models; strict shape inference alone let them in (the type constraints
    are checked only with check_type), and `show` printed them, `optimize -o x.sat` wrote them."""
    from saturate.cli import main

    f, i64, s, b = TensorProto.FLOAT, TensorProto.INT64, TensorProto.STRING, TensorProto.BOOL
    if case == "add":
        nodes, ins, outs = ([helper.make_node("Add", ["x", "k"], ["z"])],
                            [helper.make_tensor_value_info("x", f, [2]), helper.make_tensor_value_info("k", i64, [2])],
                            [tensor_in("z", [2])])
    elif case == "relu":
        nodes, ins, outs = ([helper.make_node("Relu", ["x"], ["z"])], [helper.make_tensor_value_info("x", s, [2])],
                            [helper.make_tensor_value_info("z", s, [2])])
    elif case == "if":
        nodes, ins, outs = _if_on(f)
    else:  # a branch's node reading a bool from the outer graph
        then = helper.make_graph([helper.make_node("Relu", ["c"], ["t_o"])], "then", [],
                                 [helper.make_tensor_value_info("t_o", b, [])])
        els = helper.make_graph([helper.make_node("Identity", ["c"], ["e_o"])], "els", [],
                                [helper.make_tensor_value_info("e_o", b, [])])
        nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els)]
        ins, outs = [helper.make_tensor_value_info("c", b, [])], [helper.make_tensor_value_info("y", b, [])]
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", ins, outs), opset_imports=[helper.make_opsetid("", 17)]),
              str(path))
    for argv in (["show", str(path)], ["optimize", str(path), "-o", str(tmp_path / "m.sat"), "--check", "0"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"saturate: error: {path}: invalid ONNX model: shape inference "
                                                   "failed: [ShapeInferenceError] ") and message in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_an_stft_omitting_onesided_imports_optimizes_and_runs_like_the_input(tmp_path):
    """ONNX's STFT inference reads `onesided` as 0 when a node omits it, where the schema says 1: an
    audio front end declaring the onesided bins was refused as invalid. Imported, it states onesided=1,
    and the optimized model gives ONNX Runtime's outputs."""
    nodes = [helper.make_node("STFT", ["x", "step", "win", "len"], ["s"]),
             helper.make_node("Mul", ["s", "s"], ["sq"]),
             helper.make_node("ReduceSum", ["sq", "axes"], ["y"], keepdims=0)]
    inits = [numpy_helper.from_array(np.array(4, np.int64), "step"),
             numpy_helper.from_array(np.hanning(16).astype(np.float32), "win"),
             numpy_helper.from_array(np.array(16, np.int64), "len"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    graph = helper.make_graph(nodes, "stft", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 29, 9])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "m.onnx")
    g = import_model(model)
    assert g.nodes[0].attrs["onesided"] == 1 and not any(a.name == "onesided" for a in model.graph.node[0].attribute)
    optimized, _ = saturate.optimize(g)
    save_graph(optimized, str(tmp_path / "o.onnx"))
    x = np.random.default_rng(0).standard_normal((1, 128, 1)).astype(np.float32)
    want = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(tmp_path / "o.onnx")).run(None, {"x": x})[0]
    assert got.shape == (1, 29, 9) and np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
