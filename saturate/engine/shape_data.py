"""Facts about e-classes, the elements of shape computations: a small integer value computed
from shapes (Shape, Gather, Slice, Concat, Unsqueeze, Where...) read element by element, each an
int or a dim symbol, so that rules can decide Reshape targets and the like over symbolic dims.
A mixin of Facts (which provides dims, value, info, the view and the encoding)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from saturate.core.ir import ValueInfo
from saturate.engine.egraph import ENode
from saturate.frontend.infer import DATA_ELEMENTS
from saturate.lang.builtins import CONST_FUNCS


class ShapeData:
    """Facts' reading of shape computations (see the module's docstring)."""

    def data(self, cls: Any) -> tuple | None:
        """The elements of a small integer value of rank 0 or 1 computed from shapes (Shape,
        Gather, Slice, Concat, Unsqueeze...), each an int or a dim symbol as `dims` spells it;
        None when they cannot be told."""
        got = self.tensor_data(cls)
        return None if got is None or len(got[0]) > 1 else got[1]

    def tensor_data(self, cls: Any) -> tuple[tuple[int, ...], tuple] | None:
        """Shape and row-major elements of a small integer value of any rank, as `data` reads
        them (exporters reverse pads through a [n, 2] Reshape, a Slice and a Transpose)."""
        if not hasattr(self, "_data"):
            self._data: dict[Any, tuple | None] = {}
        if cls in self._data:
            return self._data[cls]
        self._data[cls] = None                      # a cycle reads as unknown
        result = None
        v = self.value(cls) if cls in self.view.consts else None
        if v is not None:
            a = np.asarray(v)
            if (np.issubdtype(a.dtype, np.integer) or a.dtype == bool) and a.size <= DATA_ELEMENTS:
                result = (tuple(a.shape), tuple(int(x) for x in a.ravel()))
        else:
            info = self.info(cls)
            if info.dtype.startswith(("int", "uint")) or info.dtype in ("unknown", "bool"):
                for node in self.view.classes.get(cls, ()):
                    op_node = self._op_of(node)
                    if op_node is None:
                        continue
                    try:
                        got = self._node_data(*op_node, info.shape)
                    except (ValueError, TypeError, IndexError, KeyError, OverflowError):
                        got = None          # a bound or axis out of range: nothing is told
                    result = got if result is None else _better_data(result, got)
            if result is None and small_ints(info):
                # Elements nobody can tell still count: each is a symbol of its own.
                result = (tuple(info.shape), tuple(("elem", cls, k) for k in range(math.prod(info.shape))))
        self._data[cls] = result
        return result

    def _op_of(self, node: ENode) -> tuple[str, dict, tuple] | None:
        """Op, attributes and input e-classes of an op e-node, or of the first output of an
        opaque node (the int64 Equal and Where of an exporter's shape arithmetic are opaque)."""
        if node.kind == "op":
            return node.head, self.enc.attr_sets[node.key][1], node.children
        opaque = self._opaque_of(node) if node.key == 0 else None
        if opaque is not None and opaque[0].domain in ("", "ai.onnx"):
            return opaque[0].op, opaque[0].attrs, opaque[1].children
        return None

    def _node_data(self, op: str, attrs: dict, kids: tuple, out_shape: tuple | None) -> tuple | None:
        """Shape and elements one e-node gives its class (whose static shape is `out_shape`).
        Ops that only move elements are applied to an array of element positions, then the
        positions are read back."""
        if op == "Shape":
            dims = self.dims(kids[0])
            if dims is None:
                return None
            picked = dims[attrs.get("start", 0) or 0:attrs.get("end")]
            return (len(picked),), picked
        first = self.tensor_data(kids[0])
        if first is None:
            return None
        shape, elements = first
        index = np.arange(len(elements)).reshape(shape)
        consts = [self.value(c) if c in self.view.consts else None for c in kids[1:]]
        if op in ("Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze"):
            # The elements keep their order; the shape is the class's own, once known.
            if out_shape is None or not all(isinstance(d, int) for d in out_shape) \
                    or math.prod(out_shape) != len(elements):
                return None
            return tuple(out_shape), elements
        if op == "Cast":
            return first if np.issubdtype(_np_type(attrs.get("to")), np.integer) else None
        if op == "Concat":
            parts = [self.tensor_data(c) for c in kids]
            if any(p is None for p in parts):
                return None
            offsets = np.cumsum([0] + [len(p[1]) for p in parts])
            joined = np.concatenate([np.arange(len(p[1])).reshape(p[0]) + o for p, o in zip(parts, offsets)],
                                    axis=int(attrs.get("axis", 0)))
            return _pick(sum((p[1] for p in parts), ()), joined)
        if op == "Gather" and consts and consts[0] is not None:
            return _pick(elements, np.take(index, np.asarray(consts[0]), axis=int(attrs.get("axis", 0))))
        if op == "Transpose":
            perm = attrs.get("perm")
            return _pick(elements, np.transpose(index, None if perm is None else [int(p) for p in perm]))
        if op == "Slice" and all(c is not None for c in consts):
            return _pick(elements, CONST_FUNCS["slice"].impl(index, *consts, *[None] * (4 - len(consts))))
        if op == "ConstantOfShape":
            value = np.asarray(attrs.get("value", np.zeros(1, np.float32))).ravel()
            if value.size != 1 or not (np.issubdtype(value.dtype, np.integer) or value.dtype == bool) \
                    or not all(isinstance(d, int) and d >= 0 for d in elements) or len(shape) != 1:
                return None
            return tuple(elements), (int(value[0]),) * math.prod(elements)
        if op == "Where" and len(kids) == 3:
            picks = [self.tensor_data(c) for c in kids[1:]]
            if any(p is None for p in picks):
                return None
            cond, a, b = np.broadcast_arrays(index, *(np.arange(len(p[1])).reshape(p[0]) for p in picks))
            out = []
            for c, i, j in zip(cond.ravel(), a.ravel(), b.ravel()):
                if not isinstance(elements[c], int):
                    return None
                out.append(picks[0][1][i] if elements[c] else picks[1][1][j])
            return tuple(cond.shape), tuple(out)
        if op in ("Add", "Sub", "Mul", "Div", "Mod", "Equal") and len(kids) == 2:
            other = self.tensor_data(kids[1])
            if other is None:
                return None
            a, b = np.broadcast_arrays(index, np.arange(len(other[1])).reshape(other[0]))
            if op == "Equal":
                return tuple(a.shape), tuple(_equal(elements[i], other[1][j]) for i, j in zip(a.ravel(), b.ravel()))
            impl = CONST_FUNCS[op.lower()].impl
            fmod = int(attrs.get("fmod", 0))
            fn = (lambda x, y: impl(x, y, fmod)) if op == "Mod" else impl
            out = []
            for i, j in zip(a.ravel(), b.ravel()):
                x, y = elements[i], other[1][j]
                known = isinstance(x, int) and isinstance(y, int) and not (op in ("Div", "Mod") and y == 0)
                out.append(int(fn(np.int64(x), np.int64(y))) if known else ("elem", op, x, y))
            return tuple(a.shape), tuple(out)
        return None


def _equal(x: Any, y: Any) -> Any:
    """Equal of two elements as `data` reads them: known when both are numbers, when they are
    one symbol, or when one is a dim (never negative) and the other a negative number."""
    if isinstance(x, int) and isinstance(y, int):
        return int(x == y)
    if x == y:
        return 1
    if (_is_dim(x) and isinstance(y, int) and y < 0) or (_is_dim(y) and isinstance(x, int) and x < 0):
        return 0
    return ("elem", "Equal", x, y)


def _is_dim(x: Any) -> bool:
    return isinstance(x, str) or (isinstance(x, tuple) and len(x) == 3 and x[0] == "dim")


def small_ints(info: ValueInfo) -> bool:
    """Whether a value of this type is a small integer tensor of known shape (rank 0 or 1)."""
    return (info.shape is not None and len(info.shape) <= 1 and all(isinstance(d, int) for d in info.shape)
            and info.dtype.startswith(("int", "uint")) and math.prod(info.shape) <= DATA_ELEMENTS)


def _pick(elements: tuple, index: Any) -> tuple[tuple[int, ...], tuple] | None:
    """Shape and elements of an array of positions into `elements` (negative ones count from
    the end)."""
    idx = np.asarray(index)
    if not np.issubdtype(idx.dtype, np.integer) or np.any((idx < -len(elements)) | (idx >= len(elements))):
        return None
    return tuple(idx.shape), tuple(elements[int(k)] for k in idx.ravel())


def _np_type(to: Any) -> Any:
    from onnx.helper import tensor_dtype_to_np_dtype

    try:
        return np.dtype(tensor_dtype_to_np_dtype(int(to)))
    except (TypeError, ValueError, KeyError):
        return np.dtype(object)


def _better_data(a: tuple, b: tuple | None) -> tuple:
    """Of two readings of one value (shape, elements), element by element the known one."""
    if b is None or a[0] != b[0]:
        return a
    return a[0], tuple(x if isinstance(x, int) or not isinstance(y, int) else y for x, y in zip(a[1], b[1]))
