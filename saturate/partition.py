"""Partition stage: group matches of a target's composite patterns into ONNX local functions."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np
import onnx
from onnx import helper

from saturate.core.errors import SaturateError
from saturate.core.ir import Graph, Node, unique_name
from saturate.core.ops import spec
from saturate.lang.ast import IntList, Num, OpTerm, Str, Term, Var
from saturate.targets.target import Composite, Target, load_target

FUNCTIONS_KEY = "functions"  # graph.meta[FUNCTIONS_KEY]: {(domain, name): body Graph}
_COMMUTATIVE = {"Add", "Mul", "Max", "Min", "Sum"}


@dataclass
class _Match:
    composite: Composite
    binds: dict[str, str]          # pattern variable -> value name, in first-seen order
    nodes: list[Node]              # matched nodes, root last


# ---- matching ------------------------------------------------------------------------------

class _Matcher:
    """Finds matches of composite patterns rooted at a node of one graph."""

    def __init__(self, graph: Graph, leave: frozenset[str] = frozenset()):
        self.g, self.leave = graph, leave
        self.producers = graph.producers()
        self.consumers = graph.consumers()
        self.claimed: set[int] = set()

    def match(self, comp: Composite, root: Node) -> _Match | None:
        """The first closed match of `comp` rooted at `root`, or None."""
        for binds, nodes in self._term(comp.pattern, root.outputs[0] if root.outputs else "", {}, ()):
            inner = {o for n in nodes for o in n.outputs}
            if nodes and nodes[-1] is root and not inner & set(binds.values()) and self._closed(nodes, root):
                # Parameters in the order the pattern names them, whatever order commuting matched.
                order = {v: k for k, v in enumerate(_variables(comp.pattern))}
                return _Match(comp, dict(sorted(binds.items(), key=lambda kv: order[kv[0]])), list(nodes))
        return None

    def _term(self, term: Term, value: str, binds: dict, nodes: tuple) -> Iterator[tuple[dict, tuple]]:
        if isinstance(term, Var):
            if term.const and value not in self.g.constants:
                return
            if binds.get(term.name, value) != value:
                return
            yield {**binds, term.name: value}, nodes
            return
        if not isinstance(term, OpTerm) or not value:
            return
        node = self.producers.get(value)
        if (node is None or node.op != term.op or node.domain not in ("", "ai.onnx")
                or id(node) in self.claimed or node.outputs[0] != value
                or node.op in self.leave or node.name in self.leave or value in self.leave):
            return
        inputs = list(node.inputs)
        while inputs and not inputs[-1]:
            inputs.pop()
        if len(inputs) != len(term.args) or "" in inputs or not self._attrs_match(term, node):
            return
        orders = [term.args]
        if node.op in _COMMUTATIVE and len(term.args) == 2:
            orders.append(term.args[::-1])
        for args in orders:
            yield from self._args(list(args), inputs, binds, nodes, node)

    def _args(self, args: list, inputs: list, binds: dict, nodes: tuple, node: Node):
        if not args:
            yield binds, nodes if any(n is node for n in nodes) else nodes + (node,)
            return
        for b, ns in self._term(args[0], inputs[0], binds, nodes):
            yield from self._args(args[1:], inputs[1:], b, ns, node)

    def _attrs_match(self, term: OpTerm, node: Node) -> bool:
        s = spec(node.op, self.g.opset)
        for key, want in term.attrs:
            have = node.attrs.get(key, s.attrs.get(key) if s else None)
            if isinstance(want, IntList):
                if have is None or list(have) != list(want.values):
                    return False
            elif isinstance(want, (Num, Str)) and have != want.value:
                return False
        return True

    def _closed(self, nodes: list[Node], root: Node) -> bool:
        """Interior values must not escape: only matched nodes read them, no graph output is one."""
        ids = {id(n) for n in nodes}
        if ids & self.claimed:
            return False
        outputs = set(self.g.outputs)
        for n in nodes:
            if n is root:
                continue
            for out in n.outputs:
                if out and (out in outputs or any(id(c) not in ids for c in self.consumers.get(out, []))):
                    return False
        return True


def _variables(term: Term) -> list[str]:
    """Pattern variables in the order they are written."""
    if isinstance(term, Var):
        return [term.name]
    if isinstance(term, OpTerm):
        return list(dict.fromkeys(v for a in term.args for v in _variables(a)))
    return []


# ---- rewriting matches into calls --------------------------------------------------------

def partition(graph: Graph, target: Target | str, keep_constants: bool = False,
              leave: Iterable[str] = ()) -> Graph:
    """Copy of `graph` where each match of the target's composites is a call to a local function.

    Constants the match reads become function arguments (the call node takes the weights),
    unless `keep_constants`, which keeps them in the body. Matches with the same body share
    one function. The functions live in `graph.meta["functions"]`; `to_model` writes them.
    Nodes named in `leave` (by op, node name or first output) join no function: the user
    preserved them, for instance for another compiler.
    """
    t = load_target(target)
    g = graph.copy()
    matcher = _Matcher(g, frozenset(leave))
    matches: list[_Match] = []
    # From the outputs back, so an outer root claims its nodes before a pattern rooted inside
    # it; at one root, the composite listed first in the target file wins.
    for root in reversed(g.nodes):
        if id(root) in matcher.claimed:
            continue
        for comp in t.composites:
            m = matcher.match(comp, root)
            if m is not None:
                matcher.claimed.update(id(n) for n in m.nodes)
                matches.append(m)
                break
    functions: dict[tuple[str, str], Graph] = dict(g.meta.get(FUNCTIONS_KEY, {}))
    by_body: dict[str, str] = {}
    calls: dict[int, Node] = {}
    node_names = {n.name for n in g.nodes}
    for k, m in enumerate(reversed(matches)):
        body, args = _body(g, m, keep_constants)
        key = _body_key(m.composite.name, body)
        fname = by_body.get(key)
        if fname is None:
            fname = _free_name(m.composite.name, {n for (_, n) in functions})
            by_body[key] = fname
            functions[(t.domain, fname)] = body
        root = m.nodes[-1]
        name = _free_name(f"{fname}_{k}", node_names)
        node_names.add(name)
        calls[id(root)] = Node(fname, args, list(root.outputs), name=name, domain=t.domain)
    matched = {id(n) for m in matches for n in m.nodes}
    g.nodes = [calls.get(id(n), n) for n in g.nodes if id(n) in calls or id(n) not in matched]
    if functions:
        g.meta[FUNCTIONS_KEY] = functions
        g.meta["opset_imports"] = {**g.meta.get("opset_imports", {}), t.domain: 1}
    g.remove_dead()
    return g


def _body(g: Graph, m: _Match, keep_constants: bool) -> tuple[Graph, list[str]]:
    """The function body of one match, with canonical value names, and the call's arguments."""
    body = Graph(name=m.composite.name, opset=g.opset)
    rename: dict[str, str] = {}
    args: list[str] = []
    for var, value in m.binds.items():
        if value in rename:  # two variables bound to one value: one parameter suffices
            continue
        rename[value] = var
        if keep_constants and value in g.constants:
            body.constants[var] = g.constants[value]
        else:
            body.inputs.append(var)
            args.append(value)
        body.values[var] = g.info(value)
    root = m.nodes[-1]

    def fresh(name: str) -> str:  # interior names never shadow a parameter
        while name in m.binds:
            name = "_" + name
        return name

    for j, node in enumerate(m.nodes):
        for o, out in enumerate(node.outputs):
            if out:
                rename[out] = fresh((f"out{o}" if o else "out") if node is root else f"t{j}_{o}" if o else f"t{j}")
                if out in g.values:
                    body.values[rename[out]] = g.values[out]
        body.nodes.append(Node(node.op, [rename.get(i, i) for i in node.inputs],
                               [rename.get(o, o) for o in node.outputs], dict(node.attrs),
                               name=f"n{j}", domain=node.domain))
    body.outputs = [rename[o] for o in root.outputs if o]
    return body, args


def _body_key(name: str, body: Graph) -> str:
    h = hashlib.sha256(name.encode())
    for n in body.nodes:
        h.update(repr((n.op, n.domain, n.inputs, n.outputs)).encode())
        for key, value in sorted(n.attrs.items(), key=lambda kv: kv[0]):
            # Tensor attributes by content: numpy's repr elides long arrays.
            data = np.ascontiguousarray(value).tobytes() if isinstance(value, np.ndarray) else repr(value).encode()
            h.update(key.encode() + b"=" + data)
    # Parameters by name only: a body with lifted weights serves every weight shape.
    h.update(repr(body.inputs).encode())
    for c, arr in sorted(body.constants.items()):
        h.update(repr((c, arr.dtype.str, arr.shape)).encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def _free_name(base: str, used: set[str]) -> str:
    return unique_name(base, used, first=2)


def inline(graph: Graph) -> Graph:
    """Copy of `graph` with every call to a local function replaced by the function's nodes."""
    functions = graph.meta.get(FUNCTIONS_KEY, {})
    g = graph.copy()
    g.meta.pop(FUNCTIONS_KEY, None)
    used = set(g.inputs) | set(g.constants) | set(g.values) | {n.name for n in g.nodes}
    used.update(o for n in g.nodes for o in n.outputs)

    def fresh(base: str) -> str:
        name = _free_name(base, used)
        used.add(name)
        return name

    nodes: list[Node] = []
    for node in g.nodes:
        body = functions.get((node.domain, node.op))
        if body is None:
            nodes.append(node)
            continue
        rename = dict(zip(body.inputs, node.inputs)) | dict(zip(body.outputs, node.outputs))
        for c, arr in body.constants.items():
            rename[c] = fresh(f"{node.name}_{c}")
            g.constants[rename[c]] = arr.copy()
        for bn in body.nodes:
            for o in bn.outputs:
                if o and o not in rename:
                    rename[o] = fresh(f"{node.name}_{o}")
                    g.values[rename[o]] = body.info(o)
            nodes.append(Node(bn.op, [rename.get(i, i) for i in bn.inputs], [rename.get(o, o) for o in bn.outputs],
                              dict(bn.attrs), name=fresh(f"{node.name}/{bn.name}"), domain=bn.domain))
    g.nodes = nodes
    return g


# ---- ONNX output -------------------------------------------------------------------------

def to_model(graph: Graph) -> onnx.ModelProto:
    """The ONNX model of a (possibly partitioned) graph, with its local functions."""
    from saturate.frontend.onnx_io import export_model

    model = export_model(graph)
    for (domain, name), body in graph.meta.get(FUNCTIONS_KEY, {}).items():
        model.functions.append(_function_proto(domain, name, body, export_model))
    return model


def _function_proto(domain: str, name: str, body: Graph, export_model: Any) -> onnx.FunctionProto:
    inner = export_model(body).graph
    # A kept constant travels as a Constant node: a function body has no initializers.
    consts = [helper.make_node("Constant", [], [t.name], value=t) for t in inner.initializer]
    opsets = [helper.make_opsetid("", body.opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in body.meta.get("opset_imports", {}).items()]
    return helper.make_function(domain, name, [i.name for i in inner.input], [o.name for o in inner.output],
                                consts + list(inner.node), opsets)


def check_output(path: str) -> None:
    """A partitioned model needs ONNX to hold its functions: refuse other output formats."""
    if not str(path).endswith(".onnx"):
        raise SaturateError(f"'{path}': a partitioned model is written as .onnx (its functions need ONNX)")


def save_model(graph: Graph, path: str) -> None:
    """Write a partitioned graph as .onnx atomically (temp file, then rename)."""
    from saturate.core.fileio import write_atomic

    check_output(path)
    model = to_model(graph)
    write_atomic(path, lambda f: f.write(model.SerializeToString()))


def summary(graph: Graph) -> list[str]:
    """One line per function: name, call count, parameters."""
    counts: dict[tuple[str, str], int] = {}
    for n in graph.nodes:
        counts[(n.domain, n.op)] = counts.get((n.domain, n.op), 0) + 1
    return [f"{d}::{name}({', '.join(body.inputs)})  x{counts.get((d, name), 0)}"
            + (f"  [{len(body.constants)} constants inside]" if body.constants else "")
            for (d, name), body in graph.meta.get(FUNCTIONS_KEY, {}).items()]


# ---- one run: optimize for a target, then partition ------------------------------------------

def optimize_for_target(graph: Graph, target: Target | str | None = None, preserve_ops: tuple[str, ...] = (),
                        preserve_nodes: tuple[str, ...] = (), partition_graph: bool = False,
                        keep_constants: bool = False, **limits: Any) -> tuple[Graph, Any]:
    """Optimize with the target's costs and preserved nodes, then (optionally) partition.

    Folding and partitioning need no ordering from the user: the e-graph folds batch-norm and
    merges constant adds first, and partitioning runs on the extracted graph. Ops the target
    itself preserves may join its composites; what the user preserves joins none.
    """
    from saturate.pipeline import optimize

    t = load_target(target)
    # optimize() asks saturate.preserve which nodes to keep (target list, these ops and nodes).
    out, report = optimize(graph, target=t, preserve=tuple(preserve_ops) + tuple(preserve_nodes), **limits)
    if partition_graph:
        out = partition(out, t, keep_constants=keep_constants, leave=preserve_ops + preserve_nodes)
    return out, report
