"""Encode stage: a Graph becomes egglog declarations and `let` bindings, one e-class per value."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from saturate.core.ir import Graph, Node, ValueInfo
from saturate.ops.registry import domain_of, lookup

# Leaves and the constructors every program has. T is the one sort of tensors. IsConst maps a
# constant e-class to itself: reading a row's output costs a tenth of reading its inputs. `(Ref k)` is a
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
(function IsConst (T) T :merge old)
(ruleset apply)
(ruleset facts)
(ruleset encode)
(rule ((= e (Const n))) ((set (IsConst e) e)) :ruleset facts :name "~const-leaf")
(rule ((= e (Lit n))) ((set (IsConst e) e)) :ruleset facts :name "~lit-leaf")
(relation EncLeafInp (i64 String))
(relation EncLeafConst (i64 String))
(rule ((EncLeafInp r n)) ((union (Ref r) (Inp n))) :ruleset encode :name "~EncLeafInp")
(rule ((EncLeafConst r n)) ((union (Ref r) (Const n))) :ruleset encode :name "~EncLeafConst")
"""


CHUNK_CHARS = 2000
# The run that unites each row's Ref with the e-node it spells (the graph's, and the checker's).
ENCODE = "(run encode 1)"


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
class Rows:
    """egglog input in bulk: declarations (and rows a tab-separated file cannot hold) as program
    text, and rows of integer (or plain string) relations as tab-separated lines, which egglog
    reads with one `input` command per relation (a row per command costs 0.05 ms plus 0.012 ms
    per term argument; a file of 2,000 rows, 2 ms)."""

    commands: list[str] = field(default_factory=list)
    tables: dict[str, list[str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.commands or self.tables)

    def add_ints(self, relation: str, *columns: int) -> None:
        """A row of integers (always safe in a tab-separated file)."""
        self.tables.setdefault(relation, []).append("\t".join(map(str, columns)))

    def add(self, relation: str, *columns: Any) -> None:
        text = [str(c) for c in columns]
        if all(_tsv_safe(t) for t in text):
            self.tables.setdefault(relation, []).append("\t".join(text))
        else:      # a name a tab-separated file cannot hold as it is
            self.commands.append(f"({relation} {' '.join(egg_str(c) if isinstance(c, str) else str(c) for c in columns)})")

    def run(self, eg: Any) -> None:
        """Run the commands, then read every table into its relation."""
        for piece in chunks(self.commands):
            eg.run_program(*eg.parse_program(piece))
        if self.tables:
            with tempfile.TemporaryDirectory(prefix="saturate-", dir=_memory_dir()) as folder:
                for k, (relation, lines) in enumerate(sorted(self.tables.items())):
                    path = os.path.join(folder, f"{k}.tsv")
                    with open(path, "w", encoding="utf-8") as f:
                        f.write("\n".join(lines) + "\n")
                    eg.run_program(*eg.parse_program(f"(input {relation} {egg_str(path)})"))


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
    _encoded_ops: list | None = None            # the input graph's op e-nodes (facts._encoded_ops)
    commands: list[str] = field(default_factory=list)
    rows: Rows = field(default_factory=Rows)        # the graph's nodes, loaded after `commands`
    builders: set[str] = field(default_factory=set)  # declared `Enc_*` relations
    row_relations: dict[tuple, str] = field(default_factory=dict)   # (kind, head, arity) -> relation
    # Node names that must not change; value names for the outputs of preserved nodes.
    preserved: set[str] = field(default_factory=set)
    # Relations and rules declared on first need (a builder above, a guarded rule's apply rule),
    # name -> egglog text; `declared` holds those the e-graph kept for this program has already.
    late: dict[str, str] = field(default_factory=dict)
    declared: dict[str, str] = field(default_factory=dict)
    # The largest result the rule of any op folds to, unless its inputs were as large (--max-fold-bytes).
    max_fold_bytes: int = 1 << 20
    # (function, arity) -> ("file:line:col: rule 'name'", the call) of each right side writing it:
    # an e-node does not record the rule that made it, and a constant too large to compute names it.
    writers: dict[tuple[str, int], list[tuple[str, Any]]] = field(default_factory=dict)

    def attr_id(self, op: str, attrs: dict[str, Any]) -> int:
        """Id of an attribute set of `op`, registering it on first sight."""
        key = (op, _attrs_key(attrs))
        got = self.attr_ids.get(key)
        if got is None:
            got = self.attr_ids[key] = len(self.attr_sets)
            self.attr_sets.append((op, dict(attrs)))
        return got

    def wrote(self, arity: int, rule: Any, call: Any) -> None:
        """Record that `rule`'s right side builds the constant expression `call` (a lang.ast.Call)
        of `arity` arguments."""
        loc = call.loc or rule.loc
        where = f"{loc.file}:{loc.line}:{loc.col}: rule '{rule.name}'"
        got = self.writers.setdefault((call.fn, arity), [])
        if all(w != where for w, _ in got):
            got.append((where, call))

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

    def new_ref(self) -> int:
        """A fresh `(Ref k)` handle's k."""
        self.refs += 1
        return self.refs - 1

    def builder(self, relation: str, columns: int, head: str, commands: list[str]) -> None:
        """Declare `relation` (i64 columns: the Ref, then `columns` more) and the rule of the
        `encode` ruleset that unites each row's Ref with the term `head` spells over c1..cN,
        once per encoding (to `commands`)."""
        if relation in self.builders:
            return
        self.builders.add(relation)
        if relation in self.declared:
            return
        cols = " ".join(f"c{k}" for k in range(1, columns + 1))
        text = (f"(relation {relation} ({' '.join(['i64'] * (columns + 1))}))\n"
                f"(rule (({relation} r {cols})) ((union (Ref r) {head})) :ruleset encode :name \"~{relation}\")")
        self.late[relation] = text
        commands.append(text)

    def declare_late(self, name: str, text: str, commands: list[str]) -> None:
        """Declare a relation and its rule on first need (to `commands`), unless the e-graph holds it."""
        if name not in self.declared and name not in self.late:
            self.late[name] = text
            commands.append(text)

    def node_row(self, rows: Rows, ref: int, kind: str, head: str, key: Any, kids: list[int]) -> None:
        """A row of `rows` uniting `(Ref ref)` with one e-node (an egraph.ENode's kind, head and
        key) over its children's Refs, when `rows` runs and then the `encode` ruleset."""
        if kind in ("inp", "const"):
            rows.add("EncLeafInp" if kind == "inp" else "EncLeafConst", ref, key)
            return
        relation = self.row_relations.get((kind, head, len(kids)))
        if relation is None:
            ctor = {"lit": "Lit", "absent": "Absent", "out": "Out", "opaque": opaque_ctor(len(kids)),
                    "call": k_ctor(head, len(kids))}.get(kind) or op_ctor(head, len(kids))
            keyed = kind not in ("absent", "call")
            terms = " ".join(f"(Ref c{k + 1 + keyed})" for k in range(len(kids)))
            relation = self.row_relations[kind, head, len(kids)] = f"Enc_{ctor}"
            self.builder(relation, keyed + len(kids), f"({ctor}{' c1' if keyed else ''} {terms})".replace(" )", ")"),
                         rows.commands)
        if kind in ("absent", "call"):
            rows.add_ints(relation, ref, *kids)
        else:
            rows.add_ints(relation, ref, key, *kids)

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
                f'(rule ((= e ({name} {vars_}))) ((set (IsConst e) e)) :ruleset facts :name "~const-{name}")')


def _is_float(info: ValueInfo) -> bool:
    return info.dtype.startswith("float") or info.dtype == "bfloat16"


def _rewritable(node: Node, graph: Graph, preserve: set[str], rule_ops: set[str], read: set[str]) -> bool:
    """Single-output float ops the engine works on or a rule names (shape ops of any dtype) are open
    to rules; others are opaque. An op only a rule's `op Name/N` declares is open whatever its dtype.
    Outputs nobody reads (Dropout's mask, a BatchNormalization's running statistics) do not count:
    such a node is a single-output term and loses them when rewritten (decode writes again those
    ONNX requires, saturate.engine.decode.unread_outputs)."""
    if node.op in preserve or (node.name and node.name in preserve):
        return False
    if node.domain not in ("", "ai.onnx") and not _named_by_rules(node):
        return False
    if not node.outputs or not node.outputs[0] or any(o in read for o in node.outputs[1:] if o):
        return False
    if "" in node.inputs:
        return False
    # The schemas load onnx: imported here, `import saturate.pipeline` (optimize --help) goes without.
    from saturate.ops.schema import is_rewritable_op, spec, widest_spec

    s = spec(node.op, graph.opset, node.domain)
    if s is None:
        return node.op in rule_ops
    if not (is_rewritable_op(node.op) or node.op in rule_ops):
        return False
    # Arity as any version defines it: a model may keep an older form (Unsqueeze's axes attribute).
    widest = widest_spec(node.op)
    if not widest.min_inputs <= len(node.inputs) <= widest.max_inputs:
        return False
    return s.any_dtype or _is_float(graph.info(node.outputs[0]))


def _named_by_rules(node: Node) -> bool:
    """Whether a node of another domain is the op its name means in rules: e-nodes carry op names,
    not domains, so only an op registered in the node's domain (saturate.ops) whose name no
    default-domain op and no other registered domain takes. Every other such node is opaque."""
    from saturate.ops.schema import is_onnx_op

    return (lookup(node.op, node.domain) is not None and domain_of(node.op) == node.domain
            and not is_onnx_op(node.op))


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
    enc.commands.append(PRELUDE)
    names, rows = enc.value_names, enc.rows
    refs: dict[str, int] = {}

    def ref_of(value: str) -> int:
        refs[value] = got = enc.new_ref()
        names[value] = f"(Ref {got})"
        return got

    inputs = set(graph.inputs)
    absent = None
    read = set(graph.outputs) | {i for n in graph.nodes for i in n.inputs}

    def child(value: str) -> int:
        nonlocal absent
        if not value:
            if absent is None:
                absent = enc.new_ref()
                enc.node_row(rows, absent, "absent", "Absent", None, [])
            return absent
        got = refs.get(value)
        if got is None:        # a leaf, given its Ref where a node first reads it
            got = ref_of(value)
            enc.node_row(rows, got, "inp" if value in inputs else "const", "", value, [])
        return got

    # The input graph's op e-nodes with their attribute sets, for extraction and the input's cost.
    encoded = enc._encoded_ops = []
    for v in graph.inputs:            # inputs nobody reads are still values of the graph
        child(v)
    for node in graph.nodes:
        kids = [child(i) for i in node.inputs]
        if _rewritable(node, graph, enc.preserved, rule_ops, read):
            enc.declare(op_ctor(node.op, len(kids)), len(kids))
            attr_id = enc.attr_id(node.op, node.attrs)
            encoded.append((node, attr_id))
            enc.node_row(rows, ref_of(node.outputs[0]), "op", node.op, attr_id, kids)
            continue
        ctor = opaque_ctor(len(kids))
        enc.declare(ctor, len(kids))
        terms = " ".join(f"(Ref c{k + 3})" for k in range(len(kids)))
        # Output j of an opaque node is one row: `(Out j (Opq_n node-index inputs...))`.
        enc.builder(f"EncOut_{ctor}", len(kids) + 2, f"(Out c1 ({ctor} c2 {terms}))".replace(" )", ")"),
                    rows.commands)
        idx = len(enc.opaque_nodes)
        enc.opaque_nodes.append(node)
        for j, out in enumerate(node.outputs):
            if out:
                rows.add_ints(f"EncOut_{ctor}", ref_of(out), j, idx, *kids)
    for c in sorted(graph.constants):     # constants nobody reads keep their e-class too
        if c not in refs:
            child(c)
    # Values in the order of the graph's lists (inputs, constants, node outputs): later stages
    # walk this order, and their ties break by it.
    enc.value_names = {**{v: names[v] for v in [*graph.inputs, *sorted(graph.constants)]}, **names}
    return enc


@functools.lru_cache(maxsize=1)
def _memory_dir() -> str | None:
    """A directory in memory for the row files when the system has one (Linux's /dev/shm), else
    None (the default temporary directory): on a busy disk, writing and removing a few small
    files takes longer than egglog takes to read them."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def _tsv_safe(text: str) -> bool:
    return text == text.strip() and not any(c in text for c in "\t\n\r\x0b\x0c") and text != ""


def load(eg: Any, enc: Encoding, rules: Iterable[str] = ()) -> None:
    """Run an encoding in `eg`: its declarations and the rules' text, its rows, then the
    `encode` run that builds the graph's e-nodes."""
    for piece in chunks(list(enc.commands) + list(rules)):
        eg.run_program(*eg.parse_program(piece))
    _fill(eg, enc)


def _fill(eg: Any, enc: Encoding) -> None:
    """The graph into an e-graph holding its program's declarations: the rows, then the `encode` run."""
    enc.rows.run(eg)
    eg.run_program(*eg.parse_program(ENCODE))


# Declaring the sorts, tables and rules of a program costs egglog 0.1-0.3 ms per command (25-30 ms
# for a convnet's 150-200), whatever the graph. An e-graph holding only a program's declarations is
# kept for the next run of the same program in this process (a batch, a benchmark's repeats); a run
# works above a (push) and its (pop) returns the e-graph to the declarations alone. egglog's e-graph
# may be used and dropped only on the thread that made it, so only the main thread keeps them.
PREPARED_KEEP = 4
_prepared: OrderedDict[bytes, tuple[Any, dict[str, str]]] = OrderedDict()


def loaded_egraph(enc: Encoding, rules: Iterable[str] = (), late: Iterable[str] = ()) -> tuple[Any, bytes]:
    """An e-graph with `enc` and `rules` loaded as `load` does, its declarations taken from one kept
    for the same program when there is one; returns it with its program key for `release`.

    `late` is the text of every rule the run may declare on first need besides the graph's builders
    (guarded rules' apply rules, `Encoding.declare_late`). A kept e-graph holds those an earlier run
    declared, and their text carries that run's attribute-set and literal ids, which the rules' own
    text may not (a guarded rule's matching side builds nothing): so they are part of the key, and an
    e-graph is kept for exactly the runs whose every declaration, made or to come, is the same."""
    program = list(chunks(list(enc.commands) + list(rules)))
    digest = hashlib.sha256()
    for part in (program, list(late)):
        digest.update(len(part).to_bytes(8, "little"))
        for text in part:           # each text by its length: no two lists of texts hash alike
            data = text.encode()
            digest.update(len(data).to_bytes(8, "little") + data)
    key = digest.digest()
    kept = _prepared.pop(key, None) if threading.current_thread() is threading.main_thread() else None
    if kept is None:
        from saturate.engine.egraph import egglog_bindings

        eg = egglog_bindings().EGraph()
        for piece in program:
            eg.run_program(*eg.parse_program(piece))
    else:
        eg, enc.declared = kept
        # The graph's builders that an earlier run of the program declared are there already.
        for name, text in list(enc.late.items()):
            if name in enc.declared:
                del enc.late[name]
                enc.rows.commands.remove(text)
    eg.run_program(*eg.parse_program("(push)"))
    _fill(eg, enc)
    return eg, key


def release(eg: Any, key: bytes, enc: Encoding) -> None:
    """Return an e-graph from `loaded_egraph` to its declarations alone and keep it for the next run of
    its program (on the main thread). Call it only after a run that ended normally: an e-graph an error
    left is dropped.

    The relations and rules `enc` declared on first need are declared again below the (push): each
    declaration costs egglog time, and the next run of the program, which declares mostly the same
    ones, then finds them there."""
    if threading.current_thread() is not threading.main_thread():
        return
    eg.run_program(*eg.parse_program("(pop)"))
    if enc.late:
        for piece in chunks(list(enc.late.values())):
            eg.run_program(*eg.parse_program(piece))
    _prepared[key] = (eg, {**enc.declared, **enc.late})
    _prepared.move_to_end(key)
    while len(_prepared) > PREPARED_KEEP:
        _prepared.popitem(last=False)


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
