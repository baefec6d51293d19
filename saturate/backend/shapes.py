"""C backend, shape stage: static shapes of every value and normalized window attributes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from saturate.core.errors import SaturateError
from saturate.core.ir import Graph, Node

ELEMENTWISE_UNARY = {"Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "Erf", "Neg", "Sqrt", "Reciprocal"}
ELEMENTWISE_BINARY = {"Add", "Sub", "Mul", "Div"}
ALIASES = {"Reshape", "Flatten", "Identity"}
KERNELS = {"Conv", "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool", "Gemm", "MatMul",
           "Transpose", "Concat", "Softmax"}
SUPPORTED = ELEMENTWISE_UNARY | ELEMENTWISE_BINARY | ALIASES | KERNELS


@dataclass(frozen=True)
class Window:
    """A 2-D sliding window (conv or pool): kernel, strides, begin/end pads, dilations, output size."""

    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    pe_h: int
    pe_w: int
    dh: int
    dw: int
    oh: int
    ow: int


def unsupported(node: Node, why: str) -> SaturateError:
    """The compile-time error for a node the backend cannot run."""
    return SaturateError(f"{node.where()}: the C backend {why}")


def window(node: Node, in_hw: tuple[int, int], kernel: tuple[int, int], ceil_mode: bool = False) -> Window:
    """Resolve auto_pad, pads, strides and dilations of a 2-D window and its output size."""
    rank = len(kernel)
    strides = list(node.attr("strides") or [1] * rank)
    dil = list(node.attr("dilations") or [1] * rank)
    pads = list(node.attr("pads") or [0] * (2 * rank))
    auto = node.attr("auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    out = []
    for d in range(rank):
        size, k, s, dl = in_hw[d], kernel[d], strides[d], dil[d]
        ext = (k - 1) * dl + 1
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-size // s)
            total = max((o - 1) * s + ext - size, 0)
            small = total // 2
            pads[d], pads[d + rank] = (small, total - small) if auto == "SAME_UPPER" else (total - small, small)
        elif auto == "VALID":
            pads[d], pads[d + rank] = 0, 0
            o = (size - ext) // s + 1
        else:
            span = size + pads[d] + pads[d + rank] - ext
            o = (math.ceil(span / s) if ceil_mode else span // s) + 1
            # A last window that starts inside the end padding is dropped (ONNX reference rule).
            if ceil_mode and (o - 1) * s >= size + pads[d]:
                o -= 1
        if o <= 0:
            raise unsupported(node, f"got a window larger than its input {in_hw}")
        out.append(o)
    return Window(kernel[0], kernel[1], strides[0], strides[1], pads[0], pads[1], pads[2], pads[3],
                  dil[0], dil[1], out[0], out[1])


def lifted_node(node: Node) -> Node:
    """A copy of a 1-D window node with its attributes written for 2-D."""
    attrs = dict(node.attrs)
    if attrs.get("strides"):
        attrs["strides"] = [1] + list(attrs["strides"])
    if attrs.get("dilations"):
        attrs["dilations"] = [1] + list(attrs["dilations"])
    if attrs.get("pads"):
        p = list(attrs["pads"])
        attrs["pads"] = [0, p[0], 0, p[1]]
    if attrs.get("kernel_shape"):
        attrs["kernel_shape"] = [1] + list(attrs["kernel_shape"])
    return Node(node.op, node.inputs, node.outputs, attrs, node.name, node.domain)


def conv_window(node: Node, x: tuple[int, ...], w: tuple[int, ...]) -> Window:
    """The window of a Conv (1-D lifted to 2-D)."""
    if len(x) == 3:
        return window(lifted_node(node), (1, x[2]), (1, w[2]))
    if len(x) != 4:
        raise unsupported(node, f"supports 1-D and 2-D convolutions only, input shape {x}")
    return window(node, (x[2], x[3]), (w[2], w[3]))


def pool_window(node: Node, x: tuple[int, ...]) -> Window:
    """The window of a MaxPool/AveragePool (1-D lifted to 2-D)."""
    kernel = tuple(node.attr("kernel_shape") or ())
    ceil_mode = bool(node.attr("ceil_mode", 0))
    if len(x) == 3 and len(kernel) == 1:
        return window(lifted_node(node), (1, x[2]), (1, kernel[0]), ceil_mode)
    if len(x) != 4 or len(kernel) != 2:
        raise unsupported(node, f"supports 1-D and 2-D pooling only, input shape {x}")
    return window(node, (x[2], x[3]), kernel, ceil_mode)


def const_ints(graph: Graph, node: Node, value: str) -> list[int]:
    """A compile-time integer list (Reshape's shape); a runtime value is unsupported."""
    if value not in graph.constants:
        raise unsupported(node, f"needs '{value}' to be a constant")
    return [int(v) for v in np.asarray(graph.constants[value]).reshape(-1)]


def infer_shapes(graph: Graph, input_shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Static shape of every value the graph computes; raises for ops the backend lacks."""
    shapes: dict[str, tuple[int, ...]] = {k: tuple(int(d) for d in v.shape) for k, v in graph.constants.items()}
    shapes.update(input_shapes)
    for node in graph.nodes:
        if node.op not in SUPPORTED or node.domain not in ("", "ai.onnx"):
            raise unsupported(node, f"has no kernel for op '{node.op}'")
        ins = [shapes[i] if i else None for i in node.inputs]
        shapes[node.outputs[0]] = _out_shape(graph, node, ins)
        for extra in node.outputs[1:]:
            if extra:
                raise unsupported(node, f"supports only the first output of '{node.op}'")
    return shapes


def _out_shape(graph: Graph, node: Node, ins: list) -> tuple[int, ...]:
    op, x = node.op, ins[0]
    if op in ELEMENTWISE_UNARY or op in ("Identity", "BatchNormalization", "Softmax"):
        return x
    if op in ELEMENTWISE_BINARY:
        try:
            return tuple(np.broadcast_shapes(ins[0], ins[1]))
        except ValueError:
            raise unsupported(node, f"cannot broadcast shapes {ins[0]} and {ins[1]}") from None
    if op == "Conv":
        w = ins[1]
        win = conv_window(node, x, w)
        if x[1] != w[1] * int(node.attr("group", 1)):
            raise unsupported(node, f"got input channels {x[1]} for weights {w}")
        return (x[0], w[0], win.ow) if len(x) == 3 else (x[0], w[0], win.oh, win.ow)
    if op in ("MaxPool", "AveragePool"):
        win = pool_window(node, x)
        return (x[0], x[1], win.ow) if len(x) == 3 else (x[0], x[1], win.oh, win.ow)
    if op == "GlobalAveragePool":
        return (x[0], x[1]) + (1,) * (len(x) - 2)
    if op == "Gemm":
        a, b = ins[0], ins[1]
        m = a[1] if node.attr("transA", 0) else a[0]
        n = b[0] if node.attr("transB", 0) else b[1]
        return (m, n)
    if op == "MatMul":
        a, b = ins[0], ins[1]
        a2 = (1,) + a if len(a) == 1 else a
        b2 = b + (1,) if len(b) == 1 else b
        if a2[-1] != b2[-2]:
            raise unsupported(node, f"cannot multiply shapes {a} and {b}")
        out = tuple(np.broadcast_shapes(a2[:-2], b2[:-2])) + (a2[-2], b2[-1])
        if len(a) == 1:
            out = out[:-2] + out[-1:]
        if len(b) == 1:
            out = out[:-1]
        return out
    if op == "Reshape":
        target = const_ints(graph, node, node.inputs[1])
        allow0 = node.attr("allowzero", 0)
        dims = [x[i] if (t == 0 and not allow0) else t for i, t in enumerate(target)]
        if -1 in dims:
            known = math.prod(d for d in dims if d != -1)
            dims[dims.index(-1)] = math.prod(x) // max(known, 1)
        if math.prod(dims) != math.prod(x):
            raise unsupported(node, f"cannot reshape {x} to {target}")
        return tuple(dims)
    if op == "Flatten":
        axis = node.attr("axis", 1) % (len(x) + 1) if x else 0
        return (math.prod(x[:axis]), math.prod(x[axis:]))
    if op == "Transpose":
        perm = node.attr("perm") or list(reversed(range(len(x))))
        return tuple(x[p] for p in perm)
    if op == "Concat":
        axis = node.attr("axis") % len(x)
        return x[:axis] + (sum(s[axis] for s in ins),) + x[axis + 1:]
    raise unsupported(node, f"has no kernel for op '{op}'")
