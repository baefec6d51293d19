"""The model summary: nodes per op, parameters, size and MACs, from the API and in `saturate optimize`."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import saturate
from saturate.cli import main
from saturate.core.errors import SaturateError
from saturate.summary import ModelSummary, format_summary, summarize
from test_simplify_api import conv_bn_relu


def _weight(name: str, shape: tuple[int, ...]):
    return numpy_helper.from_array(np.ones(shape, np.float32), name)


def contractions() -> object:
    """One node of each counted op (and an uncounted Relu), shapes chosen so the counts are easy by hand."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=2, strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("ConvTranspose", ["r", "wt"], ["t"], strides=[2, 2]),
             helper.make_node("Gemm", ["a", "b"], ["g"], transA=1),
             helper.make_node("MatMul", ["m", "n"], ["p"])]
    graph = helper.make_graph(
        nodes, "contractions",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8]),
         helper.make_tensor_value_info("a", TensorProto.FLOAT, [5, 3]),
         helper.make_tensor_value_info("m", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in ("t", "g", "p")],
        [_weight("w", (6, 2, 3, 3)), _weight("wt", (6, 3, 2, 2)), _weight("b", (5, 7)), _weight("n", (4, 5))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_macs_count_every_contraction_from_its_shapes():
    model = contractions()
    summary = saturate.model_summary(model)
    conv = 1 * 6 * 4 * 4 * (2 * 3 * 3)      # output [1,6,4,4]; each a dot product over C_in/group x 3x3
    transposed = 1 * 6 * 4 * 4 * (3 * 2 * 2)  # input [1,6,4,4]; each scattered over C_out x 2x2
    gemm = 3 * 7 * 5                         # A' [3,5] x B [5,7]
    matmul = 2 * 3 * 5 * 4                   # [2,3,4] x [4,5]
    assert summary.macs == conv + transposed + gemm + matmul
    assert summary.parameters == 6 * 2 * 3 * 3 + 6 * 3 * 2 * 2 + 5 * 7 + 4 * 5
    assert summary.ops == {"Conv": 1, "ConvTranspose": 1, "Gemm": 1, "MatMul": 1, "Relu": 1}
    assert summary.size == model.ByteSize()


@pytest.mark.slow      # building the example model's weights takes seconds
def test_resnet18_has_the_macs_and_parameters_torchvision_lists():
    """torchvision lists ResNet-18 at 1.81 GFLOPS (multiply-adds, at 224x224) and 11,689,512
    parameters; the model's batch norms also hold their running mean and variance, 9,600 elements."""
    summary = saturate.model_summary("example:resnet18")
    assert summary.macs == 1_814_073_344
    assert summary.parameters == 11_689_512 + 9_600


def test_a_symbolic_dimension_makes_the_macs_unknown():
    summary = saturate.model_summary(conv_bn_relu(batch="N"))
    assert summary.macs is None and summary.parameters == 4 * 3 * 3 * 3 + 4 * 4
    table = format_summary(summary, summary)
    assert table.splitlines()[-1].split() == ["MACs", "?", "?"]


def test_the_size_is_that_of_the_file_saturate_writes(tmp_path):
    from saturate.frontend import load_graph, save_graph

    graph = load_graph("example:mlp")
    save_graph(graph, str(tmp_path / "mlp.onnx"))
    assert summarize(graph).size == os.path.getsize(tmp_path / "mlp.onnx")
    assert saturate.model_summary(str(tmp_path / "mlp.onnx")) == summarize(graph)
    assert saturate.model_summary(graph) == summarize(graph)
    with pytest.raises(SaturateError, match="model_summary takes an onnx.ModelProto, a path or a Graph, not int"):
        saturate.model_summary(3)


def _table(out: str) -> dict[str, list[str]]:
    """The summary table's rows, by their first column."""
    lines = out.splitlines()
    start = next(k for k, line in enumerate(lines) if line.split() == ["before", "after"])
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[start + 1:]]
    return {row[0]: row[1:] for row in rows}


def test_optimize_prints_the_summary_and_writes_it_in_the_report(tmp_path, capsys):
    import onnx

    onnx.save(conv_bn_relu(), tmp_path / "m.onnx")
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(out), "--report", str(report)]) == 0
    data = json.loads(report.read_text())["summary"]
    before, after = data["before"], data["after"]
    assert after["size_bytes"] == os.path.getsize(out)
    # The batch norm's four vectors are gone; the conv gained a bias of 4.
    assert (before["parameters"], after["parameters"]) == (4 * 27 + 16, 4 * 27 + 4)
    assert before["macs"] == after["macs"] == 4 * 5 * 5 * 27
    assert (before["nodes"], after["nodes"]) == (4, 3)
    rows = _table(capsys.readouterr().out)
    assert rows["nodes"] == ["4", "3"] and rows["BatchNormalization"] == ["1", "0"]
    assert "Conv" not in rows                      # op types whose count did not change are left out
    assert rows["parameters"] == ["124", "112"] and rows["MACs"] == ["2,700", "2,700"]
    assert rows["model size"] == [_kib(before["size_bytes"]), _kib(after["size_bytes"])]
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(out), "--quiet"]) == 0
    assert capsys.readouterr().out == ""


def _kib(n: int) -> str:
    return f"{n / 1024:.2f} KiB" if n >= 1024 else f"{n} B"


def test_optimize_summary_shows_unknown_macs_until_an_input_shape_is_given(tmp_path, capsys):
    import onnx

    onnx.save(conv_bn_relu(batch="N"), tmp_path / "m.onnx")
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx")]) == 0
    assert _table(capsys.readouterr().out)["MACs"] == ["?", "?"]
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "--input-shape", "x:2,3,5,5"]) == 0
    assert _table(capsys.readouterr().out)["MACs"] == ["5,400", "5,400"]


def test_the_summary_as_json_holds_every_count():
    summary = ModelSummary({"Relu": 2, "Conv": 1}, 10, None, None)
    assert summary.to_json() == {"nodes": 3, "ops": {"Conv": 1, "Relu": 2}, "parameters": 10,
                                 "size_bytes": None, "macs": None}


def test_a_partitioned_result_counts_what_its_functions_do(tmp_path):
    """Composites called as ONNX functions: their bodies' Conv and (with --keep-constants) weights count."""
    import onnx

    onnx.save(conv_bn_relu(), tmp_path / "m.onnx")
    for keep in ([], ["--keep-constants"]):
        out, report = tmp_path / "p.onnx", tmp_path / "r.json"
        assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(out), "--partition", "--target", "fused",
                     "--report", str(report), "--quiet", *keep]) == 0
        after = json.loads(report.read_text())["summary"]["after"]
        assert after["ops"] == {"Flatten": 1, "conv_bias_relu": 1}
        assert (after["macs"], after["parameters"], after["size_bytes"]) == (2700, 112, os.path.getsize(out))
        assert saturate.model_summary(str(out)).macs == 2700
