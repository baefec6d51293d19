"""Encode stage: a Graph becomes egglog declarations and `let` bindings, one e-class per value."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from saturate.ir import Graph, Node, ValueInfo
from saturate.ops import spec

# Leaves and the constructors every program has. T is the one sort of tensors.
PRELUDE = """
(sort T)
(constructor Inp (String) T)
(constructor Const (String) T)
(constructor Lit (i64) T)
(constructor Absent () T)
(constructor Out (i64 T) T)
(relation IsConst (T))
(rule ((= e (Const n))) ((IsConst e)) :name "~const-leaf")
(rule ((= e (Lit n))) ((IsConst e)) :name "~lit-leaf")
"""


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


@dataclass
class Encoding:
    """Everything later stages need to read the e-graph back: tables Python keeps beside egglog."""

    graph: Graph
    attr_sets: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    attr_ids: dict[tuple[str, str], int] = field(default_factory=dict)
    lits: list[Any] = field(default_factory=list)
    lit_ids: dict[str, int] = field(default_factory=dict)
    opaque_nodes: list[Node] = field(default_factory=list)
    value_names: dict[str, str] = field(default_factory=dict)   # IR value -> egglog global
    ctors: set[tuple[str, int]] = field(default_factory=set)     # declared (name, arity)
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
        key = canonical_attrs({"v": value}) + type(value).__name__
        got = self.lit_ids.get(key)
        if got is None:
            got = self.lit_ids[key] = len(self.lits)
            self.lits.append(value)
        return got

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
                f'(rule ((= e ({name} {vars_}))) ((IsConst e)) :name "~const-{name}")')


def _is_float(info: ValueInfo) -> bool:
    return info.dtype.startswith("float") or info.dtype == "bfloat16"


def _rewritable(node: Node, graph: Graph, preserve: set[str]) -> bool:
    """Known single-output float ops are open to rules; everything else is opaque."""
    s = spec(node.op)
    if s is None or node.domain not in ("", "ai.onnx") or node.op in preserve:
        return False
    if node.name and node.name in preserve:
        return False
    if len([o for o in node.outputs if o]) != 1 or not (s.min_inputs <= len(node.inputs) <= s.max_inputs):
        return False
    if "" in node.inputs:
        return False
    return _is_float(graph.info(node.outputs[0]))


def encode_graph(graph: Graph, preserve: Iterable[str] = ()) -> Encoding:
    """Turn `graph` into egglog commands (declarations first, then one `let` per value)."""
    enc = Encoding(graph=graph, preserved=set(preserve))
    enc.commands.append(PRELUDE)
    lets: list[str] = []
    names = enc.value_names
    for k, v in enumerate(graph.inputs):
        names[v] = f"$i{k}"
        lets.append(f"(let $i{k} (Inp {egg_str(v)}))")
    for k, c in enumerate(sorted(graph.constants)):
        if c not in names:
            names[c] = f"$c{k}"
            lets.append(f"(let $c{k} (Const {egg_str(c)}))")
    for k, node in enumerate(graph.nodes):
        args = [names[i] if i else "(Absent)" for i in node.inputs]
        if _rewritable(node, graph, enc.preserved):
            ctor = op_ctor(node.op, len(args))
            enc.declare(ctor, len(args))
            term = f"({ctor} {enc.attr_id(node.op, node.attrs)} {' '.join(args)})"
            names[node.outputs[0]] = f"$v{k}"
            lets.append(f"(let $v{k} {term})")
            continue
        ctor = opaque_ctor(len(args))
        enc.declare(ctor, len(args))
        idx = len(enc.opaque_nodes)
        enc.opaque_nodes.append(node)
        lets.append(f"(let $n{k} ({ctor} {idx} {' '.join(args)}))")
        for j, out in enumerate(node.outputs):
            if out:
                names[out] = f"$v{k}_{j}"
                lets.append(f"(let $v{k}_{j} (Out {j} $n{k}))")
    enc.commands.extend(lets)
    return enc


def chunks(commands: list[str], size: int = 64) -> Iterable[str]:
    """Program text in small pieces: egglog 13.2 parses one large text in quadratic time."""
    for k in range(0, len(commands), size):
        yield "\n".join(commands[k:k + size])
