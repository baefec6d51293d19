"""Reference interpreter, kernels: numpy functions `f(node, *inputs)` that the op registry
(saturate/ops) names as its entries' evaluation."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from saturate.interp.window import Unhandled, fail
from saturate.core.ir import Node, numpy_native


def _same_dtype(node: Node, *arrays: np.ndarray | None) -> None:
    kinds = {a.dtype for a in arrays if a is not None}
    if len(kinds) > 1:
        raise fail(node, "inputs have different dtypes " + ", ".join(sorted(str(k) for k in kinds)))


def _axis(node: Node, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise fail(node, f"axis {axis} is out of range for rank {rank}")
    return axis % rank


# ---- elementwise --------------------------------------------------------------------------

def binary(ufunc) -> Callable:
    def run(node: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        _same_dtype(node, a, b)
        return ufunc(a, b)
    return run


def div(node: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    _same_dtype(node, a, b)
    if a.dtype.kind in "iu":
        # ONNX integer division truncates toward zero; numpy's // floors.
        if np.any(b == 0):
            raise fail(node, "integer division by zero")
        # Through divmod, not |a| // |b|: the most negative integer has no absolute value.
        with np.errstate(over="ignore"):
            q, r = np.divmod(a, b)
        return (q + ((r != 0) & ((a < 0) != (b < 0))).astype(q.dtype)).astype(a.dtype)
    return np.divide(a, b)


def unary(fn) -> Callable:
    return lambda node, x: fn(x)


def clip(node: Node, x: np.ndarray, lo: np.ndarray | None = None, hi: np.ndarray | None = None):
    # Before opset 11 the bounds were attributes; an input, when given, wins.
    if lo is None and "min" in node.attrs:
        lo = np.asarray(node.attrs["min"], x.dtype)
    if hi is None and "max" in node.attrs:
        hi = np.asarray(node.attrs["max"], x.dtype)
    for bound in (lo, hi):
        if bound is not None and bound.size != 1:
            raise fail(node, f"bounds must be scalars, got shape {tuple(bound.shape)}")
    _same_dtype(node, x, lo, hi)
    y = x if lo is None else np.maximum(x, lo.reshape(()))
    y = y if hi is None else np.minimum(y, hi.reshape(()))
    return y if y is not x else x.copy()


def leaky_relu(node: Node, x: np.ndarray) -> np.ndarray:
    alpha = float(node.attrs.get("alpha", 0.01))
    return np.where(x >= 0, x, x * np.asarray(alpha, x.dtype))


def gelu(node: Node, x: np.ndarray) -> np.ndarray:
    # Opset 20 (the first with Gelu): exact by default, or the tanh approximation.
    approximate = node.attrs.get("approximate", "none")
    half = np.asarray(0.5, x.dtype)
    if approximate == "tanh":
        inner = np.asarray(math.sqrt(2 / math.pi), x.dtype) * (x + np.asarray(0.044715, x.dtype) * x ** 3)
        return half * x * (1 + np.tanh(inner))
    if approximate != "none":
        raise fail(node, f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return (half * x * (1 + erf(x / np.asarray(math.sqrt(2), x.dtype)))).astype(x.dtype, copy=False)


def batch_norm(node: Node, x, scale, bias, mean, var) -> np.ndarray:
    if int(node.attrs.get("training_mode", 0)) or any(node.outputs[1:]):
        raise Unhandled  # batch statistics and running-mean outputs
    if x.ndim < 2:
        raise fail(node, f"input rank {x.ndim} must be >= 2")
    _same_dtype(node, x, scale, bias, mean, var)
    c = x.shape[1]
    for label, p in (("scale", scale), ("B", bias), ("mean", mean), ("var", var)):
        if p.shape != (c,):
            raise fail(node, f"{label} has shape {tuple(p.shape)}, expected ({c},)")
    eps = np.asarray(float(node.attrs.get("epsilon", 1e-5)), x.dtype)
    shape = (1, c) + (1,) * (x.ndim - 2)
    factor = (scale / np.sqrt(var + eps)).reshape(shape)
    return (x - mean.reshape(shape)) * factor + bias.reshape(shape)


def softmax(node: Node, x: np.ndarray) -> np.ndarray:
    # Opset 13 semantics: normalize along one axis (the frontend accepts opset >= 13 only).
    axis = _axis(node, int(node.attrs.get("axis", -1)), x.ndim)
    if x.size == 0:  # nothing to normalize (max has no identity on an empty axis)
        return x.copy()
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# ---- linear algebra -----------------------------------------------------------------------

def gemm(node: Node, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    if a.ndim != 2 or b.ndim != 2:
        raise fail(node, f"A and B must be matrices, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    _same_dtype(node, a, b, c)
    a = a.T if int(node.attrs.get("transA", 0)) else a
    b = b.T if int(node.attrs.get("transB", 0)) else b
    if a.shape[1] != b.shape[0]:
        raise fail(node, f"inner dimensions differ: {tuple(a.shape)} x {tuple(b.shape)}")
    alpha = float(node.attrs.get("alpha", 1.0))
    y = (a @ b).astype(a.dtype, copy=False)  # bfloat16 products come back as float32
    if alpha != 1.0:
        y *= np.asarray(alpha, y.dtype)
    if c is not None:
        beta = float(node.attrs.get("beta", 1.0))
        y = y + (c if beta == 1.0 else c * np.asarray(beta, c.dtype))
        if y.shape != (a.shape[0], b.shape[1]):
            raise fail(node, f"C of shape {tuple(c.shape)} does not broadcast to {(a.shape[0], b.shape[1])}")
    return y


def matmul(node: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    _same_dtype(node, a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise fail(node, "MatMul inputs must have rank >= 1")
    # numpy computes ml_dtypes' bfloat16 and float8 products in float32; ONNX keeps the type.
    return np.matmul(a, b).astype(a.dtype, copy=False)


# ---- shape ops ----------------------------------------------------------------------------

def reshape(node: Node, x: np.ndarray, shape: np.ndarray) -> np.ndarray:
    if shape.ndim != 1 or shape.dtype.kind not in "iu":
        raise fail(node, f"shape must be a 1-D integer tensor, got {shape.dtype}{list(shape.shape)}")
    dims = [int(d) for d in shape]
    if not int(node.attrs.get("allowzero", 0)):
        for i, d in enumerate(dims):
            if d == 0:
                if i >= x.ndim:
                    raise fail(node, f"shape entry {i} is 0 but the input has rank {x.ndim}")
                dims[i] = x.shape[i]
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise fail(node, f"invalid target shape {dims}")
    known = math.prod(d for d in dims if d != -1)
    if (-1 in dims and (known == 0 or x.size % known)) or (-1 not in dims and known != x.size):
        raise fail(node, f"cannot reshape {tuple(x.shape)} to {dims}")
    return x.reshape(dims)


def flatten(node: Node, x: np.ndarray) -> np.ndarray:
    axis = int(node.attrs.get("axis", 1))
    if not -x.ndim <= axis <= x.ndim:
        raise fail(node, f"axis {axis} is out of range for rank {x.ndim}")
    axis = axis + x.ndim if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


def transpose(node: Node, x: np.ndarray) -> np.ndarray:
    perm = node.attrs.get("perm")
    perm = list(range(x.ndim))[::-1] if perm is None else [int(p) for p in perm]
    if sorted(perm) != list(range(x.ndim)):
        raise fail(node, f"perm {perm} is not a permutation of {x.ndim} axes")
    return x.transpose(perm)


def concat(node: Node, *xs: np.ndarray) -> np.ndarray:
    if "axis" not in node.attrs:
        raise fail(node, "missing required attribute 'axis'")
    _same_dtype(node, *xs)
    axis = _axis(node, int(node.attrs["axis"]), xs[0].ndim)
    return np.concatenate(xs, axis=axis)


def _axes_of(node: Node, axes: np.ndarray | None) -> list[int] | None:
    if axes is not None:
        return [int(a) for a in axes.reshape(-1)]
    return None if node.attrs.get("axes") is None else [int(a) for a in node.attrs["axes"]]


def squeeze(node: Node, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
    chosen = _axes_of(node, axes)
    if chosen is None:
        return x.reshape([d for d in x.shape if d != 1])
    chosen = [_axis(node, a, x.ndim) for a in chosen]
    if any(x.shape[a] != 1 for a in chosen):
        raise fail(node, f"cannot squeeze axes {chosen} of shape {tuple(x.shape)}")
    return np.squeeze(x, axis=tuple(chosen))


def unsqueeze(node: Node, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
    chosen = _axes_of(node, axes)
    if chosen is None:
        raise fail(node, "missing axes")
    rank = x.ndim + len(chosen)
    chosen = sorted(_axis(node, a, rank) for a in chosen)
    if len(set(chosen)) != len(chosen):
        raise fail(node, f"repeated axes {chosen}")
    return np.expand_dims(x, tuple(chosen))


def dropout(node: Node, x: np.ndarray, ratio: np.ndarray | None = None, training: np.ndarray | None = None):
    # Inference: the identity (a view, copied only if it becomes a graph output).
    if (training is not None and bool(training)) or any(node.outputs[1:]):
        raise Unhandled  # random masks and the mask output
    return x.view()


def cast(node: Node, x: np.ndarray) -> np.ndarray:
    from onnx.helper import tensor_dtype_to_np_dtype
    to = np.dtype(tensor_dtype_to_np_dtype(int(node.attrs["to"])))
    # numpy's own types only: float8/int4/bfloat16 (saturation, rounding) and strings (number
    # formatting) follow ONNX rules that astype does not.
    if not (numpy_native(x.dtype) and numpy_native(to)):
        raise Unhandled
    return x.astype(to)


def constant(node: Node) -> np.ndarray:
    for key, dtype in (("value", None), ("value_float", np.float32), ("value_floats", np.float32),
                       ("value_int", np.int64), ("value_ints", np.int64)):
        if key in node.attrs:
            return np.array(node.attrs[key], dtype=dtype)
    raise fail(node, "needs one of the attributes value, value_float(s), value_int(s)")


def shape(node: Node, x: np.ndarray) -> np.ndarray:
    return np.array(x.shape, np.int64)[node.attrs.get("start"):node.attrs.get("end")]


def gather(node: Node, x: np.ndarray, indices: np.ndarray) -> np.ndarray:
    axis = _axis(node, int(node.attrs.get("axis", 0)), x.ndim)
    n = x.shape[axis]
    if not np.issubdtype(indices.dtype, np.integer) or np.any((indices < -n) | (indices >= n)):
        raise fail(node, f"indices out of range for axis {axis} of size {n}")
    return np.take(x, np.where(indices < 0, indices + n, indices), axis=axis)


def gather_elements(node: Node, x: np.ndarray, indices: np.ndarray) -> np.ndarray:
    # onnx.reference's goes through np.choose, which takes at most 64 choices along the axis
    # (BERT's token-type table is read along an axis of 512).
    axis = _axis(node, int(node.attrs.get("axis", 0)), x.ndim)
    n = x.shape[axis]
    if not np.issubdtype(indices.dtype, np.integer) or indices.ndim != x.ndim:
        raise fail(node, f"indices must be integers of rank {x.ndim}")
    if any(i > d for k, (i, d) in enumerate(zip(indices.shape, x.shape)) if k != axis):
        raise fail(node, f"indices of shape {indices.shape} reach past data of shape {x.shape}")
    if np.any((indices < -n) | (indices >= n)):
        raise fail(node, f"indices out of range for axis {axis} of size {n}")
    region = tuple(slice(0, i) if k != axis else slice(None) for k, i in enumerate(indices.shape))
    return np.take_along_axis(x[region], np.where(indices < 0, indices + n, indices), axis=axis)


def variadic(ufunc) -> Callable:
    def run(node: Node, *xs: np.ndarray) -> np.ndarray:
        _same_dtype(node, *xs)
        y = xs[0]
        for x in xs[1:]:
            y = ufunc(y, x)
        return y if len(xs) > 1 else y.copy()
    return run


def mean(node: Node, *xs: np.ndarray) -> np.ndarray:
    total = variadic(np.add)(node, *xs)
    return (total / len(xs)).astype(total.dtype)


def pow_(node: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.power(a, b.astype(a.dtype)).astype(a.dtype, copy=False)


def _special():
    # scipy.special is slow to import, and most graphs never call it.
    import scipy.special

    return scipy.special


def expit(x: np.ndarray) -> np.ndarray:
    return _special().expit(x)


def erf(x: np.ndarray) -> np.ndarray:
    return _special().erf(x)


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, np.zeros((), x.dtype))


def view(x: np.ndarray) -> np.ndarray:
    # A view, so the interpreter copies it only if it becomes a graph output.
    return x.view()


# ---- random -------------------------------------------------------------------------------

def _generator(node: Node) -> np.random.Generator:
    """A numpy Generator seeded from the node's `seed` (a float attribute): a whole non-negative
    seed is the generator's seed itself, any other (fractional, negative) is taken by its bits;
    without one, fresh entropy, so two runs differ."""
    seed = node.attrs.get("seed")
    if seed is None:
        return np.random.default_rng()
    seed = float(seed)
    if seed.is_integer() and seed >= 0:
        return np.random.default_rng(int(seed))
    return np.random.default_rng(int(np.float64(seed).view(np.uint64)))


def multinomial(node: Node, x: np.ndarray) -> np.ndarray:
    """[batch, class_size] unnormalized log-probabilities -> [batch, sample_size] class indices.
    As ONNX Runtime draws them: a row's classes with a non-finite logit (-inf mostly) have
    probability 0, the others exp(logit - the row's largest finite logit) normalized; each sample
    is the first class whose running total exceeds a uniform draw scaled to the row's total."""
    from onnx import TensorProto

    dtype = int(node.attrs.get("dtype", TensorProto.INT32))
    if dtype not in (TensorProto.INT32, TensorProto.INT64):
        raise fail(node, f"dtype must be int32 (6) or int64 (7), got {dtype}")
    samples = int(node.attrs.get("sample_size", 1))
    if samples < 1:
        raise fail(node, f"sample_size must be at least 1, got {samples}")
    if x.ndim != 2:
        raise fail(node, f"input must be [batch_size, class_size], got rank {x.ndim}")
    if x.dtype.kind != "f":
        raise fail(node, f"input must hold floats (log-probabilities), got {x.dtype}")
    batch, classes = x.shape
    if classes == 0 and batch:
        raise fail(node, "class_size is 0: no class to draw")
    logits = x.astype(np.float64)
    finite = np.isfinite(logits)
    empty = ~finite.any(axis=1)
    if empty.any():
        raise fail(node, f"row {int(np.argmax(empty))} has no class with a finite log-probability")
    top = np.where(finite, logits, -np.inf).max(axis=1, keepdims=True) if batch else logits
    weights = np.where(finite, np.exp(logits - top), 0.0)
    cdf = np.cumsum(weights, axis=1)
    out = np.empty((batch, samples), np.int32 if dtype == TensorProto.INT32 else np.int64)
    rng = _generator(node)
    for b in range(batch):
        targets = rng.random(samples) * cdf[b, -1]
        # Rounding may put a target at the total: it belongs to the last class that can be drawn.
        drawn = np.searchsorted(cdf[b], targets, side="right")
        out[b] = np.minimum(drawn, int(np.flatnonzero(weights[b])[-1]))
    return out


# ---- scatter ------------------------------------------------------------------------------

def scatter_elements(node: Node, data: np.ndarray, indices: np.ndarray, updates: np.ndarray) -> np.ndarray:
    """ScatterElements without a reduction, which is Scatter (opsets 9 and 10) under its new name
    from opset 11: a copy of data with updates[i, j...] written at indices[i, j...] along `axis`
    and at (i, j...) along the others."""
    axis = _axis(node, int(node.attrs.get("axis", 0)), data.ndim)
    _same_dtype(node, data, updates)
    if indices.dtype not in (np.int32, np.int64):
        raise fail(node, f"indices must be int32 or int64, got {indices.dtype}")
    if indices.shape != updates.shape:
        raise fail(node, f"indices of shape {tuple(indices.shape)} and updates of shape {tuple(updates.shape)} "
                         "must have one shape")
    if indices.ndim != data.ndim:
        raise fail(node, f"indices must have the rank of data ({data.ndim}), got {indices.ndim}")
    if any(i > d for k, (i, d) in enumerate(zip(indices.shape, data.shape)) if k != axis):
        raise fail(node, f"indices of shape {tuple(indices.shape)} reach past data of shape {tuple(data.shape)}")
    n = data.shape[axis]
    if np.any((indices < -n) | (indices >= n)):
        raise fail(node, f"indices out of range for axis {axis} of size {n}")
    out = data.copy()
    region = tuple(slice(0, i) if k != axis else slice(None) for k, i in enumerate(indices.shape))
    # A basic slice is a view: writing into it writes into out.
    np.put_along_axis(out[region], np.where(indices < 0, indices + n, indices).astype(np.int64), updates, axis)
    return out
