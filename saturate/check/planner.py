"""Property testing: derive consistent shapes and attributes for a pattern from its ops' semantics.

The planner walks a pattern top-down. The root gets a drawn output shape; every op turns the
shape asked of it into shapes for its arguments (a Conv's output fixes the input's batch and
the weight's output channels, a broadcasting Add gives its main argument the full shape and
the other a broadcastable one, ...). Guards steer the drawing so that they hold: a value under
`positive` is drawn positive, one under `varies_only_along` along that axis only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from saturate.core.errors import SaturateError
from saturate.core.ops import op_table
from saturate.lang.ast import AttrVar, Call, Guard, IntList, Num, OpTerm, Str, Term, Var
from saturate.check.strategies import (MAX_RANK, MAX_SIDE, conv_cases, conv_cases_over, conv_geometry,
                                       draw_broadcastable, draw_factorization, draw_per_axis, numel)

_SIGN_GUARDS = {"positive": "positive", "nonnegative": "nonnegative", "nonzero": "nonzero"}
_UNARY = {"Relu", "Sigmoid", "Tanh", "Erf", "Neg", "Sqrt", "Reciprocal", "Identity", "Exp", "Log",
          "Abs", "Dropout", "LeakyRelu", "Clip", "Softmax"}
_BINARY = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mod"}
_WINDOW = {"Conv", "MaxPool", "AveragePool"}
# Window ops over 1, 2 and 3 spatial axes; 2-D first, as models mostly hold.
_WINDOW_RANKS = (4, 3, 5)
# Inputs an op only defines on part of the reals: drawn inside it when they are pattern leaves.
_DOMAINS = {("BatchNormalization", 4): "nonnegative", ("Sqrt", 0): "nonnegative", ("Log", 0): "positive"}


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


class Planner:
    """Draws shapes for every variable of a pattern, attributes of every op, and sign classes."""

    def __init__(self, draw: Callable, guards: tuple[Guard, ...] = ()):
        self.draw = draw
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
        if g.fn in _SIGN_GUARDS:
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
        if op in _WINDOW:
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
        if op in _UNARY:
            a = self.template(args[0])
            return replace(a, min_rank=max(a.min_rank, 1 if op == "Softmax" else 0))
        if op in _BINARY:
            main = self.template(args[self.main_index(t)])
            other = self.template(args[1 - self.main_index(t)])
            least = max(main.min_rank, other.rank or other.min_rank)
            # The output keeps the main operand's template: the other operand may still be the
            # larger one (`binary`), adding dims or sides the main one has as 1.
            return replace(main, min_rank=least)
        raise SaturateError(f"no shape rule for op '{op}' (the checker cannot draw inputs for it)")

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
        return tuple(shape)

    # ---- top-down planning ----------------------------------------------------------------
    def plan(self, pattern: Term) -> tuple[int, ...]:
        """Plan the whole pattern; returns the output shape drawn for it (0-d included, where
        the pattern allows it: a scalar stands wherever a tensor may)."""
        out = self.shape_for(self.template(pattern))
        self.term(pattern, out, ())
        return out

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

    def term(self, t: Term, out: tuple[int, ...], path: tuple[int, ...]) -> None:
        if isinstance(t, Var):
            self.bind(t, out)
            return
        if isinstance(t, (Num, Str, IntList, AttrVar)):
            return
        if isinstance(t, Call):
            raise SaturateError(f"a constant expression ({t.fn}) cannot be drawn as a pattern")
        assume(self.template(t).allows(out))
        op = t.op
        if op in _BINARY:
            self.binary(t, out, path)
        elif op in _UNARY:
            self.unary(t, out, path)
        else:
            getattr(self, "op_" + op)(t, out, path)

    def leaf_sign(self, t: OpTerm, k: int) -> None:
        """Record the domain an op needs of argument k when that argument is a variable."""
        sign = _DOMAINS.get((t.op, k))
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
        fixed: dict[str, Any] = {}
        for key, value in written.items():
            if isinstance(value, AttrVar):
                if value.name in self.attrs:
                    fixed[key] = self.attrs[value.name]
            elif isinstance(value, (Num, Str)):
                fixed[key] = value.value
            elif isinstance(value, IntList):
                fixed[key] = list(value.values)
        result = dict(fixed)
        for key, fn in draws.items():
            if key not in result:
                result[key] = fn(result)
        spec = op_table().get(t.op)
        for key, value in written.items():
            if key not in result:  # captured but not drawn: the op's default (None: omitted)
                result[key] = spec.attrs.get(key) if spec is not None else None
            if isinstance(value, AttrVar):
                self.attrs.setdefault(value.name, result[key])
        self.node_attrs[path] = result
        self.node_ops[path] = t.op
        return result

    # ---- op shape rules ---------------------------------------------------------------------
    def unary(self, t: OpTerm, out: tuple[int, ...], path: tuple[int, ...]) -> None:
        draws: dict[str, Callable] = {}
        if t.op == "LeakyRelu":
            draws["alpha"] = lambda a: self.draw(st.sampled_from([0.01, 0.1, 0.5, -1.0, 2.0]))
        if t.op == "Softmax":
            draws["axis"] = lambda a: self.draw(st.integers(-len(out), len(out) - 1))
        self.attributes(t, path, draws)
        self.leaf_sign(t, 0)
        self.term(t.args[0], out, path + (0,))
        for k in range(1, len(t.args)):  # Clip's bounds are scalars
            if isinstance(t.args[k], Var):
                self.bind(t.args[k], ())

    def binary(self, t: OpTerm, out: tuple[int, ...], path: tuple[int, ...]) -> None:
        self.attributes(t, path, {})
        main = self.main_index(t)
        other = 1 - main
        a, b = t.args[main], t.args[other]
        # Now and then the other operand is the one that sets the shape and the main one is
        # broadcast up (x + c where c is larger than x): a rule forgetting that case must fail.
        shaped_by_guard = {"axis", "scalar", "rank"} & set(self.hints.get(getattr(b, "name", ""), ()))
        # A variable beside an op that also reads it (x + Conv(x, w)) takes the full shape
        # first, so the op is drawn around it rather than the two shapes meeting by chance.
        if isinstance(b, Var) and b.name not in self.shapes and isinstance(a, OpTerm) and _mentions(a, b.name):
            self.bind(b, out)
            self.term(a, out, path + (main,))
            return
        if (isinstance(a, Var) and isinstance(b, Var) and a.name not in self.shapes
                and b.name not in self.shapes and not shaped_by_guard
                and self.draw(st.integers(0, 3)) == 3):
            self.bind(b, out)
            self.operand(a, out, path + (main,))
            return
        # Now and then the other operand is larger than the main op's output (more dims, or a
        # side where the op has 1) and broadcasts it up: Add(Conv(x, w), c) with c bigger than
        # the conv's output. A rule that forgets this case must fail.
        if (isinstance(a, OpTerm) and isinstance(b, Var) and b.name not in self.shapes
                and self.draw(st.integers(0, 3)) == 3):
            hinted = {"axis", "scalar", "rank"} & set(self.hints.get(b.name, ()))
            if hinted:
                shape = self.operand(b, out, path + (other,))
            else:
                shape = out
                self.bind(b, shape)
            self.smaller_op(a, out, (1,) * (len(out) - len(shape)) + tuple(shape), path + (main,))
            return
        self.term(a, out, path + (main,))
        self.operand(b, out, path + (other,))

    def op_Conv(self, t: OpTerm, out: tuple[int, ...], path: tuple[int, ...]) -> None:
        case: list = []
        x = t.args[0]
        # An input already drawn (x also read elsewhere in the pattern) fixes the geometry's
        # input side; a conv drawn before over the same input is the sibling to align with.
        bound = self.shapes.get(x.name) if isinstance(x, Var) else None
        sibling = self.conv_inputs.get(x.name) if isinstance(x, Var) else None

        def geometry(fixed: dict) -> Any:
            if not case:
                if bound is not None:
                    case.append(self.draw(conv_cases_over(out, bound, fixed, sibling, self.centred_convs)))
                else:
                    case.append(self.draw(conv_cases(out, fixed)))
            return case[0]

        attrs = self.attributes(t, path, {
            "auto_pad": lambda a: "NOTSET",
            "group": lambda a: geometry(a).attrs["group"],
            "kernel_shape": lambda a: geometry(a).attrs["kernel_shape"],
            "strides": lambda a: geometry(a).attrs["strides"],
            "pads": lambda a: geometry(a).attrs["pads"],
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
        draws = {k: (lambda a, k=k: geometry(a)[0][k]) for k in keys}
        draws.update(extra)
        attrs = self.attributes(t, path, draws)
        _, sides = geometry(attrs)
        self.term(t.args[0], out[:2] + sides, path + (0,))

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
        k = self.draw(st.integers(1, MAX_SIDE))
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
        rank = self.draw(st.integers(1, MAX_RANK))
        source = draw_factorization(self.draw, numel(out), rank)
        self.term(t.args[0], source, path + (0,))
        target = list(out)
        if self.draw(st.booleans()):
            target[self.draw(st.integers(0, len(out) - 1))] = -1
        # 0 copies the input's dim at the same index (unless allowzero=1, where it means 0):
        # written now and then wherever the input has the output's side there.
        if not attrs.get("allowzero"):
            for i, (want, have) in enumerate(zip(out, source)):
                if want == have and target[i] != -1 and self.draw(st.integers(0, 3)) == 3:
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
        rank = self.draw(st.integers(n, max(n, MAX_RANK)))

        def start(_: dict) -> int:
            s = self.draw(st.integers(0, rank - n))
            return s - rank if self.draw(st.booleans()) else s

        def end(a: dict) -> int | None:
            s = int(a["start"] or 0)
            e = (s + rank if s < 0 else s) + n
            return None if e == rank and self.draw(st.booleans()) else e
        attrs = self.attributes(t, path, {"start": start, "end": end})
        assume(len(range(rank)[attrs["start"] or 0:attrs["end"]]) == n)
        self.term(t.args[0], self.shape_for(Template(rank=rank)), path + (0,))

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
        # float, int64, double: the types a shape computation or a model's arithmetic casts to.
        self.attributes(t, path, {"to": lambda _: self.draw(st.sampled_from([1, 7, 11]))})
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
        fills = [None, np.array([0.5], np.float32), np.array([-3], np.int64), np.array([2.0], np.float64)]
        self.attributes(t, path, {"value": lambda _: self.draw(st.sampled_from(fills))})
        self.index_values(t.args[0], (len(out),), 0, 0, "ConstantOfShape's shape", list(out))

    def op_Pad(self, t, out, path) -> None:
        """Pads drawn per axis (begin, end) within the output side; the input is what is left."""
        self.attributes(t, path, {"mode": lambda _: "constant"})
        r = len(out)
        zero = self.hints.get(getattr(t.args[1], "name", ""), {}).get("fill") == 0.0
        begin = [0 if zero else self.draw(st.integers(0, d - 1)) for d in out]
        end = [0 if zero else self.draw(st.integers(0, d - 1 - b)) for d, b in zip(out, begin)]
        self.term(t.args[0], tuple(d - b - e for d, b, e in zip(out, begin, end)), path + (0,))
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
