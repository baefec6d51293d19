"""Encode stage: a Graph becomes egglog declarations and `let` bindings, one e-class per value."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from saturate.core.ir import Graph, Node, ValueInfo
from saturate.core.ops import is_rewritable_op, op_table, spec

# Leaves and the constructors every program has. T is the one sort of tensors. `(Ref k)` is a
# handle Python uses to name an e-class in later commands (egglog `let` globals each cost a
# table, and thousands of them made building superlinear).
PRELUDE = """
(sort T)
(constructor Inp (String) T)
(constructor Const (String) T)
(constructor Lit (i64) T)
(constructor Absent () T)
(constructor Out (i64 T) T)
(constructor Ref (i64) T)
(relation IsConst (T))
(ruleset apply)
(ruleset facts)
(rule ((= e (Const n))) ((IsConst e)) :ruleset facts :name "~const-leaf")
(rule ((= e (Lit n))) ((IsConst e)) :ruleset facts :name "~lit-leaf")
"""


CHUNK_CHARS = 2000


def op_ctor(op: str, arity: int) -> str:
    """egglog constructor name of a known op with `arity` inputs (first argument: attribute-set id)."""
    return f"Op_{op}_{arity}"


def opaque_ctor(arity: int) -> str:
    """Constructor of an opaque node: node index, then its inputs."""
    return f"Opq_{arity}"


def k_ctor(fn: str, arity: int) -> str:
    """Constructor of a constant expression `fn(args)`, evaluated by the fold stage."""
    return f"K_{fn}_{arity}"


def egg_str(s: str) -> str:
    """An egglog string literal."""
    return json.dumps(s)


def canonical_attrs(attrs: dict[str, Any]) -> str:
    """A stable text key for an attribute dict, so equal dicts share one attribute-set id."""
    def norm(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return ["ndarray", str(v.dtype), list(v.shape), v.tobytes().hex()]
        if isinstance(v, (list, tuple)):
            return [norm(x) for x in v]
        if isinstance(v, bytes):
            return ["bytes", v.hex()]
        if isinstance(v, (np.integer, np.floating)):
            return v.item()
        if isinstance(v, (int, float, str)) or v is None:
            return v
        return ["repr", repr(v)]
    return json.dumps({k: norm(v) for k, v in sorted(attrs.items())}, sort_keys=True)


def _lit_key(v: Any) -> Any:
    """A hashable key equal for equal literals: canonical_attrs's distinctions (an int is not a
    float, a list keeps its order, an array its dtype and shape) without printing anything."""
    if isinstance(v, np.ndarray):
        return ("ndarray", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, (list, tuple)):
        return ("list", tuple(_lit_key(x) for x in v))
    if isinstance(v, (np.integer, np.floating)):
        v = v.item()
    if isinstance(v, float):
        return ("float", v)
    if isinstance(v, (bool, int, str, bytes)) or v is None:
        return (type(v).__name__, v)
    return ("repr", repr(v))


@dataclass
class Encoding:
    """Everything later stages need to read the e-graph back: tables Python keeps beside egglog."""

    graph: Graph
    attr_sets: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    attr_ids: dict[tuple[str, str], int] = field(default_factory=dict)
    lits: list[Any] = field(default_factory=list)
    lit_ids: dict[tuple, int] = field(default_factory=dict)
    opaque_nodes: list[Node] = field(default_factory=list)
    value_names: dict[str, str] = field(default_factory=dict)   # IR value -> `(Ref k)` handle
    ctors: set[tuple[str, int]] = field(default_factory=set)     # declared (name, arity)
    refs: int = 0
    _infos: dict[str, ValueInfo] | None = None
    _encoded_ops: list | None = None            # see saturate.engine.facts._encoded_ops
    _lit_objects: dict[int, tuple[Any, int]] = field(default_factory=dict)   # id(value) -> (value, lit id)
    commands: list[str] = field(default_factory=list)
    # Node names that must not change; value names for the outputs of preserved nodes.
    preserved: set[str] = field(default_factory=set)

    def attr_id(self, op: str, attrs: dict[str, Any]) -> int:
        """Id of an attribute set of `op`, registering it on first sight."""
        key = (op, canonical_attrs(attrs))
        got = self.attr_ids.get(key)
        if got is None:
            got = self.attr_ids[key] = len(self.attr_sets)
            self.attr_sets.append((op, dict(attrs)))
        return got

    def lit_id(self, value: Any) -> int:
        """Id of a literal (number, string, int list) a rule or an attribute puts in the graph."""
        # Guards hand over the same value objects again and again (Facts caches them): an
        # object seen before skips printing it (an array's bytes in hex) to find its key.
        seen = self._lit_objects.get(id(value))
        if seen is not None and seen[0] is value:
            return seen[1]
        key = (type(value).__name__, _lit_key(value))
        got = self.lit_ids.get(key)
        if got is None:
            got = self.lit_ids[key] = len(self.lits)
            self.lits.append(value)
        self._lit_objects[id(value)] = (value, got)
        return got

    def value_infos(self) -> dict[str, ValueInfo]:
        """Static type of every original value (computed once per encoding)."""
        if self._infos is None:
            self._infos = {v: self.graph.info(v) for v in self.value_names}
        return self._infos

    def new_ref(self) -> str:
        """A fresh `(Ref k)` handle."""
        self.refs += 1
        return f"(Ref {self.refs - 1})"

    def declare(self, name: str, arity: int, first_i64: bool = True) -> None:
        """Declare a constructor once: `first_i64` adds a leading i64 (attribute set or node index)."""
        if (name, arity) in self.ctors:
            return
        self.ctors.add((name, arity))
        args = (["i64"] if first_i64 else []) + ["T"] * arity
        self.commands.append(f"(constructor {name} ({' '.join(args)}) T)")
        if name.startswith("K_"):
            vars_ = " ".join(f"a{i}" for i in range(arity))
            self.commands.append(
                f'(rule ((= e ({name} {vars_}))) ((IsConst e)) :ruleset facts :name "~const-{name}")')


def _is_float(info: ValueInfo) -> bool:
    return info.dtype.startswith("float") or info.dtype == "bfloat16"


def _rewritable(node: Node, graph: Graph, preserve: set[str], rule_ops: set[str], read: set[str]) -> bool:
    """Single-output float ops the engine works on or a rule names (shape ops of any dtype) are open
    to rules; others are opaque. An op only a rule's `op Name/N` declares is open whatever its dtype.
    Outputs nobody reads (Dropout's mask, an inference BatchNormalization's running statistics)
    do not count: such a node is a single-output term and loses them when rewritten."""
    if node.domain not in ("", "ai.onnx") or node.op in preserve or (node.name and node.name in preserve):
        return False
    if not node.outputs or not node.outputs[0] or any(o in read for o in node.outputs[1:] if o):
        return False
    if "" in node.inputs:
        return False
    s = spec(node.op, graph.opset)
    if s is None:
        return node.op in rule_ops
    if not (is_rewritable_op(node.op) or node.op in rule_ops):
        return False
    # Arity as any version defines it: a model may keep an older form (Unsqueeze's axes attribute).
    widest = op_table()[node.op]
    if not widest.min_inputs <= len(node.inputs) <= widest.max_inputs:
        return False
    return s.any_dtype or _is_float(graph.info(node.outputs[0]))


def encode_graph(graph: Graph, preserve: Iterable[str] = (), rule_ops: Iterable[str] = ()) -> Encoding:
    """Turn `graph` into egglog commands: declarations, then one `(Ref k)` handle per value.
    `rule_ops` are ops the rules name that the op table does not know (declared in .rules)."""
    enc = Encoding(graph=graph, preserved=set(preserve))
    rule_ops = set(rule_ops)
    enc.commands.append(PRELUDE)
    lets: list[str] = []
    names = enc.value_names

    def bind(value: str, term: str) -> str:
        ref = enc.new_ref()
        lets.append(f"(union {ref} {term})")
        names[value] = ref
        return ref

    # Leaves name themselves: `(Const "w")` is already a handle, with no command to run.
    for v in graph.inputs:
        names[v] = f"(Inp {egg_str(v)})"
        lets.append(names[v])
    for c in sorted(graph.constants):
        if c not in names:
            names[c] = f"(Const {egg_str(c)})"
            lets.append(names[c])
    read = set(graph.outputs) | {i for n in graph.nodes for i in n.inputs}
    for node in graph.nodes:
        args = [names[i] if i else "(Absent)" for i in node.inputs]
        if _rewritable(node, graph, enc.preserved, rule_ops, read):
            ctor = op_ctor(node.op, len(args))
            enc.declare(ctor, len(args))
            bind(node.outputs[0], f"({ctor} {enc.attr_id(node.op, node.attrs)} {' '.join(args)})")
            continue
        ctor = opaque_ctor(len(args))
        enc.declare(ctor, len(args))
        idx = len(enc.opaque_nodes)
        enc.opaque_nodes.append(node)
        opq = f"({ctor} {idx} {' '.join(args)})"
        for j, out in enumerate(node.outputs):
            if out:
                bind(out, f"(Out {j} {opq})")
    enc.commands.extend(lets)
    return enc


def chunks(commands: list[str], budget: int = CHUNK_CHARS) -> Iterable[str]:
    """Program text in pieces of about `budget` characters: egglog 13.2 parses one text in
    time quadratic in its length, while each call has a fixed cost; a few KB balances both."""
    piece: list[str] = []
    size = 0
    for cmd in commands:
        piece.append(cmd)
        size += len(cmd)
        if size >= budget:
            yield "\n".join(piece)
            piece, size = [], 0
    if piece:
        yield "\n".join(piece)
