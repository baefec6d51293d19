"""Corpus: every real exported model rebuilds without torch, runs in ONNX Runtime, survives saturate.optimize,
and its optimized graph runs in the interpreter and compiled to C like ONNX Runtime on the original."""

import functools
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import saturate
from saturate.core.errors import SaturateError
from saturate.frontend import corpus, load_graph
from saturate.frontend.onnx_io import export_model, import_model
from saturate.lang.guard_builtins import GUARDS
from saturate.interp import run_graph
from saturate.partition import partition, to_model

# What fails today, by (entry, check): each is an xfail(strict=True), so a fix flips it to a
# failure that asks for the line to go. Checks: "runs" (rebuild, checker, ORT), "outputs"
# (optimize keeps the outputs), "folds" (no BatchNormalization left behind a Conv/Gemm/MatMul),
# "nodes" (no more nodes than onnxsim and ORT basic; QDQ models: ORT extended too), "interp" and
# "c" (the optimized graph in the interpreter and compiled to C gives ORT's outputs).
XFAIL: dict[tuple[str, str], str] = {}

# Models built through one export only: another export of the same model is one more C build,
# the dearest step of the suite, for a graph the interpreter test already runs. The `-noopt`
# exports optimize to the graphs of their `-dynamo` siblings (the same ops, attributes and
# input shapes, node for node), so their builds would compile the same C twice.
COMPILED_ONCE = {"bert-dynamo", "bert-ts-dyn", "llama-dynamo-dyn", "edgenext-dynamo", "nf_resnet26-ts",
                 "swinv2_cr-ts", "mobilenet_v2-dynamo-noopt", "resnet18-dynamo-noopt"}

# Entries whose rebuild, ORT runs and optimize take over 5 s together on the 2-core machine.
SLOW = {"vgg11_bn-ts", "convnext_tiny-ts", "convnext_tiny-dynamo", "swin_tiny-ts", "swin_tiny-dynamo",
        "densenet121-ts", "densenet121-dynamo", "deit_tiny-ts-dyn", "resnet50-dynamo", "swinv2_cr-ts",
        "nf_resnet26-ts"}

RTOL = 1e-4
# Nodes onnx-simplifier 0.8.1 leaves (`python bench/corpus_folding.py`; onnxsim is the `bench`
# extra, not a test dependency). ONNX Runtime's basic level is asked live.
ONNXSIM_NODES = {"convnext_tiny-dynamo": 294, "convnext_tiny-ts": 295, "deit_tiny-dynamo": 416,
                 "deit_tiny-ts": 384, "deit_tiny-ts-dyn": 418, "densenet121-dynamo": 368,
                 "densenet121-ts": 368, "efficientnet_b0-dynamo": 239, "efficientnet_b0-ts": 239,
                 "efficientnet_lite0-dynamo": 94, "efficientnet_lite0-ts": 96, "encoder-dynamo": 82,
                 "encoder-dynamo-dyn": 86, "encoder-ts": 88, "encoder-ts-dyn": 92,
                 "ghostnet_100-dynamo": 209, "ghostnet_100-ts": 241, "googlenet-dynamo": 139,
                 "googlenet-ts": 139, "mixnet_s-dynamo": 363, "mixnet_s-ts": 363, "mobilenet_v2-dynamo": 100,
                 "mobilenet_v2-dynamo-noopt": 329, "mobilenet_v2-ts": 102, "mobilenet_v3_small-dynamo": 122,
                 "mobilenet_v3_small-ts": 122, "regnet_x_400mf-dynamo": 163, "regnet_x_400mf-ts": 163,
                 "repvgg_a0-dynamo": 125, "repvgg_a0-ts": 125, "resnet18-dynamo": 49,
                 "resnet18-dynamo-dyn": 49, "resnet18-dynamo-noopt": 104, "resnet18-ts": 49,
                 "resnet18-ts-dyn": 49, "resnet26d-dynamo": 73, "resnet26d-ts": 73, "resnet50-dynamo": 122,
                 "resnet50-ts": 122, "shufflenet_v2_x1_0-dynamo": 173, "shufflenet_v2_x1_0-ts": 186,
                 "squeezenet1_1-dynamo": 65, "squeezenet1_1-ts": 65, "swin_tiny-dynamo": 561,
                 "swin_tiny-ts": 558, "vgg11_bn-ts": 28,
                 "bert-dynamo": 78, "bert-qdq": 267, "bert-ts": 73, "bert-ts-dyn": 149, "edgenext-dynamo": 313,
                 "edgenext-ts": 316, "gpt2-dynamo": 85, "llama-dynamo": 136, "llama-dynamo-dyn": 206,
                 "mobilenet_v2-qdq": 303, "nf_resnet26-dynamo": 72, "nf_resnet26-ts": 110,
                 "resnet18-qdq-pc": 140, "swinv2_cr-dynamo": 431, "swinv2_cr-ts": 443, "t5_encoder-ts": 80}
_LINEAR = {"Conv", "Gemm", "MatMul"}


class Entry:
    """One corpus model: rebuilt, its reference outputs, and (on demand) its optimized form."""

    def __init__(self, name: str):
        self.name = name
        self.model = corpus.load_model(name)
        self.feeds = corpus.inputs(name)
        self.ref = _run(self.model, self.feeds)

    @functools.cached_property
    def optimized(self) -> onnx.ModelProto:
        # A generous time limit: the checks are about the graph, and on a loaded 2-core machine
        # (the suite's own compiles beside it) the default budgets can cut extraction short,
        # which keeps the input graph.
        graph, _report = saturate.optimize(import_model(self.model), level=3, target="cpu", timeout=600)
        return export_model(graph)

    @functools.cached_property
    def graph(self):
        """The optimized model as the project's runtimes take it, read back from what optimize wrote."""
        return import_model(self.optimized)

    @functools.cached_property
    def partitioned(self) -> onnx.ModelProto:
        """The optimized model partitioned for the fused target, whose composites (conv+bias+relu)
        fire on an optimized graph: its composite rules alone, as `partition --no-optimize` runs them."""
        return to_model(partition(import_model(self.optimized), "fused"))


# Module scope: pytest runs every check of one model before rebuilding the next, so a model's
# weights are made, run and optimized once, and only one model is held at a time.
@pytest.fixture(scope="module", params=[pytest.param(n, id=n, marks=[pytest.mark.slow] if n in SLOW else [])
                                        for n in corpus.names()])
def entry(request) -> Entry:
    return Entry(request.param)


def _expect(request, entry: Entry, check: str) -> None:
    reason = XFAIL.get((entry.name, check))
    if reason:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    # The reference is the graph as written: ORT's own fusions would blur what saturate changed.
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


# ---- the corpus as stored ---------------------------------------------------------------------
def _quantized(name: str) -> bool:
    return "quantize_static" in corpus.info(name)["exporter"]


def test_corpus_is_large_and_both_exporters_appear():
    names = corpus.names()
    assert len(names) >= 24
    exporters = {corpus.info(n)["exporter"].split(" (")[0] for n in names}
    assert exporters == {"torch.onnx TorchScript", "torch.onnx dynamo"}
    assert any(n.endswith("-dynamo-noopt") for n in names)
    assert any("dyn" in n.split("-")[-1] for n in names)
    sources = {corpus.info(n)["source"] for n in names}
    assert sources == {"torchvision", "timm", "transformers", "torch"}
    models = {corpus.info(n)["model"] for n in names}
    assert {"bert", "gpt2", "llama", "t5_encoder", "swinv2_cr", "nf_resnet26", "edgenext"} <= models
    quantized = [n for n in names if _quantized(n)]
    assert {corpus.info(n)["source"] for n in quantized} >= {"torchvision", "transformers"}
    assert any("per channel" in corpus.info(n)["exporter"] for n in quantized)
    assert any("per tensor" in corpus.info(n)["exporter"] for n in quantized)


def test_skeletons_are_small():
    sizes = {p.name: p.stat().st_size for p in corpus.CORPUS_DIR.glob("*.onnx")}
    assert max(sizes.values()) < 2 * 2**20, max(sizes, key=sizes.get)
    assert sum(sizes.values()) < 15 * 2**20


def test_skeleton_keeps_small_tensors_and_drops_large_float_ones():
    for name in ("resnet18-ts", "mobilenet_v2-dynamo"):
        for init in corpus.skeleton(name).graph.initializer:
            n = math.prod(init.dims)
            float_type = init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
            stored = len(init.raw_data) or len(init.float_data) or len(init.int64_data) or len(init.int32_data)
            if float_type and n > 16:
                assert not stored and init.doc_string.startswith("corpus:")
            elif n:
                assert stored


def test_rebuild_is_deterministic_and_batch_norms_are_not_trivial():
    a, b = corpus.load_model("resnet18-ts"), corpus.load_model("resnet18-ts")
    assert a.SerializeToString() == b.SerializeToString()
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in a.graph.initializer}
    bns = [n for n in a.graph.node if n.op_type == "BatchNormalization"]
    assert len(bns) == 20
    for node in bns:
        scale, bias, mean, var = (inits[i] for i in node.input[1:])
        assert (var > 0).all() and not np.allclose(mean, 0) and not np.allclose(scale, 1)
    conv = next(n for n in a.graph.node if n.op_type == "Conv" and n.input[1] in inits)
    w = inits[conv.input[1]]
    fan_in = math.prod(w.shape[1:])
    assert 0.9 < w.std() * math.sqrt(fan_in) < 1.1  # fan-in scaling
    feeds = corpus.inputs("resnet18-ts")
    assert list(feeds) == ["x"] and feeds["x"].shape == (1, 3, 96, 96)
    assert np.array_equal(feeds["x"], corpus.inputs("resnet18-ts")["x"])
    assert not np.array_equal(feeds["x"], corpus.inputs("resnet18-ts", seed=1)["x"])


def test_load_graph_prefix_and_unknown_name():
    g = load_graph("corpus:squeezenet1_1-ts")
    assert g.op_counts()["Conv"] == 26
    with pytest.raises(SaturateError, match="no such corpus model"):
        load_graph("corpus:no-such-model")


def test_dynamic_batch_entries_run_at_batch_two():
    for name in corpus.names():
        if name.endswith("-dyn"):
            model = corpus.skeleton(name)
            dim = model.graph.input[0].type.tensor_type.shape.dim[0]
            assert dim.dim_param and not dim.HasField("dim_value"), name
            assert next(iter(corpus.inputs(name).values())).shape[0] == 2


def _dequantized_initializers(model: onnx.ModelProto):
    """(payload, scale, zero point, node) for each DequantizeLinear reading an initializer; a
    per-channel scale and zero point come shaped to broadcast along the node's axis."""
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in inits:
            q = inits[node.input[0]]
            scale = inits[node.input[1]]
            zero = inits[node.input[2]] if len(node.input) > 2 and node.input[2] else np.zeros((), q.dtype)
            if scale.ndim == 1 and q.ndim > 1:
                shape = [1] * q.ndim
                shape[next((a.i for a in node.attribute if a.name == "axis"), 1) % q.ndim] = scale.size
                scale, zero = scale.reshape(shape), zero.reshape(shape)
            yield q, scale, zero, node


def test_quantized_skeletons_store_scales_and_zero_points_and_drop_integer_weights():
    for name in ("resnet18-qdq-pc", "mobilenet_v2-qdq"):
        model = corpus.skeleton(name)
        role = {}
        for node in model.graph.node:
            if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
                role.update({v: "param" for v in node.input[1:]})
            if node.op_type == "DequantizeLinear":
                role.setdefault(node.input[0], "payload")
        dropped = {t.name for t in model.graph.initializer if t.doc_string.startswith("corpus:")}
        big = {t.name for t in model.graph.initializer if math.prod(t.dims) > 16}
        payloads = {v for v, r in role.items() if r == "payload"} & big
        assert payloads and payloads <= dropped, name
        params = {v for v, r in role.items() if r == "param"}
        assert not params & dropped, name
    # Per channel: a scale per output channel, stored whatever its length.
    scales = [s for _, s, _, _ in _dequantized_initializers(corpus.load_model("resnet18-qdq-pc"))]
    assert max(s.size for s in scales) >= 512


@pytest.mark.parametrize("name", ["mobilenet_v2-qdq", "resnet18-qdq-pc", "bert-qdq"])
def test_refilled_quantized_model_is_valid(name, tmp_path):
    model = corpus.load_model(name)
    weights = biases = 0
    for q, scale, zero, node in _dequantized_initializers(model):
        assert (scale > 0).all() and np.isfinite(scale).all(), node.name
        info = np.iinfo(q.dtype)
        assert zero.dtype == q.dtype, node.name
        if q.size <= 16:
            continue
        assert info.min <= q.min() and q.max() <= info.max
        if info.bits == 8:  # a weight: spread over its range around its zero point
            weights += 1
            assert q.std() > (int(info.max) - int(info.min)) / 16, node.name
            centred = q.astype(np.int64) - zero
            assert abs(float(np.mean(centred))) < 4 * q.std() / math.sqrt(q.size), node.name
        else:  # an int32 bias: a float bias of magnitude ~0.05 once dequantized
            biases += 1
            assert 0.01 < float(np.std((q.astype(np.int64) - zero) * scale)) < 0.2, node.name
    assert weights >= 10 and (biases >= 5 or name == "bert-qdq")
    # What makes it a quantized model to ONNX Runtime: its QDQ groups fuse into QLinear forms.
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(tmp_path / "extended.onnx")
    ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    fused = {n.op_type for n in onnx.load(opts.optimized_model_filepath).graph.node}
    assert fused & {"QLinearConv", "QLinearMatMul", "MatMulIntegerToFloat", "DynamicQuantizeMatMul"}, fused


def test_weight_standardization_keeps_its_per_channel_parameters():
    # NF-ResNet normalizes each conv weight in the graph with a BatchNormalization whose scale is
    # gain / sqrt(fan-in): stored as exported, since a refill at batch-norm ranges (0.5 to 1.5)
    # grows activations by sqrt(fan-in) a layer (outputs past 1e22 at 26 layers).
    for name in ("nf_resnet26-ts", "nf_resnet26-dynamo"):
        model = corpus.skeleton(name)
        inits = {t.name: t for t in model.graph.initializer}
        bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
        assert len(bns) >= 28
        for node in bns:
            scale = inits.get(node.input[1])
            if scale is not None:
                assert not scale.doc_string, (name, node.name)
                assert float(np.max(onnx.numpy_helper.to_array(scale))) < 0.5


# ---- every entry ------------------------------------------------------------------------------
def test_rebuilt_model_runs(entry, request):
    _expect(request, entry, "runs")
    onnx.checker.check_model(entry.model)
    for y in entry.ref:
        assert np.isfinite(y).all()
        assert y.size > 1 and np.ptp(y) > 0
        # Refilled weights keep activations in range through every layer (corpus.py's fills):
        # RepVGG's three-branch sums reach 3e3, a fill that compounds layer on layer far more.
        assert np.max(np.abs(y)) < 1e5, f"outputs reach {np.max(np.abs(y)):.3g}"


def test_optimize_keeps_outputs(entry, request):
    _expect(request, entry, "outputs")
    got = _run(entry.optimized, entry.feeds)
    assert len(got) == len(entry.ref)
    steps = corpus.output_steps(entry.name)
    for out, r, y in zip(entry.model.graph.output, entry.ref, got):
        assert y.shape == r.shape
        diff = float(np.max(np.abs(y.astype(np.float64) - r)))
        if out.name in steps:  # a quantized output: within one quantization step
            assert diff <= steps[out.name] * (1 + RTOL), f"max|diff| = {diff:.3g}, step {steps[out.name]:.3g}"
        else:
            err = diff / np.max(np.abs(r))
            assert err <= RTOL, f"max|diff| / max|ref| = {err:.2e}"


def test_optimize_and_partition_write_models_the_full_onnx_check_passes(entry):
    onnx.checker.check_model(entry.optimized, full_check=True)
    onnx.checker.check_model(entry.partitioned, full_check=True)


def test_optimize_folds_batch_norms_into_linear_ops(entry, request):
    _expect(request, entry, "folds")
    g = entry.optimized.graph
    producer = {out: n.op_type for n in g.node for out in n.output}
    left = [n.name or n.output[0] for n in g.node
            if n.op_type == "BatchNormalization" and producer.get(n.input[0]) in _LINEAR]
    assert not left, f"{len(left)} batch norms left after a conv/gemm/matmul, e.g. {left[:3]}"


def test_optimize_leaves_no_pool_of_a_one_element_window(entry):
    # vgg11_bn's AdaptiveAvgPool2d((7, 7)) on a 7x7 map exports as one (onnxsim and ORT keep it).
    left = [n.name or n.output[0] for n in entry.optimized.graph.node
            if n.op_type in ("AveragePool", "MaxPool") and _unit_window(n)]
    assert not left, left


def _unit_window(node: onnx.NodeProto) -> bool:
    attrs = {a.name: list(a.ints) for a in node.attribute if a.type == onnx.AttributeProto.INTS}
    return GUARDS["unit_window"].impl(attrs["kernel_shape"], attrs.get("strides"), attrs.get("pads"))


def _ort_nodes(model: onnx.ModelProto, level: str, tmp_path) -> int:
    """Nodes in the model ONNX Runtime writes at level "basic" or "extended"."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                     "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}[level]
    opts.optimized_model_filepath = str(tmp_path / f"{level}.onnx")
    ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return len(onnx.load(opts.optimized_model_filepath, load_external_data=False).graph.node)


def test_optimize_leaves_no_more_nodes_than_onnxsim_or_onnx_runtime_basic(entry, tmp_path, request):
    _expect(request, entry, "nodes")
    basic = _ort_nodes(entry.model, "basic", tmp_path)
    ours = len(entry.optimized.graph.node)
    assert ours <= ONNXSIM_NODES[entry.name], f"{ours} nodes, onnxsim {ONNXSIM_NODES[entry.name]}"
    assert ours <= basic, f"{ours} nodes, ONNX Runtime basic {basic}"
    if _quantized(entry.name):
        # QDQ models: as few nodes as ORT's extended level, which fuses each QDQ group into a
        # QLinearConv / QLinearMatMul.
        extended = _ort_nodes(entry.model, "extended", tmp_path)
        assert ours <= extended, f"{ours} nodes, ONNX Runtime extended {extended}"


# ---- the optimized graph on the project's runtimes ------------------------------------------------
def _assert_like_reference(entry: Entry, got: dict[str, np.ndarray]) -> None:
    steps = corpus.output_steps(entry.name)
    for out, r in zip(entry.model.graph.output, entry.ref):
        y = got[out.name]
        assert y.shape == r.shape, out.name
        diff = float(np.max(np.abs(y.astype(np.float64) - r)))
        if out.name in steps:  # a quantized output: within one quantization step
            assert diff <= steps[out.name] * (1 + RTOL), f"{out.name}: max|diff| {diff:.3g}, step {steps[out.name]:.3g}"
        else:
            err = diff / max(float(np.max(np.abs(r))), 1e-6)
            assert err <= RTOL, f"{out.name}: relative error {err:.2e}"


def test_interpreter_runs_the_optimized_model_like_ort(entry, request):
    _expect(request, entry, "interp")
    _assert_like_reference(entry, run_graph(entry.graph, entry.feeds))


@pytest.mark.compiler
def test_compiled_c_runs_the_optimized_model_like_ort(entry, request, tmp_path):
    if entry.name in COMPILED_ONCE:
        pytest.skip("compiled through its other export")
    _expect(request, entry, "c")
    shapes = {k: v.shape for k, v in entry.feeds.items()}
    compiled = saturate.compile_graph(entry.graph, input_shapes=shapes, out_dir=tmp_path / "build")
    _assert_like_reference(entry, compiled(**entry.feeds))
