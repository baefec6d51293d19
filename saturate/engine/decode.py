"""Fold stage: the chosen e-nodes decoded to a Graph, constant expressions folded with numpy."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from saturate.engine.egraph import ENode
from saturate.core.errors import SaturateError
from saturate.engine.facts import Facts
from saturate.core.ir import Graph, Node
from saturate.ops.registry import domain_of


def decode(choice: dict[Any, ENode], roots: list[Any], facts: Facts, domains: dict[str, str] | None = None) -> Graph:
    """Build the Graph the chosen e-nodes spell, folding constant expressions with numpy.

    `domains` maps ops that live outside ONNX's default domain to theirs: a target's composite
    e-nodes (saturate.targets.composites) are written as one node each in the target's domain,
    with the attribute set that records the attributes of the ops they replaced."""
    domains = domains or {}
    enc, g = facts.enc, facts.enc.graph
    out = Graph(inputs=list(g.inputs), outputs=[], name=g.name, opset=g.opset, meta=dict(g.meta))
    out.values = {i: g.info(i) for i in g.inputs}
    used = set(g.inputs)
    named: dict[Any, str] = {}
    emitted_opaque: set[int] = set()
    preferred = {}
    for o, cls in zip(g.outputs, roots):
        preferred.setdefault(cls, o)

    counters: dict[str, int] = {}
    # Node names: a node keeps the name of the input graph's node whose value it computes (the
    # matched root's, when a rewrite replaced it); names stay unique among the output's nodes.
    producer_names = {o: n.name for n in g.nodes for o in n.outputs[:1] if o and n.name}
    node_names: set[str] = set()
    node_counters: dict[str, int] = {}
    invented_names: set[str] = set()

    invented: list[Node] = []      # op nodes computing a value the input graph had no node for

    def node_name(cls: Any, value: str) -> str:
        base = next((producer_names[v] for v in (value, *facts.names.get(cls, ())) if v in producer_names), None)
        if base is None:
            invented_names.add(value)
            base = value
        name = _unique(base, node_counters, node_names.__contains__)
        node_names.add(name)
        return name

    def folded_name(cls: Any) -> str:
        # A folded value that had a name in the input graph keeps it; else it is named after the
        # first weight it was computed from (conv.weight_folded for a weight with a batch norm
        # folded in), which is the one it usually replaces.
        for n in facts.names.get(cls, ()):
            if n not in used and n not in g.inputs and n not in g.constants and n not in g.outputs:
                used.add(n)
                return n
        leaf = _first_weight(facts, cls)
        return fresh(f"{leaf}_folded" if leaf else "folded")

    def fresh(base: str) -> str:
        name = _unique(base, counters, lambda n: n in used or n in g.constants or n in g.values)
        used.add(name)
        return name

    def name_for(cls: Any) -> str:
        want = preferred.get(cls)
        if want and want not in used:
            used.add(want)
            return want
        for n in facts.names.get(cls, ()):
            if n not in used and n not in g.inputs and n not in g.constants:
                used.add(n)
                return n
        return fresh("v")

    def emit(cls: Any) -> str:
        node = choice[cls]
        if node.kind == "inp":
            return node.key
        if node.kind == "absent":
            return ""
        if node.kind in ("const", "lit", "call"):
            val = facts.cache.get(facts.node_key(node)) if facts.node_key(node) is not None else None
            if val is None:
                raise SaturateError("a constant expression chosen by extraction could not be evaluated")
            if node.kind == "const" and node.key not in out.constants:
                # The input graph's own array, as a read-only view: the result does not copy
                # every weight, and changing it in place cannot change the input.
                out.constants[node.key] = _read_only(val)
                used.add(node.key)
                return node.key
            # A bare number from a rule becomes a float32 (or int64) tensor; folded expressions
            # keep the dtype numpy computed from the graph's own constants.
            arr = np.asarray(val, np.float32) if isinstance(val, float) else np.asarray(val)
            name = folded_name(cls)
            # Shared read-only like the input's weights (a folded value may be a view of one: a
            # reshape), and copied only to lay it out in C order (not with np.ascontiguousarray:
            # it turns a 0-d value, a dim, into 1-d). Copying every folded weight was most of
            # ResNet-50's fold stage.
            out.constants[name] = _read_only(arr) if arr.flags.c_contiguous else np.array(arr, order="C")
            return name
        ins = [named[c] for c in node.children]
        if node.kind == "out":
            opq = choice[node.children[0]]
            src = enc.opaque_nodes[opq.key]
            if opq.key not in emitted_opaque:
                emitted_opaque.add(opq.key)
                node_names.add(src.name)
                out.nodes.append(Node(src.op, [named[c] for c in opq.children], list(src.outputs),
                                      dict(src.attrs), src.name, src.domain))
                used.update(o for o in src.outputs if o)
                for o in src.outputs:
                    if o and o in g.values:
                        out.values[o] = g.values[o]
            return src.outputs[node.key]
        if node.kind == "opaque":
            return ""
        op, attrs = enc.attr_sets[node.key]
        name = name_for(cls)
        outputs = [name] + [fresh(f"{name}_{extra}") for extra in unread_outputs(op, attrs)]
        out.nodes.append(Node(op, ins, outputs, dict(attrs), name=node_name(cls, name), domain=domains.get(op) or domain_of(op)))
        if name in invented_names:
            invented.append(out.nodes[-1])
        out.values[name] = facts.info(cls)
        return name

    # Post-order without recursion: deep chains have thousands of levels.
    for root in roots:
        stack = [(root, False)]
        while stack:
            cls, ready = stack.pop()
            if cls in named:
                continue
            if ready:
                named[cls] = emit(cls)
                continue
            stack.append((cls, True))
            # A constant expression is folded whole from its structure: its operands (an omitted
            # attribute among them, valued None) never become graph values of their own.
            if choice[cls].kind != "call":
                stack.extend((c, False) for c in reversed(choice[cls].children) if c not in named)
    defined = {v: n for n in out.nodes for v in n.outputs if v}
    for o, cls in zip(g.outputs, roots):
        src = named[cls]
        if src != o:
            holder = defined.get(o)
            if holder is not None:
                # An opaque node kept for another output also names this one, which extraction
                # took in another form (a folded constant): nothing reads the node's copy.
                holder.outputs[holder.outputs.index(o)] = fresh(o + "_unread")
            out.nodes.append(Node("Identity", [src], [o], name=node_name(None, fresh(o + "_id"))))
            out.values[o] = g.info(o)
        out.outputs.append(o)
    out.remove_dead()
    _name_after_readers(out, invented, node_names)
    out.validate()
    return out


def _name_after_readers(graph: Graph, invented: list[Node], taken: set[str]) -> None:
    """Name each node of `invented` (its value had no node in the input graph) after the node that
    reads it: `<reader's name>/Reshape` for a Reshape a rewrite put before a Gemm. Readers come
    after their operands' nodes, so going backwards a chain of such nodes takes its end's name."""
    ids = {id(n) for n in invented}
    if not ids:
        return
    reader: dict[str, Node] = {}
    for n in graph.nodes:
        for i in n.inputs:
            reader.setdefault(i, n)
    for n in reversed(graph.nodes):
        r = reader.get(n.outputs[0]) if id(n) in ids else None
        if r is None:
            continue
        base = name = f"{r.name}/{n.op}"
        k = 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.discard(n.name)
        taken.add(name)
        n.name = name


def _first_weight(facts: Facts, cls: Any, limit: int = 64) -> str | None:
    """The name of the first input-graph constant a constant expression reads (breadth first,
    looking at no more than `limit` e-classes), or None."""
    seen, queue = {cls}, [cls]
    while queue and len(seen) <= limit:
        for node in facts.view.classes.get(queue.pop(0), ()):
            if node.kind == "const" and isinstance(node.key, str):
                return node.key
            for c in node.children:
                if c not in seen:
                    seen.add(c)
                    queue.append(c)
    return None


def unread_outputs(op: str, attrs: dict[str, Any]) -> tuple[str, ...]:
    """Outputs an op e-node's node must list beyond its first, which nobody reads: an op e-node is
    its node's first output alone (saturate.engine.encode encodes a node so only when its other
    outputs are unread), and ONNX requires a BatchNormalization in training mode to list its
    running mean and variance."""
    mode = attrs.get("training_mode", 0) if op == "BatchNormalization" else 0
    # A model's attribute can hold anything: only a number can switch training mode on.
    if isinstance(mode, (int, float, np.number)) and mode != 0:
        return ("running_mean", "running_var")
    return ()


def _read_only(value: Any) -> Any:
    if not isinstance(value, np.ndarray) or not value.flags.writeable:
        return value
    view = value.view()
    view.flags.writeable = False
    return view


def _unique(base: str, counters: dict[str, int], taken: Callable[[str], bool]) -> str:
    """`base`, or `base_k` for the first k not taken. A counter per base keeps naming linear in
    the number of names made."""
    k = counters.get(base, 0)
    name = base if k == 0 else f"{base}_{k}"
    while taken(name):
        k += 1
        name = f"{base}_{k}"
    counters[base] = k + 1
    return name
