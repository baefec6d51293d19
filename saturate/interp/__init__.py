"""Reference interpreter: run a graph on numpy arrays."""

from saturate.interp.interpreter import eval_node, run_graph

__all__ = ["eval_node", "run_graph"]
