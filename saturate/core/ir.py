"""Graph IR: a typed dataflow DAG of ONNX-style nodes plus a table of numpy constants."""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import FrozenInstanceError, dataclass, field
from typing import Any, Iterable

import numpy as np

from saturate.core.errors import SaturateError
from saturate.core.values import FACTORY

# A dimension is a concrete int, a symbolic name ("N"), or None when unknown.
Dim = int | str | None
Shape = tuple[Dim, ...]


def dtype_name(dtype) -> str:
    """numpy's name of a dtype (`float32`), remembered per dtype: numpy builds it on every ask."""
    got = _DTYPE_NAMES.get(dtype)
    if got is None:
        got = _DTYPE_NAMES[dtype] = dtype.name
    return got


_DTYPE_NAMES: dict = {}
_MAX_DIM = 2**63 - 1


def numpy_native(dtype, kinds: str = "biuf") -> bool:
    """`dtype` is one of numpy's own types of these kinds (bool, integer, float): not ml_dtypes'
    float8, bfloat16 or int4, whose isbuiltin is 2 and some of which claim kind "f" (float8_e5m2)."""
    return dtype.isbuiltin == 1 and dtype.kind in kinds


# The IR's classes are dataclasses whose __init__, __repr__ and __eq__ (and frozen refusals) are
# written out below rather than generated: dataclass writes them as Python text and compiles them
# at every import (about a millisecond a class, at every start of every command). They do what
# @dataclass (frozen=True for OpaqueAttr) would; tests/test_startup.py holds them against it.


@dataclass(init=False, repr=False, eq=False)
class ValueInfo:
    """Static type of one value: dtype name (numpy spelling) and shape (None when unknown)."""

    dtype: str = "float32"
    shape: Shape | None = None

    def __init__(self, dtype: str = "float32", shape: Shape | None = None) -> None:
        self.dtype = dtype
        self.shape = shape

    def __repr__(self) -> str:
        return f"{self.__class__.__qualname__}(dtype={self.dtype!r}, shape={self.shape!r})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return (self.dtype, self.shape) == (other.dtype, other.shape)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)


@dataclass(init=False, repr=False, eq=False)
class Node:
    """One operation. Inputs and outputs name values; '' marks an omitted optional input.

    Attribute values are Python ints, floats, strings, bytes, lists of those, numpy arrays
    (tensor attributes) or `OpaqueAttr` for what the project does not interpret (subgraphs).
    A node with subgraphs (If, Loop, Scan) lists, after its own inputs, the outer values its
    subgraphs read (frontend.onnx_scope): every stage sees that dependency as an input.
    """

    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    domain: str = ""

    def __init__(self, op: str, inputs: list[str], outputs: list[str], attrs: dict[str, Any] = FACTORY,
                 name: str = "", domain: str = "") -> None:
        self.op = op
        self.inputs = inputs
        self.outputs = outputs
        self.attrs = {} if attrs is FACTORY else attrs
        self.name = name
        self.domain = domain

    def __repr__(self) -> str:
        return (f"{self.__class__.__qualname__}(op={self.op!r}, inputs={self.inputs!r}, outputs={self.outputs!r}, "
                f"attrs={self.attrs!r}, name={self.name!r}, domain={self.domain!r})")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return ((self.op, self.inputs, self.outputs, self.attrs, self.name, self.domain)
                    == (other.op, other.inputs, other.outputs, other.attrs, other.name, other.domain))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def where(self) -> str:
        """How errors name this node: `node 'conv1' (Conv)`."""
        return f"node '{self.name or self.outputs[0]}' ({self.op})"


@dataclass(init=False, repr=False, eq=False)
class OpaqueAttr:
    """An attribute kept byte-for-byte (for instance a subgraph), carried through untouched."""

    kind: str
    payload: bytes

    def __init__(self, kind: str, payload: bytes) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "payload", payload)

    def __repr__(self) -> str:
        return f"{self.__class__.__qualname__}(kind={self.kind!r}, payload={self.payload!r})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return (self.kind, self.payload) == (other.kind, other.payload)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.kind, self.payload))

    def __setattr__(self, name: str, value: Any) -> None:
        if type(self) is OpaqueAttr or name in ("kind", "payload"):
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if type(self) is OpaqueAttr or name in ("kind", "payload"):
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super().__delattr__(name)


@dataclass(init=False, repr=False, eq=False)
class Graph:
    """A dataflow graph.

    `nodes` is kept in topological order. Every value (graph input, constant, node output)
    may have a `ValueInfo` in `values`; constants hold their data in `constants`.
    """

    nodes: list[Node] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, ValueInfo] = field(default_factory=dict)
    name: str = "graph"
    opset: int = 17
    # Metadata that import found and export should write back (producer, other opset domains).
    meta: dict[str, Any] = field(default_factory=dict)

    def __init__(self, nodes: list[Node] = FACTORY, inputs: list[str] = FACTORY, outputs: list[str] = FACTORY,
                 constants: dict[str, np.ndarray] = FACTORY, values: dict[str, ValueInfo] = FACTORY,
                 name: str = "graph", opset: int = 17, meta: dict[str, Any] = FACTORY) -> None:
        self.nodes = [] if nodes is FACTORY else nodes
        self.inputs = [] if inputs is FACTORY else inputs
        self.outputs = [] if outputs is FACTORY else outputs
        self.constants = {} if constants is FACTORY else constants
        self.values = {} if values is FACTORY else values
        self.name = name
        self.opset = opset
        self.meta = {} if meta is FACTORY else meta

    def __repr__(self) -> str:
        return (f"{self.__class__.__qualname__}(nodes={self.nodes!r}, inputs={self.inputs!r}, "
                f"outputs={self.outputs!r}, constants={self.constants!r}, values={self.values!r}, "
                f"name={self.name!r}, opset={self.opset!r}, meta={self.meta!r})")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return ((self.nodes, self.inputs, self.outputs, self.constants, self.values, self.name, self.opset,
                     self.meta) == (other.nodes, other.inputs, other.outputs, other.constants, other.values,
                                    other.name, other.opset, other.meta))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    # ---- queries -------------------------------------------------------------------------
    def producers(self) -> dict[str, Node]:
        """Map from value name to the node that produces it."""
        return {out: n for n in self.nodes for out in n.outputs if out}

    def consumers(self) -> dict[str, list[Node]]:
        """Map from value name to the nodes that read it (a node reading twice appears twice)."""
        users: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    users.setdefault(i, []).append(n)
        return users

    def info(self, value: str) -> ValueInfo:
        if value in self.values:
            return self.values[value]
        if value in self.constants:
            c = self.constants[value]
            return ValueInfo(dtype_name(c.dtype), tuple(c.shape))
        return ValueInfo(shape=None)

    def is_constant(self, value: str) -> bool:
        return value in self.constants

    def op_counts(self) -> Counter:
        return Counter(n.op for n in self.nodes)

    def copy(self, arrays: bool = True) -> Graph:
        """Deep copy; constant arrays are copied too so callers may mutate freely, unless not
        `arrays`: then the copy holds the same arrays (the IR never changes one in place)."""
        g = copy.copy(self)
        g.nodes = [Node(n.op, list(n.inputs), list(n.outputs), dict(n.attrs), n.name, n.domain)
                   for n in self.nodes]
        g.inputs = list(self.inputs)
        g.outputs = list(self.outputs)
        g.constants = {k: v.copy() for k, v in self.constants.items()} if arrays else dict(self.constants)
        g.values = {k: ValueInfo(v.dtype, v.shape) for k, v in self.values.items()}
        g.meta = dict(self.meta)
        return g

    # ---- structure -----------------------------------------------------------------------
    def toposort(self) -> None:
        """Reorder nodes topologically (stable: keeps the current order where it can)."""
        produced = self.producers()
        placed: set[int] = set()
        order: list[Node] = []
        ready = set(self.inputs) | set(self.constants)

        # Iterative DFS so deep chains (thousands of blocks) do not hit the recursion limit.
        for root in self.nodes:
            if id(root) in placed:
                continue
            stack: list[tuple[Node, int]] = [(root, 0)]
            on_stack = {id(root)}
            while stack:
                node, k = stack[-1]
                if k < len(node.inputs):
                    stack[-1] = (node, k + 1)
                    src = node.inputs[k]
                    if not src or src in ready:
                        continue
                    dep = produced.get(src)
                    if dep is None or id(dep) in placed:
                        continue
                    if id(dep) in on_stack:
                        raise SaturateError(f"graph has a cycle through {dep.where()}")
                    stack.append((dep, 0))
                    on_stack.add(id(dep))
                else:
                    stack.pop()
                    on_stack.discard(id(node))
                    placed.add(id(node))
                    order.append(node)
        self.nodes = order

    def remove_dead(self) -> None:
        """Drop nodes and constants that no graph output depends on."""
        produced = self.producers()
        live: set[str] = set()
        work = [o for o in self.outputs]
        keep: set[int] = set()
        while work:
            v = work.pop()
            if v in live:
                continue
            live.add(v)
            n = produced.get(v)
            if n is not None and id(n) not in keep:
                keep.add(id(n))
                work.extend(i for i in n.inputs if i)
        self.nodes = [n for n in self.nodes if id(n) in keep]
        self.constants = {k: v for k, v in self.constants.items() if k in live}
        known = live | set(self.inputs) | {o for n in self.nodes for o in n.outputs}
        self.values = {k: v for k, v in self.values.items() if k in known}

    def validate(self) -> None:
        """Check that every input is defined before use, every output exists, and every declared
        dimension is one a tensor can have (0 to 2**63 - 1, as ONNX stores it)."""
        for name, info in self.values.items():
            for d in info.shape or ():
                if isinstance(d, (int, np.integer)) and not 0 <= d <= _MAX_DIM:
                    raise SaturateError(f"value '{name}' has dimension {d}, outside 0 to {_MAX_DIM}")
        defined = set(self.inputs) | set(self.constants)
        for n in self.nodes:
            for i in n.inputs:
                if i and i not in defined:
                    raise SaturateError(f"{n.where()} reads '{i}', which is not defined before it")
            for o in n.outputs:
                if o and o in defined:
                    raise SaturateError(f"{n.where()} redefines value '{o}'")
                defined.add(o)
        for o in self.outputs:
            if o not in defined:
                raise SaturateError(f"graph output '{o}' is not defined")

    def fresh_name(self, base: str) -> str:
        """A value or node name not yet used in the graph."""
        return unique_name(base, self._used_names())

    def _used_names(self) -> set[str]:
        used = set(self.inputs) | set(self.constants) | set(self.values)
        for n in self.nodes:
            used.update(n.outputs)
            used.add(n.name)
        return used


def unique_name(base: str, used: set[str] | dict, first: int = 1) -> str:
    """`base` if unused, else `base_K` with the smallest K >= first that is unused."""
    if base not in used:
        return base
    k = first
    while f"{base}_{k}" in used:
        k += 1
    return f"{base}_{k}"


def structurally_equal(a: Graph, b: Graph) -> bool:
    """Same nodes, inputs, outputs, value types and constant data (names included)."""
    return not graph_differences(a, b)


def graph_differences(a: Graph, b: Graph) -> list[str]:
    """Human-readable list of differences between two graphs (empty when equal)."""
    diffs: list[str] = []
    if a.inputs != b.inputs:
        diffs.append(f"inputs {a.inputs} != {b.inputs}")
    if a.outputs != b.outputs:
        diffs.append(f"outputs {a.outputs} != {b.outputs}")
    if len(a.nodes) != len(b.nodes):
        diffs.append(f"{len(a.nodes)} nodes != {len(b.nodes)} nodes")
    for na, nb in zip(a.nodes, b.nodes):
        if (na.op, na.inputs, na.outputs, na.domain) != (nb.op, nb.inputs, nb.outputs, nb.domain):
            diffs.append(f"{na.where()} {na.inputs}->{na.outputs} != {nb.where()} {nb.inputs}->{nb.outputs}")
        elif not _attrs_equal(na.attrs, nb.attrs):
            diffs.append(f"{na.where()} attributes {na.attrs} != {nb.attrs}")
    if set(a.constants) != set(b.constants):
        diffs.append(f"constants {sorted(a.constants)} != {sorted(b.constants)}")
    for k in set(a.constants) & set(b.constants):
        x, y = a.constants[k], b.constants[k]
        if x.dtype != y.dtype or x.shape != y.shape or not np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
            diffs.append(f"constant '{k}' differs")
    for k in set(a.values) | set(b.values):
        if a.info(k) != b.info(k):
            diffs.append(f"value '{k}': {a.info(k)} != {b.info(k)}")
    return diffs


def _attrs_equal(x: dict, y: dict) -> bool:
    if set(x) != set(y):
        return False
    for k in x:
        u, v = x[k], y[k]
        if isinstance(u, np.ndarray) or isinstance(v, np.ndarray):
            if not (isinstance(u, np.ndarray) and isinstance(v, np.ndarray)
                    and u.dtype == v.dtype and np.array_equal(u, v)):
                return False
        elif u != v:
            return False
    return True


def op_count_table(counts: Iterable[tuple[str, int]]) -> str:
    """Render op counts as aligned lines, most frequent first."""
    rows = sorted(counts, key=lambda kv: (-kv[1], kv[0]))
    width = max((len(op) for op, _ in rows), default=0)
    return "\n".join(f"  {op:<{width}}  {n}" for op, n in rows)
