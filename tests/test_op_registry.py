"""Tests for the op registry (saturate.ops): its entries agree with the stages that read them,
and a toy op added as one entry is rewritten to, checked, optimized, interpreted and compiled."""

from __future__ import annotations


import numpy as np
import onnx.defs
import pytest

from saturate.core.ir import Graph, Node, ValueInfo
from saturate.ops.schema import op_table, spec
from saturate.interp.interpreter import run_graph
from saturate.ops import OpDef, entries, find, flops, infer_type, lookup, numel, ops_with, registered

TOY = "ai.saturate.toy"
CUBE_RULE = "ruleset toy level 1\nrule cube Mul(x, Mul(x, x)) => Cube(x)\n"


def cube(evaluate=lambda node, x: x * x * x) -> OpDef:
    """The toy op: x cubed, elementwise, in a domain of its own."""
    return OpDef("Cube", domain=TOY, inputs=(1, 1), elementwise=True,
                 evaluate=evaluate, arity=(1, 1),
                 flops=lambda attrs, ins, out: 2 * numel(out),
                 draw="unary", c="unary",
                 c_expr=lambda node, args, operand, graph: f"{args[0]} * {args[0]} * {args[0]}")


def cube_graph() -> Graph:
    values = {"x": ValueInfo("float32", (2, 8)), "y": ValueInfo("float32", (2, 8))}
    return Graph(inputs=["x"], outputs=["y"], values=values,
                 nodes=[Node("Mul", ["x", "x"], ["sq"], name="square"), Node("Mul", ["x", "sq"], ["y"], name="cube")])


def feed() -> dict[str, np.ndarray]:
    return {"x": np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)}


@pytest.fixture
def rules_file(tmp_path):
    path = tmp_path / "toy.rules"
    path.write_text(CUBE_RULE)
    return path


# ---- the entries --------------------------------------------------------------------------

def test_every_standard_entry_names_an_onnx_op():
    onnx_ops = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain in ("", "ai.onnx")}
    assert {d.name for d in entries() if d.standard} <= onnx_ops


def test_kernel_arity_lies_within_the_schema():
    for d in entries():
        if d.evaluate is None or not d.standard:
            continue
        s = op_table()[d.name]
        assert s.min_inputs <= d.arity[0] and d.arity[1] <= s.max_inputs, d.name


def test_flags_reach_the_schema_facts():
    assert spec("Add").elementwise and spec("Add").any_dtype
    assert not spec("Conv").elementwise
    assert "Add" in ops_with("commutative") and "Sub" not in ops_with("commutative")


def test_shape_and_cost_come_from_the_entry():
    x, w = ValueInfo("float32", (1, 3, 8, 8)), ValueInfo("float32", (4, 3, 3, 3))
    out = infer_type("Conv", {"pads": [1, 1, 1, 1]}, [x, w])
    assert out == ValueInfo("float32", (1, 4, 8, 8))
    assert flops("Conv", {}, [x, w], out) == 2 * numel(out) * 27
    assert flops("Reshape", {}, [x], x) == 0
    assert infer_type("Add", {}, [ValueInfo("float32", (2, 1)), ValueInfo("float32", (3,))]).shape == (2, 3)
    assert infer_type("NoSuchOp", {}, [x]) is None


def test_the_c_hooks_cover_every_op_the_backend_claims():
    pytest.importorskip("saturate.backend.pointwise")  # the backend attaches its hooks on import

    for d in entries():
        if d.c in ("unary", "binary"):
            assert d.c_expr is not None, d.name
        if d.c == "kernel" and not d.same_shape:
            assert d.c_shape is not None, d.name
        assert not (d.c_vec and not d.c_expr), d.name


def test_every_drawn_op_can_be_evaluated():
    from saturate.interp.reference import reference_ops
    from saturate.ops.schema import newest_opset

    runnable = reference_ops(newest_opset())
    for d in entries():
        if d.draw is not None:
            assert d.evaluate is not None or d.name in runnable, d.name


def test_registration_is_undone_after_the_block():
    with registered(cube()) as (entry,):
        assert lookup("Cube", TOY) is entry and find("Cube") is entry
        assert spec("Cube", domain=TOY).elementwise
        assert "Cube" in op_table() and "Cube" in ops_with("c", "unary")
    assert lookup("Cube", TOY) is None and "Cube" not in op_table() and "Cube" not in ops_with("c", "unary")


def test_a_second_entry_for_one_op_is_refused():
    with registered(cube()):
        with pytest.raises(ValueError, match="already registered"):
            with registered(cube()):
                pass
    assert lookup("Cube", TOY) is None


def test_an_op_outside_onnx_states_its_inputs():
    with pytest.raises(ValueError, match="states its inputs"):
        with registered(OpDef("Cube", domain=TOY)):
            pass


# ---- a toy op through every stage --------------------------------------------------------

def test_rule_rewrites_to_the_toy_op_and_the_interpreter_runs_it(rules_file):
    from saturate.pipeline import optimize

    with registered(cube()):
        out, report = optimize(cube_graph(), rules=[rules_file])
        assert [(n.op, n.domain) for n in out.nodes] == [("Cube", TOY)]
        assert report.run.matches["cube"] >= 1
        got = run_graph(out, feed())["y"]
    x = feed()["x"]
    np.testing.assert_allclose(got, x * x * x, rtol=1e-6)


def test_check_passes_the_rule_and_catches_a_wrong_kernel(rules_file):
    from saturate.check import check_rules
    from saturate.lang.parser import load_rules

    with registered(cube()):
        [ok] = check_rules(load_rules([str(rules_file)]), examples=30, seed=1, jobs=1)
    assert ok.status == "PASS", ok
    with registered(cube(evaluate=lambda node, x: x * x)):
        [bad] = check_rules(load_rules([str(rules_file)]), examples=30, seed=1, jobs=1)
    assert bad.status == "FAIL", bad


def test_check_workers_leave_an_op_registered_at_run_time_to_this_process(rules_file):
    """Check workers import saturate.ops afresh and would not know Cube, or know another kernel:
    with jobs > 1 the toy's rule is still checked against the kernel registered here."""
    from saturate.check import check_rules
    from saturate.lang.parser import load_rules

    text = CUBE_RULE + "rule identity Identity(x) => x\nrule neg-neg Neg(Neg(x)) => x\n"
    rules_file.write_text(text)
    with registered(cube()):
        ok = check_rules(load_rules([str(rules_file)]), examples=20, seed=1, jobs=2)
    with registered(cube(evaluate=lambda node, x: x * x)):
        bad = check_rules(load_rules([str(rules_file)]), examples=20, seed=1, jobs=2)
    assert [r.status for r in ok] == ["PASS", "PASS", "PASS"], ok
    assert [r.status for r in bad] == ["FAIL", "PASS", "PASS"], bad


def test_rules_without_the_entry_do_not_know_the_op(rules_file):
    from saturate.core.errors import SaturateError
    from saturate.lang.parser import load_rules

    with pytest.raises(SaturateError, match="unknown op 'Cube'"):
        load_rules([str(rules_file)])


PRODUCT_RULE = "ruleset toy level 1\nrule cube-product Mul(Cube(x), Cube(y)) => Cube(Mul(x, y))\n"


def cubes_graph(domain: str = TOY) -> Graph:
    """Cube(x) * Cube(y), the cubes written in `domain`."""
    values = {v: ValueInfo("float32", (2, 8)) for v in ("x", "y", "a", "b", "z")}
    return Graph(inputs=["x", "y"], outputs=["z"], values=values,
                 nodes=[Node("Cube", ["x"], ["a"], name="cube_x", domain=domain),
                        Node("Cube", ["y"], ["b"], name="cube_y", domain=domain),
                        Node("Mul", ["a", "b"], ["z"], name="product")])


def test_rules_rewrite_from_a_registered_op_of_another_domain(tmp_path):
    """A model's nodes of a registered op outside ONNX are terms rules match, not opaque nodes."""
    from saturate.check import check_rules
    from saturate.lang.parser import load_rules
    from saturate.pipeline import optimize

    path = tmp_path / "product.rules"
    path.write_text(PRODUCT_RULE)
    rng = np.random.default_rng(0)
    feeds = {v: rng.standard_normal((2, 8)).astype(np.float32) for v in ("x", "y")}
    with registered(cube()):
        out, report = optimize(cubes_graph(), rules=[path])
        assert sorted((n.op, n.domain) for n in out.nodes) == [("Cube", TOY), ("Mul", "")]
        assert report.run.matches["cube-product"] >= 1
        got = run_graph(out, feeds)["z"]
        [result] = check_rules(load_rules([str(path)]), examples=30, seed=1, jobs=1)
        wrong = tmp_path / "wrong.rules"
        wrong.write_text(PRODUCT_RULE.replace("Cube(Mul(x, y))", "Cube(Add(x, y))"))
        [caught] = check_rules(load_rules([str(wrong)]), examples=30, seed=1, jobs=1)
    assert result.status == "PASS", result
    assert caught.status == "FAIL", caught
    np.testing.assert_allclose(got, (feeds["x"] * feeds["y"]) ** 3, rtol=1e-4)


def test_a_registered_op_under_an_onnx_name_stays_opaque_in_its_domain():
    """E-nodes carry names: a Relu of another domain would read as ONNX's Relu, so it is opaque."""
    from saturate.engine.encode import encode_graph

    relu = OpDef("Relu", domain=TOY, inputs=(1, 1), evaluate=lambda node, x: np.abs(x), arity=(1, 1))
    values = {v: ValueInfo("float32", (2, 8)) for v in ("x", "r", "c")}
    graph = Graph(inputs=["x"], outputs=["r", "c"], values=values,
                  nodes=[Node("Relu", ["x"], ["r"], domain=TOY), Node("Cube", ["x"], ["c"], domain=TOY)])
    with registered(relu, cube()):
        enc = encode_graph(graph, rule_ops={"Relu", "Cube"})
    assert [n.op for n in enc.opaque_nodes] == ["Relu"]


def test_a_model_file_with_the_op_is_typed_past_it_and_rewritten(tmp_path):
    """ONNX's inference stops at an op it does not know: the entry types the op's output, and
    ONNX's node inference the standard ops after it, so costs see shapes and the rule pays."""
    from onnx import TensorProto, helper

    from saturate.frontend.onnx_export import export_model
    from saturate.frontend.onnx_io import import_model
    from saturate.pipeline import optimize

    path = tmp_path / "product.rules"
    path.write_text(PRODUCT_RULE)
    nodes = [helper.make_node("Cube", ["x"], ["a"], domain=TOY), helper.make_node("Cube", ["y"], ["b"], domain=TOY),
             helper.make_node("Mul", ["a", "b"], ["m"]), helper.make_node("Relu", ["m"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(v, TensorProto.FLOAT, [2, 8]) for v in "xy"],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(TOY, 1)])
    rng = np.random.default_rng(0)
    feeds = {v: rng.standard_normal((2, 8)).astype(np.float32) for v in ("x", "y")}
    with registered(cube()):
        g = import_model(model)
        assert {v: g.values[v] for v in "abm"} == {v: ValueInfo("float32", (2, 8)) for v in "abm"}
        out, _ = optimize(g, rules=[path])
        assert sorted(n.op for n in out.nodes) == ["Cube", "Mul", "Relu"]
        exported = export_model(out)
        got = run_graph(import_model(exported), feeds)["z"]
    assert {(o.domain, o.version) for o in exported.opset_import} >= {("", 17), (TOY, 1)}
    np.testing.assert_allclose(got, np.maximum((feeds["x"] * feeds["y"]) ** 3, 0), rtol=1e-4)
    assert "a" not in import_model(model).values     # unregistered: ONNX's inference as it stands


def test_a_node_of_another_domain_under_a_registered_name_stays_opaque(tmp_path):
    """Rules name ops without domains: a Cube of a domain not registered is not the toy's Cube."""
    from saturate.pipeline import optimize

    path = tmp_path / "product.rules"
    path.write_text(PRODUCT_RULE)
    with registered(cube()):
        out, report = optimize(cubes_graph("com.example.other"), rules=[path])
    assert sorted((n.op, n.domain) for n in out.nodes) == [("Cube", "com.example.other")] * 2 + [("Mul", "")]
    assert not report.run.matches.get("cube-product")


@pytest.mark.compiler
def test_the_c_backend_compiles_the_toy_op(rules_file):
    from saturate import compile_graph
    from saturate.pipeline import optimize

    with registered(cube()):
        out, _ = optimize(cube_graph(), rules=[rules_file])
        model = compile_graph(out)
        assert [p.kind for p in model.partition.pieces] == ["c"]
        got = model(feed())["y"]
    x = feed()["x"]
    np.testing.assert_allclose(got, x * x * x, rtol=1e-6)


@pytest.mark.compiler
def test_the_toy_op_rides_a_conv_as_its_epilogue(rules_file):
    """An op registered after the backend was imported still fuses into the kernel before it."""
    import saturate.backend.plan  # noqa: F401  (imported before the op is registered)
    from saturate import compile_graph
    from saturate.pipeline import optimize

    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    graph = Graph(inputs=["x"], outputs=["y"], constants={"w": w},
                  values={"x": ValueInfo("float32", (1, 3, 8, 8)), "w": ValueInfo("float32", w.shape),
                          "c": ValueInfo("float32", (1, 4, 6, 6)), "y": ValueInfo("float32", (1, 4, 6, 6))},
                  nodes=[Node("Conv", ["x", "w"], ["c"], name="conv"),
                         Node("Mul", ["c", "c"], ["sq"], name="square"), Node("Mul", ["c", "sq"], ["y"], name="cube")])
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    with registered(cube()):
        out, _ = optimize(graph, rules=[rules_file])
        assert [n.op for n in out.nodes] == ["Conv", "Cube"]
        model = compile_graph(out)
        steps = model.segments[0].emitted.plan.steps
        assert [[n.op for n in s.nodes()] for s in steps] == [["Conv", "Cube"]]
        got = model({"x": x})["y"]
    want = run_graph(graph, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
