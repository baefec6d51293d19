"""Facts about e-classes: constant values (numpy, cached by structure) and static types; the
elements of shape computations are read by the ShapeData mixin (shape_data.py)."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from saturate.lang import fold
from saturate.lang.ast import Call, Spread, Var
from saturate.lang.builtins import CONST_FUNCS
from saturate.engine.egraph import EGraphView, ENode
from saturate.engine.encode import Encoding
from saturate.engine.shape_data import ShapeData, small_ints
from saturate.core.errors import MemoryLimitError
from saturate.core.ir import ValueInfo
from saturate.core import geometry, mapped
from saturate.frontend.infer import onnx_infer
from saturate.ops import find, infer_type
from saturate.ops.infer import broadcast_shape

FAILED = object()  # a constant expression numpy could not evaluate
_ABSENT = ("absent",)   # the structural key of an omitted input, valued None


def _form_size(term: Any) -> int:
    """How much of a constant expression is more than a variable (it fits fewer e-nodes)."""
    if isinstance(term, (Var, Spread)):
        return 0
    return 1 + sum(_form_size(a) for a in getattr(term, "args", ()))


class ConstantTooLarge(MemoryLimitError):
    """A constant expression of the e-graph would pass --max-memory; the message names the rules
    whose right sides write its function (whichever rule's guard or extraction asked for it)."""


class Facts(ShapeData):
    """Constant values and static types of e-classes, computed on demand with numpy.

    Values are cached by the structure of the constant expression, so one cache serves every
    iteration of the saturation loop even as e-class ids change under unions.
    """

    def __init__(self, view: EGraphView, enc: Encoding, cache: dict | None = None):
        self.view, self.enc = view, enc
        self.cache = {} if cache is None else cache
        self.cache.setdefault(_ABSENT, None)
        self.keys: dict[Any, Any] = {}
        self.infos: dict[Any, ValueInfo] = {}
        self.names: dict[Any, list[str]] = {}      # e-class -> original value names in it
        # E-classes being evaluated / typed right now: the guards against cycles.
        self._evaluating: set = set()
        self._busy: set = set()
        self._priming = False  # inside _type_below: the classes it types do not prime again
        # E-classes whose type was inferred from their e-nodes in this e-graph (see `info`).
        self._refined: set = set()
        self.settled: dict[Any, ValueInfo] = self.cache.setdefault("settled types", {})
        self.known_keys: dict[Any, Any] = self.cache.setdefault("constant keys", {})
        # Types inference could still refine, as an earlier e-graph left them (see `info`).
        self.inferred: dict[Any, ValueInfo] = self.cache.setdefault("refinable types", {})
        original = enc.value_infos()
        # Once per iteration over every original value: locals, no method calls it can avoid.
        class_of, names, infos, settled = view.lets.get, self.names, self.infos, self.settled
        for value, let in enc.value_names.items():
            cls = class_of(let)
            if cls is None:
                continue
            got = names.get(cls)
            if got is None:
                names[cls] = [value]
            else:
                got.append(value)
            known = settled.get(cls)
            if known is not None:
                infos[cls] = known
                continue
            # A class holds several original values once rewrites unite them (Pad by zeros and
            # its input): the best-known type of any of them is the class's.
            infos[cls] = refine(infos.get(cls), original[value])

    @property
    def order(self) -> dict[str, int]:
        """Position of every original value in the graph (inputs, constants, node outputs)."""
        if not hasattr(self, "_order"):
            self._order = {v: k for k, v in enumerate(self.enc.value_names)}
        return self._order

    def original_nodes(self) -> set[tuple[Any, ENode]]:
        """(e-class, e-node) pairs the input graph itself had (found once per view: pricing,
        the bottom-up pass and the input graph's cost each ask)."""
        out = self.__dict__.get("_original_nodes")
        if out is None:
            enc, lets, out = self.enc, self.view.lets, set()
            for node, key in _encoded_ops(enc):
                kids = tuple(lets.get(enc.value_names.get(i, ""), None) for i in node.inputs)
                cls = lets.get(enc.value_names[node.outputs[0]])
                out.add((cls, ENode("op", node.op, key, kids)))
            self.__dict__["_original_nodes"] = out
        return out

    # ---- constant values ------------------------------------------------------------------
    def value(self, cls: Any) -> Any:
        """The concrete value of a constant e-class (ndarray, number or int tuple), or None."""
        key = self.key(cls)
        return None if key is None else self.cache.get(key)

    def key(self, cls: Any) -> Any:
        """Structural key of a computable expression for `cls` (its value lands in the cache)."""
        if cls in self.keys:
            return self.keys[cls]
        if cls not in self.view.consts or cls in self._evaluating:
            return None
        # A key found in an earlier iteration still holds: an e-class id that is still canonical
        # names the same value, whatever joined it since (a failed one may succeed now: not kept).
        known = self.known_keys.get(cls)
        if known is not None:
            self.keys[cls] = known
            return known
        self._evaluating.add(cls)
        result = None
        for node in sorted(self.view.classes.get(cls, ()), key=_leaf_first):
            result = self.node_key(node)
            if result is not None:
                break
        self._evaluating.discard(cls)
        self.keys[cls] = result
        if result is not None:
            self.known_keys[cls] = result
        return result

    def node_key(self, node: ENode) -> Any:
        """Structural key of one constant e-node, evaluating it if it is new; None if it fails."""
        if node.kind == "const":
            key = ("const", node.key)
            if key not in self.cache:
                self.cache[key] = self.enc.graph.constants[node.key]
            return key
        if node.kind == "lit":
            key = ("lit", node.key)
            self.cache.setdefault(key, self.enc.lits[node.key])
            return key
        if node.kind != "call":
            return None
        # An omitted input of a folded node (Clip without its min) reads as None.
        absent = self.view.absent
        kids = [_ABSENT if c in absent else self.key(c) for c in node.children]
        if any(k is None for k in kids):
            return None
        key = (node.head, *kids)
        if key not in self.cache:
            try:
                self.cache[key] = evaluate_fn(node.head, [self.cache[k] for k in kids])
            except MemoryLimitError as err:
                where = self.made_by(node)
                raise ConstantTooLarge(f"{where}: {err}" if where else str(err)) from None
        return None if self.cache[key] is FAILED else key

    def made_by(self, node: ENode) -> str:
        """Where the rule that built the constant e-node `node` writes it: among the right sides
        calling its function, those whose arguments have the form of its children (a nested call,
        a literal). When that leaves several (`a * b` of two variables fits any product), the one
        whose form says most comes first, the others follow in brackets. "" when no rule writes it."""
        writers = self.enc.writers.get((node.head, len(node.children)), [])
        fitting = [(w, call) for w, call in writers if self._could_build(call, node)] or writers
        if not fitting:
            return ""
        fitting = [w for w, _ in sorted(fitting, key=lambda wc: -_form_size(wc[1]))]
        others = fitting[1:]
        shown = "; ".join(others[:3]) + (f"; {len(others) - 3} more" if len(others) > 3 else "")
        return fitting[0] + (f" (or {shown})" if others else "")

    def _could_build(self, call: Call, node: ENode) -> bool:
        """Whether `call`'s arguments have the form of `node`'s children."""
        if len(call.args) != len(node.children):
            return True     # a list spread over the inputs (the rule of any op): no form to compare
        for arg, child in zip(call.args, node.children):
            nodes = self.view.classes.get(child, ())
            if isinstance(arg, Call) and arg.fn in CONST_FUNCS:
                if not any(n.kind == "call" and n.head == arg.fn and self._could_build(arg, n) for n in nodes):
                    return False
            elif not isinstance(arg, (Var, Spread)) and not any(n.kind == "lit" for n in nodes):
                return False     # a literal, a query or a captured attribute: a Lit e-node
        return True

    # ---- static types ---------------------------------------------------------------------
    def info(self, cls: Any) -> ValueInfo:
        """Static type of an e-class: the input graph's for original values, refined by what its
        e-nodes imply (after Pad's pads fold to a constant, so does Pad's output shape)."""
        known = self._typed(cls)
        if known is not None:
            return known
        if not self._busy and not self._priming:
            self._type_below(cls)
            known = self._typed(cls)
            if known is not None:
                return known  # typed on the way, through a cycle back to it
        got = self.infos.get(cls)
        # A type fully known in an earlier iteration still holds: an e-class id that is still
        # canonical names the same value, however many classes joined it since.
        settled = self.settled.get(cls)
        if settled is not None:
            self.infos[cls] = settled
            return settled
        if cls in self._busy:
            return got if got is not None else ValueInfo(shape=None)
        earlier = self.inferred.get(cls)
        if earlier is not None and cls in self._unchanged:
            # Nothing under it changed since an earlier e-graph typed it: inference would
            # say the same again (a dim only an unknown input could tell stays unknown).
            self.infos[cls] = earlier
            self._refined.add(cls)
            return earlier
        self._busy.add(cls)
        result = got
        if cls in self.view.consts:
            # An elementwise expression's type without computing it, unless its value is at hand.
            typed = None if cls in self.keys or cls in self.known_keys else self._elementwise_info(cls)
            if typed is None and (v := self.value(cls)) is not None:
                typed = ValueInfo(np.asarray(v).dtype.name, tuple(np.shape(v)))
            result = typed if typed is not None else result
        else:
            for node in self.view.classes.get(cls, ()):
                result = refine(result, self._node_info(node), self.input_dims)
                if result is not None and not self.refinable(result):
                    break
        self._busy.discard(cls)
        result = result if result is not None else ValueInfo(shape=None)
        self.infos[cls] = result
        self._refined.add(cls)
        if not self.refinable(result):
            self.settled[cls] = result
        else:
            self.inferred[cls] = result
        return result

    def _typed(self, cls: Any) -> ValueInfo | None:
        """The type `info` gives `cls` without working: inferred in this e-graph, or one inference
        could not refine; else None."""
        got = self.infos.get(cls)
        return got if got is not None and (cls in self._refined or not self.refinable(got)) else None

    def _type_below(self, top: Any) -> None:
        """Type the e-classes below `top` deepest first, so that typing each one recurses a level
        at a time rather than down the whole graph (a text graph's chain of hundreds of untyped
        nodes passed Python's recursion limit)."""
        order, seen, stack = [], {top}, [(top, False)]
        while stack:
            c, expanded = stack.pop()
            if expanded:
                order.append(c)
                continue
            stack.append((c, True))
            if c in self.view.consts:  # typed from its value or its function's arguments, not from ops
                continue
            for node in self.view.classes.get(c, ()):
                # The classes _node_info types from: an op's inputs, an opaque node's inputs.
                opaque = self._opaque_of(node)
                kids = opaque[1].children if opaque is not None else node.children if node.kind == "op" else ()
                for k in kids:
                    if k not in seen and k not in self.view.absent and self._typed(k) is None:
                        seen.add(k)
                        stack.append((k, False))
        # Each is typed with its inputs typed before it; priming again from one of them would walk a
        # cycle of the e-graph (x = Reshape(Reshape(x))) back to `top` and on for ever.
        self._priming = True
        try:
            for c in order[:-1]:
                self.info(c)
        finally:
            self._priming = False

    @functools.cached_property
    def _unchanged(self) -> set:
        """E-classes whose e-nodes, and every e-node below them, are as in the e-graph the last
        Facts that asked read (the first Facts finds none)."""
        classes = self.view.classes
        before = self.cache.get("classes read")
        self.cache["classes read"] = classes
        if before is None:
            return set()
        changed = {c for c, nodes in classes.items() if before.get(c) != nodes}
        parents: dict[Any, list] = {}
        for c, nodes in classes.items():
            for node in nodes:
                for k in node.children:
                    parents.setdefault(k, []).append(c)
        stack = list(changed)
        while stack:
            for p in parents.get(stack.pop(), ()):
                if p not in changed:
                    changed.add(p)
                    stack.append(p)
        return classes.keys() - changed

    def _elementwise_info(self, cls: Any) -> ValueInfo | None:
        """The type of a constant computed by an elementwise function (a + b, sqrt(c)...), from
        its arguments' types as the function's numpy implementation combines them, without
        computing it: pricing and shape guards ask the types of many weight expressions that
        extraction never chooses. A concatenation of weights (projections merged side by side)
        is typed the same way. None when no e-node of `cls` is one."""
        for node in self.view.classes.get(cls, ()):
            if node.kind == "call" and node.head == "concat" and len(node.children) == 3:
                got = self._concat_info(node)
                if got is not None:
                    return got
            fn = CONST_FUNCS.get(node.head) if node.kind == "call" else None
            if fn is None or not fn.broadcasts:
                continue
            args = [self._argument_type(c) for c in node.children]
            if None in args:
                continue
            arrays = [a for a in args if a[0] is not None]
            dtype = np.result_type(*[a[0] for a in arrays]) if arrays else np.dtype(np.float32)
            try:
                shape = np.broadcast_shapes(*[a[1] for a in arrays])
            except ValueError:
                continue
            return ValueInfo(dtype.name, tuple(shape))
        return None

    def _concat_info(self, node: ENode) -> ValueInfo | None:
        """concat(a, b, axis) of two arrays of one dtype and rank, typed without computing it."""
        a, b = (self._argument_type(c) for c in node.children[:2])
        axis = next((self.enc.lits[n.key] for n in self.view.classes.get(node.children[2], ()) if n.kind == "lit"),
                    None)
        if a is None or b is None or a[0] is None or a[0] != b[0] or len(a[1]) != len(b[1]) or not a[1] \
                or not isinstance(axis, int) or not -len(a[1]) <= axis < len(a[1]):
            return None
        axis %= len(a[1])
        if any(x != y for k, (x, y) in enumerate(zip(a[1], b[1])) if k != axis):
            return None
        shape = list(a[1])
        shape[axis] += b[1][axis]
        return ValueInfo(a[0].name, tuple(shape))

    def _argument_type(self, cls: Any) -> tuple[np.dtype | None, tuple] | None:
        """(dtype, shape) of a constant argument, dtype None for a plain Python number (which
        takes the arrays' dtype); None when not known without evaluating it."""
        for node in self.view.classes.get(cls, ()):
            if node.kind == "const":
                a = self.enc.graph.constants[node.key]
                return np.asarray(a).dtype, tuple(np.shape(a))
            if node.kind == "lit":
                v = self.enc.lits[node.key]
                if isinstance(v, (np.ndarray, np.generic)):
                    return v.dtype, tuple(v.shape)
                return (None, ()) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
        if cls not in self.view.consts:
            return None
        info = self.info(cls)
        if info.shape is None or info.dtype == "unknown" or not all(isinstance(d, int) for d in info.shape):
            return None
        return np.dtype(info.dtype), tuple(info.shape)

    def refinable(self, info: ValueInfo) -> bool:
        """Whether inference could still learn a dim: one is unknown or named by shape inference
        (a dim the graph's inputs name, such as the batch, stays as it is)."""
        if info.shape is None:
            return True
        return any(not isinstance(d, int) and d not in self.input_dims for d in info.shape)

    @functools.cached_property
    def input_dims(self) -> frozenset[str]:
        """The names the graph's inputs give their symbolic dims (the batch, a sequence length)."""
        g = self.enc.graph
        return frozenset(d for v in g.inputs for d in (g.info(v).shape or ()) if isinstance(d, str))

    def _node_info(self, node: ENode) -> ValueInfo | None:
        """The type one e-node implies for its e-class."""
        if node.kind == "op":
            attrs = self.enc.attr_sets[node.key][1]
            return self._infer(node.head, attrs, node.children, 0, ("op", node.key))
        opaque = self._opaque_of(node)
        if opaque is not None:
            original, inner = opaque
            return self._infer(original.op, original.attrs, inner.children, node.key,
                               ("opaque", inner.key), outputs=len(original.outputs))
        return None

    def _opaque_of(self, node: ENode) -> tuple[Any, ENode] | None:
        """For an output e-node of an opaque node: the input graph's node and its opaque e-node."""
        if node.kind == "out":
            for inner in self.view.classes.get(node.children[0], ()):
                if inner.kind == "opaque":
                    return self.enc.opaque_nodes[inner.key], inner
        return None

    def _infer(self, op: str, attrs: dict, kids: tuple, output: int, ident: tuple, outputs: int = 1) -> ValueInfo:
        absent = self.view.absent
        ins = [None if c in absent else self.info(c) for c in kids]
        fast = infer(op, attrs, ins) if output == 0 and None not in ins else ValueInfo(shape=None)
        # Every dim a number or a name one of the inputs gives it: ONNX's inference could tell no
        # more for these ops (it keeps a shared name as one dim too), and asking it costs a model
        # round trip.
        if fast.shape is not None and all(d is not None for d in fast.shape):
            return fast
        if ins and ins[0] is not None and ins[0].shape is not None:
            shaped = self._constant_shaped(op, attrs, ins[0], kids, output, outputs)
            if shaped is not None and all(d is not None for d in shaped.shape):
                return shaped
        if op in ("Reshape", "Expand") and output == 0 and len(kids) == 2 and ins[0] is not None:
            shaped = self._shaped_by_data(op, attrs, ins[0], kids[1])
            if shaped is not None:
                return shaped
        # Everything else asks ONNX's own shape inference, with the small constant inputs
        # (Reshape's shape, Pad's pads, Slice's bounds) as data, cached across iterations.
        values: list[Any] = [self.key(c) if c in self.view.consts else None for c in kids]
        for k, c in enumerate(kids):
            # A shape computed from shapes (Concat of Gathers of Shape) is data too, once its
            # elements are all known: a Reshape's output is typed in the iteration its input's
            # shape is, not one fold after another down the chain.
            if values[k] is None and ins[k] is not None and small_ints(ins[k]):
                elements = self.data(c)
                if elements is not None and all(isinstance(x, int) for x in elements):
                    values[k] = ("data", ins[k].dtype, ins[k].shape, elements)
        key = ("infer", ident, output, tuple(None if i is None else (i.dtype, i.shape) for i in ins),
               tuple(values))
        if key not in self.cache:
            data = {k: (np.array(v[3], dtype=v[1]).reshape(v[2]) if v[0] == "data" else self.cache[v])
                    for k, v in enumerate(values) if v is not None}
            self.cache[key] = onnx_infer(op, attrs, ins, data, output, self.enc.graph.opset, outputs)
        return refine(fast, self.cache[key])

    def _constant_shaped(self, op: str, attrs: dict, x: ValueInfo, kids: tuple, output: int,
                         outputs: int) -> ValueInfo | None:
        """The output type of an op whose shape its constant inputs decide (Slice, Squeeze, Pad...),
        by its registry entry's `shape_by_data` (asking ONNX's inference for it costs a model round
        trip). None when an input it needs is not a known constant; a dim it cannot tell is None."""

        def ints(k: int) -> list[int] | None:
            """Input k's elements: [] when it is omitted, None when they are not all known (a
            constant, or shape arithmetic whose elements are numbers)."""
            if k >= len(kids) or kids[k] in self.view.absent:
                return []
            elements = self.data(kids[k])
            return None if elements is None or not all(isinstance(e, int) for e in elements) else list(elements)

        entry = find(op)
        if entry is None or entry.shape_by_data is None:
            return None
        try:
            return entry.shape_by_data(attrs, x, ints, len(kids), output, outputs)
        except geometry.GeometryError:
            return None

    def _shaped_by_data(self, op: str, attrs: dict, x: ValueInfo, target_cls: Any) -> ValueInfo | None:
        """Reshape's or Expand's output type from a target shape whose elements are numbers or
        the inputs' dim names (the batch read through Shape and Gather), which ONNX's inference
        cannot take as data: it would name the dim afresh, and every type below it would stay
        open to refinement for the whole run. None when the elements do not tell it."""
        target = self.data(target_cls)
        if x.shape is None or target is None or \
                not all(isinstance(d, int) or d in self.input_dims for d in target):
            return None
        if op == "Expand":
            shape = broadcast_shape(tuple(x.shape), tuple(target))
            return None if shape is None or None in shape else ValueInfo(x.dtype, shape)
        dims = list(target)
        for k, d in enumerate(dims):
            if d == 0 and not attrs.get("allowzero", 0):
                if k >= len(x.shape):
                    return None
                dims[k] = x.shape[k]
        if any(isinstance(d, int) and d < -1 for d in dims) or dims.count(-1) > 1:
            return None
        if -1 in dims:
            # The element count over the known dims, names cancelling names.
            rest = list(x.shape)
            known = 1
            for d in dims:
                if isinstance(d, str):
                    if d not in rest:
                        return None
                    rest.remove(d)
                elif d != -1:
                    known *= d
            if not all(isinstance(d, int) for d in rest) or known == 0 or math.prod(rest) % known:
                return None
            dims[dims.index(-1)] = math.prod(rest) // known
        if not all(isinstance(d, int) or d in self.input_dims for d in dims):
            return None
        return ValueInfo(x.dtype, tuple(dims))

    def shape(self, cls: Any) -> tuple | None:
        """Static shape of an e-class (None when unknown)."""
        return self.info(cls).shape

    # ---- dims as symbols ------------------------------------------------------------------
    # A dim nobody knows is still the same dim wherever it is read: ("dim", c, k) stands for
    # dim k of e-class c, and a dim the graph's inputs name (the batch) is its name.

    def dims(self, cls: Any) -> tuple | None:
        """The shape of `cls` with each unknown dim as a symbol (None when the rank is unknown)."""
        shape = self.shape(cls)
        if shape is None:
            return None
        return tuple(d if isinstance(d, int) or d in self.input_dims else ("dim", cls, k)
                     for k, d in enumerate(shape))

def _encoded_ops(enc: Encoding) -> list[tuple[Any, int]]:
    """The input graph's nodes encoded as op e-nodes, each with its attribute-set id (recorded as
    encode_graph encoded them: finding the ids again cost 1-3 ms a model)."""
    return enc._encoded_ops or []


def _leaf_first(node: ENode) -> tuple:
    return (node.kind != "const", node.kind != "lit", len(node.children), node.head)


def evaluate_fn(fn: str, args: list[Any]) -> Any:
    """Apply the constant function `fn` to concrete arguments; FAILED if numpy refuses."""
    if fn == fold.EVALUATE:
        try:
            return fold.evaluate(args[0], args[1:])
        except (ValueError, TypeError, IndexError, ZeroDivisionError, OverflowError):
            return FAILED
    spec_ = CONST_FUNCS.get(fn)
    if spec_ is None:
        return FAILED
    conv = []
    try:
        for kind, a in zip(spec_.params, args):
            if kind == "int":
                conv.append(None if a is None else int(np.asarray(a).reshape(())))
            elif kind == "ints":
                conv.append(None if a is None else tuple(int(x) for x in np.asarray(a).ravel()))
            else:
                conv.append(a)
        with np.errstate(all="ignore"):
            # A large weight is folded block by block into a temp file, and any other large
            # result moves to one: folded weights do not pile up in memory before export.
            out = mapped.elementwise_blocks(spec_.impl, conv) if spec_.broadcasts and mapped.large(conv) else None
            out = spec_.impl(*conv) if out is None else out
        if isinstance(out, np.ndarray) and out.nbytes >= mapped.SPILL_BYTES and not mapped.is_mapped(out):
            out = mapped.spill(out)
    except (ValueError, TypeError, IndexError, ZeroDivisionError, OverflowError):
        return FAILED
    return tuple(out) if spec_.returns == "ints" else out


def infer(op: str, attrs: dict[str, Any], ins: list[ValueInfo]) -> ValueInfo:
    """Output type of a new node from its inputs' types, as its op registry entry derives it
    (shape None when the entry cannot tell)."""
    dtype = ins[0].dtype if ins else "float32"
    return infer_type(op, attrs, ins) or ValueInfo(dtype, None)


def refine(known: ValueInfo | None, other: ValueInfo | None, stable: frozenset = frozenset()) -> ValueInfo | None:
    """The better-known of two types of one value: dim by dim, a number beats a name or None,
    and a `stable` name (one the graph's inputs give) beats another name or None."""
    if other is None or other.shape is None:
        return known if known is not None else other
    if known is None:
        return other
    if known.shape is None:
        dtype = known.dtype if known is not None and known.dtype != "unknown" else other.dtype
        return ValueInfo(dtype, other.shape)
    if len(known.shape) != len(other.shape):
        return known
    dims = tuple(a if isinstance(a, int) or not (isinstance(b, int) or (b in stable and a not in stable)) else b
                 for a, b in zip(known.shape, other.shape))
    return known if dims == tuple(known.shape) else ValueInfo(known.dtype, dims)
