"""Fuzzing: mutated models, text graphs and rules files through show, optimize and compile.

Every outcome is exit 0 with a valid result or exit 2 with one error line: never a traceback, a
hang, or a changed input. CI runs a bounded, derandomized number of examples per kind;
`pytest --fuzz-examples N tests/test_fuzz.py` runs longer.
"""

from __future__ import annotations

import contextlib
import io
import signal
from pathlib import Path

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from saturate.cli import main
from saturate.frontend import examples
from saturate.frontend.text import print_graph

RULES_DIR = Path(__file__).resolve().parents[1] / "rules"
# Names that end comments, start preprocessor lines, escape strings or clash after sanitizing.
HOSTILE = ["*/", "/*", "\n#define x 1\n", "\"", "\\", "??/", "%s%n", "é∑😀", "v1", "int", "a" * 2000,
           "../../x", "", " ", "\x00"]
# Sizes an attacker declares to make a reader allocate (or multiply into an overflow).
DIMS = [0, 1, 3, -1, -7, 1 << 31, 1 << 40, 1 << 62, (1 << 63) - 1]
OPS = ["Relu", "Add", "Conv", "MatMul", "Reshape", "ConstantOfShape", "Expand", "Tile", "Frobnicate",
       "BatchNormalization", "Gather", "Concat", "Split", "Resize"]


class Mutant(bytes):
    """A mutated model's bytes, shown in a failure by the mutations that made it, not its bytes."""

    how: str = ""

    def __repr__(self) -> str:
        return f"<model: {self.how}>"


class Hang(Exception):
    """The command ran past its time: a hang is a failure like a traceback."""


@contextlib.contextmanager
def _time_limit(seconds: float):
    def alarm(signum, frame):
        raise Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_cli(args: list[str], seconds: float = 60.0) -> tuple[int, str]:
    """`saturate ARGS` in this process: its exit code and what it wrote to stderr. A traceback
    propagates out of main() and fails the test; so does a hang."""
    err = io.StringIO()
    with _time_limit(seconds), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
    return code, err.getvalue()


def assert_clean_outcome(code: int, err: str) -> None:
    assert code in (0, 2), (code, err)
    if code == 2:
        # Notes (one line each) may come first: a check that could not run, say.
        lines = [line for line in err.strip().splitlines() if not line.startswith("saturate: note: ")]
        # A rule or text-graph error adds the source line and a caret under it.
        assert len(lines) in (1, 3) and lines[0].startswith("saturate: error: "), err
        assert "Traceback" not in err, err


def fuzz_settings(request_examples: int):
    return settings(max_examples=request_examples, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


# ---- mutations ---------------------------------------------------------------------------------
def control_flow_model() -> onnx.ModelProto:
    """y = If(sum(x) > 0) of x * w or -t (t = x + w), then a Loop of M iterations adding t to its
    carried value and collecting each one: subgraphs that read outer values at depth 1 and 2."""
    vi = helper.make_tensor_value_info
    F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["o1"], name="mul")], "then", [],
                               [vi("o1", F, [4])])
    else_g = helper.make_graph([helper.make_node("Neg", ["t"], ["o2"], name="neg")], "else", [], [vi("o2", F, [4])])
    inner = helper.make_graph([helper.make_node("Add", ["acc", "t"], ["b1"], name="add")], "inner", [],
                              [vi("b1", F, [4])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"], name="cond"),
         helper.make_node("If", ["c"], ["acc_out"], then_branch=inner, else_branch=inner, name="inner_if"),
         helper.make_node("Relu", ["acc_out"], ["s"], name="relu")],
        "body", [vi("i", I64, []), vi("c", B, []), vi("acc", F, [4])],
        [vi("c_out", B, []), vi("acc_out", F, [4]), vi("s", F, [4])])
    nodes = [helper.make_node("Add", ["x", "w"], ["t"], name="t"),
             helper.make_node("ReduceSum", ["x"], ["sum"], keepdims=0, name="sum"),
             helper.make_node("Greater", ["sum", "zero"], ["cond"], name="gt"),
             helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g, name="if"),
             helper.make_node("Loop", ["M", "", "y"], ["final", "all"], body=body, name="loop")]
    inits = [helper.make_tensor("w", F, [4], [1.0, 2.0, 3.0, 4.0]), helper.make_tensor("zero", F, [], [0.0]),
             helper.make_tensor("M", I64, [], [3])]
    graph = helper.make_graph(nodes, "control_flow", [vi("x", F, [4])],
                              [vi("final", F, [4]), vi("all", F, [None, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _subgraphs(g: onnx.GraphProto) -> list[onnx.GraphProto]:
    """Every subgraph of `g`, at any depth."""
    found = []
    for node in g.node:
        for a in node.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                found += [sub, *_subgraphs(sub)]
    return found


@st.composite
def mutated_model(draw) -> Mutant:
    """A small valid model with a few structured mutations, sometimes also a few flipped bytes. In
    the model with control flow, each mutation may land in one of its subgraphs instead."""
    base = draw(st.sampled_from(["mlp", "mobilenet", "chain-2", "control-flow"]))
    model = onnx.ModelProto()
    model.CopyFrom(control_flow_model() if base == "control-flow" else examples.build_model(base))
    done = [base]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["dims", "raw", "name", "attr", "op", "opset", "input", "external",
                                     "value_info", "graph_name"]))
        g = model.graph
        subgraphs = _subgraphs(g)
        if subgraphs and draw(st.booleans()):
            g = draw(st.sampled_from(subgraphs))
            kind += f" in subgraph '{g.name}'"
        done.append(kind)
        kind = kind.split(" ")[0]
        if kind == "dims" and g.initializer:
            t = g.initializer[draw(st.integers(0, len(g.initializer) - 1))]
            k = draw(st.integers(0, max(len(t.dims) - 1, 0)))
            if t.dims:
                t.dims[k] = draw(st.sampled_from(DIMS))
            else:
                t.dims.append(draw(st.sampled_from(DIMS)))
        elif kind == "raw" and g.initializer:
            t = g.initializer[draw(st.integers(0, len(g.initializer) - 1))]
            cut = draw(st.integers(0, len(t.raw_data)))
            t.raw_data = t.raw_data[:cut] + draw(st.binary(max_size=7))
        elif kind == "name":
            where = draw(st.sampled_from(["node", "input", "output", "init"]))
            name = draw(st.sampled_from(HOSTILE))
            if where == "node" and g.node:
                g.node[draw(st.integers(0, len(g.node) - 1))].name = name
            elif where == "input" and g.input:
                g.input[0].name = name
            elif where == "output" and g.output:
                g.output[0].name = name
            elif where == "init" and g.initializer:
                g.initializer[0].name = name
        elif kind == "attr" and g.node:
            node = g.node[draw(st.integers(0, len(g.node) - 1))]
            if node.attribute and draw(st.booleans()):
                a = node.attribute[draw(st.integers(0, len(node.attribute) - 1))]
                if a.type == onnx.AttributeProto.INTS and a.ints:
                    a.ints[0] = draw(st.sampled_from(DIMS))
                elif a.type == onnx.AttributeProto.INT:
                    a.i = draw(st.sampled_from(DIMS))
                else:
                    node.attribute.remove(a)
            else:
                node.attribute.append(helper.make_attribute(
                    draw(st.sampled_from(["axis", "pads", "group", "kernel_shape", "mode", "training_mode"])),
                    draw(st.sampled_from([0, 1, -3, 1 << 40, [1, -2], "edge", 1.5]))))
        elif kind == "op" and g.node:
            g.node[draw(st.integers(0, len(g.node) - 1))].op_type = draw(st.sampled_from(OPS))
        elif kind == "opset":
            model.opset_import[0].version = draw(st.sampled_from([1, 6, 11, 13, 17, 21, 99, -1]))
        elif kind == "input" and g.node:
            node = g.node[draw(st.integers(0, len(g.node) - 1))]
            if node.input and draw(st.booleans()):
                del node.input[-1]
            else:
                node.input.append(draw(st.sampled_from(["", "nowhere", node.output[0] if node.output else "x"])))
        elif kind == "external" and g.initializer:
            t = g.initializer[0]
            t.data_location = TensorProto.EXTERNAL
            t.ClearField("raw_data")
            for k, v in (("location", draw(st.sampled_from(["w.bin", "../../etc/passwd", "/etc/passwd",
                                                             "/dev/zero", "missing.bin"]))),
                         ("offset", str(draw(st.sampled_from([0, 4, -1, 1 << 40])))),
                         ("length", str(draw(st.sampled_from([4, 1 << 40, -5]))))):
                e = t.external_data.add()
                e.key, e.value = k, v
        elif kind == "value_info" and g.input:
            shape = g.input[0].type.tensor_type.shape
            if shape.dim:
                shape.dim[0].dim_value = draw(st.sampled_from(DIMS))
        elif kind == "graph_name":
            g.name = draw(st.sampled_from(HOSTILE))
    data = bytearray(model.SerializeToString())
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 3]))):
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
        done.append(f"byte {at}")
    mutant = Mutant(data)
    mutant.how = ", ".join(done)
    return mutant


HOSTILE_TEXT = ["*/", "(", ")", "[", "]", ",", "=", "%", "@", '"', "\\", "\n", "1e999", "-1",
                "99999999999999999999999", "float32", "int64", "0x", "Conv", "{", "}", "#", "..."]


def mutate_text(draw, text: str) -> str:
    """A few edits of the kinds a corrupt or hostile file has: spans dropped, duplicated or replaced,
    numbers made huge or negative, odd tokens inserted."""
    for _ in range(draw(st.integers(1, 4))):
        if not text:
            break
        at = draw(st.integers(0, len(text) - 1))
        span = draw(st.integers(0, 40))
        kind = draw(st.sampled_from(["drop", "dup", "insert", "number"]))
        if kind == "drop":
            text = text[:at] + text[at + span:]
        elif kind == "dup":
            text = text[:at] + text[at:at + span] * draw(st.integers(2, 3)) + text[at:]
        elif kind == "insert":
            text = text[:at] + draw(st.sampled_from(HOSTILE_TEXT)) + text[at:]
        else:
            digits = [k for k, c in enumerate(text) if c.isdigit()]
            if digits:
                k = digits[draw(st.integers(0, len(digits) - 1))]
                text = text[:k] + draw(st.sampled_from(["9" * 25, "-", "1099511627776", "0"])) + text[k + 1:]
    return text


@st.composite
def mutated_text_graph(draw) -> str:
    graph = examples.build(draw(st.sampled_from(["mlp", "chain-1"])))
    return mutate_text(draw, print_graph(graph, hex_data=draw(st.booleans())))


@st.composite
def mutated_rules(draw) -> str:
    source = draw(st.sampled_from(sorted(RULES_DIR.glob("*.rules"))))
    return mutate_text(draw, source.read_text())


# ---- the properties ----------------------------------------------------------------------------
def _check_written_model(out: Path) -> None:
    """An ONNX output saturate wrote with exit 0 is a model the ONNX checker accepts."""
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)


def _show_and_optimize(model: Path, data: bytes, tmp_path: Path) -> None:
    """`show` and `optimize` of the model file holding `data`: each a clean outcome, the input
    unchanged, a valid output on success and none (nor a temp file) on failure."""
    out = tmp_path / "out.onnx"
    out.unlink(missing_ok=True)
    assert_clean_outcome(*run_cli(["show", str(model), "--quiet"]))
    code, err = run_cli(["optimize", str(model), "-o", str(out), "--max-memory", "256M"])
    assert_clean_outcome(code, err)
    assert model.read_bytes() == data, "the input model changed"
    if code == 0:
        _check_written_model(out)
    else:
        assert not out.exists(), "an output was written by a failing command"
    assert not list(tmp_path.glob(".*.tmp")), "temp files left behind"


def test_mutated_models_give_a_valid_model_or_one_line(tmp_path, fuzz_examples):
    @fuzz_settings(fuzz_examples)
    @given(data=mutated_model())
    def check(data):
        model = tmp_path / "m.onnx"
        model.write_bytes(data)
        _show_and_optimize(model, data, tmp_path)

    check()


def test_mutated_text_graphs_give_a_valid_model_or_one_line(tmp_path, fuzz_examples):
    @fuzz_settings(fuzz_examples)
    @given(text=mutated_text_graph())
    def check(text):
        model = tmp_path / "m.sat"
        model.write_text(text)
        _show_and_optimize(model, model.read_bytes(), tmp_path)

    check()


def test_mutated_rules_load_or_give_one_line(tmp_path, fuzz_examples):
    @fuzz_settings(fuzz_examples)
    @given(text=mutated_rules())
    def check(text):
        rules = tmp_path / "mine.rules"
        rules.write_text(text)
        assert_clean_outcome(*run_cli(["rules", "--rules", str(rules)]))
        out = tmp_path / "out.onnx"
        out.unlink(missing_ok=True)
        code, err = run_cli(["optimize", "example:mlp", "-o", str(out), "--rules", str(rules), "--no-std"])
        assert_clean_outcome(code, err)
        assert rules.read_text() == text
        if code == 0:
            _check_written_model(out)

    check()


@pytest.mark.slow
@pytest.mark.compiler
def test_mutated_models_compile_or_give_one_line(tmp_path, fuzz_examples):
    @fuzz_settings(max(3, fuzz_examples // 6))
    @given(data=mutated_model())
    def check(data):
        model = tmp_path / "m.onnx"
        model.write_bytes(data)
        code, err = run_cli(["compile", str(model), "-o", str(tmp_path / "build"), "--quiet",
                             "--max-memory", "256M"], seconds=240)
        assert_clean_outcome(code, err)
        assert model.read_bytes() == data

    check()
