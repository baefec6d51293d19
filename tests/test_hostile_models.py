"""Hostile model files: every one gives one line and exit 2, in bounded memory and time.

Each model is built small with onnx.helper (a few hundred bytes at most) but declares terabytes,
negative dims, data that does not match its dims, or external data outside its folder; the CLI
runs in-process. Nothing may be allocated past --max-memory, nothing written, no traceback.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from saturate.cli import main
from saturate.core import limits

TIB = 1 << 40
# Every command refuses a bad model before any real work: well under this.
SECONDS = 20


@pytest.fixture(autouse=True)
def _own_limit():
    # main() puts --max-memory into the environment for child processes; keep it to this test
    # (monkeypatch.delenv of an unset variable would not undo what main sets).
    saved = os.environ.pop(limits.ENV, None)
    yield
    os.environ.pop(limits.ENV, None)
    if saved is not None:
        os.environ[limits.ENV] = saved


def _model(nodes, inputs=(), outputs=("y",), initializers=(), opset=17) -> onnx.ModelProto:
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    graph = helper.make_graph(list(nodes), "g", list(inputs), outs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _weight(dims, dtype=TensorProto.FLOAT, raw=None, floats=None, name="W") -> TensorProto:
    """A TensorProto built field by field: onnx.helper would refuse data that does not fit."""
    t = TensorProto(name=name, data_type=dtype)
    t.dims.extend(dims)
    if raw is not None:
        t.raw_data = raw
    if floats is not None:
        t.float_data.extend(floats)
    return t


def _relu_of(weight: TensorProto) -> onnx.ModelProto:
    return _model([helper.make_node("Relu", [weight.name], ["y"], name="relu")], initializers=[weight])


def _external(dims, location, offset=None, length=None) -> TensorProto:
    t = _weight(dims)
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            t.external_data.add(key=key, value=str(value))
    return t


def _save(tmp_path: Path, model: onnx.ModelProto, name: str = "m.onnx") -> str:
    path = tmp_path / name
    path.write_bytes(model.SerializeToString())
    assert path.stat().st_size < 400  # the point: a tiny file
    return str(path)


def _refused(capsys, argv: list[str], *words: str) -> str:
    """Run the CLI; it must exit 2 quickly with one error line holding every word."""
    start = time.monotonic()
    code = main(argv)
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err
    assert code == 2, err
    assert elapsed < SECONDS
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("saturate: no --input")]
    assert len(lines) == 1 and lines[0].startswith("saturate: error: "), err
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


COMMANDS = ["show", "optimize", "run"]


def _argv(command: str, model: str, tmp_path: Path, *extra: str) -> list[str]:
    out = {"optimize": ["-o", str(tmp_path / "out.onnx")], "run": ["-o", str(tmp_path / "out.npy")]}
    return [command, model, *out.get(command, []), *extra]


def _nothing_written(tmp_path: Path) -> None:
    assert not (tmp_path / "out.onnx").exists() and not (tmp_path / "out.npy").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# ---- weights: sizes, dims and data -----------------------------------------------------------

BAD_WEIGHTS = {
    # A 4 TiB weight with no data: decoding it used to be a traceback after seconds of work.
    "terabyte-no-data": (_weight([TIB]), ["initializer 'W'", "4.0 TiB", "--max-memory"]),
    "terabyte-raw": (_weight([TIB], raw=b"\0" * 4), ["initializer 'W'", "4.0 TiB"]),
    "terabyte-2d": (_weight([1 << 20, 1 << 20], floats=[1.0]), ["initializer 'W'", "4.0 TiB"]),
    # Negative dims whose product is large and positive: past onnx's checker, which only sees
    # small weights.
    "negative-dims": (_weight([-5000, -2]), ["initializer 'W'", "negative dimension -5000"]),
    "raw-too-short": (_weight([5000], raw=b"\0" * 10), ["initializer 'W'", "raw_data holds 10 bytes",
                                                        "float32[5000] needs 20000"]),
    "raw-too-long": (_weight([4], raw=b"\0" * 20), ["initializer 'W'", "raw_data holds 20 bytes"]),
    "raw-not-whole-elements": (_weight([5000], raw=b"\0" * 6), ["initializer 'W'", "raw_data holds 6 bytes"]),
    "float-data-short": (_weight([5000], floats=[1.0, 2.0, 3.0]), ["initializer 'W'", "float_data holds 3 values"]),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", sorted(BAD_WEIGHTS))
def test_bad_weight_is_one_line(case, command, tmp_path, capsys):
    weight, words = BAD_WEIGHTS[case]
    model = _save(tmp_path, _relu_of(weight))
    _refused(capsys, _argv(command, model, tmp_path), *words)
    _nothing_written(tmp_path)


def test_huge_constant_node_is_one_line(tmp_path, capsys):
    value = helper.make_attribute("value", _weight([1 << 20, 1 << 21], name=""))
    node = helper.make_node("Constant", [], ["W"], name="const")
    node.attribute.append(value)
    model = _save(tmp_path, _model([node, helper.make_node("Relu", ["W"], ["y"])]))
    _refused(capsys, ["show", model], "node 'const' (Constant)", "attribute 'value'", "8.0 TiB")


def test_a_weight_over_a_given_limit(tmp_path, capsys):
    """--max-memory bounds one weight: under a larger limit the same weight passes that check
    (and is refused for its missing data instead)."""
    model = _save(tmp_path, _relu_of(_weight([1024, 1024])))
    _refused(capsys, ["show", model, "--max-memory", "1M"], "initializer 'W'", "4.0 MiB", "limit of 1.0 MiB")
    _refused(capsys, ["show", model, "--max-memory", "8M"], "initializer 'W'", "float_data holds 0 values")


def test_a_model_file_over_the_limit_is_not_read(tmp_path, capsys):
    model = _save(tmp_path, _relu_of(_weight([64], raw=b"\0" * 256)))
    _refused(capsys, ["show", model, "--max-memory", "100"], "m.onnx", "over the 100 bytes a model may take")


# ---- external data ---------------------------------------------------------------------------

def _external_case(tmp_path: Path, **kwargs) -> str:
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    return _save(tmp_path, _relu_of(_external(**kwargs)))


BAD_EXTERNAL = {
    "offset-past-the-end": (dict(dims=[4], location="w.bin", offset=1000, length=16),
                            ["external data of tensor 'W'", "offset 1000", "holds 16 bytes"]),
    "length-over-the-file": (dict(dims=[4], location="w.bin", offset=0, length=TIB),
                             ["external data of tensor 'W'", f"{TIB} bytes declared", "needs 16"]),
    "length-not-the-dims": (dict(dims=[4], location="w.bin", length=8),
                            ["external data of tensor 'W'", "8 bytes declared", "needs 16"]),
    "dims-over-the-file": (dict(dims=[100], location="w.bin"), ["external data of tensor 'W'", "400 bytes"]),
    # onnx would read it lazily (or fail after allocating); refused by size before any read.
    "terabyte": (dict(dims=[TIB], location="w.bin"), ["tensor 'W'", "4.0 TiB"]),
    "parent-folder": (dict(dims=[4], location="../../etc/passwd"), ["tensor 'W'", "not a path inside"]),
    "absolute": (dict(dims=[4], location="/etc/passwd"), ["tensor 'W'", "not a path inside"]),
    "no-location": (dict(dims=[4], location=None), ["tensor 'W'", "no file location"]),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", sorted(BAD_EXTERNAL))
def test_bad_external_data_is_one_line(case, command, tmp_path, capsys):
    kwargs, words = BAD_EXTERNAL[case]
    model = _external_case(tmp_path, **kwargs)
    _refused(capsys, _argv(command, model, tmp_path), *words)
    _nothing_written(tmp_path)


def test_external_data_through_a_link_out_of_the_folder(tmp_path, capsys):
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"\1" * 16)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "w.bin").symlink_to(outside)
    model = _save(folder, _relu_of(_external(dims=[4], location="w.bin")))
    _refused(capsys, ["show", model], "tensor 'W'", "leads outside the model's folder")


def test_external_data_that_is_a_fifo(tmp_path, capsys):
    os.mkfifo(tmp_path / "w.bin")
    model = _save(tmp_path, _relu_of(_external(dims=[4], location="w.bin")))
    _refused_without_hanging(capsys, ["show", model], "tensor 'W'", "not a regular file")


def test_external_data_is_read(tmp_path, capsys):
    """The checks let a well-formed external weight through, read from its offset."""
    (tmp_path / "w.bin").write_bytes(b"\0" * 8 + np.arange(4, dtype="<f4").tobytes())
    model = _save(tmp_path, _relu_of(_external(dims=[4], location="w.bin", offset=8, length=16)))
    assert main(["run", model]) == 0
    assert "y: float32[4] [0, 1, 2, 3]" in capsys.readouterr().out


# ---- declared shapes, and sizes only known when running ---------------------------------------

def _relu_of_input(shape, dtype=TensorProto.FLOAT) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", dtype, shape)
    return _model([helper.make_node("Relu", ["x"], ["y"], name="relu")], inputs=[x])


@pytest.mark.parametrize("command", COMMANDS)
def test_negative_input_dims(command, tmp_path, capsys):
    model = _save(tmp_path, _relu_of_input([-3, 2]))
    _refused(capsys, _argv(command, model, tmp_path), "value 'x'", "negative dimension -3")
    _nothing_written(tmp_path)


def test_terabyte_input_is_not_drawn(tmp_path, capsys):
    model = _save(tmp_path, _relu_of_input([1 << 20, 1 << 20]))
    _refused(capsys, _argv("run", model, tmp_path), "input 'x'", "float32[1048576, 1048576]", "4.0 TiB")
    _nothing_written(tmp_path)


def test_terabyte_input_no_node_reads_is_not_drawn_by_the_check(tmp_path, capsys):
    """An input that is a graph output as it is: no node's output size stands for it, and
    optimize's check drew its values (8 TiB as numpy draws them, 64-bit): a traceback."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1 << 20, 1 << 20])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])
    model = _model([helper.make_node("Relu", ["z"], ["y"], name="relu")], inputs=[x, z], outputs=("y", "x"))
    _refused(capsys, _argv("optimize", _save(tmp_path, model), tmp_path), "input 'x'", "8.0 TiB", "--check")
    _nothing_written(tmp_path)


def test_input_over_a_given_limit(tmp_path, capsys):
    model = _save(tmp_path, _relu_of_input([1024, 1024]))
    _refused(capsys, _argv("run", model, tmp_path, "--max-memory", "1M"), "input 'x'", "4.0 MiB")
    _nothing_written(tmp_path)


def _constant_of_shape(shape_input: bool) -> onnx.ModelProto:
    node = helper.make_node("ConstantOfShape", ["s"], ["y"], name="fill")
    if shape_input:
        return _model([node], inputs=[helper.make_tensor_value_info("s", TensorProto.INT64, [2])])
    return _model([node], initializers=[helper.make_tensor("s", TensorProto.INT64, [2], [1 << 20, 1 << 20])])


def test_terabyte_constant_of_shape_in_run(tmp_path, capsys):
    model = _save(tmp_path, _constant_of_shape(shape_input=False))
    _refused(capsys, _argv("run", model, tmp_path), "node 'fill' (ConstantOfShape)", "4.0 TiB")
    _nothing_written(tmp_path)


def test_constant_of_shape_over_a_given_limit_from_an_input(tmp_path, capsys):
    """The output's size comes from an input's values: checked before the kernel allocates it."""
    model = _save(tmp_path, _constant_of_shape(shape_input=True))
    np.save(tmp_path / "s.npy", np.array([1024, 1024], np.int64))
    argv = _argv("run", model, tmp_path, "--input", str(tmp_path / "s.npy"), "--max-memory", "1M")
    _refused(capsys, argv, "node 'fill' (ConstantOfShape)", "4.0 MiB", "limit of 1.0 MiB")
    _nothing_written(tmp_path)


# ---- the model file itself -------------------------------------------------------------------

def _refused_without_hanging(capsys, argv, *words) -> None:
    """_refused, in a thread: a blocked open() would otherwise hang the test run forever."""
    result: dict = {}

    def work():
        try:
            result["line"] = _refused(capsys, argv, *words)
        except BaseException as err:  # reported below, in the test's own thread
            result["error"] = err

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(SECONDS)
    assert not worker.is_alive(), f"saturate {' '.join(argv)} still running after {SECONDS} s"
    if "error" in result:
        raise result["error"]


@pytest.mark.parametrize("suffix", [".onnx", ".sat"])
@pytest.mark.parametrize("command", COMMANDS)
def test_fifo_as_model(suffix, command, tmp_path, capsys):
    fifo = tmp_path / f"m{suffix}"
    os.mkfifo(fifo)
    _refused_without_hanging(capsys, _argv(command, str(fifo), tmp_path), str(fifo), "not a regular file")
    _nothing_written(tmp_path)


def test_unreadable_model(tmp_path, capsys):
    # /proc/self/mem reads as an I/O error at offset 0, even for root (chmod 000 is no bar to root).
    mem = Path("/proc/self/mem")
    if not mem.exists():
        pytest.skip("no /proc")
    _refused(capsys, ["show", str(mem)], "/proc/self/mem")



# ---- the text form ---------------------------------------------------------------------------

BAD_TEXT = {
    # numpy's reader clamped this to 9223372036854775807 without a word.
    "int64-above-range": ("const %c: int64[2] = [99999999999999999999, 1]\n  output %c",
                          "2:24: constant value 99999999999999999999 is out of range for int64"),
    "int64-below-range": ("const %c: int64[1] = [-99999999999999999999]\n  output %c",
                          "2:24: constant value -99999999999999999999 is out of range for int64"),
    "int8-wraps": ("const %c: int8[2] = [300, 1]\n  output %c", "2:23: constant value 300 is out of range for int8"),
    "uint8-negative": ("const %c: uint8[1] = [-1]\n  output %c", "2:24: constant value -1 is out of range for uint8"),
    "uint8-wraps": ("const %c: uint8[1] = [300]\n  output %c", "2:24: constant value 300 is out of range for uint8"),
    "uint64-above-range": ("const %c: uint64[1] = [18446744073709551616]\n  output %c",
                           "2:25: constant value 18446744073709551616 is out of range for uint64"),
    "bool-not-0-or-1": ("const %c: bool[1] = [2]\n  output %c", "2:23: constant value 2 is out of range for bool"),
    "attribute-int": ("input %x: float32[2]\n  %y = Relu(%x) {foo=99999999999999999999}\n  output %y",
                      "3:22: integer 99999999999999999999 is out of range"),
    "dim-above-int64": ("input %x: float32[99999999999999999999]\n  %y = Relu(%x)\n  output %y",
                        "2:21: dimension 99999999999999999999 is out of range"),
    "negative-dim": ("input %x: float32[-3]\n  %y = Relu(%x)\n  output %y", "2:21: dimension -3 is out of range"),
    "import-version": ('import "com.x" 99999999999999999999\n  input %x: float32[2]\n  output %x',
                       "2:18: opset version 99999999999999999999 is out of range"),
    "corrupt-opaque": ("input %x: bool[]\n  %y: float32[2] = If(%x) {then_branch=opaque GRAPH b\"ffff\"}\n  output %y",
                       "3:53: opaque attribute is not a serialized ONNX AttributeProto"),
    "opaque-of-another-kind": ("input %x: bool[]\n  %y: float32[2] = If(%x) {then_branch=opaque GRAPH b\"0801\"}\n  output %y",
                               "opaque attribute holds an attribute of type UNDEFINED, not GRAPH"),
    "odd-hex-bytes": ("input %x: float32[2]\n  %y = Relu(%x) {foo=b\"fff\"}\n  output %y",
                      "3:22: bytes need an even number of hex digits"),
    # A value's dtype was taken as written: optimize and run asked numpy for 'quux' (a traceback).
    "unknown-value-dtype": ("input %x: quux[2]\n  %y: quux[2] = Relu(%x)\n  output %y", "2:13: unknown dtype 'quux'"),
    # numpy knows datetime64, ONNX does not: run printed it with a traceback.
    "constant-dtype-onnx-lacks": ("const %c: datetime64[2] = [1, 2]\n  output %c", "2:13: unknown dtype 'datetime64'"),
    # ONNX has no list of lists, nor of mixed kinds: export failed on it with a traceback.
    "nested-list-attribute": ("input %x: float32[2]\n  %y = Relu(%x) {foo=[[1]]}\n  output %y",
                              "3:23: a list may not hold lists"),
    # Read recursively, 5000 brackets ended in Python's recursion limit: one line, but no position.
    "deeply-nested-meta": ("meta foo = " + "[" * 5000 + "]" * 5000 + "\n  input %x: float32[2]\n  output %x",
                           "2:15: a list may not hold lists"),
    "mixed-list-attribute": ("input %x: float32[2]\n  %y = Relu(%x) {foo=[1, \"a\"]}\n  output %y",
                             "3:18: attribute 'foo' must be a list of numbers, of strings or of tensors"),
    # Meta entries saturate reads as its own structures: each was a traceback in optimize.
    "meta-opset-imports": ("meta opset_imports = 5\n  input %x: float32[2]\n  output %x",
                           "2:8: meta 'opset_imports' cannot be set in a text graph"),
    "meta-functions": ("meta functions = 1\n  input %x: float32[2]\n  output %x",
                       "2:8: meta 'functions' cannot be set in a text graph"),
    "meta-preserve-not-strings": ("meta preserve = [1, 2]\n  input %x: float32[2]\n  output %x",
                                  "2:8: meta 'preserve' must be a list of strings"),
    # JSON escapes that spell no Unicode text: export and print failed on them with a traceback.
    "lone-surrogate-name": ('input %"\\ud800": float32[2]\n  %y = Relu(%"\\ud800")\n  output %y',
                            '2:9: string "\\ud800" is not valid Unicode'),
    "lone-surrogate-string-data": ('const %c: string[1] = ["a\\udc80"]\n  output %c',
                                   '2:25: string "a\\udc80" is not valid Unicode'),
    "domain-with-control-characters": ('input %x: float32[2]\n  %y = "my\\u001b.d".Foo(%x)\n  output %y',
                                       '3:8: domain "my\\u001b.d" holds control characters'),
    # The graph's opset was imported again beside it: optimize wrote a model stamped opset 17 and 5.
    "import-of-the-default-domain": ('import "" 5\n  input %x: float32[2]\n  output %x',
                                     "2:10: ONNX's own opset is the graph's"),
    "import-twice": ('import "a.b" 1\n  import "a.b" 2\n  input %x: float32[2]\n  output %x',
                     '3:10: domain "a.b" is imported twice'),
    "terabyte-constant": ("const %c: float32[1099511627776] = 0x00\n  output %c", "constant float32[1099511627776] would take 4.0 TiB"),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", sorted(BAD_TEXT))
def test_bad_text_graph(case, command, tmp_path, capsys):
    body, message = BAD_TEXT[case]
    path = tmp_path / "m.sat"
    path.write_text(f"graph g opset 17\n  {body}\n")
    start = time.monotonic()
    assert main(_argv(command, str(path), tmp_path)) == 2
    assert time.monotonic() - start < SECONDS
    err = capsys.readouterr().err
    # A source error: its one line, then the offending line and a caret under the place.
    assert "Traceback" not in err
    first = err.splitlines()[0]
    assert first.startswith(f"saturate: error: {path}:") and message in first, err
    _nothing_written(tmp_path)


@pytest.mark.parametrize("dim", [-1, 2**63])
def test_graph_validation_refuses_impossible_dims(dim):
    """Graphs built through the API (not only parsed ones) are held to the same dims."""
    from saturate.core.errors import SaturateError
    from saturate.core.ir import Graph, Node, ValueInfo

    g = Graph(inputs=["x"], outputs=["y"], nodes=[Node("Relu", ["x"], ["y"])])
    g.values["x"] = ValueInfo("float32", (2, dim))
    with pytest.raises(SaturateError, match=f"value 'x' has dimension {dim}"):
        g.validate()


def test_sparse_tensors_declaring_terabytes(tmp_path, capsys):
    values = _weight([0], name="v")
    indices = _weight([0], dtype=TensorProto.INT64, name="i")
    sparse = helper.make_sparse_tensor(values, indices, [TIB])
    node = helper.make_node("Constant", [], ["y"], name="dense", sparse_value=sparse)
    model = _save(tmp_path, _model([node]))
    _refused(capsys, _argv("run", model, tmp_path), "node 'dense' (Constant)", "attribute 'sparse_value'", "4.0 TiB")
    graph = _model([helper.make_node("Relu", ["W"], ["y"])])
    graph.graph.sparse_initializer.append(helper.make_sparse_tensor(_weight([0], name="W"), indices, [TIB]))
    _refused(capsys, ["show", _save(tmp_path, graph, "s.onnx")], "sparse initializer 'W'", "not supported")


def test_terabyte_constant_of_shape_in_optimize(tmp_path, capsys):
    """fold-any leaves a ConstantOfShape of 4 TiB (--max-fold-bytes), and the check against ONNX
    Runtime refuses to run it: every value's size is checked before ONNX Runtime computes it."""
    model = _save(tmp_path, _constant_of_shape(shape_input=False))
    _refused(capsys, _argv("optimize", model, tmp_path), "node 'fill' (ConstantOfShape)", "4.0 TiB",
             "--check")
    _nothing_written(tmp_path)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("where", ["input", "output"])
def test_unknown_element_type(where, command, tmp_path, capsys):
    x = helper.make_tensor_value_info("x", 999 if where == "input" else TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", 999 if where == "output" else TensorProto.FLOAT, [2])
    model = _model([helper.make_node("Relu", ["x"], ["y"])], inputs=[x])
    del model.graph.output[:]
    model.graph.output.append(y)
    _refused(capsys, _argv(command, _save(tmp_path, model), tmp_path),
             f"value '{'x' if where == 'input' else 'y'}'", "unknown tensor element type 999")
    _nothing_written(tmp_path)


@pytest.mark.parametrize("command", ["show", "optimize"])
def test_a_node_whose_inputs_contradict_its_op_is_refused_by_name(command, tmp_path, capsys):
    # An Add of [2, 4] and [4, 3] (a MatMul renamed, say): ONNX Runtime refuses such a model, so
    # optimize must not write one; the checker alone does not look at shapes.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3], [0.5] * 12)
    model = _model([helper.make_node("Add", ["x", "w"], ["y"], name="mm")], inputs=[x], initializers=[w])
    _refused(capsys, _argv(command, _save(tmp_path, model), tmp_path), "Add", "mm", "Incompatible dimensions")
    _nothing_written(tmp_path)


@pytest.mark.parametrize("command", ["show", "optimize"])
def test_a_name_that_is_not_utf8_is_refused(command, tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="relu")], inputs=[x])
    data = model.SerializeToString().replace(b"relu", b"r\x80lu")
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    _refused(capsys, _argv(command, str(path), tmp_path), "not UTF-8")
    _nothing_written(tmp_path)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("first, second, words", [(("", 17), ("ai.onnx", 5), "domain 'ai.onnx' is imported twice, at opsets 17 and 5"),
                                                  (("my.d", 1), ("my.d", 2), "domain 'my.d' is imported twice, at opsets 1 and 2")])
def test_a_domain_imported_at_two_opsets_is_refused(command, first, second, words, tmp_path, capsys):
    # ONNX Runtime read the Relu at opset 5 (and refused it), saturate at 17 (the last import won).
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    model = _model([helper.make_node("Relu", ["x"], ["y"])], inputs=[x])
    model.opset_import.extend([helper.make_opsetid(*first), helper.make_opsetid(*second)])
    _refused(capsys, _argv(command, _save(tmp_path, model), tmp_path), words)
    _nothing_written(tmp_path)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("op, domain", [("Fo\x1b]0;t\x07o", "my.d"), ("Foo", "my\n.d")])
def test_an_op_or_domain_with_control_characters_is_refused(command, op, domain, tmp_path, capsys):
    # ONNX's checker takes any text in another domain; show's op counts and optimize's summary
    # printed it as it is (a terminal escape acted, a line break split the table).
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    model = _model([helper.make_node(op, ["x"], ["y"], domain=domain)], inputs=[x])
    model.opset_import.append(helper.make_opsetid(domain, 1))
    _refused(capsys, _argv(command, _save(tmp_path, model), tmp_path), "node 0 of the graph", repr(op),
             "control characters in an op or domain")
    _nothing_written(tmp_path)
