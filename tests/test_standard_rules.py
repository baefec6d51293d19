"""Every standard rule, Before/Expected: a small graph, the ops left after the rule, same numbers."""

from __future__ import annotations

import numpy as np
import pytest
from engine_util import Builder, assert_same, ops

from saturate.interp.interpreter import run_graph
from saturate.lang.parser import load_rules
from saturate.pipeline import optimize

RULES = {r.name: r for r in load_rules(None, level=3)}
I64 = np.int64


def _img(fn, shape=(1, 4, 6, 6)):
    b = Builder(shape=shape)
    return b, b.build(fn(b))


def _mat(fn, shape=(2, 3)):
    return _img(fn, shape)


def _per_channel(b, low=None):
    return b.rand(1, 4, 1, 1, low=low)


def _fold(op, *consts, **attrs):
    """x + op(constants): the op is computed once, leaving a single Add."""
    return lambda b: b.op("Add", "x", b.op(op, *[c(b) for c in consts], **attrs))


def _around_reshapes(body):
    """Reshape x (2, 3) to (6,), apply `body` to it, Reshape back to (2, 3)."""
    return lambda b: b.op("Reshape", body(b, b.op("Reshape", "x", _i64(6)(b))), _i64(2, 3)(b))


_MEET = ("reshape-reshape", "reshape-same")


def _c(*shape, low=None):
    return lambda b: b.rand(*shape, low=low)


def _gemm(trans_b: int, bias: bool, scale_in: bool):
    def build(b):
        w = b.rand(*((4, 3) if trans_b else (3, 4)))
        x = b.op("Mul", "x", b.rand(1, 3)) if scale_in else "x"
        ins = [x, w] + ([b.rand(4)] if bias else [])
        y = b.op("Gemm", *ins, transB=trans_b)
        return y if scale_in else b.op("Mul", y, b.rand(1, 4))
    return build


def _i64(*values):
    return lambda b: b.const(np.array(values, I64))


def _reshape_to(op, *ins, **attrs):
    """x (2, 3) reshaped to a shape computed by op(inputs): once folded, a Reshape by a constant."""
    return lambda b: b.op("Reshape", "x", b.op(op, *[i(b) if callable(i) else i for i in ins], **attrs))


def _concat_of_convs(op, n, const_shape):
    """op(Concat of n convs of x along channels, per-channel constant): split into each conv."""
    def build(b):
        cat = b.op("Concat", *[b.conv("x", 2, 4, bias=True) for _ in range(n)], axis=1)
        return b.op(op, cat, b.rand(*const_shape(2 * n)))
    return build


def _branches(identity):
    """RepVGG's block: a 3x3 conv, a 1x1 conv and an identity branch of x, summed."""
    def build(b):
        y = b.op("Add", b.conv("x", 4, 4, k=3, bias=True), b.conv("x", 4, 4, k=1, bias=True))
        return b.op("Add", y, identity(b)) if identity else y
    return build


def _qdq(b, x, scale, zero_point, **attrs):
    """x quantized and dequantized again with one (scale, zero point)."""
    s, z = b.const(np.asarray(scale, np.float32)), b.const(zero_point)
    return b.op("DequantizeLinear", b.op("QuantizeLinear", x, s, z, **attrs), s, z, **attrs)


def _quant_case(op, *, per_channel=False, bias=None):
    """quantize_static's pattern Q(op(DQ(x), DQ(w), bias)) -> DQ. Power-of-two scales make the
    integer form exact: the accumulator's products are the float ones."""
    def build(b):
        x = _qdq(b, "x", 2.0 ** -4, np.uint8(128))
        n = 4
        shape = (n, 4, 3, 3) if op == "Conv" else (3, n)
        w = b.const(b.rng.integers(-128, 128, shape).astype(np.int8))
        axis = 0 if op == "Conv" else 1
        ws = b.const((2.0 ** -6 * (1 + np.arange(n) % 2)).astype(np.float32) if per_channel
                     else np.float32(2.0 ** -6))
        wz = b.const(np.zeros(n, np.int8) if per_channel else np.int8(0))
        ins = [x, b.op("DequantizeLinear", w, ws, wz, axis=axis)]
        bias_q = b.rng.integers(-300, 300, n)
        if bias == "int32":
            ins.append(b.op("DequantizeLinear", b.const(bias_q.astype(np.int32)),
                            b.const(np.float32(2.0 ** -10)), b.const(np.int32(0))))
        elif bias == "float":
            ins.append(b.const((bias_q * 2.0 ** -9).astype(np.float32)))   # whole steps of every xs * ws
        y = b.op(op, *ins, **({"pads": [1, 1, 1, 1]} if op == "Conv" else {}))
        s, z = b.const(np.float32(2.0 ** -2)), b.const(np.uint8(128))
        return b.op("DequantizeLinear", b.op("QuantizeLinear", y, s, z), s, z)
    return build


def _quant_moves(op, *args, **attrs):
    """DQ -> op -> Q with one quantization on both sides, dequantized after."""
    def build(b):
        s, z = b.const(np.float32(0.25)), b.const(np.uint8(100))
        moved = b.op(op, b.op("DequantizeLinear", b.op("QuantizeLinear", "x", s, z), s, z),
                     *[a(b) for a in args], **attrs)
        return b.op("DequantizeLinear", b.op("QuantizeLinear", moved, s, z), s, z)
    return build


QUANT_CASES = {
    "qdq-conv": (_img(_quant_case("Conv")), ["QuantizeLinear", "QLinearConv", "DequantizeLinear"], ()),
    "qdq-conv-bias": (_img(_quant_case("Conv", per_channel=True, bias="float")),
                      ["QuantizeLinear", "QLinearConv", "DequantizeLinear"], ()),
    "qdq-conv-qbias": (_img(_quant_case("Conv", bias="int32")),
                       ["QuantizeLinear", "QLinearConv", "DequantizeLinear"], ()),
    "qdq-matmul": (_mat(_quant_case("MatMul")), ["QuantizeLinear", "QLinearMatMul", "DequantizeLinear"], ()),
    "qdq-matmul-per-column": (_mat(_quant_case("MatMul", per_channel=True)),
                              ["QuantizeLinear", "QLinearMatMul", "DequantizeLinear"], ()),
    "q-relu": (_img(lambda b: _qdq(b, b.op("Relu", "x"), 0.25, np.uint8(0))),
               ["QuantizeLinear", "DequantizeLinear"], ()),
    "q-clip": (_img(lambda b: _qdq(b, b.op("Clip", "x", b.const(np.float32(0)), b.const(np.float32(64))),
                                   0.25, np.uint8(0))), ["QuantizeLinear", "DequantizeLinear"], ()),
    "dq-q": (_img(lambda b: _qdq(b, _qdq(b, "x", 0.25, np.int8(3)), 0.25, np.int8(3))),
             ["QuantizeLinear", "DequantizeLinear"], ()),
    "dq-q-axis": (_img(lambda b: _qdq(b, _qdq(b, "x", [0.25, 0.5, 1, 2], np.arange(4, dtype=np.int8), axis=1),
                                      [0.25, 0.5, 1, 2], np.arange(4, dtype=np.int8), axis=1)),
                  ["QuantizeLinear", "DequantizeLinear"], ()),
    "dq-flatten-q": (_img(_quant_moves("Flatten", axis=1)), ["QuantizeLinear", "Flatten", "DequantizeLinear"], ()),
    "dq-reshape-q": (_img(_quant_moves("Reshape", _i64(4, -1))), ["QuantizeLinear", "Reshape", "DequantizeLinear"],
                     ()),
    "dq-transpose-q": (_img(_quant_moves("Transpose", perm=[0, 2, 3, 1])),
                       ["QuantizeLinear", "Transpose", "DequantizeLinear"], ()),
    "fold-quantize": (_img(lambda b: b.op("Add", "x", _qdq(b, b.rand(1, 4, 1, 1), 0.1, np.int8(0)))),
                      ["DequantizeLinear", "Add"], ()),
}


# rule -> (Before graph, Expected ops after, other rules the case needs to show the effect).
# A rewrite to a form of equal cost (x - c into x + -c) shows only once another rule uses it.
CASES = {
    "add-add": (_mat(lambda b: b.op("Add", b.op("Add", "x", b.rand(3)), b.rand(2, 1))), ["Add"], ()),
    "mul-mul": (_mat(lambda b: b.op("Mul", b.op("Mul", "x", b.rand(3)), b.rand(2, 3))), ["Mul"], ()),
    "sub-const": (_mat(lambda b: b.op("Add", b.op("Sub", "x", b.rand(3)), b.rand(3))), ["Add"], ("add-add",)),
    "div-const": (_mat(lambda b: b.op("Mul", b.op("Div", "x", b.rand(3, low=0.5)), b.rand(3))), ["Mul"],
                  ("mul-mul",)),
    "add-zero": (_mat(lambda b: b.op("Relu", b.op("Add", "x", b.const(np.zeros(3, np.float32))))), ["Relu"], ()),
    "mul-one": (_mat(lambda b: b.op("Relu", b.op("Mul", "x", b.const(np.ones(3, np.float32))))), ["Relu"], ()),
    "batchnorm": (_img(lambda b: b.bn(b.conv("x", 4, 4), 4)), ["Conv"], ("conv-scale-out", "conv-bias")),
    "batchnorm-training-const": (_img(lambda b: b.op("Add", "x", b.op(
        "BatchNormalization", b.rand(2, 4, 6, 6), b.rand(4, low=0.5), b.rand(4), b.rand(4), b.rand(4, low=0.5),
        epsilon=1e-3, training_mode=1))), ["Add"], ()),
    "conv-bias": (_img(lambda b: b.op("Add", b.conv("x", 4, 4), _per_channel(b))), ["Conv"], ()),
    "conv-bias-add": (_img(lambda b: b.op("Add", b.conv("x", 4, 4, bias=True), _per_channel(b))), ["Conv"], ()),
    "identity": (_mat(lambda b: b.op("Relu", b.op("Identity", "x"))), ["Relu"], ()),
    "add-comm": (_mat(lambda b: b.op("Add", b.op("Add", b.rand(3), "x"), b.rand(3))), ["Add"], ("add-add",)),
    "mul-comm": (_mat(lambda b: b.op("Mul", b.op("Mul", b.rand(3), "x"), b.rand(3))), ["Mul"], ("mul-mul",)),
    "reshape-reshape": (_mat(lambda b: b.op("Reshape", b.op("Reshape", "x", b.const(np.array([3, 2], I64))),
                                            b.const(np.array([6], I64)))), ["Reshape"], ()),
    "transpose-transpose": (_img(lambda b: b.op("Transpose", b.op("Transpose", "x", perm=[0, 2, 3, 1]),
                                                perm=[0, 2, 3, 1])), ["Transpose"], ()),
    "transpose-identity": (_img(lambda b: b.op("Relu", b.op("Transpose", "x", perm=[0, 1, 2, 3]))), ["Relu"], ()),
    # Strides and pads omitted (1s and 0s), then written out.
    "averagepool-unit": (_img(lambda b: b.op("Relu", b.op("AveragePool", "x", kernel_shape=[1, 1]))), ["Relu"], ()),
    "maxpool-unit": (_img(lambda b: b.op("Relu", b.op("MaxPool", "x", kernel_shape=[1, 1], strides=[1, 1],
                                                      pads=[0, 0, 0, 0]))), ["Relu"], ()),
    "fold-add": (_mat(_fold("Add", _c(3), _c(2, 3))), ["Add"], ()),
    "fold-sub": (_mat(_fold("Sub", _c(3), _c(2, 3))), ["Add"], ()),
    "fold-mul": (_mat(_fold("Mul", _c(3), _c(2, 3))), ["Add"], ()),
    "fold-div": (_mat(_fold("Div", _c(3), _c(2, 3, low=0.5))), ["Add"], ()),
    "fold-neg": (_mat(_fold("Neg", _c(3))), ["Add"], ()),
    "fold-sqrt": (_mat(_fold("Sqrt", _c(3, low=0.1))), ["Add"], ()),
    "fold-reciprocal": (_mat(_fold("Reciprocal", _c(3, low=0.5))), ["Add"], ()),
    "fold-relu": (_mat(_fold("Relu", _c(3))), ["Add"], ()),
    "fold-sigmoid": (_mat(_fold("Sigmoid", _c(3))), ["Add"], ()),
    "fold-tanh": (_mat(_fold("Tanh", _c(3))), ["Add"], ()),
    "fold-erf": (_mat(_fold("Erf", _c(3))), ["Add"], ()),
    "fold-exp": (_mat(_fold("Exp", _c(3))), ["Add"], ()),
    "fold-log": (_mat(_fold("Log", _c(3, low=0.1))), ["Add"], ()),
    "fold-pow": (_mat(lambda b: b.op("Add", "x", b.op("Pow", b.rand(3, low=0.1), b.const(np.array([2, -1, 3], I64))))),
                 ["Add"], ()),
    "fold-leaky-relu": (_mat(_fold("LeakyRelu", _c(3), alpha=0.2)), ["Add"], ()),
    "fold-clip": (_mat(lambda b: b.op("Add", "x", b.op("Clip", b.rand(3), b.const(np.float32(-0.5)),
                                                         b.const(np.float32(0.5))))), ["Add"], ()),
    "fold-matmul": (_mat(_fold("MatMul", _c(2, 4), _c(4, 3))), ["Add"], ()),
    "fold-gemm": (_mat(_fold("Gemm", _c(2, 4), _c(3, 4), transB=1)), ["Add"], ()),
    "fold-gemm-bias": (_mat(_fold("Gemm", _c(2, 4), _c(4, 3), _c(3), alpha=0.5)), ["Add"], ()),
    "fold-transpose": (_mat(_fold("Transpose", _c(3, 2), perm=[1, 0])), ["Add"], ()),
    "fold-reshape": (_mat(lambda b: b.op("Add", "x", b.op("Reshape", b.rand(6),
                                                          b.const(np.array([2, 3], I64))))), ["Add"], ()),
    "fold-flatten": (_mat(_fold("Flatten", _c(2, 3, 1), axis=1)), ["Add"], ()),
    "fold-softmax": (_mat(_fold("Softmax", _c(2, 3), axis=1)), ["Add"], ()),
    **{f"{outer.lower()}-{inner.lower()}": (_mat(lambda b, o=outer, i=inner: b.op(o, b.op(i, "x"))), [outer], ())
       for outer, inner in (("Relu", "Relu"), ("Abs", "Abs"), ("Ceil", "Ceil"), ("Floor", "Floor"),
                            ("Round", "Round"), ("Sign", "Sign"), ("Abs", "Neg"))},
    "abs-relu": (_mat(lambda b: b.op("Abs", b.op("Relu", "x"))), ["Relu"], ()),
    "neg-neg": (_mat(lambda b: b.op("Relu", b.op("Neg", b.op("Neg", "x")))), ["Relu"], ()),
    "concat-single": (_mat(lambda b: b.op("Relu", b.op("Concat", "x", axis=0))), ["Relu"], ()),
    "shape-static": (_mat(_reshape_to("Shape", "x", start=0)), ["Reshape"], ()),
    "shape-gather": (_mat(_reshape_to("Gather", lambda b: b.op("Shape", "x"), _i64(1, 0), axis=0)),
                     ["Reshape"], ()),
    "fold-gather": (_mat(_reshape_to("Gather", _i64(3, 2, 7), _i64(1, 0), axis=0)), ["Reshape"], ()),
    "fold-unsqueeze": (_mat(_reshape_to("Unsqueeze", lambda b: b.const(np.array(6, I64)), _i64(0))),
                       ["Reshape"], ()),
    "fold-unsqueeze-attr": (_mat(_reshape_to("Unsqueeze", lambda b: b.const(np.array(6, I64)), axes=[0])),
                            ["Reshape"], ()),
    "fold-squeeze": (_mat(_reshape_to("Squeeze", lambda b: b.const(np.array([[2, 3]], I64)), _i64(0))),
                     ["Reshape"], ()),
    "fold-squeeze-attr": (_mat(_reshape_to("Squeeze", lambda b: b.const(np.array([[2, 3]], I64)))),
                          ["Reshape"], ()),
    "fold-cast": (_mat(_reshape_to("Cast", lambda b: b.const(np.array([3.0, 2.0], np.float32)), to=7)),
                  ["Reshape"], ()),
    "fold-concat-2": (_mat(_reshape_to("Concat", _i64(3), _i64(2), axis=0)), ["Reshape"], ()),
    "fold-concat-3": (_mat(_reshape_to("Concat", _i64(1), _i64(2), _i64(3), axis=0)), ["Reshape"], ()),
    "fold-concat-4": (_mat(_reshape_to("Concat", _i64(3), _i64(1), _i64(2), _i64(1), axis=-1)), ["Reshape"], ()),
    "fold-slice-3": (_mat(_reshape_to("Slice", _i64(2, 3, 9), _i64(0), _i64(2))), ["Reshape"], ()),
    "fold-slice-4": (_mat(_reshape_to("Slice", _i64(9, 2, 3), _i64(1), _i64(5), _i64(0))), ["Reshape"], ()),
    "fold-slice-5": (_mat(_reshape_to("Slice", _i64(3, 9, 2), _i64(-1), _i64(-4), _i64(0), _i64(-2))),
                     ["Reshape"], ()),
    "fold-any": (_mat(_fold("Sin", _c(2, 3))), ["Add"], ()),
    "fold-castlike": (_mat(lambda b: b.op("Add", "x", b.op("CastLike", b.const(np.arange(3.0)), "x"))),
                      ["Add"], ()),
    "fold-range": (_mat(_reshape_to("Range", lambda b: b.const(np.array(2, I64)), lambda b: b.const(np.array(4, I64)),
                                    lambda b: b.const(np.array(1, I64)))), ["Reshape"], ()),
    "fold-concat-6": (_mat(_reshape_to("Concat", _i64(1), _i64(2), _i64(3), _i64(1), _i64(1), _i64(1), axis=0)),
                      ["Reshape"], ()),
    "fold-mod": (_mat(_reshape_to("Mod", _i64(-2, 7), _i64(4, 4))), ["Reshape"], ()),
    "pad-zero": (_mat(lambda b: b.op("Relu", b.op("Pad", "x", _i64(0, 0, 0, 0)(b)))), ["Relu"], ()),
    "pad-zero-value": (_mat(lambda b: b.op("Relu", b.op("Pad", "x", _i64(0, 0, 0, 0)(b), b.const(np.float32(1))))),
                       ["Relu"], ()),
    "dropout": (_mat(lambda b: b.op("Relu", b.op("Dropout", "x"))), ["Relu"], ()),
    "cast-noop": (_mat(lambda b: b.op("Relu", b.op("Cast", "x", to=1))), ["Relu"], ()),
    "fold-reshape-allowzero": (_mat(lambda b: b.op("Add", "x", b.op("Reshape", b.rand(6), _i64(2, 3)(b), allowzero=1))),
                               ["Add"], ()),
    "mul-out-const": (_mat(lambda b: b.op("MatMul", b.op("Mul", "x", b.op("Mul", b.op("Erf", "x"), b.const(np.float32(0.5)))),
                                          b.rand(3, 4))), ["Erf", "Mul", "MatMul"], ("matmul-scale-in",)),
    "mul-add-const": (_mat(lambda b: b.op("Mul", b.op("Add", b.op("MatMul", "x", b.rand(3, 4)), b.rand(4)), b.rand(4))),
                      ["MatMul", "Add"], ("matmul-scale-out",)),
    "transpose-scale": (_mat(lambda b: b.op("Mul", b.op("Transpose", b.op("MatMul", "x", b.rand(3, 4)), perm=[1, 0]),
                                            b.rand(4, 1))), ["MatMul", "Transpose"], ("matmul-scale-out",)),
    "mul-concat": (_img(_concat_of_convs("Mul", 5, lambda c: (1, c, 1, 1))), ["Conv"] * 5 + ["Concat"],
                   ("conv-bias-scale-out",)),
    "add-concat": (_img(_concat_of_convs("Add", 3, lambda c: (c, 1, 1))), ["Conv"] * 3 + ["Concat"],
                   ("conv-bias-add",)),
    "conv-add-conv": (_img(_branches(None)), ["Conv"], ("add-comm",)),
    "conv-add-conv-nobias": (_img(lambda b: b.op("Add", b.conv("x", 4, 4, k=1), b.conv("x", 4, 4, k=3))), ["Conv"],
                             ("add-comm",)),
    "conv-add-input": (_img(lambda b: b.op("Add", "x", b.conv("x", 4, 4, bias=True))), ["Conv"], ()),
    "conv-add-scaled-input": (_img(lambda b: b.op("Add", b.conv("x", 4, 4, bias=True), b.op("Mul", "x", _per_channel(b)))),
                              ["Conv"], ("add-comm",)),
    "conv-add-affine-input": (_img(_branches(lambda b: b.bn("x", 4))), ["Conv"],
                              ("conv-add-conv", "add-comm", "batchnorm")),
    "conv-scale-out": (_img(lambda b: b.op("Mul", b.conv("x", 4, 4), _per_channel(b))), ["Conv"], ()),
    "conv-bias-scale-out": (_img(lambda b: b.op("Mul", b.conv("x", 4, 4, bias=True), _per_channel(b))),
                            ["Conv"], ()),
    "conv-scale-in": (_img(lambda b: b.conv(b.op("Mul", "x", _per_channel(b)), 4, 4)), ["Conv"], ()),
    # On cpu a Slice is a copy: the merged MatMul matches but costs more, so the graph stays.
    "matmul-merge-2": (_mat(lambda b: b.op("Add", b.op("MatMul", "x", b.rand(3, 4)), b.op("MatMul", "x", b.rand(3, 4)))),
                       ["MatMul", "MatMul", "Add"], ()),
    "matmul-merge-3": (_mat(lambda b: b.op("Add", b.op("Add", *[b.op("MatMul", "x", b.rand(3, 4)) for _ in range(2)]),
                                           b.op("MatMul", "x", b.rand(3, 4)))),
                       ["MatMul", "MatMul", "Add", "MatMul", "Add"], ()),
    "matmul-bias-merge-2": (_mat(lambda b: b.op("Mul", *[b.op("Add", b.op("MatMul", "x", b.rand(3, 4)), b.rand(4))
                                                         for _ in range(2)])),
                            ["MatMul", "Add", "MatMul", "Add", "Mul"], ()),
    "matmul-bias-merge-3": (_mat(lambda b: b.op("Mul", b.op("Mul", *[b.op("Add", b.op("MatMul", "x", b.rand(3, 4)), b.rand(4))
                                                                     for _ in range(2)]),
                                                b.op("Add", b.op("MatMul", "x", b.rand(3, 4)), b.rand(4)))),
                            ["MatMul", "Add", "MatMul", "Add", "Mul", "MatMul", "Add", "Mul"], ()),
    "shape-same-shape": (_img(lambda b: b.op("Concat", b.op("Shape", "x"), b.op("Shape", b.op("Relu", "x")), axis=0)),
                         ["Shape", "Concat"], ()),
    "conv-bias-scale-in": (_img(lambda b: b.conv(b.op("Mul", "x", _per_channel(b)), 4, 4, bias=True)),
                           ["Conv"], ()),
    "relu-scale": (_img(lambda b: b.conv(b.op("Relu", b.op("Mul", "x", _per_channel(b, low=0.1))), 4, 4)),
                   ["Relu", "Conv"], ("conv-scale-in",)),
    "matmul-scale-out": (_mat(lambda b: b.op("Mul", b.op("MatMul", "x", b.rand(3, 4)), b.rand(4))),
                         ["MatMul"], ()),
    "matmul-bias": (_mat(lambda b: b.op("Add", b.op("MatMul", "x", b.rand(3, 4)), b.rand(1, 4))),
                    ["Gemm"], ()),
    "matmul-scale-in": (_mat(lambda b: b.op("MatMul", b.op("Mul", "x", b.rand(3)), b.rand(3, 4))),
                        ["MatMul"], ()),
    "gemm-scale-out": (_mat(_gemm(0, False, False)), ["Gemm"], ()),
    "gemm-t-scale-out": (_mat(_gemm(1, False, False)), ["Gemm"], ()),
    "gemm-bias-scale-out": (_mat(_gemm(0, True, False)), ["Gemm"], ()),
    "gemm-t-bias-scale-out": (_mat(_gemm(1, True, False)), ["Gemm"], ()),
    "gemm-scale-in": (_mat(_gemm(0, False, True)), ["Gemm"], ()),
    "gemm-t-scale-in": (_mat(_gemm(1, False, True)), ["Gemm"], ()),
    "gemm-bias-scale-in": (_mat(_gemm(0, True, True)), ["Gemm"], ()),
    "gemm-t-bias-scale-in": (_mat(_gemm(1, True, True)), ["Gemm"], ()),
    "slice-whole-3": (_mat(lambda b: b.op("Relu", b.op("Slice", "x", _i64(0)(b), _i64(2)(b)))), ["Relu"], ()),
    "slice-whole-4": (_mat(lambda b: b.op("Relu", b.op("Slice", "x", _i64(0)(b), _i64(2**62)(b), _i64(1)(b)))),
                      ["Relu"], ()),
    "slice-whole-5": (_mat(lambda b: b.op("Relu", b.op("Slice", "x", _i64(-3)(b), _i64(3)(b), _i64(-1)(b), _i64(1)(b)))),
                      ["Relu"], ()),
    "shape-slice-3": (_mat(_reshape_to("Slice", lambda b: b.op("Shape", "x"), _i64(0), _i64(2))), ["Reshape"], ()),
    "shape-slice-4": (_mat(_reshape_to("Slice", lambda b: b.op("Shape", "x"), _i64(0), _i64(2), _i64(0))),
                      ["Reshape"], ()),
    "shape-slice-5": (_mat(_reshape_to("Slice", lambda b: b.op("Shape", "x"), _i64(-1), _i64(-3), _i64(0), _i64(-1))),
                      ["Reshape"], ()),
    "reshape-known-target": (_mat(_reshape_to("Concat", lambda b: b.op("Unsqueeze", b.op(
        "Gather", b.op("Shape", "x"), b.const(np.array(0, I64)), axis=0), _i64(0)(b)), _i64(3), axis=0)),
                             ["Reshape"], ()),
    "fold-concat-5": (_mat(_reshape_to("Concat", _i64(1), _i64(2), _i64(1), _i64(3), _i64(1), axis=0)), ["Reshape"], ()),
    "matmul-bias-rows": (_img(lambda b: b.op("Reshape", b.op("Add", b.op("MatMul", "x", b.rand(8, 6)), b.rand(6)),
                                             _i64(8, 6)(b)), shape=(2, 4, 8)), ["Reshape", "Gemm"],
                         ("reshape-reshape", "reshape-same")),
    "unsqueeze-reshape": (_mat(lambda b: b.op("Relu", b.op("Unsqueeze", b.op("Reshape", "x", _i64(6)(b)), _i64(0)(b)))),
                          ["Reshape", "Relu"], ("reshape-reshape",)),
    "squeeze-reshape": (_mat(lambda b: b.op("Relu", b.op("Squeeze", b.op("Reshape", "x", _i64(1, 6)(b)), _i64(0)(b)))),
                        ["Reshape", "Relu"], ("reshape-reshape",)),
    "transpose-reshape": (_mat(lambda b: b.op("Relu", b.op("Transpose", b.op("Reshape", "x", _i64(1, 6)(b)),
                                                            perm=[1, 0]))), ["Reshape", "Relu"], ("reshape-reshape",)),
    "reshape-same": (_mat(lambda b: b.op("Relu", b.op("Reshape", "x", _i64(2, -1)(b)))), ["Relu"], ()),
    "reshape-same-allowzero": (_mat(lambda b: b.op("Relu", b.op("Reshape", "x", _i64(-1, 3)(b), allowzero=1))),
                               ["Relu"], ()),
    # GPT-2's MLP: a Reshape to rows, an elementwise op, a Reshape back: only the op stays.
    **{f"reshape-in-{op.lower()}": (_mat(_around_reshapes(lambda b, r, op=op: b.op(op, r))), [op], _MEET)
       for op in ("Tanh", "Erf", "Sigmoid", "Relu")},
    "reshape-in-mul": (_mat(_around_reshapes(lambda b, r: b.op("Mul", r, r))), ["Mul"], _MEET),
    "reshape-in-add": (_mat(_around_reshapes(lambda b, r: b.op("Add", r, r))), ["Add"], _MEET),
    **{f"reshape-in-{op.lower()}-scalar": (_mat(_around_reshapes(
        lambda b, r, op=op: b.op(op, r, b.const(np.array(2.0, np.float32))))), [op], _MEET)
       for op in ("Mul", "Add", "Pow")},
}


CASES.update(QUANT_CASES)


def test_every_standard_rule_has_a_case():
    assert sorted(RULES) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_standard_rule(name):
    (b, before), expected, others = CASES[name]
    rules = [RULES[name]] + [RULES[o] for o in others]
    after, report = optimize(before, rules)
    assert report.run.matches[name] > 0, f"{name} never matched"
    assert ops(after) == expected
    assert_same(before, after, b.sample())


def test_neg_neg_on_int8_keeps_its_wrapped_minimum():
    # Neg is shape arithmetic, rewritten on every dtype: int8 -128 negates to itself, twice too.
    from saturate.core.ir import Graph, Node, ValueInfo

    g = Graph(name="g", opset=17, inputs=["x"], outputs=["r"])
    g.values.update({v: ValueInfo("int8", (4,)) for v in ("x", "n", "r")})
    g.nodes += [Node("Neg", ["x"], ["n"], name="n1"), Node("Neg", ["n"], ["r"], name="n2")]
    after, report = optimize(g, [RULES["neg-neg"]])
    assert ops(after) == ["Identity"] and report.run.matches["neg-neg"] > 0   # the input is the output
    x = {"x": np.array([-128, -1, 0, 127], np.int8)}
    assert run_graph(after, x)["r"].tolist() == run_graph(g, x)["r"].tolist() == [-128, -1, 0, 127]


def test_a_unit_max_pool_whose_indices_are_read_stays():
    from saturate.core.ir import Graph, Node, ValueInfo

    g = Graph(name="g", opset=17, inputs=["x"], outputs=["r", "idx"])
    g.values.update({"x": ValueInfo("float32", (1, 2, 3, 3)), "y": ValueInfo("float32", (1, 2, 3, 3)),
                     "idx": ValueInfo("int64", (1, 2, 3, 3)), "r": ValueInfo("float32", (1, 2, 3, 3))})
    g.nodes += [Node("MaxPool", ["x"], ["y", "idx"], {"kernel_shape": [1, 1]}, name="pool"),
                Node("Relu", ["y"], ["r"], name="relu")]
    after, report = optimize(g, [RULES["maxpool-unit"]])
    assert ops(after) == ["MaxPool", "Relu"] and report.run.matches["maxpool-unit"] == 0


@pytest.mark.parametrize("name", ["mixnet_s-ts", "mixnet_s-dynamo"])
def test_mixnet_keeps_no_batch_norm(name):
    # Its mixed-kernel convs meet a batch-norm after Concats of up to 5 inputs (mul-concat and
    # add-concat split it into each conv, whatever the number of inputs).
    from saturate.frontend import corpus
    from saturate.frontend.onnx_io import import_model

    before = import_model(corpus.load_model(name))
    assert before.op_counts()["BatchNormalization"] > 0
    assert max(len(n.inputs) for n in before.nodes if n.op == "Concat") == 5
    after, report = optimize(before)
    assert after.op_counts()["BatchNormalization"] == 0
    assert report.run.matches["mul-concat"] > 0 and report.run.matches["add-concat"] > 0
