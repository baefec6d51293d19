"""Rule AST: what the DSL parser produces and the engine, checker and folder consume."""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import FrozenInstanceError, field
from typing import Any, Callable, Union


def value_class(cls: type) -> type:
    """`@dataclass(frozen=True)` without the methods dataclass writes as Python text and compiles
    for each class (about a millisecond a class, most of what defining these classes cost each
    process): a dataclass of the same fields (dataclasses.fields, replace and asdict see no
    difference) whose __init__, __repr__, __eq__, __hash__ and refusal to assign are functions
    shared by every such class, built from its fields. Not for a class with __post_init__,
    ClassVar, InitVar, keyword-only or non-init fields: dataclass itself serves those."""
    if "__post_init__" in vars(cls) or "__init__" in vars(cls):
        raise TypeError(f"{cls.__name__} has its own construction: use @dataclass")
    if not cls.__doc__:
        # dataclass would describe the class by its signature (inspect.signature, slow)
        raise TypeError(f"{cls.__name__} needs a docstring")
    cls = dataclasses.dataclass(init=False, repr=False, eq=False)(cls)
    fields = dataclasses.fields(cls)
    if len(fields) != len(cls.__dataclass_fields__) or any(not f.init or f.kw_only for f in fields):
        raise TypeError(f"{cls.__name__} has fields __init__ does not take in order: use @dataclass")
    names = tuple(f.name for f in fields)
    defaults = {f.name: f for f in fields
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    cls.__init__ = _init(cls.__name__, names, defaults)
    cls.__repr__ = _repr(tuple(f.name for f in fields if f.repr))
    compared = _getter(tuple(f.name for f in fields if f.compare))
    hashed = _getter(tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash)))
    cls.__eq__ = lambda self, other: (compared(self) == compared(other) if other.__class__ is self.__class__
                                      else NotImplemented)
    cls.__hash__ = lambda self: hash(hashed(self))
    cls.__setattr__, cls.__delattr__ = _frozen(cls, frozenset(names))
    return cls


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple]:
    """The tuple of these fields of an object, as dataclass compares and hashes it."""
    if len(names) > 1:
        return operator.attrgetter(*names)
    if names:
        name = names[0]
        return lambda obj: (getattr(obj, name),)
    return lambda obj: ()


def _init(cls_name: str, names: tuple[str, ...], defaults: dict[str, dataclasses.Field]) -> Callable[..., None]:
    n = len(names)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not kwargs and len(args) == n:   # how nearly every object is made
            self.__dict__.update(zip(names, args))
            return
        if len(args) > n:
            raise TypeError(f"{cls_name}.__init__() takes {n + 1} positional arguments but {len(args) + 1} were given")
        values = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in names:
                raise TypeError(f"{cls_name}.__init__() got an unexpected keyword argument {key!r}")
            if key in values:
                raise TypeError(f"{cls_name}.__init__() got multiple values for argument {key!r}")
            values[key] = value
        missing = [k for k in names if k not in values and k not in defaults]
        if missing:
            raise TypeError(f"{cls_name}.__init__() missing {len(missing)} required argument"
                            f"{'s' * (len(missing) > 1)}: {', '.join(map(repr, missing))}")
        for key in names:
            if key not in values:
                f = defaults[key]
                values[key] = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        self.__dict__.update((k, values[k]) for k in names)

    return __init__


def _repr(shown: tuple[str, ...]) -> Callable[[Any], str]:
    # "(name={!r}, const={!r})" filled by one str.format: every rule's terms are printed to sort
    # the rules (saturate.pipeline.canonical_order), so this is a path of every run.
    template = "(" + ", ".join(f"{k}={{!r}}" for k in shown) + ")"
    values = _getter(shown)

    def __repr__(self: Any) -> str:
        return self.__class__.__qualname__ + template.format(*values(self))

    return __repr__


def _frozen(cls: type, names: frozenset[str]) -> tuple[Callable[..., None], Callable[..., None]]:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __setattr__, __delattr__


@value_class
class Loc:
    """Where something was written: file, 1-based line and column."""

    file: str
    line: int
    col: int = 1

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


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
