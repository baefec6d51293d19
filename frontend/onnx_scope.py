"""Frontend stage, subgraph scopes: the values a node's subgraphs (If's branches, Loop's and Scan's
bodies, at any depth) read from the graphs around them, and the rewriting of those names on export.

In the IR a node with subgraph attributes lists, after its own inputs, the outer values its
subgraphs read (`subgraph_reads` names them as the subgraphs spell them, in order). Every stage
then sees the dependency as an input: the optimizer keeps the value alive and may rename or fold
it, the interpreter frees it only after the node ran. Export (`bind_subgraphs`) drops those inputs
again and rewrites each subgraph to read the outer values under the names the graph now gives
them, renaming a subgraph's own value where it would hide one (ONNX lets a subgraph's inputs
shadow an outer name, not its nodes' outputs: the checker's single-assignment rule).
"""

from __future__ import annotations

import functools
from typing import Any, Iterable

import onnx
from onnx import AttributeProto

from saturate.core.errors import SaturateError
from saturate.core.ir import Node, OpaqueAttr, unique_name

# Subgraphs within subgraphs up to this depth: real models nest two or three (a Loop of detection
# post-processing holding an If); protobuf itself stops at about 32.
MAX_DEPTH = 16
GRAPH_KINDS = ("GRAPH", "GRAPHS")


def graph_attrs(node: Node) -> list[tuple[str, OpaqueAttr]]:
    """The node's subgraph attributes, by name in sorted order (the order their reads are listed)."""
    return sorted((k, v) for k, v in node.attrs.items() if isinstance(v, OpaqueAttr) and v.kind in GRAPH_KINDS)


def has_subgraphs(node: Node) -> bool:
    return any(isinstance(v, OpaqueAttr) and v.kind in GRAPH_KINDS for v in node.attrs.values())


def attribute_graphs(a: AttributeProto) -> list[onnx.GraphProto]:
    return [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)


def subgraph_reads(node: Node) -> tuple[str, ...]:
    """The outer names a node's subgraphs read, as they spell them, in order of first read (the
    node's last len(...) inputs hold those values, under the graph's names)."""
    attrs = graph_attrs(node)
    if not attrs:
        return ()
    try:
        return _reads(tuple(v.payload for _, v in attrs))
    except SaturateError as err:
        raise SaturateError(f"{node.where()}: {err}") from None


def own_inputs(node: Node) -> tuple[list[str], list[str]]:
    """The node's own inputs and the outer values its subgraphs read (its trailing inputs)."""
    k = len(subgraph_reads(node))
    if k > len(node.inputs):
        raise SaturateError(f"{node.where()}: lists {len(node.inputs)} inputs, fewer than the {k} outer "
                            f"values its subgraphs read")
    cut = len(node.inputs) - k
    return node.inputs[:cut], node.inputs[cut:]


@functools.lru_cache(maxsize=1024)
def _reads(payloads: tuple[bytes, ...]) -> tuple[str, ...]:
    found: dict[str, None] = {}
    for payload in payloads:
        for g in attribute_graphs(parse_attribute(payload)):
            found.update(dict.fromkeys(free_names(g)))
    return tuple(found)


def parse_attribute(payload: bytes) -> AttributeProto:
    a = AttributeProto()
    try:
        a.ParseFromString(payload)
    except Exception:  # protobuf's decode errors differ between versions
        raise SaturateError("a subgraph attribute is not a valid serialized ONNX attribute") from None
    return a


def free_names(g: onnx.GraphProto, depth: int = 0) -> list[str]:
    """Names `g` reads that it does not define (its inputs, initializers and nodes' outputs define
    names; a nested subgraph's reads count where its node is), in order of first read."""
    if depth > MAX_DEPTH:
        raise SaturateError(f"subgraphs nested deeper than {MAX_DEPTH} levels")
    defined = {vi.name for vi in g.input} | {t.name for t in g.initializer} | {""}
    defined |= {t.values.name for t in g.sparse_initializer}
    free: dict[str, None] = {}
    for n in g.node:
        for name in n.input:
            if name not in defined:
                free[name] = None
        for a in n.attribute:
            for sub in attribute_graphs(a):
                free.update(dict.fromkeys(x for x in free_names(sub, depth + 1) if x not in defined))
        defined.update(n.output)
    free.update(dict.fromkeys(vi.name for vi in g.output if vi.name not in defined))
    return list(free)


# ---- import: the checks the ONNX checker makes, each naming the node --------------------------------

def check_scopes(g: onnx.GraphProto, outer: frozenset[str] = frozenset(), depth: int = 0) -> None:
    """Refuse, in one line naming the node and op, a subgraph that reads a name nothing defines
    before its node (in its graph or one around it), defines a value an enclosing graph already
    has (ONNX forbids shadowing but by a subgraph's own inputs), or nests too deeply."""
    defined = set(outer) | {vi.name for vi in g.input} | {t.name for t in g.initializer} | {""}
    for n in g.node:
        subgraphs = [(a.name, sub) for a in n.attribute for sub in attribute_graphs(a)]
        if subgraphs:
            where = f"node '{n.name or (n.output[0] if n.output else '')}' ({n.op_type})"
            if depth >= MAX_DEPTH:
                raise SaturateError(f"invalid ONNX model: {where}: subgraphs nested deeper than {MAX_DEPTH} levels")
            for attr, sub in subgraphs:
                try:
                    _check_subgraph(sub, frozenset(defined), depth)
                except SaturateError as err:
                    raise SaturateError(f"invalid ONNX model: {where}, subgraph '{attr}': "
                                        f"{str(err).removeprefix('invalid ONNX model: ')}") from None
        defined.update(n.output)


def _check_subgraph(g: onnx.GraphProto, outer: frozenset[str], depth: int) -> None:
    seen = set(outer) | {vi.name for vi in g.input} | {t.name for t in g.initializer} | {""}
    for n in g.node:
        where = f"node '{n.name or (n.output[0] if n.output else '')}' ({n.op_type})"
        missing = [i for i in n.input if i not in seen]
        if missing:
            raise SaturateError(f"{where} reads '{missing[0]}', which nothing defines before it")
        clash = [o for o in n.output if o and o in outer]
        if clash:
            raise SaturateError(f"{where} defines '{clash[0]}', a value of an enclosing graph (ONNX forbids "
                                f"shadowing one)")
        seen.update(n.output)
    check_scopes(g, outer, depth + 1)
    for vi in g.output:
        if vi.name not in seen or vi.name in outer and vi.name not in {i.name for i in g.input}:
            raise SaturateError(f"output '{vi.name}' is not computed in the subgraph (ONNX wants a subgraph's "
                                f"outputs computed in it)")


# ---- export: outer values under the graph's names ---------------------------------------------------

def bind_subgraphs(node: Node, proto: onnx.NodeProto, visible: Iterable[str] = (),
                   taken: Iterable[str] = ()) -> None:
    """Make `proto` (the NodeProto of `node`) ONNX's form of the node: its own inputs only, each
    subgraph reading the outer values the node's trailing inputs name. `visible` holds the names
    defined before the node (a subgraph's node may not define one), `taken` every name of the
    graph (a renamed subgraph value takes none of them)."""
    own, bound = own_inputs(node)
    del proto.input[len(own):]
    subst = dict(zip(subgraph_reads(node), bound))
    visible = set(visible) | set(bound)
    taken = set(taken) | visible
    changed = any(k != v for k, v in subst.items())
    for a in proto.attribute:
        if a.type not in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
            continue
        for g in attribute_graphs(a):
            if changed or _hides(g, visible):
                _rebind(g, subst, visible, taken)


def _hides(g: onnx.GraphProto, visible: set[str]) -> bool:
    """Whether a node of `g` (at any depth) defines a name of `visible`."""
    return any(o in visible for n in g.node for o in n.output) or any(
        _hides(sub, visible) for n in g.node for a in n.attribute for sub in attribute_graphs(a))


def _names(g: onnx.GraphProto, into: set[str]) -> set[str]:
    into.update(vi.name for vi in g.input)
    into.update(t.name for t in g.initializer)
    for n in g.node:
        into.update(n.output)
        into.update(n.input)
        for a in n.attribute:
            for sub in attribute_graphs(a):
                _names(sub, into)
    return into


def _rebind(g: onnx.GraphProto, subst: dict[str, str], visible: set[str], taken: set[str]) -> None:
    """Rewrite `g` in place: a name it reads from outside becomes subst's; an input or initializer
    that would hide one of subst's names, and a node output that would redefine a visible name,
    get fresh names (their readers within `g` follow)."""
    free = set(free_names(g))
    subst = {k: v for k, v in subst.items() if k in free}
    wanted = set(subst.values())
    # One set through every depth: a name chosen in a nested graph is taken here too.
    _names(g, taken).update(wanted)
    local: dict[str, str] = {}

    def fresh(name: str) -> str:
        new = unique_name(name, taken)
        taken.add(new)
        local[name] = new
        return new

    for vi in g.input:
        if vi.name in wanted:
            vi.name = fresh(vi.name)
    for t in g.initializer:
        if t.name in wanted:
            t.name = local.get(t.name) or fresh(t.name)
    names = {**subst, **local}
    defined = {vi.name for vi in g.input} | {t.name for t in g.initializer}
    for n in g.node:
        for k, name in enumerate(n.input):
            if name in names:
                n.input[k] = names[name]
        for a in n.attribute:
            for sub in attribute_graphs(a):
                # What the nested graph reads from here is what this graph's names now are.
                _rebind(sub, {**{x: x for x in free_names(sub)}, **names}, visible | defined, taken)
        for k, name in enumerate(n.output):
            if name and name in visible | wanted:
                n.output[k] = names[name] = fresh(name)
        defined.update(n.output)
    for vi in list(g.output) + list(g.value_info):
        if vi.name in names:
            vi.name = names[vi.name]


def outer_names_before(nodes: list[Any], start: Iterable[str]) -> Iterable[tuple[Any, set[str]]]:
    """(node, names defined before it) for each node with subgraphs, in order."""
    defined = set(start)
    for n in nodes:
        if has_subgraphs(n):
            yield n, set(defined)
        defined.update(o for o in n.outputs if o)
