"""A DSL rule compiled for egglog: the record the encode stage writes and the saturation loop, the
guard checks and the rule of any op (saturate.engine.fold_any) read."""

from __future__ import annotations

from dataclasses import dataclass, field

from saturate.lang.ast import OpTerm, Rule, Spread, Term


@dataclass
class RhsOp:
    """How a right-hand op gets its attribute set: a fixed id, a left node's id, or computed."""

    op: str
    fixed: int | None = None
    inherit: int | None = None          # index into CompiledRule.lhs_ops
    overrides: tuple = ()               # (key, AttrValue) pairs applied on the inherited set
    column: str = ""                    # Ok column holding a computed id


@dataclass(frozen=True)
class AttrTest:
    """Op `k` of a rule's pattern tests attributes; `relation` holds one row per attribute set
    that passes, with the values of `captures` (attribute variables) taken from it."""

    relation: str
    k: int
    term: OpTerm
    captures: tuple[str, ...]


@dataclass
class CompiledRule:
    """One direction of one DSL rule, as egglog text plus what the Python check needs."""

    rule: Rule
    index: int
    name: str                            # egglog rule name of the rewriting rule
    direction: str
    lhs: Term
    rhs: Term
    lhs_ops: list[OpTerm] = field(default_factory=list)
    vars: list[str] = field(default_factory=list)
    rhs_ops: list[RhsOp] = field(default_factory=list)
    extras: list[tuple[str, Term]] = field(default_factory=list)   # T columns: queries, attrs, lits
    checked: bool = False
    text: list[str] = field(default_factory=list)
    # A guarded rule's `Ok` relation and apply rule, declared when its first Ok row is (most
    # guarded rules never fire on a given graph, and each declaration costs egglog about 1 ms).
    apply_text: list[str] = field(default_factory=list)
    attr_tests: list[AttrTest] = field(default_factory=list)      # decided by relations in egglog
    fold: str = ""       # an instance of the rule of any op: "op" or "opaque" (saturate.engine.fold_any)

    @property
    def group(self) -> str:
        """The egglog ruleset of this rule's matching side, its own so that saturation can run
        it alone (saturate.engine.saturation splits a step that would overrun a limit)."""
        return f"g{self.index}"

    @property
    def label(self) -> str:
        suffix = " (reverse)" if self.direction == "reverse" else ""
        return f"{self.rule.name}{suffix}"

    def cand_columns(self) -> list[str]:
        return ["root"] + [f"v_{v}" for v in self.vars] + [f"a_{k}" for k in range(len(self.lhs_ops))]

    def ok_columns(self) -> list[str]:
        return (self.cand_columns() + [r.column for r in self.rhs_ops if r.column]
                + [c for c, _ in self.extras])


def input_counts(t: Term, into: dict[str, set[int]]) -> None:
    """Add to `into` the input count of every op term in `t` (a variadic one, with a spread, aside)."""
    if isinstance(t, OpTerm) and not any(isinstance(a, Spread) for a in t.args):
        into.setdefault(t.op, set()).add(len(t.args))
    for a in getattr(t, "args", ()):
        input_counts(a, into)
