"""Example models: shapes and structure, non-trivial batch norms, determinism, numerics vs ONNX Runtime."""

import numpy as np
import onnxruntime as ort
import pytest

from saturate.frontend import load_graph
from saturate.frontend.examples import EXAMPLES, build, build_model, random_inputs
from saturate.core.errors import SaturateError
from saturate.interp.interpreter import run_graph
from saturate.core.ir import graph_differences

SMALL = ["vgg", "mobilenet", "mlp", "chain-3"]
BIG = ["resnet18", "resnet50", "vgg11bn"]


def conv_kernels(g):
    return [tuple(n.attrs["kernel_shape"]) for n in g.nodes if n.op == "Conv"]


def test_names_listed_for_help():
    assert set(EXAMPLES) >= {"vgg", "vgg11bn", "resnet18", "resnet50", "mobilenet", "mlp", "chain-N"}


@pytest.mark.parametrize("name", SMALL + ["resnet18"])
def test_batch_norms_are_not_trivial(name):
    g = build(name)
    for n in g.nodes:
        if n.op == "BatchNormalization":
            gamma, beta, mean, var = (g.constants[i] for i in n.inputs[1:])
            assert (var > 0).all()
            for arr, trivial in ((gamma, 1), (beta, 0), (mean, 0), (var, 1)):
                assert not np.allclose(arr, trivial)
            assert len(np.unique(gamma)) == len(gamma)


def test_resnet18_shape():
    g = build("resnet18")
    counts = g.op_counts()
    assert (counts["Conv"], counts["BatchNormalization"], counts["Add"], counts["Relu"]) == (20, 20, 8, 17)
    assert (counts["MaxPool"], counts["GlobalAveragePool"], counts["Flatten"], counts["Gemm"]) == (1, 1, 1, 1)
    assert conv_kernels(g).count((1, 1)) == 3  # the downsample convs
    assert g.info("x").shape == (1, 3, 224, 224) and g.info(g.outputs[0]).shape == (1, 1000)
    widths = sorted({g.constants[n.inputs[1]].shape[0] for n in g.nodes if n.op == "Conv"})
    assert widths == [64, 128, 256, 512]
    # Residual sums: each Add reads two computed values, none of them constants.
    assert all(not g.is_constant(i) for n in g.nodes if n.op == "Add" for i in n.inputs)


@pytest.mark.slow
def test_resnet50_and_vgg11bn_shapes():
    r = build("resnet50")
    assert r.op_counts()["Conv"] == 53 and r.op_counts()["Add"] == 16
    assert r.info(r.outputs[0]).shape == (1, 1000)
    v = build("vgg11bn")
    widths = [v.constants[n.inputs[1]].shape[0] for n in v.nodes if n.op == "Conv"]
    assert widths == [64, 128, 256, 256, 512, 512, 512, 512]
    assert v.op_counts()["BatchNormalization"] == 8 and v.info("x").shape == (1, 3, 224, 224)


def test_vgg_convs_carry_bias_before_batch_norm():
    g = build("vgg")
    producers = g.producers()
    for n in g.nodes:
        if n.op == "BatchNormalization":
            conv = producers[n.inputs[0]]
            assert conv.op == "Conv" and len(conv.inputs) == 3 and g.is_constant(conv.inputs[2])
    assert g.nodes[-1].op == "Gemm"


def test_mobilenet_has_depthwise_convs_and_relu6():
    g = build("mobilenet")
    depthwise = [n for n in g.nodes if n.op == "Conv" and n.attrs["group"] > 1]
    assert depthwise
    for n in depthwise:
        w = g.constants[n.inputs[1]]
        assert n.attrs["group"] == w.shape[0] and w.shape[1] == 1
    for n in (n for n in g.nodes if n.op == "Clip"):
        assert (float(g.constants[n.inputs[1]]), float(g.constants[n.inputs[2]])) == (0.0, 6.0)


def test_mlp_layers():
    g = build("mlp")
    assert [n.op for n in g.nodes] == ["MatMul", "Add", "Relu"] * 2 + ["MatMul", "Add"]


@pytest.mark.parametrize("n", [1, 7, 250])
def test_chain_has_n_blocks(n):
    g = build(f"chain-{n}")
    assert [x.op for x in g.nodes] == ["Conv", "BatchNormalization", "Relu"] * n
    assert g.info(g.outputs[0]).shape == (1, 8, 16, 16)


def test_builds_are_deterministic_and_fresh():
    a, b = build("mobilenet"), load_graph("example:mobilenet")
    assert graph_differences(a, b) == []
    weight = a.nodes[0].inputs[1]  # each build has its own arrays, shared with no other
    assert not np.shares_memory(a.constants[weight], build("mobilenet").constants[weight])


@pytest.mark.parametrize("bad", ["resnet", "chain-0", "chain-x", ""])
def test_unknown_example_lists_known_ones(bad):
    with pytest.raises(SaturateError, match="known examples: vgg, vgg11bn, resnet18"):
        build(bad)


@pytest.mark.parametrize("name", SMALL + ["chain-300", pytest.param("resnet18", marks=pytest.mark.slow)])
def test_reference_interpreter_agrees_with_onnx_runtime(name):
    g = build(name)
    for seed in (0, 1):
        feeds = random_inputs(g, seed)
        sess = ort.InferenceSession(build_model(name).SerializeToString(), providers=["CPUExecutionProvider"])
        expected = sess.run(None, feeds)[0]
        got = run_graph(g, feeds)[g.outputs[0]]
        assert np.isfinite(expected).all() and np.abs(expected).max() > 1e-3
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_random_inputs_match_graph_inputs():
    g = build("mlp")
    feeds = random_inputs(g, seed=3)
    assert list(feeds) == ["x"] and feeds["x"].shape == (2, 64) and feeds["x"].dtype == np.float32
    assert not np.array_equal(feeds["x"], random_inputs(g, seed=4)["x"])
