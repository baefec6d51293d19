"""C backend: a product's epilogue that reads a value of its own chain again (GELU's x * f(x), erf and tanh forms
as exporters write them) runs in the product's step, the value kept in a local; values read outside the
chain are still written. Checked against ONNX Runtime and the reference interpreter."""

from __future__ import annotations

import math

import numpy as np
import pytest

from backend_util import check_three_way, make
from saturate.backend.emit import emit
from saturate.core.ir import Node

pytestmark = pytest.mark.compiler


def arr(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def scalar(v: float) -> np.ndarray:
    return np.array(v, np.float32)


def erf_gelu(tokens: tuple) -> tuple[list[Node], dict, dict]:
    """BERT's: MatMul + bias, then x * 0.5 * (1 + erf(x / sqrt 2)) (the Mul by 0.5 last)."""
    nodes = [Node("MatMul", ["x", "w"], ["m"]), Node("Add", ["m", "b"], ["h"]), Node("Div", ["h", "r2"], ["d"]),
             Node("Erf", ["d"], ["e"]), Node("Add", ["e", "one"], ["e1"]), Node("Mul", ["h", "e1"], ["g"]),
             Node("Mul", ["g", "half"], ["y"])]
    consts = {"w": arr(1, (96, 150)) * np.float32(0.2), "b": arr(2, (150,)), "r2": scalar(math.sqrt(2.0)),
              "one": scalar(1.0), "half": scalar(0.5)}
    return nodes, {"x": (*tokens, 96)}, consts


def tanh_gelu(rows: int) -> tuple[list[Node], dict, dict]:
    """GPT-2's, on a Gemm with transB: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), x read three times."""
    nodes = [Node("Gemm", ["x", "w", "b"], ["h"], {"transB": 1}), Node("Pow", ["h", "three"], ["p"]),
             Node("Mul", ["p", "c"], ["pc"]), Node("Add", ["h", "pc"], ["s"]), Node("Mul", ["s", "k"], ["sk"]),
             Node("Tanh", ["sk"], ["t"]), Node("Add", ["t", "one"], ["t1"]), Node("Mul", ["h", "t1"], ["g"]),
             Node("Mul", ["g", "half"], ["y"])]
    consts = {"w": arr(3, (70, 64)) * np.float32(0.2), "b": arr(4, (70,)), "three": scalar(3.0),
              "c": scalar(0.044715), "k": scalar(math.sqrt(2.0 / math.pi)), "one": scalar(1.0), "half": scalar(0.5)}
    return nodes, {"x": (rows, 64)}, consts


def steps(g) -> list[str]:
    return ["+".join(n.op for n in s.nodes()) for s in emit(g).plan.steps]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", ["erf 37", "erf 2x16", "tanh 16", "tanh 9"])
def test_gelu_runs_in_the_products_epilogue(case, threads):
    kind, shape = case.split()
    dims = tuple(int(d) for d in shape.split("x"))
    nodes, inputs, consts = erf_gelu((1, *dims) if len(dims) == 1 else dims) if kind == "erf" else tanh_gelu(dims[0])
    g = make(nodes, inputs, consts)
    assert len(steps(g)) == 1, steps(g)
    check_three_way(g, threads=threads)


def test_a_residual_of_the_chain_value_closes_too():
    # y = h + relu(h): the Add reads the product's value and the chain's
    nodes = [Node("MatMul", ["x", "w"], ["h"]), Node("Relu", ["h"], ["r"]), Node("Add", ["r", "h"], ["y"])]
    g = make(nodes, {"x": (20, 48)}, {"w": arr(5, (48, 40))})
    assert steps(g) == ["MatMul+Relu+Add"]
    check_three_way(g)


@pytest.mark.parametrize("variant", ["output", "branches"])
def test_values_read_outside_the_chain_stay_written(variant):
    nodes, inputs, consts = erf_gelu((1, 12))
    outputs = None
    if variant == "output":  # the product's value is a graph output too
        outputs = ["y", "h"]
    else:  # two chains from the product that never meet
        nodes = [Node("MatMul", ["x", "w"], ["h"]), Node("Relu", ["h"], ["a"]), Node("Sigmoid", ["h"], ["y"])]
        inputs, consts, outputs = {"x": (1, 12, 96)}, {"w": consts["w"]}, ["a", "y"]
    g = make(nodes, inputs, consts, outputs=outputs)
    assert len(steps(g)) > 1, steps(g)
    check_three_way(g)
