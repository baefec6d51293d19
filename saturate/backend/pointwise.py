"""C backend, pointwise stage: generate fused epilogue and elementwise loops from a chain of nodes."""

from __future__ import annotations

from saturate.backend.quant import q_expr, q_vec_expr
from saturate.backend.shapes import unsupported
from saturate.core.ir import Node
from saturate.ops.ctext import c_float
from saturate.ops.registry import attach, lookup

__all__ = ["Operand", "c_float", "run_axis", "step_expr", "strides", "vec_expr"]


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


    def image_base(self) -> str | None:
        """Index of this operand's value for plane q (image q / C, channel q % C) of an N x C x ... output, less
        the channel's own term: None unless the operand is constant over the pixel axes."""
        if self.kind != "scalar" or len(self.oshape) < 2 or any(self.bstr[2:]):
            return None
        n, c = self.oshape[0], self.oshape[1]
        return f"((q / {c}) % {n}) * {self.bstr[0]}" if self.bstr[0] and n > 1 else "0"

    def chan_load(self, k: int) -> str | None:
        """AVX-512 load of this operand for 16 consecutive channels at one pixel of an N x C x ... output
        (planes q .. q+15 of one image, lanes `mc`), None unless it is constant over the pixel axes."""
        if self.kind == "literal":
            return f"_mm512_set1_ps({c_float(self.literal)})"
        base = self.image_base()
        if base is None:
            return None
        c = self.oshape[1]
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
        base = self.image_base()
        if base is None:
            return None
        c = self.oshape[1]
        if self.bstr[1] == 0 or c == 1:
            return f"_mm256_set1_ps(p{k}[{base}])"
        if self.bstr[1] == 1:
            return f"_mm256_maskload_ps(p{k} + {base} + q % {c}, mc)"
        return None

    def row_load(self, k: int, avx2: bool = False) -> str | None:
        """AVX load (widened to AVX-512 by its user) of this operand for 16 consecutive outputs of one channel
        of an N x C x ... output (plane q, flat index off, lanes mk), or with `avx2` for 8 of them (mk an
        __m256i mask): per-channel operands by q, a constant divisor; others as vload."""
        base = self.image_base()
        if base is None:
            return self.vload(k, avx2)
        c = self.oshape[1]
        channel = f" + (q % {c}) * {self.bstr[1]}" if self.bstr[1] and c > 1 else ""
        return f"_mm256_set1_ps(p{k}[{base}{channel}])"

    def vload(self, k: int, avx2: bool = False) -> str | None:
        """AVX-512VL load of 8 consecutive outputs' operands (lanes `mk`; with `avx2` an AVX2 masked load, mk an
        __m256i mask), None for gathers."""
        if self.kind == "literal":
            return f"_mm256_set1_ps({c_float(self.literal)})"
        if self.kind == "scalar":
            return f"_mm256_set1_ps(p{k}[b{k}])"
        if self.kind == "contig":
            return f"_mm256_maskload_ps(p{k} + b{k}, mk)" if avx2 else f"_mm256_maskz_loadu_ps(mk, p{k} + b{k})"
        return None


class PointwiseArgs:
    """C text of a pointwise op's inputs for its registry hooks: `v` for the chain value, any
    other input of a binary op loaded by `operand` when first read (a load adds an operand to
    the loop); a unary op reads the chain value alone (its other inputs are parameters)."""

    def __init__(self, node: Node, chain_input: str, operand):
        d = lookup(node.op, node.domain)
        self.inputs = list(node.inputs) if d is not None and d.c == "binary" else [chain_input]
        self.chain_input, self.operand, self.loaded = chain_input, operand, {}

    def chain(self, k: int) -> bool:
        """Whether input k is the chain value."""
        return self.inputs[k] == self.chain_input

    def __getitem__(self, k: int) -> str | None:
        if self.chain(k):
            return "v"
        if k not in self.loaded:
            self.loaded[k] = self.operand(self.inputs[k])
        return self.loaded[k]

    def __len__(self) -> int:
        return len(self.inputs)

    def __iter__(self):
        return (self[k] for k in range(len(self.inputs)))


def step_expr(node: Node, chain_input: str, operand, graph) -> str:
    """C expression for one node applied to the chain value `v` (its registry entry's `c_expr`);
    `operand(value)` loads the other side."""
    d = lookup(node.op, node.domain)
    if d is None or d.c_expr is None:
        raise unsupported(node, f"cannot apply op '{node.op}' pointwise")
    return d.c_expr(node, PointwiseArgs(node, chain_input, operand), operand, graph)


def vec_expr(node: Node, chain_input: str, operand, graph) -> str | None:
    """AVX vector form of step_expr on `v` (8 lanes; the entry's `c_vec`), or None when the op has
    no vector form here. The 16-lane forms of AVX-512 kernels rename every _mm256_ call to its
    512-bit version."""
    d = lookup(node.op, node.domain)
    if d is None or d.c_vec is None:
        return None
    return d.c_vec(node, PointwiseArgs(node, chain_input, operand), operand, graph)


# The C of quantizing and dequantizing lives with the backend's quant kernels: hooks of the
# registry's entries that need the backend's own code are attached here.
for _op in ("QuantizeLinear", "DequantizeLinear"):
    attach(_op, c_expr=lambda node, a, operand, graph: q_expr(node, operand, graph),
           c_vec=lambda node, a, operand, graph: q_vec_expr(node, operand, graph))


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


def c_ints(values) -> str:
    """A C array initializer of ints (one 0 for an empty list: C has no empty initializer)."""
    return ", ".join(str(int(v)) for v in values) or "0"


def c_floats(values) -> str:
    """A C array initializer of floats (one 0 for an empty list)."""
    return ", ".join(c_float(v) for v in values) or "0"
