"""Rules a careful engineer gets wrong, one per input the checker once never drew: each passed
`saturate check` then, each fails now with a counterexample showing that input."""

from __future__ import annotations

import numpy as np
import pytest

from saturate.check.checker import check_rule, check_rules, format_result
from saturate.lang.parser import parse_rules


def _rule(text: str):
    (rule,) = parse_rules("ruleset blind level 2\n" + text + "\n", "blind.rules")[0].rules
    return rule


def _fails(text: str, examples: int = 100, seed: int = 0):
    result = check_rule(_rule(text), examples=examples, seed=seed)
    assert result.status == "FAIL", format_result(result)
    return result.counterexample.example


# ---- attributes drawn from the schema ----------------------------------------------------------

def test_batchnorm_fold_that_forgets_training_mode_fails():
    # The README's bn-affine before its fix: in training mode BN normalizes by the batch's own
    # statistics, not the running ones.
    ex = _fails("rule bn-affine  BatchNormalization(x, g:const, b:const, m:const, v:const){epsilon=eps}"
                "  => Add(Mul(x, per_axis(g / sqrt(v + eps), 1, rank(x))),"
                "         per_axis(b - m * (g / sqrt(v + eps)), 1, rank(x)))")
    assert ex.node_attrs[()]["training_mode"] == 1


def test_pad_fold_assuming_non_negative_pads_fails():
    # Two constant pads add up, unless one crops (a negative pad) what the other then pads.
    ex = _fails('rule pad-pad  Pad(Pad(x, p1:const){mode="constant"}, p2:const){mode="constant"}'
                '  => Pad(x, p1 + p2){mode="constant"}')
    assert (ex.values["p1"] < 0).any() or (ex.values["p2"] < 0).any()


def test_conv_rule_that_assumes_explicit_pads_fails():
    # Written out with auto_pad=NOTSET, a SAME_UPPER conv loses its padding.
    ex = _fails("rule conv-explicit  Conv(x, w){kernel_shape=k, strides=s, pads=p, dilations=d, group=g}"
                '  => Conv(x, w){kernel_shape=k, strides=s, pads=p, dilations=d, group=g, auto_pad="NOTSET"}')
    assert ex.node_attrs[()]["auto_pad"] != "NOTSET"


def test_pool_rule_that_assumes_floor_mode_fails():
    ex = _fails("rule maxpool-floor  MaxPool(x){kernel_shape=k, strides=s, pads=p, dilations=d}"
                "  => MaxPool(x){kernel_shape=k, strides=s, pads=p, dilations=d, ceil_mode=0}")
    assert ex.node_attrs[()]["ceil_mode"] == 1


def test_reshape_fold_ignoring_allowzero_fails():
    # same_dims reads a 0 as "copy this dim"; with allowzero=1 it is a 0-sized dim.
    ex = _fails("rule reshape-same-any  Reshape(x, s:const) => x  if same_dims(x, s)", examples=200, seed=3)
    assert ex.node_attrs[()]["allowzero"] == 1


def test_pattern_attributes_left_free_are_drawn_from_every_valid_value():
    from hypothesis import HealthCheck, given, settings

    from saturate.check.examples import rule_examples

    rule = _rule("rule pad-any  Pad(x, p:const) => Pad(x, p)")
    modes = set()

    @settings(max_examples=60, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(rule_examples(rule))
    def draw(ex):
        modes.add(ex.node_attrs[()]["mode"])
    draw()
    assert modes == {"constant", "reflect", "edge", "wrap"}


# ---- ops with no hand-written shape rule --------------------------------------------------------

@pytest.mark.parametrize("text", [
    "rule mean-relu  ReduceMean(Relu(x)) => Relu(ReduceMean(x))",
    "rule hsig-relu  HardSigmoid(x) => Relu(x)",
    "rule floor-neg  Floor(Neg(x)) => Neg(Floor(x))",
    "rule where-swap  Where(c, x, y) => Where(c, y, x)",
    "rule lnorm-id  LayerNormalization(x, s:const, b:const) => x  if ones(s), zeros(b)",
])
def test_rules_over_ops_without_a_shape_rule_are_checked(text):
    _fails(text, examples=100)


@pytest.mark.parametrize("pattern", [
    "Tile(x, r:const)", "Resize(x, roi, sc:const)", "ConvTranspose(x, w:const)", "InstanceNormalization(x, s, b)",
    "ReduceSum(x, a:const)", "Gelu(x)", "Split(x)", "Greater(x, y)", "Softplus(Elu(x))", "Sum(x)",
])
def test_any_op_the_interpreter_runs_is_drawn(pattern):
    # A rule rewriting a term to itself: it passes once inputs the op accepts are drawn (Gelu's
    # graphs run at opset 20, the first that defines it).
    result = check_rule(_rule(f"rule same  {pattern} => {pattern.replace(':const', '')}"), examples=20, seed=0)
    assert result.status == "PASS" and result.examples == 20, format_result(result)


def test_an_op_the_checker_cannot_draw_says_why():
    # An empty optional needs a `type` attribute, which is not drawn.
    result = check_rule(_rule("rule none  Identity(Optional()) => Optional()"), examples=5, seed=0)
    assert result.status == "NOGEN"
    assert "refuses every drawn Optional node" in result.message and "needs the attribute 'type'" in result.message
    # num_outputs is an attribute of Split from opset 18 on: a rule naming it runs at opset 18.
    result = check_rule(_rule("rule split-one  Split(x){num_outputs=1} => x"), examples=5, seed=0)
    assert result.status == "PASS", format_result(result)


# ---- empty tensors ------------------------------------------------------------------------------

def test_rule_whose_right_side_differs_only_on_empty_tensors_fails():
    # [-1, last dim] cannot be resolved when the last dim is 0: Reshape fails where Flatten
    # gives an empty (n, 0) output.
    ex = _fails("rule flatten-rows  Flatten(x){axis=1} => Reshape(x, rows_shape(x))  if rank(x) == 2")
    assert ex.values["x"].size == 0


# ---- dtypes -------------------------------------------------------------------------------------

def test_integer_fold_that_overflows_fails():
    # (x * a) / a is x only while x * a fits the dtype.
    ex = _fails("rule mul-div  Div(Mul(x, a:const), a:const) => x  if nonzero(a)")
    assert ex.values["x"].dtype.kind in "iu"


def test_cast_from_every_source_type():
    # Through float32 an int64 loses its low bits: the two Casts are not one.
    ex = _fails("rule cast-cast  Cast(Cast(x){to=1}){to=7} => Cast(x){to=7}")
    assert ex.values["x"].dtype == np.int64


# ---- broadcasting -------------------------------------------------------------------------------

def test_broadcast_rule_wrong_for_shapes_broadcasting_both_ways_fails():
    # x as large as y in elements and rank still need not hold the output: (2, 1) + (2,).
    ex = _fails("rule add-zero-bigger  Add(x, Sub(y, y)) => x  if numel(x) >= numel(y), rank(x) >= rank(y),"
                "  numel(y) > 0")
    x, y = ex.values["x"].shape, ex.values["y"].shape
    assert np.broadcast_shapes(x, y) not in (x, y)


def test_one_element_constant_with_more_dims_than_a_variable_fails():
    ex = _fails("rule mul-vec  Mul(x, c:const) => Mul(x, vec(c))  if is_scalar(c), rank(c) >= 2")
    assert ex.values["c"].ndim > ex.values["x"].ndim


@pytest.mark.parametrize("text", ["rule sum3  Sum(x, y, z) => Add(x, y)",
                                  "rule max3  Max(x, y, z) => Max(x, y)"])
def test_variadic_ops_with_three_inputs_are_drawn(text):
    ex = _fails(text)
    assert {"x", "y", "z"} <= set(ex.values)


def test_variadic_ops_take_one_to_five_inputs():
    for n in range(1, 6):
        names = [f"x{k}" for k in range(n)]
        text = f"rule mean{n}  Mean({', '.join(names)}) => Mean({', '.join(reversed(names))})"
        result = check_rule(_rule(text), examples=20, seed=0)
        assert result.status == "PASS", format_result(result)


# ---- every core ---------------------------------------------------------------------------------

def test_rules_checked_in_worker_processes_report_in_rule_order_and_as_one_process_does():
    rules = [_rule("rule sub-const  Sub(x, c:const) => Add(x, -c)"),
             _rule("rule sub-wrong  Sub(x, c:const) => Add(x, c)"),
             _rule("rule mul-comm  Mul(a, b) => Mul(b, a)")]
    seen = []
    parallel = check_rules(rules, examples=20, seed=4, progress=lambda r: seen.append(r.rule.name), jobs=2)
    serial = check_rules(rules, examples=20, seed=4, jobs=1)
    assert seen == [r.name for r in rules]
    assert [r.status for r in parallel] == ["PASS", "FAIL", "PASS"]
    def shown(r):  # the report but its time
        first, *rest = format_result(r).splitlines()
        return [first.rsplit("  ", 1)[0]] + rest
    assert [shown(r) for r in parallel] == [shown(r) for r in serial]


# ---- float8, int4, bfloat16 and the wider unsigned types ------------------------------------------

def _astype_cast(c, to):
    """fold-cast's constant expression before it refused float8: numpy's astype, which does not
    saturate (1e6 to float8e4m3fn is NaN, where ONNX's Cast with saturate=1 gives 448)."""
    from onnx.helper import tensor_dtype_to_np_dtype
    return np.asarray(c).astype(tensor_dtype_to_np_dtype(int(to)))


def test_cast_fold_by_astype_fails_on_a_float8_target(monkeypatch):
    import dataclasses

    from saturate.check.schema import dtype_of_tensor_type, is_exotic
    from saturate.lang import builtins
    monkeypatch.setitem(builtins.CONST_FUNCS, "cast", dataclasses.replace(builtins.CONST_FUNCS["cast"],
                                                                          impl=_astype_cast))
    ex = _fails("rule fold-cast-old  Cast(a:const){to=to} => cast(a, to)", examples=300)
    assert is_exotic(dtype_of_tensor_type(ex.attrs["to"]))


def test_standard_cast_folds_pass():
    rules = {r.name: r for rs in parse_rules(open("rules/constant_fold.rules").read(), "rules/constant_fold.rules")
             for r in rs.rules}
    for name in ("fold-cast", "fold-castlike"):
        result = check_rule(rules[name], examples=150, seed=0)
        assert result.status == "PASS", format_result(result)


def test_quantize_commutes_with_reshape_on_int4_and_float8():
    rule = _rule("rule q-reshape  QuantizeLinear(Reshape(x, sh), s:const, z:const){saturate=sat}"
                 "  => Reshape(QuantizeLinear(x, s, z){saturate=sat}, sh)  if numel(s) == 1")
    result = check_rule(rule, examples=150, seed=0)
    assert result.status == "PASS", format_result(result)


def test_quantize_forcing_saturate_fails_on_float8():
    # saturate=0 maps values beyond float8's range to NaN (e4m3fn) or inf (e5m2), not its largest.
    ex = _fails("rule q-sat  QuantizeLinear(x, s:const, z:const) => QuantizeLinear(x, s, z){saturate=1}",
                examples=300)
    assert ex.values["z"].dtype.name.startswith("float8") and ex.node_attrs[()]["saturate"] == 0


def test_integer_rules_hold_or_fail_under_wraparound():
    # Adding and taking away a constant is sound under wraparound, signed or not; halving a
    # doubling is not (uint8's 200 * 2 is 144).
    result = check_rule(_rule("rule add-sub  Sub(Add(x, c:const), c:const) => x  if same_shape(x, c)"),
                        examples=100, seed=0)
    assert result.status == "PASS", format_result(result)
    ex = _fails("rule div-mul  Div(Mul(x, c:const), c:const) => x  if c == 2.0")
    assert ex.values["x"].dtype.kind in "iu"
