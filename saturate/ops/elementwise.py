"""Op registry, elementwise family: arithmetic, activations and comparisons."""

from __future__ import annotations

import numpy as np

from saturate.ops.schema import VARIADIC
from saturate.interp import kernels as k
from saturate.ops.cost import no_flops
from saturate.ops.ctext import c_float, clip_bounds, text
from saturate.ops.registry import define

# Shape arithmetic and the first ops rules name: encoded as terms, open to integer data.
_ARITH = dict(elementwise=True, shape_arith=True, engine=True, c="binary")
_ACTIVATION = dict(elementwise=True, engine=True, draw="unary", c="unary")


# The hooks' `a` is backend.pointwise.PointwiseArgs: a[k] the C text of input k, a.chain(k)
# whether it is the chain value `v`.
def _infix(sym: str, vec: str):
    def expr(node, a, operand, graph) -> str:
        return f"{a[0]} {sym} {a[1]}"

    def vector(node, a, operand, graph) -> str | None:
        return None if None in a else f"_mm256_{vec}_ps({a[0]}, {a[1]})"
    return expr, vector


def _call(fn: str):
    return lambda node, a, operand, graph: f"{fn}({a[0]}, {a[1]})"


def _minmax_vec(fn: str):
    def vector(node, a, operand, graph) -> str | None:
        if node.inputs[0] == node.inputs[1]:
            return None
        other = a[1] if a.chain(0) else a[0]
        return None if other is None else f"_mm256_{fn}_ps(v, {other})"
    return vector


def _pow_expr(node, a, operand, graph) -> str:
    if a.chain(0) and not a.chain(1):
        # Constant exponents of real models (LayerNorm's square, RMS roots) need no powf call.
        special = {"2.0f": "v * v", "1.0f": "v", "0.5f": "sqrtf(v)", "3.0f": "v * v * v", "-1.0f": "1.0f / v"}
        return special.get(a[1], f"powf(v, {a[1]})")
    return f"powf({a[0]}, {a[1]})"


def _pow_vec(node, a, operand, graph) -> str | None:
    return "_mm256_mul_ps(v, v)" if a.chain(0) and not a.chain(1) and a[1] == "_mm256_set1_ps(2.0f)" else None


def _scalar(c_text: str):
    """A pointwise C expression in `v` alone."""
    return lambda node, a, operand, graph: c_text


for _name, _ufunc, _sym, _vec in (("Add", np.add, "+", "add"), ("Sub", np.subtract, "-", "sub"),
                                  ("Mul", np.multiply, "*", "mul")):
    _expr, _vector = _infix(_sym, _vec)
    define(_name, **_ARITH, commutative=_name != "Sub", evaluate=k.binary(_ufunc), arity=(2, 2), draw="binary",
           c_expr=_expr, c_vec=_vector)
def _reciprocal(node, a, graph) -> str | None:
    """1 / c as a C literal where the chain value is divided by a float scalar constant c whose reciprocal
    is a normal float: a product then stands for the divide, within an ulp or so of it. A vector divide
    has a fifth of a multiply's throughput: BERT's GELU, x * (1 + erf(x / sqrt 2)) in the epilogue of a
    512 x 384 x 1536 product, took 7.9 ms with the divide and 7.6 with the product (avx2 build, 1 thread,
    the whole product 6.9 ms without the GELU)."""
    if graph is None or not a.chain(0) or a.chain(1):
        return None
    c = graph.constants.get(node.inputs[1])
    if c is None or np.size(c) != 1 or np.asarray(c).dtype.kind != "f":
        return None
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        r = np.float32(1.0) / np.asarray(c, np.float32).reshape(-1)[0]
    return c_float(r) if np.isfinite(r) and abs(r) >= np.finfo(np.float32).tiny else None


def _div_expr(node, a, operand, graph) -> str:
    r = _reciprocal(node, a, graph)
    return f"v * {r}" if r else f"{a[0]} / {a[1]}"


def _div_vec(node, a, operand, graph) -> str | None:
    r = _reciprocal(node, a, graph)
    if r:
        return f"_mm256_mul_ps(v, _mm256_set1_ps({r}))"
    return None if None in a else f"_mm256_div_ps({a[0]}, {a[1]})"


define("Div", **_ARITH, evaluate=k.div, arity=(2, 2), draw="binary", c_expr=_div_expr, c_vec=_div_vec)
define("Pow", elementwise=True, evaluate=k.pow_, arity=(2, 2), draw="binary", c="binary", c_expr=_pow_expr,
       c_vec=_pow_vec)
define("Mod", elementwise=True, shape_arith=True, draw="binary")
for _name, _ufunc, _fn in (("Max", np.maximum, "fmaxf"), ("Min", np.minimum, "fminf")):
    define(_name, elementwise=True, commutative=True, evaluate=k.variadic(_ufunc), arity=(1, VARIADIC),
           draw="variadic", c="binary", c_expr=_call(_fn), c_vec=_minmax_vec(_name.lower()))
# onnx.reference sums into a copy of the first input: it fails when a later input is larger.
define("Sum", commutative=True, evaluate=k.variadic(np.add), arity=(1, VARIADIC), draw="variadic")
define("Mean", evaluate=k.mean, arity=(1, VARIADIC), draw="variadic")
# C holds Where's bool condition as 0.0f or 1.0f (backend.shapes: its dtypes and shape).
define("Where", draw="broadcast", c="binary",
       c_expr=lambda node, a, operand, graph: f"({a[0]} != 0.0f ? {a[1]} : {a[2]})")
for _name in ("And", "Or", "Xor", "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"):
    define(_name, draw="broadcast")
define("BitShift", draw="broadcast", enums={"direction": ("RIGHT", "LEFT")})

define("Neg", **{**_ACTIVATION, "shape_arith": True}, evaluate=k.unary(np.negative), arity=(1, 1),
       c_expr=_scalar("-v"), c_vec=_scalar("_mm256_xor_ps(_mm256_set1_ps(-0.0f), v)"))
define("Relu", **_ACTIVATION, evaluate=k.unary(k.relu), arity=(1, 1), c_expr=_scalar("v > 0.0f ? v : 0.0f"),
       c_vec=_scalar("_mm256_max_ps(v, _mm256_setzero_ps())"))  # NaN -> 0, as the scalar form
define("Sigmoid", **_ACTIVATION, evaluate=k.unary(k.expit), arity=(1, 1),
       c_expr=_scalar("sat_rcpf(1.0f + sat_expf(-v))"))
define("Tanh", **_ACTIVATION, evaluate=k.unary(np.tanh), arity=(1, 1), c_expr=_scalar("sat_tanhf(v)"))
define("Erf", **_ACTIVATION, evaluate=k.unary(k.erf), arity=(1, 1), c_expr=_scalar("sat_erff(v)"))
define("Sqrt", **_ACTIVATION, evaluate=k.unary(np.sqrt), arity=(1, 1), domains={0: "nonnegative"},
       c_expr=_scalar("sqrtf(v)"))
define("Reciprocal", **_ACTIVATION, evaluate=k.unary(np.reciprocal), arity=(1, 1), c_expr=_scalar("1.0f / v"))
define("Clip", **_ACTIVATION, evaluate=k.clip, arity=(1, 3), param_inputs=True,
       c_expr=lambda node, a, operand, graph: "sat_clampf(v, {}, {})".format(*map(c_float, clip_bounds(node, graph))),
       c_vec=lambda node, a, operand, graph: "_mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps({})), "
                                             "_mm256_set1_ps({}))".format(*map(c_float, clip_bounds(node, graph))))
define("LeakyRelu", **_ACTIVATION, evaluate=k.leaky_relu, arity=(1, 1),
       c_expr=lambda node, a, operand, graph: f"v >= 0.0f ? v : {c_float(node.attr('alpha', 0.01))} * v")
# Views, so the interpreter copies them only if they become graph outputs.
define("Identity", elementwise=True, shape_arith=True, engine=True, evaluate=k.unary(k.view), arity=(1, 1),
       draw="unary", c="view", int_move=True, flops=no_flops, c_expr=_scalar("v"), c_vec=_scalar("v"))
# libm's expf: the full range (overflow to inf) matters when Exp stands alone.
define("Exp", elementwise=True, evaluate=k.unary(np.exp), arity=(1, 1), draw="unary", c="unary",
       c_expr=_scalar("expf(v)"))
define("Log", elementwise=True, evaluate=k.unary(np.log), arity=(1, 1), draw="unary", domains={0: "positive"},
       c="unary", c_expr=_scalar("logf(v)"))
define("Abs", elementwise=True, evaluate=k.unary(np.abs), arity=(1, 1), draw="unary", c="unary",
       c_expr=_scalar("fabsf(v)"), c_vec=_scalar("_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v)"))
define("Floor", elementwise=True, c="unary", c_expr=_scalar("floorf(v)"))
# C holds the bool output as 0.0f or 1.0f, as Where's condition (backend.shapes: its dtype). No vector form: the
# AVX-512 kernels widen vector forms, and a 512-bit compare gives a mask, not a vector.
define("IsNaN", arity=(1, 1), draw="unary", c="unary", c_expr=_scalar("v != v ? 1.0f : 0.0f"))
define("Ceil", elementwise=True, c="unary", c_expr=_scalar("ceilf(v)"))
define("Sign", elementwise=True)
define("PRelu", elementwise=True)


def _hard_vec(alpha: float, beta: float) -> str:
    return (f"_mm256_min_ps(_mm256_max_ps(_mm256_add_ps(_mm256_mul_ps(v, _mm256_set1_ps({c_float(alpha)})), "
            f"_mm256_set1_ps({c_float(beta)})), _mm256_setzero_ps()), _mm256_set1_ps(1.0f))")


define("HardSwish", elementwise=True, c="unary",
       c_expr=_scalar("v * sat_clampf(v * (1.0f / 6.0f) + 0.5f, 0.0f, 1.0f)"),
       c_vec=lambda node, a, operand, graph: f"_mm256_mul_ps(v, {_hard_vec(1.0 / 6.0, 0.5)})")
define("HardSigmoid", elementwise=True, c="unary",
       c_expr=lambda node, a, operand, graph: (f"sat_clampf(v * {c_float(node.attr('alpha', 0.2))} + "
                                               f"{c_float(node.attr('beta', 0.5))}, 0.0f, 1.0f)"),
       c_vec=lambda node, a, operand, graph: _hard_vec(node.attr("alpha", 0.2), node.attr("beta", 0.5)))
# Swish's vector form calls vec.h's sat_exp8 and sat_rcp8 (AVX2 and AVX-512 builds).
define("Swish", c="unary",
       c_expr=lambda node, a, operand, graph: f"v * sat_rcpf(1.0f + sat_expf(-{c_float(node.attr('alpha', 1.0))} * v))",
       c_vec=lambda node, a, operand, graph: (
           f"_mm256_mul_ps(v, sat_rcp8(_mm256_add_ps(_mm256_set1_ps(1.0f), "
           f"sat_exp8(_mm256_mul_ps(_mm256_set1_ps(-{c_float(node.attr('alpha', 1.0))}), v)))))"))


def _gelu_expr(node, a, operand, graph) -> str:
    if text(node.attr("approximate", "none")) == "tanh":
        return "0.5f * v * (1.0f + sat_tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))"
    return "0.5f * v * (1.0f + sat_erff(v * 0.7071067811865476f))"


define("Gelu", elementwise=True, evaluate=k.gelu, arity=(1, 1), c="unary", c_expr=_gelu_expr,
       enums={"approximate": ("none", "tanh")})
define("Elu", elementwise=True, c="unary",
       c_expr=lambda node, a, operand, graph: (f"v >= 0.0f ? v : {c_float(node.attr('alpha', 1.0))} "
                                               "* (sat_expf(v) - 1.0f)"))


def _selu_expr(node, a, operand, graph) -> str:
    alpha = c_float(node.attr("alpha", 1.67326319217681884765625))
    gamma = c_float(node.attr("gamma", 1.05070102214813232421875))
    return f"{gamma} * (v > 0.0f ? v : {alpha} * (sat_expf(v) - 1.0f))"


define("Selu", elementwise=True, c="unary", c_expr=_selu_expr)
# log1p(exp(v)) overflows for large v, where softplus is v itself.
define("Softplus", elementwise=True, c="unary", c_expr=_scalar("v > 20.0f ? v : log1pf(expf(v))"))
