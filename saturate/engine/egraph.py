"""Read-back stage: the e-graph's tables, from egglog's freeze(), as Python e-classes and e-nodes."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, NamedTuple


def egglog_bindings():
    """egglog's compiled text interface, loaded without the `egglog` package's high-level API.

    Importing the package costs about 0.15 s (it loads the Python DSL and a code formatter);
    the engine only needs the Rust bindings, which load in milliseconds on their own.
    """
    if "egglog.bindings" in sys.modules:
        return sys.modules["egglog.bindings"]
    package = importlib.util.find_spec("egglog")
    for folder in package.submodule_search_locations or ():
        for name in sorted(os.listdir(folder)):
            if name.startswith("bindings.") and name.endswith((".so", ".pyd")):
                spec = importlib.util.spec_from_file_location("egglog.bindings", os.path.join(folder, name))
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                sys.modules["egglog.bindings"] = module
                return module
    from egglog import bindings  # an unusual install layout: take the ordinary way
    return bindings


class ENode(NamedTuple):
    """One e-node. kind: "inp" (a graph input), "const" (a constant), "lit" (a literal value),
    "absent" (an omitted optional input), "op" (an op open to rules), "opaque" (an op kept as
    it is, several outputs possibly), "out" (output k of an opaque op) or "call" (a constant
    function applied to constants, computed with numpy); head: op or function name;
    key: attribute-set id, node index, output index, literal id or value name."""

    kind: str
    head: str
    key: Any
    children: tuple


@dataclass
class EGraphView:
    """Every e-class (an egglog Value) with its e-nodes, plus the relations the engine keeps."""

    classes: dict[Any, list[ENode]] = field(default_factory=dict)
    lets: dict[str, Any] = field(default_factory=dict)          # handle text -> e-class
    refs: dict[Any, int] = field(default_factory=dict)          # e-class -> a k of its (Ref k)
    absent: set = field(default_factory=set)                     # the e-class of an omitted input
    consts: set = field(default_factory=set)                     # e-classes known constant
    relations: dict[str, list[tuple]] = field(default_factory=dict)   # Cand_i / Ok_i rows
    size: int = 0                                                # e-nodes in constructor tables

    def add(self, cls: Any, node: ENode) -> None:
        self.classes.setdefault(cls, []).append(node)


def read_egraph(eg: Any, relations: tuple[str, ...] = ()) -> EGraphView:
    """Freeze `eg` and decode its tables; `relations` names the Cand/Ok tables to keep."""
    view = EGraphView()
    to_i64, to_str = eg.value_to_i64, eg.value_to_string
    wanted = set(relations)
    for name, fn in eg.freeze().functions.items():
        # A table's rows become Python objects when asked for: the builders' and attribute tests'
        # tables (a fifth of the rows) are never asked.
        if fn.is_let_binding:
            rows = fn.rows
            if rows:
                view.lets[name] = rows[0].output
            continue
        if name == "Ref":
            lets, refs, texts = view.lets, view.refs, _REF_TEXTS
            for r in fn.rows:
                out = r.output              # each read of a row's field makes a new Python object
                k = to_i64(r.inputs[0])
                while k >= len(texts):
                    texts.append(f"(Ref {len(texts)})")
                lets[texts[k]] = out
                if out not in refs:
                    refs[out] = k
            continue
        if name == "IsConst":
            view.consts.update(r.output for r in fn.rows)
            continue
        if name in wanted:
            view.relations[name] = [tuple(r.inputs) for r in fn.rows]
            continue
        kind = _KINDS.get(name.split("_", 1)[0])
        if kind is None:
            continue
        rows = fn.rows
        view.size += len(rows)
        head = name.split("_")[1] if kind in ("op", "call") else name
        if kind == "call":
            head = name[2:name.rindex("_")]
        classes, make = view.classes, tuple.__new__
        # The hottest loops of the engine: one pass per row, no method calls they can avoid.
        if kind in ("op", "opaque", "out", "lit"):
            for r in rows:
                ins = r.inputs
                node = make(ENode, (kind, head, to_i64(ins[0]), tuple(ins[1:])))
                out = r.output
                if out in classes:
                    classes[out].append(node)
                else:
                    classes[out] = [node]
        elif kind in ("inp", "const"):
            for r in rows:
                node = make(ENode, (kind, head, to_str(r.inputs[0]), ()))
                out = r.output
                view.lets[_leaf_text(name, node.key)] = out
                classes.setdefault(out, []).append(node)
        else:
            if kind == "absent":
                view.absent.update(r.output for r in rows)
            for r in rows:
                node = make(ENode, (kind, head, None, tuple(r.inputs)))
                out = r.output
                if out in classes:
                    classes[out].append(node)
                else:
                    classes[out] = [node]
    return view


# `(Ref k)` spelled once per k for the process: every read spells each handle of the e-graph.
_REF_TEXTS: list[str] = []


@functools.lru_cache(maxsize=65536)
def _leaf_text(ctor: str, key: str) -> str:
    """egglog text of an input or constant leaf, as the encoder spelled it (read again every
    iteration, so spelled once)."""
    return f"({ctor} {json.dumps(key)})"


def node_count(sizes: list[tuple[str, int]]) -> int:
    """E-nodes in constructor tables, counted as read_egraph counts them, from egglog's
    `(print-size)` rows: the size of the e-graph without reading a single row of it."""
    return sum(n for name, n in sizes if name.split("_", 1)[0] in _KINDS)


_KINDS = {"Inp": "inp", "Const": "const", "Lit": "lit", "Absent": "absent", "Out": "out",
          "Op": "op", "Opq": "opaque", "K": "call"}
