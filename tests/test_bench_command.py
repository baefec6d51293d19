"""`saturate bench --input-shape`: a model with a symbolic input is timed at the shape given; without
it, bench and compile name that option (not the Python keyword input_shapes)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from saturate.cli import main


def dynamic_matmul(path) -> str:
    """x [N, 8] -> MatMul [8, 4] -> Relu -> y [N, 4]."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                              "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def test_a_symbolic_input_is_refused_naming_the_option_that_fixes_it(tmp_path, capsys):
    model = dynamic_matmul(tmp_path / "dyn.onnx")
    assert main(["bench", model, "--runs", "1"]) == 2
    assert capsys.readouterr().err == ("saturate: error: input 'x' has shape (N, 8); saturate bench needs a static "
                                       "one: --input-shape x:1,8\n")


def test_compile_refuses_a_symbolic_input_naming_input_shape(tmp_path, capsys):
    model = dynamic_matmul(tmp_path / "dyn.onnx")
    assert main(["compile", model, "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == ("saturate: error: input 'x' has shape (N, 8); saturate compile needs a "
                                       "static one: --input-shape x:1,8\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("spec,error", [
    ("x:2", "--input-shape 'x': input 'x' has rank 2 (Nx8), not 1"),
    ("y:2,8", "--input-shape 'y': the model has no input 'y'; its inputs are 'x'"),
    ("x:2,9", "--input-shape 'x': dim 1 of input 'x' is static, 8, not 9"),
    ("x:0,8", "bad --input-shape 'x:0,8': expected NAME=D1xD2x... or NAME:D1,D2,... with positive sizes")])
def test_a_bad_input_shape_is_one_line(tmp_path, capsys, spec, error):
    model = dynamic_matmul(tmp_path / "dyn.onnx")
    assert main(["bench", model, "--input-shape", spec]) == 2
    assert capsys.readouterr().err == f"saturate: error: {error}\n"


@pytest.mark.compiler
def test_input_shape_times_a_symbolic_input_at_that_shape(tmp_path, capsys):
    model = dynamic_matmul(tmp_path / "dyn.onnx")
    assert main(["bench", model, "--runs", "1", "--threads", "1", "--input-shape", "x:3,8"]) == 0
    table = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:]}
    assert set(rows) == {"numpy", "onnxruntime", "compiled"}
    # Each runtime ran and matched ONNX Runtime on the same [3, 8] input.
    assert float(rows["compiled"][-1]) <= 1e-4 and float(rows["numpy"][-1]) <= 1e-4



def test_each_timed_run_follows_an_untimed_run_of_the_same_runtime(monkeypatch):
    """A runtime whose run right after another runtime's is slow (its caches evicted) is timed warm: the
    cold runs are the untimed ones."""
    import time

    from saturate.backend import bench, runtime
    from saturate.frontend.onnx_io import import_model

    clock, last = [0.0], [None]

    def run_as(name, warm, cold):
        clock[0] += warm if last[0] == name else cold
        last[0] = name
        return {"y": np.zeros((2, 4), np.float32)}

    class Model:
        inputs = [("x", (2, 8))]
        input_dtypes = {"x": "float32"}

        def __call__(self, feed):
            return run_as("c", 1.0, 1.1)

    class Session:
        def get_outputs(self):
            return [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])]

        def run(self, names, feed):
            return [run_as("ort", 2.0, 5.0)["y"]]

    monkeypatch.setattr(runtime, "compile_graph", lambda graph, threads: Model())
    monkeypatch.setattr(bench, "ort_session", lambda *a: Session())
    monkeypatch.setattr("saturate.simplifier.run_interruptibly", lambda sess, names, feed: sess.run(names, feed))
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    w = numpy_helper.from_array(np.ones((8, 4), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w])
    model = import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    rows = {r.name: r for r in bench.benchmark(model, runs=3, reference=False)}
    assert rows["onnxruntime"].median_ms == pytest.approx(2000.0)
    assert rows["compiled C"].median_ms == pytest.approx(1000.0)
