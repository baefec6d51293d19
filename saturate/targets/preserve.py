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
    """The node names the engine must leave alone, on a copy of `graph` where each has a name.

    Preserved are nodes whose op the target or `ops` lists and nodes named in `nodes` (node
    name or first output). Where the target says `fold-preserved yes`, a preserved node that
    computes from constants alone is not kept: constant folding may still replace it.
    """
    g = graph.copy()
    ops_set = set(target.preserve) | set(ops)
    wanted = set(nodes)
    known = {n.name for n in g.nodes} | {o for n in g.nodes for o in n.outputs}
    missing = sorted(wanted - known)
    if missing:
        raise SaturateError(f"--preserve-nodes: no node named {', '.join(repr(m) for m in missing)} in the model")
    constant = set(g.constants)
    node_names = {n.name for n in g.nodes}
    names: list[str] = []
    for n in g.nodes:
        const_only = all(not i or i in constant for i in n.inputs)
        if const_only:
            constant.update(o for o in n.outputs if o)
        if n.op not in ops_set and n.name not in wanted and not (set(n.outputs) & wanted):
            continue
        if const_only and target.fold_preserved:
            continue
        if not n.name:
            # Node names live apart from value names: the first output names the node if free.
            base, k = n.outputs[0] if n.outputs else n.op, 1
            n.name = base
            while n.name in node_names:
                k += 1
                n.name = f"{base}_{k}"
            node_names.add(n.name)
        names.append(n.name)
    return g, tuple(names)
