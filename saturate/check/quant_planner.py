"""Rule checking, drawing quantized values: QuantizeLinear and DequantizeLinear take positive
scales and zero points within their integer type, per tensor or along one axis, which the
generic drawing (any float, small integers) does not give. A mixin of the Planner."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from saturate.core.errors import SaturateError
from saturate.check.schema import is_exotic, np_dtype
from saturate.check.strategies import MAX_SIDE, conv_cases, conv_cases_over, draw_broadcastable
from saturate.lang.ast import OpTerm, Var

# Scales drawn: powers of two (exact products), ordinary steps and one large one.
_SCALES = (0.5, 0.25, 1.0, 0.1, 0.02, 0.05, 2.0, 0.3, 0.0078125, 4.0)
# Attributes a quantization node is drawn without: block quantization and output types (the
# zero point's type is drawn instead). Float8's `saturate` is drawn from the schema.
_OMITTED = ("block_size", "output_dtype", "precision")
# Attributes of a Conv's geometry a pattern may fix.
_GEOMETRY = ("group", "kernel_shape", "strides", "pads", "dilations")


class QuantPlanning:
    """Planner methods for the quantization ops (the Planner provides draw, term, bind...)."""

    def op_QuantizeLinear(self: Any, t: OpTerm, out: tuple[int, ...], path: tuple[int, ...]) -> None:
        self.quantization(t, out, path)

    def op_DequantizeLinear(self: Any, t: OpTerm, out: tuple[int, ...], path: tuple[int, ...]) -> None:
        self.quantization(t, out, path)

    def quantization(self: Any, t: OpTerm, out: tuple[int, ...], path: tuple[int, ...]) -> None:
        rank = len(out)
        draws = {key: (lambda _: None) for key in _OMITTED}
        # Per axis from opset 13; axis 0 and 1 (a conv's output channels, a matrix's columns) first.
        draws["axis"] = lambda _: (self.draw(st.sampled_from([0, 1, -1] + list(range(-rank, rank))))
                                   if rank and self.opset >= 13 else None)
        attrs = self.attributes(t, path, draws)
        assume(not attrs.get("block_size"))
        self.term(t.args[0], out, path + (0,))
        axis = attrs.get("axis")
        axis = 1 if axis is None else int(axis)
        per_axis = self.opset >= 13 and rank and -rank <= axis < rank and self.draw(st.integers(0, 2)) == 2
        shape = (out[axis % rank],) if per_axis else self.draw(st.sampled_from([(), (1,)]))
        # A scale drawn as a copy of another (same_quant) takes its shape too, where it fits here.
        same = self.hints.get(getattr(t.args[1], "name", None), {}).get("same_as") if len(t.args) > 1 else None
        if same in self.forced and self.forced[same].size in (1, out[axis % rank] if rank else 1):
            copied = self.forced[same].shape
            if copied in ((), (1,)) or (rank and copied == (out[axis % rank],)):
                shape = copied
        if len(t.args) > 1:
            self.quant_param(t.args[1], shape, "scale")
        if len(t.args) > 2:
            self.quant_param(t.args[2], shape, "zero point")

    def quant_param(self: Any, v: Any, shape: tuple[int, ...], what: str) -> None:
        if not isinstance(v, Var):
            raise SaturateError(f"the checker needs a quantization {what} to be a variable")
        self.bind(v, shape)
        if v.name in self.forced:
            return
        same = self.hints.get(v.name, {}).get("same_as")
        dtype = np_dtype(self.dtypes.get(v.name, "float32" if what == "scale" else "uint8"))
        if same in self.forced and self.forced[same].shape == tuple(shape) and self.forced[same].dtype == dtype \
                and self.draw(st.integers(0, 3)):
            self.forced[v.name] = self.forced[same].copy()
            return
        n = int(np.prod(shape, dtype=np.int64))
        if what == "scale":
            values = [self.draw(st.sampled_from(_SCALES)) for _ in range(n)]
        else:
            if is_exotic(dtype) and dtype.name not in ("int4", "uint4"):
                # float8: 0, the only zero point ONNX allows for it (its reference refuses others).
                self.forced[v.name] = np.zeros(shape, dtype)
                return
            if dtype.kind not in "iu" and not is_exotic(dtype):
                assume(False)
            info = ml_dtypes.iinfo(dtype) if is_exotic(dtype) else np.iinfo(dtype)
            lowest = self.hints.get(v.name, {}).get("lowest") and self.draw(st.integers(0, 3))
            picks = st.sampled_from([0, int(info.min), 1, -1 if info.min < 0 else 128, 3, int(info.max)])
            values = [int(info.min) if lowest else max(int(info.min), min(int(info.max), self.draw(picks)))
                      for _ in range(n)]
        self.forced[v.name] = np.array(values, dtype).reshape(shape)

    # ---- the integer forms of Conv and MatMul (drawn by the generic rule, generic_planner) -------

    def zero_point(self: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        """Zero points within their integer type: 0, the type's ends and values between."""
        info = np.iinfo(np.dtype(dtype))
        picks = st.sampled_from([0, int(info.min), 1, -1 if info.min < 0 else 128, 3, int(info.max)])
        n = int(np.prod(shape, dtype=np.int64))
        return np.array([self.draw(picks) for _ in range(n)], dtype).reshape(shape)

    def scale(self: Any, shape: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod(shape, dtype=np.int64))
        return np.array([self.draw(st.sampled_from(_SCALES)) for _ in range(n)], np.float32).reshape(shape)

    def quant_conv(self: Any, fixed: dict, x: tuple | None, out: tuple | None) -> Any:
        """A Conv's geometry over 1, 2 or 3 spatial axes (2 first), every auto_pad mode now and
        then; from the input `x` or to the output `out` when either is drawn already."""
        geometry = {k: fixed[k] for k in _GEOMETRY if k in fixed}
        if out is None:
            n_sp = len(x) - 2 if x is not None else self.draw(st.sampled_from([2, 1, 3]))
            assume(n_sp >= 1)
            out = ((x[0],) if x is not None else (self.draw(st.integers(1, 2)),)) + (self.draw(st.integers(1, 3)),) + \
                tuple(self.draw(st.integers(1, x[2 + i] if x is not None else 3)) for i in range(n_sp))
            auto = fixed.get("auto_pad") or self.draw(st.sampled_from(["NOTSET"] * 3 + ["SAME_UPPER", "SAME_LOWER",
                                                                                     "VALID"]))
        else:
            assume(len(out) >= 3)
            auto = fixed.get("auto_pad") or "NOTSET"    # explicit pads give the output asked
        case = self.draw(conv_cases(out, geometry) if x is None else conv_cases_over(out, x, geometry))
        attrs = {**case.attrs, "auto_pad": auto}
        if auto != "NOTSET":
            attrs["pads"] = None
        return case, {**attrs, **fixed}

    def fit_ConvInteger(self: Any, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> tuple:
        # x (N, C, ...), w (M, C / group, kernel...); x's zero point one value, w's one or one
        # per output channel.
        case, attrs = self.quant_conv(fixed, known.get(0), out)
        values = {}
        if len(t.args) > 2:
            values[2] = self.zero_point(self.arg_dtype(t, path, 2), self.draw(st.sampled_from([(), (1,)])))
        if len(t.args) > 3:
            m = case.w_shape[0]
            values[3] = self.zero_point(self.arg_dtype(t, path, 3), self.draw(st.sampled_from([(), (m,), (1,)])))
        return {0: case.x_shape, 1: case.w_shape}, values, attrs

    def fit_QLinearConv(self: Any, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> tuple:
        # x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point[, B]: the
        # scales positive, w's per tensor or per output channel, the bias one int32 per channel.
        case, attrs = self.quant_conv(fixed, known.get(0), out)
        m = case.w_shape[0]
        w_shape = self.draw(st.sampled_from([(), (m,), (1,)]))
        values = {1: self.scale(()), 2: self.zero_point(self.arg_dtype(t, path, 2), ()),
                  4: self.scale(w_shape), 5: self.zero_point(self.arg_dtype(t, path, 5), w_shape),
                  6: self.scale(()), 7: self.zero_point(self.arg_dtype(t, path, 7), ())}
        shapes = {0: case.x_shape, 3: case.w_shape}
        if len(t.args) > 8:
            shapes[8] = (m,)
        return shapes, {k: v for k, v in values.items() if k < len(t.args)}, attrs

    def quant_matmul(self: Any, known: dict, b_at: int, out: tuple | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Shapes of a and b (argument b_at) for a (batched, broadcast) matrix product, 1-D now
        and then; an operand drawn already, or the output asked, keeps its sides."""
        m, k, n = (self.draw(st.integers(1, MAX_SIDE)) for _ in range(3))
        batch = tuple(self.draw(st.integers(1, 3)) for _ in range(self.draw(st.sampled_from([0, 0, 1, 2]))))
        a, b = known.get(0), known.get(b_at)
        if out is not None and len(out) >= 2 and a is None and b is None:
            batch, (m, n) = tuple(out[:-2]), out[-2:]
        if a is None:
            a = batch + (m, k) if b is not None or out is not None or self.draw(st.integers(0, 7)) else (k,)
            if b is not None:
                assume(len(b) >= 2)
                a = draw_broadcastable(self.draw, tuple(b[:-2])) + (m, b[-2])
        if b is None:
            assume(len(a) >= 1)
            b = draw_broadcastable(self.draw, tuple(a[:-2]) if len(a) > 2 else batch) + (a[-1], n)
        return tuple(a), tuple(b)

    def fit_MatMulInteger(self: Any, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> tuple:
        # A 1-D zero point runs along a's rows and b's columns.
        a, b = self.quant_matmul(known, 1, out)
        values = {}
        if len(t.args) > 2:
            rows = [(), (1,)] + ([(a[-2],)] if len(a) >= 2 else [])
            values[2] = self.zero_point(self.arg_dtype(t, path, 2), self.draw(st.sampled_from(rows)))
        if len(t.args) > 3:
            values[3] = self.zero_point(self.arg_dtype(t, path, 3), self.draw(st.sampled_from([(), (1,), (b[-1],)])))
        return {0: a, 1: b}, values, fixed

    def fit_QLinearMatMul(self: Any, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> tuple:
        # a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point: b's scale
        # and zero point per tensor or per column.
        a, b = self.quant_matmul(known, 3, out)
        b_shape = self.draw(st.sampled_from([(), (1,), (b[-1],)]))
        values = {1: self.scale(()), 2: self.zero_point(self.arg_dtype(t, path, 2), ()),
                  4: self.scale(b_shape), 5: self.zero_point(self.arg_dtype(t, path, 5), b_shape),
                  6: self.scale(()), 7: self.zero_point(self.arg_dtype(t, path, 7), ())}
        return {0: a, 3: b}, values, fixed
