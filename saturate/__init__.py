"""saturate: a declarative graph-folding optimizer for neural networks, by equality saturation."""

from saturate.errors import SaturateError, SourceError
from saturate.ir import Graph, Node, ValueInfo
# The function shadows its module's name on the package on purpose: saturate.optimize(graph).
from saturate.optimize import optimize

__all__ = ["optimize", "Graph", "Node", "ValueInfo", "SaturateError", "SourceError"]
