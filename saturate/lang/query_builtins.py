"""Rule builtins, the int queries: what a rule may ask of a value's shape and type (rank, dim,
numel, elem_type) and the shape computations it may build from them (shape_of, reshape_target,
...), answered from static or symbolic shapes, never from data. Calling convention: builtins.py."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from saturate.lang.builtin_kinds import QueryFn, Shape
from saturate.lang.builtins import as_ints, slice_


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


def shape_slice(shape: Shape, start: int | None, end: int | None, starts: Any, ends: Any,
                axes: Any, steps: Any) -> np.ndarray | None:
    """Slice(Shape(v){start, end}, starts, ends, axes, steps): the picked dims as int64, None if
    one is symbolic (the others may be: a symbolic batch leaves the static dims readable)."""
    part = tuple(shape)[start or 0:end]
    picked = slice_(np.arange(len(part)), starts, ends, axes, steps)
    dims = [part[int(k)] for k in picked]
    if not all(isinstance(d, (int, np.integer)) for d in dims):
        return None
    return np.array([int(d) for d in dims], np.int64)


def reshape_target(dims: Shape | None, data: tuple | None) -> np.ndarray | None:
    """A constant target for Reshape(x, s) (allowzero 0) from what is known of s's elements:
    when one element alone is not a number it becomes -1, read from the element count (the
    other elements all known and positive, so the count decides it); otherwise an element that
    is x's dim at the same position becomes 0 (copy it), and one element still unknown, -1.
    None when more is unknown."""
    if dims is None or data is None:
        return None
    return _target(dims, data)


def unsqueeze_target(dims: Shape | None, axes: Any) -> np.ndarray | None:
    """The Reshape target that does what Unsqueeze(x, axes) does (see reshape_target)."""
    if dims is None:
        return None
    rank = len(dims) + len(as_ints(axes))
    ax = sorted(a + rank if a < 0 else a for a in as_ints(axes))
    if len(set(ax)) != len(ax) or any(not 0 <= a < rank for a in ax):
        return None
    rest = iter(dims)
    return _target(dims, tuple(1 if k in ax else next(rest) for k in range(rank)))


def squeeze_target(dims: Shape | None, axes: Any) -> np.ndarray | None:
    """The Reshape target that does what Squeeze(x, axes) does; None unless each squeezed dim
    is known to be 1. An empty axes list is left alone: ONNX Runtime squeezes every dim of
    size 1 for it, onnx.reference none."""
    ax = as_ints(axes)
    if dims is None or not ax:
        return None
    ax = tuple(a + len(dims) if a < 0 else a for a in ax)
    if any(not 0 <= a < len(dims) or dims[a] != 1 for a in ax):
        return None
    return _target(dims, tuple(d for k, d in enumerate(dims) if k not in ax))


def transpose_target(dims: Shape | None, perm: Any) -> np.ndarray | None:
    """The Reshape target that does what Transpose(x, perm) does, when it does: the perm moves
    only dims of size 1, so the elements keep their order (None otherwise)."""
    if dims is None:
        return None
    p = as_ints(perm) or tuple(range(len(dims) - 1, -1, -1))
    if sorted(p) != list(range(len(dims))):
        return None
    moved = [k for k in p if dims[k] != 1]
    if moved != sorted(moved):
        return None
    return _target(dims, tuple(dims[k] for k in p))


def _target(dims: Shape, out: tuple) -> np.ndarray | None:
    symbolic = [j for j, e in enumerate(out) if not isinstance(e, (int, np.integer))]
    if len(symbolic) == 1 and all(e > 0 for j, e in enumerate(out) if j != symbolic[0]):
        # One symbolic dim is read from the element count (-1) even where it could be copied
        # (0): a target without 0 does not depend on its input's shape, so it merges with a
        # Reshape before it (reshape-reshape).
        return np.array([-1 if j == symbolic[0] else int(e) for j, e in enumerate(out)], np.int64)
    got: list[int | None] = []
    for j, e in enumerate(out):
        if isinstance(e, (int, np.integer)):
            # A 0 in a Reshape target copies the input's dim there: it says 0 only where the
            # input has a 0 at that index (an empty tensor's other sides cannot be written).
            if e == 0 and not (j < len(dims) and dims[j] == 0):
                return None
            got.append(int(e))
        elif j < len(dims) and dims[j] == e:
            got.append(0)
        else:
            got.append(None)
    holes = [j for j, e in enumerate(got) if e is None or e == -1]
    if len(holes) > 1:
        return None
    if holes and got[holes[0]] is None:
        if any(e <= 0 for j, e in enumerate(got) if j != holes[0]):
            return None
        got[holes[0]] = -1
    return np.array(got, np.int64)


def rows_restore(dims: Shape | None, n: int) -> np.ndarray | None:
    """The Reshape target giving rows of length n (a Gemm's output over x's rows) back x's
    leading dims: x's dims but the last, then n; one symbolic dim among them becomes -1."""
    if dims is None or not dims:
        return None
    lead = [d if isinstance(d, (int, np.integer)) else None for d in dims[:-1]]
    if lead.count(None) > 1 or (None in lead and any(d is not None and d <= 0 for d in lead)):
        return None
    return np.array([-1 if d is None else int(d) for d in lead] + [int(n)], np.int64)


def rows_shape(shape: Shape) -> np.ndarray | None:
    """The Reshape target [-1, last dim] that folds every leading dim into rows, as int64
    (None when the last dim is symbolic)."""
    if not shape or not isinstance(shape[-1], (int, np.integer)):
        return None
    return np.array([-1, int(shape[-1])], np.int64)


def elem_type(dtype: Any) -> int | None:
    """The ONNX element type number (onnx.TensorProto) of a value's dtype, as Cast's `to` wants."""
    from onnx.helper import np_dtype_to_tensor_dtype

    if dtype is None:
        return None
    try:
        return int(np_dtype_to_tensor_dtype(np.dtype(dtype)))
    except (TypeError, KeyError, ValueError):
        return None


QUERIES: dict[str, QueryFn] = {
    # "type" parameters get the value's dtype name (numpy spelling), not its shape.
    "elem_type": QueryFn(1, elem_type, elem_type.__doc__, ("type",)),
    "rank": QueryFn(1, len, "number of dims of v", ("value",)),
    "dim": QueryFn(2, _dim, "size of dim k of v (negative k counts from the end)", ("value", "int")),
    "numel": QueryFn(1, _numel, "number of elements of v (None when a dim is symbolic)", ("value",)),
    "shape_of": QueryFn(3, shape_of, shape_of.__doc__, ("value", "int", "int"), "const"),
    "shape_at": QueryFn(4, shape_at, shape_at.__doc__, ("value", "int", "int", "const"), "const"),
    "rows_shape": QueryFn(1, rows_shape, rows_shape.__doc__, ("value",), "const"),
    "rows_restore": QueryFn(2, rows_restore, rows_restore.__doc__, ("dims", "int"), "const"),
    "reshape_target": QueryFn(2, reshape_target, reshape_target.__doc__, ("dims", "data"), "const"),
    "unsqueeze_target": QueryFn(2, unsqueeze_target, unsqueeze_target.__doc__, ("dims", "ints"), "const"),
    "squeeze_target": QueryFn(2, squeeze_target, squeeze_target.__doc__, ("dims", "ints"), "const"),
    "transpose_target": QueryFn(2, transpose_target, transpose_target.__doc__, ("dims", "ints"), "const"),
    "shape_slice": QueryFn(7, shape_slice, shape_slice.__doc__,
                           ("value", "int", "int", "ints", "ints", "ints", "ints"), "const"),
}
