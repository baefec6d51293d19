"""saturate: a declarative graph-folding optimizer for neural networks, by equality saturation."""

from saturate.errors import SaturateError, SourceError
from saturate.ir import Graph, Node, ValueInfo


def __getattr__(name: str):
    # saturate.optimize loads the engine (egglog, scipy) on first use, not on `import saturate`.
    # The module saturate.optimize is itself callable, so saturate.optimize(graph) works
    # whichever of module or function the attribute holds.
    if name == "optimize":
        from saturate.optimize import optimize
        return optimize
    raise AttributeError(f"module 'saturate' has no attribute '{name}'")


def compile(graph: Graph, **options):
    """Compile a graph to C (saturate.backend); returns a callable on numpy arrays."""
    from saturate.backend import compile_graph

    return compile_graph(graph, **options)


__all__ = ["compile", "optimize", "Graph", "Node", "ValueInfo", "SaturateError", "SourceError"]
