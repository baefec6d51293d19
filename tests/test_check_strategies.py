"""Tests for the public hypothesis strategies and rule examples of saturate.check."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from saturate.check import examples, strategies
from saturate.lang import builtins
from saturate.check.checker import build_graph
from saturate.interp.interpreter import run_graph
from saturate.core.ir import Graph, Node
from saturate.lang.ast import Call, Guard, Loc, Num, OpTerm, Rule, Var

FAST = settings(max_examples=60, deadline=None)


@FAST
@given(st.data())
def test_broadcastable_shapes_broadcast_into_the_target(data):
    target = data.draw(strategies.shapes(min_rank=0, max_rank=4))
    shape = data.draw(strategies.broadcastable_shapes(target))
    assert len(shape) <= len(target)
    assert np.broadcast_shapes(shape, target) == target


@FAST
@given(st.data())
def test_per_axis_constants_satisfy_the_guard(data):
    target = data.draw(strategies.shapes(min_rank=1, max_rank=4))
    axis = data.draw(st.integers(0, len(target) - 1))
    c = data.draw(strategies.per_axis_constants(target, axis))
    assert builtins.varies_only_along(c.shape, axis, len(target))
    assert np.broadcast_shapes(c.shape, target) == target


@FAST
@given(st.data())
def test_constants_respect_their_sign_class(data):
    sign = data.draw(st.sampled_from(strategies.SIGNS))
    c = data.draw(strategies.constants(data.draw(strategies.shapes(max_rank=3)), sign))
    assert c.dtype == np.float32 and np.isfinite(c).all()
    check = {"any": lambda a: True, "positive": lambda a: a > 0, "nonnegative": lambda a: a >= 0,
             "nonzero": lambda a: a != 0, "negative": lambda a: a < 0}[sign]
    assert np.all(check(c))


def test_constants_cover_zero_negative_tiny_and_huge():
    seen = []

    @settings(max_examples=200, deadline=None, database=None)
    @given(strategies.constants((3,)))
    def collect(c):
        seen.extend(c.tolist())

    collect()
    mags = np.abs(np.array(seen))
    assert (mags == 0).any() and (np.array(seen) < 0).any()
    assert (mags[mags > 0] < 1e-3).any() and (mags > 1e3).any()


@FAST
@given(strategies.conv_cases())
def test_conv_cases_are_consistent_with_the_interpreter(case):
    g = Graph(nodes=[Node("Conv", ["x", "w"], ["y"], case.attrs)], inputs=["x"], outputs=["y"],
              constants={"w": np.ones(case.w_shape, np.float32)})
    y = run_graph(g, {"x": np.ones(case.x_shape, np.float32)})["y"]
    assert y.shape == case.out_shape


def _conv_scale_rule() -> Rule:
    x, w, s = Var("x"), Var("w", const=True), Var("s", const=True)
    lhs = OpTerm("Mul", (OpTerm("Conv", (x, w)), s))
    scale = Call("per_axis", (Call("vec", (s,)), Num(0), Call("rank", (w,))))
    rhs = OpTerm("Conv", (x, Call("mul", (w, scale))))
    guards = (Guard("varies_only_along", (s, Num(1), Call("rank", (w,)))), Guard("positive", (s,)))
    return Rule("conv-scale", lhs, rhs, guards, "t", 3, Loc("<test>", 1))


@FAST
@given(examples.rule_examples(_conv_scale_rule()))
def test_rule_examples_satisfy_guards_and_run(example):
    rule = _conv_scale_rule()
    assert examples.guards_hold(rule, example)
    s = example.values["s"]
    assert (s > 0).all() and builtins.varies_only_along(s.shape, 1, 4)
    # The drawn left side runs on the reference interpreter with the drawn shapes.
    g = build_graph(rule.lhs, example)
    out = run_graph(g, {n: example.values[n] for n in g.inputs})[g.outputs[0]]
    assert out.ndim == 4 and out.shape[1] == example.values["w"].shape[0]


# The README's example: a user's own property test of a rule written in the rule language.
_USER_RULE_TEXT = """
ruleset mine level 2
rule mul-div  Div(Mul(x, a:const), b:const) => Mul(x, a / b)  if nonzero(b), floating(b), broadcasts_into(a, x), broadcasts_into(b, x)
"""


def _user_rule():
    from saturate.lang.parser import parse_rules
    return parse_rules(_USER_RULE_TEXT, "mine.rules")[0].rules[0]


@settings(max_examples=100, deadline=None)
@given(examples.rule_examples(_user_rule()))
def test_user_property_test_as_in_the_readme(example):
    from saturate.check.checker import run_example
    assert run_example(_user_rule(), example) is None
