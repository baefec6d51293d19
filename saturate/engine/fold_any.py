"""Encode stage, the rule of any op (`op(xs:const...) => evaluate(op, xs...)`, saturate.lang.fold).

egglog matches one constructor per op and input count, so the schema compiles to one rule per
such pair the e-graph can hold, each an ordinary guarded rule:

- over op e-nodes: `Op(xs_0:const, ..., xs_n-1:const) => evaluate(<matched node>, xs_0, ...)` for
  each op the graph encodes as a term, or a rule builds, with n inputs;
- over opaque nodes (ops no rule names, nodes of several outputs): output j of
  `Opq_n(node, xs_0, ..., xs_n-1)`, each input a constant or omitted, for each n the graph's
  opaque nodes have. Its Cand rows carry j and the node's index where an op's carry attribute
  sets, and the check reads the node from the encoding.

The matched node (op, attributes, output, opset) reaches the right side as a literal computed per
match, so the fold stage evaluates it like any constant expression.
"""

from __future__ import annotations

from saturate.engine.compiled_rule import CompiledRule, input_counts
from saturate.engine.encode import Encoding, k_ctor, opaque_ctor
from saturate.lang import fold
from saturate.lang.ast import Call, OpTerm, Rule, Term, Var

# Read by the opaque instances: a constant, or an omitted input (Absent). Leaves count in the
# same run that marks them constant (the first step of a run would find no match otherwise).
FOLD_ARG = """(relation FoldArg (T))
(rule ((= e (Const n))) ((FoldArg e)) :ruleset facts :name "~fold-arg-leaf")
(rule ((IsConst e)) ((FoldArg e)) :ruleset facts :name "~fold-arg-const")
(rule ((= e (Absent))) ((FoldArg e)) :ruleset facts :name "~fold-arg-absent")"""


def instance(rule: Rule, op: str, n: int) -> Rule:
    """The schema rule for op `op` with `n` inputs, as an ordinary rule over an op e-node."""
    lhs, rhs = rule.lhs, rule.rhs
    xs = lhs.args[0].term
    names = [Var(f"{xs.name}_{k}", True, xs.loc) for k in range(n)]
    return Rule(rule.name, OpTerm(op, tuple(names), (), lhs.loc),
                Call(fold.EVALUATE, (Call(fold.SPEC, (), rhs.loc), *[Var(v.name, False, v.loc) for v in names]),
                     rhs.loc),
                rule.guards, rule.ruleset, rule.level, rule.loc)


def instances_for(rule: Rule, enc: Encoding, others: list[Rule]) -> list[tuple[str, Rule]]:
    """The schema's instances this encoding needs, each with its kind ("op" or "opaque"): one per
    op and input count among the graph's op e-nodes and what the other rules build, and one per
    input count of the graph's opaque nodes. An op another rule folds whenever its inputs are
    constants (fold-add...) is left to that rule, and so is an op no instance could fold."""
    counts: dict[str, set[int]] = {}
    for node, _ in enc._encoded_ops or ():
        counts.setdefault(node.op, set()).add(len(node.inputs))
    for r in others:
        input_counts(r.rhs, counts)
    covered = {(r.lhs.op, len(r.lhs.args)) for r in others if _folds_always(r)}
    opset = enc.graph.opset
    out = []
    for op in sorted(counts):
        if not _may_fold(op, opset):
            continue
        for n in sorted(counts[op]):
            if n >= 1 and (op, n) not in covered:
                out.append(("op", instance(rule, op, n)))
    arities = sorted({len(node.inputs) for node in enc.opaque_nodes
                      if node.inputs and node.domain in ("", "ai.onnx") and _may_fold(node.op, opset)})
    for n in arities:
        out.append(("opaque", instance(rule, "Opq", n)))
    return out


def _may_fold(op: str, opset: int) -> bool:
    return fold.plausible(op, opset)


def _folds_always(r: Rule) -> bool:
    """A rule that folds its op whenever every input is a constant: a pattern of constant
    variables alone, no attribute it tests, no guard, a constant expression on the right."""
    lhs = r.lhs
    return (isinstance(lhs, OpTerm) and not r.guards and isinstance(r.rhs, Call)
            and all(isinstance(a, Var) and a.const for a in lhs.args)
            and all(not hasattr(v, "value") and not hasattr(v, "values") for _, v in lhs.attrs))


def compile_opaque(cr: CompiledRule, enc: Encoding, first: bool) -> None:
    """egglog text of an instance over opaque nodes (`cr.rule`'s pattern names `Opq` with n
    inputs): the match rule recording Cand rows (root, inputs, output index, node index), the
    apply rule uniting the root with `evaluate` of them."""
    rule = cr.rule
    names = [a.name for a in rule.lhs.args]
    n = len(names)
    cr.vars = list(names)
    # Two i64 columns where an op's match has its attribute set: the output index and the node.
    cr.lhs_ops = [OpTerm("Out", ()), OpTerm("Opq", ())]
    cr.extras = [("x_0", rule.rhs.args[0])]
    cr.checked = True
    ctor = opaque_ctor(n)
    enc.declare(ctor, n)
    body_ctor = k_ctor(fold.EVALUATE, n + 1)
    enc.declare(body_ctor, n + 1, first_i64=False)
    enc.wrote(n + 1, rule, rule.rhs)
    args = " ".join(f"v_{v}" for v in names)
    query = " ".join(["(= root (Out a_0 t_1))", f"(= t_1 ({ctor} a_1 {args}))"]
                     + [f"(FoldArg v_{v})" for v in names])
    cand = " ".join(cr.cand_columns())
    sorts = ["T"] * (1 + n) + ["i64"] * 2
    if first:
        cr.text.append(FOLD_ARG)
    cr.text.append(f"(relation Cand_{cr.index} ({' '.join(sorts)}))")
    cr.text.append(f'(ruleset {cr.group})\n(rule ({query}) ((Cand_{cr.index} {cand})) '
                   f':ruleset {cr.group} :name "m{cr.name}")')
    ok = cr.ok_columns()
    cr.apply_text.append(f"(relation Ok_{cr.index} ({' '.join(['i64'] * len(ok))}))")
    classes = 1 + n
    bind = [f"(let {c} (Ref k_{c}))" for c in ok[:classes]] + ["(let x_0 (Lit k_x_0))"]
    heads = [f"k_{c}" for c in ok[:classes]] + ["a_0", "a_1", "k_x_0"]
    body = f"({body_ctor} x_0 {args})"
    cr.apply_text.append(f'(rule ((Ok_{cr.index} {" ".join(heads)})) ({" ".join(bind)} (union root {body})) '
                         f':ruleset apply :name "{cr.name}")')


def matched(cr: CompiledRule, enc: Encoding, columns: list[int]) -> tuple[fold.Matched, list[dict]]:
    """The node a candidate of an instance matched, and the attribute sets `decide` reads (in
    `cr.lhs_ops` order), from the candidate's i64 columns."""
    limit = enc.max_fold_bytes
    if cr.fold == "opaque":
        j, idx = columns
        node = enc.opaque_nodes[idx]
        kept = node.op in enc.preserved or bool(node.name and node.name in enc.preserved)
        return fold.Matched(node.op, dict(node.attrs), j, len(node.outputs), enc.graph.opset, node.domain,
                            kept, limit), [{}, {}]
    op, attrs = enc.attr_sets[columns[0]]
    return fold.Matched(op, dict(attrs), 0, 1, enc.graph.opset, max_bytes=limit), [attrs]


def is_instance(t: Term) -> bool:
    """Whether a right side is the schema's `evaluate(<matched node>, ...)`."""
    return isinstance(t, Call) and t.fn == fold.EVALUATE and bool(t.args) \
        and isinstance(t.args[0], Call) and t.args[0].fn == fold.SPEC
