"""Encode stage: a Graph becomes egglog declarations and `let` bindings, one e-class per value."""

from __future__ import annotations

import json
import os
import tempfile
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
(relation Named (i64 T))
(rule ((Named k t)) ((union (Ref k) t)) :ruleset apply :name "~named")
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


def _lit_key(v: Any) -> Any:
    """A hashable key equal for equal literals: an int is not a float nor a bool, a list or tuple
    keeps its order, an array its dtype and shape; nothing is printed to make it."""
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


def _attrs_key(attrs: dict[str, Any]) -> tuple:
    """A hashable key equal for equal attribute dicts, as `_lit_key` compares their values."""
    return tuple(sorted((k, _lit_key(v)) for k, v in attrs.items()))


@dataclass
class Encoding:
    """Everything later stages need to read the e-graph back: tables Python keeps beside egglog."""

    graph: Graph
    attr_sets: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    attr_ids: dict[tuple[str, tuple], int] = field(default_factory=dict)
    lits: list[Any] = field(default_factory=list)
    lit_ids: dict[tuple, int] = field(default_factory=dict)
    opaque_nodes: list[Node] = field(default_factory=list)
    value_names: dict[str, str] = field(default_factory=dict)   # IR value -> `(Ref k)` handle
    ctors: set[tuple[str, int]] = field(default_factory=set)     # declared (name, arity)
    refs: int = 0
    _infos: dict[str, ValueInfo] | None = None
    _encoded_ops: list | None = None            # see saturate.engine.facts._encoded_ops
    commands: list[str] = field(default_factory=list)
    # Rows of the encoding relations, tab-separated, loaded with egglog's `input` (see `load`).
    tables: dict[str, list[str]] = field(default_factory=dict)
    # Node names that must not change; value names for the outputs of preserved nodes.
    preserved: set[str] = field(default_factory=set)

    def attr_id(self, op: str, attrs: dict[str, Any]) -> int:
        """Id of an attribute set of `op`, registering it on first sight."""
        key = (op, _attrs_key(attrs))
        got = self.attr_ids.get(key)
        if got is None:
            got = self.attr_ids[key] = len(self.attr_sets)
            self.attr_sets.append((op, dict(attrs)))
        return got

    def known_attr_id(self, op: str, attrs: dict[str, Any]) -> int | None:
        """Id of an attribute set of `op` registered before, or None."""
        return self.attr_ids.get((op, _attrs_key(attrs)))

    def lit_id(self, value: Any) -> int:
        """Id of a literal (number, string, int list) a rule or an attribute puts in the graph."""
        key = (type(value).__name__, _lit_key(value))
        got = self.lit_ids.get(key)
        if got is None:
            got = self.lit_ids[key] = len(self.lits)
            self.lits.append(value)
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
    """Turn `graph` into egglog declarations and rows, one `(Ref k)` handle per value.

    A top-level `(union ...)` costs egglog a pass over the e-graph (about 1 ms each at 16,000
    e-nodes), so the graph is not written as unions: each node is a row of integers in a relation
    of its constructor (`Enc_Op_Conv_2 (Ref, attribute set, input Refs)`), and one rule per
    constructor builds the nodes of all its rows in a single run. The rows go to egglog as files
    it reads in one command each (a row per command costs 0.05 ms; a file of 2,000, 2 ms).
    `load` runs it all. `rule_ops` are ops the rules name that the op table does not know
    (declared in .rules)."""
    enc = Encoding(graph=graph, preserved=set(preserve))
    rule_ops = set(rule_ops)
    enc.commands.append(PRELUDE + "(ruleset encode)\n")
    names = enc.value_names

    def row(relation: str, *columns: Any) -> None:
        text = [str(c) for c in columns]
        if all(_tsv_safe(t) for t in text):
            enc.tables.setdefault(relation, []).append("\t".join(text))
        else:      # a name a tab-separated file cannot hold as it is
            enc.commands.append(f"({relation} {' '.join(egg_str(c) if isinstance(c, str) else str(c) for c in columns)})")

    refs: dict[str, int] = {}
    kinds: set[str] = set()

    def ref_of(value: str) -> int:
        enc.refs += 1
        refs[value] = enc.refs - 1
        return enc.refs - 1

    def builder(relation: str, columns: int, head: str) -> None:
        """Declare `relation` (i64 columns: the Ref, then `columns` more) and the rule that
        unites each row's Ref with the term `head` spells over c1..cN."""
        if relation in kinds:
            return
        kinds.add(relation)
        cols = " ".join(f"c{k}" for k in range(1, columns + 1))
        enc.commands.append(f"(relation {relation} ({' '.join(['i64'] * (columns + 1))}))\n"
                            f"(rule (({relation} r {cols})) ((union (Ref r) {head})) :ruleset encode "
                            f':name "~{relation}")')

    # Leaves name themselves: `(Const "w")` is a handle as it is; a Ref joins it for the rows.
    enc.commands.append('(relation EncLeafInp (i64 String))\n(relation EncLeafConst (i64 String))\n'
                        '(rule ((EncLeafInp r n)) ((union (Ref r) (Inp n))) :ruleset encode :name "~EncLeafInp")\n'
                        '(rule ((EncLeafConst r n)) ((union (Ref r) (Const n))) :ruleset encode :name "~EncLeafConst")')
    inputs = set(graph.inputs)
    for v in graph.inputs:
        names[v] = f"(Inp {egg_str(v)})"
    for c in sorted(graph.constants):
        if c not in names:
            names[c] = f"(Const {egg_str(c)})"
    absent = None
    read = set(graph.outputs) | {i for n in graph.nodes for i in n.inputs}

    def child(value: str) -> int:
        nonlocal absent
        if not value:
            if absent is None:
                builder("EncAbsent", 0, "(Absent)")
                absent = enc.refs
                enc.refs += 1
                row("EncAbsent", absent)
            return absent
        got = refs.get(value)
        if got is None:        # a leaf, given its Ref where a node first reads it
            leaf = "Inp" if value in inputs else "Const"
            got = ref_of(value)
            row(f"EncLeaf{leaf}", got, value)
        return got

    for v in graph.inputs:            # inputs nobody reads are still values of the graph
        child(v)
    for node in graph.nodes:
        kids = [child(i) for i in node.inputs]
        if _rewritable(node, graph, enc.preserved, rule_ops, read):
            ctor = op_ctor(node.op, len(kids))
            enc.declare(ctor, len(kids))
            terms = " ".join(f"(Ref c{k + 2})" for k in range(len(kids)))
            builder(f"Enc_{ctor}", len(kids) + 1, f"({ctor} c1 {terms})")
            ref = ref_of(node.outputs[0])
            names[node.outputs[0]] = f"(Ref {ref})"
            row(f"Enc_{ctor}", ref, enc.attr_id(node.op, node.attrs), *kids)
            continue
        ctor = opaque_ctor(len(kids))
        enc.declare(ctor, len(kids))
        terms = " ".join(f"(Ref c{k + 3})" for k in range(len(kids)))
        builder(f"EncOut_{ctor}", len(kids) + 2, f"(Out c1 ({ctor} c2 {terms}))")
        idx = len(enc.opaque_nodes)
        enc.opaque_nodes.append(node)
        for j, out in enumerate(node.outputs):
            if out:
                ref = ref_of(out)
                names[out] = f"(Ref {ref})"
                row(f"EncOut_{ctor}", ref, j, idx, *kids)
    for c in sorted(graph.constants):     # constants nobody reads keep their e-class too
        if c not in refs:
            child(c)
    return enc


def _tsv_safe(text: str) -> bool:
    return text == text.strip() and not any(c in text for c in "\t\n\r\x0b\x0c") and text != ""


def load(eg: Any, enc: Encoding, rules: Iterable[str] = ()) -> None:
    """Run an encoding in `eg`: its declarations and the rules' text, its rows, then the
    `encode` run that builds the graph's e-nodes."""
    for piece in chunks(list(enc.commands) + list(rules)):
        eg.run_program(*eg.parse_program(piece))
    if enc.tables:
        with tempfile.TemporaryDirectory(prefix="saturate-") as folder:
            for k, (relation, lines) in enumerate(sorted(enc.tables.items())):
                path = os.path.join(folder, f"{k}.tsv")
                with open(path, "w", encoding="utf-8") as f:
                    f.write("\n".join(lines) + "\n")
                eg.run_program(*eg.parse_program(f"(input {relation} {egg_str(path)})"))
    eg.run_program(*eg.parse_program("(run encode 1)"))


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
