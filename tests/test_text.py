"""Text form: print/parse round trips (hypothesis over random graphs), syntax errors, `saturate show`."""

import re
import warnings

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from saturate.frontend import load_graph, save_graph
from saturate.frontend.examples import build
from saturate.frontend.text import parse_graph, print_graph
from saturate.cli import main
from saturate.core.errors import SaturateError, SourceError
from saturate.core.ir import Graph, Node, OpaqueAttr, ValueInfo, graph_differences

NAMES = st.one_of(st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True),
                  st.sampled_from(["input.1", "onnx::Conv_7", "/layer1/0/Relu_output_0", "a b", "_", "%", "q\"x"]),
                  st.text(min_size=1, max_size=6))
DTYPES = ["float32", "float64", "float16", "int64", "int32", "int8", "uint8", "bool"]
DIMS = st.one_of(st.integers(0, 7), st.sampled_from(["N", "batch size", None]))


def assert_same(a: Graph, b: Graph):
    assert graph_differences(a, b) == []
    assert (a.name, a.opset, a.meta) == (b.name, b.opset, b.meta)
    for x, y in zip(a.nodes, b.nodes):
        assert x.name == y.name
        for k in x.attrs:  # same Python types, not only equal values (1 != 1.0 for ONNX)
            assert type(x.attrs[k]) is type(y.attrs[k])
            if isinstance(x.attrs[k], list):
                assert [type(v) for v in x.attrs[k]] == [type(v) for v in y.attrs[k]]


def arrays(draw, finite=False):
    dtype = draw(st.sampled_from(DTYPES + ["string"]))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3))
    if dtype == "string":
        items = draw(st.lists(st.text(max_size=4), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
        return np.array(items, dtype=object).reshape(shape)
    elements = st.floats(width=np.dtype(dtype).itemsize * 8, allow_nan=False) if finite and dtype.startswith("float") else None
    return draw(hnp.arrays(np.dtype(dtype), shape, elements=elements))


@st.composite
def attr_values(draw):
    kind = draw(st.sampled_from(["int", "float", "str", "bytes", "ints", "floats", "strs", "empty", "tensor", "opaque"]))
    if kind == "int":
        return draw(st.integers(-2**63, 2**63 - 1))
    if kind == "float":
        return draw(st.floats(allow_nan=False))
    if kind == "str":
        return draw(st.text(max_size=8))
    if kind == "bytes":
        return draw(st.binary(max_size=6))
    if kind == "ints":
        return draw(st.lists(st.integers(-100, 100), min_size=1, max_size=4))
    if kind == "floats":
        return draw(st.lists(st.floats(allow_nan=False, width=32), min_size=1, max_size=4))
    if kind == "strs":
        return draw(st.lists(st.text(max_size=3), min_size=1, max_size=3))
    if kind == "empty":
        return []
    if kind == "tensor":
        return arrays(draw, finite=True)
    # The payload is filled in once the attribute's name is drawn (opaque_named): the parser
    # checks that it is a well-formed AttributeProto of that name and kind.
    return OpaqueAttr("GRAPH", draw(st.binary(max_size=8)))


def opaque_named(key: str, value):
    """An opaque attribute drawn by attr_values as a GRAPH AttributeProto named `key`."""
    if not isinstance(value, OpaqueAttr):
        return value
    graph = onnx.GraphProto(name=value.payload.hex())
    proto = onnx.AttributeProto(name=key, type=onnx.AttributeProto.GRAPH, g=graph)
    return OpaqueAttr("GRAPH", proto.SerializeToString())


@st.composite
def graphs(draw):
    names = draw(st.lists(NAMES, min_size=5, max_size=12, unique=True))
    g = Graph(name=draw(NAMES), opset=draw(st.integers(13, 21)))
    if draw(st.booleans()):
        g.meta["opset_imports"] = {"com.example": draw(st.integers(1, 3))}
    pool = iter(names)
    defined = []
    for name in [next(pool) for _ in range(draw(st.integers(1, 2)))]:
        g.inputs.append(name)
        defined.append(name)
        if draw(st.booleans()):
            shape = draw(st.one_of(st.none(), st.lists(DIMS, max_size=4).map(tuple)))
            g.values[name] = ValueInfo(draw(st.sampled_from(DTYPES)), shape)
    for name in [next(pool) for _ in range(draw(st.integers(0, 2)))]:
        g.constants[name] = arrays(draw)
        defined.append(name)
    for name in pool:
        args = draw(st.lists(st.sampled_from(defined + [""]), max_size=3))
        outs = [name] + ([""] if draw(st.booleans()) else [])
        attrs = draw(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True), attr_values(), max_size=3))
        attrs = {k: opaque_named(k, v) for k, v in attrs.items()}
        # An op ONNX does not define only exists in a domain of its own (the parser refuses it bare).
        op, domain = draw(st.sampled_from([("Conv", ""), ("Add", ""), ("Add", "com.example"),
                                           ("MyOp", "com.example")]))
        node = Node(op, args, outs, attrs, name=draw(st.one_of(st.just(""), NAMES)), domain=domain)
        g.nodes.append(node)
        if draw(st.booleans()):
            g.values[name] = ValueInfo(draw(st.sampled_from(DTYPES)), tuple(draw(st.lists(DIMS, max_size=3))))
        defined.append(name)
    g.outputs = draw(st.lists(st.sampled_from(defined), min_size=1, max_size=3))
    return g


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.booleans())
def test_round_trip_random_graphs(g, hex_data):
    text = print_graph(g, hex_data=hex_data)
    assert_same(g, parse_graph(text))


# resnet18 (11 M weights, 158 MB of text, 15 s) takes the same paths as these; exactness of large data is
# test_float32_data_is_exact_including_special_values's.
@pytest.mark.parametrize("name", ["mlp", "vgg", "mobilenet", "chain-20"])
def test_round_trip_examples(name):
    g = build(name)
    assert_same(g, parse_graph(print_graph(g)))


def test_float32_data_is_exact_including_special_values():
    bits = np.random.default_rng(0).integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    data = np.concatenate([bits.view(np.float32), np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45], np.float32)])
    g = Graph(inputs=[], outputs=["c"], constants={"c": data})
    back = parse_graph(print_graph(g)).constants["c"]
    finite = np.isfinite(data)
    assert np.array_equal(back.view(np.uint32)[finite], data.view(np.uint32)[finite])
    assert np.array_equal(np.isnan(back), np.isnan(data))


def test_hex_form_and_exotic_dtypes():
    g = Graph(outputs=["c", "h"], constants={"c": np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
                                               "h": np.array([1.5, -2], np.float16)})
    text = print_graph(g, hex_data=True)
    assert "0x" in text and "0.14285" not in text
    assert_same(g, parse_graph(text))


def test_file_round_trip(tmp_path):
    g = build("mobilenet")
    path = tmp_path / "m.sat"
    save_graph(g, str(path))
    assert_same(g, load_graph(str(path)))


# ---- errors ------------------------------------------------------------------------------------
def error_of(text: str) -> SourceError:
    with pytest.raises(SourceError) as err:
        parse_graph(text, file="g.sat")
    return err.value


def test_syntax_error_points_at_line_and_column():
    err = error_of("graph g opset 17\n  input %x: float32[2]\n  %y = Relu(%x,, %x)\n  output %y\n")
    assert (err.file, err.line, err.col) == ("g.sat", 3, 16)
    assert str(err).startswith("g.sat:3:16: unexpected")
    assert str(err).splitlines()[1:] == ["      %y = Relu(%x,, %x)", "                   ^"]


def test_bad_character_and_missing_header():
    assert error_of("graph g opset 17\n  input %x: float32[2] $\n").line == 2
    err = error_of("input %x\n")
    assert err.line == 1 and "unexpected" in err.message


def test_unsupported_opset():
    err = error_of("graph g opset 9\n  input %x\n  output %x\n")
    assert (err.line, err.col) == (1, 15) and "unsupported ONNX opset 9" in err.message


def test_abbreviated_constant_cannot_be_parsed():
    g = build("mlp")
    text = print_graph(g, max_elements=4)
    err = error_of(text)
    first = next(k for k, line in enumerate(text.splitlines(), 1) if "..." in line)
    assert "abbreviated" in err.message and err.line == first


def test_undefined_and_duplicate_values():
    err = error_of("graph g opset 17\n  input %x\n  %y = Add(%x, %z)\n  output %y\n")
    assert (err.line, err.col) == (3, 16) and "'%z' is used before it is defined" in err.message
    err = error_of("graph g opset 17\n  input %x\n  %x = Relu(%x)\n  output %x\n")
    assert err.line == 3 and "defined twice" in err.message
    err = error_of("graph g opset 17\n  output %nothing\n")
    assert err.line == 2


def test_constant_data_must_match_its_type():
    err = error_of("graph g opset 17\n  const %c: float32[3] = [1.0, 2.0]\n  output %c\n")
    assert "has 2 values; shape [3] needs 3" in err.message
    err = error_of("graph g opset 17\n  const %c: int64[2] = [1, x]\n  output %c\n")
    assert "not a list of int64 values" in err.message
    err = error_of("graph g opset 17\n  const %c: float32[1] = 0x0000\n  output %c\n")
    assert "needs 4" in err.message
    err = error_of("graph g opset 17\n  const %c: wibble[1] = [1]\n  output %c\n")
    assert "unknown dtype 'wibble'" in err.message


def test_an_op_of_another_domain_named_anything_round_trips(tmp_path, capsys):
    # ONNX holds any op name in another domain; printed bare, "Foo-Bar" made text (optimize -o x.sat,
    # show) that did not parse back.
    g = Graph(name="g", opset=17, inputs=["x"], outputs=["y"], nodes=[Node("Foo-Bar", ["x"], ["y"], domain="my.d")])
    g.values["x"] = ValueInfo("float32", (2,))
    g.meta["opset_imports"] = {"my.d": 1}
    text = print_graph(g)
    assert '"my.d"."Foo-Bar"(%x)' in text
    assert_same(parse_graph(text), g)
    err = error_of('graph g opset 17\n  input %x: float32[2]\n  %y = "my.d"."F\\u001bo"(%x)\n  output %y\n')
    assert (err.line, err.col) == (3, 15) and 'op "F\\u001bo" holds control characters' in err.message


def test_constant_data_is_counted_before_it_is_decoded(monkeypatch):
    # Decoded first, a list of zeros took 8 bytes a value (several times its text) before its
    # length was found wrong for the shape.
    from saturate.frontend import text as text_module

    def decode(*args, **kwargs):
        raise AssertionError("decoded before its length was checked")

    monkeypatch.setattr(text_module.np, "fromstring", decode)
    err = error_of("graph g opset 17\n  const %c: float32[1] = [" + "0," * 1000 + "0]\n  output %c\n")
    assert "has 1001 values; shape [1] needs 1" in err.message
    err = error_of("graph g opset 17\n  const %c: float32[1] = 0x" + "00" * 1000 + "\n  output %c\n")
    assert "hex data holds 1000 bytes; float32[1] needs 4" in err.message


def test_a_float_past_its_dtype_reads_as_infinity_without_a_warning(capsys):
    # numpy's cast warned "overflow encountered in cast": a second line on stderr of show and run.
    text = "graph g opset 17\n  const %c: float16[2] = [70000, -1e999]\n  output %c\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = parse_graph(text).constants["c"]
    assert c.dtype == np.float16 and list(c) == [np.inf, -np.inf]


# ---- saturate show ---------------------------------------------------------------------------
def test_show_abbreviates_and_counts(capsys):
    assert main(["show", "example:mlp"]) == 0
    out = capsys.readouterr().out
    assert "..." in out and "MatMul  3" in out and out.startswith("graph mlp opset 17")


def test_show_full_parses_back(capsys):
    assert main(["show", "--full", "example:vgg"]) == 0
    assert_same(build("vgg"), parse_graph(capsys.readouterr().out))


def string_model(tmp_path):
    """A model of ONNX STRING values: an initializer and a Constant holding a newline and terminal escapes."""
    labels = onnx.numpy_helper.from_array(np.array([["a", "b\n\x1b[31mred", "c"], ["d", "e", "f"]], object), "labels")
    tags = onnx.helper.make_tensor("tags", onnx.TensorProto.STRING, [2], [b"x", b"\x1b]0;t\x07"])
    nodes = [onnx.helper.make_node("Constant", [], ["k"], value=tags),
             onnx.helper.make_node("Identity", ["labels"], ["out"]), onnx.helper.make_node("Identity", ["k"], ["tag"])]
    outs = [onnx.helper.make_tensor_value_info("out", onnx.TensorProto.STRING, [2, 3]),
            onnx.helper.make_tensor_value_info("tag", onnx.TensorProto.STRING, [2])]
    graph = onnx.helper.make_graph(nodes, "g", [], outs, [labels])
    path = tmp_path / "strings.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), str(path))
    return path


def test_show_prints_string_tensors_as_string_with_their_values_escaped(capsys, tmp_path):
    # A value holding ONNX STRING printed as numpy's `object[2, 3]`; its text, which a model may
    # fill with a newline or a terminal escape, stays one escaped line that parses back.
    path = string_model(tmp_path)
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "object" not in out and "\x1b" not in out and len(out.splitlines()) == 11
    assert '  const %labels: string[2, 3] = ["a", "b\\n\\u001b[31mred", "c", "d", "e", "f"]\n' in out
    assert '  const %k: string[2] = ["x", "\\u001b]0;t\\u0007"]\n' in out
    assert "  %out: string[2, 3] = Identity(%labels)\n  %tag: string[2] = Identity(%k)\n" in out
    assert main(["show", "--full", str(path)]) == 0
    assert_same(load_graph(str(path)), parse_graph(capsys.readouterr().out))


def test_show_cuts_long_strings_unless_full(capsys, tmp_path):
    # --elements bounded how many strings show, not how long each is: a model's one string of a
    # megabyte printed whole.
    long = onnx.helper.make_tensor("long", onnx.TensorProto.STRING, [2], [b"a" * 1_000_000, b"b"])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["long"], ["out"])], "g", [],
                                   [onnx.helper.make_tensor_value_info("out", onnx.TensorProto.STRING, [2])], [long])
    path = tmp_path / "long.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), str(path))
    assert main(["show", str(path)]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if "%long" in l)
    assert line == f'  const %long: string[2] = ["{"a" * 64}"..., "b"] # strings cut at 64 characters'
    assert main(["show", "--full", str(path)]) == 0
    assert f'["{"a" * 1_000_000}", "b"]' in capsys.readouterr().out


def test_show_svg_names_string_values_string(tmp_path):
    path, svg = string_model(tmp_path), tmp_path / "strings.svg"
    assert main(["show", str(path), "--svg", str(svg)]) == 0
    drawn = svg.read_text()
    assert "<title>output out string 2×3</title>" in drawn and "object" not in drawn


def test_show_bad_model_is_exit_2(capsys, tmp_path):
    bad = tmp_path / "bad.sat"
    bad.write_text("graph g opset 17\n  %y = Relu(%x)\n")
    assert main(["show", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"saturate: error: {bad}:2:13: value '%x' is used before it is defined" in err
    with pytest.raises(SaturateError):
        load_graph(str(tmp_path / "missing.sat"))


def test_an_attribute_of_the_wrong_kind_is_refused_where_written(tmp_path):
    # LeakyRelu's alpha is a FLOAT: a string there reached the C backend's float formatting.
    text = 'graph g opset 17\n  input %x: float32[1, 4]\n  %y: float32[1, 4] = LeakyRelu(%x){alpha="abc"}\n  output %y\n'
    with pytest.raises(SourceError, match=r"m.sat:3:.*attribute 'alpha' of LeakyRelu must be FLOAT"):
        parse_graph(text, file="m.sat")
    assert parse_graph(text.replace('"abc"', "2"), file="m.sat").nodes[0].attrs["alpha"] == 2


def test_a_long_chain_of_untyped_nodes_optimizes_and_keeps_its_outputs(tmp_path):
    """A text graph need not declare its values' types: typing a chain of 1500 of them recursed once
    per node and passed Python's recursion limit at about 250 ("input nested too deeply")."""
    import onnxruntime as ort

    lines, prev = ["graph g opset 17", "  input %x: float32[4]"], "x"
    for i in range(1500):
        lines.append(f"  %v{i} = {('Neg', 'Relu', 'Sigmoid')[i % 3]}(%{prev})")
        prev = f"v{i}"
    (tmp_path / "chain.sat").write_text("\n".join([*lines, f"  output %{prev}"]) + "\n")
    assert main(["optimize", str(tmp_path / "chain.sat"), "-o", str(tmp_path / "chain.onnx"), "--quiet"]) == 0
    from saturate.interp.interpreter import run_graph

    x = np.array([-2.0, -0.5, 0.5, 2.0], np.float32)
    want = run_graph(load_graph(str(tmp_path / "chain.sat")), {"x": x})[prev]
    got = ort.InferenceSession(str(tmp_path / "chain.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ---- types, checked on load as ONNX import checks them ---------------------------------------
HEADER = "graph g opset 17\n  input %x: float32[2, 3]\n"


@pytest.mark.parametrize("body,words", [
    ("  const %c: int64[3] = [1, 2, 3]\n  %y = Add(%x, %c)\n", "(op_type:Add, node name: y): B has inconsistent type"),
    ("  input %s: string[2]\n  %y = Relu(%s)\n", "(op_type:Relu, node name: y): X typestr: T, has unsupported type"),
    # A declared result type does not hide what the node makes of its inputs.
    ("  const %c: int64[3] = [1, 2, 3]\n  %y: float32[2, 3] = Add(%x, %c) @\"sum\"\n", "(op_type:Add, node name: sum)"),
    ("  %s: float32[2] = Shape(%x)\n  %y = Relu(%s)\n",
     "node 's' (Shape): output 's' is declared float32, but the op gives int64"),
    # Behind an input the text leaves untyped, the nodes that read only typed values are still checked.
    ("  input %u\n  %r = Relu(%u)\n  const %c: int64[3] = [1, 2, 3]\n  %y = Add(%x, %c)\n",
     "(op_type:Add, node name: y)"),
])
def test_a_text_graph_giving_an_op_types_it_refuses_is_refused_on_load(tmp_path, capsys, body, words):
    path, out = tmp_path / "bad.sat", tmp_path / "out.sat"
    path.write_text(HEADER + body + "  output %y\n")
    for argv in (["show", str(path)], ["optimize", str(path), "-o", str(out)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"saturate: error: {path}: invalid graph: ") and words in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("body", [
    # An untyped input is not taken for float: here it can only be int64 indices.
    "  input %i\n  const %t: float32[4] = [1, 2, 3, 4]\n  %y = Gather(%t, %i)\n",
    # Untyped results, an int64 one among them, and an untyped graph output.
    "  %s = Shape(%x)\n  %y = Reshape(%x, %s)\n",
    # An op of a domain the text does not import: inference has no schema for it, and skips it.
    '  %y = "my.ops".Frobnicate(%x)\n',
])
def test_well_typed_text_graphs_load_whatever_they_leave_untyped(tmp_path, body):
    path = tmp_path / "ok.sat"
    path.write_text(HEADER + body + "  output %y\n")
    assert load_graph(str(path)).outputs == ["y"]


@pytest.mark.parametrize("name", ["mlp", "vgg", "mobilenet", "resnet18"])
def test_examples_load_from_text_with_or_without_their_types(tmp_path, name):
    # Printed with every type, then with none but the input's (an earlier check took the untyped
    # for float and refused int64 shape arithmetic), then without that too.
    g = build(name)
    typed = print_graph(g)
    bare = re.sub(r"^(  %\S+): [^=\n]+ = ", r"\1 = ", typed, flags=re.M)
    assert not re.search(r"^  %\S+: ", bare, flags=re.M)
    for k, text in enumerate([typed, bare, re.sub(r"^(  input %\S+): .*$", r"\1", bare, flags=re.M)]):
        (tmp_path / f"{k}.sat").write_text(text)
        assert_same(parse_graph(text), load_graph(str(tmp_path / f"{k}.sat")))
