"""Preserve stage: which nodes no rewrite may change, from the target, the user and model marks."""

from __future__ import annotations

from typing import Iterable

from saturate.core.errors import SaturateError
from saturate.core.ir import Graph
from saturate.targets.target import Target


def split_names(graph: Graph, names: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Split `--preserve` entries into (ops, nodes): an entry naming a node (or its first output)
    is a node; anything else is an op."""
    known = {n.name for n in graph.nodes} | {n.outputs[0] for n in graph.nodes if n.outputs}
    names = list(dict.fromkeys(names))
    return tuple(n for n in names if n not in known), tuple(n for n in names if n in known)


def preserved(graph: Graph, target: Target, ops: Iterable[str] = (),
              nodes: Iterable[str] = ()) -> tuple[Graph, tuple[str, ...]]:
    """The node names the engine must leave alone, and `graph` with each of them named (a copy
    when a preserved node had no name).

    Preserved are nodes whose op the target or `ops` lists and nodes named in `nodes` (node
    name or first output). Where the target says `fold-preserved yes`, a preserved node that
    computes from constants alone is not kept: constant folding may still replace it.
    """
    ops_set = set(target.preserve) | set(ops)
    wanted = set(nodes)
    known = {n.name for n in graph.nodes} | {o for n in graph.nodes for o in n.outputs}
    missing = sorted(wanted - known)
    if missing:
        raise SaturateError(f"--preserve-nodes: no node named {', '.join(repr(m) for m in missing)} in the model")
    constant = set(graph.constants)
    kept: list[int] = []
    for k, n in enumerate(graph.nodes):
        const_only = all(not i or i in constant for i in n.inputs)
        if const_only:
            constant.update(o for o in n.outputs if o)
        if n.op not in ops_set and n.name not in wanted and not (set(n.outputs) & wanted):
            continue
        if const_only and target.fold_preserved:
            continue
        kept.append(k)
    if all(graph.nodes[k].name for k in kept):
        return graph, tuple(graph.nodes[k].name for k in kept)
    # Naming a node changes it: the names go on a copy whose arrays are the input's (copying
    # every weight cost more than the rest of this stage).
    g = graph.copy(arrays=False)
    node_names = {n.name for n in g.nodes}
    for k in kept:
        n = g.nodes[k]
        if not n.name:
            # Node names live apart from value names: the first output names the node if free.
            base, j = n.outputs[0] if n.outputs else n.op, 1
            n.name = base
            while n.name in node_names:
                j += 1
                n.name = f"{base}_{j}"
            node_names.add(n.name)
    return g, tuple(g.nodes[k].name for k in kept)
