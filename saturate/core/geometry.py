"""Geometry of ops, one definition: Conv and pooling windows (pads, strides, dilations, output
sizes), and the shapes Slice, Squeeze/Unsqueeze, Split and Pad give from their constant inputs.

The interpreter, the engine's shape facts, the rule checker's strategies and the C backend all
resolve `auto_pad`, `pads`, `ceil_mode`, Slice bounds and output sizes here, so they cannot disagree.
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


def slice_ranges(shape: Sequence[Any], starts: Sequence[int], ends: Sequence[int],
                 axes: Sequence[int] | None = None, steps: Sequence[int] | None = None
                 ) -> list[tuple[int, int, int | None]]:
    """(start, step, count) per axis of a Slice of a tensor of `shape`, clamped as ONNX specifies
    (for negative steps, unlike Python's slices, a start before the first element clamps to it).
    An axis the Slice does not touch is (0, 1, its dim); one it touches whose dim is not a number
    (a symbolic batch) has count None. Raises GeometryError for a zero step, an axis out of range
    or lists of different lengths."""
    rank = len(shape)
    axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise GeometryError(f"Slice has {len(starts)} starts, {len(ends)} ends, {len(axes)} axes and "
                            f"{len(steps)} steps")
    out: list[tuple[int, int, int | None]] = [(0, 1, d) for d in shape]
    for a, b, e, st in zip(axes, starts, ends, steps):
        if st == 0:
            raise GeometryError("Slice step is zero")
        if not -rank <= a < rank:
            raise GeometryError(f"Slice axis {a} is out of range for rank {rank}")
        a %= rank
        n = shape[a]
        if not isinstance(n, int):
            out[a] = (0, st, None)
            continue
        b, e = int(b), int(e)
        b, e = b + n if b < 0 else b, e + n if e < 0 else e
        if st > 0:
            b, e = min(max(b, 0), n), min(max(e, 0), n)
        else:
            b, e = min(max(b, 0), n - 1), min(max(e, -1), n - 1)
        out[a] = (b, st, len(range(b, e, st)))
    return out


def squeeze_shape(shape: Sequence[Any], axes: Sequence[int]) -> tuple:
    """Squeeze's output shape: `axes` dropped (every dim of 1 when empty). Raises GeometryError for
    an axis out of range or a dropped dim that is a number other than 1, or, without axes, for a
    dim that is not a number (whether it is 1 is not known)."""
    rank = len(shape)
    if axes:
        if any(not -rank <= a < rank for a in axes):
            raise GeometryError(f"Squeeze axes {list(axes)} are out of range for rank {rank}")
        drop = {a % rank for a in axes}
    else:
        if not all(isinstance(d, int) for d in shape):
            raise GeometryError("Squeeze without axes needs every dim known")
        drop = {k for k, d in enumerate(shape) if d == 1}
    if any(isinstance(shape[a], int) and shape[a] != 1 for a in drop):
        raise GeometryError(f"cannot squeeze axes {sorted(drop)} of shape {tuple(shape)}")
    return tuple(d for k, d in enumerate(shape) if k not in drop)


def unsqueeze_shape(shape: Sequence[Any], axes: Sequence[int]) -> tuple:
    """Unsqueeze's output shape: a 1 at each of `axes` (positions in the output)."""
    rank = len(shape) + len(axes)
    if any(not -rank <= a < rank for a in axes):
        raise GeometryError(f"Unsqueeze axes {list(axes)} are out of range for rank {rank}")
    ones = {a % rank for a in axes}
    if len(ones) != len(axes):
        raise GeometryError(f"Unsqueeze axes {list(axes)} repeat")
    rest = iter(shape)
    return tuple(1 if k in ones else next(rest) for k in range(rank))


def split_sizes(dim: int, outputs: int, split: Sequence[int] | None = None,
                num_outputs: int | None = None) -> list[int]:
    """Sizes of Split's outputs along its axis of `dim` elements: `split` when given, else
    `num_outputs` (or the node's output count) chunks of the rounded-up share, the last smaller.
    Raises GeometryError when the sizes do not add up to `dim` or do not match the outputs."""
    if split is not None and len(split):
        sizes = [int(s) for s in split]
    else:
        n = int(num_outputs or outputs)
        if n < 1:
            raise GeometryError("Split has no outputs")
        chunk = -(-dim // n)
        sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
    if len(sizes) != outputs or sum(sizes) != dim or any(s < 0 for s in sizes):
        raise GeometryError(f"cannot split {dim} into {sizes} for {outputs} outputs")
    return sizes


def pad_amounts(rank: int, pads: Sequence[int], axes: Sequence[int] | None = None
                ) -> tuple[list[int], list[int]]:
    """Pads before and after each of `rank` axes from Pad's `pads` (all begins, then all ends, for
    `axes` or every axis). Raises GeometryError when their number does not match."""
    axes = list(range(rank)) if axes is None else [int(a) for a in axes]
    if len(pads) != 2 * len(axes) or any(not -rank <= a < rank for a in axes):
        raise GeometryError(f"Pad has {len(pads)} pads for axes {axes} of rank {rank}")
    begin, end = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        begin[a % rank], end[a % rank] = int(pads[k]), int(pads[k + len(axes)])
    return begin, end
