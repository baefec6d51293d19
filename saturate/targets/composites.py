"""A target's composites as rules and e-nodes: `PATTERN => Composite<Name>(vars...)`, priced by the target.

Each composite becomes a rule whose right side is one e-node with the pattern's variables as
inputs, in the order the pattern writes them. The e-node's attribute set records every attribute
of every op the pattern matched, keyed `"<position>.<attribute>"`, where positions number the
pattern's ops children first, left to right, root last; the function body a partitioned model
calls is rebuilt from the pattern and these attributes.

Inside the e-graph the op is named `Composite` + the composite's name in camel case
(`conv_bias_relu` -> `CompositeConvBiasRelu`): the engine reads an e-node's op from its egglog
constructor name `Op_<op>_<arity>` by splitting at '_', so the name holds none.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Sequence

import numpy as np

from saturate.core.ir import ValueInfo
from saturate.ops.schema import newest_opset, spec
from saturate.frontend.infer import onnx_infer
from saturate.lang.ast import AttrVar, OpTerm, Rule, Term, Var
from saturate.ops import find, infer_type as registry_type, nbytes

PREFIX = "Composite"


def egraph_op(name: str) -> str:
    """The op name of composite `name` inside the e-graph: no '_' (see the module docstring)."""
    return PREFIX + "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)


def variables(term: Term) -> list[str]:
    """Pattern variables in the order they are first written."""
    if isinstance(term, Var):
        return [term.name]
    if isinstance(term, OpTerm):
        return list(dict.fromkeys(v for a in term.args for v in variables(a)))
    return []


def positions(pattern: OpTerm) -> list[OpTerm]:
    """The pattern's ops, children first, left to right, root last: index = position."""
    out: list[OpTerm] = []

    def walk(term: Term) -> None:
        if isinstance(term, OpTerm):
            for a in term.args:
                walk(a)
            out.append(term)
    walk(pattern)
    return out


def position_attrs(attrs: dict[str, Any], position: int) -> dict[str, Any]:
    """The attributes of the op at `position`, out of a composite e-node's attribute set."""
    prefix = f"{position}."
    return {k[len(prefix):]: v for k, v in attrs.items() if k.startswith(prefix)}


def rules(composites: Sequence[Any], ruleset: str) -> list[Rule]:
    """One rule per composite and per order of its commutative binary ops (`Add(Conv(..), y)`
    also matches `Add(y, Conv(..))`), each rewriting the pattern to the composite e-node."""
    out: list[Rule] = []
    for comp in composites:
        order = positions(comp.pattern)
        where = {id(t): k for k, t in enumerate(order)}
        # The right side records each op's attributes, written or captured, under its position.
        recorded = tuple((f"{k}.{key}", value) for k, t in enumerate(order) for key, value in _open_attrs(t, k))
        rhs = OpTerm(egraph_op(comp.name), tuple(Var(v) for v in variables(comp.pattern)), recorded, comp.loc)
        for n, lhs in enumerate(_orders(comp.pattern, where)):
            name = f"composite {comp.name}" + (f" (order {n + 1})" if n else "")
            out.append(Rule(name, lhs, rhs, (), ruleset, 0, comp.loc))
    return out


def _open_attrs(term: OpTerm, position: int) -> tuple:
    """The attributes the pattern writes, then a capture of every other attribute the op
    defines: the node's value, its default where the node omits it, or nothing when it has
    none (the body needs them all)."""
    written = {key for key, _ in term.attrs}
    s = spec(term.op)
    return tuple(term.attrs) + tuple((key, AttrVar(f"p{position}_{key}"))
                                     for key in sorted(s.attrs if s else ()) if key not in written)


def _orders(term: Term, where: dict[int, int]) -> Iterator[Term]:
    """Every left side of one pattern: each commutative binary op in both argument orders, each
    op capturing the attributes the pattern leaves open."""
    if not isinstance(term, OpTerm):
        yield term
        return
    attrs = _open_attrs(term, where[id(term)])
    arg_lists: list[tuple] = [()]
    for a in term.args:
        options = list(_orders(a, where))
        arg_lists = [done + (o,) for done in arg_lists for o in options]
    for args in arg_lists:
        yield OpTerm(term.op, args, attrs, term.loc)
        if _commutative(term.op) and len(args) == 2 and args[0] != args[1]:
            yield OpTerm(term.op, args[::-1], attrs, term.loc)


# ---- types and cost of a composite e-node --------------------------------------------------

def interior_types(pattern: OpTerm, attrs: dict[str, Any], inputs: Sequence[ValueInfo | None],
                   output: ValueInfo | None) -> tuple[list[list[ValueInfo | None]], list[ValueInfo | None]]:
    """Input and output types of each pattern position of one composite e-node, from the types
    of its inputs (the pattern's variables in order) and of its output (the root's)."""
    bound = dict(zip(variables(pattern), inputs))
    order = positions(pattern)
    outs: dict[int, ValueInfo | None] = {}
    ins_at: list[list[ValueInfo | None]] = []
    out_at: list[ValueInfo | None] = []
    for k, t in enumerate(order):
        ins = [bound.get(a.name) if isinstance(a, Var) else outs[id(a)] for a in t.args]
        out = output if k == len(order) - 1 else infer_type(t.op, position_attrs(attrs, k), ins)
        outs[id(t)] = out
        ins_at.append(ins)
        out_at.append(out)
    return ins_at, out_at


def infer_type(op: str, attrs: dict[str, Any], ins: Sequence[ValueInfo | None]) -> ValueInfo:
    """Output type of one interior op: its registry entry's, else ONNX's shape inference of that
    one node."""
    dtype = ins[0].dtype if ins and ins[0] is not None else "float32"
    own = registry_type(op, attrs, ins)
    if own is not None and own.shape is not None:
        return own
    key = (op, _attrs_key(attrs),
           tuple(None if i is None else (i.dtype, None if i.shape is None else tuple(i.shape)) for i in ins))
    if key not in _INFERRED:
        if len(_INFERRED) >= 4096:      # a bound, not a policy: one graph's distinct types fit
            _INFERRED.clear()
        known = not any(i is None for i in ins)
        _INFERRED[key] = onnx_infer(op, attrs, list(ins), {}, 0, newest_opset()) if known else None
    return _INFERRED[key] or ValueInfo(dtype, None)


def _commutative(op: str) -> bool:
    d = find(op)
    return d is not None and d.commutative


def _attrs_key(attrs: dict[str, Any]) -> str:
    """Attributes as text, a tensor by its bytes (numpy's repr elides long arrays)."""
    return repr(sorted((k, (v.dtype.str, v.shape, v.tobytes()) if isinstance(v, np.ndarray) else v)
                       for k, v in attrs.items()))


# ONNX's inference of one node takes about a millisecond; pricing a graph asks it once per
# composite node, and a deep chain repeats a few types thousands of times.
_INFERRED: dict[tuple, ValueInfo | None] = {}


def composite_cost(target: Any, pattern: OpTerm, attrs: dict[str, Any], inputs: Sequence[ValueInfo | None],
                   output: ValueInfo | None) -> float | None:
    """Cost of one composite e-node on `target`:

        max(sum over the pattern's ops p of cost(p)
              - sum over the interior values v (every op's output but the root's) of 2 * bytes(v),
            max over the pattern's ops p of cost(p))
        - (number of ops - 1)

    with each op priced by the target's formula at the types it has inside the match. A fused
    kernel runs every op of its pattern but never writes an interior value to memory nor reads
    it back: one write by its producer and one read by its consumer saved per value. It never
    costs less than the most expensive op it runs: a formula that charges an op no traffic
    (`op Relu = numel(out)`) would otherwise make the kernel free, and computing a shared conv
    a second time inside it would look cheaper than reading the conv's output. The last
    term, one per op launch saved, decides where the formulas see no difference: accel charges
    nothing for a batch-norm or relu that rides along with its conv, and the kernel it declares
    wins that tie over the separate ops. None (the target cannot run it) when the target cannot
    run one of the pattern's ops.
    """
    ins_at, out_at = interior_types(pattern, attrs, inputs, output)
    costs = []
    order = positions(pattern)
    for k, t in enumerate(order):
        c = target.op_cost(t.op, position_attrs(attrs, k), ins_at[k], out_at[k])
        if c is None or not math.isfinite(c):
            return None
        costs.append(max(0.0, float(c)))
    saved = sum(2 * nbytes(out_at[k]) for k in range(len(order) - 1))
    return max(sum(costs) - saved, max(costs)) - (len(costs) - 1)


def body_attrs(op: str, attrs: dict[str, Any], opset: int) -> dict[str, Any]:
    """The attributes an interior node is written with: those captured at a default value it
    would take anyway are left out, so a body reads as the nodes it replaced."""
    s = spec(op, opset)
    defaults = s.attrs if s else {}
    kept = {}
    for k, v in attrs.items():
        d = defaults.get(k)
        if d is not None and _same(v, d):
            continue
        if s is not None and k not in defaults:
            continue     # an attribute this opset does not define (captured for a newer one)
        kept[k] = v
    return kept


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple, np.ndarray)) or isinstance(b, (list, tuple, np.ndarray)):
        return np.array_equal(np.asarray(a), np.asarray(b))
    return a == b
