"""Value classes: dataclasses whose methods are shared functions rather than code compiled for
each class at import."""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import FrozenInstanceError
from typing import Any, Callable


class _Factory:
    """dataclass's own sentinel prints so too."""

    def __repr__(self) -> str:
        return "<factory>"


# The default of an argument left to its field's default_factory, in a dataclass whose __init__
# is written out (saturate.core.ir's, for one) rather than compiled by dataclass.
FACTORY: Any = _Factory()


def value_class(cls: type) -> type:
    """`@dataclass(frozen=True)` without the methods dataclass writes as Python text and compiles
    for each class (about a millisecond a class, most of what defining such classes cost each
    process): a dataclass of the same fields (dataclasses.fields, replace and asdict see no
    difference) whose __init__, __repr__, __eq__, __hash__ and refusal to assign are functions
    shared by every such class, built from its fields. Their construction is slower (about 0.5
    against 0.1 microseconds): for classes made by the thousand at most, such as the rules' AST,
    not for a graph's nodes and values. Not for a class with __post_init__, ClassVar, InitVar,
    keyword-only or non-init fields: dataclass itself serves those."""
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
    required = n - len(defaults)
    if any(k in defaults for k in names[:required]):
        raise TypeError(f"{cls_name}: a field without a default follows one with a default")
    trailing = [defaults[k] for k in names[required:]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not kwargs and len(args) == n:   # how nearly every object is made
            self.__dict__.update(zip(names, args))
            return
        if not kwargs and required <= len(args) < n:   # the rest left to their defaults
            d = self.__dict__
            d.update(zip(names, args))
            for f in trailing[len(args) - required:]:
                d[f.name] = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
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
