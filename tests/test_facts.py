"""Facts the engine reads before any rule fires: shapes computed from shapes, multi-output types,
and attribute tests egglog decides without a Python round."""

from __future__ import annotations

import numpy as np
from egglog import bindings
from engine_util import Builder, assert_same

from saturate.core.ir import Node, ValueInfo
from saturate.engine import saturation
from saturate.engine.compile_rules import compile_rules, rule_ops
from saturate.engine.egraph import read_egraph
from saturate.engine.encode import encode_graph, load
from saturate.engine.facts import Facts
from saturate.lang.parser import load_rules
from saturate.pipeline import optimize

I64 = np.int64
RULES = {r.name: r for r in load_rules(None, level=3)}


def _facts(graph):
    """Facts of the graph as encoded, before any rule ran."""
    enc = encode_graph(graph, rule_ops=rule_ops(list(RULES.values())))
    eg = bindings.EGraph()
    load(eg, enc)
    eg.run_program(*eg.parse_program("(run-schedule (saturate (run facts)))"))
    view = read_egraph(eg)
    return Facts(view, enc), {v: view.lets[ref] for v, ref in enc.value_names.items()}


def _reversed_pads(b: Builder, x: str, rank: int) -> str:
    """Pads as torch's exporter writes F.pad's: (begin, end) pairs per dim from the last dim
    back, reversed through a [n, 2] Reshape, a Slice with step -1 and a Transpose. The last
    dim's end pad is computed from the input's shape."""
    h = b.op("Gather", b.op("Shape", x), b.const(np.array(rank - 1, I64)), axis=0)
    extra = b.op("Mod", b.op("Sub", b.const(np.array(4, I64)), b.op("Mod", h, b.const(np.array(4, I64)))),
                 b.const(np.array(4, I64)))
    pairs = b.op("Concat", b.const(np.array([0], I64)), b.op("Unsqueeze", extra, b.const(np.array([0], I64))),
                 b.const(np.zeros(2 * rank - 2, I64)), axis=0)
    by_dim = b.op("Reshape", pairs, b.const(np.array([-1, 2], I64)))
    flipped = b.op("Slice", by_dim, b.const(np.array([-1], I64)), b.const(np.array([-(2 ** 62)], I64)),
                   b.const(np.array([0], I64)), b.const(np.array([-1], I64)))
    return b.op("Cast", b.op("Reshape", b.op("Transpose", flipped, perm=[1, 0]), b.const(np.array([-1], I64))),
                to=7)


def test_pads_reversed_through_reshape_slice_and_transpose_are_known_elements():
    b = Builder(shape=(1, 3, 5, 6))
    pads = _reversed_pads(b, "x", 4)
    padded = b.op("Pad", "x", pads)
    g = b.build(b.op("Relu", padded))
    facts, cls = _facts(g)
    # The graph as typed on import does not know the Pad's output; the facts do, from the
    # elements of the pads, before anything folded.
    assert facts.data(cls[pads]) == tuple(int(v) for v in b.env[pads])
    assert facts.tensor_data(cls[pads])[0] == (8,)
    assert facts.shape(cls[padded]) == b.env[padded].shape == (1, 3, 5, 8)


def test_a_shape_computed_from_a_shape_types_the_reshape_it_feeds():
    b = Builder(shape=(2, 6, 4))
    s = b.op("Shape", "x")
    target = b.op("Concat", b.op("Unsqueeze", b.op("Gather", s, b.const(np.array(0, I64)), axis=0),
                                 b.const(np.array([0], I64))),
                  b.const(np.array([3, 2], I64)), b.op("Slice", s, b.const(np.array([2], I64)),
                                                       b.const(np.array([3], I64))), axis=0)
    out = b.op("Reshape", "x", target)
    g = b.build(out)
    g.values[out] = ValueInfo("float32", None)     # as an exporter leaves it: unknown
    facts, cls = _facts(g)
    assert facts.data(cls[target]) == (2, 3, 2, 4)
    assert facts.shape(cls[out]) == (2, 3, 2, 4)


def test_the_batch_read_through_shape_arithmetic_types_expand_and_reshape_by_name():
    # torch's exporter writes `cls_token.expand(x.shape[0], -1, -1)` as an Expand whose shape
    # is Where(Equal(s, -1), ones, s) over s = [batch, 1, 1], and `x.flatten(1)` as a Reshape to
    # [batch, -1]. ONNX's inference names the dims it cannot tell afresh (unk__0...).
    b = Builder(shape=(2, 4, 6))
    s = b.op("Concat", b.op("Unsqueeze", b.op("Gather", b.op("Shape", "x"), b.const(np.array(0, I64)), axis=0),
                            b.const(np.array([0], I64))), b.const(np.array([1, 1], I64)), axis=0)
    ones = b.op("ConstantOfShape", b.op("Shape", s), value=np.array([1], I64))
    shape = b.op("Where", b.op("Equal", s, b.op("Mul", ones, b.const(np.array(-1, I64)))), ones, s)
    tokens = b.op("Concat", b.op("Expand", b.rand(1, 1, 6), shape), "x", axis=1)
    flat = b.op("Reshape", tokens, b.op("Concat", b.op("Unsqueeze", b.op("Gather", b.op("Shape", "x"),
                                                                          b.const(np.array(0, I64)), axis=0),
                                                        b.const(np.array([0], I64))),
                                        b.const(np.array([-1], I64)), axis=0))
    g = b.build(b.op("Relu", flat))
    g.values["x"] = ValueInfo("float32", ("batch", 4, 6))
    for k, v in enumerate(n.outputs[0] for n in g.nodes if n.op in ("Expand", "Concat", "Reshape", "Relu")):
        if g.values[v].dtype == "float32":
            g.values[v] = ValueInfo("float32", tuple(f"unk__{k}" if d == 2 else d for d in g.values[v].shape))
    facts, cls = _facts(g)
    assert facts.data(cls[shape]) == ("batch", 1, 1)
    assert facts.shape(cls[tokens]) == ("batch", 5, 6)
    assert facts.shape(cls[flat]) == ("batch", 30)
    assert not facts.refinable(facts.info(cls[flat]))


def test_every_output_of_a_split_is_typed():
    b = Builder(shape=(3, 2, 4))
    g = b.build("x")
    g.constants["sizes"] = np.array([1, 1, 1], I64)
    g.nodes.append(Node("Split", ["x", "sizes"], ["p", "q", "r"], {"axis": 0}, name="split"))
    for v in "pqr":
        g.values[v] = ValueInfo("float32", None)
    g.nodes.append(Node("Relu", ["q"], ["y"], name="relu"))
    g.values["y"] = ValueInfo("float32", None)
    g.outputs = ["y"]
    facts, cls = _facts(g)
    assert facts.shape(cls["q"]) == (1, 2, 4)
    assert facts.shape(cls["y"]) == (1, 2, 4)


def test_an_integer_matrix_reshaped_reads_its_elements_row_major():
    b = Builder(shape=(2, 3))
    m = b.op("Reshape", b.op("Shape", b.op("Reshape", "x", b.const(np.array([1, 2, 3, 1], I64)))),
             b.const(np.array([2, 2], I64)))
    t = b.op("Transpose", m, perm=[1, 0])
    g = b.build(b.op("Cast", t, to=1))
    facts, cls = _facts(g)
    assert facts.tensor_data(cls[m]) == ((2, 2), (1, 2, 3, 1))
    assert facts.tensor_data(cls[t]) == ((2, 2), (1, 3, 2, 1))
    assert facts.data(cls[t]) is None, "data() reads rank 0 and 1 only"


# ---- attribute tests in egglog -------------------------------------------------------------------

def test_a_fold_with_only_attribute_tests_is_one_egglog_rule_with_relations():
    enc = encode_graph(Builder().build("x"), rule_ops=["Concat", "Cast"])
    concat, cast = compile_rules([RULES["fold-concat-2"], RULES["fold-cast"]], enc)
    assert not concat.checked and not cast.checked
    assert [t.captures for t in concat.attr_tests] == [("axis",)]
    assert not any("Cand_" in line for line in concat.text)
    # A guard still needs Python.
    (reshape,) = compile_rules([RULES["fold-reshape-allowzero"]], enc)
    assert reshape.checked and not reshape.attr_tests


def test_a_chain_of_constant_concats_and_casts_folds_without_a_python_round_per_link(monkeypatch):
    b = Builder(shape=(2,))
    v = b.const(np.array([1], I64))
    for k in range(8):
        # int32 and int64 in turn: each Concat reads the Cast before it.
        v = b.op("Concat", v, b.const(np.array([k], np.int32 if k % 2 else I64)), axis=0)
        v = b.op("Cast", v, to=7 if k % 2 else 6)
    before = b.build(b.op("Reshape", "x", b.op("Slice", b.op("Cast", v, to=7), b.const(np.array([2], I64)),
                                               b.const(np.array([4], I64)))))
    reads = []
    real = saturation.read_egraph
    monkeypatch.setattr(saturation, "read_egraph", lambda *a, **k: reads.append(1) or real(*a, **k))
    after, report = optimize(before)
    assert [n.op for n in after.nodes] == ["Reshape"]
    assert report.run.matches["fold-concat-2"] == 8 and report.run.matches["fold-cast"] == 9
    # Each of the 17 links used to wait for its own read of the e-graph and check in Python.
    assert len(reads) <= 6, len(reads)
    assert_same(before, after, b.sample())


def test_a_step_that_matches_nothing_new_ends_saturation_without_another_read(monkeypatch):
    # Only add-comm matches (no guard, nothing applied after a read): the second step adds
    # nothing, and the e-graph read after the first is the final one.
    b = Builder(shape=(2, 3), inputs=("x", "y"))
    before = b.build(b.op("Relu", b.op("Add", "x", "y")))
    reads = []
    real = saturation.read_egraph
    monkeypatch.setattr(saturation, "read_egraph", lambda *a, **k: reads.append(1) or real(*a, **k))
    after, report = optimize(before)
    assert report.run.stop_reason == "saturated" and report.run.matches["add-comm"] > 0
    assert report.run.iterations == 2 and len(report.run.sizes) == 3
    assert len(reads) == 1          # after the first step; none before it, none after the second
    assert report.run.matches["add-comm"] == 2      # the second step's match still counts
    assert_same(before, after, b.sample())


def test_slice_squeeze_and_normalization_types_need_no_onnx_inference(monkeypatch):
    """Shapes core.geometry computes from constant inputs (and those of ops that keep their input's
    shape) are typed in the engine itself: asking ONNX's inference costs a model round trip each."""
    from saturate.engine import facts as facts_module

    asked = []
    monkeypatch.setattr(facts_module, "onnx_infer", lambda op, *a, **k: asked.append(op))
    b = Builder(shape=(2, 6, 5))
    half = b.op("Div", b.op("Gather", b.op("Shape", "x"), b.const(np.array(1, I64)), axis=0), b.const(np.array(2, I64)))
    cut = b.op("Slice", "x", b.const(np.array([0], I64)), b.op("Unsqueeze", half, b.const(np.array([0], I64))),
               b.const(np.array([1], I64)))
    squeezed = b.op("Squeeze", b.op("Slice", cut, b.const(np.array([4], I64)), b.const(np.array([5], I64)),
                                    b.const(np.array([2], I64))), b.const(np.array([2], I64)))
    normed = b.op("Softmax", b.op("Pad", squeezed, b.const(np.array([0, 1, 0, 2], I64))), axis=-1)
    g = b.build(normed)
    for v in g.values:
        if g.values[v].dtype == "float32" and v != "x":
            g.values[v] = ValueInfo("float32", None)
    facts, cls = _facts(g)
    assert facts.shape(cls[cut]) == (2, 3, 5)
    assert facts.shape(cls[squeezed]) == (2, 3)
    assert facts.shape(cls[normed]) == (2, 6)
    assert asked == []
