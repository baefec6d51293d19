"""Op registry, shape inference: an op's output type from its entry (ONNX's inference is the
callers' fallback, saturate.frontend.infer)."""

from __future__ import annotations

from typing import Any, Sequence

from saturate.core.ir import ValueInfo
from saturate.ops.registry import find, lookup


def broadcast_shape(a: tuple, b: tuple) -> tuple | None:
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


def broadcast_all(shapes: Sequence[tuple]) -> tuple | None:
    """The multidirectional broadcast of static shapes, or None when they may not broadcast."""
    out = tuple(shapes[0])
    for sh in shapes[1:]:
        out = broadcast_shape(out, tuple(sh)) if out is not None else None
    return out


def infer_type(op: str, attrs: dict[str, Any], ins: Sequence[ValueInfo | None],
               domain: str | None = None) -> ValueInfo | None:
    """Output 0's type as the op's entry derives it: same-shape ops take their first input's,
    elementwise ops broadcast, others ask their `shape` function. None when the entry cannot
    tell (unknown input shapes, an op without one): ask ONNX's inference then. Without a
    domain, the op a rule means by that name (registry.find)."""
    d = find(op) if domain is None else lookup(op, domain)
    if d is None or not ins:
        return None
    dtype = ins[0].dtype if ins[0] is not None else "float32"
    if d.same_shape and ins[0] is not None:
        return ValueInfo(dtype, ins[0].shape)
    if any(i is None or i.shape is None for i in ins):
        return None
    if d.elementwise:
        out = broadcast_all([i.shape for i in ins])
        return None if out is None else ValueInfo(dtype, out)
    return None if d.shape is None else d.shape(attrs, list(ins))
