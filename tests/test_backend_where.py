"""C backend: Where as a pointwise select (bool condition held as 0.0f / 1.0f, broadcasting on every input,
float and integer operands), checked against ONNX Runtime and the reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from backend_util import rel_error
from saturate.core.ir import Graph, Node, ValueInfo

pytestmark = pytest.mark.compiler


def where_graph(shapes: dict, dtypes: dict, consts: dict | None = None, nodes: list[Node] | None = None,
                out: str = "y", out_dtype: str = "float32") -> Graph:
    """Where(c, a, b) over inputs of the given shapes and dtypes (constants in `consts`)."""
    g = Graph(inputs=list(shapes), outputs=[out], opset=17, name="where")
    for name, shape in shapes.items():
        g.values[name] = ValueInfo(dtypes.get(name, "float32"), tuple(shape))
    g.values[out] = ValueInfo(out_dtype, None)
    g.constants = {k: np.asarray(v) for k, v in (consts or {}).items()}
    g.nodes = nodes or [Node("Where", ["c", "a", "b"], ["y"], name="select")]
    return g


def feed(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name in graph.inputs:
        if name in graph.constants:
            continue
        info = graph.info(name)
        if info.dtype == "bool":
            out[name] = rng.integers(0, 2, info.shape).astype(bool)
        elif info.dtype.startswith("float"):
            out[name] = rng.standard_normal(info.shape).astype(info.dtype)
        else:
            lo, hi = np.iinfo(info.dtype).min, np.iinfo(info.dtype).max
            out[name] = rng.integers(lo, hi, info.shape, endpoint=True).astype(info.dtype)
    return out


def check(graph: Graph, threads: int = 1, c_ops: tuple = ("Where",), exact: bool = True, ort: bool = True):
    """Compile, run against ORT (where it has the kernel: `ort`) and the reference interpreter (`exact`: equal
    to the reference, as a graph of selects, views and exact products is), and check that the ops `c_ops` ran
    in C. Returns the model."""
    from saturate.backend import compile_graph
    from saturate.backend.bench import ort_session
    from saturate.interp.interpreter import run_graph

    model = compile_graph(graph, threads=threads)
    fell_back = {op for op, _, _ in model.fallback_ops}
    assert not fell_back & set(c_ops), model.partition.fallback
    x = feed(graph)
    got = model(x)
    wants = [run_graph(graph, x)]
    if ort:
        sess = ort_session(graph, threads)
        wants.append(dict(zip([o.name for o in sess.get_outputs()], sess.run(None, x))))
    for want in wants:
        for name in graph.outputs:
            ref = np.asarray(want[name])
            assert got[name].dtype == ref.dtype and got[name].shape == ref.shape, (got[name].dtype, ref.dtype)
            assert rel_error(got[name], ref.astype(np.float64)) <= 1e-4
            if exact:
                np.testing.assert_array_equal(got[name], ref)
    return model


@pytest.mark.parametrize("shapes", [
    {"c": (2, 3, 5), "a": (2, 3, 5), "b": (2, 3, 5)},
    {"c": (5,), "a": (2, 3, 5), "b": (2, 3, 5)},          # condition broadcast
    {"c": (2, 3, 5), "a": (3, 1), "b": (2, 3, 5)},        # first operand broadcast
    {"c": (2, 1, 5), "a": (2, 3, 5), "b": (1,)},          # second operand a scalar-like vector
    {"c": (1, 3, 1), "a": (2, 1, 5), "b": (2, 3, 1)},     # every input broadcast to a shape none has
])
def test_runtime_bool_condition_broadcast_on_each_input(shapes):
    check(where_graph(shapes, {"c": "bool"}))


def test_a_constant_condition_and_scalar_operand_join_the_matmul_epilogue():
    """GPT-2's causal mask: MatMul, scale, Where(tril, s, -3.4e38), Softmax; Where rides in the product's
    output loop, the Softmax runs on its rows in the same step, and the graph is one C step list with no
    interpreter piece."""
    rng = np.random.default_rng(1)
    consts = {"kT": rng.standard_normal((1, 2, 8, 16)).astype(np.float32), "scale": np.float32(8 ** 0.5),
              "tril": np.tril(np.ones((16, 16), bool)), "low": np.float32(-3.4e38)}
    nodes = [Node("MatMul", ["q", "kT"], ["s"]), Node("Div", ["s", "scale"], ["d"]),
             Node("Where", ["tril", "d", "low"], ["m"]), Node("Softmax", ["m"], ["y"], {"axis": -1})]
    g = where_graph({"q": (1, 2, 16, 8)}, {}, consts, nodes)
    for threads in (1, 2):
        model = check(g, threads, exact=False)
    assert [p.kind for p in model.partition.pieces] == ["c"]
    steps = model.emitted.plan.steps
    assert [(s.anchor.op, [n.op for n in s.chain], s.softmax.op) for s in steps] == [("MatMul", ["Div", "Where"],
                                                                                      "Softmax")]


def test_the_chain_value_may_be_either_operand_or_the_condition():
    consts = {"k": np.float32(2.0)}
    nodes = [Node("Mul", ["x", "k"], ["t"]), Node("Where", ["c", "z", "t"], ["u"]),  # chain value second
             Node("Add", ["u", "x"], ["y"])]
    check(where_graph({"c": (4, 6), "x": (4, 6), "z": (6,)}, {"c": "bool"}, consts, nodes), c_ops=("Where", "Mul"))
    nodes = [Node("Not", ["c"], ["n"]), Node("Where", ["n", "x", "z"], ["y"])]  # the condition from the interpreter
    check(where_graph({"c": (4, 6), "x": (4, 6), "z": (4, 1)}, {"c": "bool"}, None, nodes))


def test_a_bool_mask_is_viewed_and_cast_in_c():
    """An attention mask's bool reshaped on its way to Where, and a bool cast to float32, stay in C."""
    consts = {"ax": np.array([1], np.int64)}
    nodes = [Node("Unsqueeze", ["c", "ax"], ["cu"]), Node("Where", ["cu", "x", "z"], ["w"]),
             Node("Cast", ["c"], ["cf"], {"to": 1}), Node("Unsqueeze", ["cf", "ax"], ["cfu"]),
             Node("Mul", ["w", "cfu"], ["y"])]
    check(where_graph({"c": (2, 8), "x": (2, 3, 8), "z": (1,)}, {"c": "bool"}, consts, nodes),
          c_ops=("Where", "Unsqueeze", "Cast", "Mul"))


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16", "bool"])
def test_integer_and_bool_operands_held_exactly(dtype):
    model = check(where_graph({"c": (3, 7), "a": (3, 7), "b": (7,)}, {"c": "bool", "a": dtype, "b": dtype},
                              out_dtype=dtype), ort=dtype in ("int8", "uint8"))  # ORT has no Where of the others
    assert model.partition.dtypes["y"] == dtype


def test_integer_constants_float32_holds_exactly_run_in_c():
    consts = {"a": np.arange(-12, 12, dtype=np.int64).reshape(4, 6) * 1000, "b": np.array(2**24, np.int64)}
    model = check(where_graph({"c": (4, 6)}, {"c": "bool"}, consts, out_dtype="int64"))
    assert model.partition.dtypes["y"] == "int64"


@pytest.mark.parametrize("why, shapes, dtypes, consts", [
    ("float32 holds exactly", {"c": (4,)}, {"c": "bool"}, {"a": np.full(4, 2**24 + 1, np.int64), "b": np.int64(0)}),
    ("float32 holds exactly", {"c": (4,), "a": (4,), "b": (4,)}, {"c": "bool", "a": "int64", "b": "int64"}, {}),
    ("float32 holds exactly", {"c": (4,), "a": (4,), "b": (4,)}, {"c": "bool", "a": "float64", "b": "float64"}, {}),
])
def test_what_c_cannot_hold_exactly_runs_in_the_interpreter(why, shapes, dtypes, consts):
    from saturate.backend import compile_graph

    g = where_graph(shapes, dtypes, consts, out_dtype=dtypes.get("a", "int64"))
    model = compile_graph(g)
    (node, reason), = model.partition.fallback
    assert node.op == "Where" and why in reason, reason
    x = feed(g)
    np.testing.assert_array_equal(model(x)["y"], np.where(x["c"], consts.get("a", x.get("a")), consts.get("b", x.get("b"))))
