"""C backend, emit stage: one C source for the whole graph plus a binary weights blob."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from saturate.backend.build import BuildConfig
from saturate.backend.emit_movement import MovementEmission
from saturate.backend.emit_nn import NnEmission
from saturate.backend.plan import Plan, Step, panel_width, plan
from saturate.backend.quant import axis_operand
from saturate.backend.pointwise import Operand, c_ints, run_axis, step_expr, vec_expr
from saturate.backend.shapes import ELEMENTWISE_BINARY, ELEMENTWISE_UNARY, infer_shapes, unsupported
from saturate.backend.weights import WeightsBlob
from saturate.core.errors import SaturateError
from saturate.core.ir import Graph
from saturate.core.limits import check_allocation, check_bytes


@dataclass
class Emitted:
    """The generated program: C source, weights (weights.bin's bytes), and the facts the runtime needs."""

    source: str
    weights: WeightsBlob
    inputs: list[tuple[str, tuple[int, ...]]]
    outputs: list[tuple[str, tuple[int, ...]]]
    plan: Plan
    shapes: dict[str, tuple[int, ...]]


# Characters a model's name keeps inside a C comment: with '*', backslash, '?' and line breaks gone, none of
# them, alone or next to the comment's own delimiters, can end the comment, open another, splice a line
# or form a trigraph.
_COMMENT_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.:/+,()[]=<>@")
# Longer names are cut in comments (a model's names can be of any length; the comment only points to them).
COMMENT_CHARS = 80


def comment_text(text: str, limit: int = COMMENT_CHARS) -> str:
    """A name from the model as a C comment may hold it: every UTF-8 byte outside _COMMENT_SAFE written
    as %XX ('%' too, so the spelling is unambiguous), cut to `limit` characters with '...'. A model's text
    reaches generated C only this way or as a string literal (capi.c_string)."""
    out = "".join(chr(b) if b in _COMMENT_SAFE else f"%{b:02X}"
                  for b in str(text).encode("utf-8", "surrogatepass"))
    return out if len(out) <= limit else out[:limit] + "..."


def where(node) -> str:
    """A node as a step comment names it: its name (or first output) and op, escaped by comment_text."""
    return f"{comment_text(node.name or (node.outputs[0] if node.outputs else ''))} ({comment_text(node.op)})"


def runtime_inputs(graph: Graph) -> list[str]:
    """Graph inputs fed at run time (an initializer listed as an input stays a constant)."""
    return [i for i in graph.inputs if i not in graph.constants]


def static_input_shapes(graph: Graph, overrides: dict | None = None) -> dict[str, tuple[int, ...]]:
    """Concrete shapes of the graph inputs (overrides first); symbolic dimensions are an error."""
    out = {}
    for name in runtime_inputs(graph):
        if overrides and name in overrides:
            out[name] = tuple(int(d) for d in overrides[name])
            continue
        info = graph.info(name)
        if not info.is_static():
            raise SaturateError(f"graph input '{name}' has shape {info.shape}; the C backend needs static "
                                f"shapes (pass input_shapes)")
        if info.dtype != "float32":
            raise SaturateError(f"graph input '{name}' has dtype {info.dtype}; the C backend runs float32 only")
        out[name] = tuple(info.shape)
    return out


# The signatures of a conv kernel's inlined vector epilogues (dconv.h, vec.h, pgemm.h): on 16 channels of one
# pixel (q the first channel's plane), on 8 consecutive outputs of one channel, and on 8 channels (AVX2).
EPC_FORM = ("__m512 {name}(__m512 v, int64_t q, __mmask16 mc)", "mc")
EPV_FORM = ("__m256 {name}(__m256 v, int64_t off, __mmask8 mk)", "mk")
EPC8_FORM = ("__m256 {name}(__m256 v, int64_t q, __m256i mc)", "mc")
EPR_FORM = ("__m512 {name}(__m512 v, int64_t q, int64_t off, __mmask16 mk)", "mk")
EPR8_FORM = ("__m256 {name}(__m256 v, int64_t q, int64_t off, __m256i mk)", "mk")
# An integer literal of generated C (not part of a name, a float literal or a hexadecimal one).
_INT = re.compile(r"(?<![\w.])\d+(?![\w.])")
_POINTER = re.compile(r"\((W[TS]) \+ (\d+)\)")


@dataclass
class Lifted:
    """A vector epilogue's body with its integer constants lifted out: EK[@k] stands for consts[k]."""

    kind: str
    body: str
    consts: list[int]

    def at(self, base: int) -> str:
        """The body reading its constants from EK[base ...]."""
        return re.sub(r"EK\[@(\d+)\]", lambda m: f"EK[{base + int(m.group(1))}]", self.body)


def lift(form: tuple[str, str], text: str, pointers_only: bool = False) -> Lifted:
    """A vector epilogue's statements as a Lifted of signature `form`. Per-channel forms run once per tile,
    so every integer becomes a constant read (a channel count among them: one division per tile);
    per-pixel forms run once per 8 outputs and keep their divisors, lifting only weight and arena offsets."""
    consts: list[int] = []

    def take(value: str) -> str:
        consts.append(int(value))
        return f"EK[@{len(consts) - 1}]"

    if pointers_only:
        body = _POINTER.sub(lambda m: f"({m.group(1)} + {take(m.group(2))})", text)
    else:
        body = _INT.sub(lambda m: take(m.group(0)), text)
    return Lifted(form[0], f"    (void){form[1]};\n{body}", consts)


def _weight_name(key) -> str:
    """The graph value a weights-blob key stands for (keys of packed forms are tuples naming it second)."""
    if isinstance(key, tuple):
        named = [k for k in key[1:] if isinstance(k, str)]
        return named[0] if named else str(key[0])
    return str(key)


class Emitter(NnEmission, MovementEmission):
    """Walks the plan and writes C: one static function per fused pointwise chain, calls per step."""

    def __init__(self, graph: Graph, shapes: dict, pl: Plan, cfg: BuildConfig):
        self.g, self.shapes, self.plan, self.cfg, self.sanitize = graph, shapes, pl, cfg, cfg.sanitize
        self.pn = panel_width(cfg)
        self.wsizes: dict = {}
        self.inputs = runtime_inputs(graph)
        self.needs_packed = False
        self.blob = WeightsBlob()
        self.woff: dict = {}
        self.nweights = 0
        self.funcs: list[str] = []
        self.body: list[str] = []
        self.vector: dict[str, tuple] = {}  # scalar epilogue name -> its vector forms (per channel, per pixel)
        self.vector8: dict[str, Lifted] = {}  # scalar epilogue name -> its 8-channel form (every step per channel)
        # scalar epilogue name -> its row form for the build's sat_conv_pw (sat_epr or, on AVX2, sat_epr8)
        self.vector_rows: dict[str, Lifted] = {}
        self.units: dict[tuple, str] = {}  # (runner, guard, epilogue templates) -> its work-item function
        self.ek: list[int] = []  # the running step's epilogue constants (see unit)

    # ---- storage ----------------------------------------------------------------------------
    def weight(self, key, array: np.ndarray) -> str:
        """Pointer expression to a float32 array stored in the weights blob (64-byte aligned)."""
        if key not in self.woff:
            # Weights go to disk one at a time (WeightsBlob) and the compiled model maps them, so the memory
            # limit bounds each float32 copy made here, not the sum of a model's weights.
            check_bytes(4 * array.size, f"weight '{_weight_name(key)}' of graph '{self.g.name}' as float32")
            data = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
            self.woff[key] = self.nweights
            pad = (-data.size) % 16 + (16 if self.sanitize else 0)
            self.wsizes[key] = data.size
            self.blob.append(data)
            self.blob.append(np.zeros(pad, np.float32))
            self.nweights += data.size + pad
        return f"(WT + {self.woff[key]})"

    def ptr(self, value: str) -> str:
        r = self.plan.root(value)
        if r in self.inputs:
            return f"((float *)IN[{self.inputs.index(r)}])"
        if r in self.g.constants:
            arr = self.g.constants[r]
            if arr.dtype.kind not in "fiub":
                raise SaturateError(f"constant '{r}' has dtype {arr.dtype}; the C backend reads float32 only")
            return f"((float *){self.weight(r, arr)})"
        return f"(WS + {self.plan.offsets[r] // 4})"

    # ---- pointwise chains -------------------------------------------------------------------
    def pointwise(self, step: Step, members: list, oshape: tuple, run_from: int | None, start: str | None,
                  extra: list | None = None, vector: bool = False) -> tuple[str, int]:
        """Emit `static void pw_K(y, off, len)` applying `members` (node, chain input) to each element.

        `start` names the value loaded first (elementwise anchors); None starts from y itself.
        `extra` are (expression-maker) steps applied before the members (conv bias, gemm C).
        Returns the function name and the axis its runs start at.
        """
        ops: list[Operand] = []
        keys: list = []

        def operand_shape(key) -> tuple[int, ...]:
            if isinstance(key, tuple):
                return key[2]
            return self.shapes[key]

        # First pass collects operand shapes to choose the run layout.
        def collect(key):
            keys.append(self.bn_key(key))
            return "0"

        for node, chain_in in members:
            step_expr(node, chain_in, collect, self.g)
        for key, _ in extra or []:
            keys.append(key)
        if start is not None:
            keys.append(start)
        if run_from is None:
            run_from = run_axis(oshape, [operand_shape(k) for k in keys])
        index: dict = {}

        def load(key) -> str:
            if isinstance(key, str):
                ident = key
            else:
                ident = (key[0], id(key[3])) if len(key) > 3 else (key[0], key[2])
            if ident not in index:
                index[ident] = len(ops)
                ops.append(self.operand(key, oshape, run_from))
            return ops[index[ident]].load(index[ident])

        lines = []
        for key, fmt in extra or []:
            lines.append(f"        v = {fmt.format(load(key))};\n")
        # Chain values a later member reads again besides the chain value (plan._diamond: a GELU's x) are kept
        # in locals, as the step never writes them out.
        made = {step.anchor.outputs[0]} | {node.outputs[0] for node, _ in members}
        again = {i for node, chain_in in members for i in node.inputs if i in made and i != chain_in}
        kept: dict[str, str] = {}

        def keep(value: str) -> None:
            if value in again and value not in kept:
                kept[value] = f"c{len(kept)}"
                lines.append(f"        const float {kept[value]} = v;\n")

        def member_load(k) -> str:
            return kept[k] if isinstance(k, str) and k in kept else load(self.bn_key(k))

        if start is None:
            keep(step.anchor.outputs[0])
        for node, chain_in in members:
            lines.append(f"        v = {step_expr(node, chain_in, member_load, self.g)};\n")
            keep(node.outputs[0])
        first = load(start) if start is not None else "y[off + i]"
        name = f"pw_{len(self.funcs)}"
        setup = "".join(o.setup(k) for k, o in enumerate(ops))
        self.funcs.append(
            f"static void {name}(float *restrict y, int64_t off, int64_t len) {{\n{setup}"
            f"    for (int64_t i = 0; i < len; i++) {{\n        float v = {first};\n{''.join(lines)}"
            f"        y[off + i] = v;\n    }}\n}}\n")
        if vector and start is None:
            self.vector_form(name, members, extra, load, ops, index)
        return name, run_from

    def vector_form(self, name, members, extra, load, ops, index) -> None:
        """Emit the chain as AVX code for kernels that apply it in their store (dconv.h): a leading run of
        steps whose operands are per channel becomes `pwc_K(v, q, mc)` on 16 channels of one pixel (q the
        first channel's plane), the rest `pwv_K(v, off, mk)` on 8 consecutive outputs of one channel.
        Recorded in self.vector only when every step has a vector form."""
        def operand(key):
            load(key)  # registers the operand
            ident = key if isinstance(key, str) else ((key[0], id(key[3])) if len(key) > 3 else (key[0], key[2]))
            k = index[ident]
            return k, ops[k]

        steps = [(lambda ld, key=key, fmt=fmt: None if fmt != "v + {}" or ld(key) is None
                  else f"_mm256_add_ps(v, {ld(key)})") for key, fmt in extra or []]
        steps += [(lambda ld, node=node, ci=chain_in: vec_expr(node, ci, lambda k: ld(self.bn_key(k)), self.g))
                  for node, chain_in in members]
        # The 8-channel AVX2 form (sat_conv_dwt), when every step reads only per-channel operands.
        lanes8 = [st(lambda key: operand(key)[1].chan_load8(operand(key)[0])) for st in steps]
        if all(lanes8):
            text = "".join(f"    v = {e};\n" for e in lanes8)
            decl = "".join(f"    const float *restrict p{k} = {o.ptr};\n" for k, o in enumerate(ops)
                           if o.ptr and re.search(rf"\bp{k}\b", text))
            self.vector8[name] = lift(EPC8_FORM, decl + text)
        widen = {"_mm256_": "_mm512_", "sat_exp8(": "sat_exp16(", "sat_rcp8(": "sat_rcp16("}

        def wide(e: str) -> str:
            return re.sub('|'.join(map(re.escape, widen)), lambda m: widen[m.group(0)], e)

        # The row form of 1x1 convs on sat_conv_pw (sat_epr on AVX-512 builds, sat_epr8 on AVX2 ones), when every
        # step has one.
        avx2 = not self.cfg.packed_gemm
        rows = [st(lambda key: operand(key)[1].row_load(operand(key)[0], avx2)) for st in steps]
        if all(rows):
            text = "".join(f"    v = {e if avx2 else wide(e)};\n" for e in rows)
            decl = "".join(o.setup(k) if re.search(rf"\bb{k}\b", text) else
                           f"    const float *restrict p{k} = {o.ptr};\n" for k, o in enumerate(ops)
                           if o.ptr and re.search(rf"\b[pb]{k}\b", text))
            self.vector_rows[name] = lift(EPR8_FORM if avx2 else EPR_FORM, decl + text, pointers_only=True)
        per_channel, rest = [], []
        for st in steps:
            e = None if rest else st(lambda key: operand(key)[1].chan_load(operand(key)[0]))
            if e is not None:
                per_channel.append(f"    v = {wide(e)};\n")
                continue
            e = st(lambda key: operand(key)[1].vload(operand(key)[0]))
            if e is None:
                return
            rest.append(f"    v = {e};\n")
        # Each function declares only the operands its own steps read (-Wall: no unused variables).
        chan_text, vec_text = "".join(per_channel), "".join(rest)
        ptrs = "".join(f"    const float *restrict p{k} = {o.ptr};\n" for k, o in enumerate(ops)
                       if o.ptr and re.search(rf"\bp{k}\b", chan_text))
        setup = "".join(o.setup(k) for k, o in enumerate(ops) if re.search(rf"\b[pb]{k}\b", vec_text))
        self.vector[name] = (lift(EPC_FORM, ptrs + chan_text) if per_channel else None,
                             lift(EPV_FORM, setup + vec_text, pointers_only=True) if rest else None)

    def bn_key(self, key):
        """BatchNormalization's folded per-channel scale and shift, as (tag, node, shape, node) keys."""
        if not isinstance(key, tuple):
            return key
        tag, node = key
        if tag in ("q_scale", "q_zero"):
            return axis_operand(self.g, node, tag, self.shapes[node.inputs[0]])
        if any(i not in self.g.constants for i in node.inputs[1:5]):
            raise unsupported(node, "needs constant BatchNormalization statistics")
        scale, bias, mean, var = (np.asarray(self.g.constants[i], np.float64) for i in node.inputs[1:5])
        a = scale / np.sqrt(var + float(node.attr("epsilon", 1e-5)))
        rank = len(self.shapes[node.inputs[0]])
        shape = (a.size,) + (1,) * (rank - 2)
        arr = a if tag == "bn_scale" else bias - mean * a
        return (tag, arr.astype(np.float32).reshape(shape), shape, node)

    def operand(self, key, oshape, run_from) -> Operand:
        if isinstance(key, tuple):  # derived array: (tag, array, shape[, node]) or (value, None, view shape)
            tag, arr, shape = key[0], key[1], key[2]
            if arr is None:
                return self.operand_value(tag, oshape, run_from, shape)
            if arr.size == 1:
                return Operand(None, shape, oshape, run_from, literal=float(arr.reshape(-1)[0]))
            return Operand(self.weight((tag, id(key[3]) if len(key) > 3 else tag), arr), shape, oshape, run_from)
        return self.operand_value(key, oshape, run_from, self.shapes[key])

    def operand_value(self, value, oshape, run_from, shape) -> Operand:
        r = self.plan.root(value)
        if r in self.g.constants and self.g.constants[r].size == 1:
            return Operand(None, shape, oshape, run_from, literal=float(self.g.constants[r].reshape(-1)[0]))
        return Operand(self.ptr(value), shape, oshape, run_from)

    # ---- steps ------------------------------------------------------------------------------
    def emit_step(self, step: Step) -> None:
        start, self.ek = len(self.body), []
        self.emit_kernel(step)
        if self.ek:
            table = f"ek_{len(self.funcs)}"
            self.funcs.append(f"static const int64_t {table}[] = {{{c_ints(self.ek)}}};\n")
            self.body.insert(start, f"    EK = {table};\n")

    def emit_kernel(self, step: Step) -> None:
        node, sh = step.anchor, self.shapes
        out, oshape = self.ptr(step.out), sh[step.out]
        chain = [(n, prev.outputs[0]) for prev, n in zip([node, *step.chain], step.chain)]
        self.body.append(f"    /* {', '.join(where(n) for n in step.nodes())} */\n")
        if step.pattern:
            getattr(self, f"emit_{step.pattern}")(step, chain, out, oshape)
            return
        if node.op in ELEMENTWISE_UNARY | ELEMENTWISE_BINARY | {"BatchNormalization"}:
            start = node.inputs[0]
            members = [(node, start)] + chain
            fn, r = self.pointwise(step, members, oshape, None, start)
            run = math.prod(oshape[r:])
            runs = math.prod(oshape) // max(run, 1)
            # Runs per work item: ~16K elements, down to 8K where that leaves fewer than 8 items (3 items of 16K
            # shared 2 + 1 between two threads); a step of fewer stays on one thread, where waking another
            # costs about what it would save.
            target = min(16384, max(8192, math.prod(oshape) // 8))
            per = max(1, min(runs, -(-target // max(run, 1))))
            chunks = -(-runs // per)
            if run > target:
                # Runs longer than an item are cut into pieces (any stretch of a run is one: its operands'
                # bases are computed from the offset), so a single run (an operand broadcast over all of
                # the output, as BERT's GELU divides by a scalar) is shared too, not run on one thread.
                pieces = -(-run // target)
                piece = -(-(-(-run // pieces)) // 16) * 16
                pieces = -(-run // piece)
                self.funcs.append(
                    f"static void {fn}_items(void *ctx, int64_t c, int tid) {{\n    (void)ctx; (void)tid;\n"
                    f"    const int64_t r = c / {pieces}, s = c % {pieces} * {piece};\n"
                    f"    {fn}({out}, r * {run} + s, {run} - s < {piece} ? {run} - s : {piece});\n}}\n")
                self.body.append(f"    sat_parallel({runs * pieces}, {fn}_items, NULL);\n")
                return
            self.funcs.append(
                f"static void {fn}_items(void *ctx, int64_t c, int tid) {{\n    (void)ctx; (void)tid;\n"
                f"    const int64_t end = (c + 1) * {per} < {runs} ? (c + 1) * {per} : {runs};\n"
                f"    for (int64_t r = c * {per}; r < end; r++) {fn}({out}, r * {run}, {run});\n}}\n")
            self.body.append(f"    sat_parallel({chunks}, {fn}_items, NULL);\n")
            return
        getattr(self, f"emit_{node.op}")(step, chain, out, oshape)

    def epilogue(self, step, chain, oshape, run_from, extra=None, vector=False) -> str:
        if not chain and not extra:
            return "NULL"
        return self.pointwise(step, chain, oshape, run_from, None, extra, vector)[0]

    def _unit8(self, prefix: str, runner: str, epi: str) -> str:
        """A work-item function running a conv kernel's `runner` with epilogue `epi` in its 8-channel
        form, inlined (AVX2 builds; NULL where the kernel has no such form)."""
        return self.unit(prefix, runner, "defined(SAT_HAVE_DWT)", [self.vector8[epi]])

    def unit(self, prefix: str, runner: str, guard: str, forms: list) -> str:
        """A work-item function running a kernel's inline `runner` with vector epilogue `forms` (Lifted or None)
        inlined into its stores, where `guard` (a preprocessor condition) holds, else NULL. Instances are shared:
        epilogues that differ only in their integer constants (weight offsets, channel counts) run one compiled
        unit, which reads those constants from EK, pointed at this step's table (self.ek, every unit of the
        step's in turn) before its kernel runs. Each instance costs the compiler a whole tile kernel, so this
        is most of what a model's compile takes."""
        texts = []
        for form in forms:
            texts.append(None if form is None else form.at(len(self.ek)))
            self.ek += [] if form is None else form.consts
        key = (runner, guard, tuple(texts))
        if key not in self.units:
            name = f"{prefix}_{len(self.units)}"
            args = []
            for k, (form, text) in enumerate(zip(forms, texts)):
                if form is None:
                    args.append("NULL")
                    continue
                args.append(f"{name}_e{k}")
                self.funcs.append(f"#if {guard}\nstatic inline {form.kind.format(name=args[-1])} {{\n{text}    return v;\n}}\n"
                                  f"#endif\n")
            self.funcs.append(f"#if {guard}\nstatic void {name}(void *ctx, int64_t i, int tid) "
                              f"{{ {runner}(ctx, i, tid, {', '.join(args)}); }}\n#else\n#define {name} NULL\n#endif\n")
            self.units[key] = name
        return self.units[key]

    # ---- whole program ----------------------------------------------------------------------
    def program(self) -> str:
        for k, step in enumerate(self.plan.steps):
            self.body.append("    { SAT_TIC\n")
            self.emit_step(step)
            self.body.append(f"    SAT_TOC({k}) }}\n")
        copies = "".join(f"    memcpy(outputs[{k}], {self.ptr(o)}, {math.prod(self.shapes[o]) * 4});\n"
                         for k, o in enumerate(self.g.outputs))
        poison_init, poison_run = self.poison()
        head = (f"/* Generated by saturate's C backend for graph '{comment_text(self.g.name)}': "
                f"{len(self.g.nodes)} nodes in {len(self.plan.steps)} kernel steps. */\n"
                + ("#include <sanitizer/asan_interface.h>\n" if self.sanitize else "")
                + "#include \"kernels.h\"\n"
                + f"#if SAT_PN != {self.pn}\n#error \"weights packed for {self.pn}-wide panels (the build's vector width changed)\"\n"
                  "#endif\n"
                + ("#ifndef SAT_HAVE_PACKED_GEMM\n#error \"packed conv weights need an AVX-512 build (-march=native)\"\n"
                   "#endif\n" if self.needs_packed else "") + "\n"
                f"static const float *WT;\nstatic const int64_t NWT = {self.nweights};\nstatic float *WS, *COL;\n"
                f"static const float *const *IN;\n"
                f"/* The integer constants of the running step's epilogue (see Emitter.unit). */\n"
                f"static const int64_t *EK __attribute__((unused));\n\n")
        # (sanitizer builds: a later mapping at these addresses would keep the run's poisoned shadow)
        unpoison_free = f"    if (ws) ASAN_UNPOISON_MEMORY_REGION(ws, {self.plan.peak_bytes});\n" if self.sanitize else ""
        api = (f"\nint sat_init(const char *path) {{\n    if (!WT) {{\n        WT = sat_read_weights(path, NWT);\n"
               f"{poison_init}    }}\n"
               f"    return WT ? 0 : 1;\n}}\n\n"
               f"int64_t sat_workspace_bytes(void) {{ return {self.plan.peak_bytes}; }}\n\n"
               f"float *sat_workspace_alloc(void) {{ return sat_workspace_map({self.plan.peak_bytes}); }}\n\n"
               f"void sat_workspace_free(float *ws) {{\n{unpoison_free}    sat_workspace_unmap(ws, {self.plan.peak_bytes});\n}}\n\n"
               f"int sat_run(const float *const *inputs, float *const *outputs, float *ws, int threads) {{\n"
               f"    if (!WT) return 1;\n    /* any count: the pool and the per-thread buffers hold SAT_MAX_THREADS */\n    sat_set_threads(threads);\n    scipy_openblas_set_num_threads(1);\n"
               f"    IN = inputs;\n    WS = ws;\n    COL = ws + {self.plan.arena_bytes // 4};\n    (void)COL;\n{poison_run}"
               f"    int status = 0;\n    sat_pool_begin();\n{''.join(self.body)}{copies}    sat_pool_end();\n"
               f"    return status;\n}}\n")
        return head + "".join(self.funcs) + api

    def poison(self) -> tuple[str, str]:
        """Sanitizer builds: poison the arena and weight padding, unpoison what kernels may touch."""
        if not self.sanitize:
            return "", ""
        init = "".join(f"    ASAN_UNPOISON_MEMORY_REGION((void *)(WT + {o}), {4 * self.wsizes[k]});\n"
                       for k, o in self.woff.items())
        run = "".join(f"    ASAN_UNPOISON_MEMORY_REGION(WS + {o // 4}, {4 * self.plan.floats(r, self.shapes[r])});\n"
                      for r, o in self.plan.offsets.items())
        return (f"    if (WT) ASAN_POISON_MEMORY_REGION((void *)WT, {4 * self.nweights});\n{init}",
                # (the whole workspace first: memory mapped where an earlier mapping was poisoned keeps its
                # shadow, so the scratch after the arena is cleared here too)
                f"    ASAN_UNPOISON_MEMORY_REGION(ws, {self.plan.peak_bytes});\n"
                f"    ASAN_POISON_MEMORY_REGION(ws, {self.plan.arena_bytes});\n{run}")


def emit(graph: Graph, input_shapes: dict | None = None, config: BuildConfig | None = None) -> Emitted:
    """Shape, fuse, plan and generate C for any float32 graph of supported ops, for `config` (else the settings
    in force)."""
    config = config or BuildConfig.from_env()
    graph.validate()
    shapes = infer_shapes(graph, static_input_shapes(graph, input_shapes))
    for o in graph.outputs:
        if o in graph.constants and graph.constants[o].dtype != np.float32:
            raise SaturateError(f"graph output '{o}' has dtype {graph.constants[o].dtype}; the C backend is float32 only")
    # What a call allocates (its inputs, outputs and workspace) is refused here when over the memory limit,
    # before the compile and before anything runs the model.
    for name in runtime_inputs(graph):
        check_allocation(shapes[name], 4, f"graph input '{name}'")
    for name in graph.outputs:
        check_allocation(shapes[name], 4, f"graph output '{name}'")
    pl = plan(graph, shapes, config, redzone=64 if config.sanitize else 0)
    check_bytes(pl.peak_bytes, f"the workspace of graph '{graph.name}'")
    em = Emitter(graph, shapes, pl, config)
    src = em.program()
    return Emitted(src, em.blob, [(i, shapes[i]) for i in em.inputs],
                   [(o, shapes[o]) for o in graph.outputs], pl, shapes)
