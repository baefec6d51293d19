"""Op vocabulary: the ONNX ops the project knows, with arity and attribute defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OpSpec:
    """What the project knows of one op: how many inputs it takes and its attributes."""

    name: str
    min_inputs: int
    max_inputs: int
    attrs: dict[str, Any] = field(default_factory=dict)  # name -> default (None: required/none)
    elementwise: bool = False
    # Shape ops carry int64 shape data as often as floats: open to rules whatever their dtype.
    any_dtype: bool = False


_SPECS = [
    OpSpec("Conv", 2, 3, {"auto_pad": "NOTSET", "dilations": None, "group": 1,
                          "kernel_shape": None, "pads": None, "strides": None}),
    OpSpec("BatchNormalization", 5, 5, {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0}),
    OpSpec("Add", 2, 2, elementwise=True),
    OpSpec("Sub", 2, 2, elementwise=True),
    OpSpec("Mul", 2, 2, elementwise=True),
    OpSpec("Div", 2, 2, elementwise=True),
    OpSpec("Relu", 1, 1, elementwise=True),
    OpSpec("Clip", 1, 3, elementwise=True),
    OpSpec("LeakyRelu", 1, 1, {"alpha": 0.01}, elementwise=True),
    OpSpec("Sigmoid", 1, 1, elementwise=True),
    OpSpec("Tanh", 1, 1, elementwise=True),
    OpSpec("Erf", 1, 1, elementwise=True),
    OpSpec("Neg", 1, 1, elementwise=True),
    OpSpec("Sqrt", 1, 1, elementwise=True),
    OpSpec("Reciprocal", 1, 1, elementwise=True),
    OpSpec("MaxPool", 1, 1, {"auto_pad": "NOTSET", "ceil_mode": 0, "dilations": None,
                             "kernel_shape": None, "pads": None, "storage_order": 0, "strides": None}),
    OpSpec("AveragePool", 1, 1, {"auto_pad": "NOTSET", "ceil_mode": 0, "count_include_pad": 0,
                                 "dilations": None, "kernel_shape": None, "pads": None, "strides": None}),
    OpSpec("GlobalAveragePool", 1, 1),
    OpSpec("Gemm", 2, 3, {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}),
    OpSpec("MatMul", 2, 2),
    OpSpec("Reshape", 2, 2, {"allowzero": 0}),
    OpSpec("Flatten", 1, 1, {"axis": 1}),
    OpSpec("Transpose", 1, 1, {"perm": None}),
    OpSpec("Concat", 1, 1 << 30, {"axis": None}, any_dtype=True),
    OpSpec("Shape", 1, 1, {"start": 0, "end": None}, any_dtype=True),
    OpSpec("Gather", 2, 2, {"axis": 0}, any_dtype=True),
    OpSpec("Unsqueeze", 1, 2, {"axes": None}, any_dtype=True),
    OpSpec("Squeeze", 1, 2, {"axes": None}, any_dtype=True),
    OpSpec("Cast", 1, 1, {"to": None, "saturate": 1}, any_dtype=True),
    OpSpec("Softmax", 1, 1, {"axis": -1}),
    OpSpec("Identity", 1, 1, elementwise=True),
]

OPS: dict[str, OpSpec] = {s.name: s for s in _SPECS}


def spec(op: str) -> OpSpec | None:
    """The spec of a known op, or None for an op the project keeps opaque."""
    return OPS.get(op)
