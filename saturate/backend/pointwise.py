"""C backend, pointwise stage: generate fused epilogue and elementwise loops from a chain of nodes."""

from __future__ import annotations

import math

import numpy as np

from saturate.backend.shapes import unsupported
from saturate.core.ir import Node


def c_float(x: float) -> str:
    """A C float literal for x (inf and nan spelled with math.h macros)."""
    x = float(np.float32(x))
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    return f"{x!r}f"


def strides(shape: tuple[int, ...]) -> list[int]:
    """Row-major element strides."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


class Operand:
    """How a pointwise step reads one operand at output element off+i, given the run layout."""

    def __init__(self, ptr: str | None, shape: tuple[int, ...], oshape: tuple[int, ...], run_from: int,
                 literal: float | None = None):
        self.ptr, self.literal = ptr, literal
        full = (1,) * (len(oshape) - len(shape)) + tuple(shape)
        own = strides(full)
        # Broadcast strides over the output: a dimension of size 1 repeats (stride 0).
        self.bstr = [0 if full[d] == 1 and oshape[d] != 1 else own[d] for d in range(len(oshape))]
        self.ostr = strides(oshape)
        self.oshape = oshape
        tail = range(run_from, len(oshape))
        if literal is not None:
            self.kind = "literal"
        elif all(self.bstr[d] == 0 or oshape[d] == 1 for d in tail):
            self.kind = "scalar"
        elif all(self.bstr[d] == self.ostr[d] for d in tail):
            self.kind = "contig"
        else:
            self.kind = "gather"

    def index(self, at: str, dims: range) -> str:
        # Trailing dimensions the operand shares with the output whole are one term: `at` itself when that
        # is all of them (a residual Add's operand), not a division and a remainder per dimension.
        same = len(self.oshape)
        while same > dims.start and (self.bstr[same - 1] == self.ostr[same - 1] or self.oshape[same - 1] == 1):
            same -= 1
        terms = [f"(({at} / {self.ostr[d]}) % {self.oshape[d]}) * {self.bstr[d]}"
                 for d in dims if d < same and self.bstr[d] and self.oshape[d] > 1]
        if same < len(self.oshape) and any(self.oshape[d] > 1 for d in range(same, len(self.oshape))):
            terms.append(at if same == 0 else f"({at} % {self.ostr[same - 1]})")
        return " + ".join(terms) or "0"

    def setup(self, k: int) -> str:
        """Declarations before the loop (the base index of the run)."""
        if self.kind in ("literal", "gather"):
            return f"    const float *restrict p{k} = {self.ptr or 'NULL'};\n" if self.ptr else ""
        base = self.index("off", range(len(self.oshape)))
        return f"    const float *restrict p{k} = {self.ptr};\n    const int64_t b{k} = {base};\n"

    def load(self, k: int) -> str:
        if self.kind == "literal":
            return c_float(self.literal)
        if self.kind == "scalar":
            return f"p{k}[b{k}]"
        if self.kind == "contig":
            return f"p{k}[b{k} + i]"
        return f"p{k}[{self.index('(off + i)', range(len(self.oshape)))}]"


    def chan_load(self, k: int) -> str | None:
        """AVX-512 load of this operand for 16 consecutive channels at one pixel of an N x C x ... output
        (planes q .. q+15 of one image, lanes `mc`), None unless it is constant over the pixel axes."""
        if self.kind == "literal":
            return f"_mm512_set1_ps({c_float(self.literal)})"
        if self.kind != "scalar" or len(self.oshape) < 2 or any(self.bstr[2:]):
            return None
        n, c = self.oshape[0], self.oshape[1]
        base = f"((q / {c}) % {n}) * {self.bstr[0]}" if self.bstr[0] and n > 1 else "0"
        if self.bstr[1] == 0 or c == 1:
            return f"_mm512_set1_ps(p{k}[{base}])"
        if self.bstr[1] == 1:
            return f"_mm512_maskz_loadu_ps(mc, p{k} + {base} + q % {c})"
        return None

    def chan_load8(self, k: int) -> str | None:
        """AVX2 load of this operand for 8 consecutive channels at one pixel (planes q .. q+7, lanes `mc`, an
        __m256i mask), None unless it is constant over the pixel axes."""
        if self.kind == "literal":
            return f"_mm256_set1_ps({c_float(self.literal)})"
        if self.kind != "scalar" or len(self.oshape) < 2 or any(self.bstr[2:]):
            return None
        n, c = self.oshape[0], self.oshape[1]
        base = f"((q / {c}) % {n}) * {self.bstr[0]}" if self.bstr[0] and n > 1 else "0"
        if self.bstr[1] == 0 or c == 1:
            return f"_mm256_set1_ps(p{k}[{base}])"
        if self.bstr[1] == 1:
            return f"_mm256_maskload_ps(p{k} + {base} + q % {c}, mc)"
        return None

    def vload(self, k: int) -> str | None:
        """AVX-512VL load of 8 consecutive outputs' operands (lanes `mk`), None for gathers."""
        if self.kind == "literal":
            return f"_mm256_set1_ps({c_float(self.literal)})"
        if self.kind == "scalar":
            return f"_mm256_set1_ps(p{k}[b{k}])"
        if self.kind == "contig":
            return f"_mm256_maskz_loadu_ps(mk, p{k} + b{k})"
        return None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _const_scalar(graph, node: Node, value: str, default: float) -> float:
    if not value:
        return default
    if value not in graph.constants:
        raise unsupported(node, f"needs '{value}' to be a constant")
    return float(np.asarray(graph.constants[value]).reshape(-1)[0])


def clip_bounds(node: Node, graph) -> tuple[float, float]:
    """Clip's (min, max): constant inputs from opset 11 on, attributes before; absent = unbounded."""
    if len(node.inputs) > 1 or "min" not in node.attrs:
        lo = _const_scalar(graph, node, node.inputs[1] if len(node.inputs) > 1 else "", -math.inf)
        hi = _const_scalar(graph, node, node.inputs[2] if len(node.inputs) > 2 else "", math.inf)
        return lo, hi
    return node.attr("min", -math.inf), node.attr("max", math.inf)


def step_expr(node: Node, chain_input: str, operand, graph) -> str:
    """C expression for one node applied to the chain value `v`; `operand(value)` loads the other side."""
    op = node.op
    if op in ("Add", "Sub", "Mul", "Div"):
        sym = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/"}[op]
        a, b = node.inputs
        if a == chain_input and b == chain_input:
            return f"v {sym} v"
        if a == chain_input:
            return f"v {sym} {operand(b)}"
        return f"{operand(a)} {sym} v"
    if op in ("Pow", "Max", "Min"):
        a, b = node.inputs
        if op == "Pow" and a == chain_input and b != chain_input:
            # Constant exponents of real models (LayerNorm's square, RMS roots) need no powf call.
            special = {"2.0f": "v * v", "1.0f": "v", "0.5f": "sqrtf(v)", "3.0f": "v * v * v", "-1.0f": "1.0f / v"}
            exp = operand(b)
            return special.get(exp, f"powf(v, {exp})")
        fn = {"Pow": "powf", "Max": "fmaxf", "Min": "fminf"}[op]
        lhs = "v" if a == chain_input else operand(a)
        rhs = "v" if b == chain_input else operand(b)
        return f"{fn}({lhs}, {rhs})"
    if op == "HardSwish":
        return "v * sat_clampf(v * (1.0f / 6.0f) + 0.5f, 0.0f, 1.0f)"
    if op == "HardSigmoid":
        alpha, beta = c_float(node.attr("alpha", 0.2)), c_float(node.attr("beta", 0.5))
        return f"sat_clampf(v * {alpha} + {beta}, 0.0f, 1.0f)"
    if op == "Swish":
        return f"v * sat_rcpf(1.0f + sat_expf(-{c_float(node.attr('alpha', 1.0))} * v))"
    if op == "Gelu":
        if _text(node.attr("approximate", "none")) == "tanh":
            return "0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))"
        return "0.5f * v * (1.0f + sat_erff(v * 0.7071067811865476f))"
    if op == "Exp":
        return "expf(v)"  # libm's: the full range (overflow to inf) matters when Exp stands alone
    if op == "Log":
        return "logf(v)"
    if op == "Abs":
        return "fabsf(v)"
    if op == "Floor":
        return "floorf(v)"
    if op == "Ceil":
        return "ceilf(v)"
    if op == "Elu":
        return f"v >= 0.0f ? v : {c_float(node.attr('alpha', 1.0))} * (sat_expf(v) - 1.0f)"
    if op == "Selu":
        alpha, gamma = c_float(node.attr("alpha", 1.67326319217681884765625)), c_float(node.attr("gamma", 1.05070102214813232421875))
        return f"{gamma} * (v > 0.0f ? v : {alpha} * (sat_expf(v) - 1.0f))"
    if op == "Softplus":
        # log1p(exp(v)) overflows for large v, where softplus is v itself.
        return "v > 20.0f ? v : log1pf(expf(v))"
    if op == "Relu":
        return "v > 0.0f ? v : 0.0f"
    if op == "Clip":
        lo, hi = clip_bounds(node, graph)
        return f"sat_clampf(v, {c_float(lo)}, {c_float(hi)})"
    if op == "LeakyRelu":
        return f"v >= 0.0f ? v : {c_float(node.attr('alpha', 0.01))} * v"
    if op == "Sigmoid":
        return "sat_rcpf(1.0f + sat_expf(-v))"
    if op == "Tanh":
        return "tanhf(v)"
    if op == "Erf":
        return "sat_erff(v)"
    if op == "Neg":
        return "-v"
    if op == "Sqrt":
        return "sqrtf(v)"
    if op == "Reciprocal":
        return "1.0f / v"
    if op == "BatchNormalization":
        return f"v * {operand(('bn_scale', node))} + {operand(('bn_shift', node))}"
    if op in ("QuantizeLinear", "DequantizeLinear"):
        from saturate.backend.quant import q_expr

        return q_expr(node, operand, graph)
    if op == "Identity":
        return "v"
    raise unsupported(node, f"cannot apply op '{op}' pointwise")


def vec_expr(node: Node, chain_input: str, operand, graph) -> str | None:
    """AVX vector form of step_expr on `v` (8 lanes), or None when the op has no vector form here. A Swish
    calls vec.h's sat_exp8 and sat_rcp8 (AVX2 and AVX-512 builds; the 16-lane forms of AVX-512 kernels
    rename them, with every _mm256_ call, to their 512-bit versions)."""
    op = node.op
    if op in ("QuantizeLinear", "DequantizeLinear"):
        from saturate.backend.quant import q_vec_expr

        return q_vec_expr(node, operand, graph)
    if op == "Swish":
        a = c_float(node.attr("alpha", 1.0))
        return (f"_mm256_mul_ps(v, sat_rcp8(_mm256_add_ps(_mm256_set1_ps(1.0f), "
                f"sat_exp8(_mm256_mul_ps(_mm256_set1_ps(-{a}), v)))))")
    if op in ("Add", "Sub", "Mul", "Div"):
        fn = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}[op]
        a, b = node.inputs
        if a == chain_input and b == chain_input:
            return f"_mm256_{fn}_ps(v, v)"
        if a == chain_input:
            rhs = operand(b)
            return None if rhs is None else f"_mm256_{fn}_ps(v, {rhs})"
        lhs = operand(a)
        return None if lhs is None else f"_mm256_{fn}_ps({lhs}, v)"
    if op in ("Max", "Min") and node.inputs[0] != node.inputs[1]:
        other = operand(node.inputs[1] if node.inputs[0] == chain_input else node.inputs[0])
        return None if other is None else f"_mm256_{op.lower()}_ps(v, {other})"
    if op == "Pow" and node.inputs[0] == chain_input and node.inputs[1] != chain_input:
        return "_mm256_mul_ps(v, v)" if operand(node.inputs[1]) == "_mm256_set1_ps(2.0f)" else None
    if op in ("HardSwish", "HardSigmoid"):
        alpha, beta = (1.0 / 6.0, 0.5) if op == "HardSwish" else (node.attr("alpha", 0.2), node.attr("beta", 0.5))
        hs = (f"_mm256_min_ps(_mm256_max_ps(_mm256_add_ps(_mm256_mul_ps(v, _mm256_set1_ps({c_float(alpha)})), "
              f"_mm256_set1_ps({c_float(beta)})), _mm256_setzero_ps()), _mm256_set1_ps(1.0f))")
        return f"_mm256_mul_ps(v, {hs})" if op == "HardSwish" else hs
    if op == "Abs":
        return "_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v)"
    if op == "Neg":
        return "_mm256_xor_ps(_mm256_set1_ps(-0.0f), v)"
    if op == "Relu":
        return "_mm256_max_ps(v, _mm256_setzero_ps())"  # NaN -> 0, as the scalar form
    if op == "Clip":
        lo, hi = clip_bounds(node, graph)
        return f"_mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps({c_float(lo)})), _mm256_set1_ps({c_float(hi)}))"
    if op == "BatchNormalization":
        a, b = operand(("bn_scale", node)), operand(("bn_shift", node))
        return None if a is None or b is None else f"_mm256_add_ps(_mm256_mul_ps(v, {a}), {b})"
    if op == "Identity":
        return "v"
    return None


def run_axis(oshape: tuple[int, ...], shapes: list[tuple[int, ...]]) -> int:
    """Smallest axis r such that every operand is either whole or fully broadcast over dims [r:]."""
    for r in range(len(oshape) + 1):
        ok = True
        for s in shapes:
            full = (1,) * (len(oshape) - len(s)) + tuple(s)
            tail = [(full[d], oshape[d]) for d in range(r, len(oshape)) if oshape[d] != 1]
            if not (all(a == 1 for a, _ in tail) or all(a == o for a, o in tail)):
                ok = False
                break
        if ok:
            return r
    return len(oshape)
