"""Run under AddressSanitizer (see test_backend_asan.py): compile graphs with -fsanitize=address and run them."""

from __future__ import annotations

import sys

import numpy as np

from backend_util import feed_for, make, rel_error
from saturate.frontend import load_graph
from saturate.backend import compile_graph
from saturate.interp.interpreter import run_graph
from saturate.core.ir import Node


def cases():
    rng = np.random.default_rng(0)

    def w(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    yield load_graph("example:mobilenet")
    yield load_graph("example:resnet18")
    yield make([Node("Conv", ["x", "w"], ["c"], {"group": 3, "strides": [2, 3], "pads": [2, 0, 1, 2],
                                                 "dilations": [2, 1]}),
                Node("MaxPool", ["c"], ["p"], {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
                Node("AveragePool", ["p"], ["y"], {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1],
                                                   "count_include_pad": 1})],
               {"x": (2, 3, 11, 13)}, {"w": w(6, 1, 3, 3)})
    yield make([Node("MatMul", ["a", "b"], ["m"]), Node("Transpose", ["m"], ["t"], {"perm": [3, 1, 0, 2]}),
                Node("Softmax", ["t"], ["s"], {"axis": 2}), Node("Concat", ["s", "s"], ["y"], {"axis": 3})],
               {"a": (2, 3, 4, 5)}, {"b": w(3, 5, 7)})
    # a batched product on pgemm.h's tile (A read in place, B packed per item): rows, columns and the reduction
    # off the tile's and block's sizes, so the last rows' pointers and the last panel's pad columns are reached
    yield make([Node("MatMul", ["a", "b"], ["y"])], {"a": (1, 2, 37, 300), "b": (1, 2, 300, 45)})
    # the same tile reading its operands through Transposes: Q's rows at the heads' pitch, K^T packed from K's rows
    yield make([Node("Transpose", ["q"], ["qh"], {"perm": [0, 2, 1, 3]}),
                Node("Transpose", ["k"], ["kt"], {"perm": [0, 2, 3, 1]}), Node("MatMul", ["qh", "kt"], ["y"])],
               {"q": (1, 70, 2, 64), "k": (1, 70, 2, 64)})
    ints = lambda *v: np.array(v, np.int64)  # noqa: E731
    # Tensor kernels at their edges: reflect pads, reversed slices, upsampling, split, norm, reductions.
    tensor = make([Node("Pad", ["x", "p"], ["pd"], {"mode": "reflect"}),
                Node("Slice", ["pd", "s", "e", "a", "st"], ["sl"]),
                Node("Resize", ["sl", "", "sc"], ["rs"], {"mode": "linear"}),
                Node("Split", ["rs", "sp"], ["h0", "h1"], {"axis": 3}),
                Node("LayerNormalization", ["h1", "g"], ["ln"], {"axis": -1}),
                Node("ReduceMean", ["ln"], ["rm"], {"axes": [1, 3], "keepdims": 1}),
                Node("Expand", ["rm", "es"], ["y"])],
               {"x": (2, 3, 5, 6)}, {"p": ints(0, 0, 2, 1, 0, 0, 1, 2), "s": ints(-1, 0), "e": ints(-2**63, 9),
                                     "a": ints(2, 3), "st": ints(-2, 2), "sc": np.array([1, 1, 2, 1.5], np.float32),
                                     "sp": ints(3, 4), "g": w(4), "es": ints(2, 1, 8, 3)},
               outputs=["y", "h0"], opset=13)
    tensor.name = "tensor-kernels"
    yield tensor
    # The vector kernels at their edges (vec.h): a depthwise row with a partial last vector, a short-reduction
    # conv ending in a partial panel, a small-plane depthwise across channels, a few-pixel conv (on streamed
    # weights without AVX-512, pgemm.h: 10 pixels, 48 channels) and a one-row Gemm as dot products; twice, so
    # both thread counts run it.
    for _ in range(2):
        yield make([Node("Conv", ["x", "d1"], ["a"], {"group": 16, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
                    Node("Conv", ["a", "p1"], ["b"]),
                    Node("Conv", ["b", "d2"], ["c"], {"group": 40, "pads": [2, 2, 2, 2], "strides": [2, 2]}),
                    Node("Conv", ["c", "k3"], ["d"], {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
                    Node("Flatten", ["d"], ["f"]),
                    Node("Gemm", ["f", "g"], ["y"], {"transB": 1})],
                   {"x": (1, 16, 13, 37)},
                   {"d1": w(16, 1, 3, 3), "p1": w(40, 16, 1, 1), "d2": w(40, 1, 5, 5), "k3": w(48, 40, 3, 3) * 0.1,
                    "g": w(35, 480) * 0.1})


def main() -> int:
    for k, graph in enumerate(cases()):
        feed = feed_for(graph)
        model = compile_graph(graph, sanitize=True, threads=1 + k % 2)
        if model.fallback_ops:
            print(f"case {k}: ran {model.fallback_ops} in the interpreter, not in sanitized C")
            return 1
        got = model(feed)
        if graph.name == "tensor-kernels":
            # Memory safety only: its reference runs on onnx.reference, whose internal C++ exceptions
            # ASan's preloaded interceptor cannot unwind; test_backend_ops checks these values.
            if not all(np.isfinite(v).all() for v in got.values()):
                print(f"case {k}: non-finite output")
                return 1
            continue
        ref = run_graph(graph, feed)
        for name in graph.outputs:
            err = rel_error(got[name], np.asarray(ref[name], np.float64))
            if err > 1e-4:
                print(f"case {k}: output {name} off by {err}")
                return 1
    print("asan cases ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
