"""Rule checking, drawing quantized values: QuantizeLinear and DequantizeLinear take positive
scales and zero points within their integer type, per tensor or along one axis, which the
generic drawing (any float, small integers) does not give. A mixin of the Planner."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from saturate.core.errors import SaturateError
from saturate.lang.ast import OpTerm, Var

# Scales drawn: powers of two (exact products), ordinary steps and one large one.
_SCALES = (0.5, 0.25, 1.0, 0.1, 0.02, 0.05, 2.0, 0.3, 0.0078125, 4.0)
# Attributes a quantization node is drawn without: block quantization, float8 saturation and
# output types belong to other dtypes than those drawn here.
_OMITTED = ("block_size", "saturate", "output_dtype", "precision")


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
        if same in self.forced and self.forced[same].shape == tuple(shape) and self.draw(st.integers(0, 3)):
            self.forced[v.name] = self.forced[same].copy()
            return
        dtype = np.dtype(self.dtypes.get(v.name, "float32" if what == "scale" else "uint8"))
        n = int(np.prod(shape, dtype=np.int64))
        if what == "scale":
            values = [self.draw(st.sampled_from(_SCALES)) for _ in range(n)]
        else:
            if dtype.kind not in "iu":
                assume(False)
            info = np.iinfo(dtype)
            lowest = self.hints.get(v.name, {}).get("lowest") and self.draw(st.integers(0, 3))
            picks = st.sampled_from([0, int(info.min), 1, -1 if info.min < 0 else 128, 3, int(info.max)])
            values = [int(info.min) if lowest else max(int(info.min), min(int(info.max), self.draw(picks)))
                      for _ in range(n)]
        self.forced[v.name] = np.array(values, dtype).reshape(shape)
