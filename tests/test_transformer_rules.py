"""rules/transformer.rules and the rule form of several roots: small graphs as exporters write them."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from saturate.core.errors import SaturateError
from saturate.lang.parser import parse_statements
from saturate.simplifier import simplify


def _model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                               for o in outputs],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _optimized_agrees(model, feeds):
    out, ok = simplify(model, check_n=0)
    assert ok
    for a, b in zip(_ort(model, feeds), _ort(out, feeds)):
        assert a.shape == b.shape
        assert np.max(np.abs(a - b)) <= 1e-4 * max(1.0, float(np.max(np.abs(a))))
    return Counter(n.op_type for n in out.graph.node)


def _shape_chains():
    """x of shape [B, S, 8], y = x + 1 and z = Relu(x): each flattened to [B*S, 8] by its own
    Shape -> Gather, Gather -> Mul -> Unsqueeze -> Concat chain, as torch.onnx exports x.view."""
    inits = {"one": np.ones(8, np.float32), "i0": np.array(0, np.int64), "i1": np.array(1, np.int64),
             "minus": np.array([-1], np.int64), "ax": np.array([0], np.int64)}
    nodes = [helper.make_node("Add", ["x", "one"], ["y"]), helper.make_node("Relu", ["x"], ["z"])]
    for v in "xyz":
        nodes += [helper.make_node("Shape", [v], [f"s{v}"]),
                  helper.make_node("Gather", [f"s{v}", "i0"], [f"g{v}"], axis=0),
                  helper.make_node("Gather", [f"s{v}", "i1"], [f"h{v}"], axis=0),
                  helper.make_node("Mul", [f"g{v}", f"h{v}"], [f"n{v}"]),
                  helper.make_node("Unsqueeze", [f"n{v}", "ax"], [f"u{v}"]),
                  helper.make_node("Concat", [f"u{v}", "minus"], [f"t{v}"], axis=0),
                  helper.make_node("Reshape", [v, f"t{v}"], [f"r{v}"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 8])
    return _model(nodes, [x], ["rx", "ry", "rz"], inits)


def test_shape_chains_of_same_shaped_values_merge_into_one():
    model = _shape_chains()
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 5, 8)).astype(np.float32)}
    ops = _optimized_agrees(model, feeds)
    assert len(model.graph.node) == 23
    # One Shape, two Gathers, Mul, Unsqueeze, Concat serve all three Reshapes.
    assert ops == Counter({"Reshape": 3, "Shape": 1, "Gather": 2, "Mul": 1, "Unsqueeze": 1, "Concat": 1,
                           "Add": 1, "Relu": 1})


def test_shapes_of_values_whose_dims_differ_stay_apart():
    # y = x[:, :2] has a different dim 1: its chain must keep reading its own Shape.
    inits = {"i1": np.array(1, np.int64), "s": np.array([0], np.int64), "e": np.array([2], np.int64),
             "ax": np.array([1], np.int64)}
    nodes = [helper.make_node("Slice", ["x", "s", "e", "ax"], ["y"]),
             helper.make_node("Shape", ["x"], ["sx"]), helper.make_node("Shape", ["y"], ["sy"]),
             helper.make_node("Gather", ["sx", "i1"], ["gx"], axis=0),
             helper.make_node("Gather", ["sy", "i1"], ["gy"], axis=0),
             helper.make_node("Cast", ["gx"], ["fx"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["gy"], ["fy"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x", "fx"], ["ox"]), helper.make_node("Mul", ["y", "fy"], ["oy"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S"])
    model = _model(nodes, [x], ["ox", "oy"], inits)
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 6)).astype(np.float32)}
    assert _optimized_agrees(model, feeds)["Shape"] == 2


def _projections(n, bias, d=16):
    """n projections of one input x [2, 5, d] by stored weights (q, k, v; gate and up), each with
    its bias when `bias`, each read by its own Relu."""
    rng = np.random.default_rng(3)
    nodes, inits, outs = [], {}, []
    for k in range(n):
        inits[f"w{k}"] = rng.standard_normal((d, d)).astype(np.float32)
        nodes.append(helper.make_node("MatMul", ["x", f"w{k}"], [f"m{k}"]))
        last = f"m{k}"
        if bias:
            inits[f"b{k}"] = rng.standard_normal(d).astype(np.float32)
            nodes.append(helper.make_node("Add", [last, f"b{k}"], [f"a{k}"]))
            last = f"a{k}"
        nodes.append(helper.make_node("Relu", [last], [f"y{k}"]))
        outs.append(f"y{k}")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, d])
    feeds = {"x": rng.standard_normal((2, 5, d)).astype(np.float32)}
    return _model(nodes, [x], outs, inits), feeds


# A code generator that slices by views: a Slice costs nothing, so reading x once wins.
VIEWS = "target views \"slices are views\"\ndefault flops + bytes\nop Slice = 0\n"


@pytest.mark.parametrize("n, bias", [(3, True), (3, False), (2, False)])
def test_projections_of_one_input_merge_into_one_matmul_where_slices_are_free(n, bias):
    from saturate.targets.target import parse_target

    model, feeds = _projections(n, bias)
    out, ok = simplify(model, check_n=0, target=parse_target(VIEWS))
    ops = Counter(node.op_type for node in out.graph.node)
    assert ok and ops["MatMul"] == 1 and ops["Slice"] == n
    for a, b in zip(_ort(model, feeds), _ort(out, feeds)):
        assert np.max(np.abs(a - b)) <= 1e-4 * max(1.0, float(np.max(np.abs(a))))
    weights = [i for i in out.graph.initializer if list(i.dims) == [16, 16 * n]]
    assert len(weights) == 1


def test_the_local_search_moves_every_projection_to_the_merged_matmul_at_once(monkeypatch):
    # Without the exact program (out of time on a large graph) the merge is still found.
    from saturate.engine import extract
    from saturate.targets.target import parse_target

    monkeypatch.setattr(extract, "solve", lambda *a: None)
    model, feeds = _projections(3, False)
    out, ok = simplify(model, check_n=0, target=parse_target(VIEWS))
    assert Counter(node.op_type for node in out.graph.node) == Counter({"MatMul": 1, "Slice": 3, "Relu": 3})


def test_projections_stay_apart_on_cpu_where_a_slice_is_a_copy():
    model, feeds = _projections(3, True)
    assert _optimized_agrees(model, feeds) == Counter({"MatMul": 3, "Add": 3, "Relu": 3})


def test_merged_weights_are_not_computed_when_the_merge_is_not_chosen(monkeypatch):
    # Typing a merged MatMul reads its weights' shapes only: a large model's q, k and v weights
    # are not concatenated for every pair and triple the rules offer.
    import dataclasses

    from saturate.lang.builtins import CONST_FUNCS

    calls = []
    concat = CONST_FUNCS["concat"]
    monkeypatch.setitem(CONST_FUNCS, "concat", dataclasses.replace(
        concat, impl=lambda *a: calls.append(np.shape(a[0])) or concat.impl(*a)))
    model, feeds = _projections(3, False)
    assert _optimized_agrees(model, feeds) == Counter({"MatMul": 3, "Relu": 3})
    assert calls == []


def test_a_rule_of_several_roots_parses_and_a_missing_replacement_is_one_error():
    rule = parse_statements("rule r Shape(x) & Shape(y) => Shape(x) & Shape(x) if same_shape(x, y)")[0]
    assert len(rule.roots) == 2 and rule.more_lhs[0].args[0].name == "y"
    with pytest.raises(SaturateError, match=r"<string>:1:1: 2 patterns joined by & on the left, 1 on the right"):
        parse_statements("rule r Shape(x) & Shape(y) => Shape(x)")
    with pytest.raises(SaturateError, match="several roots is written with =>"):
        parse_statements("rule r Shape(x) & Shape(y) <=> Shape(y) & Shape(x)")


# Each wrong: Shapes of any two values merged; projections given each other's columns.
WRONG = {"merge-any": """Shape(x){start=s, end=e} & Shape(y){start=s2, end=e2}
  => Shape(x){start=s, end=e} & Shape(x){start=s2, end=e2}""",
         "merge-swapped": """MatMul(x, w1:const) & MatMul(x, w2:const)
  => Slice(MatMul(x, concat(w2, w1, 1)), cast(reshape(0, [1]), 7), cast(reshape(dim(w1, 1), [1]), 7),
           cast(reshape(-1, [1]), 7))
   & Slice(MatMul(x, concat(w2, w1, 1)), cast(reshape(dim(w1, 1), [1]), 7),
           cast(reshape(dim(w1, 1) + dim(w2, 1), [1]), 7), cast(reshape(-1, [1]), 7))"""}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WRONG))
def test_the_checker_draws_every_root_and_refuses_a_wrong_merge(tmp_path, name):
    from saturate.check.checker import check_rule
    from saturate.lang.parser import load_rules

    path = tmp_path / "bad.rules"
    path.write_text(f"ruleset t level 1\nrule {name} {WRONG[name]}\n")
    (rule,) = load_rules([path], names=[name])
    assert check_rule(rule, examples=50, seed=0).status == "FAIL"
