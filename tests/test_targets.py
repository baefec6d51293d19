"""Tests for target files: parsing, costs from shapes, errors with positions, `saturate targets`."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saturate.cli import main
from saturate.core.errors import SaturateError, SourceError
from saturate.core.ir import ValueInfo
from saturate.lang.ast import IntList, Num, OpTerm, Var
from saturate.targets.target import TARGETS_DIR, flops, list_targets, load_target, parse_target, target_files

X = ValueInfo("float32", (1, 3, 8, 8))
W = ValueInfo("float32", (4, 3, 3, 3))
B = ValueInfo("float32", (4,))
Y = ValueInfo("float32", (1, 4, 8, 8))


def test_shipped_targets_load_by_glob():
    names = set(target_files())
    assert {"cpu", "accel"} <= names
    assert names == {p.stem for p in TARGETS_DIR.glob("*.target")}
    for t in list_targets():
        assert t.name in names and t.description and t.domain


def test_default_target_is_cpu():
    assert load_target(None).name == "cpu"


def test_conv_flops_count_multiply_adds_and_bias():
    # 4 output channels * 64 pixels, each a 3*3*3 dot product (mul + add), plus one bias add.
    assert flops("Conv", {}, [X, W, B], Y) == 2 * (4 * 64) * 27 + 4 * 64
    assert flops("Conv", {}, [X, W], Y) == 2 * (4 * 64) * 27


def test_cpu_cost_is_flops_plus_bytes():
    cpu = load_target("cpu")
    moved = 4 * (3 * 64 + 4 * 27 + 4 + 4 * 64)
    assert cpu.node_cost("Conv", {}, [X, W, B], Y) == 2 * 256 * 27 + 256 + moved
    # An op the file does not list falls back to the file's default formula.
    assert cpu.node_cost("SomeCustomOp", {}, [Y], Y) == 256 + 4 * 2 * 256


def test_targets_rank_batchnorm_differently():
    """Folded conv vs conv + batch-norm: cpu pays for the extra op, accel runs batch-norm for free."""
    cpu, accel = load_target("cpu"), load_target("accel")
    for t in (cpu, accel):
        conv = t.node_cost("Conv", {}, [X, W, B], Y)
        bn = t.node_cost("BatchNormalization", {}, [Y, B, B, B, B], Y)
        if t is cpu:
            assert conv + bn > conv
        else:
            assert bn == 0
    assert "BatchNormalization" in accel.preserve and "BatchNormalization" not in cpu.preserve


def test_unsupported_ops_cost_none():
    t = parse_target("target tiny\ndefault unsupported\nop Conv = flops\nop Mul = unsupported\n", "tiny.target")
    assert t.node_cost("Conv", {}, [X, W], Y) == flops("Conv", {}, [X, W], Y)
    assert t.node_cost("Mul", {}, [Y, Y], Y) is None and not t.supports("Mul")
    assert t.node_cost("Relu", {}, [Y], Y) is None and t.supports("Conv")


def test_formula_facts_and_calls():
    t = parse_target("op Conv = numel(out) + dim(in1, 0) * 1000 + rank(in0) / 2 + max(1, bytes(in2), 3)\n"
                     "op Relu = -numel + min(out_bytes, in_bytes) * (inputs + 1)\n")
    assert t.node_cost("Conv", {}, [X, W, B], Y) == 256 + 4 * 1000 + 4 / 2 + 16
    # Negative totals clamp to zero: extraction needs non-negative costs.
    assert t.node_cost("Relu", {}, [Y], Y) == -256 + 1024 * 2
    assert parse_target("op Relu = 0 - numel").node_cost("Relu", {}, [Y], Y) == 0


def test_symbolic_dims_count_as_one():
    t = parse_target("op Relu = numel(out)")
    assert t.node_cost("Relu", {}, [], ValueInfo("float32", ("N", 4, None))) == 4


@settings(max_examples=60, deadline=None)
@given(st.recursive(st.integers(0, 50).map(str),
                    lambda inner: st.tuples(inner, st.sampled_from("+-*"), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
                    max_leaves=12))
def test_formulas_evaluate_like_arithmetic(expr):
    t = parse_target(f"op Foo = {expr}")
    assert t.node_cost("Foo", {}, [], Y) == max(0.0, float(eval(expr)))


def test_composites_are_rule_ast_patterns():
    t = parse_target("composite cbr = Relu(Conv(x, w:const, b:const){group=1, pads=[1, 1, 1, 1]})")
    (c,) = t.composites
    conv = c.pattern.args[0]
    assert c.name == "cbr" and isinstance(c.pattern, OpTerm) and c.pattern.op == "Relu"
    assert conv.args == (Var("x"), Var("w", const=True), Var("b", const=True))
    assert dict(conv.attrs) == {"group": Num(1), "pads": IntList((1, 1, 1, 1))}


def test_header_statements():
    t = parse_target('target npu "a neural unit"\ndomain com.example.npu\npreserve Softmax, Gemm\n'
                     "preserve Softmax\nfold-preserved no\n# comment\n\n", "npu.target")
    assert (t.name, t.description, t.domain) == ("npu", "a neural unit", "com.example.npu")
    assert t.preserve == ("Softmax", "Gemm") and t.fold_preserved is False


@pytest.mark.parametrize("source, line, col, words", [
    ("op Conv = flops +", 1, 18, "syntax error"),
    ("op Conv = flop", 1, 11, "unknown shape fact 'flop'"),
    ("op Conv = out * 2", 1, 11, "names a value"),
    ("op Conv = dim(out)", 1, 11, "bad call 'dim"),
    ("op Conv = 1\n\nop Relu, Conv = 2", 3, 10, "already has a cost"),
    ("composite c = x", 1, 11, "must be an op pattern"),
    ("composite c = Relu(x)\ncomposite c = Neg(x)", 2, 11, "defined twice"),
    ("composite c = Add(x:const, x)", 1, 11, "both const and not"),
    ("target cpu\nop Conv = 1 $", 2, 13, "unexpected character '$'"),
    ("preserve", 1, 9, "syntax error"),
])
def test_errors_name_line_and_column(source, line, col, words):
    with pytest.raises(SourceError) as info:
        parse_target(source, "bad.target")
    err = info.value
    assert (err.file, err.line, err.col) == ("bad.target", line, col)
    assert words in str(err)
    assert str(err).splitlines()[-1].index("^") == 4 + col - 1  # caret under the column


@pytest.mark.parametrize("source, col", [('target t "\x1b]0;title\x07"', 10), ('composite c = Pad(x){mode="a\rb"}', 27)])
def test_a_string_with_control_characters_is_refused(source, col):
    # `saturate targets` printed a description as it is: a terminal escape acted on the terminal.
    with pytest.raises(SourceError) as info:
        parse_target(source + "\n", "t.target")
    assert (info.value.line, info.value.col) == (1, col) and "may not hold control characters" in str(info.value)


@pytest.mark.parametrize("statement", ["default " + " + ".join(["flops"] * 5000),
                                       "composite c = " + "Relu(" * 3000 + "x" + ")" * 3000])
def test_a_statement_nested_past_the_limit_names_its_line(statement):
    # Built (and a formula evaluated) recursively, these ended in Python's recursion limit: one
    # line, naming no file.
    with pytest.raises(SourceError, match=r"^deep\.target:2:[0-9]+: formula or pattern nested more than 200 levels deep"):
        parse_target("target deep\n" + statement + "\n", "deep.target")


def test_declared_name_must_match_file(tmp_path):
    path = tmp_path / "mine.target"
    path.write_text("target other\n")
    assert load_target(str(path)).name == "other"  # a path is taken as written
    with pytest.raises(SourceError, match="declares target 'other' but is named 'mine'"):
        parse_target(path.read_text(), str(path), name="mine")


def test_unknown_target_lists_available():
    with pytest.raises(SaturateError, match=r"unknown target 'nope' \(available: .*accel.*cpu"):
        load_target("nope")
    with pytest.raises(SaturateError, match="does not exist"):
        load_target("missing/file.target")


def test_cli_lists_targets_one_per_line(capsys):
    assert main(["targets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == sorted(target_files())
    assert all(len(line.split(maxsplit=1)) == 2 for line in lines)


def test_cli_shows_one_target(capsys):
    assert main(["targets", "accel"]) == 0
    out = capsys.readouterr().out
    assert "BatchNormalization" in out and "conv_bias_relu" in out


def test_cli_bad_target_file_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.target"
    path.write_text("op Conv = flops +\n")
    assert main(["targets", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"saturate: error: {path}:1:18: syntax error") and "Traceback" not in err


def test_a_formula_dividing_by_zero_names_its_file_line_and_text():
    t = parse_target("target dz\ndefault flops / (inputs - 1)  # zero for one input\nop Conv = bytes / dim(in1, 0)\n",
                     "dz.target")
    assert t.node_cost("Conv", {}, [X, W], Y) == (768 + 432 + 1024) / 4     # bytes of x, w, y over 4 filters
    with pytest.raises(SaturateError, match=r"^dz\.target:2: cost formula 'flops / \(inputs - 1\)' divides by zero "
                                            r"for Relu \(output 1x4x8x8\)$"):
        t.node_cost("Relu", {}, [Y], Y)
    with pytest.raises(SaturateError, match=r"^dz\.target:3: cost formula 'bytes / dim\(in1, 0\)' divides by zero"):
        t.node_cost("Conv", {}, [X, ValueInfo("float32", (0, 3, 3, 3))], Y)


@pytest.mark.parametrize("formula, gives", [
    ("1e400", "inf"),                                       # a literal past float64
    ("0 * 1e400", "nan"),
    (" * ".join(["numel"] * 130), "inf"),                   # Python ints past what a float holds
])
def test_a_formula_without_a_finite_value_names_its_file_line_and_text(formula, gives):
    # Extraction read infinity as an op the target cannot run, NaN as a cost of 0, and the
    # product of ints was a traceback (OverflowError) in optimize.
    t = parse_target(f"target big\ndefault {formula}\n", "big.target")
    with pytest.raises(SaturateError, match=rf"^big\.target:2: cost formula '.*' gives {gives} for Relu "
                                            rf"\(output 1x4x8x8\), not a finite cost$"):
        t.node_cost("Relu", {}, [Y], Y)


@pytest.mark.parametrize("axis", ["1e400", "1.5"])
def test_dim_axis_must_be_a_whole_number(axis):
    with pytest.raises(SourceError, match=f"dim's axis must be a whole number, not {axis}"):
        parse_target(f"default dim(out, {axis})\n", "d.target")


# ---- composites as rules and e-nodes ---------------------------------------------------------

def test_composites_become_rules_with_one_enode_on_the_right():
    from saturate.core.ir import Graph, Node
    from saturate.engine.compile_rules import compile_rules
    from saturate.engine.encode import encode_graph
    from saturate.lang.ast import AttrVar, Rule

    t = load_target("fused")
    assert set(t.composite_ops) == {"CompositeConvBiasAddRelu", "CompositeConvAddRelu", "CompositeConvBiasRelu"}
    assert all("_" not in op for op in t.composite_ops)
    rules = t.composite_rules()
    assert all(isinstance(r, Rule) for r in rules)
    # Add is commutative: each pattern with an Add is also matched with the Add's inputs swapped.
    assert sorted(r.name for r in rules) == [
        "composite conv_add_relu", "composite conv_add_relu (order 2)", "composite conv_bias_add_relu",
        "composite conv_bias_add_relu (order 2)", "composite conv_bias_relu"]
    for op in ("Add", "Mul", "Max", "Min", "Sum"):
        swapped = parse_target(f"composite k = Relu({op}(x, y:const))").composite_rules()
        assert [r.lhs.args[0].args for r in swapped] == [(Var("x"), Var("y", const=True)),
                                                         (Var("y", const=True), Var("x"))]
    assert len(parse_target("composite k = Relu(Sub(x, y:const))").composite_rules()) == 1
    (r,) = [r for r in rules if r.name == "composite conv_bias_add_relu (order 2)"]
    assert r.lhs.args[0].op == "Add" and r.lhs.args[0].args[0] == Var("y")
    assert r.rhs.op == "CompositeConvBiasAddRelu" and r.rhs.args == (Var("x"), Var("w"), Var("b"), Var("y"))
    # Every attribute of every pattern op is captured and recorded by position (Conv is position 0).
    recorded = dict(r.rhs.attrs)
    assert {k for k in recorded if k.startswith("0.")} == {f"0.{a}" for a in ("auto_pad", "dilations", "group",
                                                                              "kernel_shape", "pads", "strides")}
    assert recorded["0.pads"] == AttrVar("p0_pads")
    # The ordinary rule compiler takes them: the right side is one e-node of the composite's op.
    g = Graph(inputs=["x"], outputs=["y"], nodes=[Node("Relu", ["x"], ["y"])])
    compiled = compile_rules(rules, encode_graph(g))
    assert any("Op_CompositeConvBiasAddRelu_4" in line for cr in compiled for line in cr.text + cr.apply_text)


def test_composite_cost_is_its_ops_minus_the_interior_traffic():
    from saturate.targets.composites import egraph_op
    from saturate.targets.target import nbytes

    t = load_target("fused")
    K = ValueInfo("float32", (1, 4, 1, 1))
    pads = [1, 1, 1, 1]          # the conv keeps the 8x8 sides: its output is of type Y
    conv = t.node_cost("Conv", {"pads": pads}, [X, W], Y)
    add, relu = t.node_cost("Add", {}, [Y, K], Y), t.node_cost("Relu", {}, [Y], Y)
    got = t.node_cost(egraph_op("conv_add_relu"), {"0.pads": pads}, [X, W, K], Y)
    # Two interior values (the conv's and the add's outputs), each written once and read once,
    # and two op launches saved.
    assert got == conv + add + relu - 2 * nbytes(Y) - 2 * nbytes(Y) - 2 > conv
    # A target charging elementwise ops no traffic would save more than they cost: the kernel
    # then costs what its most expensive op, the conv, costs (less the launches saved).
    light = dataclasses.replace(t, costs={**t.costs, "Add": lambda f: 1.0, "Relu": lambda f: 1.0})
    assert light.node_cost(egraph_op("conv_add_relu"), {"0.pads": pads}, [X, W, K], Y) == conv - 2
    cpu = dataclasses.replace(t, costs={}, default=load_target("cpu").default)   # flops + bytes for every op
    conv, add, relu = (cpu.node_cost(op, {"pads": pads} if op == "Conv" else {}, ins, Y)
                       for op, ins in (("Conv", [X, W]), ("Add", [Y, K]), ("Relu", [Y])))
    assert cpu.node_cost(egraph_op("conv_add_relu"), {"0.pads": pads}, [X, W, K], Y) == \
        conv + add + relu - 2 * nbytes(Y) - 2 * nbytes(Y) - 2
    # An interior type comes from the conv's window: stride 2 halves the conv output's sides.
    half = ValueInfo("float32", (1, 4, 3, 3))
    strided = cpu.node_cost(egraph_op("conv_bias_relu"), {"0.strides": [2, 2]}, [X, W, B], half)
    assert strided == (cpu.node_cost("Conv", {"strides": [2, 2]}, [X, W, B], half)
                       + cpu.node_cost("Relu", {}, [half], half) - 2 * nbytes(half) - 1)
    # Other interior ops are typed by ONNX's shape inference of the one node (a 2x2 pool halves).
    from saturate.targets.composites import interior_types

    pool = parse_target("composite pr = Relu(MaxPool(x){kernel_shape=[2, 2], strides=[2, 2]})").composites[0]
    ins, outs = interior_types(pool.pattern, {"0.kernel_shape": [2, 2], "0.strides": [2, 2]}, [Y],
                               ValueInfo("float32", (1, 4, 4, 4)))
    assert outs[0] == ValueInfo("float32", (1, 4, 4, 4)) and ins == [[Y], [outs[0]]]
    # A composite whose ops the target cannot run cannot run either.
    no = parse_target("default unsupported\nop Conv = flops\ncomposite cr = Relu(Conv(x, w:const))")
    assert no.node_cost(egraph_op("cr"), {}, [X, W], Y) is None


def test_composites_with_one_egraph_name_are_an_error():
    with pytest.raises(SourceError) as info:
        parse_target("composite conv_relu = Relu(Conv(x, w:const))\ncomposite convRelu = Relu(Conv(x, w))",
                     "two.target")
    assert (info.value.line, info.value.col) == (2, 11)
    assert "one e-graph name, CompositeConvRelu" in str(info.value)
