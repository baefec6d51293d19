"""C backend, emit stage, the ops that move elements: Transpose, Slice, Gather, Expand, Pad,
Resize and Concat, most as one strided copy with unit axes dropped and contiguous ones merged.
A mixin of the Emitter (which provides ptr, body, funcs and the shapes)."""

from __future__ import annotations

import math

from saturate.backend.pointwise import c_float, c_floats, c_ints, strides
from saturate.backend.shapes import (gather_rows, gather_view, pad_params, resize_tables, runtime_indices,
                                     slice_params, unsupported)


class MovementEmission:
    """The Emitter's emission of data movement."""

    def emit_strided(self, node, src: str, base: int, oshape, istride, out) -> None:
        """y = x viewed through per-axis strides (0 broadcasts, negative reverses) from element `base`;
        unit axes dropped and contiguous axes merged so the C loop runs long rows."""
        if math.prod(oshape) == 0:
            return
        merged: list[list[int]] = []
        for n, st in zip(oshape, istride):
            if n == 1:
                continue
            if merged and merged[-1][1] == st * n:
                merged[-1] = [merged[-1][0] * n, st]
            else:
                merged.append([n, st])
        merged = merged or [[1, 0]]
        if len(merged) > 8:
            raise unsupported(node, "supports strided copies up to rank 8")
        shp = ", ".join(str(n) for n, _ in merged)
        st = ", ".join(str(t) for _, t in merged)
        self.body.append(f"    {{ static const int64_t s[] = {{{shp}}}, t[] = {{{st}}};\n"
                         f"      sat_strided({src} + {base}, {out}, {len(merged)}, s, t); }}\n")

    def emit_Transpose(self, step, chain, out, oshape):
        node = step.anchor
        x = self.shapes[node.inputs[0]]
        perm = node.attr("perm") or list(reversed(range(len(x))))
        ist = strides(x)
        self.emit_strided(node, self.ptr(node.inputs[0]), 0, oshape, [ist[p] for p in perm], out)

    def emit_Slice(self, step, chain, out, oshape):
        node = step.anchor
        x = self.shapes[node.inputs[0]]
        ist = strides(x)
        params = slice_params(self.g, node, x)
        base = sum(start * ist[d] for d, (start, _, count) in enumerate(params) if count)
        self.emit_strided(node, self.ptr(node.inputs[0]), base, oshape,
                          [step_ * ist[d] for d, (_, step_, _) in enumerate(params)], out)

    def emit_Gather(self, step, chain, out, oshape):
        node = step.anchor
        x = self.shapes[node.inputs[0]]
        if runtime_indices(self.g, node):
            axis, n, inner, _ = gather_rows(node, x, self.shapes[node.inputs[1]])
            self.body.append(f"    status |= sat_gather_rows({self.ptr(node.inputs[0])}, {self.ptr(node.inputs[1])}, "
                             f"{out}, {math.prod(x[:axis])}, {n}, {math.prod(self.shapes[node.inputs[1]])}, "
                             f"{inner});\n")
            return
        axis, first, stride, _ = gather_view(self.g, node, x)
        count = math.prod(oshape) // max(math.prod(x[:axis] + x[axis + 1:]), 1)
        ist = strides(x)
        view = x[:axis] + (count,) + x[axis + 1:]
        self.emit_strided(node, self.ptr(node.inputs[0]), first * ist[axis], view,
                          [t * (stride if d == axis else 1) for d, t in enumerate(ist)], out)

    def emit_Expand(self, step, chain, out, oshape):
        node = step.anchor
        x = self.shapes[node.inputs[0]]
        full = (1,) * (len(oshape) - len(x)) + tuple(x)
        ist = strides(full)
        self.emit_strided(node, self.ptr(node.inputs[0]), 0, oshape,
                          [0 if full[d] == 1 else ist[d] for d in range(len(oshape))], out)

    def emit_Pad(self, step, chain, out, oshape):
        node = step.anchor
        x = self.shapes[node.inputs[0]]
        begin, _, mode, value = pad_params(self.g, node, x)
        if math.prod(oshape) == 0:
            return
        if not x:
            raise unsupported(node, "cannot pad a scalar")
        self.body.append(
            f"    {{ static const int64_t is[] = {{{c_ints(x)}}}, os[] = {{{c_ints(oshape)}}}, b[] = {{{c_ints(begin)}}};\n"
            f"      sat_pad({self.ptr(node.inputs[0])}, {out}, {len(x)}, is, os, b, "
            f"{['constant', 'reflect', 'edge'].index(mode)}, {c_float(value)}); }}\n")

    def emit_Resize(self, step, chain, out, oshape):
        node = step.anchor
        x = self.shapes[node.inputs[0]]
        _, mode, ((h0, h1, hw), (w0, w1, ww)) = resize_tables(self.g, node, x)
        tab = f"rs_{len(self.funcs)}"
        self.funcs.append(
            f"static const int32_t {tab}_h0[] = {{{c_ints(h0)}}}, {tab}_h1[] = {{{c_ints(h1)}}}, "
            f"{tab}_w0[] = {{{c_ints(w0)}}}, {tab}_w1[] = {{{c_ints(w1)}}};\n"
            f"static const float {tab}_hw[] = {{{c_floats(hw)}}}, {tab}_ww[] = {{{c_floats(ww)}}};\n")
        if math.prod(oshape) == 0:
            return
        self.body.append(
            f"    sat_resize2d({self.ptr(node.inputs[0])}, {out}, {math.prod(x[:-2])}, {x[-2]}, {x[-1]}, "
            f"{oshape[-2]}, {oshape[-1]}, {tab}_h0, {tab}_h1, {tab}_hw, {tab}_w0, {tab}_w1, {tab}_ww, "
            f"{int(mode == 'nearest')});\n")

    def emit_rotary(self, step, chain, out, oshape):
        """plan.rotary's Slice, Neg, Concat, Mul, Mul and Add as one pass over x's rows; with a Transpose
        before them, the rows read in place from the Transpose's input (its strides per output axis)."""
        x, cos, sin = step.operands
        table = self.g.constants[cos].shape
        period = table[-2] if len(table) > 1 else 1
        epi = self.epilogue(step, chain, oshape, len(oshape) - 1)
        rows = "0, NULL, NULL"
        first = step.inner[0]
        if first.op == "Transpose":
            xs = self.shapes[x]
            perm = first.attr("perm") or list(reversed(range(len(xs))))
            ist = strides(xs)
            dims = [(n, ist[p]) for n, p in zip(oshape[:-1], perm[:-1]) if n != 1]
            if dims:
                rows = (f"{len(dims)}, (const int64_t[]){{{', '.join(str(n) for n, _ in dims)}}}, "
                        f"(const int64_t[]){{{', '.join(str(t) for _, t in dims)}}}")
        self.body.append(f"    sat_rotary({self.ptr(x)}, {self.ptr(cos)}, {self.ptr(sin)}, {out}, "
                         f"{math.prod(oshape[:-1])}, {period}, {oshape[-1]}, {rows}, {epi});\n")

    def emit_Concat(self, step, chain, out, oshape):
        node = step.anchor
        axis = node.attr("axis") % len(oshape)
        outer, inner = math.prod(oshape[:axis]), math.prod(oshape[axis + 1:])
        at = 0
        for v in node.inputs:
            d = self.shapes[v][axis]
            self.body.append(f"    sat_copy_blocks({self.ptr(v)}, {out} + {at * inner}, {outer}, {d * inner}, "
                             f"{oshape[axis] * inner});\n")
            at += d
