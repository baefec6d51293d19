"""Rule builtins, the guards: predicates a rule's `if` may name, over shapes and ints (decided
from the facts the engine keeps for every value) or over constant data (`needs_values`), and
the comparisons. Calling convention: builtins.py."""

from __future__ import annotations

import operator
from typing import Any, Callable

import numpy as np

from saturate.lang.builtin_kinds import GuardFn, Shape
from saturate.lang.builtins import as_ints
from saturate.lang.quant_builtins import QUANT_GUARDS
from saturate.ops.infer import broadcast_shape
from saturate.lang import fold


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
    p = as_ints(perm) or tuple(range(rank - 1, -1, -1))
    return p == tuple(range(rank))


def _window(kernel: Shape, pads: Any, dilations: Any) -> tuple | None:
    """Spatial kernel sides, (begin, end) pads and dilations of a conv (omitted: 0 and 1)."""
    n = len(kernel) - 2
    if n < 1 or not static(kernel):
        return None
    p = as_ints(pads) or (0,) * (2 * n)
    d = as_ints(dilations) or (1,) * n
    if len(p) != 2 * n or len(d) != n:
        return None
    return kernel[2:], [(p[i], p[n + i]) for i in range(n)], d


def centred_within(small: Shape, small_pads: Any, big: Shape, big_pads: Any, dilations: Any) -> bool:
    """Two convs of one input with the same strides and `dilations` read windows with one centre:
    the `small` kernel zero-padded evenly to the `big` one's sides, with the big one's pads,
    computes what the small one does with its own pads (every side differs by an even number)."""
    a, b = _window(small, small_pads, dilations), _window(big, big_pads, dilations)
    if a is None or b is None or len(a[0]) != len(b[0]):
        return False
    for k, (p0, p1), big_k, (q0, q1), d in zip(a[0], a[1], b[0], b[1], a[2]):
        grow = big_k - k
        if grow < 0 or grow % 2 or q0 - p0 != d * grow // 2 or q1 - p1 != d * grow // 2:
            return False
    return True


def centred_identity(kernel: Shape, pads: Any, strides: Any, dilations: Any) -> bool:
    """A conv whose centre tap reads the input pixel at its own output position: odd sides,
    stride 1 and pads of (side - 1) / 2 dilated on both ends (output sides = input sides)."""
    w = _window(kernel, pads, dilations)
    if w is None:
        return False
    s = as_ints(strides) or (1,) * len(w[0])
    return all(st == 1 and k % 2 == 1 and p0 == p1 == d * (k - 1) // 2
               for k, (p0, p1), d, st in zip(w[0], w[1], w[2], s)) and len(s) == len(w[0])


def unpadded(pads: Any) -> bool:
    """A conv's or pool's `pads` add nothing: omitted, or every begin and end 0."""
    p = as_ints(pads)
    return p is None or all(x == 0 for x in p)


def precedes(a: Any, b: Any) -> bool:
    """Matrices with as many rows: `a`'s first row comes before `b`'s (as tuples of numbers).
    Weights read by one input in this order merge in this order only. The first row, not the
    first column: a row is contiguous, so a mapped weight of gigabytes is read one page, not
    one page per row."""
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[0] or not a.size or not b.size:
        return False
    return tuple(a[0].tolist()) < tuple(b[0].tolist())


def unit_window(kernel: Any, strides: Any, pads: Any) -> bool:
    """A pooling window of one element moved one element at a time over the unpadded input
    (omitted strides are 1s, omitted pads 0s): each output is the input element at its place."""
    k = as_ints(kernel)
    if not k:
        return False
    s = as_ints(strides) or (1,) * len(k)
    p = as_ints(pads) or (0,) * (2 * len(k))
    return set(k) == {1} and set(s) == {1} and len(s) == len(k) and len(p) == 2 * len(k) and not any(p)


def whole_slice(shape: Shape, starts: Any, ends: Any, axes: Any, steps: Any) -> bool:
    """ONNX Slice of a value of this shape keeps every element in order: on each sliced axis,
    step 1 from the first element to the last (bounds clamped as ONNX clamps them)."""
    st, en = as_ints(starts), as_ints(ends)
    ax = as_ints(axes) or tuple(range(len(st)))
    sp = as_ints(steps) or (1,) * len(st)
    if not len(st) == len(en) == len(ax) == len(sp) or len(set(ax)) != len(ax):
        return False
    for s, e, x, k in zip(st, en, ax, sp):
        if not -len(shape) <= x < len(shape) or not isinstance(shape[x], (int, np.integer)):
            return False
        d = int(shape[x])
        if k != 1 or slice(s, e, k).indices(d)[:2] != (0, d):
            return False
    return True


def fits_along(shape: Shape, axis: int, rank: int, n: int) -> bool:
    """Broadcast against a rank-`rank` value whose side on `axis` is n, a value of this shape
    leaves that side n: it has at most `rank` dims and size 1 or n there."""
    if len(shape) > rank or not -rank <= axis < rank:
        return False
    axis = axis + rank if axis < 0 else axis
    local = axis - (rank - len(shape))
    return local < 0 or shape[local] in (1, n)


def same_dims(dims: Shape, target: Any) -> bool:
    """Reshape (allowzero 0) of a value with these dims to `target` keeps its shape: each entry is
    the dim itself or 0 (copy it), or one entry is -1 while every other is the same known,
    positive dim."""
    t = as_ints(target)
    if t is None or len(t) != len(dims):
        return False
    minus = [j for j, e in enumerate(t) if e == -1]
    if len(minus) > 1:
        return False
    for j, (e, d) in enumerate(zip(t, dims)):
        if j in minus:
            continue
        if minus and not (isinstance(d, (int, np.integer)) and e == d > 0):
            return False
        if not (e == 0 or (isinstance(d, (int, np.integer)) and e == d)):
            return False
    return True


def _all(pred: Callable[[np.ndarray], np.ndarray]) -> Callable[[Any], bool]:
    return lambda c: bool(np.all(pred(np.asarray(c))))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.number)) and not isinstance(v, bool)


def _compare_values(op: Callable[[Any, Any], Any], a: Any, b: Any) -> bool:
    """A comparison with a constant's values: it holds for every element (broadcast, numpy
    rules), and a constant with no element holds none. A Python number takes the constant's
    dtype, as in NumPy 2, so a float32 0.044715 equals the literal 0.044715."""
    try:
        with np.errstate(all="ignore"):
            got = np.asarray(op(a, b))
    except (TypeError, ValueError):
        return False
    return got.size > 0 and bool(np.all(got))


def _cmp(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    """Comparisons of ints/floats/strings/int tuples; None (unknown) compares False. A constant
    (an ndarray) compared with a number or another constant compares its values elementwise
    (`_compare_values`); compared with a list it is read as a list."""

    def impl(a: Any, b: Any) -> bool:
        arrays = [isinstance(v, (np.ndarray, np.generic)) for v in (a, b)]
        if any(arrays) and all(arr or _is_number(v) for arr, v in zip(arrays, (a, b))):
            return _compare_values(op, a, b)
        a = tuple(a) if isinstance(a, (list, np.ndarray)) else a
        b = tuple(b) if isinstance(b, (list, np.ndarray)) else b
        if a is None or b is None:
            return False
        try:
            return bool(op(a, b))
        except TypeError:
            return False

    return impl


def numpy_int(dtype: Any) -> bool:
    """The value holds one of numpy's own integer types (not int4 or uint4, not a float8: their
    quantization rounds and saturates by rules of ONNX's own)."""
    from saturate.core.ir import numpy_native

    if dtype is None:
        return False
    try:
        return numpy_native(np.dtype(dtype), "iu")
    except TypeError:
        return False


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
    "centred_within": _shape(centred_within, ("value", "ints", "value", "ints", "ints")),
    "centred_identity": _shape(centred_identity, ("value", "ints", "ints", "ints")),
    "whole_slice": _shape(whole_slice, ("value", "ints", "ints", "ints", "ints")),
    "unit_window": _shape(unit_window, ("ints", "ints", "ints")),
    "unpadded": _shape(unpadded, ("ints",)),
    "same_dims": _shape(same_dims, ("dims", "ints")),
    "fits_along": _shape(fits_along, ("value", "int", "int", "int")),
    "numpy_int": _shape(numpy_int, ("type",)),
    "positive": _value(_all(lambda a: a > 0), "every element > 0"),
    "nonnegative": _value(_all(lambda a: a >= 0), "every element >= 0"),
    "nonzero": _value(_all(lambda a: a != 0), "every element != 0"),
    "ones": _value(_all(lambda a: a == 1), "every element == 1"),
    "zeros": _value(_all(lambda a: a == 0), "every element == 0"),
    "precedes": GuardFn(2, precedes, precedes.__doc__, True, ("const", "const")),
    "stored": GuardFn(1, lambda stored: stored, "the value is a constant the model stores, not one a rule "
                      "computed (merged weights, say)", False, ("stored",)),
    "floating": _value(lambda c: bool(np.issubdtype(np.asarray(c).dtype, np.floating)),
                       "the constant has a floating-point dtype"),
    "all_equal": GuardFn(2, lambda c, v: _compare_values(operator.eq, np.asarray(c), v),
                         "every element of c equals v (a number in c's dtype, or a constant)",
                         True, ("const", "any")),
    "not_ones": GuardFn(1, lambda c: not bool(np.all(np.asarray(c) == 1)), "some element != 1",
                        True, ("const",), termination=True),
    "not_zeros": GuardFn(1, lambda c: not bool(np.all(np.asarray(c) == 0)), "some element != 0",
                         True, ("const",), termination=True),
    # Regrouping rules (add-add, mul-mul...) on an all-constant graph (shape arithmetic) would
    # build ever new constant expressions of one value; the fold rules handle those.
    "not_const": GuardFn(1, lambda is_const: not is_const, "the value is computed, not a constant",
                         False, ("isconst",), termination=True),
}

COMPARISONS: dict[str, GuardFn] = {
    sym: GuardFn(2, _cmp(fn), f"a {sym} b", False, ("any", "any"))
    for sym, fn in {"==": operator.eq, "!=": operator.ne, "<": operator.lt,
                    "<=": operator.le, ">": operator.gt, ">=": operator.ge}.items()
}
GUARDS.update(COMPARISONS)


# Guards of a rule over any op (`op(xs:const...)`): "op" is the matched node, "list" its inputs.
GUARDS["foldable"] = GuardFn(1, fold.foldable, "the op is deterministic, standard, "
                             "not preserved, and the interpreter runs it", False, ("op",))
GUARDS["fold_fits"] = GuardFn(2, fold.fold_fits, "the result, sized by shape inference, is "
                              "within --max-fold-bytes or no larger than the inputs", True, ("op", "list"))

# Quantization (rules/quant.rules): defined beside the interpreter's QuantizeLinear.
GUARDS.update(QUANT_GUARDS)
