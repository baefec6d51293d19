"""The e-graph kept between runs of one program (saturate.engine.encode.loaded_egraph) never mixes two
models: any sequence of models in one process gives each the graph and report it gets alone."""

from __future__ import annotations

import json

import onnx
import pytest

import saturate
from saturate.cli import main
from saturate.engine import encode
from saturate.frontend import load_graph, save_graph
from saturate.frontend.onnx_io import export_model


def _optimize(name: str) -> tuple[bytes, dict]:
    """The optimized model's bytes and its report, less what varies from run to run (times, the
    process's peak memory)."""
    graph, report = saturate.optimize(load_graph(f"corpus:{name}"), level=3, target="cpu")
    got = report.to_json()
    del got["times"], got["peak_rss_bytes"]
    return export_model(graph).SerializeToString(), got


def _alone(name: str) -> tuple[bytes, dict]:
    encode._prepared.clear()
    try:
        return _optimize(name)
    finally:
        encode._prepared.clear()


# Pairs whose declarations and rules are the same program (one key before the kept e-graph was
# keyed by the rules it declares on first need): the first model's guarded rules declared apply
# rules carrying its attribute-set and literal ids, which the second model read as its own.
@pytest.mark.parametrize("first,second", [("efficientnet_lite0-ts", "mobilenet_v2-ts"),
                                          ("efficientnet_lite0-dynamo", "mobilenet_v2-dynamo")])
def test_models_sharing_a_program_give_in_one_process_what_they_give_alone(first, second):
    alone = {name: _alone(name) for name in (first, second)}
    for order in ((first, second), (second, first)):
        encode._prepared.clear()
        try:
            for name in order:
                model, report = _optimize(name)
                assert report == alone[name][1], f"{name} after {order[0]}"
                assert model == alone[name][0], f"{name} after {order[0]}"
        finally:
            encode._prepared.clear()


def test_a_kept_egraph_serves_again_every_run_of_its_own_program():
    """The start-up saving stays where it is sound: a model with other apply rules gets an e-graph
    of its own, and a model whose every declaration is the same as one kept (resnet18-ts and its
    dynamic-batch twin) starts from the kept one, as a repeated run of one model does."""
    encode._prepared.clear()
    try:
        kept = []
        for name in ("efficientnet_lite0-ts", "mobilenet_v2-ts", "efficientnet_lite0-ts", "resnet18-ts",
                     "resnet18-ts-dyn"):
            _optimize(name)
            kept.append(len(encode._prepared))
        assert kept == [1, 2, 2, 3, 3]
    finally:
        encode._prepared.clear()


# The batch's own path (worker processes, each keeping e-graphs between its models), on a dozen models
# rather than the corpus: test_corpus.py optimizes every model already, and the whole corpus again here
# was a minute of both cores. Two programs (resnet18's TorchScript and dynamo exports) are each shared
# by three models, the dynamic-batch twin and a copy read from a file, so with two workers one of them
# runs some program again on the e-graph it kept; the rest (quantized, transformer, dynamic-batch and
# unoptimized exports) put more programs through each worker than encode.PREPARED_KEEP, so kept e-graphs
# are evicted and models follow others of other programs.
BATCH = ["resnet18-ts", "resnet18-ts-dyn", "resnet18-dynamo", "resnet18-dynamo-dyn", "bert-qdq", "mobilenet_v2-qdq",
         "llama-dynamo-dyn", "bert-ts-dyn", "gpt2-dynamo", "t5_encoder-ts", "squeezenet1_1-dynamo",
         "mobilenet_v3_small-ts"]


@pytest.mark.slow
def test_a_batch_in_two_processes_optimizes_every_model(tmp_path):
    copies = []
    for name in ("resnet18-ts", "resnet18-dynamo"):
        copies.append(str(tmp_path / f"{name}-copy.onnx"))
        save_graph(load_graph(f"corpus:{name}"), copies[-1])
    out = tmp_path / "out"
    main(["optimize", *(f"corpus:{n}" for n in BATCH), *copies, "-o", str(out), "--jobs", "2", "--quiet"])
    summary = json.loads((out / "summary.json").read_text())
    failed = [(r["source"], r["error"]) for r in summary["results"] if not r["ok"]]
    assert not failed
    assert summary["models"] == len(BATCH) + len(copies) > 2 * encode.PREPARED_KEEP
    for result in summary["results"]:
        onnx.checker.check_model(onnx.load(result["output"]), full_check=True)
