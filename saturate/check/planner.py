"""Property testing: derive consistent shapes and attributes for a pattern from its ops' semantics.

The planner first draws a dtype for every value as the ops' ONNX type constraints allow
(`assign_types`), then walks the pattern top-down. The root gets a drawn output shape; every op
turns the shape asked of it into shapes for its arguments (a Conv's output fixes the input's
batch and the weight's output channels, a broadcasting Add gives its main argument the full
shape and the others broadcastable ones, ...). Ops with no such hand-written rule go to the
generic one (`generic`): candidate input shapes, attributes and shape-like inputs, kept when the
interpreter runs the node and gives the shape asked (or, for a term drawn from its inputs up,
any shape). Attributes a pattern leaves free are drawn from the op's schema (schema.py).
Guards steer the drawing so that they hold: a value under `positive` is drawn positive, one
under `varies_only_along` along that axis only.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from saturate.core.errors import SaturateError
from saturate.core.geometry import GeometryError, window
from saturate.core.ir import Node
from saturate.ops.schema import op_table, spec
from saturate.lang.ast import AttrVar, Call, Guard, IntList, Num, OpTerm, Str, Term, Var
from saturate.check.quant_planner import QuantPlanning
from saturate.check.schema import (BASE_OPSET, DTYPE_WEIGHTS, FLOATS, attribute_drawer, draw_dtype,
                                   dtype_of_tensor_type, input_slot, schema, slot_types, tensor_type)
from saturate.ops.registry import domain_of, find, ops_with
from saturate.check.strategies import (MAX_RANK, MAX_SIDE, conv_cases, conv_cases_over, conv_geometry,
                                       draw_broadcastable, draw_factorization, draw_per_axis, numel)

_SIGN_GUARDS = {"positive": "positive", "nonnegative": "nonnegative", "nonzero": "nonzero"}
# How the op registry says to draw an op (OpDef.draw); these broadcast multidirectionally, as Add.
_BROADCASTING = ("binary", "variadic", "broadcast")
# Attributes the hand-written shape rules below draw themselves (or keep at their default);
# every other attribute of those ops is drawn from the schema.
_SHAPING = {"axis", "axes", "perm", "kernel_shape", "strides", "pads", "dilations", "group", "auto_pad",
            "ceil_mode", "transA", "transB", "start", "end", "keepdims", "storage_order"}
# Tries of the generic shape rule before an example is given up.
_GENERIC_TRIES = 12
# Window ops over 1, 2 and 3 spatial axes; 2-D first, as models mostly hold.
_WINDOW_RANKS = (4, 3, 5)


@dataclass(frozen=True)
class Template:
    """What an op needs of its output shape: an exact rank (or a least rank) and fixed sides."""

    rank: int | None = None
    min_rank: int = 0
    fixed: tuple[tuple[int, int], ...] = ()
    # The ranks allowed when rank is None (None: any from min_rank), most common first: the
    # shrinker moves towards the first.
    ranks: tuple[int, ...] | None = None
    # Every axis from 2 on has side 1 (a global pooling's output, at any rank).
    unit_spatial: bool = False

    def allows(self, shape: tuple[int, ...]) -> bool:
        """Whether an output of this shape fits the template."""
        r = len(shape)
        return ((self.rank is None or self.rank == r) and r >= self.min_rank
                and (self.ranks is None or r in self.ranks) and all(shape[a] == s for a, s in self.fixed)
                and (not self.unit_spatial or all(d == 1 for d in shape[2:])))


def _num(term: Term) -> Any:
    return term.value if isinstance(term, Num) else None


class Planner(QuantPlanning):
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
        if not isinstance(first, Var):
            # `rank(v) == k` pins a rank; other comparisons are checked after drawing.
            if g.fn == "==" and isinstance(first, Call) and first.fn == "rank" and _num(args[1]) is not None:
                if isinstance(first.args[0], Var):
                    self.hints.setdefault(first.args[0].name, {})["rank"] = int(args[1].value)
            return
        hint = self.hints.setdefault(first.name, {})
        if g.fn == "same_quant" and all(isinstance(a, Var) for a in args):
            # The second (scale, zero point) drawn mostly as a copy of the first.
            self.hints.setdefault(args[2].name, {})["same_as"] = first.name
            self.hints.setdefault(args[3].name, {})["same_as"] = args[1].name
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
        if op in ("Cast", "CastLike"):
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
        if op in ops_with("evaluates") and spec(op, self.opset) is not None:
            return
        reason = unsupported_reason(op, self.opset)
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
    def assign_types(self, t: Term, allowed: frozenset[str] | None, path: tuple[int, ...]) -> str | None:
        """Draw the dtype of `t`'s value among `allowed` (None: any drawn dtype) as its op's type
        constraints allow; returns it. An op the engine rewrites only on floats (every op but
        the shape-arithmetic ones, see the op registry's shape_arith flag) is drawn on floats where
        its schema allows one."""
        options = frozenset(DTYPE_WEIGHTS) if allowed is None else allowed
        if isinstance(t, Var):
            have = self.dtypes.get(t.name)
            if have is not None:
                assume(have in options)
                return have
            assume(options)
            wanted = options & self.hints.get(t.name, {}).get("dtypes", options)
            self.dtypes[t.name] = draw_dtype(self.draw, wanted or options)
            return self.dtypes[t.name]
        if not isinstance(t, OpTerm):
            return None
        op = t.op
        if schema(op, self.opset) is None:
            self.generic_check(op)
        (out_param, out_allowed), _ = slot_types(op, self.opset)
        out_opts = out_allowed & options
        op_spec = spec(op, self.opset)
        if op_spec is not None and not op_spec.any_dtype and out_opts & FLOATS:
            out_opts &= FLOATS
        written = dict(t.attrs)
        if op == "Cast" and isinstance(written.get("to"), Num):
            out_opts &= {dtype_of_tensor_type(int(written["to"].value))}
        if op == "Mod" and isinstance(written.get("fmod"), Num) and not written["fmod"].value:
            out_opts -= FLOATS  # fmod=0 is defined on integers only
        assume(out_opts)
        dtype = draw_dtype(self.draw, out_opts)
        self.node_dtypes[path] = dtype
        bound = {out_param: dtype} if not out_param.startswith("tensor(") else {}
        for k, a in enumerate(t.args):
            param, opts = input_slot(op, self.opset, k)
            want = frozenset({bound[param]}) if param in bound else opts
            got = self.assign_types(a, want, path + (k,))
            if got is not None and not param.startswith("tensor("):
                bound.setdefault(param, got)
        return dtype

    def bind(self, v: Var, shape: tuple[int, ...], exact: bool = True) -> None:
        if v.const:
            self.consts.add(v.name)
        have = self.shapes.get(v.name)
        if have is None:
            self.shapes[v.name] = tuple(shape)
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

    def op_Conv(self, t: OpTerm, out: tuple[int, ...], path: tuple[int, ...]) -> None:
        case: list = []
        x = t.args[0]
        # An input already drawn (x also read elsewhere in the pattern) fixes the geometry's
        # input side; a conv drawn before over the same input is the sibling to align with.
        bound = self.shapes.get(x.name) if isinstance(x, Var) else None
        sibling = self.conv_inputs.get(x.name) if isinstance(x, Var) else None

        n_sp = len(out) - 2

        def geometry(fixed: dict) -> Any:
            if not case:
                auto = fixed.get("auto_pad") or "NOTSET"
                fixed = dict(fixed)
                if auto != "NOTSET":
                    # VALID pads nothing; SAME_* pads as the input side asks (sides set below).
                    fixed["pads"] = [0] * (2 * n_sp)
                if bound is not None and auto in ("NOTSET", "VALID"):
                    c = self.draw(conv_cases_over(out, bound, fixed, sibling, self.centred_convs))
                else:
                    c = self.draw(conv_cases(out, fixed))
                if auto.startswith("SAME"):
                    # SAME_*: the output side is ceil(input side / stride).
                    strides = c.attrs["strides"]
                    sides = tuple(self.draw(st.integers((o - 1) * s + 1, o * s)) for o, s in zip(out[2:], strides))
                    if bound is not None:
                        assume(len(bound) == len(out) and bound[1] == c.x_shape[1])
                        sides = tuple(bound[2:])
                        assume(all(-(-i // s) == o for i, s, o in zip(sides, strides, out[2:])))
                    c = replace(c, x_shape=c.x_shape[:2] + sides)
                case.append(c)
            return case[0]

        attrs = self.attributes(t, path, {
            # Explicit pads mostly (what exporters write), every auto_pad mode now and then.
            "auto_pad": lambda a: self.draw(st.sampled_from(["NOTSET", "NOTSET", "NOTSET", "SAME_UPPER",
                                                             "SAME_LOWER", "VALID"])),
            "group": lambda a: geometry(a).attrs["group"],
            "kernel_shape": lambda a: geometry(a).attrs["kernel_shape"],
            "strides": lambda a: geometry(a).attrs["strides"],
            "pads": lambda a: None if (a.get("auto_pad") or "NOTSET") != "NOTSET" else geometry(a).attrs["pads"],
            "dilations": lambda a: geometry(a).attrs["dilations"],
        })
        c = geometry(attrs)
        if isinstance(x, Var):
            self.conv_inputs.setdefault(x.name, attrs)
        self.term(t.args[0], c.x_shape, path + (0,))
        self.term(t.args[1], c.w_shape, path + (1,))
        if len(t.args) > 2:
            self.term(t.args[2], (out[1],), path + (2,))

    def _pool(self, t: OpTerm, out: tuple[int, ...], path: tuple[int, ...], extra: dict) -> None:
        done: list = []

        def geometry(fixed: dict) -> Any:
            if not done:
                if self.unit_windows:
                    # Kernel and strides of ones each three times in four, so that a one-element
                    # window at a larger stride is drawn as often as the identity is. (Pads are
                    # drawn narrower than the kernel, as ONNX Runtime requires: none for these.)
                    n = len(out) - 2
                    ones = {k: [1] * n for k in ("kernel_shape", "strides") if self.draw(st.integers(0, 3)) > 0}
                    fixed = {**ones, **fixed}
                done.append(self.draw(conv_geometry(out[2:], fixed, dilations=t.op == "MaxPool")))
            return done[0]

        keys = ["kernel_shape", "strides", "pads"] + (["dilations"] if t.op == "MaxPool" else [])
        draws: dict[str, Callable] = {
            # Explicit pads and floor mostly, as exporters write; the other modes now and then.
            "auto_pad": lambda a: self.draw(st.sampled_from(["NOTSET"] * 3 + ["SAME_UPPER", "SAME_LOWER", "VALID"])),
            "ceil_mode": lambda a: self.draw(st.sampled_from([0, 0, 1]))}
        draws.update({k: (lambda a, k=k: geometry(a)[0][k]) for k in keys})
        draws["pads"] = lambda a: None if (a.get("auto_pad") or "NOTSET") != "NOTSET" else geometry(a)[0]["pads"]
        draws.update(extra)
        attrs = self.attributes(t, path, draws)
        _, sides = geometry(attrs)
        if (attrs.get("auto_pad") or "NOTSET") != "NOTSET" or attrs.get("ceil_mode"):
            sides = self._window_sides(attrs, out[2:])
        self.term(t.args[0], out[:2] + sides, path + (0,))

    def _window_sides(self, attrs: dict, out: tuple[int, ...]) -> tuple[int, ...]:
        """Input sides a window of these attributes (any auto_pad, ceil_mode) maps to `out`:
        found by trying every side up to the widest that can give it."""
        n = len(out)
        kernel = list(attrs.get("kernel_shape") or [1] * n)
        strides = list(attrs.get("strides") or [1] * n)
        dil = list(attrs.get("dilations") or [1] * n)
        pads = list(attrs.get("pads") or [0] * (2 * n))
        sides = []
        for i in range(n):
            one = {"auto_pad": attrs.get("auto_pad") or "NOTSET", "strides": [strides[i]], "dilations": [dil[i]],
                   "pads": [pads[i], pads[n + i]]}
            fits = []
            for side in range(1, out[i] * strides[i] + dil[i] * (kernel[i] - 1) + 2):
                try:
                    got = window(one, [side], [kernel[i]], bool(attrs.get("ceil_mode"))).out[0]
                except GeometryError:
                    continue
                if got == out[i]:
                    fits.append(side)
            assume(fits)
            sides.append(self.draw(st.sampled_from(fits)))
        return tuple(sides)

    def op_MaxPool(self, t, out, path) -> None:
        self._pool(t, out, path, {})

    def op_AveragePool(self, t, out, path) -> None:
        self._pool(t, out, path, {"count_include_pad": lambda a: self.draw(st.sampled_from([0, 1]))})

    def op_GlobalAveragePool(self, t, out, path) -> None:
        self.attributes(t, path, {})
        sides = self.draw(st.tuples(*[st.integers(1, MAX_SIDE)] * (len(out) - 2)))
        self.term(t.args[0], out[:2] + sides, path + (0,))

    def op_BatchNormalization(self, t, out, path) -> None:
        self.attributes(t, path, {"epsilon": lambda a: self.draw(st.sampled_from([1e-5, 1e-3, 0.5]))})
        self.term(t.args[0], out, path + (0,))
        for k in range(1, len(t.args)):
            self.leaf_sign(t, k)
            self.term(t.args[k], (out[1],), path + (k,))

    def op_Gemm(self, t, out, path) -> None:
        pick = st.sampled_from
        attrs = self.attributes(t, path, {
            "transA": lambda a: self.draw(pick([0, 1])), "transB": lambda a: self.draw(pick([0, 1])),
            "alpha": lambda a: self.draw(pick([1.0, 0.5, -2.0])),
            "beta": lambda a: self.draw(pick([1.0, 0.5, -2.0]))})
        m, n = out
        k = self.draw(st.integers(1, MAX_SIDE))
        self.term(t.args[0], (k, m) if attrs["transA"] else (m, k), path + (0,))
        self.term(t.args[1], (n, k) if attrs["transB"] else (k, n), path + (1,))
        if len(t.args) > 2:
            self.operand(t.args[2], out, path + (2,))

    def op_MatMul(self, t, out, path) -> None:
        self.attributes(t, path, {})
        # An input another root of the rule has bound already (q, k and v of one x) keeps its side.
        bound = self.shapes.get(t.args[0].name) if isinstance(t.args[0], Var) else None
        k = bound[-1] if bound else self.draw(st.integers(1, MAX_SIDE))
        batch, (m, n) = out[:-2], out[-2:]
        self.term(t.args[0], batch + (m, k), path + (0,))
        b_rank = self.template(t.args[1]).rank
        if b_rank is not None:
            assume(2 <= b_rank <= len(out))
            b_batch = draw_broadcastable(self.draw, batch, b_rank - 2, b_rank - 2)
        else:
            b_batch = draw_broadcastable(self.draw, batch)
        self.term(t.args[1], tuple(b_batch) + (k, n), path + (1,))

    def op_Reshape(self, t, out, path) -> None:
        attrs = self.attributes(t, path, {})
        allowzero = bool(attrs.get("allowzero"))
        empty = 0 in out
        rank = self.draw(st.integers(1, MAX_RANK))
        zeros = [i for i, d in enumerate(out) if d == 0]
        if empty and not allowzero:
            # A 0 in the output comes from copying the input's 0 at the same index.
            source = tuple(out)
        elif len(zeros) > 1 and self.draw(st.booleans()):
            # allowzero=1: a 0 written where the input has another side (one 0 is enough for
            # the element counts to agree), which a fold reading 0 as "copy" gets wrong.
            keep = self.draw(st.sampled_from(zeros))
            source = tuple(self.draw(st.integers(1, MAX_SIDE)) if d == 0 and i != keep else d
                           for i, d in enumerate(out))
        else:
            source = draw_factorization(self.draw, numel(out), rank)
        self.term(t.args[0], source, path + (0,))
        target = list(out)
        # -1 stands for the side the element count gives: not when that count is 0.
        if not empty and self.draw(st.booleans()):
            target[self.draw(st.integers(0, len(out) - 1))] = -1
        # 0 copies the input's dim at the same index (allowzero=0), or is a 0 side (allowzero=1):
        # written now and then wherever it gives the output's side.
        for i, want in enumerate(out):
            zero_fits = want == 0 if allowzero else (i < len(source) and source[i] == want)
            if zero_fits and target[i] != -1 and (want == 0 or self.draw(st.integers(0, 3)) == 3):
                target[i] = 0
        shape_arg = t.args[1]
        if isinstance(shape_arg, Var):
            self.bind(shape_arg, (len(out),))
            self.forced[shape_arg.name] = np.array(target, np.int64)
        else:
            raise SaturateError("the checker needs Reshape's shape to be a variable")

    def op_Flatten(self, t, out, path) -> None:
        a, b = out
        rank = self.draw(st.integers(1, MAX_RANK))
        lo = 1 if a > 1 else 0
        hi = rank - 1 if b > 1 else rank
        attrs = self.attributes(t, path, {"axis": lambda _: self.draw(st.integers(min(lo, hi), hi))})
        axis = int(attrs["axis"])
        axis = axis + rank if axis < 0 else axis
        assume(0 <= axis <= rank and (axis > 0 or a == 1) and (axis < rank or b == 1))
        head = draw_factorization(self.draw, a, axis)
        tail = draw_factorization(self.draw, b, rank - axis)
        self.term(t.args[0], head + tail, path + (0,))

    def op_Transpose(self, t, out, path) -> None:
        perm = dict(t.attrs).get("perm")
        # An identity_perm guard would reject all but one of the rank! permutations.
        identity = isinstance(perm, AttrVar) and self.attr_hints.get(perm.name) == "identity"
        axes = range(len(out))
        # An omitted perm (reversed axes) now and then: a rule reading perm must handle it.
        attrs = self.attributes(t, path, {
            "perm": lambda a: list(axes) if identity else
            None if self.draw(st.integers(0, 3)) == 3 else self.draw(st.permutations(axes))})
        perm = attrs["perm"]
        perm = list(range(len(out)))[::-1] if perm is None else [int(p) for p in perm]
        assume(sorted(perm) == list(range(len(out))))
        shape = [0] * len(out)
        for i, p in enumerate(perm):
            shape[p] = out[i]
        self.term(t.args[0], tuple(shape), path + (0,))

    # ---- the generic shape rule: any op the interpreter runs ------------------------------------
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
        for _ in range(_GENERIC_TRIES):
            shapes = dict(known)
            for k in data:
                if k in shapes:
                    continue
                tmpl = self.template(t.args[k])
                first = next((shapes[j] for j in data if j in shapes), None)
                if first is None:
                    shapes[k] = self.candidate(out, tmpl)
                else:
                    pick = self.draw(st.integers(0, 3))
                    shapes[k] = (first if pick < 2 else draw_broadcastable(self.draw, first) if pick == 2
                                 else self.shape_for(tmpl))
            rank = len(shapes[data[0]]) if data else 0
            attrs = dict(fixed)
            for key in op_schema.attributes:
                if key not in attrs:
                    drawer = attribute_drawer(op, key, self.opset, lambda: rank)
                    attrs[key] = drawer(self.draw, attrs) if drawer is not None else None
            values = {k: self.param_values(t, k, op_schema, rank) for k, kind in enumerate(kinds) if kind == "param"}
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

    def written_attrs(self, t: OpTerm) -> dict[str, Any]:
        """The attributes a pattern op fixes: literals, and captures already bound."""
        fixed: dict[str, Any] = {}
        for key, value in t.attrs:
            if isinstance(value, AttrVar):
                if value.name in self.attrs:
                    fixed[key] = self.attrs[value.name]
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
        name = formals[min(k, len(formals) - 1)].name if formals else ""
        if name in _PARAMS or np.dtype(self.dtypes.get(a.name, "float32")).kind in "iu" and k > 0:
            return "param"
        return "data"

    def param_values(self, t: OpTerm, k: int, op_schema: Any, rank: int) -> np.ndarray:
        """Values of a shape-like input, by the name the schema gives it."""
        v = t.args[k]
        if v.name in self.forced:
            return self.forced[v.name]
        formals = list(op_schema.inputs)
        name = formals[min(k, len(formals) - 1)].name
        dtype = np.dtype(self.dtypes.get(v.name, "int64"))
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
        elif name in ("indices", "k", "split"):
            values = d(st.lists(ints(-1, 2) if name == "indices" else ints(1, 3), min_size=1, max_size=2))
        else:
            return np.asarray(d(ints(-1, 3)) if dtype.kind in "iu" else d(st.sampled_from([0.5, 1.0, 2.0])),
                              dtype)
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
            args.append(np.zeros(shapes[k], dtype or "float32"))
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
        return tuple(int(d) for d in np.shape(result[0]))

    # ---- shape computations (int64 data about shapes, as exporters emit them) ---------------
    def index_values(self, v: Term, shape: tuple[int, ...], lo: int, hi: int, what: str,
                     values: list[int] | None = None) -> None:
        """Bind an int64 input of `shape` (indices, axes) to forced values drawn in [lo, hi]."""
        if not isinstance(v, Var):
            raise SaturateError(f"the checker needs {what} to be a variable")
        size = numel(shape)
        if values is None:
            values = self.draw(st.lists(st.integers(lo, hi), min_size=size, max_size=size))
        self.bind(v, shape)
        self.forced[v.name] = np.array(values, np.int64).reshape(shape)

    def op_Shape(self, t, out, path) -> None:
        n = out[0]
        arg = t.args[0]
        partner = self.shapes.get(self.hints.get(getattr(arg, "name", ""), {}).get("same_shape", ""))
        if partner is not None and len(partner) >= n and getattr(arg, "name", "") not in self.shapes:
            rank = len(partner)
        else:
            partner, rank = None, self.draw(st.integers(n, max(n, MAX_RANK)))

        def start(_: dict) -> int:
            s = self.draw(st.integers(0, rank - n))
            return s - rank if self.draw(st.booleans()) else s

        def end(a: dict) -> int | None:
            s = int(a["start"] or 0)
            e = (s + rank if s < 0 else s) + n
            return None if e == rank and self.draw(st.booleans()) else e
        attrs = self.attributes(t, path, {"start": start, "end": end})
        assume(len(range(rank)[attrs["start"] or 0:attrs["end"]]) == n)
        self.term(arg, partner if partner is not None else self.shape_for(Template(rank=rank)), path + (0,))

    def op_Gather(self, t, out, path) -> None:
        r = len(out)
        data = self.template(t.args[0]).rank
        # Rank of the indices: fixed when the data's rank is (a shape is rank 1), else drawn.
        q = r - data + 1 if data is not None and 1 <= data <= r + 1 else self.draw(st.integers(0, r))
        data_rank = r - q + 1

        def axis(_: dict) -> int:
            a = self.draw(st.integers(0, r - q))
            return a - data_rank if self.draw(st.booleans()) else a
        ax = int(self.attributes(t, path, {"axis": axis})["axis"])
        ax = ax + data_rank if ax < 0 else ax
        assume(0 <= ax <= r - q)
        n = self.draw(st.integers(1, MAX_SIDE))
        self.term(t.args[0], out[:ax] + (n,) + out[ax + q:], path + (0,))
        self.index_values(t.args[1], out[ax:ax + q], -n, n - 1, "Gather's indices")

    def op_Unsqueeze(self, t, out, path) -> None:
        r = len(out)
        ones = [i for i, d in enumerate(out) if d == 1]
        chosen = sorted(self.draw(st.lists(st.sampled_from(ones), unique=True))) if ones else []
        axes = [a - r if self.draw(st.booleans()) else a for a in chosen]
        attrs = self.attributes(t, path, {} if len(t.args) == 2 else {"axes": lambda _: axes})
        if len(t.args) == 2:
            self.index_values(t.args[1], (len(axes),), 0, 0, "Unsqueeze's axes", axes)
        else:
            assume(attrs["axes"] is not None and list(attrs["axes"]) == axes)
        self.term(t.args[0], tuple(d for i, d in enumerate(out) if i not in chosen), path + (0,))

    def op_Squeeze(self, t, out, path) -> None:
        r = len(out)
        k = self.draw(st.integers(0, max(0, MAX_RANK + 1 - r)))
        chosen = sorted(self.draw(st.lists(st.integers(0, r + k - 1), min_size=k, max_size=k, unique=True))
                        ) if r + k else []
        rest = iter(out)
        shape = tuple(1 if i in chosen else next(rest) for i in range(r + k))
        axes = [a - (r + k) if self.draw(st.booleans()) else a for a in chosen]
        # Without axes every 1-dim goes: drawn only when the output has none to keep.
        all_ones = 1 not in out and self.draw(st.booleans())
        attrs = self.attributes(t, path, {} if len(t.args) == 2 else
                                {"axes": lambda _: None if all_ones else axes})
        if len(t.args) == 2:
            self.index_values(t.args[1], (len(axes),), 0, 0, "Squeeze's axes", axes)
        else:
            want = None if all_ones else axes
            assume((attrs["axes"] is None and want is None) or
                   (attrs["axes"] is not None and want is not None and list(attrs["axes"]) == want))
        self.term(t.args[0], shape, path + (0,))

    def op_Concat(self, t, out, path) -> None:
        r, n = len(out), len(t.args)
        # Inputs are non-empty unless the axis is too short for that or, now and then, an empty
        # one is drawn on purpose: the shrinker then keeps a non-empty counterexample when one
        # shows the fault. A drawn axis is one long enough for n non-empty inputs.
        empty = n > 1 and self.draw(st.integers(0, 7)) == 7
        long_enough = [a for a in range(r) if out[a] >= n]

        def axis(_: dict) -> int:
            a = self.draw(st.sampled_from(long_enough)) if long_enough and not empty else \
                self.draw(st.integers(0, r - 1))
            return a - r if self.draw(st.booleans()) else a
        ax = int(self.attributes(t, path, {"axis": axis})["axis"])
        ax = ax + r if ax < 0 else ax
        assume(0 <= ax < r)
        if n == 1:
            cuts = []
        elif out[ax] >= n and not empty:
            cuts = sorted(self.draw(st.lists(st.integers(1, out[ax] - 1), min_size=n - 1, max_size=n - 1,
                                             unique=True)))
        else:
            cuts = sorted(self.draw(st.lists(st.integers(0, out[ax]), min_size=n - 1, max_size=n - 1)))
        bounds = [0] + cuts + [out[ax]]
        for k, a in enumerate(t.args):
            self.term(a, out[:ax] + (bounds[k + 1] - bounds[k],) + out[ax + 1:], path + (k,))

    def op_Cast(self, t, out, path) -> None:
        # `to` is the output dtype drawn for the node (assign_types), from any source dtype.
        self.attributes(t, path, {"to": lambda _: tensor_type(self.node_dtypes.get(path, "float32"))})
        self.term(t.args[0], out, path + (0,))


    def op_CastLike(self, t, out, path) -> None:
        self.attributes(t, path, {})
        self.term(t.args[0], out, path + (0,))
        like = t.args[1]
        if isinstance(like, Var) and like.name not in self.shapes:
            self.bind(like, self.shape_for(Template()))
        elif not isinstance(like, Var):
            self.term(like, self.shape_for(self.template(like)), path + (1,))

    def op_Slice(self, t, out, path) -> None:
        """Per sliced axis a step (1, 2 or -1) and bounds that give the output's side, written
        now and then as negative indices or clamped sentinels past the end, as exporters do."""
        self.attributes(t, path, {})
        r = len(out)
        big = np.iinfo(np.int64).max
        if len(t.args) == 3:
            axes = list(range(self.draw(st.integers(1, r))))
        else:
            axes = sorted(self.draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r, unique=True)))
        shape, starts, ends, steps = list(out), [], [], []
        for a in axes:
            m = out[a]
            k = self.draw(st.sampled_from([1, 2, -1])) if len(t.args) == 5 else 1
            span = (m - 1) * abs(k) + 1
            n = self.draw(st.integers(span, span + 2))
            shape[a] = n
            if k > 0:
                lo = self.draw(st.integers(0, n - span))
                hi = lo + span + self.draw(st.integers(0, k - 1))
                hi = big if hi >= n and self.draw(st.booleans()) else min(hi, n + 3)
                lo = lo - n if lo and self.draw(st.booleans()) else lo
            else:
                lo = self.draw(st.integers(span - 1, n - 1))
                hi = lo - span
                hi = -big if hi < 0 and self.draw(st.booleans()) else (hi if hi >= 0 else -n - 1)
            starts.append(lo)
            ends.append(hi)
            steps.append(k)
        self.term(t.args[0], tuple(shape), path + (0,))
        size = (len(axes),)
        self.index_values(t.args[1], size, 0, 0, "Slice's starts", starts)
        self.index_values(t.args[2], size, 0, 0, "Slice's ends", ends)
        if len(t.args) > 3:
            written = [a - r if self.draw(st.booleans()) else a for a in axes]
            self.index_values(t.args[3], size, 0, 0, "Slice's axes", written)
        if len(t.args) > 4:
            self.index_values(t.args[4], size, 0, 0, "Slice's steps", steps)

    def op_Expand(self, t, out, path) -> None:
        """The input broadcasts into the output; the shape asks for the output's dims, or 1 where
        the input already has them (Expand never shrinks), or fewer leading dims."""
        self.attributes(t, path, {})
        shape = draw_broadcastable(self.draw, out)
        self.term(t.args[0], shape, path + (0,))
        padded = (1,) * (len(out) - len(shape)) + tuple(shape)
        target = [d if p == 1 or self.draw(st.booleans()) else 1 for d, p in zip(out, padded)]
        # Leading dims the input itself has at full size may be left out of the shape.
        keep = 0
        while keep < len(out) and padded[keep] == out[keep]:
            keep += 1
        target = target[self.draw(st.integers(0, keep if len(shape) == len(out) else 0)):]
        self.index_values(t.args[1], (len(target),), 0, 0, "Expand's shape", target)

    def op_ConstantOfShape(self, t, out, path) -> None:
        dtype = np.dtype(self.node_dtypes.get(path, "float32"))
        fill = self.draw(st.sampled_from([0, 1, 2] + ([-3] if dtype.kind in "fi" else [])))
        # The output's dtype is the value's (float32 zero when the value is omitted).
        omit = dtype == np.float32 and fill == 0 and self.draw(st.booleans())
        self.attributes(t, path, {"value": lambda _: None if omit else np.array([fill], dtype)})
        self.index_values(t.args[0], (len(out),), 0, 0, "ConstantOfShape's shape", list(out))

    def op_Pad(self, t, out, path) -> None:
        """Pads drawn per axis (begin, end) within the output side; the input is what is left.
        Now and then a pad is negative (it crops, as the spec allows), in every mode; reflect
        needs an input side of 2 or more wherever it pads."""
        attrs = self.attributes(t, path, {})
        mode = attrs.get("mode") or "constant"
        r = len(out)
        zero = self.hints.get(getattr(t.args[1], "name", ""), {}).get("fill") == 0.0
        begin, end = [], []
        for d in out:
            if zero:
                begin.append(0)
                end.append(0)
                continue
            b = self.draw(st.integers(0, max(d - 1, 0)))
            e = self.draw(st.integers(0, max(d - 1 - b, 0)))
            # A crop: the input has the removed elements too.
            if self.draw(st.integers(0, 3)) == 3:
                b = -self.draw(st.integers(1, 2))
            if self.draw(st.integers(0, 3)) == 3:
                e = -self.draw(st.integers(1, 2))
            begin.append(b)
            end.append(e)
        source = tuple(d - b - e for d, b, e in zip(out, begin, end))
        assume(all(side >= 0 for side in source))
        if mode != "constant":
            # Edge, reflect and wrap read the input wherever they pad: it has elements there.
            assume(all(side >= 1 or (b <= 0 and e <= 0) for side, b, e in zip(source, begin, end)))
        if mode == "reflect":
            assume(all(side >= max(b, e) + 1 or (b <= 0 and e <= 0) for side, b, e in zip(source, begin, end)))
        self.term(t.args[0], source, path + (0,))
        self.index_values(t.args[1], (2 * r,), 0, 0, "Pad's pads", begin + end)
        if len(t.args) > 2 and isinstance(t.args[2], Var):
            self.bind(t.args[2], ())

    def op_Range(self, t, out, path) -> None:
        self.attributes(t, path, {})
        n = out[0]
        start = self.draw(st.integers(-5, 5))
        delta = self.draw(st.sampled_from([1, 2, 3, -1, -2]))
        limit = start + (n - 1) * delta + (1 if delta > 0 else -1) * self.draw(st.integers(1, abs(delta)))
        for k, v in enumerate((start, limit, delta)):
            self.index_values(t.args[k], (), 0, 0, "Range's inputs", [v])


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


# Inputs of these names hold shape-like data the generic rule draws values for.
_PARAMS = frozenset({"axes", "repeats", "sizes", "scales", "roi", "pads", "indices", "k", "split"})
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
