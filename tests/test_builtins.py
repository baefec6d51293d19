"""Rule builtins: numpy semantics of constant functions, queries and guards (ONNX Runtime as reference)."""

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper

from saturate.lang import builtins, query_builtins
from saturate.lang.builtins import CONST_FUNCS
from saturate.lang.guard_builtins import GUARDS
from saturate.lang.query_builtins import QUERIES
from saturate.ops.infer import broadcast_shape

F = CONST_FUNCS
G = GUARDS


def run_onnx(op: str, inputs: list[np.ndarray], **attrs) -> np.ndarray:
    """One ONNX node run by ONNX Runtime: the reference for the numpy builtins."""
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, ["y"], **attrs)
    dtype = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64}
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, dtype[a.dtype], a.shape) for n, a in zip(names, inputs)],
        [helper.make_tensor_value_info("y", dtype[inputs[0].dtype], None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, dict(zip(names, inputs)))[0]


small = hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=4, max_side=4),
                   elements=st.floats(-4, 4, width=32))


def close(a, b):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-4, atol=1e-5)


# ---- tables are consistent ----------------------------------------------------------------------

def test_every_builtin_declares_one_kind_per_parameter():
    # "op" and "list": the node a rule of any op matched, and its inputs (fold-any's guards);
    # "stored": whether a constant is one the model stores (the projection merges' guard).
    kinds = {"const", "int", "ints", "value", "type", "isconst", "any", "dims", "data", "op", "list", "stored"}
    for table in (CONST_FUNCS, QUERIES, GUARDS):
        for name, fn in table.items():
            assert len(fn.params) == fn.arity, name
            assert set(fn.params) <= kinds, name


def test_value_guards_are_the_ones_reading_data():
    reading = {n for n, g in GUARDS.items() if g.needs_values}
    assert reading == {"positive", "nonnegative", "nonzero", "ones", "zeros", "not_ones", "not_zeros", "floating",
                       "all_equal", "same_quant", "zero_point_at_min", "clip_saturates", "fine_accumulator",
                       "fold_fits", "precedes"}
    assert all(GUARDS[n].params[0] == "const" for n in reading - {"fold_fits"})
    assert {n for n, g in GUARDS.items() if g.termination} == {"not_ones", "not_zeros", "not_const"}


# ---- arithmetic -------------------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(small, small)
def test_infix_arithmetic_matches_onnx_with_broadcasting(a, b):
    if broadcast_shape(a.shape, b.shape) is None:
        return
    for fn, op in (("add", "Add"), ("sub", "Sub"), ("mul", "Mul")):
        out = F[fn].impl(a, b)
        assert out.dtype == np.float32
        close(out, run_onnx(op, [a, b]))
    b = np.where(np.abs(b) < 0.1, 1.0, b).astype(np.float32)
    close(F["div"].impl(a, b), run_onnx("Div", [a, b]))


def test_python_scalars_keep_float32_and_literals_alone_are_float32():
    a = np.array([1, 2], np.float32)
    assert F["add"].impl(a, 1e-5).dtype == np.float32
    assert F["mul"].impl(2, 3).dtype == np.float32


def test_integer_division_truncates_like_onnx():
    a, b = np.array([-7, 7, -6], np.int64), np.array([2, 2, 4], np.int64)
    out = F["div"].impl(a, b)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, run_onnx("Div", [a, b]))


@settings(max_examples=30, deadline=None)
@given(small)
def test_unary_functions_match_onnx(a):
    pos = np.abs(a) + np.float32(0.5)
    close(F["neg"].impl(a), run_onnx("Neg", [a]))
    close(F["sqrt"].impl(pos), run_onnx("Sqrt", [pos]))
    close(F["reciprocal"].impl(pos), run_onnx("Reciprocal", [pos]))
    close(F["rsqrt"].impl(pos), 1 / run_onnx("Sqrt", [pos]))
    close(F["relu"].impl(a), run_onnx("Relu", [a]))
    close(F["sigmoid"].impl(a), run_onnx("Sigmoid", [a]))
    close(F["tanh"].impl(a), run_onnx("Tanh", [a]))
    close(F["erf"].impl(a), run_onnx("Erf", [a]))
    close(F["leaky_relu"].impl(a, 0.2), run_onnx("LeakyRelu", [a], alpha=0.2))
    lo, hi = np.array(-1, np.float32), np.array(2, np.float32)
    close(F["clip"].impl(a, lo, hi), run_onnx("Clip", [a, lo, hi]))
    close(F["softmax"].impl(a, -1), run_onnx("Softmax", [a], axis=-1))
    close(F["flatten"].impl(a, 1), run_onnx("Flatten", [a], axis=1))


@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_gemm_and_matmul_match_onnx(ta, tb):
    rng = np.random.default_rng(ta * 2 + tb)
    a = rng.standard_normal((3, 4) if not ta else (4, 3)).astype(np.float32)
    b = rng.standard_normal((4, 5) if not tb else (5, 4)).astype(np.float32)
    c = rng.standard_normal((5,)).astype(np.float32)
    want = run_onnx("Gemm", [a, b, c], alpha=0.5, beta=2.0, transA=ta, transB=tb)
    close(F["gemm"].impl(a, b, c, 0.5, 2.0, ta, tb), want)
    if not ta and not tb:
        close(F["matmul"].impl(a, b), run_onnx("MatMul", [a, b]))


# ---- shaping -------------------------------------------------------------------------------------

def test_per_axis_lays_values_on_one_axis():
    c = np.arange(3, dtype=np.float32).reshape(1, 3, 1, 1)
    out = F["per_axis"].impl(c, 0, 4)
    assert out.shape == (3, 1, 1, 1) and out.ravel().tolist() == [0, 1, 2]
    assert F["per_axis"].impl(np.float32(2), 1, 2).shape == (1, 1)
    assert F["per_axis"].impl(c, -1, 2).shape == (1, 3)


def test_vec_and_broadcast_vec():
    assert F["vec"].impl(np.ones((1, 4, 1, 1), np.float32)).shape == (4,)
    assert F["vec"].impl(np.float32(3)).shape == (1,)
    np.testing.assert_array_equal(F["broadcast_vec"].impl(np.full((1, 1), 2, np.float32), 3), [2, 2, 2])
    with pytest.raises(ValueError):
        F["vec"].impl(np.ones((2, 3), np.float32))


def test_reshape_unsqueeze_expand_transpose_match_onnx():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for shape in ([0, -1], [4, 0, 2], [-1], [2, 12, 1]):
        s = np.array(shape, np.int64)
        np.testing.assert_array_equal(F["reshape"].impl(a, s), run_onnx("Reshape", [a, s]))
    axes = np.array([0, -1], np.int64)
    np.testing.assert_array_equal(F["unsqueeze"].impl(a, axes), run_onnx("Unsqueeze", [a, axes]))
    col = np.arange(3, dtype=np.float32).reshape(3, 1)
    shape = np.array([2, 1, 4], np.int64)
    np.testing.assert_array_equal(F["expand"].impl(col, shape), run_onnx("Expand", [col, shape]))
    for perm in ((2, 0, 1), None):
        kw = {} if perm is None else {"perm": list(perm)}
        np.testing.assert_array_equal(F["transpose"].impl(a, perm), run_onnx("Transpose", [a], **kw))


def test_shape_ops_match_onnx():
    a = np.arange(24, dtype=np.float32).reshape(2, 1, 3, 4)
    for idx in (np.array(1, np.int64), np.array([[-1, 0], [2, 2]], np.int64)):
        for axis in (2, -1):
            np.testing.assert_array_equal(F["gather"].impl(a, idx, axis), run_onnx("Gather", [a, idx], axis=axis))
    with pytest.raises(ValueError):
        F["gather"].impl(a, np.array([3], np.int64), 2)
    axes = np.array([-3], np.int64)
    np.testing.assert_array_equal(F["squeeze"].impl(a, axes), run_onnx("Squeeze", [a, axes]))
    np.testing.assert_array_equal(F["squeeze"].impl(a, None), run_onnx("Squeeze", [a]))
    b = np.arange(6, dtype=np.float32).reshape(2, 1, 3, 1)
    np.testing.assert_array_equal(F["concat"].impl(a, np.repeat(b, 4, axis=3), 1),
                                  run_onnx("Concat", [a, np.repeat(b, 4, axis=3)], axis=1))
    cast = F["cast"].impl(a - 11.5, TensorProto.INT64)   # ONNX Cast to an int truncates toward 0
    assert cast.dtype == np.int64 and cast.ravel()[:2].tolist() == [-11, -10] and cast.ravel()[-1] == 11


def test_shape_of_reads_static_dims_only():
    q = QUERIES["shape_of"].impl
    assert q((2, 3, 4), 0, None).tolist() == [2, 3, 4] and q((2, 3, 4), 0, None).dtype == np.int64
    assert q((2, 3, 4), -2, None).tolist() == [3, 4] and q((2, 3, 4), 1, 2).tolist() == [3]
    assert q(("N", 3, 4), 1, None).tolist() == [3, 4]
    assert q(("N", 3, 4), 0, None) is None
    at = QUERIES["shape_at"].impl
    assert at(("N", 3, 4), 0, None, np.array([2, -2], np.int64)).tolist() == [4, 3]
    assert at(("N", 3, 4), 1, None, np.array(1, np.int64)).tolist() == 4
    assert at(("N", 3, 4), 0, None, np.array(0, np.int64)) is None
    assert at((2, 3), 0, None, np.array([2], np.int64)) is None
    assert G["static"].impl((2, 3)) and not G["static"].impl(("N", 3)) and not G["static"].impl((None,))


perms = st.integers(1, 5).flatmap(lambda r: st.tuples(st.just(r), st.permutations(range(r)), st.permutations(range(r))))


@settings(max_examples=50, deadline=None)
@given(perms, st.booleans(), st.booleans())
def test_compose_perm_is_one_transpose(rpq, p_absent, q_absent):
    rank, p, q = rpq
    p, q = (None if p_absent else tuple(p)), (None if q_absent else tuple(q))
    a = np.arange(np.prod(range(2, rank + 2)), dtype=np.float32).reshape(range(2, rank + 2))
    twice = F["transpose"].impl(F["transpose"].impl(a, p), q)
    once = F["transpose"].impl(a, F["compose_perm"].impl(p, q, rank))
    np.testing.assert_array_equal(twice, once)
    assert G["identity_perm"].impl(F["compose_perm"].impl(p, q, rank), rank) == (twice.shape == a.shape
                                                                                and np.array_equal(twice, a))


# ---- queries ---------------------------------------------------------------------------------------

def test_queries_read_static_shapes():
    assert QUERIES["rank"].impl(("N", 3, 8, 8)) == 4
    assert QUERIES["dim"].impl(("N", 3, 8, 8), 1) == 3
    assert QUERIES["dim"].impl(("N", 3, 8, 8), -1) == 8
    assert QUERIES["dim"].impl((3,), 5) is None
    assert QUERIES["numel"].impl((2, 3, 4)) == 24
    assert QUERIES["numel"].impl(("N", 3)) is None


# ---- guards ------------------------------------------------------------------------------------------

shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=3)


@settings(max_examples=80, deadline=None)
@given(shapes, shapes)
def test_broadcast_guards_agree_with_numpy(a, b):
    try:
        want = np.broadcast_shapes(a, b)
    except ValueError:
        want = None
    assert broadcast_shape(a, b) == want
    assert G["broadcastable"].impl(a, b) == (want is not None)
    assert G["broadcasts_into"].impl(a, b) == (want == tuple(b))
    assert G["same_shape"].impl(a, b) == (tuple(a) == tuple(b))


@settings(max_examples=80, deadline=None)
@given(shapes, st.integers(-4, 4), st.integers(0, 4))
def test_varies_only_along_means_per_axis_reproduces_the_constant(shape, axis, rank):
    c = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    holds = G["varies_only_along"].impl(shape, axis, rank)
    assert G["per_axis"].impl(shape, axis, rank) == holds
    if holds:
        rebuilt = F["per_axis"].impl(F["vec"].impl(c), axis, rank)
        assert rebuilt.ndim == rank
        np.testing.assert_array_equal(np.broadcast_to(rebuilt, np.broadcast_shapes(rebuilt.shape, c.shape)),
                                      np.broadcast_to(c, np.broadcast_shapes(rebuilt.shape, c.shape)))
    elif -rank <= axis < rank and len(shape) <= rank:
        # Some other axis than `axis` is not 1 after right-aligning to `rank` dims.
        padded = (1,) * (rank - len(shape)) + tuple(shape)
        assert any(d != 1 for i, d in enumerate(padded) if i != axis % rank)


def test_symbolic_and_unknown_dims_leave_shape_guards_false():
    assert G["broadcastable"].impl(("N", 3), (1, 3))
    assert not G["broadcastable"].impl(("N", 3), (2, 3))
    assert not G["broadcastable"].impl((None, 3), (2, 3))
    assert G["broadcasts_into"].impl((1, 3, 1, 1), ("N", 3, 5, 5))
    assert not G["same_shape"].impl((None,), (None,))
    assert G["is_scalar"].impl(()) and G["is_scalar"].impl((1, 1)) and not G["is_scalar"].impl((2,))


def test_value_guards():
    pos, mixed = np.array([1, 2], np.float32), np.array([0, -1], np.float32)
    assert G["positive"].impl(pos) and not G["positive"].impl(mixed)
    assert G["nonnegative"].impl(np.abs(mixed)) and not G["nonnegative"].impl(mixed)
    assert G["nonzero"].impl(pos) and not G["nonzero"].impl(mixed)
    assert G["ones"].impl(np.ones(3, np.float32)) and not G["ones"].impl(pos)
    assert G["zeros"].impl(np.zeros(3, np.float32)) and not G["zeros"].impl(mixed)
    assert G["not_ones"].impl(pos) and not G["not_ones"].impl(np.ones(2, np.float32))
    assert G["not_zeros"].impl(mixed) and not G["not_zeros"].impl(np.zeros(2, np.float32))
    assert G["floating"].impl(pos) and not G["floating"].impl(np.ones(2, np.int64))


def test_comparisons():
    assert G["=="].impl(4, 4) and G["!="].impl(4, 3)
    assert G["<"].impl(1, 2) and G["<="].impl(2, 2) and G[">"].impl(3, 2) and G[">="].impl(2, 2)
    assert G["=="].impl([1, 1], (1, 1)) and G["=="].impl(np.array([2, 2]), (2, 2))
    assert G["=="].impl("NOTSET", "NOTSET")
    assert not G["=="].impl(None, None) and not G["<"].impl(None, 1)
    assert not G["<"].impl("a", 1)


# ---- shapes with symbolic dims ------------------------------------------------------------------

B = ("dim", "x", 0)      # an unknown dim, as the engine spells it
C = ("dim", "x", 1)


def test_reshape_target_reads_one_unknown_from_the_count_and_copies_dims_in_place():
    # One symbolic dim is -1, so the target merges with a Reshape before it; with two, those
    # in place are copied (0).
    assert QUERIES["reshape_target"].impl((B, 37, 576), (B, 37, 3, 3, 64)).tolist() == [-1, 37, 3, 3, 64]
    assert QUERIES["reshape_target"].impl((B, C, 576), (B, C, 3, 3, 64)).tolist() == [0, 0, 3, 3, 64]
    assert QUERIES["reshape_target"].impl((B, C, 576), (B, C, 3, 192)).tolist() == [0, 0, 3, 192]
    assert QUERIES["reshape_target"].impl((B, 6, 8), (6, B, 8)).tolist() == [6, -1, 8]
    assert QUERIES["reshape_target"].impl((B, 6, 8), (("elem", 1), B, 8)) is None     # two unknown
    assert QUERIES["reshape_target"].impl((B, 6, 8), (0, B, 8)) is None               # count ambiguous


def test_unit_dim_moves_as_reshape_targets():
    assert QUERIES["transpose_target"].impl((1, 16, 768), (1, 0, 2)).tolist() == [16, 1, 768]
    assert QUERIES["transpose_target"].impl((2, 16, 768), (1, 0, 2)) is None
    assert QUERIES["transpose_target"].impl((1, B, 768), (1, 0, 2)).tolist() == [-1, 1, 768]
    assert QUERIES["squeeze_target"].impl((3, B, 1, 8), (-2,)).tolist() == [3, -1, 8]
    assert QUERIES["squeeze_target"].impl((3, 2, 1), ()) is None          # ORT and onnx.reference differ
    assert QUERIES["squeeze_target"].impl((3, 2, 1), (1,)) is None        # not a dim of size 1
    assert QUERIES["unsqueeze_target"].impl((B, 4), (1, -1)).tolist() == [-1, 1, 4, 1]
    assert QUERIES["unsqueeze_target"].impl((B, C), (2,)).tolist() == [0, 0, 1]


def test_same_dims_and_whole_slices():
    assert GUARDS["same_dims"].impl((B, 16, 64), (-1, 16, 64))
    assert GUARDS["same_dims"].impl((B, 16, 64), (0, 16, 64))
    assert not GUARDS["same_dims"].impl((B, 16, 64), (-1, 64, 16))
    assert not GUARDS["same_dims"].impl((B, B, 64), (-1, 0, 64))
    assert GUARDS["whole_slice"].impl((4, 6), (0,), (2**62,), (1,), ())
    assert GUARDS["whole_slice"].impl((4, 6), (-4,), (4,), (), (1,))
    assert not GUARDS["whole_slice"].impl((4, 6), (0,), (-1,), (1,), ())
    assert not GUARDS["whole_slice"].impl((B, 6), (0,), (2**62,), (0,), ())   # unknown: may differ
    assert not GUARDS["whole_slice"].impl((4, 6), (3,), (-5,), (0,), (-1,))   # reversed


def test_unit_pooling_windows():
    unit = GUARDS["unit_window"].impl
    assert unit((1, 1), None, None)                      # omitted strides and pads: 1s and 0s
    assert unit((1,), (1,), (0, 0))
    assert not unit((1, 1), (2, 1), None)                # every other element
    assert not unit((1, 2), None, None)
    assert not unit((1, 1), None, (0, 1, 0, 0))          # a padded border
    assert not unit((1, 1), (1,), None)                  # strides for another rank
    assert not unit((), None, None)


def test_static_dims_are_read_past_a_symbolic_one():
    assert QUERIES["shape_slice"].impl(("batch", 12, 64), 0, None, (-1,), (2**63 - 1,), (), ()).tolist() == [64]
    assert QUERIES["shape_slice"].impl(("batch", 12, 64), 0, None, (0,), (2,), (), ()) is None
    assert QUERIES["rows_restore"].impl((B, 16, 768), 3072).tolist() == [-1, 16, 3072]
    assert QUERIES["rows_shape"].impl((B, 16, 768)).tolist() == [-1, 768]


# ---- elementwise functions of onnx.reference, value comparisons, computed attributes -------------

@settings(max_examples=30, deadline=None)
@given(small, small)
def test_exp_log_pow_min_max_and_other_elementwise_functions_match_onnx(a, b):
    pos = np.abs(a) + np.float32(0.5)
    for fn, op, arg in (("exp", "Exp", a), ("log", "Log", pos), ("abs", "Abs", a), ("sign", "Sign", a),
                        ("floor", "Floor", a), ("ceil", "Ceil", a), ("round", "Round", a), ("sin", "Sin", a),
                        ("cos", "Cos", a), ("softplus", "Softplus", a)):
        out = F[fn].impl(arg)
        assert out.dtype == np.float32, fn
        close(out, run_onnx(op, [arg]))
    close(F["hard_sigmoid"].impl(a, 0.2, 0.5), run_onnx("HardSigmoid", [a], alpha=0.2, beta=0.5))
    if broadcast_shape(a.shape, b.shape) is not None:
        close(F["pow"].impl(pos, b), run_onnx("Pow", [pos, b]))
        close(F["min"].impl(a, b), run_onnx("Min", [a, b]))
        close(F["max"].impl(a, b), run_onnx("Max", [a, b]))
    # A literal takes the constant's dtype.
    assert F["pow"].impl(pos, 2).dtype == np.float32 and F["max"].impl(np.arange(3), 1).dtype == np.int64


def test_comparisons_with_a_constant_compare_every_element_in_its_dtype():
    gelu = np.array([0.044715], np.float32)
    assert G["=="].impl(gelu, 0.044715) and G["all_equal"].impl(gelu, 0.044715)
    assert not G["=="].impl(gelu.astype(np.float64), 0.044715 + 1e-9)
    assert G["<"].impl(np.array([1, 2], np.int64), 3) and not G["<"].impl(np.array([1, 3]), 3)
    assert G[">="].impl(3, np.array([[1], [3]])) and G["!="].impl(np.array([1, 2]), 0)
    assert G["=="].impl(np.full((2, 3), 6.0, np.float32), np.float32(6))       # broadcast
    assert not G["=="].impl(np.array([1, 2]), np.array([1, 2, 3]))             # shapes that do not broadcast
    assert not G["=="].impl(np.zeros((0,), np.float32), 0) and not G["all_equal"].impl(np.zeros((2, 0)), 0)
    assert G["all_equal"].impl(np.array([2, 2]), np.array([2])) and not G["all_equal"].impl(np.array([2, 3]), 2)
    # Against a list a constant still reads as a list (a shape compared with [1, 2]).
    assert G["=="].impl(np.array([1, 2]), (1, 2))


def test_computed_attributes_take_the_attribute_type():
    from saturate.lang.builtins import to_attribute
    from saturate.ops.schema import attribute_type

    assert [attribute_type("HardSigmoid", "alpha"), attribute_type("Gather", "axis"),
            attribute_type("Transpose", "perm"), attribute_type("Conv", "auto_pad"),
            attribute_type("MyOp", "alpha")] == ["FLOAT", "INT", "INTS", "STRING", None]
    assert to_attribute("FLOAT", np.array([[0.2]], np.float32)) == float(np.float32(0.2))
    assert to_attribute("INT", np.array(3.0)) == 3 and type(to_attribute("INT", np.int64(3))) is int
    assert to_attribute("INTS", (2, 0, 1)) == [2, 0, 1] and to_attribute("INTS", np.array(4)) == [4]
    assert to_attribute(None, (1, 2)) == (1, 2)
    for kind, bad in (("FLOAT", np.ones(2)), ("INT", 0.5), ("INT", np.array([np.inf])), ("INTS", np.ones((2, 2))),
                      ("FLOAT", "x"), ("STRING", 1), ("INT", 2.0**70)):
        with pytest.raises(ValueError):
            to_attribute(kind, bad)


def test_pow_keeps_the_base_dtype_as_onnx_does():
    base = np.array([1.5, 2.0, 4.0], np.float32)
    out = F["pow"].impl(base, np.array([2, -1, 0], np.int64))
    assert out.dtype == np.float32
    close(out, run_onnx("Pow", [base, np.array([2, -1, 0], np.int64)]))
    assert F["pow"].impl(np.array([2, 3], np.int64), 2).dtype == np.int64


def test_integer_division_is_exact_and_truncates():
    # Through float64 a quotient past 2**53 is rounded: INT64_MAX / 1 came back as INT64_MIN.
    a = np.array([np.iinfo(np.int64).max, -7, 7, -7, 7], np.int64)
    b = np.array([1, 2, -2, -2, 2], np.int64)
    assert builtins._div(a, b).tolist() == [np.iinfo(np.int64).max, -3, -3, 3, 3]


def test_reshape_targets_of_empty_tensors_say_zero_only_where_the_input_has_it():
    # A 0 in a Reshape target copies the input's dim: (1, 0) squeezed at 0 is not Reshape(x, [0]).
    assert query_builtins._target((1, 0), (0,)) is None
    assert query_builtins._target((0, 3), (0, 1, 3)).tolist() == [0, 1, 3]


def test_precedes_orders_weights_by_their_first_row():
    # A row is contiguous: a mapped weight is read one page, where a column read every row's.
    from saturate.lang.guard_builtins import precedes

    a = np.array([[0.0, 5.0], [9.0, 9.0]])      # by first columns, b would come first
    b = np.array([[0.0, 6.0], [-9.0, -9.0]])
    assert precedes(a, b) and not precedes(b, a) and not precedes(a, a)


def test_cast_follows_onnx_where_astype_does_not():
    """astype does not saturate: a float8 Cast of 1e6 is 448 with saturate=1, NaN without."""
    big = np.array([1e6, -1e6, 0.5], np.float32)
    got = F["cast_saturate"].impl(big, TensorProto.FLOAT8E4M3FN, 1).astype(np.float32)
    assert got.tolist() == [448.0, -448.0, 0.5]
    assert np.isnan(F["cast_saturate"].impl(big, TensorProto.FLOAT8E4M3FN, 0).astype(np.float32)[:2]).all()
    assert F["cast"].impl(big, TensorProto.FLOAT8E4M3FN).astype(np.float32).tolist() == [448.0, -448.0, 0.5]
    assert F["cast"].impl(np.array([1.5], np.float32), TensorProto.INT64).tolist() == [1]
    with pytest.raises(ValueError, match="round_mode"):
        F["cast"].impl(big, TensorProto.FLOAT8E8M0)


def test_numpy_int_holds_for_numpy_integer_types_only():
    import ml_dtypes

    assert G["numpy_int"].impl("int8") and G["numpy_int"].impl("uint16") and G["numpy_int"].impl("int32")
    for dtype in ("float32", "bool", None, ml_dtypes.int4, ml_dtypes.float8_e4m3fn):
        assert not G["numpy_int"].impl(dtype), dtype
