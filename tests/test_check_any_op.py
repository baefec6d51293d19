"""`saturate check` draws examples for rules over any ONNX op the interpreter runs: ops with
required attributes, unsigned parameters, or a reference kernel that runs only at float32;
ops whose inputs must fit each other's values (lengths, regions, geometry, an equation); ops
over strings; ops that draw random numbers (compared by seed, else in distribution)."""

from __future__ import annotations

import numpy as np
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
# reads a plain tensor, GlobalLpPool on the interpreter's own kernel, RotaryEmbedding's caches
# of half the rotated width per step or per position id. A sound rule over each passes...
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
    "Identity(RotaryEmbedding(x, c, s)) => RotaryEmbedding(x, c, s)",
    "Identity(RotaryEmbedding(x, c, s, p)) => RotaryEmbedding(x, c, s, p)",
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
    "RotaryEmbedding(x, c, s) => RotaryEmbedding(x, s, c)",
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


# Ops over strings: string tensors drawn with letters, digits, spaces, separators, non-ASCII
# letters and empty strings; attributes from the schema (StringNormalizer's stopwords taken from
# the drawn strings); strings compared exactly. Cast reads strings of numbers and writes them.
STRING_SOUND = [
    "Identity(StringConcat(x, y)) => StringConcat(x, y)",
    "Identity(StringSplit(x)) => StringSplit(x)",
    "Identity(RegexFullMatch(x)) => RegexFullMatch(x)",
    "Identity(StringNormalizer(x)) => StringNormalizer(x)",
    "Identity(Cast(x){to=8}) => Cast(x){to=8}",
    "Cast(Cast(x){to=8}){to=8} => Cast(x){to=8}",
    "Identity(Cast(x)) => Cast(x)",
]
STRING_UNSOUND = [
    "StringConcat(x, y) => StringConcat(y, x)",
    'StringSplit(x){delimiter=","} => StringSplit(x){delimiter=";"}',
    'RegexFullMatch(x){pattern="[a-z]+"} => RegexFullMatch(x){pattern="[a-z]*"}',    # apart on ""
    'StringNormalizer(x){case_change_action="LOWER"} => StringNormalizer(x){case_change_action="UPPER"}',
    # a number written as a string shows its dtype's precision: 0.1 in float32 is not 0.1 in float64
    "Cast(Cast(x){to=1}){to=8} => Cast(x){to=8}",
]


@pytest.mark.parametrize("rule", STRING_SOUND)
def test_a_sound_rule_over_strings_passes(tmp_path, rule):
    result = _check(tmp_path, rule, examples=20)
    assert result.status == "PASS", format_result(result)
    assert result.examples > 0


@pytest.mark.parametrize("rule", STRING_UNSOUND)
def test_a_wrong_rule_over_strings_fails_with_the_strings_shown(tmp_path, rule):
    result = _check(tmp_path, rule, examples=20)
    assert result.status == "FAIL", format_result(result)
    shown = format_result(result)
    assert "string[" in shown and "'" in shown, shown    # strings print quoted, by shape


def test_cast_reads_strings_of_numbers(tmp_path):
    # Among the examples of a rule over Cast, some read strings: Cast's source is every dtype.
    from hypothesis import given, settings
    from saturate.check import rule_examples
    path = tmp_path / "probe.rules"
    path.write_text("ruleset probe level 1\nrule probe Identity(Cast(x)) => Cast(x)\n")
    [rule] = load_rules([str(path)])
    seen = []

    @settings(max_examples=150, database=None, derandomize=True)
    @given(rule_examples(rule))
    def draw(example):
        seen.append(example.values["x"])
    draw()
    strings = [v for v in seen if v.dtype == object]
    assert strings and all(isinstance(s, str) for v in strings for s in v.ravel())


def test_chi_square_pvalues_are_the_distributions_tail():
    from saturate.check.checker import _chi_square_pvalue

    # Critical values from the chi-square table, and the tail far past them.
    for stat, df, p in [(3.841459, 1, 0.05), (9.487729, 4, 0.05), (23.209251, 10, 0.01), (0.454936, 1, 0.5),
                        (2.0, 2, 0.36787944117144233), (50.0, 2, 1.388794386496402e-11)]:
        assert abs(_chi_square_pvalue(stat, df) - p) <= 1e-6 * p


def test_counts_of_a_few_values_are_compared_by_chi_square_where_kolmogorov_smirnov_misses():
    # Six classes drawn 1200 times each side, a tenth of the draws moved from class 2 to class 3: the
    # distance of the Kolmogorov-Smirnov test moves in steps on so few values and misses it at the
    # checker's level; the counts do not. The same counts pass.
    from saturate.check.checker import DISTRIBUTION_ALPHA, _ks_distance, _ks_pvalue, _ks_reason

    left = np.repeat(np.arange(6.0), 200)[:, None]
    right = np.repeat(np.arange(6.0), [200, 200, 80, 320, 200, 200])[:, None]
    assert _ks_pvalue(_ks_distance(left[:, 0], right[:, 0]), 1200, 1200) > DISTRIBUTION_ALPHA
    reason = _ks_reason(left, right, DISTRIBUTION_ALPHA, (1,))
    assert reason is not None and "chi-square" in reason and "right counts" not in reason
    assert "left counts {0: 200, 1: 200, 2: 200, 3: 200, 4: 200, 5: 200}, right {0: 200, 1: 200, 2: 80, 3: 320" in reason
    assert _ks_reason(left, left[::-1], DISTRIBUTION_ALPHA, (1,)) is None


# Ops drawing random numbers: seeded alike, a right side keeping the left's random op gives the
# same numbers; one that does not is compared in distribution (Kolmogorov-Smirnov over runs, or
# chi-square over the counts of each value where the values are a few integers).
RANDOM_SOUND = [
    "Identity(RandomNormal()) => RandomNormal()",
    "Identity(RandomUniform()) => RandomUniform()",
    "Identity(RandomNormalLike(x)) => RandomNormalLike(x)",
    "Identity(RandomUniformLike(x)) => RandomUniformLike(x)",
    "Identity(Bernoulli(p)) => Bernoulli(p)",
]
RANDOM_UNSOUND = [
    "RandomNormal(){scale=1.0} => RandomNormal(){scale=2.0}",
    "RandomUniform(){high=1.0} => RandomUniform(){high=1.5}",
    "RandomNormalLike(x){mean=0.0} => RandomNormalLike(x){mean=0.5}",
    "RandomUniformLike(x){low=0.0} => RandomUniformLike(x){low=-1.0}",
    "Bernoulli(p) => Bernoulli(Mul(p, p))",
]


@pytest.mark.parametrize("rule", RANDOM_SOUND)
def test_a_sound_rule_over_a_random_op_passes(tmp_path, rule):
    result = _check(tmp_path, rule, examples=20)
    assert result.status == "PASS", format_result(result)
    assert result.examples > 0


def test_a_rule_equal_only_in_distribution_passes(tmp_path):
    # -N(0, 1) draws other numbers than N(0, 1) from one seed, with the same distribution.
    result = _check(tmp_path, "Neg(RandomNormal(){mean=0.0}) => RandomNormal(){mean=0.0}", examples=3)
    assert result.status == "PASS", format_result(result)


@pytest.mark.parametrize("rule", RANDOM_UNSOUND)
def test_a_wrong_rule_over_a_random_op_fails_in_distribution(tmp_path, rule):
    result = _check(tmp_path, rule, examples=20)
    assert result.status == "FAIL", format_result(result)
    assert "distributions differ" in result.counterexample.reason, format_result(result)


def test_a_distribution_failure_is_reproduced_by_its_seed(tmp_path):
    rule = "RandomNormal(){scale=1.0} => RandomNormal(){scale=2.0}"
    first, again = _check(tmp_path, rule, examples=20), _check(tmp_path, rule, examples=20)
    assert first.status == again.status == "FAIL"
    assert format_result(first).split("s\n", 1)[1] == format_result(again).split("s\n", 1)[1]


def test_a_seeded_random_op_runs_alike():
    # What comparing seeded sides exactly rests on: the interpreter draws the same numbers for a
    # seed, and other numbers for another.
    import numpy as np
    from saturate.core.ir import Node
    from saturate.interp.interpreter import eval_node
    node = lambda seed: Node("RandomNormal", [], ["y"], {"shape": [3, 2], "seed": seed}, name="r")
    first, second, other = (eval_node(node(s), [], 22)[0] for s in (5.0, 5.0, 6.0))
    assert np.array_equal(first, second) and not np.array_equal(first, other)


def test_the_distribution_test_tells_a_scale_apart_and_not_a_sample():
    import numpy as np
    from saturate.check.checker import DISTRIBUTION_ALPHA, _ks_reason
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(1000, 3)), rng.normal(size=(1000, 3))
    assert _ks_reason(a, b, DISTRIBUTION_ALPHA, (3,)) is None
    assert "distributions differ" in _ks_reason(a, 2 * b, DISTRIBUTION_ALPHA, (3,))
    # one draw broadcast over every element: the pooled test counts runs, not elements
    c = np.repeat(rng.normal(size=(1000, 1)), 50, axis=1)
    d = np.repeat(rng.normal(size=(1000, 1)), 50, axis=1)
    assert _ks_reason(c, d, DISTRIBUTION_ALPHA, (50,)) is None


# The last three ops of ONNX's default domain to be checked: Multinomial (the interpreter's own
# kernel; seeded alike, else compared in distribution, its logits drawn with classes never drawn
# and rows of one dominant class), the deprecated Scatter (run as ScatterElements, its new name)
# and SequenceMap (a body drawn over the items: Identity, an elementwise op with a constant of its
# own or an extra input, a Cast, a Shape).
LAST_SOUND = [
    "Identity(Multinomial(x)) => Multinomial(x)",
    "Identity(Scatter(x, i, u)) => Scatter(x, i, u)",
    "Scatter(x, i, u){axis=a} => ScatterElements(x, i, u){axis=a}",
    "Identity(SequenceMap(s)) => SequenceMap(s)",
    "Identity(SequenceMap(s, x)) => SequenceMap(s, x)",
    "SequenceLength(SequenceMap(s, x)) => SequenceLength(s)",
]
LAST_UNSOUND = [
    ("Multinomial(x) => Multinomial(Neg(x))", "distributions differ"),
    ("Multinomial(Add(x, x)) => Multinomial(x)", "distributions differ"),     # logits scaled by 2
    ('Scatter(x, i, u){axis=a} => ScatterElements(x, i, u){axis=a, reduction="add"}', "outputs differ"),
    ("Identity(SequenceMap(s)) => s", "differ"),
    ("SequenceMap(s, x) => SequenceMap(s, Neg(x))", "outputs differ"),
]


@pytest.mark.parametrize("rule", LAST_SOUND)
def test_a_sound_rule_over_multinomial_scatter_or_sequence_map_passes(tmp_path, rule):
    result = _check(tmp_path, rule, examples=10)
    assert result.status == "PASS" and result.examples == 10, format_result(result)


@pytest.mark.parametrize("rule, reason", LAST_UNSOUND)
def test_a_wrong_rule_over_multinomial_scatter_or_sequence_map_fails(tmp_path, rule, reason):
    result = _check(tmp_path, rule, examples=10)
    assert result.status == "FAIL", format_result(result)
    assert reason in result.counterexample.reason, format_result(result)


def test_a_sequence_map_body_shows_in_the_counterexample(tmp_path):
    result = _check(tmp_path, "Identity(SequenceMap(s)) => s", examples=10)
    assert "SequenceMap at [0]: body=body (" in format_result(result), format_result(result)
    assert "OpaqueAttr" not in format_result(result)


def _drawn(tmp_path, text: str, count: int) -> list:
    from hypothesis import HealthCheck, given, settings
    from saturate.check import rule_examples
    path = tmp_path / "probe.rules"
    path.write_text(f"ruleset probe level 1\nrule probe {text}\n")
    [rule] = load_rules([str(path)])
    seen = []

    @settings(max_examples=count, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(rule_examples(rule))
    def draw(example):
        seen.append(example)
    draw()
    return seen


def test_multinomial_logits_hold_classes_never_drawn_and_dominant_ones(tmp_path):
    import numpy as np
    logits = [ex.values["x"] for ex in _drawn(tmp_path, "Identity(Multinomial(x)) => Multinomial(x)", 60)]
    assert any(np.isneginf(x).any() for x in logits)
    assert any((x == 8.0).any() and x.shape[1] > 1 for x in logits)             # one class far above the rest
    assert all(np.isfinite(row).any() for x in logits for row in x)             # every row has a class to draw
    dtypes = {ex.node_attrs[(0,)].get("dtype") for ex in _drawn(tmp_path, "Identity(Multinomial(x)) => Multinomial(x)", 60)}
    assert {None, 6, 7} <= dtypes


def test_sequence_map_bodies_are_drawn_of_every_kind(tmp_path):
    from saturate.frontend.onnx_scope import parse_attribute
    wanted = {"Identity", "Neg", "Add", "constant", "Cast", "CastLike", "Shape"}
    kinds = set()
    # Which draws come first depends on hypothesis's version: a second, longer round where the
    # first missed a kind (a Shape body needs an int64 output and one input, a few in a hundred).
    for count in (80, 400):
        for text in ("Identity(SequenceMap(s)) => SequenceMap(s)", "Identity(SequenceMap(s, x)) => SequenceMap(s, x)"):
            for ex in _drawn(tmp_path, text, count):
                body = parse_attribute(ex.node_attrs[(0,)]["body"].payload).g
                kinds |= {n.op_type for n in body.node} | ({"constant"} if body.initializer else set())
        if wanted <= kinds:
            break
    assert wanted <= kinds, kinds
