"""Rule checking, drawing the movement and shape ops: Reshape, Transpose, Slice, Concat, Pad, ...
and the int64 shape computations exporters emit (Shape, Gather, Unsqueeze, Range, ...), whose
index inputs are drawn as forced values that give the output shape asked. A mixin of the Planner."""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from saturate.core.errors import SaturateError
from saturate.lang.ast import AttrVar, Term, Var
from saturate.check.schema import STRING, cast_runs, is_exotic, is_exotic_int, np_dtype, tensor_type
from saturate.check.strategies import (MAX_RANK, MAX_SIDE, Template, draw_broadcastable,
                                       draw_factorization, numel)


class MovementPlanning:
    """Planner methods for movement and shape-computation ops (the Planner provides draw, term,
    bind, attributes, template, shape_for...)."""

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
        attrs = self.attributes(t, path, {"to": lambda _: tensor_type(self.node_dtypes.get(path, "float32"))})
        self.term(t.args[0], out, path + (0,))
        self.numbers_cast(t, path)
        self.cast_runs(t, path, attrs)

    def cast_runs(self, t, path, attrs) -> None:
        """Leave out the few casts between ml_dtypes' types the interpreter does not run."""
        source = t.args[0]
        got = self.dtypes.get(source.name) if isinstance(source, Var) else self.node_dtypes.get(path + (0,))
        if got is not None:
            assume(cast_runs(got, self.node_dtypes.get(path, "float32"), attrs.get("saturate", 1)))

    def numbers_cast(self, t, path) -> None:
        """Strings Cast (or CastLike) reads as numbers: integers for an integer type, any number else."""
        source = t.args[0]
        to = np_dtype(self.node_dtypes.get(path, "float32"))
        if isinstance(source, Var) and self.dtypes.get(source.name) == STRING:
            self.hints.setdefault(source.name, {}).setdefault("numbers", "int" if to.kind in "iu" else "float")
        elif isinstance(source, Var) and is_exotic(to):
            # A float source of a cast to float8, float4, bfloat16 or int4: now and then values
            # beyond the target's range and below its subnormals, and for a float target inf or
            # NaN, which ONNX maps by the type's saturation table (floating-point policy, checking.md).
            self.hints.setdefault(source.name, {})["specials"] = "int" if is_exotic_int(to) else "float"


    def op_CastLike(self, t, out, path) -> None:
        attrs = self.attributes(t, path, {})
        self.term(t.args[0], out, path + (0,))
        self.numbers_cast(t, path)
        self.cast_runs(t, path, attrs)
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
        dtype = np_dtype(self.node_dtypes.get(path, "float32"))
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
