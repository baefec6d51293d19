"""Rule checking, drawing the network ops: a Conv's, a pooling's, a Gemm's and a MatMul's
inputs and attributes from the output shape asked of them (the geometry is drawn first, the
input sides follow from it). A mixin of the Planner."""

from __future__ import annotations

from typing import Any, Callable

from hypothesis import assume
from hypothesis import strategies as st

from dataclasses import replace

from saturate.core.geometry import GeometryError, window
from saturate.lang.ast import OpTerm, Var
from saturate.check.strategies import (MAX_SIDE, conv_cases, conv_cases_over, conv_geometry,
                                       draw_broadcastable)


class NnPlanning:
    """Planner methods for convolutions, poolings, normalization and matrix products (the
    Planner provides draw, term, attributes, template...)."""

    def op_Conv(self: Any, t: OpTerm, out: tuple[int, ...], path: tuple[int, ...]) -> None:
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

    def _pool(self: Any, t: OpTerm, out: tuple[int, ...], path: tuple[int, ...], extra: dict) -> None:
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

    def op_MaxPool(self: Any, t, out, path) -> None:
        self._pool(t, out, path, {})

    def op_AveragePool(self: Any, t, out, path) -> None:
        self._pool(t, out, path, {"count_include_pad": lambda a: self.draw(st.sampled_from([0, 1]))})

    def op_GlobalAveragePool(self: Any, t, out, path) -> None:
        self.attributes(t, path, {})
        sides = self.draw(st.tuples(*[st.integers(1, MAX_SIDE)] * (len(out) - 2)))
        self.term(t.args[0], out[:2] + sides, path + (0,))

    def op_BatchNormalization(self: Any, t, out, path) -> None:
        self.attributes(t, path, {"epsilon": lambda a: self.draw(st.sampled_from([1e-5, 1e-3, 0.5]))})
        self.term(t.args[0], out, path + (0,))
        for k in range(1, len(t.args)):
            self.leaf_sign(t, k)
            self.term(t.args[k], (out[1],), path + (k,))

    def op_Gemm(self: Any, t, out, path) -> None:
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

    def op_MatMul(self: Any, t, out, path) -> None:
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
