"""Encode stage: graphs become e-classes with handles; rules become egglog rules."""

from __future__ import annotations

import numpy as np
import pytest
from egglog import bindings
from engine_util import Builder

from saturate.engine.egraph import read_egraph
from saturate.engine.encode import encode_graph, load
from saturate.engine.compile_rules import compile_rules, rule_ops
from saturate.core.errors import SaturateError
from saturate.core.ir import Node, ValueInfo
from saturate.lang.ast import Call, Guard, Loc, Num, OpTerm, Rule, Var

LOC = Loc("test.rules", 3)
X, C, D = Var("x"), Var("c", const=True), Var("d", const=True)


def _rule(name, lhs, rhs, guards=(), bidirectional=False):
    return Rule(name, lhs, rhs, tuple(guards), "t", 2, LOC, bidirectional)


def _load(enc, compiled=()):
    eg = bindings.EGraph()
    load(eg, enc, [t for cr in compiled for t in cr.text])
    return eg


def _graph():
    b = Builder(shape=(1, 4, 6, 6))
    c1 = b.conv("x", 4, 4)
    c2 = b.conv(c1, 4, 4)
    return b.build(b.op("Exp", b.op("Relu", c2)))


def test_every_value_gets_an_e_class_and_opaque_ops_keep_their_node():
    g = _graph()
    enc = encode_graph(g)
    view = read_egraph(_load(enc))
    classes = {v: view.lets[ref] for v, ref in enc.value_names.items()}
    assert set(classes) == set(g.inputs) | set(g.constants) | {n.outputs[0] for n in g.nodes}
    assert len(set(classes.values())) == len(classes)
    kinds = {n.kind for nodes in view.classes.values() for n in nodes}
    assert kinds == {"inp", "const", "op", "opaque", "out"}
    assert [n.op for n in enc.opaque_nodes] == ["Exp"]
    conv_ids = {view.classes[classes[n.outputs[0]]][0].key for n in g.nodes if n.op == "Conv"}
    assert len(conv_ids) == 1, "equal attribute dicts share one attribute-set id"


def test_preserved_multi_output_and_integer_nodes_are_opaque():
    g = _graph()
    g.nodes.append(Node("Dropout", [g.outputs[0]], ["d", "mask"], name="drop"))
    g.values["d"] = g.values[g.outputs[0]]
    g.values["mask"] = ValueInfo("bool", (1, 4, 6, 6))
    g.outputs.append("mask")   # a second output someone reads
    g.constants["s"] = np.array([[6, 4], [1, 2]], np.int64)
    g.nodes.append(Node("MatMul", ["s", "s"], ["s2"], name="int_matmul"))   # not a shape op
    g.values["s2"] = ValueInfo("int64", (2, 2))
    enc = encode_graph(g, preserve=["Relu"])
    assert [n.op for n in enc.opaque_nodes] == ["Relu", "Exp", "Dropout", "MatMul"]
    view = read_egraph(_load(enc))
    assert view.lets[enc.value_names["d"]] != view.lets[enc.value_names["mask"]]


def test_unread_extra_outputs_and_integer_shape_arithmetic_are_terms():
    g = _graph()
    g.nodes.append(Node("Dropout", [g.outputs[0]], ["d", "mask"], name="drop"))
    g.values["d"] = g.values[g.outputs[0]]
    g.values["mask"] = ValueInfo("bool", (1, 4, 6, 6))
    g.constants["s"] = np.array([6, 4], np.int64)
    g.nodes.append(Node("Div", ["s", "s"], ["s2"], name="int_div"))
    g.values["s2"] = ValueInfo("int64", (2,))
    enc = encode_graph(g, rule_ops=["Dropout"])
    assert [n.op for n in enc.opaque_nodes] == ["Exp"]


def test_plain_rule_is_one_egglog_rule_and_guarded_rule_goes_through_python():
    enc = encode_graph(_graph())
    plain = _rule("sub", OpTerm("Sub", (X, C)), OpTerm("Add", (X, Call("neg", (C,)))))
    guarded = _rule("mm", OpTerm("Mul", (OpTerm("Mul", (X, C)), D)), OpTerm("Mul", (X, Call("mul", (C, D)))),
                    [Guard("positive", (C,))])
    compiled = compile_rules([plain, guarded], enc)
    assert [cr.checked for cr in compiled] == [False, True]
    assert len(compiled[0].text) == 1 and "union root" in compiled[0].text[0]
    assert any(t.startswith("(relation Cand_1") for t in compiled[1].text)
    assert compiled[1].vars == ["x", "c", "d"]
    _load(enc, compiled)  # the program is valid egglog


def test_bidirectional_rule_compiles_both_ways():
    enc = encode_graph(_graph())
    comm = _rule("comm", OpTerm("Add", (X, Var("y"))), OpTerm("Add", (Var("y"), X)), bidirectional=True)
    compiled = compile_rules([comm], enc)
    assert [cr.direction for cr in compiled] == ["forward", "reverse"]
    assert compiled[1].label == "comm (reverse)"


def test_right_hand_attributes_inherit_or_are_fixed():
    enc = encode_graph(_graph())
    keep = _rule("k", OpTerm("Mul", (OpTerm("Conv", (X, Var("w", const=True))), C)),
                 OpTerm("Conv", (X, Call("mul", (Var("w", const=True), C)))))
    fixed = _rule("f", OpTerm("Relu", (X,)), OpTerm("LeakyRelu", (X,), (("alpha", Num(0.0)),)))
    k, f = compile_rules([keep, fixed], enc)
    assert k.rhs_ops[0].inherit == 0 and "a_0" in k.text[0]
    assert f.rhs_ops[0].fixed is not None and enc.attr_sets[f.rhs_ops[0].fixed] == ("LeakyRelu", {"alpha": 0.0})


@pytest.mark.parametrize("rule, message", [
    (_rule("u", OpTerm("Relu", (X,)), OpTerm("Relu", (Var("y"),))), "'y' is not bound"),
    (_rule("n", OpTerm("Add", (X, Num(0))), X), "literal"),
])
def test_bad_rules_are_clean_errors_with_their_location(rule, message):
    with pytest.raises(SaturateError, match=message) as err:
        compile_rules([rule], encode_graph(_graph()))
    assert "test.rules:3" in str(err.value)


def test_rule_ops_names_both_sides():
    r = _rule("x", OpTerm("Foo", (X,)), OpTerm("Bar", (OpTerm("Relu", (X,)),)))
    assert rule_ops([r]) == {"Foo", "Bar", "Relu"}


@pytest.mark.parametrize("name", ["w", " w", "w ", "a\tb", "line\nbreak", "12", '"quoted"', "unicodé/x:0"])
def test_any_value_name_survives_encoding(name):
    from saturate.pipeline import optimize

    b = Builder(shape=(1, 4, 6, 6))
    out = b.op("Relu", b.op("Add", "x", b.rand(1, 4, 1, 1)))
    g = b.build(out)
    (old,) = list(g.constants)
    g.constants[name] = g.constants.pop(old)
    g.values[name] = g.values.pop(old) if old in g.values else g.info(name)
    g.nodes[0].inputs[1] = name
    enc = encode_graph(g)
    view = read_egraph(_load(enc))
    cls = view.lets[enc.value_names[name]]
    assert any(n.kind == "const" and n.key == name for n in view.classes[cls])
    result, _ = optimize(g)
    assert name in result.constants and np.array_equal(result.constants[name], g.constants[name])
