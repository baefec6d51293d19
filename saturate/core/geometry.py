"""Window geometry of Conv and pooling: pads, strides, dilations and output sizes, one definition.

The interpreter, the engine's shape facts, the rule checker's strategies and the C backend all
resolve `auto_pad`, `pads`, `ceil_mode` and output sizes here, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence


class GeometryError(ValueError):
    """Attributes that describe no valid window (callers add the node and op)."""


@dataclass(frozen=True)
class Window:
    """A resolved n-D window: per spatial axis, strides, dilations, pads before/after, output size."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[int, ...]
    end: tuple[int, ...]
    out: tuple[int, ...]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ints(attrs: dict, key: str, n: int, default: int) -> list[int]:
    value = attrs.get(key)
    if value is None or (not value and n):
        return [default] * n
    value = [int(v) for v in value]
    if len(value) != n:
        raise GeometryError(f"attribute '{key}' has {len(value)} entries, expected {n}")
    return value


def extent(kernel: int, dilation: int) -> int:
    """Input positions one dilated kernel spans."""
    return (kernel - 1) * dilation + 1


def window(attrs: dict, spatial: Sequence[int], kernel: Sequence[int], ceil_mode: bool = False) -> Window:
    """Resolve a window's attributes (ONNX Conv/MaxPool/AveragePool semantics) for an input of
    `spatial` sizes; raises GeometryError for attributes no valid window has."""
    n = len(spatial)
    kernel = [int(k) for k in kernel]
    strides = _ints(attrs, "strides", n, 1)
    dilations = _ints(attrs, "dilations", n, 1)
    if len(kernel) != n:
        raise GeometryError(f"kernel has {len(kernel)} spatial dims, the input {n}")
    if min(strides + dilations + kernel, default=1) < 1:
        raise GeometryError("strides, dilations and kernel sizes must be positive")
    span = [extent(k, d) for k, d in zip(kernel, dilations)]
    auto = _text(attrs.get("auto_pad", "NOTSET"))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-i // s) for i, s in zip(spatial, strides)]
        total = [max(0, (o - 1) * s + w - i) for o, s, w, i in zip(out, strides, span, spatial)]
        small = [t // 2 for t in total]
        begin = small if auto == "SAME_UPPER" else [t - h for t, h in zip(total, small)]
        end = [t - b for t, b in zip(total, begin)]
        return Window(tuple(kernel), tuple(strides), tuple(dilations), tuple(begin), tuple(end), tuple(out))
    if auto == "VALID":
        begin = end = [0] * n
    elif auto == "NOTSET":
        pads = _ints(attrs, "pads", 2 * n, 0)
        begin, end = pads[:n], pads[n:]
        if min(pads, default=0) < 0:
            raise GeometryError(f"negative pads {pads}")
    else:
        raise GeometryError(f"unknown auto_pad '{auto}'")
    out = []
    for i, b, e, w, s in zip(spatial, begin, end, span, strides):
        room = i + b + e - w
        if room < 0:
            raise GeometryError(f"kernel extent {w} exceeds padded input size {i + b + e}")
        size = (-(-room // s) if ceil_mode else room // s) + 1
        # A window that would start past the input and its leading pad is dropped (ceil_mode).
        if ceil_mode and (size - 1) * s >= i + b:
            size -= 1
        out.append(size)
    return Window(tuple(kernel), tuple(strides), tuple(dilations), tuple(begin), tuple(end), tuple(out))


def conv_output_shape(attrs: dict, x: Sequence[Any], w: Sequence[Any]) -> tuple | None:
    """Output shape of a Conv with input shape `x` and weight shape `w`; a spatial dim that is not
    a known int (symbolic) gives None in that place. None when the attributes are invalid."""
    nsp = len(x) - 2
    kernel = list(attrs.get("kernel_shape") or w[2:])
    known = [isinstance(d, int) for d in x[2:]]
    # Symbolic sides are resolved with a stand-in size and then reported as unknown.
    sides = [d if k else 1 << 20 for d, k in zip(x[2:], known)]
    try:
        win = window(attrs, sides, kernel)
    except GeometryError:
        return None
    if len(win.out) != nsp:
        return None
    return (x[0], w[0], *(o if k else None for o, k in zip(win.out, known)))


def input_side(out: int, kernel: int, stride: int, dilation: int, pads: tuple[int, int], extra: int = 0) -> int:
    """An input side that a window of this geometry maps to `out` outputs (`extra` < stride)."""
    return (out - 1) * stride + extent(kernel, dilation) - pads[0] - pads[1] + extra
