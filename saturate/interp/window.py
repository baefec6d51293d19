"""Reference interpreter, windowed ops: Conv and pooling by strided windows + matmul (im2col)."""

from __future__ import annotations

import math

import numpy as np

from saturate.core.errors import SaturateError
from saturate.core.geometry import GeometryError, window
from saturate.core.ir import Node


class Unhandled(Exception):
    """Raised by a kernel for a rare form of its op (training mode, float8 casts) that it leaves
    to the general onnx.reference implementation rather than duplicate it."""


def fail(node: Node, message: str) -> SaturateError:
    """An error that names the node and op, ready to raise."""
    return SaturateError(f"{node.where()}: {message}")


def int_list(node: Node, key: str, n: int, default: int) -> list[int]:
    """An int-list attribute of length n, or n copies of the default when absent."""
    value = node.attrs.get(key)
    if value is None:
        return [default] * n
    value = [int(v) for v in value]
    if len(value) != n:
        raise fail(node, f"attribute '{key}' has {len(value)} entries, expected {n}")
    return value


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def geometry(node: Node, spatial: tuple[int, ...], kernel: list[int], ceil_mode: bool = False):
    """Strides, dilations, pads before/after and output size for a sliding-window op."""
    try:
        w = window(node.attrs, spatial, kernel, ceil_mode)
    except GeometryError as err:
        raise fail(node, str(err)) from None
    return list(w.strides), list(w.dilations), list(w.begin), list(w.end), list(w.out)


def windows(x: np.ndarray, begin, end, out, kernel, strides, dilations, fill) -> np.ndarray:
    """A read-only view (N, C, *out, *kernel) of x padded with `fill`, without copying windows."""
    # Extra trailing room for ceil_mode windows that hang over the padded input.
    extra = [max(0, (o - 1) * s + (k - 1) * d + 1 - (i + b + e))
             for o, s, k, d, i, b, e in zip(out, strides, kernel, dilations, x.shape[2:], begin, end)]
    widths = [(0, 0), (0, 0)] + [(b, e + t) for b, e, t in zip(begin, end, extra)]
    xp = np.pad(x, widths, constant_values=fill) if any(map(any, widths)) else x
    lead, spatial_strides = xp.strides[:2], xp.strides[2:]
    shape = xp.shape[:2] + tuple(out) + tuple(kernel)
    steps = lead + tuple(st * s for st, s in zip(spatial_strides, strides)) \
        + tuple(st * d for st, d in zip(spatial_strides, dilations))
    return np.lib.stride_tricks.as_strided(xp, shape, steps, writeable=False)


def conv(node: Node, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Conv (N-D, grouped) as one batched matmul per group over im2col columns."""
    if x.ndim < 3 or w.ndim != x.ndim:
        raise fail(node, f"input rank {x.ndim} and weight rank {w.ndim} must match and be >= 3")
    if x.dtype != w.dtype or (b is not None and b.dtype != x.dtype):
        raise fail(node, f"input, weight and bias dtypes differ ({x.dtype}, {w.dtype}"
                         f"{', ' + str(b.dtype) if b is not None else ''})")
    group = int(node.attrs.get("group", 1))
    n_batch, channels = x.shape[:2]
    m_out, c_group = w.shape[:2]
    kernel = list(w.shape[2:])
    if group < 1 or channels != c_group * group or m_out % group:
        raise fail(node, f"input has {channels} channels but weight {tuple(w.shape)} with group={group} "
                         f"expects {c_group * group}")
    if node.attrs.get("kernel_shape") is not None and list(node.attrs["kernel_shape"]) != kernel:
        raise fail(node, f"kernel_shape {list(node.attrs['kernel_shape'])} != weight kernel {kernel}")
    if b is not None and b.shape != (m_out,):
        raise fail(node, f"bias shape {tuple(b.shape)} != ({m_out},)")
    strides, dilations, begin, end, out = geometry(node, x.shape[2:], kernel)
    view = windows(x, begin, end, out, kernel, strides, dilations, 0)
    n = len(kernel)
    m_group, positions, k_size = m_out // group, math.prod(out), math.prod(kernel)
    # (N, G, Cg, *out, *k) -> (G, Cg, *k, N, *out): one copy into matmul-ready columns.
    view = view.reshape((n_batch, group, c_group) + tuple(out) + tuple(kernel))
    order = (1, 2) + tuple(range(3 + n, 3 + 2 * n)) + (0,) + tuple(range(3, 3 + n))
    cols = view.transpose(order).reshape(group, c_group * k_size, n_batch * positions)
    y = np.matmul(w.reshape(group, m_group, c_group * k_size), cols)
    y = y.reshape(group, m_group, n_batch, positions).transpose(2, 0, 1, 3)
    y = y.reshape((n_batch, m_out) + tuple(out))
    if b is not None:
        y += b.reshape((m_out,) + (1,) * n)
    return y


def _reduce_offsets(ufunc, view: np.ndarray, kernel: list[int]) -> np.ndarray:
    """Combine the (N, C, *out) slices of a window view, one kernel offset at a time."""
    # One pass per offset over contiguous-ish slices is far faster than reducing 2n strided axes.
    acc = None
    for offset in np.ndindex(*kernel):
        part = view[(Ellipsis,) + offset]
        acc = part.copy() if acc is None else ufunc(acc, part, out=acc)
    return acc


def _pool_kernel(node: Node, x: np.ndarray) -> list[int]:
    if x.ndim < 3:
        raise fail(node, f"input rank {x.ndim} must be >= 3")
    kernel = node.attrs.get("kernel_shape")
    if kernel is None:
        raise fail(node, "missing required attribute 'kernel_shape'")
    return int_list(node, "kernel_shape", x.ndim - 2, 1)


def max_pool(node: Node, x: np.ndarray):
    """MaxPool over padded windows (padding never wins the max)."""
    kernel = _pool_kernel(node, x)
    if int(node.attrs.get("storage_order", 0)) != 0 and len(node.outputs) > 1 and node.outputs[1]:
        raise Unhandled  # column-major Indices: rare, left to onnx.reference
    strides, dilations, begin, end, out = geometry(node, x.shape[2:], kernel,
                                                   bool(node.attrs.get("ceil_mode", 0)))
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    view = windows(x, begin, end, out, kernel, strides, dilations, lowest)
    n = len(kernel)
    if len(node.outputs) < 2 or not node.outputs[1]:
        return _reduce_offsets(np.maximum, view, kernel)
    flat = view.reshape(view.shape[:2 + n] + (-1,))
    arg = flat.argmax(axis=-1)
    y = np.take_along_axis(flat, arg[..., None], axis=-1)[..., 0]
    # Indices: flat positions in the unpadded input (row-major over N, C, spatial).
    offsets = np.unravel_index(arg, kernel)
    flat_index = np.zeros(arg.shape, np.int64)
    spatial = x.shape[2:]
    for axis in range(n):
        grid = np.arange(out[axis]).reshape((-1,) + (1,) * (n - 1 - axis)) * strides[axis] - begin[axis]
        coord = grid + offsets[axis] * dilations[axis]
        flat_index = flat_index * spatial[axis] + coord
    base = np.arange(x.shape[0] * x.shape[1]).reshape(x.shape[:2] + (1,) * n) * math.prod(spatial)
    return y, flat_index + base


def average_pool(node: Node, x: np.ndarray) -> np.ndarray:
    """AveragePool; the divisor counts pad cells only with count_include_pad, never ceil overhang."""
    kernel = _pool_kernel(node, x)
    strides, dilations, begin, end, out = geometry(node, x.shape[2:], kernel,
                                                   bool(node.attrs.get("ceil_mode", 0)))
    total = _reduce_offsets(np.add, windows(x, begin, end, out, kernel, strides, dilations, 0), kernel)
    include = int(node.attrs.get("count_include_pad", 0))
    ones = np.ones((1, 1) + x.shape[2:], x.dtype)
    if include:
        ones = np.pad(ones, [(0, 0), (0, 0)] + list(zip(begin, end)), constant_values=1)
        begin_c, end_c = [0] * len(kernel), [0] * len(kernel)
    else:
        begin_c, end_c = begin, end
    count = _reduce_offsets(np.add, windows(ones, begin_c, end_c, out, kernel, strides, dilations, 0), kernel)
    return (total / np.maximum(count, 1)).astype(x.dtype, copy=False)


def global_average_pool(node: Node, x: np.ndarray) -> np.ndarray:
    """GlobalAveragePool: mean over every spatial axis, kept as size-1 axes."""
    if x.ndim < 3:
        raise fail(node, f"input rank {x.ndim} must be >= 3")
    return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=x.dtype)


def global_lp_pool(node: Node, x: np.ndarray) -> np.ndarray:
    """GlobalLpPool: the p-norm over every spatial axis, kept as size-1 axes."""
    if x.ndim < 3:
        raise fail(node, f"input rank {x.ndim} must be >= 3")
    p = int(node.attrs.get("p", 2))
    if p < 1:
        raise fail(node, f"p = {p} must be >= 1")
    spatial = tuple(range(2, x.ndim))
    total = np.sum(np.abs(x) ** p, axis=spatial, keepdims=True, dtype=x.dtype)
    return (total ** (1.0 / p)).astype(x.dtype, copy=False)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    # C's roundf, which ROI pooling's box corners are defined by; numpy rounds halves to even.
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def max_roi_pool(node: Node, x: np.ndarray, rois: np.ndarray) -> np.ndarray:
    """MaxRoiPool (Fast R-CNN's ROI pooling): each box (batch index, x1, y1, x2, y2), scaled and
    rounded to pixels, split into pooled_shape bins; each bin is the max over its pixels, 0 when
    it holds none."""
    if x.ndim != 4:
        raise fail(node, f"input rank {x.ndim} must be 4 (N, C, H, W)")
    if rois.ndim != 2 or rois.shape[1] != 5:
        raise fail(node, f"rois of shape {list(rois.shape)} must be (num_rois, 5)")
    pooled = node.attrs.get("pooled_shape")
    if pooled is None or len(pooled) != 2 or min(int(v) for v in pooled) < 1:
        raise fail(node, f"pooled_shape {_text(pooled)} must be two positive sizes")
    ph, pw = (int(v) for v in pooled)
    scale = float(node.attrs.get("spatial_scale", 1.0))
    n, c, h, w = x.shape
    out = np.zeros((rois.shape[0], c, ph, pw), dtype=x.dtype)
    corners = _round_half_away(rois[:, 1:].astype(np.float64) * scale)
    for r in range(rois.shape[0]):
        batch = int(rois[r, 0])
        if not 0 <= batch < n:
            raise fail(node, f"roi {r} names batch {batch}, outside 0..{n - 1}")
        x1, y1, x2, y2 = (int(v) for v in corners[r])
        bin_h = max(y2 - y1 + 1, 1) / ph
        bin_w = max(x2 - x1 + 1, 1) / pw
        for i in range(ph):
            top = min(max(math.floor(i * bin_h) + y1, 0), h)
            bottom = min(max(math.ceil((i + 1) * bin_h) + y1, 0), h)
            for j in range(pw):
                left = min(max(math.floor(j * bin_w) + x1, 0), w)
                right = min(max(math.ceil((j + 1) * bin_w) + x1, 0), w)
                if bottom > top and right > left:
                    out[r, :, i, j] = x[batch, :, top:bottom, left:right].max(axis=(1, 2))
    return out
