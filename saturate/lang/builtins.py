"""Rule builtins: the constant functions, int queries and guards a rule may name, as numpy code.

Calling convention (what the engine, the folder and the checker pass to an `impl`):

- a parameter of kind "const" gets an `np.ndarray` (a Python int/float for a literal or a numeric
  attribute is accepted too and treated as a float32 scalar);
- "int" gets a Python int; "ints" gets a tuple of ints (a list or an integer ndarray is accepted);
  either may be None for an attribute the node omits and ONNX gives no fixed default (perm);
- "isconst" gets whether the value is a constant (or a constant expression);
- "stored" gets whether the value is a constant the model stores (not one computed by a rule);
- "type" (queries) gets the value's dtype name ("float32", "int64"), None when unknown;
- "value" (queries and shape guards) gets the value's static shape as a tuple whose dims are ints,
  or symbolic names / None when unknown. Shape guards answer False when unknown dims leave the
  answer open, so an undecided guard never fires a rule; `numel` of a symbolic shape is None;
- "dims" (queries) gets the value's shape with every dim an int or a symbol: the dims the engine
  cannot tell are symbols equal only where they are the same dim (the batch, read twice);
- "data" (queries) gets the elements of a small integer value (a shape being computed) as such
  dims: Reshape(x, Concat(Gather(Shape(x), 0), [64])) has target data (x's dim 0, 64);
- "any" (comparisons) gets an int, float, string or tuple of ints.

Guards with `needs_values=True` read constant data (positive, ones...); the others decide from
static shapes and ints alone, so the engine can decide them from the facts it keeps for every value.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from saturate.core.limits import check_allocation
from saturate.lang.builtin_kinds import ConstFn
from saturate.lang.quant_builtins import QUANT_FUNCS


# ---- helpers ----------------------------------------------------------------------------------

def _is_array(a: Any) -> bool:
    return isinstance(a, (np.ndarray, np.generic))


def as_ints(v: Any) -> tuple[int, ...] | None:
    """An "ints" argument as a tuple of Python ints (None stays None)."""
    if v is None:
        return None
    return tuple(int(x) for x in np.asarray(v).ravel())


def _special():
    """scipy.special, imported on first use: it costs 0.2 s, paid only by rules that need it."""
    from scipy import special

    return special


def fits(fn: str, shape: Any, dtype: Any) -> None:
    """Refuse a constant expression's result over --max-memory before it is allocated: one line
    (a SaturateError) naming the function, the result's type and its size."""
    dims = [int(d) for d in shape]
    check_allocation(dims, np.dtype(dtype).itemsize, f"constant expression {fn}: {np.dtype(dtype).name}{dims}")


def _matmul_shape(a: Any, b: Any) -> tuple[int, ...] | None:
    """The shape np.matmul gives two arrays of rank 2 or more (None for others: numpy decides)."""
    sa, sb = np.shape(a), np.shape(b)
    if len(sa) < 2 or len(sb) < 2:
        return None
    try:
        return (*np.broadcast_shapes(sa[:-2], sb[:-2]), sa[-2], sb[-1])
    except ValueError:
        return None


def _elementwise(fn: Callable[..., Any]) -> Callable[..., np.ndarray]:
    """Wrap a numpy function: the result takes the dtype of the array inputs (float32 by default)."""

    def impl(*args: Any) -> np.ndarray:
        arrays = [a for a in args if _is_array(a)]
        dtype = np.result_type(*arrays) if arrays else np.dtype(np.float32)
        # Broadcasting [n, 1] against [1, n] makes n * n elements out of 2n.
        try:
            shape = np.broadcast_shapes(*(np.shape(a) for a in args))
        except ValueError:  # not elementwise (matmul) or not broadcastable: numpy says why
            shape = _matmul_shape(*args[:2]) if fn is np.matmul else None
        if shape is not None:
            fits(getattr(fn, "__name__", "elementwise"), shape, dtype)
        out = fn(*(np.asarray(a, dtype) if not _is_array(a) else a for a in args))
        return np.asarray(out).astype(dtype, copy=False)

    impl.__name__ = getattr(fn, "__name__", "elementwise")
    return impl


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # ONNX integer division truncates toward zero; numpy's // floors.
    if np.issubdtype(np.result_type(a, b), np.integer):
        # Exactly, in the integers: through float64 a quotient past 2**53 is rounded.
        a, b = np.asarray(a), np.asarray(b)
        with np.errstate(divide="ignore", over="ignore"):
            q, r = np.divmod(a, b)
        return q + ((r != 0) & ((a < 0) != (b < 0))).astype(q.dtype)
    return np.true_divide(a, b)


# ---- shaping ------------------------------------------------------------------------------------

def per_axis(c: Any, axis: int, rank: int) -> np.ndarray:
    """A scalar, or a constant varying along one axis, laid out on `axis` of a rank-`rank` shape."""
    v = vec(c)
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank:
        raise ValueError(f"per_axis: axis {axis} outside rank {rank}")
    shape = [1] * rank
    shape[axis] = v.shape[0]
    return v.reshape(shape)


def vec(c: Any) -> np.ndarray:
    """The values of `c` along its one non-1 axis as a 1-D array; a scalar gives shape (1,)."""
    a = np.asarray(c, np.float32) if not _is_array(c) else np.asarray(c)
    varying = [d for d in a.shape if d != 1]
    if len(varying) > 1:
        raise ValueError(f"vec: shape {a.shape} varies along more than one axis")
    return a.reshape(-1)


def broadcast_vec(c: Any, n: int) -> np.ndarray:
    """vec(c) repeated to length n when it has one element (a scalar becomes n equal values)."""
    v = vec(c)
    fits("broadcast_vec", (n,), v.dtype)
    return np.broadcast_to(v, (n,)).copy()


def reshape(c: Any, shape: Any) -> np.ndarray:
    """ONNX Reshape (allowzero=0): 0 copies the input's dim, -1 is inferred."""
    a = np.asarray(c)
    dims = list(as_ints(shape) or ())
    dims = [a.shape[i] if d == 0 and i < a.ndim else d for i, d in enumerate(dims)]
    return a.reshape(dims)


def unsqueeze(c: Any, axes: Any) -> np.ndarray:
    """ONNX Unsqueeze: insert 1-dims at `axes` of the output (negative axes count from the end)."""
    a = np.asarray(c)
    ax = as_ints(axes) or ()
    rank = a.ndim + len(ax)
    return np.expand_dims(a, tuple(sorted(x + rank if x < 0 else x for x in ax)))


def expand(c: Any, shape: Any) -> np.ndarray:
    """ONNX Expand: broadcast `c` and `shape` together (never shrinks a dim of `c`)."""
    a = np.asarray(c)
    target = np.broadcast_shapes(a.shape, as_ints(shape) or ())
    fits("expand", target, a.dtype)
    return np.broadcast_to(a, target).copy()


def transpose(c: Any, perm: Any) -> np.ndarray:
    """ONNX Transpose; a missing perm (None) reverses the axes."""
    return np.array(np.transpose(np.asarray(c), as_ints(perm)), order="C")   # 0-d stays 0-d


def inverse_perm(p: Any, rank: int) -> tuple[int, ...]:
    """The perm undoing Transpose by `p` (None = reversed axes) on a rank-`rank` value."""
    p = as_ints(p) or tuple(range(rank - 1, -1, -1))
    if sorted(p) != list(range(rank)):
        raise ValueError(f"inverse_perm: {p} is not a permutation of {rank} axes")
    inv = [0] * rank
    for i, a in enumerate(p):
        inv[a] = i
    return tuple(inv)


def align_rank(c: Any, rank: int) -> np.ndarray:
    """`c` with 1-dims prepended up to `rank` dims, as broadcasting against a rank-`rank` value reads it."""
    a = np.asarray(c, np.float32) if not _is_array(c) else np.asarray(c)
    if a.ndim > rank:
        raise ValueError(f"align_rank: rank {a.ndim} above {rank}")
    return a.reshape((1,) * (rank - a.ndim) + a.shape)


def compose_perm(p: Any, q: Any, rank: int) -> tuple[int, ...]:
    """The perm of Transpose(Transpose(x, p), q) as one Transpose of x (None = reversed axes)."""
    p = as_ints(p) or tuple(range(rank - 1, -1, -1))
    q = as_ints(q) or tuple(range(rank - 1, -1, -1))
    return tuple(p[i] for i in q)


def squeeze(c: Any, axes: Any) -> np.ndarray:
    """ONNX Squeeze: drop the 1-dims at `axes` (None: every 1-dim); a non-1 dim is an error."""
    a = np.asarray(c)
    if axes is None:
        return a.reshape([d for d in a.shape if d != 1])
    ax = tuple(sorted(x + a.ndim if x < 0 else x for x in as_ints(axes)))
    return np.squeeze(a, axis=ax) if ax else a.copy()


def gather(c: Any, indices: Any, axis: int) -> np.ndarray:
    """ONNX Gather: take `indices` (negative ones count from the end) along `axis`."""
    a, idx = np.asarray(c), np.asarray(indices)
    axis = 0 if axis is None else (axis + a.ndim if axis < 0 else axis)
    if not 0 <= axis < a.ndim or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError("gather: bad axis or non-integer indices")
    n = a.shape[axis]
    if np.any((idx < -n) | (idx >= n)):
        raise ValueError("gather: index out of range")
    fits("gather", (*a.shape[:axis], *idx.shape, *a.shape[axis + 1:]), a.dtype)
    return np.take(a, np.where(idx < 0, idx + n, idx), axis=axis)


def concat(a: Any, b: Any, axis: int) -> np.ndarray:
    """ONNX Concat of two constants along `axis` (a longer Concat folds as a chain of these)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype:
        raise ValueError("concat: inputs differ in dtype")
    return np.concatenate([a, b], axis=axis)


def plain_cast_types(dtype: Any, to: int) -> tuple[np.dtype, np.dtype] | None:
    """(from, to) numpy dtypes when both are numpy's own bool, integer or float types, else None."""
    from onnx.helper import tensor_dtype_to_np_dtype

    try:
        pair = np.dtype(dtype), np.dtype(tensor_dtype_to_np_dtype(int(to)))
    except (TypeError, KeyError, ValueError):
        return None
    from saturate.core.ir import numpy_native

    return pair if all(numpy_native(d) for d in pair) else None


def cast(c: Any, to: int, saturate: int | None = 1) -> np.ndarray:
    """ONNX Cast to the tensor type numbered `to` (onnx.TensorProto), with Cast's `saturate`
    (float8 targets; None, an opset without it, reads as 1). Between numpy's own types, astype; to
    and from float8, bfloat16, int4, float4 and strings, ONNX's rules (saturation, rounding, number
    formatting) as onnx.reference computes them. float8e8m0 rounds by a `round_mode` a rule cannot
    pass here, so that cast refuses."""
    from onnx import TensorProto

    a = np.asarray(c)
    pair = plain_cast_types(a.dtype, to)
    if pair is not None:
        return a.astype(pair[1])
    if int(to) == getattr(TensorProto, "FLOAT8E8M0", -1) or a.dtype.kind == "V" and "e8m0" in a.dtype.name:
        raise ValueError("cast: float8e8m0 rounds by a round_mode the rule does not give")
    from onnx.reference.ops.op_cast import cast_to

    try:
        return np.asarray(cast_to(a, int(to), bool(1 if saturate is None else saturate)))
    except (TypeError, KeyError, RuntimeError, NotImplementedError) as err:
        raise ValueError(f"cast: {a.dtype} to ONNX type {to}: {err}") from None


def slice_(c: Any, starts: Any, ends: Any, axes: Any, steps: Any) -> np.ndarray:
    """ONNX Slice: per listed axis (default 0..k-1), starts/ends clamped as ONNX does (negative
    ones count from the end), steps default 1; axes or steps None or [] when the node omits them."""
    a = np.asarray(c)
    st, en = as_ints(starts), as_ints(ends)
    # An omitted axes or steps input arrives as None, or as [] from a rule that spells it so.
    ax = as_ints(axes) or tuple(range(len(st)))
    sp = as_ints(steps) or (1,) * len(st)
    if not len(st) == len(en) == len(ax) == len(sp) or len(set(ax)) != len(ax):
        raise ValueError("slice: starts, ends, axes and steps differ in length")
    index = [slice(None)] * a.ndim
    for s, e, x, k in zip(st, en, ax, sp):
        if not -a.ndim <= x < a.ndim or k == 0:
            raise ValueError("slice: bad axis or zero step")
        # Python slices clamp the same way ONNX does, INT64 sentinels included.
        index[x % a.ndim] = slice(s, e, k)
    return a[tuple(index)].copy()


def slice_along(c: Any, axis: int, rank: int, start: int, stop: int) -> np.ndarray:
    """The part [start:stop] along `axis` of a constant broadcast against a rank-`rank` value
    (aligned right), stop -1 meaning to the end; a constant of size 1 there applies to every
    part, and is returned as is."""
    a = np.asarray(c)
    axis = axis + rank if axis < 0 else axis
    local = axis - (rank - a.ndim)
    if not 0 <= axis < rank or a.ndim > rank:
        raise ValueError("slice_along: axis outside the rank")
    if local < 0 or a.shape[local] == 1:
        return a
    index = [slice(None)] * a.ndim
    index[local] = slice(start, None if stop == -1 else stop)
    return a[tuple(index)].copy()


def constant_of_shape(shape: Any, value: Any) -> np.ndarray:
    """ONNX ConstantOfShape: `shape` filled with the one element of `value` (float32 0 if omitted)."""
    v = np.zeros(1, np.float32) if value is None else np.asarray(value)
    if v.size != 1:
        raise ValueError("constant_of_shape: value must hold one element")
    dims = as_ints(shape)
    if any(d < 0 for d in dims):
        raise ValueError("constant_of_shape: negative dim")
    fits("constant_of_shape", dims, v.dtype)
    return np.full(dims, v.reshape(()), v.dtype)


def range_(start: Any, limit: Any, delta: Any) -> np.ndarray:
    """ONNX Range: start, start + delta, ... before limit, in the dtype of `start`."""
    s, l, d = (np.asarray(x).reshape(()) for x in (start, limit, delta))
    if d == 0:
        raise ValueError("range: zero delta")
    n = max(int(np.ceil((l - s) / d)), 0)
    fits("range", (n,), np.result_type(s, d))
    return (s + np.arange(n, dtype=np.result_type(s, d)) * d).astype(s.dtype)


def mod(a: Any, b: Any, fmod: int) -> np.ndarray:
    """ONNX Mod: the sign of the divisor (fmod=0, integers), or of the dividend (fmod=1, C fmod)."""
    a, b = np.asarray(a), np.asarray(b)
    if not fmod and np.issubdtype(np.result_type(a, b), np.integer):
        with np.errstate(all="ignore"):   # x mod 0 is undefined in ONNX; numpy (and onnx.reference) give 0
            return np.mod(a, b)
    if not fmod:
        raise ValueError("mod: fmod=0 is for integers")
    return np.fmod(a, b)


def pad_kernel(w: Any, like: Any) -> np.ndarray:
    """Conv weights `w` zero-padded on every spatial axis, centred, to the spatial size of `like`
    (a kernel k grows by (K - k) / 2 on each side, so the sizes must differ by an even number)."""
    a, b = np.asarray(w), np.asarray(like)
    if a.ndim != b.ndim or a.ndim < 3:
        raise ValueError("pad_kernel: ranks differ")
    grow = [(0, 0), (0, 0)]
    for k, big in zip(a.shape[2:], b.shape[2:]):
        if big < k or (big - k) % 2:
            raise ValueError("pad_kernel: kernel cannot be centred")
        grow.append(((big - k) // 2, (big - k) // 2))
    fits("pad_kernel", (*a.shape[:2], *b.shape[2:]), a.dtype)
    return np.pad(a, grow)


def identity_kernel(w: Any, s: Any) -> np.ndarray:
    """Conv weights of w's shape whose conv is x * s (s per channel, or a scalar), for a conv whose
    output channels are its input channels: output channel o reads input channel o, which is
    channel o mod (input channels per group) of its group, at the centre tap of an odd kernel."""
    a = np.asarray(w)
    cout, per_group = a.shape[0], a.shape[1]
    if any(k % 2 == 0 for k in a.shape[2:]):
        raise ValueError("identity_kernel: even kernel has no centre")
    scale = broadcast_vec(s, cout)
    out = np.zeros(a.shape, np.result_type(a, scale))
    centre = tuple(k // 2 for k in a.shape[2:])
    for o in range(cout):
        out[(o, o % per_group) + centre] = scale[o]
    return out


def flatten(c: Any, axis: int) -> np.ndarray:
    """ONNX Flatten: a 2-D array split before `axis`."""
    a = np.asarray(c)
    axis = 1 if axis is None else (axis + a.ndim if axis < 0 else axis)
    return a.reshape(int(np.prod(a.shape[:axis], dtype=np.int64)), -1)


# ---- other constant folds ------------------------------------------------------------------------

def batch_normalize(x: Any, scale: Any, bias: Any, eps: Any) -> np.ndarray:
    """ONNX BatchNormalization in training mode: x normalized by its own mean and (population)
    variance over every axis but 1, then times scale and plus bias per channel (axis 1)."""
    a = np.asarray(x)
    if a.ndim < 2 or not np.issubdtype(a.dtype, np.floating):
        raise ValueError("batch_normalize: x must be a float tensor of rank 2 or more")
    shape = (1, a.shape[1]) + (1,) * (a.ndim - 2)
    if np.size(scale) != a.shape[1] or np.size(bias) != a.shape[1]:
        raise ValueError("batch_normalize: scale and bias need one value per channel")
    axes = (0, *range(2, a.ndim))
    wide = a.astype(np.float64)
    mean, var = wide.mean(axis=axes, keepdims=True), wide.var(axis=axes, keepdims=True)
    y = (wide - mean) / np.sqrt(var + float(np.asarray(eps).reshape(()))) * np.reshape(scale, shape) \
        + np.reshape(bias, shape)
    return y.astype(a.dtype)


def _softmax(c: Any, axis: Any) -> np.ndarray:
    a = np.asarray(c, np.float32) if not _is_array(c) else c
    axis = -1 if axis is None else int(axis)
    e = np.exp(a - np.max(a, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _pow(a: Any, b: Any) -> np.ndarray:
    """a ** b in a's dtype, as ONNX Pow (its exponent may have another type)."""
    base = np.asarray(a, np.float32) if not _is_array(a) else np.asarray(a)
    exponent = np.asarray(b, base.dtype) if not _is_array(b) else np.asarray(b)
    return np.asarray(np.power(base, exponent)).astype(base.dtype)


def _gemm(a, b, c, alpha, beta, trans_a, trans_b):
    a = a.T if trans_a else a
    b = b.T if trans_b else b
    shape = _matmul_shape(a, b)
    if shape is not None:
        fits("gemm", shape, np.result_type(a, b))
    return alpha * (a @ b) + beta * c


def _const(fn: Callable[..., Any], params: str, doc: str, broadcasts: bool = False) -> ConstFn:
    """Tensor-in, tensor-out function; `params` spells kinds: c=const i=int s=ints."""
    kinds = tuple({"c": "const", "i": "int", "s": "ints"}[k] for k in params)
    return ConstFn(len(kinds), fn, doc, kinds, broadcasts=broadcasts)


def _pointwise(fn: Callable[..., Any], params: str, doc: str) -> ConstFn:
    """An elementwise numpy function over broadcast arguments (see ConstFn.broadcasts)."""
    return _const(_elementwise(fn), params, doc, broadcasts=True)


CONST_FUNCS: dict[str, ConstFn] = {
    "add": _pointwise(np.add, "cc", "a + b (numpy broadcasting)"),
    "sub": _pointwise(np.subtract, "cc", "a - b"),
    "mul": _pointwise(np.multiply, "cc", "a * b"),
    "div": _pointwise(_div, "cc", "a / b (integers truncate, as ONNX Div)"),
    "neg": _pointwise(np.negative, "c", "-c"),
    "sqrt": _pointwise(np.sqrt, "c", "square root"),
    "rsqrt": _pointwise(lambda a: 1 / np.sqrt(a), "c", "1 / sqrt(c)"),
    "reciprocal": _pointwise(lambda a: 1 / a, "c", "1 / c"),
    "relu": _pointwise(lambda a: np.maximum(a, 0), "c", "max(c, 0)"),
    "sigmoid": _pointwise(lambda x: _special().expit(x), "c", "logistic sigmoid"),
    "tanh": _pointwise(np.tanh, "c", "hyperbolic tangent"),
    "erf": _pointwise(lambda x: _special().erf(x), "c", "error function"),
    "exp": _pointwise(np.exp, "c", "e ** c"),
    "log": _pointwise(np.log, "c", "natural logarithm"),
    "pow": _const(_pow, "cc", _pow.__doc__),
    "min": _pointwise(np.minimum, "cc", "elementwise minimum"),
    "max": _pointwise(np.maximum, "cc", "elementwise maximum"),
    "abs": _pointwise(np.abs, "c", "absolute value"),
    "sign": _pointwise(np.sign, "c", "-1, 0 or 1"),
    "floor": _pointwise(np.floor, "c", "round down"),
    "ceil": _pointwise(np.ceil, "c", "round up"),
    "round": _pointwise(np.round, "c", "round half to even (ONNX Round)"),
    "sin": _pointwise(np.sin, "c", "sine"),
    "cos": _pointwise(np.cos, "c", "cosine"),
    "softplus": _pointwise(lambda a: np.logaddexp(a, 0), "c", "log(1 + e ** c)"),
    "hard_sigmoid": _const(_elementwise(lambda a, alpha, beta: np.clip(alpha * a + beta, 0, 1)), "ccc",
                           "max(0, min(1, alpha * c + beta)) (ONNX HardSigmoid)"),
    "leaky_relu": _const(_elementwise(lambda a, alpha: np.where(a >= 0, a, alpha * a)), "cc",
                         "c where c >= 0, alpha * c elsewhere"),
    "clip": _const(_elementwise(np.clip), "ccc", "clip(c, lo, hi)"),
    "matmul": _const(_elementwise(np.matmul), "cc", "matrix product (numpy matmul)"),
    "gemm": _const(_elementwise(_gemm), "ccccccc",
                   "gemm(a, b, c, alpha, beta, transA, transB) = alpha*A'B' + beta*c"),
    "softmax": _const(_softmax, "ci", "softmax of c along axis"),
    "batch_normalize": _const(batch_normalize, "cccc", batch_normalize.__doc__),
    "per_axis": _const(per_axis, "cii", per_axis.__doc__),
    "vec": _const(vec, "c", vec.__doc__),
    "broadcast_vec": _const(broadcast_vec, "ci", broadcast_vec.__doc__),
    "reshape": _const(reshape, "cs", reshape.__doc__),
    "unsqueeze": _const(unsqueeze, "cs", unsqueeze.__doc__),
    "expand": _const(expand, "cs", expand.__doc__),
    "transpose": _const(transpose, "cs", transpose.__doc__),
    "flatten": _const(flatten, "ci", flatten.__doc__),
    "squeeze": _const(squeeze, "cs", squeeze.__doc__),
    "gather": _const(gather, "cci", gather.__doc__),
    "concat": _const(concat, "cci", concat.__doc__),
    "cast": _const(cast, "ci", cast.__doc__),
    "cast_saturate": _const(cast, "cii", "cast(c, to) with Cast's saturate attribute (1 saturates a float8 target)"),
    "slice": _const(slice_, "cssss", slice_.__doc__),
    "mod": _const(mod, "cci", mod.__doc__),
    "slice_along": _const(slice_along, "ciiii", slice_along.__doc__),
    "constant_of_shape": _const(constant_of_shape, "sc", constant_of_shape.__doc__),
    "range": _const(range_, "ccc", range_.__doc__),
    "pad_kernel": _const(pad_kernel, "cc", pad_kernel.__doc__),
    "identity_kernel": _const(identity_kernel, "cc", identity_kernel.__doc__),
    "compose_perm": ConstFn(3, compose_perm, compose_perm.__doc__, ("ints", "ints", "int"), "ints"),
    "inverse_perm": ConstFn(2, inverse_perm, inverse_perm.__doc__, ("ints", "int"), "ints"),
    "align_rank": _const(align_rank, "ci", align_rank.__doc__),
}

# Functions over the list a variadic pattern binds (`Concat(xs...)`). They are spelled out when
# a rule is instantiated for a number of inputs (saturate.lang.variadic), never called.
LIST_FUNCS: dict[str, str] = {
    "count": "count(xs): the number of elements of the list xs",
    "sum": "sum(e): e summed over the elements of the list it names (ints or constants)",
    "sum_before": "sum_before(e): e summed over the elements before the current one (0 for the "
                  "first); only where the list's name reads as one element",
}

# The infix operators of constant expressions and the functions they stand for.
INFIX: dict[str, str] = {"+": "add", "-": "sub", "*": "mul", "/": "div"}



# ---- computed attributes -------------------------------------------------------------------------

# The kinds of value that may become an attribute of each type, as the load-time checks see them.
ATTRIBUTE_KINDS = {"FLOAT": {"const", "int", "num"}, "INT": {"const", "int", "num"},
                   "FLOATS": {"const", "ints", "int", "num"}, "INTS": {"const", "ints", "int", "num"},
                   "STRING": {"str"}, "TENSOR": {"const", "int", "num"}}


def to_attribute(kind: str | None, value: Any) -> Any:
    """A computed value as an attribute of ONNX type `kind` (see attribute_type): FLOAT and INT
    from one element (an INT only from a whole number), INTS and FLOATS from a list of at most
    one axis, TENSOR as an array; ValueError when it cannot be one, so the rule does not fire.
    An attribute of an op ONNX does not define (kind None) keeps the value as computed."""
    if kind is None or value is None:
        return value
    if kind == "STRING":
        if not isinstance(value, str):
            raise ValueError("a string attribute needs a string")
        return value
    if isinstance(value, str):
        raise ValueError(f"a string cannot be a {kind} attribute")
    a = np.asarray(value)
    if kind == "TENSOR":
        return a
    if a.dtype.kind not in "biuf":
        raise ValueError(f"a {a.dtype} value cannot be a {kind} attribute")
    if kind in ("INTS", "FLOATS"):
        if a.ndim > 1:
            raise ValueError(f"a {kind} attribute needs a list, not shape {a.shape}")
        a = a.reshape(-1)
    elif a.size != 1:
        raise ValueError(f"a {kind} attribute needs one element, not {a.size}")
    if not np.all(np.isfinite(a.astype(np.float64))):
        raise ValueError("an attribute must be finite")
    if kind in ("INT", "INTS"):
        if a.dtype.kind == "f" and not np.all(a == np.round(a)):
            raise ValueError(f"{value!r} is not a whole number")
        if np.any(np.abs(a.astype(np.float64)) >= 2.0**63):
            raise ValueError("an INT attribute holds 64 bits")
        ints = [int(x) for x in a.ravel()]
        return ints if kind == "INTS" else ints[0]
    floats = [float(np.float32(x)) for x in a.ravel()]   # attributes hold float32
    return floats if kind == "FLOATS" else floats[0]


# Quantization (rules/quant.rules): defined beside the interpreter's QuantizeLinear.
CONST_FUNCS.update(QUANT_FUNCS)
