"""C backend, emit stage, the kernels with weights and the normalizations: Conv (direct, packed,
Winograd, depthwise), poolings, Gemm and MatMul (packed B, OpenBLAS, batched), the quantized
products, LayerNormalization, reductions and Softmax. A mixin of the Emitter (which provides
ptr, weight, epilogue, unit, the plan and the shapes)."""

from __future__ import annotations

import math

import numpy as np

from saturate.backend.plan import (DIRECT_WIDE, DOT_MINK, PR, SKINNY, C, accumulating_kernel, conv_layout,
                                   direct_width, plain_pointwise, pw_capable, runs_direct, runs_packed, runs_pw,
                                   runs_stream, runs_wino, runs_wino16, tile_rows, transposed_product)
from saturate.backend.pointwise import c_float, c_ints, strides
from saturate.backend.quant import emit_qlinear
from saturate.backend.shapes import conv_window, pool_window, reduce_axes, unsupported


# The AVX-512 micro-kernel's panels (gemm.h): SAT_MR rows of A, SAT_NR columns of B, SAT_KC deep.
PANEL, NR, KC = C["SAT_MR"], C["SAT_NR"], C["SAT_KC"]
# The channels of the AVX2 direct tile (dconv8.h).
D8N = C["SAT_D8N"]


def pack_weights(w: np.ndarray, group: int, panel: int = PANEL, kc: int = KC) -> np.ndarray:
    """Conv weights in gemm.h's packed order: per group and per block of KC columns, `panel`-row panels
    stored k-major (rows zero-padded to a multiple of `panel`): 8 for the kernel's A side, 32 for
    its B side (the transposed product of small outputs)."""
    m = w.shape[0] // group
    k = int(np.prod(w.shape[1:]))
    rows = -(-m // panel) * panel
    full = np.zeros((group, rows, k), np.float32)
    full[:, :m] = np.asarray(w, np.float32).reshape(group, m, k)
    blocks = [full[:, :, k0:k0 + kc].reshape(group, rows // panel, panel, -1).transpose(0, 1, 3, 2).reshape(group, -1)
              for k0 in range(0, k, kc)]
    return np.concatenate(blocks, axis=1)


# Most floats a batched MatMul's product packs (B's column panels, per thread): beyond, OpenBLAS's blocked
# sgemm, whose packing stays within its cache blocks.
BMM_PACK_MAX = 1 << 22
# Fewest multiply-adds of a batched MatMul's product on pgemm.h's tile: smaller ones (a 37 x 70 x 45 product)
# ran up to 1.6x OpenBLAS's time on an AVX-512 build, their 32-column panels mostly padding.
BMM_MIN_MACS = 1 << 18

# Winograd F(2x2, 3x3) weight transform G (4 x 3).
WINO_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])


def wino_slices(w: np.ndarray) -> np.ndarray:
    """U = G g G^T of 3x3 conv weights (M x C x 3 x 3) per (m, c), in float64 then rounded once: 4 x 4 x M x C,
    slice xi = 4 i + j at [i, j]."""
    return np.einsum("ik,mckl,jl->ijmc", WINO_G, np.asarray(w, np.float64), WINO_G).astype(np.float32)


def wino_weights(w: np.ndarray, pn: int) -> np.ndarray:
    """3x3 conv weights (M x C x 3 x 3) as sat_conv_wino (wino.h) reads them: per PN-channel panel (rows
    zero-padded to a multiple of PN, the build's panel_width) its 16 slices (wino_slices), each C x PN k-major
    (pack_weights' panel layout). A work unit reads a panel's 16 slices one after the other, so the weights
    stream in the order they are stored."""
    u = wino_slices(w)
    m, c = w.shape[:2]
    panels = -(-m // pn)
    slices = [pack_weights(u[i, j], 1, pn, kc=c).reshape(panels, c * pn) for i in range(4) for j in range(4)]
    return np.stack(slices, axis=1).reshape(1, -1)


def wino16_weights(w: np.ndarray, packed_gemm: bool) -> np.ndarray:
    """3x3 conv weights (M x C x 3 x 3) as sat_conv_wino16 (wino.h) reads them: the 16 slices (wino_slices) one
    after another, each M x C packed as the tile's A: gemm.h's 8-row panels in blocks of KC (AVX-512 builds),
    pgemm.h's PR-row panels over the whole reduction (AVX2)."""
    u = wino_slices(w)
    c = w.shape[1]
    return np.concatenate([pack_weights(u[i, j], 1, PANEL) if packed_gemm else pack_weights(u[i, j], 1, PR, kc=c)
                           for i in range(4) for j in range(4)], axis=1)


class NnEmission:
    """The Emitter's emission of products, windows and normalizations."""

    def emit_Conv(self, step, chain, out, oshape):
        node, sh = step.anchor, self.shapes
        x, w = sh[node.inputs[0]], sh[node.inputs[1]]
        win = conv_window(node, x, w)
        extra = []
        if len(node.inputs) > 2 and node.inputs[2]:
            extra.append(((node.inputs[2], None, (w[0],) + (1,) * (len(x) - 2)), "v + {}"))
        cfg = self.cfg
        acc = int(bool(step.accumulates))
        if acc:
            # the kernel adds its sums onto the residual, whose storage the output took (plan.in_place_residual):
            # the chain's leading Add is done
            assert chain[0][0] is step.chain[0] and accumulating_kernel(node, sh, self.g.constants, cfg)
            chain = chain[1:]
        # a conv reading or writing pixel panels runs on sat_conv_pw whatever else would take it (plan.panel_roots)
        xpan, ypan = self.plan.root(node.inputs[0]) in self.plan.panels, self.plan.root(step.out) in self.plan.panels
        # but for a strided 1x1 conv on the 6 x 64 direct tiles, which gathers its pixels from the panels
        gathers = (xpan and not ypan and direct_width(node, sh, cfg) == DIRECT_WIDE
                   and not pw_capable(node, sh, self.g.constants, cfg, True, not cfg.packed_gemm))
        direct = runs_direct(node, sh, self.g.constants, cfg) and (gathers or not (xpan or ypan))
        lanes = w[1] == 1
        packed_trans = (not direct and w[1] != 1 and runs_packed(node, sh, self.g.constants, cfg)
                        and conv_layout(x, w, win, int(node.attr("group", 1)), cfg) == 1)
        stream = runs_stream(node, sh, self.g.constants, cfg)
        wino = runs_wino(node, sh, self.g.constants, cfg)
        pw = (ypan or xpan and pw_capable(node, sh, self.g.constants, cfg, True, not cfg.packed_gemm)
              or runs_pw(node, sh, self.g.constants, cfg, bool(acc)))
        plain = plain_pointwise(x, win) if len(x) == 4 else False
        epi = self.epilogue(step, chain, oshape, 2, extra,
                            vector=direct or lanes or packed_trans or stream or wino or pw)
        H, W = (x[2], x[3]) if len(x) == 4 else (1, x[2])
        geo = f"{win.kh}, {win.kw}, {win.oh}, {win.ow}, {win.sh}, {win.sw}, {win.ph}, {win.pw}, {win.dh}, {win.dw}"
        xp = self.ptr(node.inputs[0])
        group = int(node.attr("group", 1))
        if direct and not cfg.packed_gemm:
            # AVX2's tiles (dconv8.h): weights in 16-channel panels over the whole K; a unit function per conv
            # inlines its 8-channel epilogue where it has one.
            k = w[1] * win.kh * win.kw
            arr = pack_weights(self.g.constants[node.inputs[1]], group, D8N, kc=k)
            packed = self.weight(("direct8", node.inputs[1], group), arr)
            unit = self._unit8("dconv8", "sat_dconv8_unit", epi) if epi in self.vector8 else "sat_dconv8_plain"
            scalar = epi if epi not in self.vector8 else "NULL"
            self.body.append(f"    sat_conv_direct({xp}, {packed}, {arr.size // group}, {out}, COL, {x[0]}, {x[1]}, "
                             f"{H}, {W}, {w[0]}, {geo}, {group}, {D8N}, 0, {scalar}, {unit});\n")
            return
        if direct:
            # Weights in 32- or 64-channel panels (direct_width) over the whole K; a unit function per conv
            # inlines its epilogue.
            k = w[1] * win.kh * win.kw
            width = direct_width(node, sh, cfg)
            arr = pack_weights(self.g.constants[node.inputs[1]], group, width, kc=k)
            packed = self.weight(("direct", node.inputs[1], group, width), arr)
            self.needs_packed = True
            unit = self.unit("dconv", "sat_dconv_unit", "defined(SAT_HAVE_PACKED_GEMM)",
                             list(self.vector.get(epi, (None, None))))
            scalar = epi if epi not in self.vector else "NULL"
            # (an output in its residual's storage needs the epilogue in the stores: see plan.in_place_residual)
            assert not step.shares or scalar == "NULL", node.name
            self.body.append(f"    sat_conv_direct({xp}, {packed}, {arr.size // group}, {out}, COL, {x[0]}, {x[1]}, "
                             f"{H}, {W}, {w[0]}, {geo}, {group}, {width}, {int(xpan)}, {scalar}, {unit});\n")
            return
        # (sat_conv_pw's row form reads a shared residual where it stores too)
        assert not step.shares or (pw and epi in self.vector_rows), node.name
        if stream:
            # Weights packed once here in vector-wide channel panels over the whole reduction (pgemm.h).
            arr = pack_weights(self.g.constants[node.inputs[1]], 1, self.pn // 2, kc=w[1] * win.kh * win.kw)
            packed = self.weight(("stream", node.inputs[1]), arr)
            unit = self._unit8("sconv", "sat_sconv_run", epi) if epi in self.vector8 else "NULL"
            self.body.append(f"    sat_conv_stream({xp}, {packed}, {out}, {x[0]}, {x[1]}, {H}, {W}, {w[0]}, {geo}, "
                             f"{epi}, {unit});\n")
            return
        if runs_wino16(node, sh, self.g.constants, cfg):
            # Weights transformed once here, each of the 16 slices packed as the products tile's A (wino.h); a
            # unit function per conv inlines the epilogue's row form, where it has one, into the stores.
            packed = self.weight(("wino16", node.inputs[1]), wino16_weights(self.g.constants[node.inputs[1]], cfg.packed_gemm))
            self.needs_packed = self.needs_packed or cfg.packed_gemm
            rows = epi == "NULL" or epi in self.vector_rows
            unit = (self.unit("wino16", "sat_wino16_run", "defined(SAT_HAVE_WINO16)",
                              [self.vector_rows[epi] if epi != "NULL" else None]) if rows else "NULL")
            self.body.append(f"    sat_conv_wino16({xp}, {packed}, {out}, {x[0]}, {x[1]}, {H}, {W}, {w[0]}, {win.oh}, "
                             f"{win.ow}, {win.ph}, {win.pw}, {'NULL' if rows else epi}, {unit});\n")
            return
        if wino:
            # Weights transformed and packed once here (16 slices of M x C); see wino.h.
            packed = self.weight(("wino", node.inputs[1]), wino_weights(self.g.constants[node.inputs[1]], self.pn))
            unit = self._unit8("wino", "sat_wino_run", epi) if epi in self.vector8 else "NULL"
            self.body.append(f"    sat_conv_wino({xp}, {packed}, {out}, {x[0]}, {x[1]}, {H}, {W}, {w[0]}, {win.oh}, "
                             f"{win.ow}, {win.ph}, {win.pw}, {epi}, {unit});\n")
            return
        if w[1] == 1:
            item = ""
            if lanes:
                # A work-item function per conv inlines the epilogue when its 8-channel form exists, and
                # one for AVX-512 builds' 16-lane kernel when dconv.h's vector forms do.
                item = ", NULL"
                if epi in self.vector8:
                    item = f", {self._unit8('dwt', 'sat_dwt_run', epi)}"
                wide = "NULL"
                if epi in self.vector:
                    wide = self.unit("dwz", "sat_dwz_run", "defined(__AVX512F__)", list(self.vector[epi]))
                item += f", {wide}"
            self.body.append(f"    sat_conv_dw_lanes({xp}, {self.ptr(node.inputs[1])}, {out}, {x[0]}, {x[1]}, {H}, {W}, "
                             f"{w[0]}, {geo}, {epi}{item});\n")
            return
        rows = epi == "NULL" or epi in self.vector_rows
        # panels are written, and read at unit stride, by sat_conv_pw alone (plan.panel_roots: its epilogue has a
        # row form there); a strided conv reading them without one gathers them on sat_conv2d's tiles (AVX-512)
        assert rows or not (ypan or xpan and (plain or not cfg.packed_gemm)), node.name
        if pw and rows:
            # Weights packed as sat_conv2d's (AVX-512) or pgemm.h's usual product's (AVX2); a unit function per
            # conv inlines the epilogue's row form.
            if cfg.packed_gemm:
                arr = pack_weights(self.g.constants[node.inputs[1]], 1, PANEL)
                packed = self.weight(("packed", node.inputs[1], 1, 0), arr)
                self.needs_packed = True
                guard = "defined(SAT_HAVE_PACKED_GEMM)"
            else:
                arr = pack_weights(self.g.constants[node.inputs[1]], 1, PR, kc=w[1])
                packed = self.weight(("pgemm", node.inputs[1], 1, False), arr)
                guard = "defined(SAT_HAVE_PW) && !defined(SAT_HAVE_PACKED_GEMM)"
            unit = self.unit("pwconv", "sat_pw_unit", guard, [self.vector_rows[epi] if epi != "NULL" else None])
            self.body.append(f"    sat_conv_pw({xp}, {packed}, {out}, {x[0]}, {x[1]}, {w[0]}, {H}, {W}, {win.oh}, "
                             f"{win.ow}, {win.sh}, {win.sw}, {acc}, {int(xpan)}, {int(ypan)}, {unit});\n")
            return
        if runs_packed(node, sh, self.g.constants, cfg):
            # Weights packed once here in the panels of the tile side they take (pgemm.h).
            layout = conv_layout(x, w, win, group, cfg)
            arr = pack_weights(self.g.constants[node.inputs[1]], group, self.pn if layout == 1 else PR,
                               kc=w[1] * win.kh * win.kw)
            packed = self.weight(("pgemm", node.inputs[1], group, layout == 1), arr)
            if layout == 2:
                self.body.append(f"    sat_conv_xdirect({xp}, {packed}, {arr.size // group}, {out}, {x[0]}, {x[1]}, "
                                 f"{H}, {W}, {w[0]}, {geo}, {group}, {epi});\n")
                return
            unit = "NULL"
            if layout == 1 and epi in self.vector8:
                # the transposed product's sums take the epilogue 8 channels at a time (pgemm.h)
                unit = self._unit8("pconv", "sat_pconv_run", epi)
            self.body.append(f"    sat_conv_packed({xp}, {packed}, {arr.size // group}, {out}, {x[0]}, {x[1]}, {H}, "
                             f"{W}, {w[0]}, {geo}, {group}, {layout}, {acc}, {epi}, {unit});\n")
            return
        # Constant weights are stored once, packed for the micro-kernel; others go to OpenBLAS as they are.
        wp, packed, per_group, trans = "NULL", "NULL", 0, 0
        if cfg.packed_gemm and node.inputs[1] in self.g.constants:
            trans = int(transposed_product(x, w, win, group))
            arr = pack_weights(self.g.constants[node.inputs[1]], group, NR if trans else PANEL)
            packed, per_group = self.weight(("packed", node.inputs[1], group, trans), arr), arr.size // group
            self.needs_packed = True
        else:
            wp = self.ptr(node.inputs[1])
        assert not xpan or wp == "NULL", node.name
        self.body.append(f"    sat_conv2d({xp}, {wp}, {packed}, {per_group}, {out}, COL, {x[0]}, {x[1]}, {H}, {W}, "
                         f"{w[0]}, {geo}, {group}, {trans}, {acc}, {int(xpan)}, {epi});\n")

    def emit_pool(self, step, chain, out, oshape, mode):
        node, x = step.anchor, self.shapes[step.anchor.inputs[0]]
        win = pool_window(node, x)
        epi = self.epilogue(step, chain, oshape, 2)
        H, W = (x[2], x[3]) if len(x) == 4 else (1, x[2])
        self.body.append(
            f"    sat_pool2d({self.ptr(node.inputs[0])}, {out}, {x[0] * x[1]}, {H}, {W}, {win.oh}, {win.ow}, "
            f"{win.kh}, {win.kw}, {win.sh}, {win.sw}, {win.ph}, {win.pw}, {win.pe_h}, {win.pe_w}, {win.dh}, "
            f"{win.dw}, {mode}, {epi});\n")

    def emit_MaxPool(self, step, chain, out, oshape):
        if len(step.anchor.outputs) > 1 and step.anchor.outputs[1]:
            raise unsupported(step.anchor, "does not compute MaxPool indices")
        self.emit_pool(step, chain, out, oshape, 0)

    def emit_AveragePool(self, step, chain, out, oshape):
        self.emit_pool(step, chain, out, oshape, 2 if step.anchor.attr("count_include_pad", 0) else 1)

    def emit_GlobalAveragePool(self, step, chain, out, oshape):
        x = self.shapes[step.anchor.inputs[0]]
        epi = self.epilogue(step, chain, oshape, 1)
        self.body.append(f"    sat_global_avgpool({self.ptr(step.anchor.inputs[0])}, {out}, {x[0]}, {x[1]}, "
                         f"{math.prod(x[2:])}, {epi});\n")

    def emit_Gemm(self, step, chain, out, oshape):
        node, sh = step.anchor, self.shapes
        a, b = sh[node.inputs[0]], sh[node.inputs[1]]
        ta, tb = int(node.attr("transA", 0)), int(node.attr("transB", 0))
        k = a[0] if ta else a[1]
        extra = []
        beta = float(node.attr("beta", 1.0))
        if len(node.inputs) > 2 and node.inputs[2] and beta != 0.0:
            extra.append(((node.inputs[2], None, sh[node.inputs[2]]), "v + " + c_float(beta) + " * {}"))
        epi = self.epilogue(step, chain, oshape, 1, extra)
        if self.packs_b(node.inputs[1], oshape[0], ta, tb, k):
            w = np.asarray(self.g.constants[node.inputs[1]], np.float32)
            bp = self.weight(("pgemm_b", node.inputs[1], tb), pack_weights(w if tb else w.T, 1, self.pn, kc=k))
            self.body.append(
                f"    sat_gemm_packed({ta}, {oshape[0]}, {oshape[1]}, {k}, {c_float(node.attr('alpha', 1.0))}, "
                f"{self.ptr(node.inputs[0])}, {a[1]}, {bp}, {out}, 0, {epi});\n")
            return
        self.body.append(
            f"    sat_gemm({ta}, {tb}, {oshape[0]}, {oshape[1]}, {k}, {c_float(node.attr('alpha', 1.0))}, "
            f"{self.ptr(node.inputs[0])}, {a[1]}, {self.ptr(node.inputs[1])}, {b[1]}, {out}, 0, {epi});\n")

    def packs_b(self, b: str, rows: int, ta: int, tb: int, k: int) -> bool:
        """Whether a product runs on pgemm.h's tile with its constant B packed here: every product sat_gemm
        would hand to OpenBLAS's sgemm, which repacks B on every call (DeiT-tiny's MLP products ran 1.8x
        faster packed, AVX-512 builds too; so did a 16-row encoder's), and the products of 2 to 16
        rows against a transposed B that sat_dot took. sat_gemm's own kernels keep theirs: one row against
        a transposed B (sat_dot, one pass over B) and up to SKINNY rows against B as stored.
        sat_dot against the packed product, B cold (out of cache), thread CPU time, minima of 300 calls on a
        Zen 4 with AVX-512: 16 x 768 x 768 371 -> 265 us on the AVX2 build, 461 -> 264 on the AVX-512 one;
        2 rows 201 -> 107 us; one row of 2048 by 1000 376 us on sat_dot, 448 packed."""
        w = self.g.constants.get(b)
        if not (self.cfg.pgemm and w is not None and w.ndim == 2 and w.dtype == np.float32):
            return False
        dots = not ta and tb and rows == 1 and k >= DOT_MINK
        skinny = not ta and not tb and rows <= SKINNY
        return not (dots or skinny)

    def packs_batched(self, m: int, n: int, k: int) -> bool:
        """Whether each product of a batched MatMul runs on pgemm.h's tile (sat_matmul_batched: B packed per
        product, A read in place) rather than on OpenBLAS's sgemm: products of more rows than SKINNY (fewer
        keep sat_gemm's few-row kernel) and at least BMM_MIN_MACS multiply-adds whose packed B stays within
        BMM_PACK_MAX floats. Attention's products of 6 heads at 1 thread, thread CPU time, minima of 25
        interleaved batches on a Zen 4: probabilities x V 0.82-0.85x OpenBLAS's time at 512 tokens and
        0.88-0.94x at 128, Q x K^T 0.90-0.97x, on both builds."""
        panels = -(-n // self.pn) * self.pn
        return self.cfg.pgemm and m > SKINNY and m * n * k >= BMM_MIN_MACS and k * panels <= BMM_PACK_MAX

    def emit_MatMul(self, step, chain, out, oshape):
        node, sh = step.anchor, self.shapes
        a, b = sh[node.inputs[0]], sh[node.inputs[1]]
        a2 = (1,) + a if len(a) == 1 else a
        b2 = b + (1,) if len(b) == 1 else b
        m, k, n = a2[-2], a2[-1], b2[-1]
        epi = self.epilogue(step, chain, oshape, len(oshape) if len(b) == 1 else len(oshape) - 1)
        ap, bp = self.ptr(node.inputs[0]), self.ptr(node.inputs[1])
        if len(b2) == 2:  # one weight matrix: fold the batch of A into its rows
            rows = math.prod(a2[:-1])
            if len(b) == 2 and self.packs_b(node.inputs[1], rows, 0, 0, k):
                w = np.asarray(self.g.constants[node.inputs[1]], np.float32)
                bp = self.weight(("pgemm_b", node.inputs[1], 0), pack_weights(w.T, 1, self.pn, kc=k))
                self.body.append(f"    sat_gemm_packed(0, {rows}, {n}, {k}, 1.0f, {ap}, {k}, {bp}, {out}, 0, {epi});\n")
                return
            self.body.append(f"    sat_gemm(0, 0, {rows}, {n}, {k}, 1.0f, {ap}, {k}, {bp}, {n}, {out}, 0, {epi});\n")
            return
        self.batched_product(a2, strides(a2), ap, b2, strides(b2), bp, out, epi, step.softmax is not None)

    def emit_bmm_views(self, step, chain, out, oshape):
        """plan.transposed_operands: a batched MatMul reading its transposed operands in place, each through
        its Transpose's permuted strides (rows of A contiguous; B's rows or, transposed, its columns)."""
        node, sh = step.anchor, self.shapes
        a, b = sh[node.inputs[0]], sh[node.inputs[1]]
        a2 = (1,) + a if len(a) == 1 else a
        epi = self.epilogue(step, chain, oshape, len(oshape) - 1)
        views = {t.outputs[0]: t for t in step.inner}

        def view(value, read, shape):
            t = views.get(value)
            if t is None:
                return strides(shape)
            xs = sh[read]
            st = strides(xs)
            return [st[p] for p in (t.attr("perm") or list(reversed(range(len(xs)))))]

        a_read, b_read = step.operands
        self.batched_product(a2, view(node.inputs[0], a_read, a2), self.ptr(a_read), b,
                             view(node.inputs[1], b_read, b), self.ptr(b_read), out, epi, step.softmax is not None)

    def batched_product(self, a2, ast, ap, b2, bst, bp, out, epi, softmax=False):
        """sat_matmul_batched of A (a2: ..., m, k) and B (b2: ..., k, n) read at `ap` and `bp` through the
        strides `ast` and `bst` (floats per step of each axis): A's k and one of B's last two axes contiguous;
        with `softmax`, each output row's softmax after the epilogue (plan._row_softmax)."""
        m, k, n = a2[-2], a2[-1], b2[-1]
        tb = int(bst[-1] != 1 and n > 1)
        # (the pitch of an axis of one row or column is never stepped; sgemm wants it at least the row's length)
        lda = ast[-2] if m > 1 else k
        ldb = bst[-1] if tb else (bst[-2] if k > 1 else n)
        batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
        offs = []
        for idx in np.ndindex(*batch):
            ao = sum(i * s for i, s, d in zip(idx[len(idx) - len(a2) + 2:], ast[:-2], a2[:-2]) if d > 1)
            bo = sum(i * s for i, s, d in zip(idx[len(idx) - len(b2) + 2:], bst[:-2], b2[:-2]) if d > 1)
            offs.append((ao, bo))
        tab = f"mm_{len(self.funcs)}"
        self.funcs.append(f"static const int64_t {tab}[][2] = {{{', '.join(f'{{{p}, {q}}}' for p, q in offs)}}};\n")
        packed = int(self.packs_batched(m, n, k))
        self.body.append(f"    sat_matmul_batched({ap}, {bp}, {out}, {len(offs)}, {tab}, {m}, {n}, {k}, {lda}, {ldb}, "
                         f"{tb}, {packed}, {epi}, {int(softmax)});\n")

    def emit_QLinearConv(self, step, chain, out, oshape):
        emit_qlinear(self, step, chain, out, oshape)

    def emit_QLinearMatMul(self, step, chain, out, oshape):
        emit_qlinear(self, step, chain, out, oshape)

    def emit_LayerNormalization(self, step, chain, out, oshape):
        node = step.anchor
        axis = int(node.attr("axis", -1)) % len(oshape)
        norm = oshape[axis:]

        def param(k):
            v = node.inputs[k] if len(node.inputs) > k else ""
            if not v:
                return "NULL"
            if v in self.g.constants:
                arr = np.broadcast_to(np.asarray(self.g.constants[v], np.float32), norm)
                return self.weight(("layernorm", v, norm), arr)
            return self.ptr(v)

        epi = self.epilogue(step, chain, oshape, axis)
        self.body.append(f"    sat_layernorm({self.ptr(node.inputs[0])}, {param(1)}, {param(2)}, {out}, "
                         f"{math.prod(oshape[:axis])}, {math.prod(norm)}, {c_float(node.attr('epsilon', 1e-5))}, "
                         f"{epi});\n")

    def emit_rms_norm(self, step, chain, out, oshape):
        """plan.rms_norm's Pow, ReduceMean, Add, Sqrt and Div as one pass over x's rows."""
        x, eps = step.operands
        epi = self.epilogue(step, chain, oshape, len(oshape) - 1)
        self.body.append(f"    sat_rmsnorm({self.ptr(x)}, {out}, {math.prod(oshape[:-1])}, {oshape[-1]}, "
                         f"{c_float(eps)}, {epi});\n")

    def emit_reduce(self, step, chain, out, oshape, mode):
        node = step.anchor
        x = self.shapes[node.inputs[0]]
        axes, _ = reduce_axes(self.g, node, x)
        if not axes:  # noop_with_empty_axes
            self.emit_strided(node, self.ptr(node.inputs[0]), 0, x, strides(x), out)
            return
        kept = strides(tuple(1 if d in axes else n for d, n in enumerate(x)))
        ystr = [0 if d in axes else kept[d] for d in range(len(x))]
        count = math.prod(x[d] for d in axes)
        self.body.append(
            f"    {{ static const int64_t s[] = {{{c_ints(x)}}}, t[] = {{{c_ints(ystr)}}};\n"
            f"      sat_reduce({self.ptr(node.inputs[0])}, {out}, {len(x)}, s, t, {math.prod(oshape)}, {mode}, "
            f"{c_float(1.0 / max(count, 1))}); }}\n")

    def emit_ReduceSum(self, step, chain, out, oshape):
        self.emit_reduce(step, chain, out, oshape, 0)

    def emit_ReduceMean(self, step, chain, out, oshape):
        self.emit_reduce(step, chain, out, oshape, 1)

    def emit_ReduceMax(self, step, chain, out, oshape):
        self.emit_reduce(step, chain, out, oshape, 2)

    def emit_ReduceMin(self, step, chain, out, oshape):
        self.emit_reduce(step, chain, out, oshape, 3)

    def emit_ReduceSumSquare(self, step, chain, out, oshape):
        self.emit_reduce(step, chain, out, oshape, 4)

    def emit_ReduceL2(self, step, chain, out, oshape):
        self.emit_reduce(step, chain, out, oshape, 5)

    def emit_Softmax(self, step, chain, out, oshape):
        node = step.anchor
        default = -1 if self.g.opset >= 13 else 1
        axis = node.attr("axis", default) % len(oshape)
        outer = math.prod(oshape[:axis])
        if self.g.opset >= 13:
            length, inner = oshape[axis], math.prod(oshape[axis + 1:])
        else:
            length, inner = math.prod(oshape[axis:]), 1
        self.body.append(f"    sat_softmax({self.ptr(node.inputs[0])}, {out}, {outer}, {length}, {inner});\n")
