"""The kinds of the rule language's built-in functions: constant functions, shape queries and guards,
each with its arity, parameter kinds and numpy meaning (the tables are in saturate.lang.builtins, guard_builtins and query_builtins)."""

from __future__ import annotations

from typing import Any, Callable

from saturate.core.values import value_class

Shape = tuple[Any, ...]


@value_class
class ConstFn:
    """A constant-expression function: `params` are argument kinds, `returns` the result kind."""

    arity: int
    impl: Callable[..., Any]
    doc: str
    params: tuple[str, ...]
    returns: str = "const"  # "const" (ndarray) | "int" | "ints"
    # numpy broadcasting of the arguments, result in their dtype (`_elementwise`): the result's
    # type follows from the arguments' types without computing it
    broadcasts: bool = False


@value_class
class QueryFn:
    """An int-valued function of a value's static shape (first parameter, kind "value")."""

    arity: int
    impl: Callable[..., Any]
    doc: str
    params: tuple[str, ...]
    returns: str = "int"


@value_class
class GuardFn:
    """A named guard or comparison; `needs_values` tells shape guards from value guards."""

    arity: int
    impl: Callable[..., bool]
    doc: str
    needs_values: bool
    params: tuple[str, ...]
    # A termination guard only stops rules from feeding on their own output (x * 1 = x would let
    # Mul(Mul(x, 1), b) rebuild b * 1 forever). It never decides soundness, so an engine that
    # cannot decide it may answer True.
    termination: bool = False
