"""`saturate check` draws examples for rules over any ONNX op the interpreter runs: ops with
required attributes, unsigned parameters, or a reference kernel that runs only at float32;
ops whose inputs must fit each other's values (lengths, regions, geometry, an equation); ops
that draw random numbers are refused with the reason."""

from __future__ import annotations

import pytest

from saturate.check import check_rule
from saturate.check.checker import format_result
from saturate.lang.parser import load_rules


def _check(tmp_path, text: str, examples: int = 8):
    path = tmp_path / "probe.rules"
    path.write_text(f"ruleset probe level 1\nrule probe {text}\n")
    [rule] = load_rules([str(path)])
    return check_rule(rule, examples=examples, seed=0)


def _probe(tmp_path, op: str, arity: int):
    args = ", ".join(f"x{k}" for k in range(arity))
    return _check(tmp_path, f"Identity({op}({args})) => {op}({args})")


# Each drew no example (or failed in the checker) before: required attributes (DepthToSpace's
# blocksize, LRN's size, GroupNormalization's num_groups, LpPool's kernel_shape), a uint8
# parameter drawn as -1 (OneHot, ScatterElements), a reference body that fails in float64
# (MeanVarianceNormalization), a window length read from a drawn value (HannWindow), TopK's
# count (its input is named K, and takes one element).
@pytest.mark.parametrize("op, arity", [("DepthToSpace", 1), ("LRN", 1), ("GroupNormalization", 3),
                                       ("LpPool", 1), ("OneHot", 3), ("ScatterElements", 3),
                                       ("MeanVarianceNormalization", 1), ("HannWindow", 1), ("TopK", 2)])
def test_a_rule_over_the_op_is_checked(tmp_path, op, arity):
    result = _probe(tmp_path, op, arity)
    assert result.status == "PASS", result


# Ops whose inputs must fit each other's values, each drawn by a rule of its own: lengths within
# the time axis, regions inside the image, a convolution's geometry with zero points and scales,
# an equation over the operands' axes, a dtype of the input's width, head counts, a value held in
# an attribute, sizes read from values, an encoded image; OptionalGetElement at the opset that
# reads a plain tensor, GlobalLpPool on the interpreter's own kernel. A sound rule over each passes...
SOUND = [
    "ReverseSequence(x, l) => ReverseSequence(x, l)",
    "Identity(Col2Im(x, i, b)) => Col2Im(x, i, b)",
    "Identity(CenterCropPad(x, s)) => CenterCropPad(x, s)",
    "Identity(RoiAlign(x, r, b)) => RoiAlign(x, r, b)",
    "Identity(MaxRoiPool(x, r)) => MaxRoiPool(x, r)",
    "Identity(NonMaxSuppression(b, s, m, i, t)) => NonMaxSuppression(b, s, m, i, t)",
    "Identity(AffineGrid(t, s)) => AffineGrid(t, s)",
    "Identity(DeformConv(x, w, o)) => DeformConv(x, w, o)",
    "Identity(Einsum(a, b)) => Einsum(a, b)",
    'Einsum(a, b){equation="ij,jk->ik"} => MatMul(a, b)',
    'Einsum(a, a){equation="ij,jk->ik"} => MatMul(a, a)',     # one operand twice: square
    'Einsum(a){equation="ij->ji"} => Transpose(a){perm=[1, 0]}',
    "Identity(BitCast(x)) => BitCast(x)",
    "Identity(TfIdfVectorizer(x)) => TfIdfVectorizer(x)",
    "Identity(ConvInteger(x, w, a, b)) => ConvInteger(x, w, a, b)",
    "Identity(QLinearConv(x, xs, xz, w, ws, wz, ys, yz)) => QLinearConv(x, xs, xz, w, ws, wz, ys, yz)",
    "Identity(MatMulInteger(a, b, za, zb)) => MatMulInteger(a, b, za, zb)",
    "Identity(QLinearMatMul(a, sa, za, b, sb, zb, sy, zy)) => QLinearMatMul(a, sa, za, b, sb, zb, sy, zy)",
    "Identity(Attention(q, k, v)) => Attention(q, k, v)",
    "Identity(LinearAttention(q, k, v)) => LinearAttention(q, k, v)",
    "Identity(Constant()) => Constant()",
    "Identity(MelWeightMatrix(n, d, r, lo, hi)) => MelWeightMatrix(n, d, r, lo, hi)",
    "Identity(Resize(x, roi, scales)) => Resize(x, roi, scales)",
    "Identity(ImageDecoder(x)) => ImageDecoder(x)",
    "OptionalGetElement(x) => x",
    "Identity(GlobalLpPool(x)) => GlobalLpPool(x)",
    # asked for a shape by the op above them
    "Conv(RoiAlign(x, r, b), w) => Conv(RoiAlign(x, r, b), w)",
    "MatMul(Attention(q, k, v), w) => MatMul(Attention(q, k, v), w)",
    "DequantizeLinear(QLinearConv(x, xs, xz, w, ws, wz, ys, yz), s, z)"
    " => DequantizeLinear(QLinearConv(x, xs, xz, w, ws, wz, ys, yz), s, z)",
]

# ... and a wrong one fails with a counterexample, so the examples reach the op's semantics.
UNSOUND = [
    "ReverseSequence(x, l) => x",
    "Col2Im(x, i, b) => Neg(Col2Im(x, i, b))",
    "CenterCropPad(x, s) => x",
    'RoiAlign(x, r, b){mode="avg"} => RoiAlign(x, r, b){mode="max"}',
    "MaxRoiPool(x, r) => Neg(MaxRoiPool(x, r))",
    "NonMaxSuppression(b, s, m, i, t) => NonMaxSuppression(b, Neg(s), m, i, t)",
    "AffineGrid(t, s){align_corners=0} => AffineGrid(t, s){align_corners=1}",
    "DeformConv(x, w, o) => Exp(DeformConv(x, w, o))",
    'Einsum(a){equation="ij->ji"} => a',
    "Einsum(a, b) => Neg(Einsum(a, b))",
    "BitCast(x) => Neg(BitCast(x))",
    "TfIdfVectorizer(x) => Neg(TfIdfVectorizer(x))",
    "ConvInteger(x, w, a, b) => ConvInteger(x, w)",
    "QLinearConv(x, xs, xz, w, ws, wz, ys, yz) => QLinearConv(x, xs, xz, w, xs, wz, ys, yz)",
    "MatMulInteger(a, b, za, zb) => MatMulInteger(a, b)",
    "QLinearMatMul(a, sa, za, b, sb, zb, sy, zy) => QLinearMatMul(a, sy, za, b, sb, zb, sa, zy)",
    "Attention(q, k, v) => Attention(k, q, v)",
    "LinearAttention(q, k, v) => LinearAttention(k, q, v)",
    "Constant() => Neg(Constant())",
    'ImageDecoder(x){pixel_format="RGB"} => ImageDecoder(x){pixel_format="BGR"}',
    "OptionalGetElement(x) => Neg(x)",
    "GlobalLpPool(x){p=2} => GlobalLpPool(x){p=1}",
]


@pytest.mark.parametrize("rule", SOUND)
def test_a_sound_rule_over_an_op_with_fitted_inputs_passes(tmp_path, rule):
    result = _check(tmp_path, rule)
    assert result.status == "PASS", format_result(result)


@pytest.mark.parametrize("rule", UNSOUND)
def test_a_wrong_rule_over_an_op_with_fitted_inputs_fails(tmp_path, rule):
    result = _check(tmp_path, rule)
    assert result.status == "FAIL", format_result(result)
    assert result.counterexample is not None


def test_a_bitcast_to_a_written_type_is_drawn_from_inputs_of_its_width(tmp_path):
    # `to` fixes the output's dtype (int32 here, not the floats other ops are drawn on) and the
    # input is drawn 4 bytes wide, read at its own dtype: rereading it keeps the shape.
    result = _check(tmp_path, "Shape(BitCast(x){to=6}) => Shape(x)", examples=20)
    assert result.status == "PASS", format_result(result)
    assert result.examples > 0


@pytest.mark.parametrize("op, arity", [("RandomNormalLike", 1), ("Bernoulli", 1)])
def test_an_op_drawing_random_numbers_is_refused_with_the_reason(tmp_path, op, arity):
    result = _probe(tmp_path, op, arity)
    assert result.status == "NOGEN", result
    assert f"op '{op}' cannot be checked: it draws random numbers" in result.message


@pytest.mark.parametrize("op, arity", [("StringSplit", 1), ("StringConcat", 2)])
def test_an_op_over_strings_is_refused_with_the_reason(tmp_path, op, arity):
    result = _probe(tmp_path, op, arity)
    assert result.status == "NOGEN", result
    assert f"op '{op}' cannot be checked: it reads or writes strings" in result.message
