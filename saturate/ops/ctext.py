"""Op registry, C text: the literals and constant reads the C backend's op hooks write."""

from __future__ import annotations

import math

import numpy as np

from saturate.core.errors import SaturateError
from saturate.core.ir import Node


def c_float(x: float) -> str:
    """A C float literal for x (inf and nan spelled with math.h macros)."""
    x = float(np.float32(x))
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    return f"{x!r}f"


def text(value) -> str:
    """A string attribute as text (ONNX stores them as bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _const_scalar(graph, node: Node, value: str, default: float) -> float:
    if not value:
        return default
    if value not in graph.constants:
        raise SaturateError(f"{node.where()}: the C backend needs '{value}' to be a constant")
    return float(np.asarray(graph.constants[value]).reshape(-1)[0])


def clip_bounds(node: Node, graph) -> tuple[float, float]:
    """Clip's (min, max): constant inputs from opset 11 on, attributes before; absent = unbounded."""
    if len(node.inputs) > 1 or "min" not in node.attrs:
        lo = _const_scalar(graph, node, node.inputs[1] if len(node.inputs) > 1 else "", -math.inf)
        hi = _const_scalar(graph, node, node.inputs[2] if len(node.inputs) > 2 else "", math.inf)
        return lo, hi
    return node.attr("min", -math.inf), node.attr("max", math.inf)
