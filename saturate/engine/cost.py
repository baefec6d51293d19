"""Cost model: the default price of a node from shapes alone (FLOPs plus bytes moved)."""

from __future__ import annotations

import math
from typing import Any, Protocol, Sequence

from saturate.core.ir import Graph, ValueInfo


class CostModel(Protocol):
    """What extraction needs from a target: a node's cost, or None when it cannot run the op."""

    def node_cost(self, op: str, attrs: dict[str, Any], input_infos: Sequence[ValueInfo],
                  output_info: ValueInfo) -> float | None: ...


class DefaultCost:
    """FLOPs plus bytes moved for every op (the cpu target's formula, without a target file)."""

    name = "default"
    preserve: tuple[str, ...] = ()

    def node_cost(self, op: str, attrs: dict[str, Any], input_infos: Sequence[ValueInfo],
                  output_info: ValueInfo) -> float:
        """FLOPs of the node plus the bytes it reads and writes."""
        from saturate.targets.target import flops, nbytes
        moved = sum(nbytes(i) for i in input_infos if i is not None) + nbytes(output_info)
        return float(flops(op, attrs, input_infos, output_info) + moved)


def resolve_target(target: Any) -> Any:
    """A cost model from a target name, a .target path, or an object with node_cost."""
    if target is None:
        target = "cpu"
    if hasattr(target, "node_cost"):
        return target
    from saturate.targets.target import load_target
    return load_target(target)


def graph_cost(graph: Graph, model: Any) -> float:
    """Total cost of a graph's nodes under `model`: infinite if the target cannot run one."""
    total = 0.0
    for n in graph.nodes:
        ins = [graph.info(i) if i else ValueInfo(shape=None) for i in n.inputs]
        out = graph.info(n.outputs[0]) if n.outputs else ValueInfo(shape=None)
        c = model.node_cost(n.op, n.attrs, ins, out)
        total += c if c is not None else math.inf
    return total
