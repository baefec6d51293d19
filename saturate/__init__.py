"""saturate: a declarative graph-folding optimizer for neural networks, by equality saturation."""

from saturate.errors import SaturateError, SourceError
from saturate.ir import Graph, Node, ValueInfo
# The function shadows its module's name on the package on purpose: saturate.optimize(graph).
from saturate.optimize import optimize


def compile(graph: Graph, **options):
    """Compile a graph to C (saturate.backend); returns a callable on numpy arrays."""
    from saturate.backend import compile_graph

    return compile_graph(graph, **options)


__all__ = ["compile", "optimize", "Graph", "Node", "ValueInfo", "SaturateError", "SourceError"]
