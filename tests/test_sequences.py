"""Sequence values (ONNX's seq(tensor)): the interpreter runs the sequence ops as ONNX Runtime does,
`saturate run` prints and saves sequence outputs, and `saturate check` draws and compares them."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper

from saturate.cli import main
from saturate.core.errors import SaturateError
from saturate.core.ir import Graph, Node
from saturate.frontend.onnx_io import import_model
from saturate.interp import run_graph
from saturate.interp.sequences import TensorSequence

OPTIONAL_OPS = {"Optional", "OptionalHasElement", "OptionalGetElement"}
SEQUENCE_OPS = {"SequenceConstruct", "SequenceAt", "SequenceLength", "SequenceInsert", "SequenceErase",
                "SequenceEmpty", "SplitToSequence", "ConcatFromSequence"}


def model(nodes, inputs, outputs, initializers=(), opset=17):
    """A checked model; outputs declared without a shape take the one inference gives."""
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    inferred = {vi.name: vi for vi in m.graph.value_info}
    for k, vi in enumerate(m.graph.output):
        if vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape") and vi.name in inferred:
            m.graph.output[k].CopyFrom(inferred[vi.name])
    onnx.checker.check_model(m, full_check=True)
    return m


def ort_run(m: onnx.ModelProto, feeds: dict) -> dict:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def assert_same(got, want, where=""):
    """Equal as ONNX Runtime gives them: a sequence item by item (length, dtype, shape, values);
    an empty optional is None."""
    if want is None or got is None:
        assert got is None and want is None, (where, got, want)
        return
    if isinstance(want, list):
        assert isinstance(got, list), where
        assert len(got) == len(want), where
        for k, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{k}]")
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (where, got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0, err_msg=where)


def against_ort(m: onnx.ModelProto, feeds: dict) -> dict:
    got = run_graph(import_model(m), feeds)
    want = ort_run(m, feeds)
    assert set(got) == set(want)
    for k in want:
        assert_same(got[k], want[k], k)
    return got


def tensor(name, elem=T.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def seq(name, elem=T.FLOAT):
    return helper.make_tensor_sequence_value_info(name, elem, None)


def ints(name, values):
    return helper.make_tensor(name, T.INT64, [len(values)] if isinstance(values, list) else [], values
                              if isinstance(values, list) else [values])


X = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 7.5


@pytest.mark.parametrize("axis,split,keepdims", [
    (0, None, 1), (1, None, 0), (-1, None, 1), (2, 3, 1), (1, [1, 2], 1), (2, [0, 4], 0), (-2, 2, 1)])
def test_split_to_sequence_then_every_reader_matches_onnxruntime(axis, split, keepdims):
    inits = [] if split is None else [ints("split", split)]
    nodes = [helper.make_node("SplitToSequence", ["x"] + (["split"] if inits else []), ["s"], axis=axis,
                              keepdims=keepdims),
             helper.make_node("SequenceLength", ["s"], ["n"]),
             helper.make_node("SequenceAt", ["s", "last"], ["at"]),
             helper.make_node("ConcatFromSequence", ["s"], ["joined"], axis=axis),
             helper.make_node("ConcatFromSequence", ["s"], ["stacked"], axis=0, new_axis=1)]
    inits.append(ints("last", -1))
    outs = [seq("s"), tensor("n", T.INT64), tensor("at"), tensor("joined"), tensor("stacked")]
    dim = X.shape[axis]
    if isinstance(split, int) and dim % split or isinstance(split, list) and len(set(split)) > 1:
        nodes.pop()        # items of different shapes do not stack
        outs.pop()
    got = against_ort(model(nodes, [tensor("x", T.FLOAT, [2, 3, 4])], outs, inits), {"x": X})
    assert isinstance(got["s"], TensorSequence) and got["s"].dtype == np.float32


def test_construct_insert_erase_at_match_onnxruntime():
    a, b, c = (np.full((2, 2), v, np.int32) for v in (1, 2, 3))
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node("SequenceInsert", ["s", "c"], ["s1"]),              # appended
             helper.make_node("SequenceInsert", ["s1", "a", "zero"], ["s2"]),     # at the front
             helper.make_node("SequenceInsert", ["s2", "b", "neg"], ["s3"]),      # before the last
             helper.make_node("SequenceErase", ["s3"], ["e1"]),                   # the last
             helper.make_node("SequenceErase", ["e1", "one"], ["e2"]),
             helper.make_node("SequenceAt", ["e2", "one"], ["at"]),
             helper.make_node("SequenceLength", ["e2"], ["n"])]
    inits = [ints("zero", 0), ints("one", 1), helper.make_tensor("neg", T.INT32, [], [-1])]
    m = model(nodes, [tensor(n, T.INT32, [2, 2]) for n in "abc"],
              [seq("s3", T.INT32), seq("e2", T.INT32), tensor("at", T.INT32), tensor("n", T.INT64)], inits)
    got = against_ort(m, {"a": a, "b": b, "c": c})
    assert [int(t[0, 0]) for t in got["s3"]] == [1, 1, 2, 2, 3]


def test_empty_sequence_keeps_its_dtype_and_grows():
    nodes = [helper.make_node("SequenceEmpty", [], ["e"], dtype=T.INT64),
             helper.make_node("SequenceLength", ["e"], ["n0"]),
             helper.make_node("SequenceInsert", ["e", "x"], ["s"]),
             helper.make_node("SequenceInsert", ["s", "x"], ["s2"]),
             helper.make_node("ConcatFromSequence", ["s2"], ["y"], axis=-1, new_axis=1)]
    m = model(nodes, [tensor("x", T.INT64, [3])], [seq("e", T.INT64), tensor("n0", T.INT64, []), tensor("y", T.INT64, [3, 2])])
    got = against_ort(m, {"x": np.array([4, 5, 6], np.int64)})
    assert got["e"] == [] and got["e"].dtype == np.int64 and got["y"].shape == (3, 2)


def test_sequence_inputs_pass_through_identity_as_in_onnxruntime():
    m = model([helper.make_node("Identity", ["s"], ["t"]), helper.make_node("SequenceLength", ["t"], ["n"])],
              [seq("s")], [seq("t"), tensor("n", T.INT64)])
    items = [np.ones((2,), np.float32), np.zeros((3,), np.float32)]
    got = against_ort(m, {"s": items})
    got["t"][0][0] = 9                      # results are the caller's to write
    assert items[0][0] == 1


# The modules of onnx.backend.test.case.node holding ONNX's sequence and optional cases: importing one
# makes its cases (collect_testcases makes all of them, 5 to 13 s in every test worker).
CASE_MODULES = ("identity", "optionalgetelement", "optionalhaselement", "sequenceinsert", "splittosequence")


def _onnx_sequence_cases():
    import importlib
    import warnings

    import onnx.backend.test.case.node as node_cases

    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in CASE_MODULES:
            importlib.import_module(f"onnx.backend.test.case.node.{name}")
    ops = SEQUENCE_OPS | OPTIONAL_OPS
    return [c for c in node_cases._NodeTestCases
            if {n.op_type for n in c.model.graph.node} <= ops | {"Identity"}
            and any(n.op_type in ops or "sequence" in c.name or "_opt" in c.name for n in c.model.graph.node)]


_CASES = _onnx_sequence_cases()


def test_onnx_has_sequence_node_cases():
    assert len(_CASES) >= 18, [c.name for c in _CASES]


@pytest.mark.parametrize("case", _CASES, ids=lambda c: c.name)
def test_onnx_backend_sequence_case(case):
    graph = import_model(case.model)
    inputs, outputs = case.data_sets[0]
    feeds = {vi.name: v for vi, v in zip(case.model.graph.input, inputs)}
    got = run_graph(graph, feeds)
    for vi, want in zip(case.model.graph.output, outputs):
        want = [np.asarray(w) for w in want] if isinstance(want, list) else None if want is None else np.asarray(want)
        assert_same(got[vi.name], want, vi.name)


@pytest.mark.parametrize("case", _CASES, ids=lambda c: c.name)
def test_optimize_writes_back_onnx_sequence_cases_with_their_graph_types(case, tmp_path, capsys):
    # The model optimized as a user would (checked in ONNX Runtime where it can draw the inputs):
    # the result is a valid model whose inputs and outputs keep their sequence or optional types.
    onnx.save(case.model, tmp_path / "m.onnx")
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "opt.onnx"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "failed" not in err and "Traceback" not in err
    opt = onnx.load(tmp_path / "opt.onnx")
    onnx.checker.check_model(opt, full_check=True)
    assert [(v.name, v.type) for v in opt.graph.input] == [(v.name, v.type) for v in case.model.graph.input]
    kinds = [v.type.WhichOneof("value") for v in case.model.graph.output]
    assert [v.type.WhichOneof("value") for v in opt.graph.output] == kinds


def _one(op, inputs, **attrs):
    return Node(op, list(inputs), ["out"], attrs, name="n")


def _graph(nodes, inputs, output="out"):
    g = Graph(opset=17)
    g.inputs = list(inputs)
    g.outputs = [output]
    g.nodes = nodes
    return g


@pytest.mark.parametrize("nodes,feeds,message", [
    ([_one("SequenceConstruct", ["a", "b"], ), ], {"a": np.ones(2, np.float32), "b": np.ones(2, np.int64)},
     "node 'n' (SequenceConstruct): a sequence holds one element type: int64 beside float32"),
    ([Node("SequenceConstruct", ["a"], ["s"]), _one("SequenceAt", ["s", "p"])],
     {"a": np.ones(2, np.float32), "p": np.array(1, np.int64)},
     "node 'n' (SequenceAt): position 1 is out of range for a sequence of length 1 (allowed -1 to 0)"),
    ([Node("SequenceConstruct", ["a"], ["s"]), _one("SequenceInsert", ["s", "a", "p"])],
     {"a": np.ones(2, np.float32), "p": np.array(3, np.int64)},
     "node 'n' (SequenceInsert): position 3 is out of range for a sequence of length 1 (allowed -1 to 1)"),
    ([Node("SequenceEmpty", [], ["s"]), _one("SequenceErase", ["s"])], {},
     "node 'n' (SequenceErase): cannot erase from an empty sequence"),
    ([Node("SequenceEmpty", [], ["s"]), _one("ConcatFromSequence", ["s"], axis=0)], {},
     "node 'n' (ConcatFromSequence): cannot concatenate an empty sequence"),
    ([Node("SequenceConstruct", ["a", "b"], ["s"]), _one("ConcatFromSequence", ["s"], axis=0, new_axis=1)],
     {"a": np.ones(2, np.float32), "b": np.ones(3, np.float32)},
     "node 'n' (ConcatFromSequence): items of shapes [2], [3] do not stack along axis 0"),
    ([_one("SplitToSequence", ["a", "p"])], {"a": np.ones(4, np.float32), "p": np.array([1, 2], np.int64)},
     "node 'n' (SplitToSequence): split [1, 2] must be non-negative and sum to 4, the length of axis 0"),
    ([Node("SequenceConstruct", ["a"], ["s"]), _one("Relu", ["s"])], {"a": np.ones(2, np.float32)},
     "node 'n' (Relu): input 0 is a sequence; Relu takes tensors"),
])
def test_bad_sequence_input_is_one_line_naming_node_and_op(nodes, feeds, message):
    with pytest.raises(SaturateError) as err:
        run_graph(_graph(nodes, feeds), feeds)
    assert str(err.value) == message


def test_run_prints_and_saves_sequence_outputs(tmp_path, capsys):
    m = model([helper.make_node("SplitToSequence", ["x"], ["s"], axis=1),
               helper.make_node("SequenceLength", ["s"], ["n"])],
              [tensor("x", T.FLOAT, [2, 3])], [seq("s"), tensor("n", T.INT64)])
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(path), "-i", str(tmp_path / "x.npy")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "s: sequence of 3 float32 tensor(s)"
    assert out[1].startswith("s[0]: float32[2, 1] [0, 3]") and out[-1].startswith("n: int64[] [3]")
    assert main(["run", str(path), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npz")]) == 0
    assert "s sequence of 3 float32 as s.0 to s.2" in capsys.readouterr().out
    with np.load(tmp_path / "y.npz") as saved:
        assert saved.files == ["s.0", "s.1", "s.2", "n"]
        for k in range(3):
            np.testing.assert_array_equal(saved[f"s.{k}"], x[:, k:k + 1])
    m1 = model([helper.make_node("SplitToSequence", ["x"], ["s"], axis=1)], [tensor("x", T.FLOAT, [2, 3])],
               [seq("s")])
    onnx.save(m1, tmp_path / "one.onnx")
    assert main(["run", str(tmp_path / "one.onnx"), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "output 's' is a sequence of 3 tensors; save it to a .npz" in err[0]
    assert not (tmp_path / "y.npy").exists()


def test_run_reads_a_sequence_input_as_it_saves_a_sequence_output(tmp_path, capsys):
    # The items `run -o` saved (s.0, s.1, ...) feed a model whose input is that sequence.
    split = model([helper.make_node("SplitToSequence", ["x"], ["s"], axis=1)], [tensor("x", T.FLOAT, [2, 3])],
                  [seq("s")])
    joined = model([helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=1, new_axis=0)], [seq("s")],
                   [tensor("y", T.FLOAT, [2, 3])])
    onnx.save(split, tmp_path / "split.onnx")
    onnx.save(joined, tmp_path / "joined.onnx")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(tmp_path / "split.onnx"), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "s.npz")]) == 0
    assert main(["run", str(tmp_path / "joined.onnx"), "-i", str(tmp_path / "s.npz"), "-o", str(tmp_path / "y.npy")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), x)
    capsys.readouterr()
    np.savez(tmp_path / "bad.npz", **{"s.0": x.astype(np.int64)})
    assert main(["run", str(tmp_path / "joined.onnx"), "-i", str(tmp_path / "bad.npz")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"saturate: error: {tmp_path / 'bad.npz'}: s.0 has dtype int64; input 's' is a sequence of "
                   "float32 tensors"]


def test_run_of_a_bad_position_is_one_line(tmp_path, capsys):
    m = model([helper.make_node("SplitToSequence", ["x"], ["s"], axis=0),
               helper.make_node("SequenceAt", ["s", "p"], ["y"], name="pick")],
              [tensor("x", T.FLOAT, [2, 3])], [tensor("y")], [ints("p", 5)])
    onnx.save(m, tmp_path / "m.onnx")
    assert main(["run", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("saturate: error: node 'pick' (SequenceAt): position 5 is out of range for a sequence "
                       "of length 2 (allowed -2 to 1)")


# ---- saturate check over sequences ------------------------------------------------------------

def _rule(body: str):
    from saturate.lang.parser import parse_rules

    (rule,) = parse_rules(f"ruleset s level 1\nrule r\n    {body}\n", "s.rules")[0].rules
    return rule


@pytest.mark.parametrize("body", [
    "SequenceAt(SequenceConstruct(a, b), i:const) => a\n    if i == 0",
    "SequenceLength(SequenceConstruct(a, b)) => 2",
    "ConcatFromSequence(SplitToSequence(x){axis=0, keepdims=1}){axis=0, new_axis=0} => x",
    "SequenceLength(SequenceInsert(s, x)) => Add(SequenceLength(s), 1)",
    "SequenceErase(SequenceInsert(s, x)) => s",
    "SequenceAt(SplitToSequence(x){axis=0, keepdims=0}, p:const) => Gather(x, p){axis=0}",
    "SequenceLength(SplitToSequence(x){axis=1}) => Gather(Shape(x), 1){axis=0}",
    "OptionalGetElement(Optional(x)) => x",
    "SequenceLength(OptionalGetElement(Optional(SplitToSequence(x){axis=0}))) => "
    "SequenceLength(SplitToSequence(x){axis=0})",
])
def test_sound_sequence_rules_pass(body):
    from saturate.check.checker import check_rule

    result = check_rule(_rule(body), examples=25, seed=0)
    assert result.status == "PASS", (result.message, result.counterexample and result.counterexample.reason)
    assert result.examples == 25


@pytest.mark.parametrize("body,reason", [
    ("SequenceAt(SequenceConstruct(a, b), i:const) => b\n    if i == 0", "outputs differ"),
    ("SequenceLength(SequenceConstruct(a, b)) => 3", "outputs differ at index []: left 2, right 3"),
    ("SequenceErase(SequenceInsert(s, x)) => SequenceInsert(s, x)", "sequence lengths differ"),
    # Attributes a pattern leaves free are drawn: split with keepdims=0 or stacked with
    # new_axis=1, the items do not join back into x.
    ("ConcatFromSequence(SplitToSequence(x){axis=0}){axis=0} => x", "shapes differ"),
    ("SequenceInsert(SequenceInsert(s, a), b) => SequenceInsert(SequenceInsert(s, b), a)", "item"),
    ("SequenceConstruct(a) => SequenceConstruct(Cast(a){to=7})", "sequence element types differ"),
    ("OptionalGetElement(Optional(x)) => Neg(x)", "outputs differ"),
])
def test_unsound_sequence_rules_fail_with_a_counterexample(body, reason):
    from saturate.check.checker import check_rule, format_result

    result = check_rule(_rule(body), examples=100, seed=0)
    assert result.status == "FAIL", result.message
    assert reason in result.counterexample.reason, result.counterexample.reason
    report = format_result(result)
    assert "counterexample" in report and "left " in report


def test_sequence_comparison_is_item_by_item():
    from saturate.check.checker import compare, show_array

    a = TensorSequence([np.zeros(2, np.float32), np.ones(3, np.float32)])
    assert compare(a, TensorSequence([np.zeros(2, np.float32), np.ones(3, np.float32)]), 1.0) is None
    assert compare(a, TensorSequence([np.zeros(2, np.float32)]), 1.0) == "sequence lengths differ: left 2, right 1"
    assert compare(a, TensorSequence([np.zeros(2), np.ones(3)]), 1.0) == \
        "sequence element types differ: left float32, right float64"
    assert compare(a, TensorSequence([np.zeros(2, np.float32), np.ones(2, np.float32)]), 1.0) == \
        "item 1: shapes differ: left (3,), right (2,)"
    assert compare(a, TensorSequence([np.zeros(2, np.float32), np.array([1, 2, 1], np.float32)]), 1.0) == \
        "item 1: outputs differ at index [1]: left 1, right 2"
    assert compare(a, np.zeros(2, np.float32), 1.0) == "left is a sequence, right is a tensor"
    assert compare(TensorSequence([], np.int64), TensorSequence([], np.int64), 1.0) is None
    assert show_array(TensorSequence([], np.int64)) == "sequence of 0 int64"
    assert show_array(a) == "sequence of 2 float32: [0] float32[2] = [0., 0.]; [1] float32[3] = [1., 1., 1.]"


def test_sequence_strategy_draws_lists_of_one_dtype():
    from hypothesis import given, settings

    from saturate.check.strategies import sequences

    seen = set()

    @settings(max_examples=60, deadline=None, database=None)
    @given(sequences(dtype=np.int32))
    def prop(s):
        assert isinstance(s, TensorSequence) and s.dtype == np.int32 and len(s) <= 4
        assert all(a.dtype == np.int32 and a.ndim == s[0].ndim for a in s)
        seen.add(len(s))
    prop()
    assert {0, 1, 2} <= seen


# ---- optimize over sequence ops -------------------------------------------------------------------

def test_optimize_folds_a_split_joined_back_by_a_rule_naming_sequence_ops(tmp_path, capsys):
    # The e-graph holds the sequence as a value of unknown shape; a rule naming both ops matches
    # (no rule of rules/ does), and the result equals ONNX Runtime on the original.
    m = model([helper.make_node("SplitToSequence", ["x"], ["s"], axis=0),
               helper.make_node("ConcatFromSequence", ["s"], ["c"], axis=0),
               helper.make_node("Relu", ["c"], ["y"])],
              [tensor("x", T.FLOAT, [4, 3])], [tensor("y", T.FLOAT, [4, 3])])
    onnx.save(m, tmp_path / "m.onnx")
    (tmp_path / "seq.rules").write_text(
        "ruleset seq level 1\nrule concat-split\n"
        "    ConcatFromSequence(SplitToSequence(x){axis=0, keepdims=1}){axis=0, new_axis=0} => x\n")
    assert main(["optimize", str(tmp_path / "m.onnx"), "--rules", str(tmp_path / "seq.rules"),
                 "-o", str(tmp_path / "opt.onnx")]) == 0
    capsys.readouterr()
    opt = onnx.load(tmp_path / "opt.onnx")
    assert [n.op_type for n in opt.graph.node] == ["Relu"]
    x = (np.arange(12, dtype=np.float32).reshape(4, 3) - 6) / 3
    np.testing.assert_allclose(ort_run(opt, {"x": x})["y"], ort_run(m, {"x": x})["y"], rtol=1e-6)
    # Without the rule the ops are kept as they are and run as before.
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "kept.onnx")]) == 0
    kept = onnx.load(tmp_path / "kept.onnx")
    assert [n.op_type for n in kept.graph.node] == ["SplitToSequence", "ConcatFromSequence", "Relu"]
    np.testing.assert_array_equal(run_graph(import_model(kept), {"x": x})["y"], np.maximum(x, 0))


# ---- optionals -----------------------------------------------------------------------------------

def test_optionals_full_and_empty_match_onnxruntime(tmp_path, capsys):
    empty_type = helper.make_tensor_type_proto(T.FLOAT, None)
    nodes = [helper.make_node("Optional", ["x"], ["full"]),
             helper.make_node("Optional", [], ["empty"], type=empty_type),
             helper.make_node("OptionalHasElement", ["full"], ["has_full"]),
             helper.make_node("OptionalHasElement", ["empty"], ["has_empty"]),
             helper.make_node("OptionalGetElement", ["full"], ["got"]),
             helper.make_node("SplitToSequence", ["x"], ["s"], axis=0),
             helper.make_node("Optional", ["s"], ["opt_s"]),
             helper.make_node("OptionalGetElement", ["opt_s"], ["s2"]),
             helper.make_node("SequenceLength", ["s2"], ["n"])]
    m = model(nodes, [tensor("x", T.FLOAT, [3, 2])],
              [tensor("has_full", T.BOOL, []), tensor("has_empty", T.BOOL, []), tensor("got", T.FLOAT, [3, 2]),
               tensor("n", T.INT64, [])], opset=18)
    got = against_ort(m, {"x": X[0, :3, :2].copy()})
    assert bool(got["has_full"]) and not bool(got["has_empty"]) and int(got["n"]) == 3
    g = _graph([Node("Optional", [], ["e"], {"type": empty_type}), _one("OptionalGetElement", ["e"])], {})
    g.opset = 18
    with pytest.raises(SaturateError, match=r"^node 'n' \(OptionalGetElement\): the optional is empty$"):
        run_graph(g, {})


# ---- sequence and optional graph inputs and outputs ----------------------------------------------

def test_optimize_keeps_sequence_and_optional_outputs_declared_and_checks_them_in_onnxruntime(tmp_path, capsys):
    # Export once declared every graph output a tensor, and ONNX refused the result; the check
    # compares a sequence item by item (a wrong item fails it), and the C backend hands the
    # interpreter's sequence back as it is.
    nodes = [helper.make_node("SplitToSequence", ["x", "parts"], ["s"], axis=0),
             helper.make_node("Optional", ["x"], ["o"])]
    out = [seq("s"), helper.make_value_info("o", helper.make_optional_type_proto(helper.make_tensor_type_proto(T.FLOAT, [4, 3])))]
    m = model(nodes, [tensor("x", T.FLOAT, [4, 3])], out, [ints("parts", [1, 3])], opset=18)
    onnx.save(m, tmp_path / "m.onnx")
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "opt.onnx")]) == 0
    assert "not checked" not in capsys.readouterr().err
    opt = onnx.load(tmp_path / "opt.onnx")
    assert [o.type for o in opt.graph.output] == [o.type for o in m.graph.output]
    x = X.reshape(4, 6)[:, :3].copy()
    got, want = ort_run(opt, {"x": x}), ort_run(m, {"x": x})
    assert_same(got["s"], want["s"], "s")
    assert [a.shape for a in got["s"]] == [(1, 3), (3, 3)]

    from saturate.simplifier import _items
    assert _items(want["s"], want["s"]) == list(zip(want["s"], want["s"]))
    assert _items(want["s"][:1], want["s"]) is None and _items(want["s"][0], want["s"]) is None
    assert _items(None, None) == [] and _items(None, x) is None

    assert main(["run", str(tmp_path / "opt.onnx"), "--backend", "c", "-o", str(tmp_path / "c.npz")]) == 0
    with np.load(tmp_path / "c.npz") as saved:
        np.testing.assert_array_equal(saved["s.0"], run_graph(import_model(m), {"x": np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)})["s"][0])
        assert saved["s.1"].shape == (3, 3)


def test_kept_container_types_read_back_and_refuse_what_they_did_not_write():
    # The kept types travel in graph.meta, which a text graph (untrusted) also sets.
    from saturate.frontend.onnx_tensors import container_type, container_type_text

    for t in (helper.make_sequence_type_proto(helper.make_tensor_type_proto(T.INT64, None)),
              helper.make_optional_type_proto(helper.make_sequence_type_proto(helper.make_tensor_type_proto(T.BFLOAT16, None)))):
        assert container_type(container_type_text(t)) == t
    assert container_type_text(helper.make_map_type_proto(T.INT64, helper.make_tensor_type_proto(T.FLOAT, None))) is None
    deep = helper.make_tensor_type_proto(T.FLOAT, None)
    for _ in range(40):
        deep = helper.make_sequence_type_proto(deep)
    for text in ("seq(float32)", "zz", "", "08", helper.make_tensor_type_proto(T.FLOAT, [2]).SerializeToString().hex(),
                 deep.SerializeToString().hex()):
        assert container_type(text) is None
