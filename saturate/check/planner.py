"""Property testing: derive consistent shapes and attributes for a pattern from its ops' semantics.

The planner first draws a dtype for every value as the ops' ONNX type constraints allow
(`assign_types`), then walks the pattern top-down. The root gets a drawn output shape; every op
turns the shape asked of it into shapes for its arguments (a Conv's output fixes the input's
batch and the weight's output channels, a broadcasting Add gives its main argument the full
shape and the others broadcastable ones, ...). The hand-written rules are mixins by family (nn_planner,
movement_planner, quant_planner); ops with none go to the generic one (generic_planner): candidate input shapes, attributes and shape-like inputs, kept when the
interpreter runs the node and gives the shape asked (or, for a term drawn from its inputs up,
any shape). Ops whose inputs must fit each other's values (ReverseSequence's lengths, RoiAlign's
regions, ConvInteger's geometry, Einsum's equation) draw them together in the generic rule
(fitted_planner, quant_planner). Attributes a pattern leaves free are drawn from the op's schema (schema.py).
Guards steer the drawing so that they hold: a value under `positive` is drawn positive, one
under `varies_only_along` along that axis only.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from saturate.core.errors import SaturateError
from saturate.ops.schema import op_table, spec
from saturate.lang.ast import AttrVar, Call, Guard, IntList, Num, OpTerm, Str, Term, Var
from saturate.check.fitted_planner import FittedPlanning
from saturate.check.generic_planner import GenericPlanning
from saturate.check.movement_planner import MovementPlanning
from saturate.check.nn_planner import NnPlanning
from saturate.check.quant_planner import QuantPlanning
from saturate.check.schema import (BASE_OPSET, DRAWABLE, EXOTIC_OPS, FLOATS, RANDOM_OPS, STRING, attribute_drawer,
                                   draw_dtype, dtype_of_tensor_type, input_slot, np_dtype, schema, slot_types,
                                   undrawn_values)
from saturate.ops.registry import find, ops_with
from saturate.interp.control_flow import CONTROL_FLOW_OPS
from saturate.check.strategies import MAX_RANK, MAX_SIDE, SeqShape, Template, draw_broadcastable, draw_per_axis

_SIGN_GUARDS = {"positive": "positive", "nonnegative": "nonnegative", "nonzero": "nonzero"}
# How the op registry says to draw an op (OpDef.draw); these broadcast multidirectionally, as Add.
_BROADCASTING = ("binary", "variadic", "broadcast")
# Attributes the hand-written shape rules below draw themselves (or keep at their default);
# every other attribute of those ops is drawn from the schema.
_SHAPING = {"axis", "axes", "perm", "kernel_shape", "strides", "pads", "dilations", "group", "auto_pad",
            "ceil_mode", "transA", "transB", "start", "end", "keepdims", "storage_order"}
# Quantization ops, whose scales are drawn as floats or bfloat16 (newer schemas allow int32 and
# float8e8m0 scales, which the interpreter's kernels do not run).
_FLOAT_SCALES = frozenset({"QuantizeLinear", "DequantizeLinear"})
# Ops whose output (a cast's target) or zero point (input 2) is drawn exotic one time in two.
_EXOTIC_TARGETS = frozenset({"Cast", "CastLike", "QuantizeLinear", "DequantizeLinear"})
# Window ops over 1, 2 and 3 spatial axes; 2-D first, as models mostly hold.
_WINDOW_RANKS = (4, 3, 5)


def _num(term: Term) -> Any:
    return term.value if isinstance(term, Num) else None


class Planner(NnPlanning, MovementPlanning, GenericPlanning, FittedPlanning, QuantPlanning):
    """Draws shapes for every variable of a pattern, attributes of every op, and sign classes."""

    def __init__(self, draw: Callable, guards: tuple[Guard, ...] = (), opset: int = BASE_OPSET):
        self.draw = draw
        self.opset = opset
        self.dtypes: dict[str, str] = {}                    # variable -> dtype drawn
        self.node_dtypes: dict[tuple[int, ...], str] = {}   # op's path -> its output's dtype
        # Empty tensors now and then, where every op of the pattern takes them.
        self.empty_ok = False
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.consts: set[str] = set()
        self.forced: dict[str, np.ndarray] = {}
        self.signs: dict[str, str] = {}
        self.attrs: dict[str, Any] = {}
        self.node_attrs: dict[tuple[int, ...], dict[str, Any]] = {}
        self.node_ops: dict[tuple[int, ...], str] = {}
        self.attr_hints: dict[str, str] = {}
        # Captured attributes a guard compares (a1 == a2): each drawn mostly as the other, once bound.
        self.attr_equal: dict[str, str] = {}
        # (a, b) of each precedes(a, b) guard: b's first row mostly set after a's once drawn (examples.py).
        self.precedes: list[tuple[str, str]] = []
        self.hints: dict[str, dict[str, Any]] = {}
        self.conv_inputs: dict[str, dict[str, Any]] = {}   # input variable -> first conv's attributes
        # A guard asking for a conv centred on each pixel: draw mostly such convs.
        self.centred_convs = any(g.fn == "centred_identity" for g in guards)
        # A guard asking for a one-element pooling window: draw mostly such windows (a 2-D window
        # is one by chance once in 36 draws).
        self.unit_windows = any(g.fn == "unit_window" for g in guards)
        for g in guards:
            self._hint(g)

    # ---- guards as drawing hints -------------------------------------------------------------
    def _hint(self, g: Guard) -> None:
        args = g.args
        first = args[0] if args else None
        if g.fn == "identity_perm" and isinstance(first, AttrVar):
            self.attr_hints[first.name] = "identity"
            return
        if g.fn == "==" and isinstance(first, AttrVar) and isinstance(args[1], AttrVar):
            self.attr_equal[first.name], self.attr_equal[args[1].name] = args[1].name, first.name
            return
        if not isinstance(first, Var):
            # `rank(v) == k` pins a rank; other comparisons are checked after drawing.
            if g.fn == "==" and isinstance(first, Call) and first.fn == "rank" and _num(args[1]) is not None:
                if isinstance(first.args[0], Var):
                    self.hints.setdefault(first.args[0].name, {})["rank"] = int(args[1].value)
            return
        hint = self.hints.setdefault(first.name, {})
        if g.fn == "same_quant" and all(isinstance(a, Var) for a in args):
            # Whichever (scale, zero point) is drawn second, mostly as a copy of the other: a rule's
            # outer op may be drawn first (QuantizeLinear(DequantizeLinear(x, s, z), s2, z2)).
            for a, b in ((args[0], args[2]), (args[1], args[3])):
                self.hints.setdefault(b.name, {})["same_as"] = a.name
                self.hints.setdefault(a.name, {})["same_as"] = b.name
        elif g.fn == "precedes" and isinstance(args[1], Var):
            self.precedes.append((first.name, args[1].name))
        elif g.fn == "same_shape" and isinstance(args[1], Var):
            # The second value drawn with the first's shape, where its op leaves the shape free.
            self.hints.setdefault(args[1].name, {})["same_shape"] = first.name
        elif g.fn == "zero_point_at_min":
            hint["lowest"] = True
        elif g.fn == "quantized":
            hint["dtypes"] = frozenset({"int8", "uint8"})
        elif g.fn == "clip_saturates" and isinstance(args[1], Var):
            # Bounds that quantize past the type's ends: a low one below 0, a high one above.
            hint.setdefault("sign", "negative")
            self.hints.setdefault(args[1].name, {}).setdefault("sign", "positive")
        elif g.fn in _SIGN_GUARDS:
            hint["sign"] = _SIGN_GUARDS[g.fn]
        elif g.fn in ("ones", "zeros"):
            hint["fill"] = 1.0 if g.fn == "ones" else 0.0
        elif g.fn in ("all_equal", "==") and _num(args[1]) is not None:
            hint["fill"] = float(args[1].value)     # a constant compared with a number (c == 0.5)
        elif g.fn in ("varies_only_along", "per_axis") and _num(args[1]) is not None:
            hint["axis"] = (int(args[1].value), _num(args[2]) if len(args) > 2 else None)
        elif g.fn == "is_scalar":
            hint["scalar"] = True

    def sign_of(self, name: str) -> str:
        """The sign class a variable's values are drawn from."""
        return self.hints.get(name, {}).get("sign") or self.signs.get(name, "any")

    # ---- templates (bottom-up: what each term needs of its shape) -----------------------------
    def template(self, t: Term) -> Template:
        if isinstance(t, Var):
            r = self.hints.get(t.name, {}).get("rank")
            if t.name in self.shapes:
                r = len(self.shapes[t.name])
            return Template(rank=r)
        if not isinstance(t, OpTerm):
            return Template()
        op, args = t.op, t.args
        if _drawn(op) == "window":
            return Template(min_rank=3, ranks=_WINDOW_RANKS)
        if op == "GlobalAveragePool":
            return Template(min_rank=3, ranks=_WINDOW_RANKS, unit_spatial=True)
        if op in ("Gemm", "Flatten"):
            return Template(rank=2)
        if op == "BatchNormalization":
            a = self.template(args[0])
            return replace(a, min_rank=max(2, a.min_rank), fixed=())
        if op == "MatMul":
            ranks = [self.template(a).rank for a in args]
            if all(r is not None for r in ranks):
                return Template(rank=max(ranks), min_rank=2)
            return Template(min_rank=max([2] + [r for r in ranks if r is not None]))
        if op == "Transpose":
            perm = dict(t.attrs).get("perm")
            if isinstance(perm, IntList):
                return Template(rank=len(perm.values))
            return replace(self.template(args[0]), fixed=(), unit_spatial=False)
        if op == "Reshape":
            return Template(min_rank=1)
        if op == "Shape":
            return Template(rank=1)
        if op == "Concat":
            a = self.template(args[0])
            return replace(a, min_rank=max(a.min_rank, 1), fixed=(), unit_spatial=False)
        if op in ("Cast", "CastLike", "QuantizeLinear", "DequantizeLinear"):
            # (elementwise on the first input: Q(Conv(...)) takes the conv's shape)
            return self.template(args[0])
        if op in ("Slice", "ConstantOfShape"):
            return Template(min_rank=1)
        if op == "Range":
            return Template(rank=1)
        if op == "Expand":
            return Template()
        if op == "Pad":
            a = self.template(args[0])
            return replace(a, min_rank=max(a.min_rank, 1))
        if op in ("Gather", "Squeeze", "Unsqueeze"):
            return Template()
        if _drawn(op) == "unary":
            a = self.template(args[0])
            return replace(a, min_rank=max(a.min_rank, 1 if op == "Softmax" else 0))
        if _broadcasting(op):
            main_k = self.main_index(t)
            main = self.template(args[main_k])
            others = [self.template(a) for k, a in enumerate(args) if k != main_k]
            least = max([main.min_rank] + [o.rank or o.min_rank for o in others])
            # The output keeps the main operand's template: another operand may still be the
            # larger one (`broadcast`), adding dims or sides the main one has as 1.
            return replace(main, min_rank=least)
        self.generic_check(op)
        return Template()

    def generic_check(self, op: str) -> None:
        """Raise, saying why, when the generic shape rule cannot draw `op` (not run by the
        interpreter at the checker's opset, or not an ONNX op)."""
        from saturate.interp.reference import unsupported_reason
        d = find(op)
        if d is not None and d.nondeterministic and d.evaluate is None and op not in RANDOM_OPS:
            raise SaturateError(f"op '{op}' cannot be checked: it draws random numbers, so two runs of "
                                "one graph differ")
        if op in ops_with("evaluates") and spec(op, self.opset) is not None:
            return
        if d is not None and not d.standard and d.evaluate is not None:
            return      # an op registered outside ONNX, run by its entry's kernel
        if op in CONTROL_FLOW_OPS and spec(op, self.opset) is not None:
            if hasattr(self, "fit_" + op):
                return  # its subgraphs drawn by its fit (fitted_planner), run by the interpreter
            raise SaturateError(f"op '{op}' cannot be checked: its subgraph is not drawn (opset {self.opset})")
        from saturate.interp.sequences import OPTIONAL_OPS, SEQUENCE_OPS
        reason = unsupported_reason(op, self.opset) if op not in SEQUENCE_OPS and op not in OPTIONAL_OPS else None
        if reason is not None:
            raise SaturateError(f"op '{op}' cannot be checked: {reason} (opset {self.opset})")

    def handled(self, op: str) -> bool:
        """Whether a hand-written shape rule draws `op` (else the generic one does)."""
        return _broadcasting(op) or _drawn(op) == "unary" or hasattr(self, "op_" + op)

    def main_index(self, t: OpTerm) -> int:
        """The argument of a broadcasting op that takes the full output shape: an op first, then
        an input, then a constant."""
        def weight(a: Term) -> int:
            if isinstance(a, OpTerm):
                return 0
            return 1 if isinstance(a, Var) and not a.const else 2
        return min(range(len(t.args)), key=lambda i: weight(t.args[i]))

    def shape_for(self, tmpl: Template, lo: int = 0, hi: int = MAX_RANK) -> tuple[int, ...]:
        rank = tmpl.rank
        if rank is None and tmpl.ranks is not None:
            rank = self.draw(st.sampled_from(tmpl.ranks))
        elif rank is None:
            rank = self.draw(st.integers(max(lo, tmpl.min_rank), max(hi, tmpl.min_rank)))
        shape = list(self.draw(st.tuples(*[st.integers(1, MAX_SIDE)] * rank)))
        for axis, side in tmpl.fixed:
            shape[axis] = side
        if tmpl.unit_spatial:
            shape[2:] = [1] * len(shape[2:])
        # Now and then one or two sides are 0 (an empty tensor): a rule whose right side has
        # another shape, or fails, on empty tensors must fail.
        if self.empty_ok and rank and not tmpl.fixed and not tmpl.unit_spatial and self.draw(st.integers(0, 9)) == 9:
            for a in self.draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=2, unique=True)):
                shape[a] = 0
        return tuple(shape)

    # ---- top-down planning ----------------------------------------------------------------
    def plan(self, pattern: Term) -> tuple[int, ...]:
        """Plan the whole pattern; returns the output shape drawn for it (0-d included, where
        the pattern allows it: a scalar stands wherever a tensor may)."""
        self.assign_types(pattern, None, ())
        self.empty_ok = all(_empty_safe(op) or not self.handled(op) for op in _ops(pattern))
        if self.flexible(pattern):
            return self.term(pattern, None, ())
        out = self.shape_for(self.template(pattern))
        self.term(pattern, out, ())
        return out

    def flexible(self, t: Term) -> bool:
        """Whether `t`'s shape is best drawn from its inputs up (an op of the generic rule, or
        elementwise ops over one) rather than asked of it."""
        if not isinstance(t, OpTerm):
            return False
        if not self.handled(t.op):
            return True
        if _drawn(t.op) == "unary" and t.args:
            return self.flexible(t.args[0])
        if _broadcasting(t.op) and t.args:
            return self.flexible(t.args[self.main_index(t)])
        return False

    # ---- dtypes (drawn before shapes: the generic rule runs the op on them) -------------------
    def assign_types(self, t: Term, allowed: frozenset[str] | None, path: tuple[int, ...],
                     strings: int = 0, exotic: int = 0) -> str | None:
        """Draw the dtype of `t`'s value among `allowed` (None: any drawn dtype) as its op's type
        constraints allow; returns it. An op the engine rewrites only on floats (every op but
        the shape-arithmetic ones, see the op registry's shape_arith flag) is drawn on floats where
        its schema allows one. Strings are drawn where nothing else can be (an op over a
        string-valued one), and with weight `strings` beside other dtypes (Cast's source); the
        types of EXOTIC_WEIGHTS (float8, int4, bfloat16...) in and out of an op of EXOTIC_OPS
        (`exotic`: the op above is one)."""
        options = DRAWABLE if allowed is None else allowed
        if isinstance(t, Var):
            have = self.dtypes.get(t.name)
            if have is not None:
                assume(have in options)
                return have
            assume(options)
            same = self.hints.get(t.name, {}).get("same_as")
            if self.dtypes.get(same) in options and self.draw(st.integers(0, 3)):
                # Drawn mostly as a copy of the value it is compared with (same_quant's zero points).
                self.dtypes[t.name] = self.dtypes[same]
                return self.dtypes[t.name]
            wanted = options & self.hints.get(t.name, {}).get("dtypes", options)
            self.dtypes[t.name] = draw_dtype(self.draw, wanted or options, strings, exotic)
            return self.dtypes[t.name]
        if not isinstance(t, OpTerm):
            return None
        op = t.op
        if schema(op, self.opset) is None:
            self.generic_check(op)
        undrawn = undrawn_values(op, self.opset, len(t.args))
        if undrawn is not None:
            raise SaturateError(f"op '{op}' cannot be checked: it reads or writes {undrawn}, which are not drawn "
                                "(tensors of numbers, bools and strings only)")
        out_param = slot_types(op, self.opset)[0][0]
        out_opts = self.producible(t) & options
        op_spec = spec(op, self.opset)
        # SequenceMap's items are what its drawn body makes of the input's (fitted_planner): any type.
        if op_spec is not None and not op_spec.any_dtype and out_opts & FLOATS and op != "SequenceMap":
            out_opts &= FLOATS
        if op == "Mod" and isinstance(dict(t.attrs).get("fmod"), Num) and not dict(t.attrs)["fmod"].value:
            out_opts -= FLOATS  # fmod=0 is defined on integers only
        assume(out_opts)
        # A cast's target and a quantization's type one in two, other values one in eight.
        weight = (2 if op in _EXOTIC_TARGETS else 1) if op in EXOTIC_OPS and (exotic or allowed is None) else 0
        # An input of the output's type a guard wants of some types (quantized(yz): QuantizeLinear's
        # zero point, whose type its output takes) narrows the output's draw, mostly.
        slots = [input_slot(op, self.opset, k) for k in range(len(t.args))]
        hinted = out_opts
        for a, (param, _) in zip(t.args, slots):
            if isinstance(a, Var) and param == out_param:
                hinted = hinted & self.hints.get(a.name, {}).get("dtypes", hinted)
        if hinted and hinted != out_opts and self.draw(st.integers(0, 3)):
            out_opts = hinted
        dtype = draw_dtype(self.draw, out_opts, exotic=weight)
        self.node_dtypes[path] = dtype
        bound = {out_param: dtype} if not out_param.startswith("tensor(") else {}
        if op == "SequenceMap" and self.draw(st.integers(0, 3)) == 0:
            # ONNX's S names its input and output, but the body may change the items' type (a
            # Shape, a Cast of them): one time in four the input's type is drawn on its own.
            bound = {}
        for k, a in enumerate(t.args):
            # An input drawn mostly as a copy of a typed value (same_quant's zero point) takes its type
            # parameter's other inputs with it, drawn before it (DequantizeLinear's x before its zero point).
            param, opts = slots[k]
            same = self.dtypes.get(self.hints.get(a.name, {}).get("same_as")) if isinstance(a, Var) else None
            if param not in bound and not param.startswith("tensor(") and same in opts and self.draw(st.integers(0, 3)):
                bound[param] = same
        # Variables of a type already bound first: typed before the ops beside them are, so a copy
        # drawn below (same_quant's) finds them typed.
        order = sorted(range(len(t.args)), key=lambda k: not (isinstance(t.args[k], Var) and slots[k][0] in bound))
        for k in order:
            a = t.args[k]
            param, opts = slots[k]
            want = frozenset({bound[param]}) if param in bound else opts
            if op in _FLOAT_SCALES and k == 1:
                want &= FLOATS | {"bfloat16"}
            if op == "BitCast":
                # Bits reread as another type of the same width (a wider one would change the shape).
                want = frozenset(d for d in want if d != STRING and np_dtype(d).itemsize == np_dtype(dtype).itemsize)
            # Cast reads every source type, strings of numbers too.
            got = self.assign_types(a, want, path + (k,), strings=2 if op in ("Cast", "CastLike") and k == 0 else 0,
                                    exotic=2 if op in _EXOTIC_TARGETS and k == 2 else int(op in EXOTIC_OPS))
            if got is not None and not param.startswith("tensor("):
                bound.setdefault(param, got)
        return dtype

    def producible(self, t: Term) -> frozenset[str]:
        """The dtypes `t`'s value may have whatever is drawn below it: those its op's output
        allows (Cast's written `to`), narrowed by the arguments of the output's own type
        parameter (Identity over StringConcat gives strings)."""
        if not isinstance(t, OpTerm):
            return DRAWABLE
        (out_param, out_allowed), _ = slot_types(t.op, self.opset)
        written = dict(t.attrs)
        if t.op in ("Cast", "BitCast") and isinstance(written.get("to"), Num):
            out_allowed &= {dtype_of_tensor_type(int(written["to"].value))}
        for k, a in enumerate(t.args):
            if isinstance(a, OpTerm) and input_slot(t.op, self.opset, k)[0] == out_param \
                    and not out_param.startswith("tensor("):
                out_allowed &= self.producible(a)
        return out_allowed

    def bind(self, v: Var, shape: tuple[int, ...], exact: bool = True) -> None:
        if v.const:
            self.consts.add(v.name)
        have = self.shapes.get(v.name)
        if have is None:   # a sequence's item shapes (SeqShape) stay one
            self.shapes[v.name] = shape if isinstance(shape, SeqShape) else tuple(shape)
        elif exact:
            assume(have == tuple(shape))
        else:
            assume(_broadcasts(have, shape))

    def term(self, t: Term, out: tuple[int, ...] | None, path: tuple[int, ...]) -> tuple[int, ...]:
        """Plan `t` to give a value of shape `out` (None: any shape, for a flexible term);
        returns the shape planned."""
        if isinstance(t, Var):
            if out is None:
                out = self.shapes[t.name] if t.name in self.shapes else self.shape_for(self.template(t))
            self.bind(t, out)
            return out
        if isinstance(t, (Num, Str, IntList, AttrVar)):
            return ()
        if isinstance(t, Call):
            raise SaturateError(f"a constant expression ({t.fn}) cannot be drawn as a pattern")
        op = t.op
        if not self.handled(op):
            return self.generic(t, out, path)
        if out is None and _drawn(op) == "unary":
            return self.unary(t, None, path)
        if out is None and _broadcasting(op):
            return self.broadcast(t, None, path)
        if out is None:
            out = self.shape_for(self.template(t))
        assume(self.template(t).allows(out))
        if _broadcasting(op):
            return self.broadcast(t, out, path)
        if _drawn(op) == "unary":
            return self.unary(t, out, path)
        getattr(self, "op_" + op)(t, out, path)
        return out

    def leaf_sign(self, t: OpTerm, k: int) -> None:
        """Record the domain an op needs of argument k when that argument is a variable."""
        sign = _input_domain(t.op, k)
        if sign and k < len(t.args) and isinstance(t.args[k], Var):
            self.signs.setdefault(t.args[k].name, sign)

    def operand(self, t: Term, out: tuple[int, ...], path: tuple[int, ...]) -> tuple[int, ...]:
        """Plan an argument that only has to broadcast into `out`."""
        if isinstance(t, Var):
            if t.name in self.shapes:
                self.bind(t, out, exact=False)
                return self.shapes[t.name]
            hint = self.hints.get(t.name, {})
            if "axis" in hint:
                axis, rank = hint["axis"]
                axis = axis + (rank or len(out)) if axis < 0 else axis
                axis -= (rank or len(out)) - len(out)
                assume(0 <= axis < len(out))
                shape = draw_per_axis(self.draw, out, axis)
            elif hint.get("scalar"):
                shape = (1,) * self.draw(st.integers(0, len(out)))
            elif "rank" in hint:
                assume(hint["rank"] <= len(out))
                shape = draw_broadcastable(self.draw, out, hint["rank"], hint["rank"])
            else:
                shape = draw_broadcastable(self.draw, out)
            self.bind(t, shape)
            return shape
        if isinstance(t, OpTerm):
            tmpl = self.template(t)
            if tmpl.rank is not None or tmpl.ranks is not None:
                # An op of fixed rank (Conv beside Conv over one input) takes the full shape:
                # a smaller one would rarely meet the other's geometry.
                assume(tmpl.allows(out))
                self.term(t, out, path)
                return out
            return self.smaller_op(t, out, out, path)  # the main operand has the full shape
        return ()

    def smaller_op(self, t: OpTerm, out: tuple[int, ...], given: tuple[int, ...],
                   path: tuple[int, ...]) -> tuple[int, ...]:
        """Plan an op whose output broadcasts with a shape `given` (right-aligned to `out`) to
        exactly `out`: where `given` has out's side the op may have 1 or fewer dims."""
        tmpl = self.template(t)
        # Leading axes the op may leave out: those `given` already has at full side.
        free = 0
        while free < len(out) and given[free] == out[free]:
            free += 1
        if tmpl.rank is not None:
            rank = tmpl.rank
        elif tmpl.ranks is not None:
            options = [r for r in tmpl.ranks if len(out) - free <= r <= len(out)]
            assume(options)
            rank = self.draw(st.sampled_from(options))
        else:
            rank = self.draw(st.integers(max(min(tmpl.min_rank, len(out)), len(out) - free), len(out)))
        assume(len(out) - free <= rank <= len(out))
        lead = len(out) - rank
        shape = [d if g == 1 or d == 1 or self.draw(st.booleans()) else 1
                 for d, g in zip(out[lead:], given[lead:])]
        for a, side in tmpl.fixed:
            shape[a] = side
        if tmpl.unit_spatial:
            shape[2:] = [1] * len(shape[2:])
        shape = tuple(shape)
        assume(np.broadcast_shapes(shape, given) == out if _broadcasts(shape, out) else False)
        self.term(t, shape, path)
        return shape

    # ---- attributes ---------------------------------------------------------------------------
    def attributes(self, t: OpTerm, path: tuple[int, ...], draws: dict[str, Callable[[dict], Any]]) -> dict:
        """The op's attributes: literals as written, captures reused once bound, the rest drawn.
        `draws` maps a key to a function of the attributes fixed so far that draws a value."""
        written = dict(t.attrs)
        fixed = self.written_attrs(t)
        result = dict(fixed)
        for key, fn in draws.items():
            if key not in result:
                result[key] = fn(result)
        # Every other attribute the schema gives the op is drawn from its valid values (a rule
        # must hold whatever the attributes it leaves free), except those whose shapes the
        # hand-written rule above works out, which it draws or keeps at their default.
        op_schema = schema(t.op, self.opset)
        for key in (op_schema.attributes if op_schema is not None else ()):
            if key in result or key in draws or (key in _SHAPING and self.handled(t.op)):
                continue
            drawer = attribute_drawer(t.op, key, self.opset, lambda: 0)
            if drawer is not None:
                result[key] = drawer(self.draw, result)
        merged = op_table().get(t.op)
        for key, value in written.items():
            if key not in result:  # captured but not drawn: the op's default (None: omitted)
                result[key] = merged.attrs.get(key) if merged is not None else None
            if isinstance(value, AttrVar):
                self.attrs.setdefault(value.name, result[key])
        self.node_attrs[path] = result
        self.node_ops[path] = t.op
        return result

    # ---- op shape rules ---------------------------------------------------------------------
    def unary(self, t: OpTerm, out: tuple[int, ...] | None, path: tuple[int, ...]) -> tuple[int, ...]:
        self.leaf_sign(t, 0)
        if out is None:
            out = self.term(t.args[0], None, path + (0,))
            assume(self.template(t).allows(out))
        else:
            self.term(t.args[0], out, path + (0,))
        draws: dict[str, Callable] = {}
        if t.op == "LeakyRelu":
            draws["alpha"] = lambda a: self.draw(st.sampled_from([0.01, 0.1, 0.5, -1.0, 2.0]))
        if t.op == "Softmax":
            draws["axis"] = lambda a: self.draw(st.integers(-len(out), len(out) - 1))
        self.attributes(t, path, draws)
        for k in range(1, len(t.args)):  # Clip's bounds are scalars
            if isinstance(t.args[k], Var):
                self.bind(t.args[k], ())
        return out

    def broadcast(self, t: OpTerm, out: tuple[int, ...] | None, path: tuple[int, ...]) -> tuple[int, ...]:
        """A broadcasting op of any number of inputs. The main operand (an op first) usually has
        the full output shape and the others broadcast into it; now and then the shapes
        broadcast both ways ((1, N) with (N, 1)), or a one-element constant has more dims than
        the operand beside it."""
        args = t.args
        main = self.main_index(t)
        others = [k for k in range(len(args)) if k != main]
        if t.op == "Mod":
            floating = self.node_dtypes.get(path, "float32") in FLOATS
            # fmod=0 is defined on integers only; on integers both are drawn.
            self.attributes(t, path, {"fmod": lambda _: 1 if floating else self.draw(st.sampled_from([0, 1]))})
        else:
            self.attributes(t, path, {})
        if out is None:
            # The main operand is a flexible op: its shape first, the others fit it.
            out = self.term(args[main], None, path + (main,))
            for k in others:
                self.operand(args[k], out, path + (k,))
            return out
        if not others:
            self.term(args[main], out, path + (main,))
            return out
        a = args[main]
        rest = [args[k] for k in others]
        unbound = [b for b in rest if isinstance(b, Var) and b.name not in self.shapes]
        shaped_by_guard = any({"axis", "scalar", "rank"} & set(self.hints.get(getattr(b, "name", ""), ()))
                              for b in rest)
        b, other = rest[0], others[0]
        # A variable beside an op that also reads it (x + Conv(x, w)) takes the full shape
        # first, so the op is drawn around it rather than the two shapes meeting by chance.
        if isinstance(b, Var) and b in unbound and isinstance(a, OpTerm) and _mentions(a, b.name):
            self.bind(b, out)
            self.term(a, out, path + (main,))
            for k in others[1:]:
                self.operand(args[k], out, path + (k,))
            return out
        choice = self.draw(st.integers(0, 7))
        # A one-element constant of the output's full rank beside an operand with fewer dims
        # (out has leading ones there): Add(x, c) with x (3,) and c (1, 1).
        lead = next((i for i, d in enumerate(out) if d != 1), len(out))
        if choice >= 6 and lead and isinstance(b, Var) and b.const and b in unbound:
            self.bind(b, (1,) * len(out))
            cut = self.draw(st.integers(1, lead))
            inner = out[cut:]
            if isinstance(a, OpTerm):
                assume(self.template(a).allows(inner))
            self.term(a, inner, path + (main,))
            for k in others[1:]:
                self.operand(args[k], out, path + (k,))
            return out
        # Both ways: the others broadcast into the output, the main operand has 1 (or no dim)
        # wherever one of them has the full side.
        if choice in (3, 4, 5) and not shaped_by_guard and all(isinstance(args[k], Var) for k in others):
            given = [1] * len(out)
            for k in others:
                v = args[k]
                if v.name not in self.shapes and not self.hints.get(v.name) and self.draw(st.integers(0, 3)):
                    # Mostly of the output's rank, with a 1 here and there.
                    self.bind(v, tuple(1 if self.draw(st.booleans()) else d for d in out))
                shape = self.operand(v, out, path + (k,))
                padded = (1,) * (len(out) - len(shape)) + tuple(shape)
                given = [max(g, p) if p != 1 else g for g, p in zip(given, padded)]
            given = tuple(o if g != 1 else 1 for o, g in zip(out, given))
            if isinstance(a, OpTerm):
                self.smaller_op(a, out, given, path + (main,))
            elif isinstance(a, Var) and a.name in self.shapes:
                have = self.shapes[a.name]
                assume(_broadcasts(have, out) and np.broadcast_shapes(have, given) == tuple(out))
            elif isinstance(a, Var):
                self.bind(a, self._complement(out, given))
            return out
        # Now and then an operand other than the main one sets the shape and the main one is
        # broadcast up (x + c where c is larger than x): a rule forgetting that case must fail.
        if (choice in (1, 2) and isinstance(a, Var) and isinstance(b, Var) and a.name not in self.shapes
                and b in unbound and not shaped_by_guard):
            self.bind(b, out)
            self.operand(a, out, path + (main,))
            for k in others[1:]:
                self.operand(args[k], out, path + (k,))
            return out
        # ... and the other operand is larger than the main op's output (more dims, or a side
        # where the op has 1): Add(Conv(x, w), c) with c bigger than the conv's output.
        if choice in (1, 2) and isinstance(a, OpTerm) and isinstance(b, Var) and b in unbound:
            hinted = {"axis", "scalar", "rank"} & set(self.hints.get(b.name, ()))
            if hinted:
                shape = self.operand(b, out, path + (other,))
            else:
                shape = out
                self.bind(b, shape)
            self.smaller_op(a, out, (1,) * (len(out) - len(shape)) + tuple(shape), path + (main,))
            for k in others[1:]:
                self.operand(args[k], out, path + (k,))
            return out
        self.term(a, out, path + (main,))
        for k in others:
            self.operand(args[k], out, path + (k,))
        return out

    def _complement(self, out: tuple[int, ...], given: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts with `given` (as long as out) to exactly `out`: the full side
        wherever `given` has 1, else the side or 1, with leading dims left out where `given`
        has them."""
        free = 0
        while free < len(out) and given[free] == out[free]:
            free += 1
        rank = self.draw(st.integers(len(out) - free, len(out)))
        lead = len(out) - rank
        return tuple(d if g == 1 or d == 1 or self.draw(st.booleans()) else 1
                     for d, g in zip(out[lead:], given[lead:]))

def _drawn(op: str) -> str | None:
    """How the op's registry entry says to draw it (None: the generic rule or a method op_<name>)."""
    d = find(op)
    return None if d is None else d.draw


def _broadcasting(op: str) -> bool:
    return _drawn(op) in _BROADCASTING


def _input_domain(op: str, k: int) -> str | None:
    """The part of the reals an op defines input k on, when a pattern leaf must be drawn inside it."""
    d = find(op)
    return None if d is None else d.domains.get(k)


def _empty_safe(op: str) -> bool:
    """Whether the op's shape rule draws empty tensors soundly (the generic rule checks its draws itself)."""
    d = find(op)
    return d is not None and (d.draw in ("unary", *_BROADCASTING) or d.empty_safe)



def _ops(t: Term) -> set[str]:
    if isinstance(t, OpTerm):
        return {t.op}.union(*(_ops(a) for a in t.args))
    return set()


def _broadcasts(shape: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """`shape` broadcasts into `out` without growing it."""
    try:
        return np.broadcast_shapes(tuple(shape), tuple(out)) == tuple(out)
    except ValueError:
        return False


def _mentions(t: Term, name: str) -> bool:
    """Whether variable `name` occurs in `t`."""
    if isinstance(t, Var):
        return t.name == name
    return isinstance(t, OpTerm) and any(_mentions(a, name) for a in t.args)
