"""saturate: a declarative graph-folding optimizer for neural networks, by equality saturation."""

from saturate.errors import SaturateError, SourceError
from saturate.ir import Graph, Node, ValueInfo

__all__ = ["Graph", "Node", "ValueInfo", "SaturateError", "SourceError"]
