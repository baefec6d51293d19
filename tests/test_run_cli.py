"""`saturate run` and the example models: interpreter vs ONNX Runtime, CLI outputs and errors."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from saturate.frontend import examples
from saturate.frontend.onnx_io import import_model
from saturate.cli import main
from saturate.interp.interpreter import run_graph


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """Norm-relative error: max|a-b| / max(1, max|b|)."""
    diff = np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))
    return float(diff / max(1.0, float(np.max(np.abs(want)))))


def ort_outputs(model: onnx.ModelProto, feeds: dict) -> dict:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def feeds_for(graph, seed=0):
    rng = np.random.default_rng(seed)
    return {i: rng.standard_normal([d if isinstance(d, int) else 2 for d in graph.values[i].shape])
            .astype(graph.values[i].dtype) for i in graph.inputs if i not in graph.constants}


@pytest.mark.parametrize("name", [
    "vgg", "mobilenet", "mlp", "chain-3", "resnet18",
    pytest.param("resnet50", marks=pytest.mark.slow),
    pytest.param("vgg11bn", marks=pytest.mark.slow),
])
def test_example_models_match_onnxruntime(name):
    model = examples.build_model(name)
    graph = import_model(model)
    feeds = feeds_for(graph)
    want = ort_outputs(model, feeds)
    got = run_graph(graph, feeds)
    assert set(got) == set(want)
    for k in want:
        assert got[k].shape == want[k].shape
        if rel_error(got[k], want[k]) <= 1e-5:
            continue
        # Deep float32 nets (resnet50) sit near 1e-5 from the exact result in ONNX Runtime too,
        # and how far varies with how BLAS splits its sums across threads: then allow three
        # times ONNX Runtime's own float32 error, measured against a float64 run.
        exact = run_graph(*in_float64(graph, feeds))[k]
        tol = 3 * rel_error(want[k], exact)
        assert rel_error(got[k], want[k]) <= tol, (name, k, rel_error(got[k], want[k]), tol)
        assert rel_error(got[k], exact) <= tol


def in_float64(graph, feeds):
    """The same graph and inputs with every float32 array widened to float64."""
    wide = graph.copy()
    wide.constants = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in graph.constants.items()}
    for i in graph.inputs:
        wide.values[i].dtype = "float64"
    return wide, {k: v.astype(np.float64) for k, v in feeds.items()}


def two_in_two_out(path):
    """A .onnx file with inputs a, b and outputs s = a + b, p = a * b."""
    vi = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2, 3]) for n in "ab"]
    outs = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2, 3]) for n in "sp"]
    nodes = [helper.make_node("Add", ["a", "b"], ["s"], name="add"),
             helper.make_node("Mul", ["a", "b"], ["p"], name="mul")]
    model = helper.make_model(helper.make_graph(nodes, "two", vi, outs),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, str(path))
    return str(path)


def test_run_npy_in_npy_out_matches_interpreter(tmp_path, capsys):
    graph = examples.build("mlp")
    x = feeds_for(graph, seed=3)
    np.save(tmp_path / "x.npy", next(iter(x.values())))
    assert main(["run", "example:mlp", "--input", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy")]) == 0
    y = np.load(tmp_path / "y.npy")
    assert np.array_equal(y, run_graph(graph, x)[graph.outputs[0]])
    assert "wrote" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_run_npz_several_inputs_and_outputs(tmp_path):
    model = two_in_two_out(tmp_path / "two.onnx")
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.full((2, 3), 2, np.float32)
    np.savez(tmp_path / "in.npz", a=a, b=b)
    assert main(["run", model, "-i", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as out:
        assert np.array_equal(out["s"], a + b) and np.array_equal(out["p"], a * b)


def test_run_without_input_uses_seeded_random_input_and_prints(capsys):
    assert main(["run", "example:mlp", "--values", "3"]) == 0
    first = capsys.readouterr()
    assert "random normal input from seed 0" in first.err
    graph = examples.build("mlp")
    name = graph.outputs[0]
    line = first.out.strip()
    assert line.startswith(f"{name}: float32[")
    assert line.count(",") >= 3 and "min" in line and "max" in line
    assert main(["run", "example:mlp", "--values", "3"]) == 0
    assert capsys.readouterr().out.strip() == line  # same seed, same values
    x = np.random.default_rng(0).standard_normal(graph.values[graph.inputs[0]].shape).astype(np.float32)
    y = run_graph(graph, {graph.inputs[0]: x})[name]
    assert f"{y.reshape(-1)[0]:.6g}" in line


def test_run_draws_random_inputs_of_bfloat16_float8_and_int4(tmp_path, capsys):
    types = {"b": onnx.TensorProto.BFLOAT16, "f": onnx.TensorProto.FLOAT8E4M3FN,
             "e": onnx.TensorProto.FLOAT8E8M0, "i": onnx.TensorProto.INT4}
    nodes = [helper.make_node("Cast", [k], [f"{k}32"], to=onnx.TensorProto.FLOAT) for k in types]
    model = helper.make_model(helper.make_graph(
        nodes, "exotic", [helper.make_tensor_value_info(k, t, [3]) for k, t in types.items()],
        [helper.make_tensor_value_info(f"{k}32", onnx.TensorProto.FLOAT, [3]) for k in types]),
        opset_imports=[helper.make_opsetid("", 24)])
    onnx.save(model, str(tmp_path / "exotic.onnx"))
    assert main(["run", str(tmp_path / "exotic.onnx"), "-o", str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as out:
        assert all(np.isfinite(out[f"{k}32"]).all() for k in types)
        assert (out["e32"] > 0).all() and (np.exp2(np.round(np.log2(out["e32"]))) == out["e32"]).all()
        assert (out["i32"] == np.round(out["i32"])).all() and 0 <= out["i32"].min()


def bad_model(tmp_path):
    # An op of a domain of its own: the interpreter runs every standard op (onnx.reference).
    node = helper.make_node("MyOp", ["x"], ["y"], name="hm", domain="com.example")
    model = helper.make_model(helper.make_graph(
        [node], "bad", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)], ir_version=9)
    onnx.save(model, str(tmp_path / "bad.onnx"))
    return str(tmp_path / "bad.onnx")


def multinomial_model(tmp_path):
    # A node the interpreter refuses for its attributes, found only when it runs.
    node = helper.make_node("Multinomial", ["x"], ["y"], name="draw", sample_size=0)
    model = helper.make_model(helper.make_graph(
        [node], "draws", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.INT32, None)]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, str(tmp_path / "draws.onnx"))
    return str(tmp_path / "draws.onnx")


@pytest.mark.parametrize("argv, message", [
    (["run", "{tmp}/missing.onnx"], "missing.onnx: no such file"),
    (["run", "example:mlp", "-i", "{tmp}/none.npy"], "none.npy: no such file"),
    (["run", "example:mlp", "-i", "{tmp}/junk.npy"], "junk.npy: not a .npy or .npz array file"),
    (["run", "example:mlp", "-i", "{tmp}/wrong.npy"], "input 'x' has shape [3, 3], the graph expects"),
    (["run", "example:mlp", "-i", "{tmp}/named.npz"], "'nope' is not an input of the graph"),
    (["run", "{two}", "-i", "{tmp}/wrong.npy"], "one array given, but the model has 2 inputs (a, b)"),
    (["run", "{two}", "-o", "{tmp}/out.npy"], "the model has 2 outputs (s, p); save them to a .npz"),
    (["run", "example:mlp", "-o", "{tmp}/no/dir/y.npy"], "does not exist"),
    (["run", "{bad}"], "no reference implementation for op 'com.example::MyOp' (node 'hm')"),
    (["run", "{draws}"], "node 'draw' (Multinomial): sample_size must be at least 1, got 0"),
])
def test_run_errors_are_one_line_exit_2(tmp_path, capsys, argv, message):
    (tmp_path / "junk.npy").write_bytes(b"not numpy at all")
    np.save(tmp_path / "wrong.npy", np.zeros((3, 3), np.float32))
    np.savez(tmp_path / "named.npz", nope=np.zeros(1))
    paths = {"tmp": str(tmp_path), "two": two_in_two_out(tmp_path / "two.onnx"), "bad": bad_model(tmp_path),
             "draws": multinomial_model(tmp_path)}
    assert main([a.format(**paths) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("saturate: error: ") and message in err[-1]
    assert "Traceback" not in "\n".join(err)


def _npy_bytes(header: dict, data: bytes) -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue() + data


@pytest.mark.parametrize("kind, extra, message", [
    ("huge.npy", [], "input 'x' in {tmp}/huge.npy would take 256.0 GiB, over the memory limit of"),
    ("huge.npz", [], "input 'x' in {tmp}/huge.npz would take 256.0 GiB, over the memory limit of"),
    ("huge.npy", ["--max-memory", "1T"], "input 'x' in {tmp}/huge.npy: its header says float32[68719476736] "
                                         "(274877906944 bytes) but the file holds 16 bytes of data"),
    ("short.npz", [], "input 'x' in {tmp}/short.npz: its header says float32[3] (12 bytes) but the file holds 8"),
    ("objects.npy", [], "input 'x' in {tmp}/objects.npy: an array of Python objects, which saturate never unpickles"),
    ("twice.npz", [], "{tmp}/twice.npz: holds the array 'x' twice"),
    ("pair.npz", ["--max-memory", "1200K"], "input 'c' in {tmp}/pair.npz with the arrays before it would take 1.5 MiB, "
                                            "over the memory limit of"),
])
def test_an_input_file_is_checked_before_anything_is_allocated_for_it(tmp_path, capsys, kind, extra, message):
    """An array file is untrusted: a .npy header claiming 256 GiB over 16 bytes of data (alone or in an
    .npz) was allocated by numpy and ended in a MemoryError traceback; now the claim is checked against
    --max-memory and against the bytes the file holds before any allocation."""
    import zipfile

    model = two_in_two_out(tmp_path / "two.onnx") if kind in ("twice.npz", "pair.npz") else None
    relu = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n"])]), opset_imports=[helper.make_opsetid("", 17)]),
        str(relu))
    huge = _npy_bytes({"descr": "<f4", "fortran_order": False, "shape": (2 ** 36,)}, b"\0" * 16)
    (tmp_path / "huge.npy").write_bytes(huge)
    with zipfile.ZipFile(tmp_path / "huge.npz", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", huge)
    with zipfile.ZipFile(tmp_path / "short.npz", "w") as z:
        z.writestr("x.npy", _npy_bytes({"descr": "<f4", "fortran_order": False, "shape": (3,)}, b"\0" * 8))
    np.save(tmp_path / "objects.npy", np.array([1, "a"], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(tmp_path / "twice.npz", "w") as z, pytest.warns(UserWarning, match="Duplicate name"):
        for _ in range(2):
            z.writestr("x.npy", _npy_bytes({"descr": "<f4", "fortran_order": False, "shape": (1,)}, b"\0" * 4))
    np.savez(tmp_path / "pair.npz", a=np.zeros((2, 3), np.float32), b=np.zeros(200_000, np.float32),
             c=np.zeros(200_000, np.float32))
    argv = ["run", str(model or relu), "-i", str(tmp_path / kind), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("saturate: error: ") and message.format(tmp=tmp_path) in err[0], err


def test_input_arrays_in_fortran_order_and_in_a_compressed_npz_read_as_numpy_writes_them(tmp_path):
    a = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    np.savez_compressed(tmp_path / "in.npz", a=a, b=b)
    assert main(["run", two_in_two_out(tmp_path / "two.onnx"), "-i", str(tmp_path / "in.npz"),
                 "-o", str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as out:
        assert np.array_equal(out["s"], a + b) and np.array_equal(out["p"], a * b)


def test_a_bfloat16_array_numpy_saved_as_raw_bytes_is_read_as_the_graphs_bfloat16(tmp_path):
    """numpy writes ml_dtypes' bfloat16 as '|V2' and reads it back as such: `run -o` output fed back
    with `--input` was refused (void16, the graph expects bfloat16); it is read as the graph's type."""
    import ml_dtypes

    bf = onnx.TensorProto.BFLOAT16
    model = tmp_path / "bf.onnx"
    onnx.save(helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", bf, [4])],
        [helper.make_tensor_value_info("y", bf, [4])]), opset_imports=[helper.make_opsetid("", 17)]), str(model))
    x = np.array([-1.5, 2.25, -0.0, 3.0], ml_dtypes.bfloat16)
    np.save(tmp_path / "x.npy", x)
    assert np.load(tmp_path / "x.npy").dtype == np.dtype("V2")  # what makes the reading-back necessary
    assert main(["run", str(model), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy")]) == 0
    y = np.load(tmp_path / "y.npy").view(ml_dtypes.bfloat16)
    assert np.array_equal(y, np.maximum(x, 0))
    assert main(["run", str(model), "-i", str(tmp_path / "y.npy"), "-o", str(tmp_path / "z.npy")]) == 0
    assert np.array_equal(np.load(tmp_path / "z.npy").view(ml_dtypes.bfloat16), y)


def test_run_text_graph_gives_the_same_outputs_as_the_example(tmp_path):
    from saturate.frontend import save_graph

    save_graph(examples.build("vgg"), str(tmp_path / "vgg.sat"))
    assert main(["run", str(tmp_path / "vgg.sat"), "-o", str(tmp_path / "a.npy")]) == 0
    assert main(["run", "example:vgg", "-o", str(tmp_path / "b.npy")]) == 0
    assert np.array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))


@pytest.mark.compiler
def test_a_compiled_directory_gives_outputs_that_are_an_input_or_a_constant(tmp_path, capsys):
    # One C segment gives y alone: installed as a whole directory, `run DIR` dropped x and w,
    # which the model, ONNX Runtime and `run --backend c` all give.
    f = lambda name, shape: helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [f("x", [2, 3])],
                              [f("y", [2, 3]), f("x", [2, 3]), f("w", [2])],
                              initializer=[helper.make_tensor("w", onnx.TensorProto.FLOAT, [2], [1.0, 2.0])])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["compile", str(model), "-o", str(tmp_path / "m"), "--quiet"]) == 0
    assert main(["run", str(tmp_path / "m"), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npz")]) == 0
    got = np.load(tmp_path / "y.npz")
    want = dict(zip(["y", "x", "w"], ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
                    .run(None, {"x": x})))
    assert sorted(got.files) == sorted(want)
    for k in want:
        assert np.array_equal(got[k], want[k]), k


def test_names_and_strings_of_a_model_print_escaped(tmp_path, capsys):
    # Value names and string values went to the terminal as they are: a title-setting escape and a
    # line break in an output's name, from the model, acted on the terminal and split the line.
    model = tmp_path / "m.sat"
    model.write_text('graph g opset 17\n  input %"x\\u001b[31m": float32[2]\n'
                     '  const %s: string[1] = ["a\\nb\\u0007"]\n'
                     '  %"y\\u001b]0;t\\u0007\\nz" = Relu(%"x\\u001b[31m")\n  %t = Identity(%s)\n'
                     '  output %"y\\u001b]0;t\\u0007\\nz"\n  output %t\n')
    for argv in ([], ["-o", str(tmp_path / "o.npz")]):
        assert main(["run", str(model), *argv]) == 0
        printed = capsys.readouterr()
        text = printed.out + printed.err
        assert "\x1b" not in text and "\x07" not in text, text
        assert "y\\x1b]0;t\\x07\\nz" in printed.out and "x\\x1b[31m" in printed.err
        assert len(printed.out.splitlines()) == (2 if not argv else 1)


GOOD_PIECE = {"kind": "c", "inputs": ["x"], "outputs": ["y"], "dir": "seg0"}


@pytest.mark.parametrize("manifest", [
    {"input_shapes": {}, "pieces": 5},
    {"input_shapes": {}, "pieces": [1, 2]},
    {"input_shapes": {}, "pieces": [{**GOOD_PIECE, "dir": 5}]},
    {"input_shapes": {}, "pieces": [{k: v for k, v in GOOD_PIECE.items() if k != "dir"}]},
    {"input_shapes": {}, "pieces": [{**GOOD_PIECE, "inputs": [1]}]},
    # The segments are folders of the directory itself, as compile writes them.
    {"input_shapes": {}, "pieces": [{**GOOD_PIECE, "dir": "../elsewhere"}]},
    {"input_shapes": {}, "pieces": [{**GOOD_PIECE, "dir": "/tmp"}]},
    {"input_shapes": {"x": "ab"}, "pieces": [GOOD_PIECE]},
    {"input_shapes": {"x": [4.5, 8]}, "pieces": [GOOD_PIECE]},
])
def test_a_damaged_manifest_is_a_one_line_error(tmp_path, capsys, manifest):
    # Each was a traceback (TypeError, KeyError, ValueError) before graph.onnx or a segment was read.
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "manifest.json").write_text(json.dumps(manifest))
    assert main(["run", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"saturate: error: {tmp_path / 'm' / 'manifest.json'}: not a manifest saturate wrote"], err


@pytest.mark.compiler
def test_run_a_compiled_directory_whole_or_cut_by_interpreter_ops(tmp_path, capsys):
    """`saturate run DIR` goes through the directory's extension module (and its graph.onnx for the
    interpreter pieces of a cut graph) and gives what `run MODEL --backend c` gives."""
    from test_backend_ops import fallback_graph

    from saturate.frontend import save_graph

    save_graph(fallback_graph(), str(tmp_path / "cut.onnx"))
    rng = np.random.default_rng(2)
    np.save(tmp_path / "mlp.npy", rng.standard_normal((2, 64)).astype(np.float32))
    np.save(tmp_path / "cut.npy", rng.standard_normal((2, 3, 5, 5)).astype(np.float32))
    for model, out in (("example:mlp", "y.npy"), (str(tmp_path / "cut.onnx"), "y.npz")):
        name = "mlp" if model.startswith("example") else "cut"
        assert main(["compile", model, "-o", str(tmp_path / name), "--quiet"]) == 0
        x = str(tmp_path / f"{name}.npy")
        assert main(["run", str(tmp_path / name), "-i", x, "-o", str(tmp_path / f"dir-{out}")]) == 0
        assert main(["run", model, "--backend", "c", "-i", x, "-o", str(tmp_path / f"c-{out}")]) == 0
        assert main(["run", model, "-i", x, "-o", str(tmp_path / f"np-{out}")]) == 0
        got, want, ref = (np.load(tmp_path / f"{kind}-{out}") for kind in ("dir", "c", "np"))
        if out.endswith(".npy"):
            got, want, ref = {"y": got}, {"y": want}, {"y": ref}
        assert sorted(got) == sorted(want) == sorted(ref)
        for k in want:
            assert np.array_equal(got[k], want[k]), k
            assert rel_error(got[k], ref[k]) <= 1e-4, k
    assert (tmp_path / "cut" / "manifest.json").is_file() and (tmp_path / "cut" / "graph.onnx").is_file()
    capsys.readouterr()
    np.save(tmp_path / "wrong.npy", np.zeros((3, 64), np.float32))
    (tmp_path / "empty").mkdir()
    for argv, words in ((["run", str(tmp_path / "mlp"), "-i", str(tmp_path / "wrong.npy")],
                         "input 'x' has shape (3, 64); the compiled model expects (2, 64)"),
                        (["run", str(tmp_path / "mlp"), "--backend", "numpy"], "a compiled directory runs its compiled C"),
                        (["run", str(tmp_path / "empty")], "no compiled model")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("saturate: error: ") and words in err[-1] and "Traceback" not in "\n".join(err)
