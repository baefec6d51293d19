"""The rule of any op (fold-any): a node whose inputs are all constants becomes a constant, for ops no
other rule names, under a size limit; checked against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import saturate
from saturate.cli import main
from saturate.frontend.onnx_io import import_model
from saturate.pipeline import optimize
from saturate.simplifier import check_outputs

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, consts, x_shape, y_shape, opset=17, extra_outputs=()):
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, x_shape)],
                              [helper.make_tensor_value_info("y", F, y_shape), *extra_outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _optimized(model, **options):
    before = import_model(model)
    after, report = optimize(before, **options)
    assert check_outputs(before, after, 2) is None        # ONNX Runtime, relative error <= 1e-4
    return before, after, report


def _rng():
    return np.random.default_rng(0)


def test_relative_position_tables_fold_to_one_constant():
    # Swin V2's tables: Range, Expand, Equal, Where over Exp and a Clip with no min, ScatterND.
    r = _rng()
    nodes = [helper.make_node("Range", ["zero", "four", "one"], ["idx"]),
             helper.make_node("Expand", ["idx", "shape"], ["grid"]),
             helper.make_node("Equal", ["grid", "pick"], ["eq"]),
             helper.make_node("Exp", ["c"], ["ex"]),
             helper.make_node("Clip", ["c", "", "hi"], ["cl"]),
             helper.make_node("Where", ["eq", "ex", "cl"], ["w"]),
             helper.make_node("ScatterND", ["w", "at", "upd"], ["table"]),
             helper.make_node("Add", ["x", "table"], ["y"])]
    consts = {"zero": np.array(0, np.int64), "four": np.array(4, np.int64), "one": np.array(1, np.int64),
              "shape": np.array([3, 4], np.int64), "pick": r.integers(0, 4, (3, 4)),
              "c": r.standard_normal((3, 4)).astype(np.float32), "hi": np.array(0.5, np.float32),
              "at": np.array([[0, 1], [2, 3]], np.int64), "upd": np.array([7.0, -7.0], np.float32)}
    before, after, report = _optimized(_model(nodes, consts, [3, 4], [3, 4]))
    assert len(before.nodes) == 8
    assert after.op_counts() == {"Add": 1}
    assert report.run.matches["fold-any"] >= 5
    # The folded table keeps the name of the value it replaces.
    assert "table" in after.constants


def test_weight_standardization_folds_into_the_conv():
    # NF-ResNet: (w - mean(w)) / sqrt(var(w) + eps) * gain, per output channel, then a conv; and a
    # BatchNormalization of a constant added to its output.
    r = _rng()
    nodes = [helper.make_node("ReduceMean", ["w"], ["mean"], axes=[1, 2, 3]),
             helper.make_node("Sub", ["w", "mean"], ["d"]),
             helper.make_node("Mul", ["d", "d"], ["d2"]),
             helper.make_node("ReduceMean", ["d2"], ["var"], axes=[1, 2, 3]),
             helper.make_node("Add", ["var", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["std"]),
             helper.make_node("Div", ["d", "std"], ["ws"]),
             helper.make_node("Mul", ["ws", "gain"], ["wg"]),
             helper.make_node("Conv", ["x", "wg"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["shift", "s", "b", "m", "v"], ["bn"]),
             helper.make_node("Add", ["conv", "bn"], ["y"])]
    consts = {"w": r.standard_normal((4, 3, 3, 3)).astype(np.float32), "eps": np.array(1e-5, np.float32),
              "gain": r.standard_normal((4, 1, 1, 1)).astype(np.float32),
              "shift": r.standard_normal((1, 4, 1, 1)).astype(np.float32),
              "s": np.ones(4, np.float32), "b": np.zeros(4, np.float32),
              "m": r.standard_normal(4).astype(np.float32), "v": np.full(4, 2.0, np.float32)}
    before, after, _ = _optimized(_model(nodes, consts, [1, 3, 6, 6], [1, 4, 6, 6]))
    assert len(before.nodes) == 11
    assert after.op_counts() == {"Conv": 1}       # the standardized weight, the constant as its bias


def test_positional_encoding_and_a_conv_on_constants_fold():
    # EdgeNeXt: CumSum of ones, Sin and Cos of it, and a conv of the encoding, added to the input.
    r = _rng()
    nodes = [helper.make_node("CumSum", ["ones", "axis"], ["pos"]),
             helper.make_node("Mul", ["pos", "scale"], ["ang"]),
             helper.make_node("Sin", ["ang"], ["sin"]),
             helper.make_node("Cos", ["ang"], ["cos"]),
             helper.make_node("Concat", ["sin", "cos"], ["enc"], axis=1),
             helper.make_node("Conv", ["enc", "w"], ["proj"]),
             helper.make_node("Add", ["x", "proj"], ["y"])]
    consts = {"ones": np.ones((1, 1, 4, 4), np.float32), "axis": np.array(2, np.int64),
              "scale": np.array(0.7, np.float32), "w": r.standard_normal((3, 2, 1, 1)).astype(np.float32)}
    before, after, report = _optimized(_model(nodes, consts, [1, 3, 4, 4], [1, 3, 4, 4]))
    assert after.op_counts() == {"Add": 1}
    assert report.run.matches["fold-any"] >= 4


def test_every_output_of_a_split_of_a_constant_folds():
    r = _rng()
    nodes = [helper.make_node("Split", ["c", "sizes"], ["top", "rest"], axis=0),
             helper.make_node("Add", ["x", "top"], ["a"]),
             helper.make_node("Mul", ["a", "rest"], ["y"])]
    consts = {"c": r.standard_normal((4, 3)).astype(np.float32), "sizes": np.array([1, 3], np.int64)}
    _, after, _ = _optimized(_model(nodes, consts, [3, 3], [3, 3]))
    assert after.op_counts() == {"Add": 1, "Mul": 1}


def _expand_model():
    # A 4-byte constant expanded to 2 MiB: folding it would grow the model by that much.
    nodes = [helper.make_node("Expand", ["c", "shape"], ["e"]), helper.make_node("Add", ["x", "e"], ["y"])]
    consts = {"c": np.array([0.5], np.float32), "shape": np.array([512, 1024], np.int64)}
    return _model(nodes, consts, [512, 1024], [512, 1024])


def test_the_size_limit_keeps_a_fold_that_would_grow_the_model():
    _, kept, _ = _optimized(_expand_model())
    assert kept.op_counts() == {"Expand": 1, "Add": 1}
    _, folded, _ = _optimized(_expand_model(), max_fold_bytes=4 << 20)
    assert folded.op_counts() == {"Add": 1}
    model, ok = saturate.simplify(_expand_model(), check_n=0, max_fold_bytes="4M")
    assert ok and [n.op_type for n in model.graph.node] == ["Add"]


def test_a_fold_no_larger_than_its_inputs_needs_no_allowance():
    r = _rng()
    nodes = [helper.make_node("ReduceSum", ["c", "axes"], ["s"], keepdims=0),
             helper.make_node("Add", ["x", "s"], ["y"])]
    consts = {"c": r.standard_normal((5, 3)).astype(np.float32), "axes": np.array([0], np.int64)}
    _, after, _ = _optimized(_model(nodes, consts, [3], [3]), max_fold_bytes=0)
    assert after.op_counts() == {"Add": 1}


def test_a_nondeterministic_op_stays():
    r = _rng()
    nodes = [helper.make_node("RandomUniformLike", ["c"], ["noise"], seed=1.0),
             helper.make_node("Sin", ["c"], ["sin"]),
             helper.make_node("Add", ["noise", "sin"], ["ns"]),
             helper.make_node("Add", ["x", "ns"], ["y"])]
    consts = {"c": r.standard_normal((2, 3)).astype(np.float32)}
    before = import_model(_model(nodes, consts, [2, 3], [2, 3]))
    after, report = optimize(before)
    assert after.op_counts() == {"RandomUniformLike": 1, "Add": 2}
    assert report.run.matches["fold-any"] == 1            # the Sin beside it


def test_max_fold_bytes_on_the_command_line(tmp_path, capsys):
    path, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_expand_model(), path)
    assert main(["optimize", str(path), "-o", str(out), "--quiet", "--max-fold-bytes", "4M"]) == 0
    assert [n.op_type for n in onnx.load(out).graph.node] == ["Add"]
    bad = tmp_path / "bad.onnx"
    assert main(["optimize", str(path), "-o", str(bad), "--max-fold-bytes", "lots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-fold-bytes 'lots'" in err
    assert not bad.exists()


@pytest.mark.parametrize("text, where, message", [
    ("op(xs...) => evaluate(op, xs...)", "2:12", "folds constants"),
    ("op(a:const, b:const) => evaluate(op, a)", "2:9", "one list of constant inputs"),
    ("op(xs:const...) => evaluate(xs...)", "2:28", "the right side evaluate(op, xs...)"),
    ("op(xs:const...) => evaluate(op, xs...) if positive(xs)", "2:51", "takes the guards"),
    ("Add(x, c:const) => Add(x, c) if foldable(c)", "2:41", "reads the node of a rule of any op"),
    ("Add(x, c:const) => Add(x, neg(c...))", "2:39", "only a rule of any op"),
])
def test_bad_rules_of_any_op_are_one_error_at_their_place(text, where, message):
    from saturate.core.errors import SourceError
    from saturate.lang.parser import parse_rules

    with pytest.raises(SourceError) as err:
        parse_rules(f"ruleset r level 1\nrule r1 {text}\n", "t.rules")
    assert f"t.rules:{where}" in str(err.value).splitlines()[0] and message in str(err.value)


def test_the_checker_checks_the_rule_of_any_op(monkeypatch):
    from saturate.check.checker import check_rule
    from saturate.lang import fold
    from saturate.lang.parser import load_rules

    rule = next(r for r in load_rules(None) if r.name == "fold-any")
    assert check_rule(rule, 8, seed=0).status == "PASS"
    # An evaluation that drops the node's attributes is caught (Softmax's axis, CumSum's exclusive...).
    real = fold.evaluate
    monkeypatch.setattr(fold, "evaluate", lambda spec, inputs: real((*spec[:1], (), *spec[2:]), inputs) * 1.5)
    assert check_rule(rule, 8, seed=0).status == "FAIL"


@pytest.mark.parametrize("to, saturate_attr", [(TensorProto.FLOAT8E4M3FN, 1), (TensorProto.FLOAT8E4M3FN, 0),
                                               (TensorProto.FLOAT8E5M2, 1), (TensorProto.BFLOAT16, 1),
                                               (TensorProto.STRING, None)])
def test_casts_numpy_does_not_compute_fold_as_onnx_casts(to, saturate_attr):
    """astype is not ONNX's Cast to float8 (saturation), bfloat16 or strings: such a Cast of a constant
    folds by the interpreter's Cast with the node's attributes, and CastLike too; the folded constant
    equals the unfolded graph's value and ONNX Runtime's."""
    c = np.array([0.5, 1e6, -600.0, 3.3, 1e-7, -0.1], np.float32)
    attrs = {} if saturate_attr is None else {"saturate": saturate_attr}
    back = TensorProto.FLOAT if to != TensorProto.STRING else TensorProto.DOUBLE
    nodes = [helper.make_node("Cast", ["c"], ["q"], to=to, **attrs),
             helper.make_node("Cast", ["q"], ["f"], to=back),
             helper.make_node("CastLike", ["c", "like"], ["q2"], **attrs),
             helper.make_node("CastLike", ["q2", "f"], ["g"]),
             helper.make_node("Add", ["f", "g"], ["fg"]),
             helper.make_node("CastLike", ["fg", "x"], ["fg32"]),
             helper.make_node("Add", ["x", "fg32"], ["y"])]
    like = np.array(["a"], object) if to == TensorProto.STRING else \
        numpy_helper.to_array(helper.make_tensor("like", to, [1], [0.0]))
    model = _model(nodes, {"c": c, "like": like}, [6], [6], opset=21)
    before, after, report = _optimized(model)
    from saturate.interp import run_graph

    x = {"x": np.zeros(6, np.float32)}
    got, want = run_graph(after, x)["y"], run_graph(before, x)["y"]
    assert np.array_equal(got, want, equal_nan=True), (got, want)
    # A string's size is not known before it is computed, so a Cast to strings is not folded (fold_fits).
    if to != TensorProto.STRING:
        assert after.op_counts() == {"Add": 1}


def test_a_node_kept_for_one_output_does_not_redefine_another_that_folds():
    """StringSplit of a constant: its strings are not folded (their size is not known before they are
    computed) but its lengths are; the node stays for the strings, and the graph is valid, not one
    where the node and the folded lengths both define the output."""
    from saturate.interp import run_graph

    words = np.array(["abc.com", "de.f.net", ""], object)
    nodes = [helper.make_node("StringSplit", ["w"], ["parts", "lengths"], delimiter=".")]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("parts", TensorProto.STRING, None),
                                               helper.make_tensor_value_info("lengths", I64, [3])],
                              [numpy_helper.from_array(words, "w")])
    before = import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]))
    after, _ = optimize(before)
    after.validate()
    got, want = run_graph(after, {}), run_graph(before, {})
    assert list(after.outputs) == ["parts", "lengths"]
    for name in ("parts", "lengths"):
        assert np.array_equal(got[name], want[name]), name
