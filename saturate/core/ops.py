"""Op facts: arity, attribute names and defaults from the ONNX schemas (`onnx.defs`), per opset.

The schemas are the one source of what an op takes. The project adds two facts of its own that
no schema states: which ops are elementwise (the output is the broadcast of the inputs, which the
engine's shape facts rely on) and which ops carry integer shape data often enough to be open to
rules whatever their dtype.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx.defs

# Variadic inputs (Concat, Sum, Max...) have no upper bound; this stands for "any number".
VARIADIC = 1 << 30

# The output shape is the multidirectional broadcast of the inputs (unary ops: the input's shape).
ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mod", "Relu", "Clip", "LeakyRelu", "Sigmoid",
    "Tanh", "Erf", "Neg", "Sqrt", "Reciprocal", "Identity", "Exp", "Log", "Abs", "HardSigmoid",
    "HardSwish", "Softplus", "Elu", "Selu", "Gelu", "Floor", "Ceil", "Sign", "PRelu",
})
# The first output has the first input's shape and dtype (normalizations, softmaxes, Dropout's
# output), whatever the other inputs are.
SAME_SHAPE = frozenset({
    "BatchNormalization", "LayerNormalization", "InstanceNormalization", "GroupNormalization",
    "LpNormalization", "MeanVarianceNormalization", "Softmax", "LogSoftmax", "Hardmax", "Dropout",
})
# Shape computations (Shape -> Gather -> Concat -> Reshape, and the int64 arithmetic exporters put
# between: Add/Sub/Mul/Div of dims feeding Slice and Reshape) carry int64 data as often as floats.
# Rules over these ops see integers too: a rule sound only on floats carries the `floating` guard.
SHAPE_OPS = frozenset({"Concat", "Shape", "Gather", "Unsqueeze", "Squeeze", "Cast", "CastLike",
                       "Add", "Sub", "Mul", "Div", "Neg", "Slice", "Expand", "Range",
                       "ConstantOfShape", "Reshape", "Identity", "Mod", "Pad", "Transpose"})
# Quantization makes integer tensors: rules over these ops (rules/quant.rules) see int8/uint8 values.
QUANT_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul",
                       "ConvInteger", "MatMulInteger"})
# The ops the engine encodes as rewritable terms even when no rule names them.
ENGINE_OPS = frozenset({
    "Conv", "BatchNormalization", "Add", "Sub", "Mul", "Div", "Relu", "Clip", "LeakyRelu", "Sigmoid",
    "Tanh", "Erf", "Neg", "Sqrt", "Reciprocal", "MaxPool", "AveragePool", "GlobalAveragePool", "Gemm",
    "MatMul", "Reshape", "Flatten", "Transpose", "Concat", "Shape", "Gather", "Unsqueeze", "Squeeze",
    "Cast", "Softmax", "Identity",
})


@dataclass(frozen=True)
class OpSpec:
    """What the project knows of one op at one opset: input counts and attributes with defaults."""

    name: str
    min_inputs: int
    max_inputs: int
    attrs: dict[str, Any] = field(default_factory=dict)  # name -> default (None: required or none)
    since_version: int = 1
    elementwise: bool = False
    # Open to rules whatever its dtype (shape arithmetic), not only on floats.
    any_dtype: bool = False


def newest_opset() -> int:
    """The newest default-domain opset the installed onnx package defines."""
    return onnx.defs.onnx_opset_version()


def _default(attr: onnx.defs.OpSchema.Attribute) -> Any:
    if not attr.default_value.name:
        return None
    value = onnx.helper.get_attribute_value(attr.default_value)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, float):
        # Schemas store float32; the shortest decimal that round-trips reads as written (1e-05).
        return float(str(np.float32(value)))
    return value


def _from_schema(s: onnx.defs.OpSchema) -> OpSpec:
    hi = VARIADIC if s.max_input >= 2**31 - 1 else s.max_input
    return OpSpec(s.name, s.min_input, hi, {k: _default(a) for k, a in s.attributes.items()},
                  s.since_version, s.name in ELEMENTWISE, s.name in SHAPE_OPS | QUANT_OPS)


@functools.lru_cache(maxsize=None)
def spec(op: str, opset: int | None = None, domain: str = "") -> OpSpec | None:
    """The spec of a default-domain op at `opset` (default: the newest), or None if ONNX has none."""
    if domain not in ("", "ai.onnx"):
        return None
    try:
        return _from_schema(onnx.defs.get_schema(op, opset or newest_opset(), ""))
    except onnx.defs.SchemaError:
        return None


@functools.lru_cache(maxsize=None)
def op_table() -> dict[str, OpSpec]:
    """Every default-domain op of every version, merged: the widest input range and the union of
    attribute names (defaults from the newest version), which rules are checked against, since a
    rule may match the attribute form of an older opset (Squeeze's `axes` before 13)."""
    merged: dict[str, OpSpec] = {}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain not in ("", "ai.onnx") or s.deprecated:
            continue
        new = _from_schema(s)
        old = merged.get(s.name)
        if old is None:
            merged[s.name] = new
            continue
        newer, older = (new, old) if new.since_version > old.since_version else (old, new)
        merged[s.name] = OpSpec(s.name, min(old.min_inputs, new.min_inputs), max(old.max_inputs, new.max_inputs),
                                {**older.attrs, **newer.attrs}, newer.since_version, newer.elementwise,
                                newer.any_dtype)
    return merged


def is_rewritable_op(op: str) -> bool:
    """Whether the engine encodes this op as a term rules can rewrite even when no rule names it."""
    return op in ENGINE_OPS
