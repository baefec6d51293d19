"""optimize(): what good output looks like, differential against the interpreter and ONNX Runtime."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from engine_util import Builder, assert_same, assert_same_ort, ops
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import saturate
from saturate.frontend import examples, load_graph, save_graph
from saturate.frontend.onnx_io import export_model
from saturate.interp import run_graph
from saturate.cli import main
from saturate.lang.parser import load_rules
from saturate.core.errors import SaturateError
from saturate.core.ir import structurally_equal
from saturate.pipeline import optimize

RULES = load_rules(None, level=3)


def test_conv_bias_bn_relu_chain_becomes_conv_with_bias_and_relu():
    b = Builder(shape=(1, 3, 8, 8))
    y = b.op("Relu", b.bn(b.conv("x", 4, 3, bias=True), 4))
    y = b.op("Relu", b.bn(b.conv(y, 4, 4), 4))
    g = b.build(y)
    out, report = optimize(g, RULES)
    assert ops(out) == ["Conv", "Relu", "Conv", "Relu"]
    assert all(len(n.inputs) == 3 for n in out.nodes if n.op == "Conv")
    assert report.run.stop_reason == "saturated"
    assert_same_ort(g, out, b.sample())


def test_optimize_freezes_the_older_objects_only_while_it_runs(monkeypatch, tmp_path):
    import gc

    from saturate.engine import saturation

    b = Builder(shape=(1, 3, 8, 8))
    g = b.build(b.op("Relu", b.bn(b.conv("x", 4, 3), 4)))
    seen = []
    real = saturation.read_egraph

    def read(*args, **kwargs):
        seen.append(gc.get_freeze_count())
        return real(*args, **kwargs)

    monkeypatch.setattr(saturation, "read_egraph", read)
    assert gc.get_freeze_count() == 0
    optimize(g, RULES)
    assert seen and all(n > 0 for n in seen) and gc.get_freeze_count() == 0
    with pytest.raises(SaturateError):
        optimize(g, [str(tmp_path / "missing.rules")])
    assert gc.get_freeze_count() == 0


def test_resnet18_keeps_exactly_its_residual_adds():
    g = examples.build("resnet18")
    residual_adds = sum(1 for n in g.nodes if n.op == "Add")
    out, report = optimize(g, RULES)
    counts = out.op_counts()
    assert counts["Add"] == residual_adds > 0
    assert counts["BatchNormalization"] == 0 and counts["Mul"] == 0
    assert counts["Conv"] == g.op_counts()["Conv"]
    assert all(len(n.inputs) == 3 for n in out.nodes if n.op == "Conv")
    assert_same_ort(g, out, examples.random_inputs(g))


def test_the_input_graph_is_unchanged_and_the_result_cannot_change_it():
    g = examples.build("resnet18")
    before = g.copy()
    out, _ = optimize(g, RULES)
    assert structurally_equal(g, before)
    assert all(np.array_equal(g.constants[k], before.constants[k]) for k in g.constants)
    shared = [k for k in out.constants if k in g.constants]
    assert shared                   # weights no rule changed are the input's own arrays...
    with pytest.raises(ValueError, match="read-only"):
        out.constants[shared[0]][...] = 0    # ...which the result cannot write through
    assert np.array_equal(g.constants[shared[0]], before.constants[shared[0]])
    # Folded weights (batch norms in the convs) are the result's own, shared read-only too.
    folded = [k for k in out.constants if k not in g.constants]
    assert folded and not any(out.constants[k].flags.writeable for k in folded)


def test_a_folded_constant_that_views_an_input_weight_cannot_change_it():
    # numpy's reshape of a constant is a view of the input's array, not a copy.
    b = Builder(shape=(2, 3))
    g = b.build(b.op("Add", "x", b.op("Reshape", b.rand(6), b.const(np.array([2, 3], np.int64)))))
    before = g.copy()
    out, _ = optimize(g, RULES)
    assert ops(out) == ["Add"]
    (folded,) = [v for k, v in out.constants.items() if k not in g.constants]
    with pytest.raises(ValueError, match="read-only"):
        folded[...] = 0
    assert all(np.array_equal(g.constants[k], before.constants[k]) for k in g.constants)
    assert_same(g, out, b.sample())


def test_three_constant_adds_become_one():
    b = Builder(shape=(2, 3))
    y = b.op("Add", b.op("Add", b.op("Add", "x", b.rand(3)), b.rand(1, 3)), b.rand(2, 1))
    g = b.build(y)
    out, _ = optimize(g, RULES)
    assert ops(out) == ["Add"]
    assert_same(g, out, b.sample())


def test_two_constant_muls_become_one():
    b = Builder(shape=(2, 3))
    g = b.build(b.op("Mul", b.op("Mul", "x", b.rand(3)), b.rand(3)))
    out, _ = optimize(g, RULES)
    assert ops(out) == ["Mul"]
    assert_same(g, out, b.sample())


def _scale_relu_conv(sign: float) -> tuple:
    b = Builder(shape=(1, 4, 6, 6))
    s = np.abs(b.rng.standard_normal((1, 4, 1, 1))).astype(np.float32) + 0.5
    s[0, 2, 0, 0] *= sign
    y = b.conv(b.op("Relu", b.op("Mul", "x", b.const(s))), 5, 4)
    return b, b.build(y)


def test_positive_scale_moves_through_relu_into_the_weights():
    b, g = _scale_relu_conv(+1.0)
    out, _ = optimize(g, RULES)
    assert ops(out) == ["Relu", "Conv"]
    assert_same_ort(g, out, b.sample())


def test_scale_with_a_negative_element_stays():
    b, g = _scale_relu_conv(-1.0)
    out, _ = optimize(g, RULES)
    assert ops(out) == ["Mul", "Relu", "Conv"]
    assert_same(g, out, b.sample())


def test_data_dependent_scale_is_never_folded():
    b = Builder(shape=(1, 4, 6, 6))
    gate = b.op("Relu", b.op("GlobalAveragePool", "x"))
    g = b.build(b.conv(b.op("Mul", "x", gate), 4, 4))
    out, _ = optimize(g, RULES)
    assert sorted(ops(out)) == sorted(ops(g))
    mul = next(n for n in out.nodes if n.op == "Mul")
    assert not any(i in out.constants for i in mul.inputs)
    assert_same(g, out, b.sample())


def test_unknown_op_stays_and_folding_happens_on_both_sides():
    b = Builder(shape=(1, 3, 6, 6))
    y = b.op("Exp", b.bn(b.conv("x", 4, 3), 4))
    y = b.op("Relu", b.bn(b.conv(y, 4, 4), 4))
    g = b.build(y)
    out, _ = optimize(g, RULES)
    assert ops(out) == ["Conv", "Exp", "Conv", "Relu"]
    assert_same(g, out, b.sample())


def test_conv_with_two_consumers_is_not_duplicated():
    b = Builder(shape=(1, 4, 6, 6))
    c = b.conv("x", 4, 4)
    g = b.build(b.bn(c, 4), b.op("Relu", c))
    out, report = optimize(g, RULES)
    assert out.op_counts()["Conv"] == 1
    assert report.cost_after <= report.cost_before
    assert_same(g, out, b.sample())


def test_rule_order_does_not_change_the_result():
    g = examples.build("resnet18")
    first, _ = optimize(g, RULES)
    shuffled = list(RULES)
    random.Random(7).shuffle(shuffled)
    second, _ = optimize(g, shuffled)
    assert structurally_equal(first, second)


def test_a_second_run_of_one_program_reuses_its_declared_egraph_and_gives_the_same_graph(monkeypatch):
    """The e-graph holding a program's declarations is kept between runs: the second run of the same
    graph declares nothing, works on the e-graph the first returned, and gives the same graph."""
    from saturate.engine import encode

    monkeypatch.setattr(encode, "_prepared", type(encode._prepared)())
    g = examples.build("resnet18")
    declared = []
    run_rows = encode.Rows.run

    def spy(rows, eg):
        declared.extend(c for c in rows.commands if c.startswith("(relation"))
        run_rows(rows, eg)

    monkeypatch.setattr(encode.Rows, "run", spy)
    first, r1 = optimize(g, RULES)
    assert len(encode._prepared) == 1 and declared
    kept, late = next(iter(encode._prepared.values()))
    assert len(late) == len(declared)
    declared.clear()
    second, r2 = optimize(g, RULES)
    # The relations and apply rules the first run declared on first need were kept too.
    assert declared == []
    assert structurally_equal(first, second) and r1.run.iterations == r2.run.iterations
    assert r1.run.matches == r2.run.matches and r1.cost_after == r2.cost_after
    assert len(encode._prepared) == 1 and next(iter(encode._prepared.values()))[0] is kept


def test_the_kept_egraphs_are_bounded_and_one_an_error_left_is_dropped(monkeypatch):
    from saturate.engine import encode
    from saturate.engine import saturation

    monkeypatch.setattr(encode, "_prepared", type(encode._prepared)())
    monkeypatch.setattr(encode, "PREPARED_KEEP", 2)
    for name in ("chain-4", "resnet18", "mobilenet"):
        optimize(examples.build(name), RULES)
    assert len(encode._prepared) == 2
    before = {key: eg for key, (eg, _) in encode._prepared.items()}

    def fail(*args, **kwargs):
        raise SaturateError("interrupted")

    monkeypatch.setattr("saturate.pipeline.saturate", fail)
    with pytest.raises(SaturateError):
        optimize(examples.build("mobilenet"), RULES)
    assert len(encode._prepared) == 1
    assert {key: eg for key, (eg, _) in encode._prepared.items()}.items() < before.items()
    monkeypatch.undo()
    assert saturation.saturate is not fail


def test_runs_in_threads_at_once_each_get_an_egraph_of_their_own():
    """egglog's e-graph may be used only on the thread that made it: threads build their own and keep
    none, while the main thread keeps its e-graph for its next run."""
    import threading

    g = examples.build("resnet18")
    want, _ = optimize(g, RULES)
    got, errors = [], []

    def run():
        try:
            got.append(optimize(g, RULES)[0])
        except BaseException as err:  # noqa: BLE001 - egglog's panics are BaseExceptions
            errors.append(err)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(got) == 3 and all(structurally_equal(want, out) for out in got)


@pytest.mark.parametrize("limits, reason", [
    ({"max_iterations": 1}, "iteration limit"),
    ({"max_nodes": 10}, "node limit"),
    ({"timeout": 1e-9}, "time limit"),
])
def test_a_limit_still_gives_a_correct_graph_and_says_why(limits, reason):
    g = examples.build("chain-4")
    out, report = optimize(g, RULES, **limits)
    assert report.run.stop_reason == reason and report.run.hit_limit
    assert_same(g, out, examples.random_inputs(g))


def test_preserved_op_is_left_alone():
    b = Builder(shape=(1, 3, 6, 6))
    g = b.build(b.op("Relu", b.bn(b.conv("x", 4, 3), 4)))
    out, _ = optimize(g, RULES, preserve=["BatchNormalization"])
    assert ops(out) == ["Conv", "BatchNormalization", "Relu"]
    assert_same(g, out, b.sample())


def test_api_is_exported_from_the_package():
    g = examples.build("chain-2")
    out, report = saturate.optimize(g)
    assert out.op_counts() == {"Conv": 2, "Relu": 2}
    assert report.rules == len(RULES)


def test_cli_writes_the_same_graph_as_the_api_and_a_report(tmp_path, capsys):
    out_path, rep_path = tmp_path / "out.onnx", tmp_path / "r.json"
    code = main(["optimize", "example:resnet18", "-o", str(out_path), "--report", str(rep_path),
                 "--trace"])
    assert code == 0
    api, _ = optimize(examples.build("resnet18"), RULES)
    cli = load_graph(str(out_path))
    assert cli.op_counts() == api.op_counts()
    report = json.loads(rep_path.read_text())
    assert report["stop_reason"] == "saturated"
    assert report["ops_before"]["BatchNormalization"] == 20 and "BatchNormalization" not in report["ops_after"]
    assert set(report["times"]) == {"import", "encode", "saturate", "extract", "fold", "check", "export"}
    assert len(report["egraph_sizes"]) == report["iterations"] + 1
    fired = {m["rule"]: m for m in report["matches"] if m["matches"]}
    assert "batchnorm" in fired and re.fullmatch(r".+\.rules:\d+:\d+", fired["batchnorm"]["at"])
    err = capsys.readouterr().err
    assert "stopped: saturated" in err and "batchnorm" in err and "iteration" in err


@pytest.mark.parametrize("example,flags", [("mobilenet", []), ("mobilenet", ["--no-std"]),
                                           ("mobilenet", ["--only", "conv-bias"])])
def test_cli_to_onnx_and_text_and_the_api_give_one_graph(tmp_path, example, flags):
    """Export writes exactly the graph extraction chose: no fold happens outside the rules."""
    chosen = {"--no-std": [], "--only": [r for r in RULES if r.name == "conv-bias"]}
    api, _ = optimize(examples.build(example), chosen.get(flags[0], RULES) if flags else RULES)
    for suffix in (".onnx", ".sat"):
        out = tmp_path / f"out{suffix}"
        assert main(["optimize", f"example:{example}", "-o", str(out), *flags]) == 0
        assert structurally_equal(load_graph(str(out)), api), suffix


def test_cli_version_is_the_installed_packages(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"saturate {version('saturate-onnx')}\n"


def test_cli_bad_input_is_one_clean_error(tmp_path, capsys):
    assert main(["optimize", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "o.onnx")]) == 2
    assert capsys.readouterr().err.startswith("saturate: error: ")
    assert main(["optimize", "example:mlp", "-o", str(tmp_path / "o.onnx"), "--timeout", "0"]) == 2
    assert not (tmp_path / "o.onnx").exists()


def test_cli_only_named_rules_and_a_level_that_excludes_one_is_an_error(tmp_path, capsys):
    out = tmp_path / "o.onnx"
    assert main(["optimize", "example:vgg", "-o", str(out), "--only", "batchnorm", "conv-bias-scale-out",
                 "conv-bias-add"]) == 0
    assert "BatchNormalization 5->0" in capsys.readouterr().out
    assert main(["optimize", "example:vgg", "-o", str(tmp_path / "p.onnx"), "--level", "2",
                 "--only", "batchnorm", "conv-bias-scale-out"]) == 2
    assert "rule 'conv-bias-scale-out' is level 3 but --level is 2" in capsys.readouterr().err
    assert not (tmp_path / "p.onnx").exists()


# ---- property: random conv/bn/add/mul/relu graphs keep their numerics -------------------------

@st.composite
def random_graphs(draw):
    seed = draw(st.integers(0, 2**16))
    b = Builder(shape=(1, 3, 5, 5), seed=seed)
    values, channels = ["x"], {"x": 3}
    for _ in range(draw(st.integers(1, 6))):
        src = draw(st.sampled_from(values))
        c = channels[src]
        kind = draw(st.sampled_from(["conv", "bn", "add", "mul", "relu", "addv", "sub", "div", "gate", "exp"]))
        if kind == "conv":
            cout = draw(st.integers(2, 4))
            y = b.conv(src, cout, c, k=draw(st.sampled_from([1, 3])), bias=draw(st.booleans()))
            c = cout
        elif kind == "bn":
            y = b.bn(src, c)
        elif kind == "relu":
            y = b.op("Relu", src)
        elif kind == "gate":
            y = b.op("Mul", src, b.op("Relu", b.op("GlobalAveragePool", src)))
        elif kind == "exp":
            y = b.op("Exp", b.op("Mul", src, b.const(np.float32(0.1))))
        elif kind == "addv":
            other = draw(st.sampled_from([v for v in values if channels[v] == c]))
            y = b.op("Add", src, other)
        else:
            shape = draw(st.sampled_from([(1, c, 1, 1), (1,), (c, 1, 1)]))
            arr = b.rng.standard_normal(shape).astype(np.float32)
            if draw(st.booleans()):
                arr = np.abs(arr) + 0.25
            op = {"add": "Add", "mul": "Mul", "sub": "Sub", "div": "Div"}[kind]
            y = b.op(op, src, b.const(np.abs(arr) + 0.25 if op == "Div" else arr))
        values.append(y)
        channels[y] = c
    used = {i for n in b.g.nodes for i in n.inputs}
    return b, b.build(*[v for v in values[1:] if v not in used])   # every sink is an output


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs())
def test_random_graphs_keep_their_numerics(case):
    b, g = case
    out, report = optimize(g, RULES)
    assert report.cost_after <= report.cost_before
    assert_same(g, out, b.sample())


def test_outputs_keep_their_names_when_they_fold_to_an_input_or_a_constant():
    b = Builder(shape=(2, 3))
    y = b.op("Identity", "x")
    k = b.op("Add", b.rand(3), b.rand(3))
    g = b.build(y, k)
    out, _ = optimize(g, RULES)
    assert out.outputs == [y, k]
    assert ops(out) == ["Identity", "Identity"]
    assert_same(g, out, b.sample())


def test_cli_takes_extra_rules_level_and_preserve(tmp_path, capsys):
    rules = tmp_path / "mine.rules"
    # A fold the standard library lacks: an integer-valued Floor is its own Ceil.
    rules.write_text("ruleset mine level 1\nrule ceil-floor Ceil(Floor(x)) => Floor(x)\n")
    b = Builder(shape=(2, 3))
    g = b.build(b.op("Ceil", b.op("Floor", b.op("Sub", "x", b.rand(3)))))
    from saturate.frontend import save_graph
    model, out = tmp_path / "m.sat", tmp_path / "o.sat"
    save_graph(g, str(model))
    assert main(["optimize", str(model), "-o", str(out), "--rules", str(rules), "--level", "1",
                 "--trace"]) == 0
    assert ops(load_graph(str(out))) == ["Sub", "Floor"]
    assert "ceil-floor" in capsys.readouterr().err
    assert main(["optimize", str(model), "-o", str(out), "--rules", str(rules),
                 "--preserve", "Ceil"]) == 0
    assert ops(load_graph(str(out))) == ["Sub", "Floor", "Ceil"]


def test_a_guard_numpy_cannot_evaluate_leaves_its_rule_unfired(tmp_path):
    # fine_accumulator multiplies two scales: of shapes (2,) and (3,) numpy refuses, and the
    # ValueError came out of `saturate optimize` as a traceback.
    rules, model, out = tmp_path / "mine.rules", tmp_path / "m.sat", tmp_path / "o.sat"
    rules.write_text("ruleset mine level 2\n"
                     "rule odd Concat(Mul(x, a:const), Mul(y, b:const)){axis=k} => Concat(x, y){axis=k}"
                     " if fine_accumulator(a, b, a)\n")
    model.write_text("graph g opset 17\n  input %x: float32[5, 2]\n  input %y: float32[5, 3]\n"
                     "  const %a: float32[2] = [2, 3]\n  const %b: float32[3] = [4, 5, 6]\n"
                     "  %p: float32[5, 2] = Mul(%x, %a)\n  %q: float32[5, 3] = Mul(%y, %b)\n"
                     "  %z: float32[5, 5] = Concat(%p, %q){axis=1}\n  output %z\n")
    assert main(["optimize", str(model), "-o", str(out), "--rules", str(rules), "--quiet"]) == 0
    assert ops(load_graph(str(out))) == ["Mul", "Mul", "Concat"]


@pytest.mark.parametrize("name", ["mlp", "mobilenet", "vgg11bn",
                                  pytest.param("resnet50", marks=pytest.mark.slow)])
def test_examples_match_onnx_runtime_after_optimizing(name):
    g = examples.build(name)
    out, report = optimize(g, RULES)
    assert report.cost_after <= report.cost_before
    assert "BatchNormalization" not in out.op_counts()
    assert_same_ort(g, out, examples.random_inputs(g))


def test_a_rule_on_an_op_the_table_does_not_know_still_applies():
    from saturate.lang.ast import Loc, OpTerm, Rule, Var
    x = Var("x")
    rule = Rule("log-exp", OpTerm("Log", (OpTerm("Exp", (x,)),)), x, (), "mine", 1, Loc("mine.rules", 1))
    b = Builder(shape=(2, 3))
    g = b.build(b.op("Relu", b.op("Log", b.op("Exp", "x"))))
    out, report = optimize(g, [rule])
    assert ops(out) == ["Relu"] and report.run.matches["log-exp"] >= 1
    assert_same(g, out, b.sample())


def test_a_rule_that_feeds_on_its_own_output_stops_at_a_limit():
    from saturate.lang.parser import parse_rules
    text = "ruleset grow level 1\nrule split Mul(x, c:const) => Mul(Mul(x, sqrt(c)), sqrt(c)) if positive(c)\n"
    rules = [r for rs in parse_rules(text, "grow.rules") for r in rs.rules]
    b = Builder(shape=(2, 3))
    g = b.build(b.op("Mul", "x", b.rand(3, low=0.5)))
    out, report = optimize(g, rules, max_iterations=50, max_nodes=400, timeout=20)
    # The limit holds inside an iteration: the step that would pass it is held back.
    assert report.run.stop_reason == "node limit" and report.run.held_back == {"split": "node limit"}
    assert 100 < report.run.peak_nodes <= 400 and max(report.run.sizes) <= 400
    assert ops(out) == ["Mul"]
    assert_same(g, out, b.sample())


def _reshape_by_batch_model(batch, dim=0):
    """What `x.reshape(x.shape[0], -1) @ w` exports to (Shape, Gather, Unsqueeze, Concat), with
    clip bounds Cast from int constants and a Squeeze of a constant, as exporters leave them.
    With `dim` > 0, `x.reshape(-1, x.shape[dim]) @ w` instead."""
    from onnx import TensorProto, helper, numpy_helper

    def const(name, arr):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr), name))

    nodes = [
        const("idx", np.array(dim, np.int64)), const("ax0", np.array([0], np.int64)),
        const("minus1", np.array([[-1]], np.int64)), const("lo", np.array(-1, np.int64)),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "idx"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        helper.make_node("Squeeze", ["minus1", "ax0"], ["m1"]),
        helper.make_node("Concat", ["n1", "m1"] if dim == 0 else ["m1", "n1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Cast", ["lo"], ["lo_f"], to=TensorProto.FLOAT),
        helper.make_node("Clip", ["flat", "lo_f"], ["clipped"]),
        helper.make_node("MatMul", ["clipped", "w"], ["y"]),
    ]
    k = 12 if dim == 0 else (3, 4)[dim - 1]
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((k, 5)).astype(np.float32), "w")
    graph = helper.make_graph(nodes, "shape_chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 5])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _ort_run(model, x):
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _rel_err(a, b):
    return float(np.abs(a.astype(np.float64) - b).max()) / max(float(np.abs(a).max()), 1e-6)


def test_static_shape_computation_folds_into_a_constant_reshape():
    from saturate.frontend.onnx_io import export_model, import_model

    model = _reshape_by_batch_model(2)
    out, report = optimize(import_model(model), RULES)
    assert not {"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Cast"} & set(ops(out))
    reshape = next(n for n in out.nodes if n.op == "Reshape")
    assert out.constants[reshape.inputs[1]].tolist() == [2, -1]
    assert report.run.matches["shape-static"] > 0
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    assert _rel_err(_ort_run(model, x), _ort_run(export_model(out), x)) <= 1e-4


def test_symbolic_batch_shape_computation_becomes_a_target_copying_the_batch():
    from saturate.frontend.onnx_io import export_model, import_model

    model = _reshape_by_batch_model("N")
    out, report = optimize(import_model(model), RULES)
    assert not {"Shape", "Gather", "Unsqueeze", "Concat"} & set(ops(out))
    assert report.run.matches["shape-static"] == 0
    reshape = next(n for n in out.nodes if n.op == "Reshape")
    assert out.constants[reshape.inputs[1]].tolist() == [0, -1]
    exported = export_model(out)
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 4)).astype(np.float32)
        assert _rel_err(_ort_run(model, x), _ort_run(exported, x)) <= 1e-4


def test_static_dim_of_a_symbolic_batch_shape_folds():
    from saturate.frontend.onnx_io import export_model, import_model

    model = _reshape_by_batch_model("N", dim=2)
    out, report = optimize(import_model(model), RULES)
    assert not {"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Cast"} & set(ops(out))
    reshape = next(n for n in out.nodes if n.op == "Reshape")
    assert out.constants[reshape.inputs[1]].tolist() == [-1, 4]
    assert report.run.matches["shape-gather"] > 0 and report.run.matches["shape-static"] == 0
    exported = export_model(out)
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 4)).astype(np.float32)
        assert _rel_err(_ort_run(model, x), _ort_run(exported, x)) <= 1e-4


def _bn_params_as_inputs(tmp_path) -> str:
    model = export_model(examples.build("vgg"))
    names = {i.name for i in model.graph.input}
    for init in model.graph.initializer:  # keep_initializers_as_inputs
        if init.name not in names:
            model.graph.input.append(onnx.helper.make_tensor_value_info(
                init.name, init.data_type, list(init.dims)))
    path = tmp_path / "inputs.onnx"
    onnx.save(model, str(path))
    return str(path)


def test_initializers_listed_as_inputs_stay_overridable_inputs(tmp_path):
    path = _bn_params_as_inputs(tmp_path)
    graph = load_graph(path)
    out, _ = optimize(graph, RULES)
    assert out.inputs == graph.inputs and out.op_counts()["BatchNormalization"] > 0
    feeds = examples.random_inputs(graph)
    assert set(feeds) == {"x"}
    # Overriding a weight through its input changes the result, as in ONNX Runtime.
    weight = next(n for n in graph.inputs if graph.constants.get(n) is not None and graph.constants[n].ndim == 4)
    doubled = {**feeds, weight: 2 * graph.constants[weight]}
    for inputs in (feeds, doubled):
        want, got = run_graph(graph, inputs), run_graph(out, inputs)
        for name in graph.outputs:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)
    exported = tmp_path / "out.onnx"
    save_graph(out, str(exported))
    session = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for inputs in (feeds, doubled):
        np.testing.assert_allclose(session.run(None, inputs)[0], ref.run(None, inputs)[0], rtol=1e-4, atol=1e-5)


def test_fold_initializer_inputs_folds_them_as_constants(tmp_path):
    path = _bn_params_as_inputs(tmp_path)
    out_path = tmp_path / "folded.onnx"
    assert main(["optimize", path, "-o", str(out_path), "--fold-initializer-inputs"]) == 0
    folded = load_graph(str(out_path))
    assert folded.inputs == ["x"] and "BatchNormalization" not in folded.op_counts()


def test_input_defaults_round_trip_through_the_text_form(tmp_path):
    graph = load_graph(_bn_params_as_inputs(tmp_path))
    save_graph(graph, str(tmp_path / "g.sat"))
    again = load_graph(str(tmp_path / "g.sat"))
    assert structurally_equal(graph, again) and again.inputs == graph.inputs


def test_rules_that_cannot_match_the_graph_are_not_compiled_but_are_reported():
    from saturate.engine.compile_rules import applicable_rules

    rules = load_rules(None, level=3)
    conv_only = {r.name for r in applicable_rules(rules, {"Conv", "BatchNormalization", "Relu"})}
    assert {"batchnorm", "conv-scale-out"} <= conv_only                # on the graph's own ops
    assert "conv-bias" in conv_only                                     # Add: built by batchnorm's right side
    assert not {"fold-transpose", "shape-gather", "slice-whole-3"} & conv_only
    b = Builder(shape=(1, 4, 6, 6))
    before = b.build(b.op("Relu", b.bn(b.conv("x", 4, 4), 4)))
    after, report = optimize(before)
    assert ops(after) == ["Conv", "Relu"]
    assert report.run.matches["shape-gather"] == 0 and "shape-gather" in report.run.locations


# ---- BatchNormalization in training mode ---------------------------------------------------------
def _training_bn_model(tmp_path, weights: bool, conv_first: bool = False) -> str:
    """A BatchNormalization with training_mode=1 whose running statistics nobody reads: on a conv weight reshaped to (1, out, -1) when `weights` (timm's NF-ResNet weight
    standardization), else on the graph's input (after a Conv when `conv_first`), then a Relu."""
    rng = np.random.default_rng(0)
    const = {"w": rng.standard_normal((8, 4, 3, 3)).astype(np.float32),
             "gain": rng.uniform(0.5, 1.5, 8).astype(np.float32), "beta": rng.standard_normal(8).astype(np.float32),
             "mean": np.zeros(8, np.float32), "var": np.ones(8, np.float32),
             "flat": np.array([1, 8, -1], np.int64), "back": np.array([8, 4, 3, 3], np.int64)}
    bn_ins = ["gain", "beta", "mean", "var"]
    stats = ["rm", "rv"]
    if weights:
        nodes = [onnx.helper.make_node("Reshape", ["w", "flat"], ["w1"]),
                 onnx.helper.make_node("BatchNormalization", ["w1", *bn_ins], ["w2", *stats], epsilon=1e-5,
                                       momentum=0.0, training_mode=1),
                 onnx.helper.make_node("Reshape", ["w2", "back"], ["w3"]),
                 onnx.helper.make_node("Conv", ["x", "w3"], ["c"], pads=[1, 1, 1, 1]),
                 onnx.helper.make_node("Relu", ["c"], ["y"])]
        x_shape, y_shape = [2, 4, 6, 6], [2, 8, 6, 6]
    else:
        first = [onnx.helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])] if conv_first else []
        nodes = first + [onnx.helper.make_node("BatchNormalization", ["c" if conv_first else "x", *bn_ins],
                                               ["b", *stats], epsilon=1e-5, momentum=0.0, training_mode=1),
                         onnx.helper.make_node("Relu", ["b"], ["y"])]
        x_shape, y_shape = ([2, 4, 6, 6] if conv_first else [2, 8, 6, 6]), [2, 8, 6, 6]
    outputs = [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, y_shape)]
    used = {i for n in nodes for i in n.input}
    graph = onnx.helper.make_graph(
        nodes, "nf", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_shape)], outputs,
        [onnx.numpy_helper.from_array(v, k) for k, v in const.items() if k in used])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 15)])
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "in.onnx"
    onnx.save(model, str(path))
    return str(path)


def _valid_and_same(source: str, written: str) -> onnx.ModelProto:
    """The written model passes the full ONNX check and gives ONNX Runtime's outputs of the source."""
    model = onnx.load(written)
    onnx.checker.check_model(model, full_check=True)
    feed = {"x": np.random.default_rng(1).standard_normal(
        [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)}
    want = ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feed)
    got = ort.InferenceSession(written, providers=["CPUExecutionProvider"]).run(None, feed)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    return model


def test_constant_batch_norm_in_training_mode_folds_by_a_rule_into_a_valid_model(tmp_path):
    source = _training_bn_model(tmp_path, weights=True)
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    assert main(["optimize", source, "-o", str(out), "--report", str(report), "--quiet"]) == 0
    model = _valid_and_same(source, str(out))
    assert [n.op_type for n in model.graph.node] == ["Conv", "Relu"]
    fired = {m["rule"]: m["matches"] for m in json.loads(report.read_text())["matches"]}
    assert fired["batchnorm-training-const"] == 1


@pytest.mark.parametrize("conv_first", [False, True])
def test_batch_norm_in_training_mode_on_a_variable_stays_whole_with_its_outputs(tmp_path, conv_first):
    source = _training_bn_model(tmp_path, weights=False, conv_first=conv_first)
    out = tmp_path / "out.onnx"
    assert main(["optimize", source, "-o", str(out), "--quiet"]) == 0
    (bn,) = [n for n in _valid_and_same(source, str(out)).graph.node if n.op_type == "BatchNormalization"]
    assert len(bn.output) == 3


@pytest.mark.parametrize("target", ["accel", "fused"])
def test_a_partitioned_batch_norm_in_training_mode_keeps_its_outputs_in_the_function(tmp_path, target):
    source = _training_bn_model(tmp_path, weights=False, conv_first=True)
    out = tmp_path / "out.onnx"
    assert main(["partition", source, "-t", target, "-o", str(out), "--quiet"]) == 0
    model = _valid_and_same(source, str(out))
    bns = [n for f in model.functions for n in f.node if n.op_type == "BatchNormalization"]
    bns += [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    assert len(bns) == 1 and len(bns[0].output) == 3


# ---- --check, --input-shape, --skip, and outputs faithful to the input ---------------------
def _named_model(tmp_path, batch="N") -> str:
    """Conv -> BatchNormalization -> Relu with node names, a producer, IR version 13 (when onnx
    knows it), doc strings and metadata: what an exporter writes."""
    rng = np.random.default_rng(0)
    weights = {"conv.weight": rng.standard_normal((4, 3, 3, 3)), "bn.scale": rng.random(4) + 0.5,
               "bn.bias": rng.standard_normal(4), "bn.mean": rng.standard_normal(4), "bn.var": rng.random(4) + 0.5}
    nodes = [helper.make_node("Conv", ["x", "conv.weight"], ["c"], name="/conv/Conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["b"],
                              name="/bn/BatchNormalization"),
             helper.make_node("Relu", ["b"], ["y"], name="/relu/Relu", doc_string="a relu")]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, 5, 5])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
                              doc_string="graph doc")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="exporter",
                              producer_version="2.1", doc_string="model doc")
    model.ir_version = min(onnx.IR_VERSION, 13)
    helper.set_model_props(model, {"author": "someone"})
    path = tmp_path / "named.onnx"
    onnx.save(model, path)
    return str(path)


def test_cli_check_refuses_a_rule_that_changes_outputs_unless_forced(tmp_path, capsys):
    source = _named_model(tmp_path)
    rules = tmp_path / "bad.rules"
    rules.write_text("ruleset bad level 1\nrule drop-relu Relu(x) => x\n")
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    before = open(source, "rb").read()
    assert main(["optimize", source, "-o", str(out), "--rules", str(rules), "--report", str(report)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("saturate: error: ")
    assert "output 'y'" in err and "relative error of" in err and "not written (--force writes it)" in err
    assert not out.exists() and not report.exists() and open(source, "rb").read() == before
    assert main(["optimize", source, "-o", str(out), "--rules", str(rules), "--force"]) == 1
    assert out.exists() and "written anyway" in capsys.readouterr().err
    out.unlink()
    assert main(["optimize", source, "-o", str(out), "--rules", str(rules), "--check", "0"]) == 0
    assert out.exists()
    assert main(["optimize", source, "-o", str(out), "--check", "-1"]) == 2


def test_cli_names_an_invalid_input_model_rather_than_the_result(tmp_path, capsys):
    # A MatMul turned into a Tile reading float repeats: the schema refuses the input itself, so
    # the error is the input's (node and op named), not "the result is not valid": import's type
    # inference finds it.
    model = onnx.ModelProto()
    model.CopyFrom(examples.build_model("mlp"))     # the examples' models are shared: edit a copy
    for node in model.graph.node:
        if node.name == "matmul2":
            node.op_type = "Tile"
    source = tmp_path / "tile.onnx"
    onnx.save(model, source)
    before = source.read_bytes()
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(source), "-o", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"saturate: error: {source}: invalid ONNX model: ")
    assert "Tile" in err and "matmul2" in err
    assert list(tmp_path.iterdir()) == [source] and source.read_bytes() == before


def test_cli_check_passes_a_correct_result_and_a_batch_takes_it_too(tmp_path, capsys):
    source = _named_model(tmp_path)
    assert main(["optimize", source, "-o", str(tmp_path / "ok.onnx"), "--check", "3"]) == 0
    rules = tmp_path / "bad.rules"
    rules.write_text("ruleset bad level 1\nrule drop-relu Relu(x) => x\n")
    out = tmp_path / "outs"
    assert main(["optimize", source, "example:mlp", "-o", str(out), "--rules", str(rules), "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert "check against ONNX Runtime failed" in err
    assert not list(out.glob("*.onnx"))
    assert main(["optimize", source, "example:mlp", "-o", str(out), "--rules", str(rules), "--jobs", "1",
                 "--check", "0", "--skip", "drop-relu", "--input-shape", "x:1,3,5,5", "--quiet"]) == 2
    assert "input 'x' has rank 2" in capsys.readouterr().err      # example:mlp's x: that job fails
    assert [p.name for p in out.glob("*.onnx")] == ["named.onnx"]


def _scaled(dtype: str, factor: float):
    """y = x * c for a 4 x 64 constant c of `dtype` (random), times `factor`."""
    from saturate.core.ir import Graph, Node, ValueInfo

    g = Graph(name="s", opset=17, inputs=["x"], outputs=["y"])
    g.values["x"] = g.values["y"] = ValueInfo(dtype, (4, 64))
    c = np.random.default_rng(0).uniform(0.5, 2.0, (4, 64)) * factor
    g.constants["c"] = c.astype(dtype)
    g.nodes.append(Node("Mul", ["x", "c"], ["y"], {}, name="scale"))
    return g


def test_check_tolerance_follows_the_outputs_dtype():
    from saturate.simplifier import CHECK_TOLERANCE, check_outputs, tolerance

    assert tolerance(np.float32) == tolerance(np.float64) == tolerance(np.int64) == CHECK_TOLERANCE
    assert tolerance(np.float16) == 4 * float(np.finfo(np.float16).eps)
    # One rounding of half precision moves a weight by up to 2**-11 relative: allowed in float16,
    # not in float32, where the same change is refused with the tolerance it had.
    assert check_outputs(_scaled("float16", 1), _scaled("float16", 1 + 1e-3), samples=2) is None
    failure = check_outputs(_scaled("float32", 1), _scaled("float32", 1 + 1e-3), samples=2)
    assert failure is not None and "(allowed 0.0001)" in str(failure)
    failure = check_outputs(_scaled("float16", 1), _scaled("float16", 1.01), samples=2)
    assert failure is not None and "(allowed 0.0039)" in str(failure)


def test_cli_skip_leaves_a_rule_out_and_an_unknown_one_is_an_error(tmp_path, capsys):
    source, out = _named_model(tmp_path), tmp_path / "out.onnx"
    assert main(["optimize", source, "-o", str(out), "--skip", "batchnorm", "--quiet"]) == 0
    assert "BatchNormalization" in [n.op_type for n in onnx.load(out).graph.node]
    assert main(["optimize", source, "-o", str(out), "--skip", "batchnrom"]) == 2
    assert capsys.readouterr().err == "saturate: error: no rule named 'batchnrom' to skip among the rules loaded\n"


def test_cli_input_shape_makes_a_dynamic_input_static_in_either_spelling(tmp_path, capsys):
    source, out = _named_model(tmp_path), tmp_path / "out.onnx"
    for spec in ("x:2,3,5,5", "x=2x3x5x5"):
        assert main(["optimize", source, "-o", str(out), "--input-shape", spec, "--quiet"]) == 0
        model = onnx.load(out)
        for vi in (model.graph.input[0], model.graph.output[0]):
            assert [d.dim_value for d in vi.type.tensor_type.shape.dim][:2] == [2, 3 if vi.name == "x" else 4]
    assert main(["optimize", source, "-o", str(out), "--input-shape", "x:2,3,6,5"]) == 2
    assert "dim 2 of input 'x' is static, 5, not 6" in capsys.readouterr().err
    assert main(["optimize", source, "-o", str(out), "--input-shape", "x:2,a"]) == 2
    assert "bad --input-shape 'x:2,a'" in capsys.readouterr().err


def test_cli_output_keeps_names_producer_ir_version_docs_and_metadata(tmp_path):
    source, out = _named_model(tmp_path), tmp_path / "out.onnx"
    assert main(["optimize", source, "-o", str(out), "--quiet"]) == 0
    model, original = onnx.load(out), onnx.load(source)
    onnx.checker.check_model(model, full_check=True)
    assert (model.producer_name, model.producer_version, model.ir_version) == \
        ("exporter", "2.1", original.ir_version)
    assert (model.doc_string, model.graph.doc_string) == ("model doc", "graph doc")
    assert [(p.key, p.value) for p in model.metadata_props] == [("author", "someone")]
    assert [(n.op_type, n.name, n.doc_string) for n in model.graph.node] == \
        [("Conv", "/bn/BatchNormalization", ""), ("Relu", "/relu/Relu", "a relu")]
    assert sorted(t.name for t in model.graph.initializer) == ["bn.bias_folded", "conv.weight_folded"]
    # Through the text form too.
    text = tmp_path / "out.sat"
    assert main(["optimize", source, "-o", str(text), "--quiet"]) == 0
    assert main(["optimize", str(text), "-o", str(out), "--quiet"]) == 0
    assert (onnx.load(out).producer_name, onnx.load(out).ir_version) == ("exporter", original.ir_version)


def test_cli_refuses_an_unknown_output_suffix_and_trace_says_what_it_wrote(tmp_path, capsys):
    source = _named_model(tmp_path)
    assert main(["optimize", source, "-o", str(tmp_path / "out.onxx")]) == 2
    assert capsys.readouterr().err.startswith("saturate: error: -o ")
    assert not list(tmp_path.glob("out*"))
    out = tmp_path / "out.onnx"
    assert main(["optimize", source, "-o", str(out), "--trace"]) == 0
    assert f"wrote {out}: " in capsys.readouterr().out


def test_a_node_for_a_value_the_input_had_no_node_for_is_named_after_its_reader():
    # Attention's projections: MatMul + Add on 3-d values become Reshape -> Gemm -> Reshape.
    graph = load_graph("corpus:encoder-ts")
    out, _ = optimize(graph, RULES)
    names = [n.name for n in out.nodes]
    assert len(set(names)) == len(names)
    gemms = [n for n in out.nodes if n.op == "Gemm" and n.name not in {m.name for m in graph.nodes}]
    assert gemms and all(n.name.endswith("/Gemm") and n.name.startswith("/encoder/") for n in gemms)
