"""Reference interpreter, sequence values: ONNX's seq(tensor) held as a list of numpy arrays (as
onnx.reference holds one) that also knows its element type, so that an empty sequence keeps it;
and optional values, held as onnx.reference holds them (None when empty).

The sequence ops run here rather than on onnx.reference, which does not check what the spec asks
of a position (its SequenceInsert appends at any index past the end, where ONNX Runtime refuses)
or that the items of a sequence share one element type.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from saturate.core.errors import SaturateError
from saturate.core.ir import Node

__all__ = ["TensorSequence", "SEQUENCE_OPS", "OPTIONAL_OPS", "is_sequence", "as_value", "run_sequence_op", "value_nbytes",
           "copy_value"]


class TensorSequence(list):
    """A sequence of tensors of one element type. `dtype` is numpy's dtype of the items (kept
    for an empty sequence; float32 when nothing says otherwise, as SequenceEmpty's default)."""

    def __init__(self, items: Any = (), dtype: Any = None) -> None:
        super().__init__(np.asarray(a) for a in items)
        if dtype is None:
            dtype = self[0].dtype if self else np.float32
        self.dtype = np.dtype(dtype)

    def __repr__(self) -> str:
        return f"TensorSequence({list.__repr__(self)}, dtype={self.dtype.name})"

    def __reduce__(self) -> Any:  # pickled into the checker's worker processes
        return (TensorSequence, (list(self), self.dtype))


def is_sequence(value: Any) -> bool:
    return isinstance(value, list)


def as_value(value: Any) -> Any:
    """A graph value as the interpreter holds it: a TensorSequence for a list (or tuple of
    arrays from a caller), else an array."""
    if isinstance(value, TensorSequence) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return TensorSequence(value)
    return np.asarray(value)


def value_nbytes(value: Any) -> int:
    return sum(a.nbytes for a in value) if is_sequence(value) else value.nbytes


def copy_value(value: Any) -> Any:
    if is_sequence(value):
        return TensorSequence([a.copy() for a in value], value.dtype)
    return value.copy()


def _sequence_arg(node: Node, args: Sequence[Any], k: int) -> TensorSequence:
    a = args[k] if k < len(args) else None
    if not is_sequence(a):
        raise SaturateError(f"{node.where()}: input {k} must be a sequence, got "
                            f"{'nothing' if a is None else 'a tensor'}")
    return a


def _tensor_arg(node: Node, args: Sequence[Any], k: int) -> np.ndarray | None:
    a = args[k] if k < len(args) else None
    if is_sequence(a):
        raise SaturateError(f"{node.where()}: input {k} must be a tensor, got a sequence")
    return a


def _position(node: Node, value: np.ndarray | None, length: int, insert: bool = False) -> int | None:
    """The index a position input names, checked against the spec's range ([-n, n-1], or
    [-n, n] where an insertion may append)."""
    if value is None:
        return None
    if value.dtype not in (np.int32, np.int64) or value.size != 1:
        raise SaturateError(f"{node.where()}: position must be one int32 or int64 value, "
                            f"got {value.dtype.name}{list(value.shape)}")
    pos = int(value.reshape(-1)[0])
    high = length if insert else length - 1
    if not -length <= pos <= high:
        raise SaturateError(f"{node.where()}: position {pos} is out of range for a sequence of length {length} "
                            f"(allowed {-length} to {high})")
    return pos + length if pos < 0 else pos


def _same_dtype(node: Node, dtype: np.dtype, items: Sequence[np.ndarray]) -> None:
    for a in items:
        if a.dtype != dtype:
            raise SaturateError(f"{node.where()}: a sequence holds one element type: {a.dtype.name} "
                                f"beside {dtype.name}")


def _construct(node: Node, args: Sequence[Any]) -> list[Any]:
    items = [_tensor_arg(node, args, k) for k in range(len(args))]
    if not items or any(a is None for a in items):
        raise SaturateError(f"{node.where()}: takes one or more tensors")
    _same_dtype(node, items[0].dtype, items)
    return [TensorSequence(items)]


def _empty(node: Node, args: Sequence[Any]) -> list[Any]:
    code = node.attrs.get("dtype")
    if code is None:
        return [TensorSequence([], np.float32)]
    from onnx import helper

    try:
        return [TensorSequence([], helper.tensor_dtype_to_np_dtype(int(code)))]
    except (KeyError, TypeError, ValueError):
        raise SaturateError(f"{node.where()}: dtype {code} is not a tensor element type") from None


def _at(node: Node, args: Sequence[Any]) -> list[Any]:
    seq = _sequence_arg(node, args, 0)
    pos = _position(node, _tensor_arg(node, args, 1), len(seq))
    if pos is None:
        raise SaturateError(f"{node.where()}: missing required input 1 (position)")
    return [seq[pos]]


def _length(node: Node, args: Sequence[Any]) -> list[Any]:
    return [np.array(len(_sequence_arg(node, args, 0)), np.int64)]


def _insert(node: Node, args: Sequence[Any]) -> list[Any]:
    seq = _sequence_arg(node, args, 0)
    tensor = _tensor_arg(node, args, 1)
    if tensor is None:
        raise SaturateError(f"{node.where()}: missing required input 1 (tensor)")
    _same_dtype(node, seq.dtype, [tensor])
    pos = _position(node, _tensor_arg(node, args, 2), len(seq), insert=True)
    out = TensorSequence(seq, seq.dtype)
    out.insert(len(seq) if pos is None else pos, tensor)
    return [out]


def _erase(node: Node, args: Sequence[Any]) -> list[Any]:
    seq = _sequence_arg(node, args, 0)
    if not seq:
        raise SaturateError(f"{node.where()}: cannot erase from an empty sequence")
    pos = _position(node, _tensor_arg(node, args, 1), len(seq))
    out = TensorSequence(seq, seq.dtype)
    del out[len(seq) - 1 if pos is None else pos]
    return [out]


def _split(node: Node, args: Sequence[Any]) -> list[Any]:
    x = _tensor_arg(node, args, 0)
    if x is None:
        raise SaturateError(f"{node.where()}: missing required input 0 (input)")
    if x.ndim == 0:
        raise SaturateError(f"{node.where()}: cannot split a 0-d tensor")
    axis = node.attrs.get("axis", 0)
    if not -x.ndim <= int(axis) < x.ndim:
        raise SaturateError(f"{node.where()}: axis {axis} is out of range for rank {x.ndim}")
    axis = int(axis) % x.ndim
    dim = x.shape[axis]
    split = _tensor_arg(node, args, 1)
    if split is None:
        pieces = [x.take([i], axis=axis) for i in range(dim)]
        if not node.attrs.get("keepdims", 1):
            pieces = [np.squeeze(p, axis=axis) for p in pieces]
        return [TensorSequence(pieces, x.dtype)]
    if split.dtype.kind not in "iu":
        raise SaturateError(f"{node.where()}: split must be int32 or int64, got {split.dtype.name}")
    if split.ndim == 0:
        step = int(split)
        if step <= 0:
            raise SaturateError(f"{node.where()}: split {step} must be positive")
        sizes = [step] * (dim // step) + ([dim % step] if dim % step else [])
    elif split.ndim == 1:
        sizes = [int(s) for s in split]
        if any(s < 0 for s in sizes) or sum(sizes) != dim:
            raise SaturateError(f"{node.where()}: split {sizes} must be non-negative and sum to {dim}, "
                                f"the length of axis {axis}")
    else:
        raise SaturateError(f"{node.where()}: split must be a scalar or 1-D, got shape {list(split.shape)}")
    bounds = np.cumsum([0] + sizes)
    return [TensorSequence([x[(slice(None),) * axis + (slice(int(b), int(e)),)]
                            for b, e in zip(bounds[:-1], bounds[1:])], x.dtype)]


def _concat(node: Node, args: Sequence[Any]) -> list[Any]:
    seq = _sequence_arg(node, args, 0)
    if not seq:
        raise SaturateError(f"{node.where()}: cannot concatenate an empty sequence")
    new_axis = bool(node.attrs.get("new_axis", 0))
    rank = seq[0].ndim
    if "axis" not in node.attrs:
        raise SaturateError(f"{node.where()}: attribute 'axis' is required")
    axis = int(node.attrs["axis"])
    # With new_axis the output has one axis more, which the axis may name (the spec's [-r-1, r]).
    out_rank = rank + 1 if new_axis else rank
    if not -out_rank <= axis < out_rank or out_rank == 0:
        raise SaturateError(f"{node.where()}: axis {axis} is out of range for {'stacking' if new_axis else 'joining'} "
                            f"tensors of rank {rank}")
    axis %= out_rank
    shapes = {a.shape[:axis] + a.shape[axis + 1:] if not new_axis else a.shape for a in seq}
    if any(a.ndim != rank for a in seq) or len(shapes) > 1:
        raise SaturateError(f"{node.where()}: items of shapes {', '.join(str(list(a.shape)) for a in seq)} "
                            f"do not {'stack' if new_axis else 'join'} along axis {axis}")
    return [np.stack(seq, axis=axis) if new_axis else np.concatenate(seq, axis=axis)]


def _identity(node: Node, args: Sequence[Any]) -> list[Any]:
    seq = _sequence_arg(node, args, 0)
    return [TensorSequence(seq, seq.dtype)]


# Optional values are held as onnx.reference holds them: an empty optional is None (as an omitted
# input is: OptionalHasElement of either is false), a full one its value, a tensor or a sequence.
def _optional(node: Node, args: Sequence[Any]) -> list[Any]:
    value = args[0] if args else None
    if value is None and "type" not in node.attrs:
        raise SaturateError(f"{node.where()}: an empty optional needs the attribute 'type'")
    return [value]


def _has_element(node: Node, args: Sequence[Any]) -> list[Any]:
    return [np.array(bool(args) and args[0] is not None)]


def _get_element(node: Node, args: Sequence[Any]) -> list[Any]:
    if not args or args[0] is None:
        raise SaturateError(f"{node.where()}: the optional is empty")
    return [args[0]]


OPTIONAL_OPS: dict[str, Callable[[Node, Sequence[Any]], list[Any]]] = {
    "Optional": _optional, "OptionalHasElement": _has_element, "OptionalGetElement": _get_element}

SEQUENCE_OPS: dict[str, Callable[[Node, Sequence[Any]], list[Any]]] = {
    "SequenceConstruct": _construct, "SequenceEmpty": _empty, "SequenceAt": _at, "SequenceLength": _length,
    "SequenceInsert": _insert, "SequenceErase": _erase, "SplitToSequence": _split,
    "ConcatFromSequence": _concat,
}


def run_sequence_op(node: Node, args: Sequence[Any]) -> list[Any]:
    """Run a sequence or optional op (or Identity of a sequence); one value per output."""
    if node.op == "Identity":
        return _identity(node, args)
    return (SEQUENCE_OPS.get(node.op) or OPTIONAL_OPS[node.op])(node, args)
