"""Partition stage: a target's composite nodes, as extraction chose them, become ONNX local functions.

The composites are rules of the engine (saturate.targets.composites): extraction weighs each
fused kernel against the ops it replaces with the target's costs, and decoding writes a chosen one
as a node in the target's domain. Here each such node becomes a call of a function whose body
is the pattern's ops with the attributes the node recorded."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Iterable

import numpy as np
import onnx
from onnx import helper

from saturate.core.errors import SaturateError
from saturate.core.ir import Graph, Node, unique_name
from saturate.ops.schema import op_table
from saturate.engine.decode import unread_outputs
from saturate.lang.ast import Var
from saturate.targets.composites import body_attrs, interior_types, positions, position_attrs, variables
from saturate.targets.target import Composite, Target, load_target

FUNCTIONS_KEY = "functions"  # graph.meta[FUNCTIONS_KEY]: {(domain, name): body Graph}


# ---- partitioning: extraction chooses the composites, each becomes a function ---------------

def partition(graph: Graph, target: Target | str, keep_constants: bool = False,
              leave: Iterable[str] = (), **limits: Any) -> Graph:
    """Copy of `graph` where the target's composites are calls to ONNX local functions.

    No other rule runs: the engine adds the composite rules alone and extraction, with the
    target's costs, decides where a fused kernel beats the ops it replaces (a conv whose output
    another node also reads stays a conv when fusing would compute it twice at a higher cost).
    Nodes named in `leave` (by op, node name or first output) join no function: the user
    preserved them, for instance for another compiler. Ops the target preserves may join its
    composites: preserving keeps them from being rewritten, and a function body keeps them whole.
    See `functions` for how calls and bodies are written.
    """
    t = load_target(target)
    if not t.composites:
        return graph.copy()
    out, _ = _composites_alone(graph, t, tuple(leave), **limits)
    return functions(out, t, keep_constants)


def _composites_alone(graph: Graph, t: Target, leave: tuple[str, ...], **limits: Any) -> tuple[Graph, Any]:
    """One engine run with the target's composite rules and no other: the graph with the
    composite nodes extraction chose, and the run's report."""
    from saturate.pipeline import optimize

    # Only the user's nodes stay out; the target's preserved ops are left as they are by the
    # body, which holds them unchanged.
    free = dataclasses.replace(t, preserve=())
    return optimize(graph, rules=[], target=free, preserve=leave, composites=True, **limits)


def functions(graph: Graph, target: Target | str, keep_constants: bool = False) -> Graph:
    """Copy of `graph` where each composite node of the target (as extraction wrote it, op
    `Composite...` in the target's domain) is a call to an ONNX local function.

    Constants the call reads become function arguments (the call node takes the weights),
    unless `keep_constants`, which keeps them in the body. Calls with the same body share one
    function. The functions live in `graph.meta["functions"]`; `to_model` writes them.
    """
    t = load_target(target)
    kinds = t.composite_ops
    g = graph.copy()
    found: dict[tuple[str, str], Graph] = dict(g.meta.get(FUNCTIONS_KEY, {}))
    by_body: dict[str, str] = {}
    node_names = {n.name for n in g.nodes}
    nodes: list[Node] = []
    k = 0
    for node in g.nodes:
        comp = kinds.get(node.op) if node.domain == t.domain else None
        if comp is None:
            nodes.append(node)
            continue
        body, args = _body(g, comp, node, keep_constants)
        key = _body_key(comp.name, body)
        fname = by_body.get(key)
        if fname is None:
            fname = _free_name(comp.name, {n for (_, n) in found})
            by_body[key] = fname
            found[(t.domain, fname)] = body
        name = _free_name(f"{fname}_{k}", node_names)
        node_names.add(name)
        k += 1
        nodes.append(Node(fname, args, list(node.outputs), name=name, domain=t.domain))
    g.nodes = nodes
    if found:
        g.meta[FUNCTIONS_KEY] = found
        g.meta["opset_imports"] = {**g.meta.get("opset_imports", {}), t.domain: 1}
    g.remove_dead()
    return g


def _body(g: Graph, comp: Composite, node: Node, keep_constants: bool) -> tuple[Graph, list[str]]:
    """The function body of one composite node, with canonical value names, and the call's
    arguments: the pattern's ops with the attributes the node recorded for each position."""
    body = Graph(name=comp.name, opset=g.opset)
    names = variables(comp.pattern)
    binds = dict(zip(names, node.inputs))
    rename: dict[str, str] = {}      # call input -> body parameter
    param: dict[str, str] = {}       # pattern variable -> body value
    args: list[str] = []
    for var, value in binds.items():
        if value in rename:  # two variables bound to one value: one parameter suffices
            param[var] = rename[value]
            continue
        rename[value] = param[var] = var
        if keep_constants and value in g.constants:
            body.constants[var] = g.constants[value]
        else:
            body.inputs.append(var)
            args.append(value)
        body.values[var] = g.info(value)
    order = positions(comp.pattern)
    ins_at, out_at = interior_types(comp.pattern, node.attrs, [g.info(v) for v in node.inputs],
                                    g.info(node.outputs[0]))

    def fresh(name: str) -> str:  # interior names never shadow a parameter
        while name in binds:
            name = "_" + name
        return name

    made: dict[int, str] = {}
    for j, term in enumerate(order):
        root = j == len(order) - 1
        out = fresh("out" if root else f"t{j}")
        made[id(term)] = out
        if out_at[j] is not None and (root or out_at[j].shape is not None):
            body.values[out] = out_at[j]
        ins = [param[a.name] if isinstance(a, Var) else made[id(a)] for a in term.args]
        attrs = body_attrs(term.op, position_attrs(node.attrs, j), g.opset)
        extra = [fresh(f"{out}_{o}") for o in unread_outputs(term.op, attrs)]
        body.nodes.append(Node(term.op, ins, [out, *extra], attrs, name=f"n{j}"))
    body.outputs = [made[id(order[-1])]]
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

def to_model(graph: Graph, weights: bool = True) -> onnx.ModelProto:
    """The ONNX model of a (possibly partitioned) graph, with its local functions (without the
    graph's initializers when not `weights`, as export_model)."""
    from saturate.frontend.onnx_io import export_model

    model = export_model(graph, weights=weights)
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
    """Write a partitioned graph as .onnx atomically (temp file, then rename), once it passes
    the ONNX checker as every model saturate writes (check_exported)."""
    from saturate.core.fileio import write_atomic
    from saturate.frontend.onnx_io import check_exported

    check_output(path)
    check_exported(graph, to_model(graph, weights=False))
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
    """Optimize with the target's costs and preserved nodes; with `partition_graph`, the
    target's composites are rules of the same run and each one extraction chooses is written
    as an ONNX function call.

    Folding and partitioning need no ordering from the user: one e-graph holds the folded and
    the fused forms, and extraction picks the cheapest mix. Ops the target itself preserves may
    join its composites; what the user preserves joins none.
    """
    from saturate.pipeline import optimize

    t = load_target(target)
    leave = tuple(preserve_ops) + tuple(preserve_nodes)
    # optimize() asks saturate.targets.preserve which nodes to keep (target list, these ops and nodes).
    out, report = optimize(graph, target=t, preserve=leave, composites=partition_graph, **limits)
    if not partition_graph:
        return out, report
    if _composites_need_preserved(t):
        # The run above kept the target's preserved ops out of every rule, composites included.
        # A composite may hold them whole: one more run of the composite rules alone, with
        # those ops open, fuses them too (the composite nodes chosen above stay as they are).
        # A preserved node that folded (constant inputs, `fold-preserved yes`) is no longer there.
        known = {n.name for n in out.nodes} | {o for n in out.nodes for o in n.outputs[:1]}
        ops = set(op_table()) | {n.op for n in out.nodes}
        leave = tuple(p for p in leave if p in known or p in ops)
        out, second = _composites_alone(out, t, leave, **{k: v for k, v in limits.items()
                                                          if k in ("max_iterations", "max_nodes", "timeout")})
        # The report describes the graph written: the second run's cost and matches count too.
        report.cost_after = second.cost_after
        report.kept_original = report.kept_original and second.kept_original
        for name, n in second.run.matches.items():
            report.run.matches[name] = report.run.matches.get(name, 0) + n
            report.run.locations.setdefault(name, second.run.locations.get(name, ""))
        report.times["composites"] = sum(second.times.values())
    out = functions(out, t, keep_constants)
    report.ops_after = dict(out.op_counts())      # calls by function name, as the file has them
    return out, report


def _composites_need_preserved(t: Target) -> bool:
    """Whether a composite of `t` names an op that `t` preserves."""
    kept = set(t.preserve)
    return any(term.op in kept for c in t.composites for term in positions(c.pattern))
