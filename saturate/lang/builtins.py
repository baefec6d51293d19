"""Rule builtins: the constant functions, int queries and guards a rule may name, as numpy code.

Calling convention (what the engine, the folder and the checker pass to an `impl`):

- a parameter of kind "const" gets an `np.ndarray` (a Python int/float for a literal or a numeric
  attribute is accepted too and treated as a float32 scalar);
- "int" gets a Python int; "ints" gets a tuple of ints (a list or an integer ndarray is accepted);
  either may be None for an attribute the node omits and ONNX gives no fixed default (perm);
- "value" (queries and shape guards) gets the value's static shape as a tuple whose dims are ints,
  or symbolic names / None when unknown. Shape guards answer False when unknown dims leave the
  answer open, so an undecided guard never fires a rule; `numel` of a symbolic shape is None;
- "any" (comparisons) gets an int, float, string or tuple of ints.

Guards with `needs_values=True` read constant data (positive, ones...); the others decide from
static shapes and ints alone, so the engine can decide them from the facts it keeps for every value.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

Shape = tuple[Any, ...]


@dataclass(frozen=True)
class ConstFn:
    """A constant-expression function: `params` are argument kinds, `returns` the result kind."""

    arity: int
    impl: Callable[..., Any]
    doc: str
    params: tuple[str, ...]
    returns: str = "const"  # "const" (ndarray) | "int" | "ints"


@dataclass(frozen=True)
class QueryFn:
    """An int-valued function of a value's static shape (first parameter, kind "value")."""

    arity: int
    impl: Callable[..., Any]
    doc: str
    params: tuple[str, ...]
    returns: str = "int"


@dataclass(frozen=True)
class GuardFn:
    """A named guard or comparison; `needs_values` tells shape guards from value guards."""

    arity: int
    impl: Callable[..., bool]
    doc: str
    needs_values: bool
    params: tuple[str, ...]
    # A termination guard only stops rules from feeding on their own output (x * 1 = x would let
    # Mul(Mul(x, 1), b) rebuild b * 1 forever). It never decides soundness, so an engine that
    # cannot decide it may answer True.
    termination: bool = False


# ---- helpers ----------------------------------------------------------------------------------

def _is_array(a: Any) -> bool:
    return isinstance(a, (np.ndarray, np.generic))


def _ints(v: Any) -> tuple[int, ...] | None:
    """An "ints" argument as a tuple of Python ints (None stays None)."""
    if v is None:
        return None
    return tuple(int(x) for x in np.asarray(v).ravel())


def broadcast_shape(a: Shape, b: Shape) -> Shape | None:
    """The numpy broadcast of two static shapes, or None when they do not (or may not) broadcast."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        da = a[-i] if i <= len(a) else 1
        db = b[-i] if i <= len(b) else 1
        if da == 1:
            out.append(db)
        elif db == 1 or (da == db and da is not None):
            out.append(da)
        else:
            return None
    return tuple(reversed(out))


def _special():
    """scipy.special, imported on first use: it costs 0.2 s, paid only by rules that need it."""
    from scipy import special

    return special


def _elementwise(fn: Callable[..., Any]) -> Callable[..., np.ndarray]:
    """Wrap a numpy function: the result takes the dtype of the array inputs (float32 by default)."""

    def impl(*args: Any) -> np.ndarray:
        arrays = [a for a in args if _is_array(a)]
        dtype = np.result_type(*arrays) if arrays else np.dtype(np.float32)
        out = fn(*(np.asarray(a, dtype) if not _is_array(a) else a for a in args))
        return np.asarray(out).astype(dtype, copy=False)

    impl.__name__ = getattr(fn, "__name__", "elementwise")
    return impl


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # ONNX integer division truncates toward zero; numpy's // floors.
    if np.issubdtype(np.result_type(a, b), np.integer):
        return np.trunc(np.true_divide(a, b))
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
    return np.broadcast_to(v, (n,)).copy()


def reshape(c: Any, shape: Any) -> np.ndarray:
    """ONNX Reshape (allowzero=0): 0 copies the input's dim, -1 is inferred."""
    a = np.asarray(c)
    dims = list(_ints(shape) or ())
    dims = [a.shape[i] if d == 0 and i < a.ndim else d for i, d in enumerate(dims)]
    return a.reshape(dims)


def unsqueeze(c: Any, axes: Any) -> np.ndarray:
    """ONNX Unsqueeze: insert 1-dims at `axes` of the output (negative axes count from the end)."""
    a = np.asarray(c)
    ax = _ints(axes) or ()
    rank = a.ndim + len(ax)
    return np.expand_dims(a, tuple(sorted(x + rank if x < 0 else x for x in ax)))


def expand(c: Any, shape: Any) -> np.ndarray:
    """ONNX Expand: broadcast `c` and `shape` together (never shrinks a dim of `c`)."""
    a = np.asarray(c)
    target = np.broadcast_shapes(a.shape, _ints(shape) or ())
    return np.broadcast_to(a, target).copy()


def transpose(c: Any, perm: Any) -> np.ndarray:
    """ONNX Transpose; a missing perm (None) reverses the axes."""
    return np.ascontiguousarray(np.transpose(np.asarray(c), _ints(perm)))


def compose_perm(p: Any, q: Any, rank: int) -> tuple[int, ...]:
    """The perm of Transpose(Transpose(x, p), q) as one Transpose of x (None = reversed axes)."""
    p = _ints(p) or tuple(range(rank - 1, -1, -1))
    q = _ints(q) or tuple(range(rank - 1, -1, -1))
    return tuple(p[i] for i in q)


def squeeze(c: Any, axes: Any) -> np.ndarray:
    """ONNX Squeeze: drop the 1-dims at `axes` (None: every 1-dim); a non-1 dim is an error."""
    a = np.asarray(c)
    if axes is None:
        return a.reshape([d for d in a.shape if d != 1])
    ax = tuple(sorted(x + a.ndim if x < 0 else x for x in _ints(axes)))
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
    return np.take(a, np.where(idx < 0, idx + n, idx), axis=axis)


def concat(a: Any, b: Any, axis: int) -> np.ndarray:
    """ONNX Concat of two constants along `axis` (a longer Concat folds as a chain of these)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype:
        raise ValueError("concat: inputs differ in dtype")
    return np.concatenate([a, b], axis=axis)


def cast(c: Any, to: int) -> np.ndarray:
    """ONNX Cast to the tensor type numbered `to` (onnx.TensorProto)."""
    from onnx.helper import tensor_dtype_to_np_dtype

    return np.asarray(c).astype(tensor_dtype_to_np_dtype(int(to)))


def flatten(c: Any, axis: int) -> np.ndarray:
    """ONNX Flatten: a 2-D array split before `axis`."""
    a = np.asarray(c)
    axis = 1 if axis is None else (axis + a.ndim if axis < 0 else axis)
    return a.reshape(int(np.prod(a.shape[:axis], dtype=np.int64)), -1)


# ---- other constant folds ------------------------------------------------------------------------

def _softmax(c: Any, axis: Any) -> np.ndarray:
    a = np.asarray(c, np.float32) if not _is_array(c) else c
    axis = -1 if axis is None else int(axis)
    e = np.exp(a - np.max(a, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _gemm(a, b, c, alpha, beta, trans_a, trans_b):
    a = a.T if trans_a else a
    b = b.T if trans_b else b
    return alpha * (a @ b) + beta * c


def _const(fn: Callable[..., Any], params: str, doc: str) -> ConstFn:
    """Tensor-in, tensor-out function; `params` spells kinds: c=const i=int s=ints."""
    kinds = tuple({"c": "const", "i": "int", "s": "ints"}[k] for k in params)
    return ConstFn(len(kinds), fn, doc, kinds)


CONST_FUNCS: dict[str, ConstFn] = {
    "add": _const(_elementwise(np.add), "cc", "a + b (numpy broadcasting)"),
    "sub": _const(_elementwise(np.subtract), "cc", "a - b"),
    "mul": _const(_elementwise(np.multiply), "cc", "a * b"),
    "div": _const(_elementwise(_div), "cc", "a / b (integers truncate, as ONNX Div)"),
    "neg": _const(_elementwise(np.negative), "c", "-c"),
    "sqrt": _const(_elementwise(np.sqrt), "c", "square root"),
    "rsqrt": _const(_elementwise(lambda a: 1 / np.sqrt(a)), "c", "1 / sqrt(c)"),
    "reciprocal": _const(_elementwise(lambda a: 1 / a), "c", "1 / c"),
    "relu": _const(_elementwise(lambda a: np.maximum(a, 0)), "c", "max(c, 0)"),
    "sigmoid": _const(_elementwise(lambda x: _special().expit(x)), "c", "logistic sigmoid"),
    "tanh": _const(_elementwise(np.tanh), "c", "hyperbolic tangent"),
    "erf": _const(_elementwise(lambda x: _special().erf(x)), "c", "error function"),
    "leaky_relu": _const(_elementwise(lambda a, alpha: np.where(a >= 0, a, alpha * a)), "cc",
                         "c where c >= 0, alpha * c elsewhere"),
    "clip": _const(_elementwise(np.clip), "ccc", "clip(c, lo, hi)"),
    "matmul": _const(_elementwise(np.matmul), "cc", "matrix product (numpy matmul)"),
    "gemm": _const(_elementwise(_gemm), "ccccccc",
                   "gemm(a, b, c, alpha, beta, transA, transB) = alpha*A'B' + beta*c"),
    "softmax": _const(_softmax, "ci", "softmax of c along axis"),
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
    "compose_perm": ConstFn(3, compose_perm, compose_perm.__doc__, ("ints", "ints", "int"), "ints"),
}

# The infix operators of constant expressions and the functions they stand for.
INFIX: dict[str, str] = {"+": "add", "-": "sub", "*": "mul", "/": "div"}


# ---- queries --------------------------------------------------------------------------------------

def _dim(shape: Shape, k: int) -> Any:
    return shape[k] if -len(shape) <= k < len(shape) else None


def _numel(shape: Shape) -> int | None:
    return math.prod(shape) if all(isinstance(d, int) for d in shape) else None


def shape_of(shape: Shape, start: int | None, end: int | None) -> np.ndarray | None:
    """ONNX Shape of a value with static shape: its dims[start:end] as int64 (None if symbolic)."""
    part = tuple(shape)[start or 0:end]
    if not all(isinstance(d, (int, np.integer)) for d in part):
        return None
    return np.array([int(d) for d in part], np.int64)


def shape_at(shape: Shape, start: int | None, end: int | None, indices: Any) -> np.ndarray | None:
    """Gather(Shape(v){start, end}, indices): the picked dims as int64, None if one is symbolic
    (the others may be: a symbolic batch leaves the static dims readable)."""
    part = tuple(shape)[start or 0:end]
    idx = np.asarray(indices)
    if not np.issubdtype(idx.dtype, np.integer) or np.any((idx < -len(part)) | (idx >= len(part))):
        return None
    picked = [part[int(k)] for k in idx.ravel()]
    if not all(isinstance(d, (int, np.integer)) for d in picked):
        return None
    return np.array([int(d) for d in picked], np.int64).reshape(idx.shape)


QUERIES: dict[str, QueryFn] = {
    "rank": QueryFn(1, len, "number of dims of v", ("value",)),
    "dim": QueryFn(2, _dim, "size of dim k of v (negative k counts from the end)", ("value", "int")),
    "numel": QueryFn(1, _numel, "number of elements of v (None when a dim is symbolic)", ("value",)),
    "shape_of": QueryFn(3, shape_of, shape_of.__doc__, ("value", "int", "int"), "const"),
    "shape_at": QueryFn(4, shape_at, shape_at.__doc__, ("value", "int", "int", "const"), "const"),
}


# ---- guards ---------------------------------------------------------------------------------------

def static(shape: Shape) -> bool:
    """Every dim is a known int (no symbolic dim)."""
    return all(isinstance(d, (int, np.integer)) for d in shape)


def is_scalar(shape: Shape) -> bool:
    """Every dim is 1 (rank 0 included)."""
    return all(d == 1 for d in shape)


def varies_only_along(shape: Shape, axis: int, rank: int) -> bool:
    """Broadcast to `rank` dims (right-aligned), `shape` is 1 on every axis except maybe `axis`."""
    if len(shape) > rank:
        return False
    axis = axis + rank if axis < 0 else axis
    padded = (1,) * (rank - len(shape)) + tuple(shape)
    return 0 <= axis < rank and all(d == 1 for i, d in enumerate(padded) if i != axis)


def broadcastable(a: Shape, b: Shape) -> bool:
    """`a` and `b` broadcast together (numpy rules)."""
    return broadcast_shape(a, b) is not None


def same_shape(a: Shape, b: Shape) -> bool:
    """Same rank and the same dims (symbolic dims equal only to themselves)."""
    return len(a) == len(b) and all(x == y and x is not None for x, y in zip(a, b))


def broadcasts_into(c: Shape, x: Shape) -> bool:
    """Broadcasting `c` against `x` leaves `x`'s shape unchanged (c never grows x)."""
    out = broadcast_shape(c, x)
    return out is not None and same_shape(out, x)


def identity_perm(perm: Any, rank: int) -> bool:
    """`perm` (None = reversed axes) leaves a rank-`rank` value as it is."""
    p = _ints(perm) or tuple(range(rank - 1, -1, -1))
    return p == tuple(range(rank))


def _all(pred: Callable[[np.ndarray], np.ndarray]) -> Callable[[Any], bool]:
    return lambda c: bool(np.all(pred(np.asarray(c))))


def _cmp(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    """Comparisons of ints/floats/strings/int tuples; None (unknown) compares False."""

    def impl(a: Any, b: Any) -> bool:
        a = tuple(a) if isinstance(a, (list, np.ndarray)) else a
        b = tuple(b) if isinstance(b, (list, np.ndarray)) else b
        if a is None or b is None:
            return False
        try:
            return bool(op(a, b))
        except TypeError:
            return False

    return impl


def _shape(fn: Callable[..., bool], params: tuple[str, ...]) -> GuardFn:
    return GuardFn(len(params), fn, fn.__doc__ or "", False, params)


def _value(fn: Callable[[Any], bool], doc: str) -> GuardFn:
    return GuardFn(1, fn, doc, True, ("const",))


GUARDS: dict[str, GuardFn] = {
    "is_scalar": _shape(is_scalar, ("value",)),
    "static": _shape(static, ("value",)),
    "varies_only_along": _shape(varies_only_along, ("value", "int", "int")),
    "per_axis": _shape(varies_only_along, ("value", "int", "int")),
    "broadcastable": _shape(broadcastable, ("value", "value")),
    "same_shape": _shape(same_shape, ("value", "value")),
    "broadcasts_into": _shape(broadcasts_into, ("value", "value")),
    "identity_perm": _shape(identity_perm, ("ints", "int")),
    "positive": _value(_all(lambda a: a > 0), "every element > 0"),
    "nonnegative": _value(_all(lambda a: a >= 0), "every element >= 0"),
    "nonzero": _value(_all(lambda a: a != 0), "every element != 0"),
    "ones": _value(_all(lambda a: a == 1), "every element == 1"),
    "zeros": _value(_all(lambda a: a == 0), "every element == 0"),
    "floating": _value(lambda c: bool(np.issubdtype(np.asarray(c).dtype, np.floating)),
                       "the constant has a floating-point dtype"),
    "not_ones": GuardFn(1, lambda c: not bool(np.all(np.asarray(c) == 1)), "some element != 1",
                        True, ("const",), termination=True),
    "not_zeros": GuardFn(1, lambda c: not bool(np.all(np.asarray(c) == 0)), "some element != 0",
                         True, ("const",), termination=True),
}

COMPARISONS: dict[str, GuardFn] = {
    sym: GuardFn(2, _cmp(fn), f"a {sym} b", False, ("any", "any"))
    for sym, fn in {"==": operator.eq, "!=": operator.ne, "<": operator.lt,
                    "<=": operator.le, ">": operator.gt, ">=": operator.ge}.items()
}
GUARDS.update(COMPARISONS)
