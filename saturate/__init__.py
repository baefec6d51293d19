"""saturate: a declarative graph-folding optimizer for neural networks, by equality saturation."""

from saturate.core.errors import SaturateError, SourceError
from saturate.core.ir import Graph, Node, ValueInfo


def optimize(graph: Graph, **options):
    """Saturate, extract and fold a graph (saturate.pipeline); returns (graph, report)."""
    # The engine (egglog, scipy) loads on first use, not on `import saturate`.
    from saturate.pipeline import optimize as run_pipeline

    return run_pipeline(graph, **options)


def compile_graph(graph: Graph, **options):
    """Compile a graph to C (saturate.backend); returns a callable on numpy arrays."""
    from saturate.backend import compile_graph

    return compile_graph(graph, **options)


__all__ = ["compile_graph", "optimize", "Graph", "Node", "ValueInfo", "SaturateError", "SourceError"]
