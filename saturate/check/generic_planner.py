"""Rule checking, the generic shape rule: any op the interpreter runs. Candidate input shapes,
attributes drawn from the schema and values of shape-like inputs are kept when the interpreter
runs the node on them and gives the shape asked; an op whose inputs must fit each other's values
draws them with its own `fit_<op>` (fitted_planner, quant_planner). A mixin of the Planner."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st
import warnings

from saturate.core.ir import Node
from saturate.lang.ast import AttrVar, IntList, Num, OpTerm, Str, Var
from saturate.ops.registry import domain_of
from saturate.check.schema import attribute_drawer, is_sequence_slot, np_dtype, schema
from saturate.check.strategies import MAX_RANK, MAX_SIDE, SeqShape, Template, draw_broadcastable, draw_seq_shape

# Tries of the generic shape rule before an example is given up.
_GENERIC_TRIES = 12
# Inputs of these names hold shape-like data the generic rule draws values for.
_PARAMS = frozenset({"axes", "repeats", "sizes", "scales", "roi", "pads", "indices", "k", "split"})

# Per op of the generic rule, in this process: the first refusal of a drawn node, and whether
# a draw was ever accepted (a rule whose op is never accepted is reported with the refusal).
REFUSALS: dict[str, str] = {}
ACCEPTED: set[str] = set()


def refusal(ops: set[str]) -> str | None:
    """Why no example could be drawn, when an op of the generic rule refused every draw."""
    for op in sorted(ops):
        if op in REFUSALS and op not in ACCEPTED:
            return f"the interpreter refuses every drawn {op} node: {REFUSALS[op]}"
    return None


class GenericPlanning:
    """The Planner's rule for ops without a hand-written one (the Planner provides draw, term,
    bind, template, shape_for, attributes, generic_check...)."""

    def generic(self, t: OpTerm, out: tuple[int, ...] | None, path: tuple[int, ...]) -> tuple[int, ...]:
        """Draw input shapes, attributes from the schema and the values of shape-like inputs
        (axes, repeats, sizes, scales, pads...), and keep a draw only if the interpreter runs the
        node on it and gives `out` (any shape when None). A few tries, then the example is given
        up. Inputs that are flexible ops themselves are planned first, from their own inputs."""
        op = t.op
        self.generic_check(op)
        op_schema = schema(op, self.opset)
        fixed = self.written_attrs(t)
        kinds = [self.input_kind(t, k, op_schema) for k in range(len(t.args))]
        data = [k for k, kind in enumerate(kinds) if kind == "data"]
        known: dict[int, tuple[int, ...]] = {}
        for k in data:
            a = t.args[k]
            if isinstance(a, Var) and a.name in self.shapes:
                known[k] = self.shapes[a.name]
            elif isinstance(a, OpTerm) and self.flexible(a):
                known[k] = self.term(a, None, path + (k,))
        # An op whose inputs must fit each other's values (a sequence length within the time
        # axis, a region inside the image, a weight of the input's channels) has a rule of its
        # own drawing them together (fit_<op>); the interpreter still judges every draw.
        fit = getattr(self, "fit_" + op, None)
        for _ in range(_GENERIC_TRIES):
            if fit is not None:
                shapes, values, attrs = self.fitted(t, fit, known, fixed, path, out)
                data = [k for k in range(len(t.args)) if k not in values]
            else:
                shapes, values, attrs = self.unfitted(t, op_schema, kinds, data, known, fixed, out)
            got = self.infer(t, path, shapes, values, attrs)
            if got is not None and (out is None or got == tuple(out)):
                break
        else:
            assume(False)
        self.attributes(t, path, {key: (lambda _a, v=v: v) for key, v in attrs.items()})
        for k in data:
            if k not in known:
                self.term(t.args[k], shapes[k], path + (k,))
        for k, v in values.items():
            self.bind(t.args[k], v.shape)
            self.forced[t.args[k].name] = v
        return got

    def unfitted(self, t: OpTerm, op_schema: Any, kinds: list[str], data: list[int],
                 known: dict[int, tuple[int, ...]], fixed: dict[str, Any], out: tuple[int, ...] | None) -> tuple:
        """One try of the generic rule: data shapes around the first one, attributes from the
        schema, shape-like inputs by their names."""
        shapes = dict(known)
        for k in data:
            if k in shapes:
                continue
            tmpl = self.template(t.args[k])
            first = next((_tensor_shape(shapes[j]) for j in data if j in shapes and _tensor_shape(shapes[j])
                          is not None), None)
            if first is None:
                shape = self.candidate(None if isinstance(out, SeqShape) else out, tmpl)
                if isinstance(out, SeqShape) and out and not is_sequence_slot(t.op, self.opset, k):
                    shape = out[0]      # a tensor that becomes an item of the sequence asked
            else:
                pick = self.draw(st.integers(0, 3))
                shape = (first if pick < 2 else draw_broadcastable(self.draw, first) if pick == 2
                         else self.shape_for(tmpl))
            # A sequence input: items around the shape drawn (the sequence asked, if one is).
            shapes[k] = (out if isinstance(out, SeqShape) and self.draw(st.booleans()) else
                         draw_seq_shape(self.draw, shape)) if is_sequence_slot(t.op, self.opset, k) else shape
        rank = _rank(shapes[data[0]]) if data else 0
        attrs = self.schema_attrs(t.op, op_schema, dict(fixed), rank)
        values = {k: self.param_values(t, k, op_schema, rank) for k, kind in enumerate(kinds) if kind == "param"}
        return shapes, values, attrs

    def schema_attrs(self, op: str, op_schema: Any, attrs: dict[str, Any], rank: int) -> dict[str, Any]:
        """`attrs` with every other attribute of the schema drawn (None: omitted)."""
        for key in op_schema.attributes:
            if key not in attrs:
                drawer = attribute_drawer(op, key, self.opset, lambda: rank)
                attrs[key] = drawer(self.draw, attrs) if drawer is not None else None
        return attrs

    def fitted(self, t: OpTerm, fit: Any, known: dict[int, tuple[int, ...]], fixed: dict[str, Any],
               path: tuple[int, ...], out: tuple[int, ...] | None) -> tuple:
        """One try of an op's own rule: shapes of every input, values of those it draws, and
        attributes. A drawn value becomes the input's (forced) value where the input is a fresh
        variable; an op or a variable the pattern binds elsewhere keeps only its shape."""
        shapes, values, attrs = fit(t, dict(known), dict(fixed), path, None if out is None else tuple(out))
        for k in list(values):
            a = t.args[k]
            if not isinstance(a, Var) or (a.name in self.shapes and a.name not in self.forced):
                shapes[k] = tuple(np.shape(values.pop(k)))
            elif a.name in self.forced:
                values[k] = self.forced[a.name]
            else:
                values[k] = np.asarray(values[k]).astype(self.dtypes.get(a.name, np.asarray(values[k]).dtype))
        shapes.update(known)
        for k, a in enumerate(t.args):
            if k not in shapes and k not in values:      # an input the fit leaves free
                shapes[k] = self.shape_for(self.template(a))
        first = next((shapes[k] for k in range(len(t.args)) if k in shapes), ())
        attrs = self.schema_attrs(t.op, schema(t.op, self.opset), {**attrs, **fixed}, _rank(first))
        return shapes, values, attrs

    def arg_dtype(self, t: OpTerm, path: tuple[int, ...], k: int) -> str:
        """The dtype drawn for argument k of the op at `path`."""
        a = t.args[k]
        got = self.dtypes.get(a.name) if isinstance(a, Var) else self.node_dtypes.get(path + (k,))
        return got or "float32"

    def written_attrs(self, t: OpTerm) -> dict[str, Any]:
        """The attributes a pattern op fixes: literals, and captures already bound."""
        fixed: dict[str, Any] = {}
        for key, value in t.attrs:
            if isinstance(value, AttrVar):
                equal = self.attr_equal.get(value.name)
                if value.name in self.attrs:
                    fixed[key] = self.attrs[value.name]
                elif equal in self.attrs and self.draw(st.integers(0, 3)):
                    fixed[key] = self.attrs[equal]
            elif isinstance(value, (Num, Str)):
                fixed[key] = value.value
            elif isinstance(value, IntList):
                fixed[key] = list(value.values)
        return fixed

    def input_kind(self, t: OpTerm, k: int, op_schema: Any) -> str:
        """"param" for an input whose values the generic rule draws (a fresh variable in a slot
        of integers, or of scales or a region), else "data"."""
        a = t.args[k]
        if not isinstance(a, Var) or (a.name in self.shapes and a.name not in self.forced):
            return "data"
        formals = list(op_schema.inputs)
        name = formals[min(k, len(formals) - 1)].name.lower() if formals else ""
        if name in _PARAMS or np_dtype(self.dtypes.get(a.name, "float32")).kind in "iu" and k > 0:
            return "param"
        return "data"

    def param_values(self, t: OpTerm, k: int, op_schema: Any, rank: int) -> np.ndarray:
        """Values of a shape-like input, by the name the schema gives it."""
        v = t.args[k]
        if v.name in self.forced:
            return self.forced[v.name]
        formals = list(op_schema.inputs)
        name = formals[min(k, len(formals) - 1)].name.lower()     # TopK's is "K"
        dtype = np_dtype(self.dtypes.get(v.name, "int64"))
        d, ints = self.draw, st.integers
        r = max(rank, 1)
        if name == "axes":
            chosen = d(st.lists(ints(0, r - 1), min_size=1, max_size=r, unique=True))
            values = [a - r if d(st.booleans()) else a for a in chosen]
        elif name == "repeats":
            values = [d(ints(1, 3)) for _ in range(rank)]
        elif name == "sizes":
            values = [d(ints(1, MAX_SIDE)) for _ in range(rank)]
        elif name == "scales":
            values = [d(st.sampled_from([1.0, 2.0, 0.5, 1.5])) for _ in range(rank)]
        elif name == "roi":
            values = [0.0] * rank + [1.0] * rank
        elif name == "pads":
            values = [d(ints(-1, 2)) for _ in range(2 * rank)]
        elif name == "k":
            values = [d(ints(1, 3))]            # one count: TopK takes a 1-element tensor
        elif name in ("indices", "split"):
            values = d(st.lists(ints(-1, 2) if name == "indices" else ints(1, 3), min_size=1, max_size=2))
        else:
            lowest = 0 if dtype.kind in "ub" else -1
            return np.asarray(d(ints(lowest, 3)) if dtype.kind in "iub" else d(st.sampled_from([0.5, 1.0, 2.0])),
                              dtype)
        if dtype.kind in "ub":
            values = [v for v in values if v >= 0] or [0]   # no -1 in an unsigned type
        return np.array(values, dtype).reshape(-1)

    def candidate(self, out: tuple[int, ...] | None, tmpl: Template) -> tuple[int, ...]:
        """An input shape to try for an op whose output should be `out`: out itself half the
        time (most ops keep their first input's shape), else out with sides changed and now and
        then one axis more (a reduction that drops it)."""
        if out is None:
            return self.shape_for(tmpl)
        pick = self.draw(st.integers(0, 3))
        if pick < 2:
            return tuple(out)
        shape = [side if self.draw(st.integers(0, 2)) else self.draw(st.integers(1, MAX_SIDE)) for side in out]
        if pick == 3 and len(shape) < MAX_RANK + 1:
            shape.insert(self.draw(st.integers(0, len(shape))), self.draw(st.integers(1, MAX_SIDE)))
        return tuple(shape)

    def infer(self, t: OpTerm, path: tuple[int, ...], shapes: dict[int, tuple[int, ...]],
              values: dict[int, np.ndarray], attrs: dict[str, Any]) -> tuple[int, ...] | None:
        """The output shape the interpreter gives the node on these inputs (None: it refuses)."""
        from saturate.interp.interpreter import eval_node
        args = []
        for k, a in enumerate(t.args):
            if k in values:
                args.append(values[k])
                continue
            dtype = self.dtypes.get(a.name) if isinstance(a, Var) else self.node_dtypes.get(path + (k,))
            args.append(_stand_in(shapes[k], dtype))
        node = Node(t.op, [f"in{k}" for k in range(len(args))], ["out"],
                    {key: v for key, v in attrs.items() if v is not None}, name=t.op, domain=domain_of(t.op))
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # numpy's "mean of empty slice" and the like
                result = eval_node(node, args, self.opset)
        except Exception as err:  # any refusal (onnx.reference raises every kind) rejects the draw
            REFUSALS.setdefault(t.op, str(err).splitlines()[0] if str(err) else type(err).__name__)
            return None
        if not result or result[0] is None:
            return None
        ACCEPTED.add(t.op)
        if isinstance(result[0], list):     # a sequence: its items' shapes
            return SeqShape(tuple(int(d) for d in np.shape(item)) for item in result[0])
        return tuple(int(d) for d in np.shape(result[0]))


def _stand_in(shape: tuple[int, ...], dtype: str | None) -> Any:
    """Zeros of the shape (a list of them, as a sequence value, for a SeqShape). Strings stand in
    as one word each (zeros of an object array would be ints)."""
    if isinstance(shape, SeqShape):
        from saturate.interp.sequences import TensorSequence

        return TensorSequence([_stand_in(item, dtype) for item in shape], np_dtype(dtype or "float32"))
    return np.full(shape, "a", object) if dtype == "object" else np.zeros(shape, np_dtype(dtype or "float32"))


def _tensor_shape(shape: tuple) -> tuple[int, ...] | None:
    """A tensor shape to draw a neighbour around: the shape itself, or a sequence's first item's."""
    if isinstance(shape, SeqShape):
        return shape[0] if shape else None
    return shape


def _rank(shape: tuple) -> int:
    """The rank attributes are drawn for: a tensor's, or a sequence's items'."""
    if isinstance(shape, SeqShape):
        return shape.item_rank() or 1
    return len(shape)
