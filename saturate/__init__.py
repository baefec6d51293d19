"""saturate: a declarative graph-folding optimizer for neural networks, by equality saturation."""

from typing import TYPE_CHECKING

from saturate.core.errors import SaturateError, SourceError

if TYPE_CHECKING:
    from saturate.core.ir import Graph, Node, ValueInfo

# Graph, Node and ValueInfo load numpy: they are read from saturate.core.ir on first use, so that
# `saturate --version` and every module below this package do not pay for it before they need it.
_FROM_IR = ("Graph", "Node", "ValueInfo")


def __getattr__(name: str):
    if name in _FROM_IR:
        from saturate.core import ir

        value = globals()[name] = getattr(ir, name)
        return value
    raise AttributeError(f"module 'saturate' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FROM_IR))


def optimize(graph: "Graph", **options):
    """Saturate, extract and fold a graph (saturate.pipeline); returns (graph, report)."""
    # The engine (egglog, scipy) loads on first use, not on `import saturate`.
    from saturate.pipeline import optimize as run_pipeline

    return run_pipeline(graph, **options)


def simplify(model, check_n: int = 1, overwrite_input_shapes=None, skip_rules=(), **options):
    """onnxsim's API on saturate: an onnx.ModelProto or path in, (onnx.ModelProto, ok) out, `ok`
    False when the result's outputs differ from the input's in ONNX Runtime (saturate.simplify)."""
    from saturate.simplifier import simplify as run_simplify

    return run_simplify(model, check_n, overwrite_input_shapes, skip_rules, **options)


def model_summary(model):
    """Nodes per op type, parameters, size in bytes and MACs of an onnx.ModelProto, a path or a
    Graph (saturate.summary.ModelSummary; MACs None where shapes are symbolic)."""
    from saturate.summary import model_summary as summary

    return summary(model)


def compile_graph(graph: "Graph", **options):
    """Compile a graph to C (saturate.backend); returns a callable on numpy arrays."""
    from saturate.backend import compile_graph

    return compile_graph(graph, **options)


__all__ = ["compile_graph", "model_summary", "optimize", "simplify", "Graph", "Node", "ValueInfo", "SaturateError", "SourceError"]
