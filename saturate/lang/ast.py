"""Rule AST: what the DSL parser produces and the engine, checker and folder consume."""

from __future__ import annotations

from dataclasses import field
from typing import Union

from saturate.core.values import value_class


@value_class
class Loc:
    """Where something was written: file, 1-based line and column."""

    file: str
    line: int
    col: int = 1

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


# ---- patterns (left-hand sides) and replacements (right-hand sides) -----------------------

@value_class
class Var:
    """A pattern variable. `const=True` (written `c:const`) matches only constant values."""

    name: str
    const: bool = False
    loc: Loc | None = field(default=None, compare=False)


@value_class
class AttrVar:
    """A captured attribute value inside `{key=name}`."""

    name: str
    loc: Loc | None = field(default=None, compare=False)


@value_class
class Num:
    """A numeric literal (in attributes, guards and constant expressions)."""

    value: int | float


@value_class
class Str:
    """A string literal (in attributes)."""

    value: str


@value_class
class IntList:
    """A list of integers (in attributes): `[1, -2]`."""

    values: tuple[int, ...]


# On the right, an attribute may also be computed from captured ones (perm=compose_perm(p, q, r))
# and constants (alpha=c, a constant variable; alpha=a1 * c).
AttrValue = Union[AttrVar, Num, Str, IntList, "Call", Var]


@value_class
class OpTerm:
    """`Op(arg, ...){key=value, ...}`. On the left, attributes not named match anything.
    On the right, an op that also stands on the left keeps the attributes of the node the
    first such left-hand op matched, with the ones written here overriding them; any other
    op starts from the op's defaults."""

    op: str
    args: tuple["Term", ...]
    attrs: tuple[tuple[str, AttrValue], ...] = ()
    loc: Loc | None = field(default=None, compare=False)


@value_class
class Call:
    """A constant expression (right-hand side) or an int-valued query (guards):
    `add sub mul div neg sqrt rsqrt reciprocal per_axis reshape unsqueeze expand transpose vec`
    and queries `rank(v) dim(v, k) numel(v)`, or a function over a list of inputs
    (`sum count sum_before`); see `saturate.lang.builtins` for the full table."""

    fn: str
    args: tuple["Term", ...]
    loc: Loc | None = field(default=None, compare=False)


@value_class
class Spread:
    """`term...` among an op's inputs. On the left, `xs...` (a variable) matches the op's inputs
    from there on, one or more, as the list `xs`; on the right, `term...` stands for one input
    per element of the lists the term names, the list's name reading as that element."""

    term: "Term"
    loc: Loc | None = field(default=None, compare=False)


Term = Union[Var, OpTerm, Call, Num, AttrVar, IntList, Str, Spread]


# ---- guards ---------------------------------------------------------------------------------

@value_class
class Guard:
    """A named guard `name(args)` such as positive(s), or a comparison `lhs OP rhs`
    (fn is one of == != < <= > >= and args is (lhs, rhs))."""

    fn: str
    args: tuple[Term, ...]
    loc: Loc | None = field(default=None, compare=False)


# ---- rules ----------------------------------------------------------------------------------

@value_class
class Rule:
    """One rule, checked: `rule NAME lhs => rhs if guards`, with its ruleset's name and level."""

    name: str
    lhs: Term
    rhs: Term
    guards: tuple[Guard, ...]
    ruleset: str
    level: int
    loc: Loc
    bidirectional: bool = False
    # A rule of several roots (`MatMul(x, a:const) & MatMul(x, b:const) => ... & ...`): the
    # patterns after the first, sharing its variables, and what each of them becomes.
    more_lhs: tuple[Term, ...] = ()
    more_rhs: tuple[Term, ...] = ()

    @property
    def roots(self) -> tuple[tuple[Term, Term], ...]:
        """Every (pattern, replacement) pair, the first root's first."""
        return ((self.lhs, self.rhs),) + tuple(zip(self.more_lhs, self.more_rhs))


@value_class
class RuleSet:
    """The rules under one `ruleset NAME level N` header."""

    name: str
    level: int
    rules: tuple[Rule, ...]
    loc: Loc
