"""IR: topological order, dead-code removal, validation, structural equality."""

import numpy as np
import pytest

from saturate.core.errors import SaturateError
from saturate.core.ir import Graph, Node, ValueInfo, graph_differences, structurally_equal


def diamond() -> Graph:
    g = Graph(inputs=["x"], outputs=["y", "z"])
    g.values["x"] = ValueInfo("float32", (1, 4))
    g.constants["c"] = np.ones((1, 4), np.float32)
    g.nodes = [
        Node("Add", ["a", "b"], ["y"], name="join"),
        Node("Relu", ["x"], ["a"], name="left"),
        Node("Mul", ["x", "c"], ["b"], name="right"),
        Node("Neg", ["x"], ["dead"], name="unused"),
        Node("Sigmoid", ["a"], ["z"], name="second_use"),
    ]
    return g


def test_toposort_orders_producers_first():
    g = diamond()
    g.toposort()
    order = [n.name for n in g.nodes]
    assert order.index("left") < order.index("join")
    assert order.index("right") < order.index("join")
    assert order.index("left") < order.index("second_use")
    g.validate()


def test_toposort_handles_deep_chains():
    g = Graph(inputs=["v0"], outputs=["v5000"])
    g.nodes = [Node("Relu", [f"v{i}"], [f"v{i + 1}"]) for i in reversed(range(5000))]
    g.toposort()
    assert [n.outputs[0] for n in g.nodes][:3] == ["v1", "v2", "v3"]


def test_cycle_is_a_clean_error():
    g = Graph(inputs=["x"], outputs=["b"])
    g.nodes = [Node("Add", ["x", "b"], ["a"], name="n1"), Node("Relu", ["a"], ["b"], name="n2")]
    with pytest.raises(SaturateError, match="cycle"):
        g.toposort()


def test_remove_dead_keeps_shared_nodes():
    g = diamond()
    g.toposort()
    g.remove_dead()
    assert sorted(n.name for n in g.nodes) == ["join", "left", "right", "second_use"]
    assert "c" in g.constants


def test_validate_reports_undefined_input():
    g = Graph(inputs=["x"], outputs=["y"], nodes=[Node("Add", ["x", "nope"], ["y"], name="n")])
    with pytest.raises(SaturateError, match="node 'n' \\(Add\\) reads 'nope'"):
        g.validate()


def test_copy_is_deep_and_equal():
    g = diamond()
    h = g.copy()
    assert structurally_equal(g, h)
    h.constants["c"][0, 0] = 5
    assert graph_differences(g, h) == ["constant 'c' differs"]
