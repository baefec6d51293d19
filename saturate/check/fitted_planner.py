"""Rule checking, ops whose inputs must fit each other's values: a sequence length within the
time axis, a region of interest inside the image, an image shape that the columns tile, an
equation naming the operands' axes, the subgraphs of If, Loop, Scan and SequenceMap. Each `fit_<op>` draws, in one go, the shapes of the op's
inputs, the values of those read as sizes or coordinates, and its attributes; the generic rule
(generic_planner) runs the node on the draw and keeps it if the interpreter does. A mixin of the
Planner."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from saturate.check.schema import is_exotic, np_dtype, tensor_type
from saturate.check.strategies import (MAX_SIDE, SeqShape, Template, conv_cases, draw_broadcastable, draw_constant,
                                       draw_seq_shape, draw_strings)
from saturate.lang.ast import OpTerm, Var

# A fit is called with the shapes of inputs already drawn (known), the attributes the pattern
# fixes, the op's path and the output shape asked of it (None: any). It returns the shapes of
# the inputs it does not give values for, the values of the others (by argument index), and
# the attributes.
Fit = tuple[dict[int, tuple[int, ...]], dict[int, np.ndarray], dict[str, Any]]

# Einsum's subscripts drawn: few letters, so operands share axes (contractions, diagonals).
_LETTERS = "ijkl"
# Equations models hold, by operand count, drawn half the time: transpose, trace, diagonal,
# reduction; (batched) matrix product, outer and inner products, broadcast batches.
_EINSUMS = {1: ("ij->ji", "ii->", "ii->i", "ij->i", "bij->bji", "...ij->...ji"),
            2: ("ij,jk->ik", "bij,bjk->bik", "i,j->ij", "i,i->", "ij,ij->ij", "...ij,...jk->...ik",
                "bhid,bhjd->bhij"),
            3: ("ij,jk,kl->il", "i,i,i->i")}


class FittedPlanning:
    """Planner methods drawing the inputs of one op together (the Planner provides draw,
    shape_for, arg_dtype, node_dtypes...)."""

    def _flag(self, fixed: dict, key: str, options: list) -> Any:
        if key not in fixed:
            fixed[key] = self.draw(st.sampled_from(options))
        return fixed[key]

    def fit_ReverseSequence(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # The batch and time axes are 0 and 1, either way round; every length within the time axis.
        batch_axis = int(self._flag(fixed, "batch_axis", [1, 0]))
        time_axis = int(self._flag(fixed, "time_axis", [1 - batch_axis]))
        shape = known.get(0) or out or self.shape_for(Template(min_rank=2))
        assume(len(shape) >= 2 and {batch_axis, time_axis} == {0, 1})
        steps = shape[time_axis]
        lens = [self.draw(st.integers(min(1, steps), steps)) for _ in range(shape[batch_axis])]
        return {0: shape}, {1: np.array(lens, np.int64)}, fixed

    def fit_Col2Im(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # Blocks slid over an image with strides, pads and dilations: the columns' count is the
        # number of block positions, so the input's last side follows from the image and block.
        ints = lambda lo, hi, size: [self.draw(st.integers(lo, hi)) for _ in range(size)]
        if out is not None:             # (N, C, image...): the image asked
            assume(len(out) >= 3 and 0 not in out)
            n, image = len(out) - 2, list(out[2:])
        else:
            n = self.draw(st.sampled_from([2, 1, 3]))
            image = ints(1, MAX_SIDE, n)
        block = ints(1, 3, n)
        strides = fixed.setdefault("strides", ints(1, 2, n))
        dil = fixed.setdefault("dilations", ints(1, 2, n))
        pads = fixed.setdefault("pads", ints(0, 1, 2 * n))
        assume(len(strides) == n and len(dil) == n and len(pads) == 2 * n)
        counts = [(image[i] + pads[i] + pads[n + i] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1
                  for i in range(n)]
        assume(all(c >= 1 for c in counts))
        batch, channels = out[:2] if out is not None else (self.draw(st.integers(1, 2)), self.draw(st.integers(1, 3)))
        shape = (batch, channels * math.prod(block), math.prod(counts))
        return {0: shape}, {1: np.array(image, np.int64), 2: np.array(block, np.int64)}, fixed

    def fit_CenterCropPad(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # A target side per axis (all of them, or those of `axes`), each cropped or padded to.
        shape = known.get(0) or self.shape_for(Template(rank=None if out is None else len(out), min_rank=1))
        rank = len(shape)
        assume(rank >= 1)
        if out is not None:             # every side the one asked
            assume(len(out) == rank and 0 not in out)
            fixed.setdefault("axes", None)
            sides = [out[a] for a in (fixed["axes"] or range(rank))]
            return {0: shape}, {1: np.array(sides, np.int64)}, fixed
        if "axes" not in fixed and self.draw(st.booleans()):
            chosen = sorted(self.draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True)))
            fixed["axes"] = [a - rank if self.draw(st.booleans()) else a for a in chosen]
        axes = fixed.get("axes")
        count = rank if axes is None else len(axes)
        sides = [self.draw(st.integers(1, MAX_SIDE + 1)) for _ in range(count)]
        return {0: shape}, {1: np.array(sides, np.int64)}, fixed

    def _image(self, known: dict, out: tuple | None) -> tuple[int, ...]:
        """The (N, C, H, W) image regions are pooled from, of the channels of `out` if asked."""
        shape = known.get(0) or self.shape_for(Template(rank=4))
        assume(len(shape) == 4 and 0 not in shape)
        if out is not None:
            assume(len(out) == 4 and 0 not in out)
            shape = shape if 0 in known else (shape[0], out[1]) + tuple(shape[2:])
            assume(shape[1] == out[1])
        return shape

    def _boxes(self, n: int, width: float, height: float) -> np.ndarray:
        """n boxes (x1, y1, x2, y2) on a grid of half pixels inside a width x height image (now and
        then one reaching past it), each corner no further than the opposite one."""
        def coord(limit: float) -> float:
            return self.draw(st.integers(0, int(2 * limit) + 1)) / 2
        rows = []
        for _ in range(n):
            x1, x2 = sorted((coord(width), coord(width)))
            y1, y2 = sorted((coord(height), coord(height)))
            rows.append([x1, y1, x2, y2])
        return np.array(rows, np.float32).reshape(n, 4)

    def fit_RoiAlign(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # The output (regions, C, height, width): as asked, else drawn.
        x = self._image(known, out)
        scale = float(self._flag(fixed, "spatial_scale", [1.0, 0.5, 2.0]))
        for k, key in ((2, "output_height"), (3, "output_width")):
            self._flag(fixed, key, [out[k]] if out is not None else [1, 2, 3])
        self._flag(fixed, "sampling_ratio", [0, 1, 2])
        self._flag(fixed, "mode", ["avg", "max"])
        self._flag(fixed, "coordinate_transformation_mode", ["half_pixel", "output_half_pixel"])
        n = out[0] if out is not None else self.draw(st.integers(1, 3))
        rois = self._boxes(n, x[3] / scale, x[2] / scale)
        batch = np.array([self.draw(st.integers(0, x[0] - 1)) for _ in range(n)], np.int64)
        return {0: x}, {1: rois, 2: batch}, fixed

    def fit_MaxRoiPool(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        x = self._image(known, out)
        scale = float(self._flag(fixed, "spatial_scale", [1.0, 0.5, 2.0]))
        pooled = list(out[2:]) if out is not None else [self.draw(st.integers(1, 3)), self.draw(st.integers(1, 3))]
        self._flag(fixed, "pooled_shape", [pooled])
        n = out[0] if out is not None else self.draw(st.integers(1, 3))
        batch = [[float(self.draw(st.integers(0, x[0] - 1)))] for _ in range(n)]
        rois = np.concatenate([np.array(batch, np.float32).reshape(n, 1), self._boxes(n, x[3] / scale, x[2] / scale)],
                              axis=1)
        return {0: x}, {1: rois}, fixed

    def fit_NonMaxSuppression(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # Boxes (batches, spots, 4) on a grid of half units, so that they overlap often, and
        # scores (batches, classes, spots) as data; the count kept per class (mostly not 0, which
        # keeps none) and the two thresholds are one-element values.
        boxes = known.get(0)
        if boxes is None:
            boxes = (self.draw(st.integers(1, 2)), self.draw(st.integers(1, MAX_SIDE + 2)), 4)
        assume(len(boxes) == 3 and boxes[2] == 4)
        corners = [self.draw(st.integers(0, 8)) / 2 for _ in range(math.prod(boxes))]
        values = {0: np.array(corners, np.float32).reshape(boxes)}
        shapes = {1: (boxes[0], self.draw(st.integers(1, 2)), boxes[1])}
        if len(t.args) > 2:
            keep = self.draw(st.integers(1, boxes[1] + 1)) if self.draw(st.integers(0, 5)) else 0
            values[2] = np.array([keep], np.int64)
        if len(t.args) > 3:
            values[3] = np.array([self.draw(st.sampled_from([0.5, 0.0, 0.25, 1.0]))], np.float32)
        if len(t.args) > 4:
            values[4] = np.array([self.draw(st.sampled_from([0.0, -1.0, 0.5, 2.0]))], np.float32)
        return shapes, values, fixed

    def fit_AffineGrid(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # theta (N, 2, 3) for a 2-D grid of size (N, C, H, W), (N, 3, 4) for a 3-D one.
        # The grid (N, H, W, 2) or (N, D, H, W, 3): as asked, else drawn.
        assume(out is None or (len(out) in (4, 5) and out[-1] == len(out) - 2))
        theta = known.get(0)
        if theta is None:
            n_sp = len(out) - 2 if out is not None else self.draw(st.sampled_from([2, 3]))
            theta = (out[0] if out is not None else self.draw(st.integers(1, 2)), n_sp, n_sp + 1)
        assume(len(theta) == 3 and theta[1] in (2, 3) and theta[2] == theta[1] + 1)
        sides = list(out[1:-1]) if out is not None else [self.draw(st.integers(1, MAX_SIDE)) for _ in range(theta[1])]
        size = [theta[0], self.draw(st.integers(1, 3))] + sides
        return {0: theta}, {1: np.array(size, np.int64)}, fixed

    def fit_DeformConv(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # A 2-D Conv's geometry, and per output pixel an offset (and a mask) for each kernel tap
        # of each offset group, which splits the input's channels.
        # Small: onnx.reference runs it pixel by pixel, tap by tap, in Python.
        out = out or tuple(self.draw(st.integers(1, 2)) for _ in range(4))
        assume(len(out) == 4 and 0 not in out)
        case = self.draw(conv_cases(out, {k: fixed[k] for k in ("group", "kernel_shape", "strides", "pads",
                                                                 "dilations") if k in fixed}))
        channels = case.x_shape[1]
        groups = self._flag(fixed, "offset_group", [g for g in (1, 2, 3) if channels % g == 0])
        taps = math.prod(case.attrs["kernel_shape"])
        shapes = {0: case.x_shape, 1: case.w_shape, 2: (out[0], groups * 2 * taps) + out[2:]}
        if len(t.args) > 3:
            shapes[3] = (out[1],)
        if len(t.args) > 4:
            shapes[4] = (out[0], groups * taps) + out[2:]
        return shapes, {}, {**case.attrs, **fixed}

    def fit_Einsum(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # An equation naming each operand's axes with a few shared letters (a letter twice in one
        # operand takes its diagonal), an output of some of them in any order (or none written:
        # the letters seen once, sorted), and now and then leading axes broadcast by "...". An
        # operand drawn already (or a variable read twice) keeps its shape: its letters are
        # drawn among those of its sides.
        sides: dict[str, int] = {}
        first = {}
        for k, a in enumerate(t.args):
            if isinstance(a, Var):
                first.setdefault(a.name, k)
        shapes: dict[int, tuple[int, ...]] = {}

        def given(k: int) -> tuple[int, ...] | None:
            a = t.args[k]
            if k in known:
                return tuple(known[k])
            return shapes.get(first[a.name]) if isinstance(a, Var) and first[a.name] < k else None

        def side(c: str, want: int | None = None) -> int:
            have = sides.setdefault(c, self.draw(st.integers(1, MAX_SIDE)) if want is None else want)
            assume(want is None or have == want)
            return have

        def letter(want: int) -> str:
            c = self.draw(st.sampled_from([c for c in _LETTERS if sides.get(c, want) == want] or ["?"]))
            assume(c != "?")
            side(c, want)
            return c

        fresh = not known and len(first) == len(t.args)
        equation = fixed.get("equation")
        if equation is None and fresh and len(t.args) in _EINSUMS and self.draw(st.booleans()):
            equation = self.draw(st.sampled_from(_EINSUMS[len(t.args)]))
        dots = "..." if equation is None and fresh and self.draw(st.integers(0, 4)) == 4 else ""
        terms: list[str] = []       # each operand's letters: the equation's, or drawn below
        if equation is not None:
            dots = "..." if "..." in equation else ""
            terms = [term.replace("...", "") for term in equation.replace(" ", "").split("->")[0].split(",")]
            assume(len(terms) == len(t.args))
        batch = self.shape_for(Template(), hi=2) if dots else ()
        for k in range(len(t.args)):
            have = given(k)
            if equation is None and have is not None:
                letters = [letter(d) for d in have]
            elif equation is None:
                letters = self.draw(st.lists(st.sampled_from(_LETTERS), min_size=int(k == 0), max_size=3))
            else:
                letters = list(terms[k])
            if have is not None:
                assume(len(have) >= len(letters) and (len(have) == len(letters) or dots))
                for c, d in zip(letters, have[len(have) - len(letters):]):
                    side(c, d)
                shapes[k] = have
            else:
                lead = tuple(d if d == 1 or self.draw(st.integers(0, 3)) else 1 for d in batch) if dots else ()
                shapes[k] = lead + tuple(side(c) for c in letters)
            if equation is None:
                terms.append("".join(letters))
        if equation is None:
            used = sorted({c for term in terms for c in term})
            inputs = ",".join(dots + term for term in terms)
            if self.draw(st.integers(0, 3)) == 3:
                equation = inputs
            else:
                kept = self.draw(st.permutations(used))[:self.draw(st.integers(0, len(used)))]
                equation = f"{inputs}->{dots}{''.join(kept)}"
        fixed["equation"] = equation
        return shapes, {}, fixed

    def fit_BitCast(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # To the output's dtype, which the types drawn give the input's width (Planner.assign_types).
        fixed.setdefault("to", tensor_type(self.node_dtypes.get(path, "float32")))
        return {0: known.get(0) or out or self.shape_for(Template())}, {}, fixed

    def fit_TfIdfVectorizer(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # A pool of 1- and 2-grams over small integers (the values drawn most), read from rows of
        # integers with skips between an n-gram's items.
        pool1 = sorted(set(self.draw(st.lists(st.integers(-1, 4), min_size=1, max_size=3))))
        pool2 = [self.draw(st.integers(-1, 4)) for _ in range(2 * self.draw(st.integers(0, 2)))]
        grams = len(pool1) + len(pool2) // 2
        lo = self.draw(st.integers(1, 2 if pool2 else 1))
        attrs = {"mode": self.draw(st.sampled_from(["TF", "IDF", "TFIDF"])), "pool_int64s": pool1 + pool2,
                 "ngram_counts": [0, len(pool1)], "ngram_indexes": self.draw(st.permutations(range(grams))),
                 "min_gram_length": lo, "max_gram_length": self.draw(st.integers(lo, 2 if pool2 else 1)),
                 "max_skip_count": self.draw(st.integers(0, 2))}
        if self.draw(st.booleans()):
            attrs["weights"] = [self.draw(st.sampled_from([1.0, 0.5, 2.0, 0.25])) for _ in range(grams)]
        attrs.update(fixed)
        shape = known.get(0) or self.shape_for(Template(), lo=1, hi=2)
        # Token ids from the pool's range, so that n-grams occur (a drawn int is rarely one).
        tokens = np.array([self.draw(st.integers(-1, 4)) for _ in range(math.prod(shape))], np.int64)
        return {}, {0: tokens.reshape(shape)}, attrs

    def fit_Attention(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # Q (B, Hq, L, E), K (B, Hkv, S, E), V (B, Hkv, S, Ev), Hq a multiple of Hkv; or the same
        # packed as (B, L, Hq * E) with the head counts as attributes.
        # A past key and value (B, Hkv, P, E) go before the new ones; the mask covers them all.
        b, kv, length, span, e, ev = (self.draw(st.integers(1, 3)) for _ in range(6))
        heads = kv * self.draw(st.integers(1, 2))
        past = self.draw(st.integers(1, 2)) if len(t.args) > 4 else 0
        if out is not None:             # (B, Hq, L, Ev), or packed (B, L, Hq * Ev)
            assume(len(out) in (3, 4) and 0 not in out)
            if len(out) == 4:
                b, heads, length, ev = out
            else:
                b, length = out[:2]
                heads = self.draw(st.sampled_from([h for h in range(1, out[2] + 1) if out[2] % h == 0]))
                ev = out[2] // heads
            kv = self.draw(st.sampled_from([k for k in range(1, heads + 1) if heads % k == 0]))
        if out is not None and len(out) == 4 or out is None and self.draw(st.booleans()):
            shapes = {0: (b, heads, length, e), 1: (b, kv, span, e), 2: (b, kv, span, ev)}
        else:
            fixed.setdefault("q_num_heads", heads)
            fixed.setdefault("kv_num_heads", kv)
            shapes = {0: (b, length, heads * e), 1: (b, span, kv * e), 2: (b, span, kv * ev)}
        self._flag(fixed, "softcap", [0.0, 0.0, 2.0])
        if len(t.args) > 3:
            shapes[3] = (length, past + span)
        if len(t.args) > 5:
            shapes[4], shapes[5] = (b, kv, past, e), (b, kv, past, ev)
        return shapes, {}, fixed

    def fit_LinearAttention(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # Packed (B, T, H * D) query, key and value; the plain linear recurrence unless decay
        # and update rate are given; a past state (B, Hkv, Dk, Dv).
        b, steps, kv, dk, dv = (self.draw(st.integers(1, 3)) for _ in range(5))
        heads = kv * self.draw(st.integers(1, 2))
        if out is not None:             # (B, T, Hq * Dv)
            assume(len(out) == 3 and 0 not in out)
            b, steps = out[:2]
            heads = self.draw(st.sampled_from([h for h in range(1, out[2] + 1) if out[2] % h == 0]))
            dv = out[2] // heads
            kv = self.draw(st.sampled_from([k for k in range(1, heads + 1) if heads % k == 0]))
        fixed.setdefault("q_num_heads", heads)
        fixed.setdefault("kv_num_heads", kv)
        if len(t.args) <= 4:
            fixed.setdefault("update_rule", "linear")
        shapes = {0: (b, steps, heads * dk), 1: (b, steps, kv * dk), 2: (b, steps, kv * dv)}
        if len(t.args) > 3:
            shapes[3] = (b, kv, dk, dv)
        return shapes, {}, fixed

    def fit_Constant(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # The value as one of the attributes that hold it, in the dtype drawn for the output.
        if any(key.startswith("value") for key in fixed):
            return {}, {}, fixed
        dtype = self.node_dtypes.get(path, "float32")
        shape = self.shape_for(Template())
        value = draw_constant(self.draw, shape, "any", dtype)
        style = self.draw(st.integers(0, 2))
        if style == 1 and dtype in ("float32", "int64"):
            key = "value_float" if dtype == "float32" else "value_int"
            fixed[key] = value.reshape(-1)[0].item() if value.size else 0
        elif style == 2 and dtype in ("float32", "int64") and len(shape) == 1:
            fixed["value_floats" if dtype == "float32" else "value_ints"] = value.tolist()
        else:
            fixed["value"] = value
        return {}, {}, fixed

    def fit_If(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # A drawn condition, and two branches each computing a constant of the shape and dtype
        # drawn for the output (a branch reading no outer value: a pattern binds none).
        shape = out if out is not None else self.shape_for(Template())
        dtype = self.node_dtypes.get(path, "float32")
        for key in ("then_branch", "else_branch"):
            if key not in fixed:
                fixed[key] = _constant_branch(key, draw_constant(self.draw, tuple(shape), "any", dtype))
        return {}, {0: np.array(self.draw(st.booleans()))}, fixed

    def fit_Loop(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # A trip count and a condition, no loop-carried value: the body's condition goes on or
        # stops after a drawn iteration, its scan output a constant of the drawn dtype, so the
        # output stacks one per iteration run.
        assume(len(t.args) == 2 and (out is None or len(out) >= 1))
        dtype = self.node_dtypes.get(path, "float32")
        item = tuple(out[1:]) if out is not None else self.shape_for(Template(), hi=3)
        trips = out[0] if out is not None else self.draw(st.integers(0, 3))
        stop = self.draw(st.integers(0, 4)) if out is None else trips + 1
        if "body" not in fixed:
            fixed["body"] = _loop_body(draw_constant(self.draw, item, "any", dtype), stop)
        return {}, {0: np.array(trips, np.int64), 1: np.array(out is not None or self.draw(st.booleans()))}, fixed

    def fit_Scan(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # One scan input and no state: the body passes each slice on, along drawn axes and
        # directions, so the output is the input moved or reversed along its scanned axis.
        assume(len(t.args) == 1)
        shape = known.get(0) or self.shape_for(Template(min_rank=1), lo=1)
        assume(len(shape) >= 1)
        rank = len(shape)
        fixed.setdefault("num_scan_inputs", 1)
        fixed.setdefault("scan_input_axes", [self.draw(st.integers(-rank, rank - 1))])
        fixed.setdefault("scan_input_directions", [self.draw(st.integers(0, 1))])
        fixed.setdefault("scan_output_axes", [self.draw(st.integers(-rank, rank - 1))])
        fixed.setdefault("scan_output_directions", [self.draw(st.integers(0, 1))])
        if "body" not in fixed:
            fixed["body"] = _pass_body(self.arg_dtype(t, path, 0))
        return {0: tuple(shape)}, {}, fixed

    def fit_SequenceMap(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # A body over each item and the extra inputs: the item alone (Identity, an elementwise op,
        # plus a constant of its own), with each extra input (a tensor broadcasting into every item,
        # or a sequence's item beside it) by an elementwise op, then cast to the output's type; or
        # the item's Shape, where the output holds int64. No outer value is read.
        seq = known.get(0)
        paired = next((known[k] for k in range(1, len(t.args)) if isinstance(known.get(k), SeqShape)), None)
        if seq is None and paired is not None:
            seq = paired                    # item by item beside a sequence of extra inputs
        elif seq is None:
            seq = out if out is not None and self.draw(st.booleans()) else \
                draw_seq_shape(self.draw, self.shape_for(Template(), hi=3))
        assume(isinstance(seq, SeqShape))
        items = [tuple(item) for item in seq]
        common = tuple(1 if len({item[a] for item in items}) > 1 else items[0][a] for a in range(len(items[0]))) \
            if items and len({len(item) for item in items}) == 1 else None
        shapes = {0: seq}
        for k in range(1, len(t.args)):
            if k in known:
                shapes[k] = known[k]
            elif common is not None:
                shapes[k] = draw_broadcastable(self.draw, common)
            else:
                shapes[k] = self.shape_for(Template(), hi=2)
        if "body" not in fixed:
            dtypes = [self.arg_dtype(t, path, k) for k in range(len(t.args))]
            fixed["body"] = self._map_body(dtypes, self.node_dtypes.get(path, dtypes[0]),
                                           [isinstance(shapes[k], SeqShape) for k in range(len(t.args))])
        return shapes, {}, fixed

    def _map_body(self, dtypes: list[str], result: str, sequences: list[bool]) -> Any:
        """A SequenceMap body reading an item of dtypes[0] and the extra inputs (each a tensor, or a
        sequence's item), computing an item of dtype `result`."""
        from onnx import helper, numpy_helper

        item = dtypes[0]
        kind = np.dtype(np_dtype(item)).kind
        nodes, inits = [], []
        inputs = [_typed(f"in{k}", d, None) for k, d in enumerate(dtypes)]
        numeric = kind in "iuf" and not is_exotic(np_dtype(item))
        if result == "int64" and len(dtypes) == 1 and self.draw(st.booleans()):
            nodes.append(helper.make_node("Shape", ["in0"], ["out"]))
        else:
            value = "in0"
            for k in range(1, len(dtypes)):
                other = f"in{k}"
                if dtypes[k] != item:
                    nodes.append(helper.make_node("CastLike", [other, "in0"], [f"like{k}"]))
                    other = f"like{k}"
                op = self.draw(st.sampled_from(["Add", "Mul", "Max"])) if numeric else "Xor" if kind == "b" else None
                if op is not None:
                    nodes.append(helper.make_node(op, [value, other], [f"v{k}"]))
                    value = f"v{k}"
            if len(dtypes) == 1:
                unary = "Not" if kind == "b" else "Neg" if kind in "if" and numeric else "Abs" if numeric else None
                choice = self.draw(st.sampled_from(["Identity", "unary", "constant"]))
                if choice == "unary" and unary is not None:
                    nodes.append(helper.make_node(unary, [value], ["v0"]))
                    value = "v0"
                elif choice == "constant" and numeric:
                    # A value the body holds itself: an elementwise op over the item and it.
                    c = np.array(self.draw(st.sampled_from([1, 2, 3] if kind in "iu" else [0.5, -2.0, 3.0])), np_dtype(item))
                    inits.append(numpy_helper.from_array(c, "c"))
                    nodes.append(helper.make_node(self.draw(st.sampled_from(["Add", "Mul", "Sub"])), [value, "c"], ["v0"]))
                    value = "v0"
            if result != item:
                nodes.append(helper.make_node("Cast", [value], ["out"], to=tensor_type(result)))
            else:
                nodes.append(helper.make_node("Identity", [value], ["out"]))
        graph = helper.make_graph(nodes, "body", inputs, [_typed("out", result, None)], inits)
        return _graph_attr("body", graph)

    def fit_MelWeightMatrix(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # A few bins over a short DFT, the band's edges inside the Nyquist range: a drawn integer
        # read as the bin count or DFT length would ask for gigabytes.
        rate = self.draw(st.sampled_from([16, 100, 8000]))
        low = self.draw(st.sampled_from([0.0, rate / 8]))
        values = {0: self.draw(st.integers(1, 4)), 1: self.draw(st.integers(2, 9)), 2: rate, 3: low,
                  4: self.draw(st.sampled_from([rate / 2, rate / 4]))}
        return {}, {k: np.array(v, self.arg_dtype(t, path, k)) for k, v in values.items()}, fixed

    def fit_ImageDecoder(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # A tiny image of drawn pixels, encoded losslessly (PNG or BMP), decoded to any format.
        import io

        import PIL.Image
        height, width = self.draw(st.integers(1, MAX_SIDE)), self.draw(st.integers(1, MAX_SIDE))
        pixels = np.frombuffer(self.draw(st.binary(min_size=height * width * 3, max_size=height * width * 3)),
                               np.uint8).reshape(height, width, 3)
        encoded = io.BytesIO()
        PIL.Image.fromarray(pixels, "RGB").save(encoded, format=self.draw(st.sampled_from(["PNG", "BMP"])))
        self._flag(fixed, "pixel_format", ["RGB", "BGR", "Grayscale"])
        return {}, {0: np.frombuffer(encoded.getvalue(), np.uint8).copy()}, fixed

    def fit_StringNormalizer(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # Strings of shape [C] or [1, C], the only ones the op takes, and stopwords that bite:
        # words of the drawn strings (in another case now and then, for is_case_sensitive),
        # with one that occurs nowhere.
        shape = known.get(0) or out or self.draw(st.sampled_from([(self.draw(st.integers(1, MAX_SIDE)),),
                                                                   (1, self.draw(st.integers(1, MAX_SIDE)))]))
        assume(len(shape) in (1, 2) and (len(shape) == 1 or shape[0] == 1))
        strings = draw_strings(self.draw, tuple(shape))
        if "stopwords" not in fixed and self.draw(st.integers(0, 3)):
            words = sorted({w for s in strings.ravel() for w in s.split(" ") if w})
            chosen = self.draw(st.lists(st.sampled_from(words), max_size=3, unique=True)) if words else []
            chosen = [w.upper() if self.draw(st.integers(0, 3)) == 0 else w for w in chosen]
            fixed["stopwords"] = chosen + [self.draw(st.sampled_from(["zzz", "The"]))]
        return {}, {0: strings}, fixed

    # ---- ops drawing random numbers: the output's shape and dtype, and Bernoulli's probabilities

    def _random_dtype(self, t: OpTerm, fixed: dict, path: tuple) -> None:
        # The dtype drawn for the node, written; a Like op or Bernoulli whose input has that
        # dtype leaves it out now and then (the output then follows the input's).
        dtype = self.node_dtypes.get(path, "float32")
        if "dtype" in fixed or (t.args and self.arg_dtype(t, path, 0) == dtype and self.draw(st.booleans())):
            return
        fixed["dtype"] = tensor_type(dtype)

    def fit_RandomNormal(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        shape = out or self.shape_for(Template(min_rank=1))
        assume(len(shape) >= 1)             # onnx.reference refuses an empty `shape`
        fixed.setdefault("shape", list(shape))
        self._random_dtype(t, fixed, path)
        return {}, {}, fixed

    fit_RandomUniform = fit_RandomNormal

    def fit_RandomNormalLike(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # The input is read for its shape only.
        shape = known.get(0) or out or self.shape_for(Template())
        self._random_dtype(t, fixed, path)
        return {0: tuple(shape)}, {}, fixed

    fit_RandomUniformLike = fit_RandomNormalLike

    def fit_Bernoulli(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # Probabilities in [0, 1], the ends included (certain outcomes).
        shape = known.get(0) or out or self.shape_for(Template())
        size = math.prod(shape)
        p = [self.draw(st.sampled_from([0.5, 0.0, 1.0, 0.25, 0.9, 0.1, 0.75])) for _ in range(min(size, 64))]
        probs = np.resize(np.array(p or [0.5], np.float64), size).reshape(shape)
        self._random_dtype(t, fixed, path)
        return {}, {0: probs}, fixed

    def fit_Multinomial(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # Logits [batch, class_size], a row spread over its classes (some never drawn: -inf) or
        # held by one dominant class; a few samples per row, int32 (the default, written or not)
        # or int64.
        shape = known.get(0) or ((out[0] if out else self.draw(st.integers(1, 3))), self.draw(st.integers(1, 5)))
        assume(len(shape) == 2 and shape[1] >= 1 and (out is None or len(out) == 2 and out[0] == shape[0]))
        self._flag(fixed, "sample_size", [out[1]] if out is not None else [1, 3, 2, 5])
        dtype = self.node_dtypes.get(path, "int32")
        if "dtype" not in fixed and (dtype != "int32" or self.draw(st.booleans())):
            fixed["dtype"] = tensor_type(dtype)
        rows = []
        for _ in range(shape[0]):
            classes = shape[1]
            if self.draw(st.integers(0, 2)) == 0:
                # One class far above the others (a probability of 0.9997 over four more at 0).
                row = [self.draw(st.sampled_from([0.0, -np.inf, -1.0])) for _ in range(classes)]
                row[self.draw(st.integers(0, classes - 1))] = 8.0
            else:
                row = [self.draw(st.sampled_from([0.0, 1.0, -1.0, 2.0, -0.5, -np.inf, 3.0])) for _ in range(classes)]
                if not np.isfinite(row).any():
                    row[self.draw(st.integers(0, classes - 1))] = 0.0
            rows.append(row)
        return {}, {0: np.array(rows, np.float64).reshape(shape)}, fixed

    def fit_RotaryEmbedding(self, t: OpTerm, known: dict, fixed: dict, path: tuple, out: tuple | None) -> Fit:
        # X as (batch, heads, seq, head) or (batch, seq, heads * head) with num_heads; the caches
        # hold half the rotated width (all of the head, or a part of it) per position: per batch
        # and step, or per position that position_ids (below the caches' length) pick.
        shape = known.get(0) or out
        if shape is None:
            b, h, s, d = (self.draw(st.integers(1, 2)), self.draw(st.integers(1, 3)), self.draw(st.integers(1, 4)),
                          self.draw(st.sampled_from([2, 4])))
            shape = (b, h, s, d) if self.draw(st.booleans()) else (b, s, h * d)
            if len(shape) == 3:
                fixed.setdefault("num_heads", h)
        assume(len(shape) in (3, 4))
        if len(shape) == 4:
            b, h, s, d = shape
        else:
            b, s, width = shape
            h = fixed.get("num_heads") or 0
            assume(h and width % h == 0)
            d = width // h
        assume(d % 2 == 0 and d > 0)
        if "rotary_embedding_dim" not in fixed and d > 2 and self.draw(st.integers(0, 2)) == 0:
            fixed["rotary_embedding_dim"] = 2
        half = (fixed.get("rotary_embedding_dim") or d) // 2
        self._flag(fixed, "interleaved", [0, 1])
        if len(t.args) > 3:
            positions = self.draw(st.integers(s, s + 2))
            ids = np.array([[self.draw(st.integers(0, positions - 1)) for _ in range(s)] for _ in range(b)], np.int64)
            return {0: tuple(shape), 1: (positions, half), 2: (positions, half)}, {3: ids}, fixed
        return {0: tuple(shape), 1: (b, s, half), 2: (b, s, half)}, {}, fixed


def _graph_attr(name: str, graph: Any) -> Any:
    from onnx import helper

    from saturate.core.ir import OpaqueAttr

    return OpaqueAttr("GRAPH", helper.make_attribute(name, graph).SerializeToString())


def _typed(name: str, dtype: str, shape: Any) -> Any:
    from onnx import helper

    from saturate.frontend.onnx_tensors import elem_type

    return helper.make_tensor_value_info(name, elem_type(dtype), shape)


def _constant(out: str, value: np.ndarray) -> Any:
    from onnx import helper

    from saturate.frontend.onnx_export import _tensor

    return helper.make_node("Constant", [], [out], value=_tensor("", value))


def _constant_branch(name: str, value: np.ndarray) -> Any:
    """A subgraph attribute computing `value` with a Constant node and reading nothing."""
    from onnx import helper

    out = f"{name}_value"
    graph = helper.make_graph([_constant(out, value)], name, [], [_typed(out, _dtype_name(value), list(value.shape))])
    return _graph_attr(name, graph)


def _loop_body(value: np.ndarray, stop: int) -> Any:
    """A Loop body (iteration, condition) -> (iteration + 1 < stop, value)."""
    from onnx import helper, numpy_helper

    nodes = [helper.make_node("Add", ["i", "one"], ["next"]), helper.make_node("Less", ["next", "stop"], ["going"]),
             _constant("item", value)]
    graph = helper.make_graph(nodes, "body", [_typed("i", "int64", []), _typed("cond", "bool", [])],
                              [_typed("going", "bool", []), _typed("item", _dtype_name(value), list(value.shape))],
                              [numpy_helper.from_array(np.array(1, np.int64), "one"),
                               numpy_helper.from_array(np.array(stop, np.int64), "stop")])
    return _graph_attr("body", graph)


def _pass_body(dtype: str) -> Any:
    """A Scan body passing each slice of its one scan input on."""
    from onnx import helper

    graph = helper.make_graph([helper.make_node("Identity", ["slice"], ["item"])], "body",
                              [_typed("slice", dtype, None)], [_typed("item", dtype, None)])
    return _graph_attr("body", graph)


def _dtype_name(value: np.ndarray) -> str:
    return "object" if value.dtype == object else value.dtype.name
