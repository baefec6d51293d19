"""Control flow (If, Loop, Scan): the optimizer keeps every outer value a subgraph reads alive and
correct under the name the optimized graph gives it, the interpreter runs them per ONNX, and a
hostile subgraph gets one line. Every result is held against ONNX Runtime."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import AttributeProto, TensorProto as T, helper as h, numpy_helper

from saturate.core.errors import MemoryLimitError, SaturateError
from saturate.core.limits import lowered
from saturate.frontend.onnx_io import check_exported, export_model, import_model
from saturate.frontend.onnx_scope import MAX_DEPTH, subgraph_reads
from saturate.interp import run_graph
from saturate.interp.sequences import is_sequence
from saturate.pipeline import optimize

F = T.FLOAT


def vi(name, shape, elem=F):
    return h.make_tensor_value_info(name, elem, shape)


def const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def model(nodes, inputs, outputs, inits=(), opset=17):
    m = h.make_model(h.make_graph(nodes, "g", inputs, outputs, list(inits)), opset_imports=[h.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def ort_run(m: onnx.ModelProto, feed: dict) -> list:
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feed.items() if k in names})


def close(got, want) -> None:
    if isinstance(want, list):
        assert is_sequence(got) and len(got) == len(want)
        for g, w in zip(got, want):
            close(g, w)
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def optimized(m: onnx.ModelProto) -> onnx.ModelProto:
    """The model optimized and exported, checked as the CLI checks what it writes."""
    result, _ = optimize(import_model(m))
    check_exported(result, export_model(result, weights=False))
    return export_model(result)


def agree(m: onnx.ModelProto, feeds: list[dict]) -> onnx.ModelProto:
    """The model, optimized, and both run by the interpreter, equal to ONNX Runtime on each feed."""
    out = optimized(m)
    names = [o.name for o in m.graph.output]
    for feed in feeds:
        want = ort_run(m, feed)
        for candidate in (m, out):
            got = run_graph(import_model(candidate), feed)
            for name, w in zip(names, want):
                close(got[name], w)
        for got, w in zip(ort_run(out, feed), want):
            close(got, w)
    return out


def branch(name, nodes, out, shape=(4,)):
    return h.make_graph(nodes, name, [], [vi(out, list(shape))])


def if_model(reads_from):
    """cond = sum(x) > 0; then: t * t, else: -t, where t = x + c1 + c2 (c1, c2 constants)."""
    then_g = branch("then", [h.make_node("Mul", [reads_from, reads_from], ["o1"])], "o1")
    else_g = branch("else", [h.make_node("Neg", [reads_from], ["o2"])], "o2")
    nodes = [h.make_node("Add", ["x", "c1"], ["a"]), h.make_node("Add", ["a", "c2"], ["t"]),
             h.make_node("Add", ["c1", "c2"], ["k"]),
             h.make_node("ReduceSum", ["x"], ["s"], keepdims=0), h.make_node("Greater", ["s", "zero"], ["cond"]),
             h.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)]
    return model(nodes, [vi("x", [4])], [vi("y", [4])],
                 [const("c1", np.full(4, 1, np.float32)), const("c2", np.full(4, 2, np.float32)),
                  const("zero", np.float32(0))])


X = np.float32([0.5, -1.0, 2.0, 0.25])
BOTH_BRANCHES = [{"x": X}, {"x": -X}]


def subgraph(m: onnx.ModelProto, op: str, attr: str) -> onnx.GraphProto:
    node = next(n for n in m.graph.node if n.op_type == op)
    return next(a.g for a in node.attribute if a.name == attr)


# ---- the optimizer ----------------------------------------------------------------------------------

def test_if_reading_an_outer_value_optimizes_and_runs():
    m = if_model("t")
    graph = import_model(m)
    node = next(n for n in graph.nodes if n.op == "If")
    assert subgraph_reads(node) == ("t",) and node.inputs == ["cond", "t"]
    out = agree(m, BOTH_BRANCHES)
    # The two constant adds became one, and the If reads t under whatever name it now has.
    assert [n.op_type for n in out.graph.node].count("Add") == 1
    (producer,) = [n for n in out.graph.node if n.op_type == "Add"]
    assert subgraph(out, "If", "then_branch").node[0].input == [producer.output[0]] * 2
    assert [i for i in next(n for n in out.graph.node if n.op_type == "If").input] == ["cond"]


def test_a_value_folded_to_a_constant_is_read_from_its_initializer():
    m = if_model("k")         # k = c1 + c2: folded
    out = agree(m, BOTH_BRANCHES)
    read = subgraph(out, "If", "else_branch").node[0].input[0]
    assert read in {t.name for t in out.graph.initializer}
    np.testing.assert_array_equal(numpy_helper.to_array(next(t for t in out.graph.initializer if t.name == read)),
                                  np.full(4, 3, np.float32))


def test_a_merged_duplicate_is_read_under_the_surviving_name():
    # r2 computes what r1 does: the optimizer keeps one, and the branch reads that one.
    then_g = branch("then", [h.make_node("Mul", ["r2", "r1"], ["o1"])], "o1")
    else_g = branch("else", [h.make_node("Neg", ["r2"], ["o2"])], "o2")
    nodes = [h.make_node("Relu", ["x"], ["r1"]), h.make_node("Relu", ["x"], ["r2"]),
             h.make_node("ReduceSum", ["x"], ["s"], keepdims=0), h.make_node("Greater", ["s", "zero"], ["cond"]),
             h.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)]
    m = model(nodes, [vi("x", [4])], [vi("y", [4])], [const("zero", np.float32(0))])
    out = agree(m, BOTH_BRANCHES)
    (relu,) = [n for n in out.graph.node if n.op_type == "Relu"]
    assert list(subgraph(out, "If", "then_branch").node[0].input) == [relu.output[0]] * 2


def loop_with_if(outer_read="t"):
    """A Loop (trip count M) whose body holds an If whose branch reads `t` of the top graph (two
    levels up) and `acc` of the body; a scan output collects each iteration's value."""
    then_g = branch("then", [h.make_node("Add", ["acc", outer_read], ["b1"])], "b1")
    else_g = branch("else", [h.make_node("Sub", ["acc", outer_read], ["b2"])], "b2")
    body = h.make_graph(
        [h.make_node("Cast", ["i"], ["fi"], to=F), h.make_node("Greater", ["fi", "one"], ["big"]),
         h.make_node("If", ["big"], ["acc_next"], then_branch=then_g, else_branch=else_g),
         h.make_node("Identity", ["cond_in"], ["cond_out"]), h.make_node("Mul", ["acc_next", "fi"], ["scanned"])],
        "body", [vi("i", [], T.INT64), vi("cond_in", [], T.BOOL), vi("acc", [4])],
        [vi("cond_out", [], T.BOOL), vi("acc_next", [4]), vi("scanned", [4])], [const("one", np.float32(1))])
    nodes = [h.make_node("Add", ["x", "c1"], ["a"]), h.make_node("Add", ["a", "c2"], ["t"]),
             h.make_node("Add", ["c1", "c2"], ["k"]),
             h.make_node("Loop", ["M", "", "x"], ["final", "all"], body=body)]
    return model(nodes, [vi("x", [4]), vi("M", [], T.INT64)], [vi("final", [4]), vi("all", [None, 4])],
                 [const("c1", np.full(4, 1, np.float32)), const("c2", np.full(4, 2, np.float32))])


@pytest.mark.parametrize("outer_read", ["t", "k"])
def test_nested_subgraphs_read_values_two_levels_up(outer_read):
    m = loop_with_if(outer_read)
    loop = next(n for n in import_model(m).nodes if n.op == "Loop")
    assert loop.inputs[-1] == outer_read and subgraph_reads(loop) == (outer_read,)
    agree(m, [{"x": X, "M": np.array(m_, np.int64)} for m_ in (0, 1, 4)])


def rename(graph, old: str, new: str) -> None:
    for n in graph.nodes:
        n.inputs = [new if i == old else i for i in n.inputs]
        n.outputs = [new if o == old else o for o in n.outputs]
    graph.outputs = [new if o == old else o for o in graph.outputs]
    if old in graph.values:
        graph.values[new] = graph.values.pop(old)


@pytest.mark.parametrize("new_name", ["o1", "b1", "acc", "i", "fi", "one"])
def test_a_subgraph_name_an_outer_value_takes_is_renamed_inside(new_name):
    # The outer value the subgraphs read is renamed to a name a subgraph defines itself (an input,
    # an initializer, a node's output, at either depth): the subgraph's own value gives way, so it
    # neither hides the outer one nor breaks ONNX's single assignment.
    m = loop_with_if("t")
    graph = import_model(m)
    rename(graph, "t", new_name)
    check_exported(graph, export_model(graph, weights=False))
    out = export_model(graph)
    for m_ in (1, 4):
        feed = {"x": X, "M": np.array(m_, np.int64)}
        for got, want in zip(ort_run(out, feed), ort_run(m, feed)):
            close(got, want)
        close(run_graph(import_model(out), feed)["final"], ort_run(m, feed)[0])


@pytest.mark.parametrize("op", ["Relu", "Identity"])
def test_a_subgraph_input_may_shadow_an_outer_name(op):
    # ONNX lets a body's input hide an outer value of its name: the body reads its own. Once the
    # optimizer drops t = Identity(x), the body reads the outer x its own input x hides: that
    # input gives way.
    body = h.make_graph([h.make_node("Identity", ["c"], ["c_out"]), h.make_node("Add", ["x", "t"], ["x_out"])],
                        "body", [vi("i", [], T.INT64), vi("c", [], T.BOOL), vi("x", [4])],
                        [vi("c_out", [], T.BOOL), vi("x_out", [4])])
    m = model([h.make_node(op, ["x"], ["t"]), h.make_node("Loop", ["M", "", "x"], ["y"], body=body)],
              [vi("x", [4]), vi("M", [], T.INT64)], [vi("y", [4])])
    out = agree(m, [{"x": X, "M": np.array(3, np.int64)}])
    if op == "Identity":
        assert [n.op_type for n in out.graph.node] == ["Loop"]
        assert list(subgraph(out, "Loop", "body").node[1].input) == ["x_1", "x"]


# ---- the interpreter ----------------------------------------------------------------------------------

def counting_loop(inputs, opset=17):
    """Body: cond_out = i < 2 (stops after iteration 2), x_out = x + 1, scan = x."""
    body = h.make_graph([h.make_node("Less", ["i", "two"], ["cond_out"]),
                         h.make_node("Add", ["x", "f1"], ["x_out"]), h.make_node("Identity", ["x"], ["s"])], "body",
                        [vi("i", [], T.INT64), vi("cond_in", [], T.BOOL), vi("x", [2])],
                        [vi("cond_out", [], T.BOOL), vi("x_out", [2]), vi("s", [2])],
                        [const("two", np.int64(2)), const("f1", np.float32(1))])
    return model([h.make_node("Loop", inputs, ["y", "scan"], body=body)],
                 [vi("x0", [2]), vi("M", [], T.INT64), vi("c", [], T.BOOL)], [vi("y", [2]), vi("scan", [None, 2])],
                 opset=opset)


@pytest.mark.parametrize("inputs", [["M", "", "x0"], ["", "c", "x0"], ["M", "c", "x0"]])
def test_loop_trip_count_and_condition_as_onnx_runtime(inputs):
    m = counting_loop(inputs)
    feeds = [{"x0": np.float32([0, 1]), "M": np.array(n, np.int64), "c": np.array(c)}
             for n, c in ((5, True), (1, True), (0, True), (5, False), (-2, True))]
    for feed in feeds:
        if inputs[0] == "" and not feed["c"]:
            continue
        got = run_graph(import_model(m), feed)
        for name, want in zip(["y", "scan"], ort_run(m, feed)):
            close(got[name], want)


def scan_model(directions, axes, out_directions, out_axes):
    body = h.make_graph([h.make_node("Add", ["s", "a"], ["s1"]), h.make_node("Mul", ["s1", "b"], ["o1"]),
                         h.make_node("Sub", ["a", "w"], ["o2"])], "body",
                        [vi("s", [3]), vi("a", [3]), vi("b", [3])], [vi("s1", [3]), vi("o1", [3]), vi("o2", [3])])
    shape_a = [3, 4] if axes[0] in (1, -1) else [4, 3]
    shape_b = [3, 4] if axes[1] in (1, -1) else [4, 3]
    node = h.make_node("Scan", ["s0", "xa", "xb"], ["sN", "y1", "y2"], body=body, num_scan_inputs=2,
                       scan_input_directions=directions, scan_input_axes=axes,
                       scan_output_directions=out_directions, scan_output_axes=out_axes)
    return model([h.make_node("Neg", ["s0"], ["w"]), node],
                 [vi("s0", [3]), vi("xa", shape_a), vi("xb", shape_b)],
                 [vi("sN", [3]), vi("y1", [None, None]), vi("y2", [None, None])])


@pytest.mark.parametrize("directions,axes,out_directions,out_axes", [
    ([0, 0], [0, 0], [0, 0], [0, 0]), ([1, 0], [1, 0], [0, 1], [1, -1]), ([0, 1], [-1, 0], [1, 0], [0, 1])])
def test_scan_directions_and_axes_as_onnx_runtime(directions, axes, out_directions, out_axes):
    m = scan_model(directions, axes, out_directions, out_axes)
    rng = np.random.default_rng(0)
    feed = {"s0": rng.normal(size=3).astype(np.float32),
            "xa": rng.normal(size=[3, 4] if axes[0] in (1, -1) else [4, 3]).astype(np.float32),
            "xb": rng.normal(size=[3, 4] if axes[1] in (1, -1) else [4, 3]).astype(np.float32)}
    agree(m, [feed])


# ONNX's node cases of these ops, and of the ops whose function bodies hold them: importing a module
# of onnx.backend.test.case.node makes its cases (all of them, collect_testcases, take 13 s).
CASE_MODULES = ("if_", "loop", "scan", "sequence_map", "affinegrid", "rangeop", "linear_attention")


def _control_flow_cases():
    import importlib

    import onnx.backend.test.case.node as node_cases

    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in CASE_MODULES:
            importlib.import_module(f"onnx.backend.test.case.node.{name}")
    graph_attrs = (AttributeProto.GRAPH, AttributeProto.GRAPHS)
    return [c for c in node_cases._NodeTestCases
            if any(a.type in graph_attrs for n in c.model.graph.node for a in n.attribute)
            and all(o.domain in ("", "ai.onnx") for o in c.model.opset_import)
            # Opset 8's batched Scan: refused (test_batched_scan_of_opset_8_is_refused_in_one_line).
            and c.name != "test_scan_sum"]


CASES = {c.name: c for c in _control_flow_cases()}


def test_batched_scan_of_opset_8_is_refused_in_one_line():
    # ONNX's version converter drops opset 8's batch axis from the graph's inputs: converted, the
    # model would want other inputs than the ones it declares.
    import onnx.backend.test.case.node as node_cases

    (case,) = [c for c in node_cases._NodeTestCases if c.name == "test_scan_sum"]
    with pytest.raises(SaturateError) as err:
        import_model(case.model)
    assert one_line(err) == ("cannot convert the model from opset 8 to 14: the conversion changes the type of "
                             "graph input or output 'initial' (float32[1, 2] to float32[2])")


def _feed(case):
    inputs, _ = case.data_sets[0]
    return {v.name: x if isinstance(x, list) else np.asarray(x) for v, x in zip(case.model.graph.input, inputs)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_conformance_cases(name):
    case = CASES[name]
    _, outputs = case.data_sets[0]
    got = run_graph(import_model(case.model), _feed(case))
    for v, want in zip(case.model.graph.output, outputs):
        value = got[v.name]
        if want is None:
            assert value is None
        elif isinstance(want, list):
            close(value, [np.asarray(w) for w in want])
        else:
            want = np.asarray(want)
            assert value.shape == want.shape and value.dtype == want.dtype
            np.testing.assert_allclose(np.asarray(value, np.float64) if want.dtype.isbuiltin != 1 else value,
                                       np.asarray(want, np.float64) if want.dtype.isbuiltin != 1 else want,
                                       rtol=max(case.rtol, 1e-4), atol=case.atol)


@pytest.mark.parametrize("name", ["test_if", "test_if_seq", "test_loop11", "test_loop13_seq", "test_scan9_sum",
                                  "test_affine_grid_2d_expanded", "test_range_float_type_positive_delta_expanded",
                                  "test_sequence_map_add_1_sequence_1_tensor_expanded"])
def test_conformance_cases_optimize_as_onnx_runtime_runs_them(name):
    case = CASES[name]
    out = optimized(case.model)
    feed = _feed(case)
    for got, want in zip(ort_run(out, feed), ort_run(case.model, feed)):
        close(got, want)


# ---- hostile models: one line each ------------------------------------------------------------------------

def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_a_subgraph_reading_a_name_nothing_defines_is_refused_naming_the_node():
    m = if_model("t")
    subgraph(m, "If", "then_branch").node[0].input[0] = "nowhere"
    with pytest.raises(SaturateError) as err:
        import_model(m)
    assert one_line(err).startswith("invalid ONNX model: node 'y' (If), subgraph 'then_branch': node 'o1' (Mul) "
                                    "reads 'nowhere'")


def test_a_nested_subgraph_reading_a_name_nothing_defines_names_both_nodes():
    m = loop_with_if("t")
    inner = next(n for n in subgraph(m, "Loop", "body").node if n.op_type == "If")
    next(a.g for a in inner.attribute if a.name == "else_branch").node[0].input[1] = "nowhere"
    with pytest.raises(SaturateError) as err:
        import_model(m)
    assert one_line(err) == ("invalid ONNX model: node 'final' (Loop), subgraph 'body': node 'acc_next' (If), "
                             "subgraph 'else_branch': node 'b2' (Sub) reads 'nowhere', which nothing defines "
                             "before it")


def test_a_subgraph_reading_a_later_value_or_its_own_output_is_refused():
    m = if_model("t")
    subgraph(m, "If", "else_branch").node[0].input[0] = "y"
    with pytest.raises(SaturateError) as err:
        import_model(m)
    assert "node 'y' (If), subgraph 'else_branch'" in one_line(err) and "reads 'y'" in one_line(err)


def test_a_subgraph_redefining_an_outer_value_is_refused():
    m = if_model("t")
    subgraph(m, "If", "then_branch").node[0].output[0] = "a"
    subgraph(m, "If", "then_branch").output[0].name = "a"
    with pytest.raises(SaturateError) as err:
        import_model(m)
    assert "defines 'a', a value of an enclosing graph" in one_line(err)


def test_absurd_nesting_is_refused_naming_the_node():
    g = h.make_graph([h.make_node("Identity", ["x"], ["o0"])], "b0", [], [vi("o0", [1])])
    for k in range(1, MAX_DEPTH + 3):
        other = h.make_graph([h.make_node("Identity", ["x"], [f"e{k}"])], f"e{k}", [], [vi(f"e{k}", [1])])
        g = h.make_graph([h.make_node("If", ["c"], [f"o{k}"], then_branch=g, else_branch=other, name=f"if{k}")],
                         f"b{k}", [], [vi(f"o{k}", [1])])
    m = h.make_model(h.make_graph(g.node, "top", [vi("x", [1]), vi("c", [], T.BOOL)], list(g.output)),
                     opset_imports=[h.make_opsetid("", 17)])
    with pytest.raises(SaturateError) as err:
        import_model(m)
    assert f"nested deeper than {MAX_DEPTH} levels" in one_line(err) and "(If)" in one_line(err)


def test_an_endless_loop_collecting_outputs_stops_at_the_memory_limit():
    body = h.make_graph([h.make_node("Identity", ["c"], ["c_out"]), h.make_node("Identity", ["x"], ["s"])], "body",
                        [vi("i", [], T.INT64), vi("c", [], T.BOOL)], [vi("c_out", [], T.BOOL), vi("s", [256])])
    m = model([h.make_node("Loop", ["", "go"], ["all"], body=body, name="forever")],
              [vi("x", [256]), vi("go", [], T.BOOL)], [vi("all", [None, 256])])
    with lowered(1 << 20), pytest.raises(MemoryLimitError) as err:
        run_graph(import_model(m), {"x": np.zeros(256, np.float32), "go": np.array(True)})
    assert one_line(err).startswith("node 'forever' (Loop): outputs collected over")


@pytest.mark.parametrize("feed,message", [
    ({"M": np.array([1, 2], np.int64), "c": np.array(True)}, "trip count must be one int64"),
    ({"M": np.array(3, np.int64), "c": np.array([True, False])}, "the condition must be one bool"),
])
def test_bad_loop_inputs_are_one_line(feed, message):
    m = counting_loop(["M", "c", "x0"])
    graph = import_model(m)
    graph.values.pop("M", None), graph.values.pop("c", None)
    with pytest.raises(SaturateError) as err:
        run_graph(graph, {"x0": np.float32([0, 1]), **feed})
    assert one_line(err).startswith("node 'y' (Loop): ") and message in one_line(err)


def test_an_error_inside_a_body_names_the_nodes_around_it():
    then_g = branch("then", [h.make_node("Reshape", ["acc", "shape"], ["b1"], name="reshape")], "b1")
    else_g = branch("else", [h.make_node("Identity", ["acc"], ["b2"])], "b2")
    body = h.make_graph([h.make_node("If", ["cond_in"], ["acc_next"], then_branch=then_g, else_branch=else_g,
                                     name="inner"), h.make_node("Identity", ["cond_in"], ["cond_out"])],
                        "body", [vi("i", [], T.INT64), vi("cond_in", [], T.BOOL), vi("acc", [4])],
                        [vi("cond_out", [], T.BOOL), vi("acc_next", [4])])
    m = model([h.make_node("Loop", ["M", "", "x"], ["final"], body=body, name="outer")],
              [vi("x", [4]), vi("M", [], T.INT64), vi("shape", [1], T.INT64)], [vi("final", [4])])
    with pytest.raises(SaturateError) as err:
        run_graph(import_model(m), {"x": X, "M": np.array(2, np.int64), "shape": np.array([5], np.int64)})
    assert one_line(err).startswith("node 'outer' (Loop), subgraph 'body': node 'inner' (If), "
                                    "subgraph 'then_branch': node 'reshape' (Reshape): ")


def test_cli_optimizes_and_runs_a_model_with_control_flow(tmp_path, capsys):
    from saturate.cli import main

    src, out = tmp_path / "if.onnx", tmp_path / "out.onnx"
    src.write_bytes(if_model("t").SerializeToString())
    assert main(["optimize", str(src), "-o", str(out)]) == 0
    capsys.readouterr()
    np.save(tmp_path / "x.npy", X)
    for path in (src, out):
        assert main(["run", str(path), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy")]) == 0
        close(np.load(tmp_path / "y.npy"), ort_run(if_model("t"), {"x": X})[0])


@pytest.mark.compiler
@pytest.mark.parametrize("build", [lambda: if_model("t"), lambda: loop_with_if("k")], ids=["if", "loop"])
def test_the_c_backend_runs_control_flow_between_its_segments(build):
    from saturate.backend import compile_graph

    m = build()
    graph = import_model(optimized(m))
    feed = {"x": X, "M": np.array(3, np.int64)}
    got = compile_graph(graph)({k: v for k, v in feed.items() if k in graph.inputs})
    for name, want in zip([o.name for o in m.graph.output], ort_run(m, feed)):
        close(got[name], want)


# ---- saturate check ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,status", [
    ("Identity(If(x0)) => If(x0)", "PASS"), ("Identity(Loop(x0, x1)) => Loop(x0, x1)", "PASS"),
    ("Identity(Scan(x0)) => Scan(x0)", "PASS"), ("Identity(If(x0)) => x0", "FAIL"),
    ("Relu(If(x0)) => If(x0)", "FAIL"), ("Identity(Scan(x0)) => x0", "FAIL")])
def test_saturate_check_draws_if_loop_and_scan(text, status):
    # Their subgraphs drawn (constant branches, a body stopping after a drawn iteration, a body
    # passing slices on along drawn axes and directions) and run by the interpreter on both sides.
    from saturate.check.checker import check_rule, format_result
    from saturate.lang.parser import parse_rules

    (rule,) = parse_rules(f"ruleset flow level 1\nrule r {text}\n", "flow.rules")[0].rules
    result = check_rule(rule, examples=20, seed=0)
    assert result.status == status, format_result(result)


@pytest.mark.parametrize("attr", ["scan_input_directions", "scan_output_directions"])
def test_a_scan_direction_other_than_0_or_1_is_one_line(attr):
    # ONNX Runtime refuses it; read as a truth value it would run the scan in reverse.
    m = scan_model([0, 0], [0, 0], [0, 0], [0, 0])
    node = next(n for n in m.graph.node if n.op_type == "Scan")
    next(a for a in node.attribute if a.name == attr).ints[:] = [2, 0]
    feed = {"s0": np.zeros(3, np.float32), "xa": np.ones((4, 3), np.float32), "xb": np.ones((4, 3), np.float32)}
    with pytest.raises(SaturateError) as err:
        run_graph(import_model(m), feed)
    assert one_line(err) == f"node 'sN' (Scan): attribute '{attr}' holds [2, 0]: each must be 0 (forward) or 1 (reverse)"


def test_two_nodes_whose_subgraphs_define_the_same_names_import():
    # ONNX scopes a subgraph's names to it: two Ifs with the same branches are valid (ONNX Runtime
    # runs them), though ONNX's data propagation refuses the second definition of 'o'.
    then_g = branch("b", [h.make_node("Mul", ["x", "x"], ["o"])], "o")
    else_g = branch("b", [h.make_node("Neg", ["x"], ["o"])], "o")
    nodes = [h.make_node("ReduceSum", ["x"], ["s"], keepdims=0), h.make_node("Greater", ["s", "zero"], ["cond"]),
             h.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g),
             h.make_node("If", ["cond"], ["y2"], then_branch=else_g, else_branch=then_g)]
    m = model(nodes, [vi("x", [4])], [vi("y", [4]), vi("y2", [4])], [const("zero", np.float32(0))])
    agree(m, BOTH_BRANCHES)
