"""Helpers for the C backend tests: small graphs, and a three-way check (C, reference, ORT)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from saturate.core.ir import Graph, Node, ValueInfo

TOL = 1e-4


def make(nodes: list[Node], inputs: dict, consts: dict | None = None, outputs: list[str] | None = None,
         opset: int = 17) -> Graph:
    """A graph from nodes, {input: shape} and {constant: array}; outputs default to the last node's."""
    g = Graph(inputs=list(inputs), outputs=outputs or [nodes[-1].outputs[0]], opset=opset)
    for name, shape in inputs.items():
        g.values[name] = ValueInfo("float32", tuple(shape))
    g.constants = {k: np.asarray(v) for k, v in (consts or {}).items()}
    for k, n in enumerate(nodes):
        n.name = n.name or f"n{k}"
    g.nodes = nodes
    return g


def side_by_side(graphs: list[Graph]) -> Graph:
    """The graphs as one, graph k's values renamed cK_NAME (an output cK_y names the case that failed):
    one build checks many small cases, where a build a case paid the compiler's start-up and the kernel
    headers every time. The backend plans each node on its own, so each case still reaches its kernel."""
    nodes, inputs, consts, outputs = [], {}, {}, []
    for k, g in enumerate(graphs):
        def renamed(v: str) -> str:
            return f"c{k}_{v}" if v else v

        nodes += [Node(n.op, [renamed(v) for v in n.inputs], [renamed(v) for v in n.outputs], dict(n.attrs))
                  for n in g.nodes]
        inputs.update({renamed(i): g.info(i).shape for i in g.inputs})
        consts.update({renamed(c): v for c, v in g.constants.items()})
        outputs += [renamed(o) for o in g.outputs]
    return make(nodes, inputs, consts, outputs, opset=max(g.opset for g in graphs))


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| / max |ref| (absolute when ref is all zeros)."""
    scale = max(float(np.abs(ref).max()), 1e-6) if ref.size else 1.0
    return float(np.abs(got.astype(np.float64) - ref).max()) / scale if ref.size else 0.0


def feed_for(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i: rng.standard_normal(graph.info(i).shape).astype(np.float32) for i in graph.inputs}


def check_three_way(graph: Graph, seed: int = 0, ort: bool = True, threads: int = 1, config=None) -> dict:
    """Compile the graph (with BuildConfig `config`, else the settings in force) and compare with the reference
    interpreter and ONNX Runtime."""
    from saturate.backend import compile_graph
    from saturate.interp.interpreter import run_graph

    feed = feed_for(graph, seed)
    model = compile_graph(graph, threads=threads, config=config)
    got = model(feed)
    ref = run_graph(graph, feed)
    for k in graph.outputs:
        assert got[k].shape == np.asarray(ref[k]).shape, k
        assert rel_error(got[k], np.asarray(ref[k], np.float64)) <= TOL, (k, rel_error(got[k], ref[k]))
    if ort:
        from saturate.backend.bench import ort_session

        sess = ort_session(graph, 1)
        names = [o.name for o in sess.get_outputs()]
        for k, v in zip(names, sess.run(None, feed)):
            assert got[k].shape == v.shape, (k, got[k].shape, v.shape)
            assert rel_error(got[k], np.asarray(v, np.float64)) <= TOL, (k, rel_error(got[k], v))
    return got


def corpus_reference(name: str):
    """A corpus model's inputs, ONNX Runtime's outputs on the original (no ORT rewrites: the
    graph as written), and the graph `saturate.optimize` makes of it."""
    import onnxruntime as ort

    import saturate
    from saturate.frontend import corpus
    from saturate.frontend.onnx_io import import_model

    model = corpus.load_model(name)
    feeds = corpus.inputs(name)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    optimized, _ = saturate.optimize(import_model(model))
    return feeds, want, optimized


def own_cache(tmp_path: Path) -> Path:
    """A cache folder of the test's own, holding the run's shared binding object, kernel library and precompiled
    headers (every build uses them; compiling them takes seconds), so what the test leaves in the cache is its own."""
    import shutil

    from saturate.backend.build import BuildConfig, binding_object, kernel_library, model_prelude

    obj, lib, prelude = binding_object(), kernel_library(), model_prelude(BuildConfig.from_env())
    cache = tmp_path / "cache"
    cache.mkdir()
    for path in (obj, obj.with_suffix(".sha256"), lib, lib.with_suffix(".sha256")):
        if path.exists():
            shutil.copyfile(path, cache / path.name)
    if prelude is not None:
        shutil.copytree(prelude, cache / prelude.name)
    return cache
