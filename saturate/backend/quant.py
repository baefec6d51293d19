"""C backend, quantized ops: what QuantizeLinear, DequantizeLinear, QLinearConv and QLinearMatMul need to run in
C, and the packed weights and calls of the two QLinear kernels (qgemm.h).

C segments hold quantized values as float32 numbers of exactly their integer values (shapes.INT_CODED):
QuantizeLinear and DequantizeLinear are then pointwise (they fuse into the kernel before them, as Q -> DQ
pairs of QDQ models do), and segment boundaries convert to and from the integer dtype (runtime.py)."""

from __future__ import annotations

import math

import numpy as np

from saturate.ops.ctext import c_float
from saturate.backend.plan import C
from saturate.backend.shapes import INT_CODED, INT_CODED_TYPES, conv_window, unsupported
from saturate.core.errors import SaturateError
from saturate.core.ir import Graph, Node
from saturate.core.limits import check_bytes

# Pixels a QLinear work item gathers at once (SAT_QTILE in qgemm.h, the one source).
QTILE = C["SAT_QTILE"]


def _input(node: Node, k: int) -> str:
    return node.inputs[k] if len(node.inputs) > k else ""


def _const(graph: Graph, node: Node, k: int, what: str):
    """Input k as a constant array, None when absent; a runtime value is unsupported."""
    v = _input(node, k)
    if not v:
        return None
    if v not in graph.constants:
        raise unsupported(node, f"needs the {what} '{v}' to be a constant")
    return np.asarray(graph.constants[v])


def _scale(graph: Graph, node: Node, k: int) -> np.ndarray:
    s = _const(graph, node, k, "scale")
    if s is None or s.dtype != np.float32:
        raise unsupported(node, "runs float32 scales only")
    if s.size == 0 or not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise unsupported(node, "needs positive, finite scales")
    return s.reshape(-1)


def quant_dtype(graph: Graph, node: Node) -> str:
    """Integer dtype of a QuantizeLinear's output (its zero point's, else output_dtype, else uint8), or of
    a QLinear op's (y_zero_point's); unsupported outside INT_CODED."""
    zp = _const(graph, node, 2 if node.op == "QuantizeLinear" else 7, "zero point")
    if zp is not None:
        name = zp.dtype.name
    else:
        name = INT_CODED_TYPES.get(int(node.attr("output_dtype", 0) or 2), f"type {node.attr('output_dtype')}")
    if name not in INT_CODED:
        raise unsupported(node, f"quantizes to 8- and 16-bit integers only, not {name}")
    return name


def axis_params(graph: Graph, node: Node, rank: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(scale, zero point as float32, axis) of a QuantizeLinear/DequantizeLinear: one value each (per
    tensor) or one per index of `axis`; the zero point 0 when absent."""
    if int(node.attr("block_size", 0) or 0):
        raise unsupported(node, "has no kernel for blocked quantization")
    scale = _scale(graph, node, 1)
    zp = _const(graph, node, 2, "zero point")
    zero = np.zeros(scale.shape, np.float32) if zp is None else zp.reshape(-1).astype(np.float32)
    if zero.shape != scale.shape:
        raise unsupported(node, f"got {zero.size} zero points for {scale.size} scales")
    axis = int(node.attr("axis", 1))
    if scale.size > 1 and not -rank <= axis < rank:
        raise unsupported(node, f"got axis {axis} for a rank {rank} input")
    return scale, zero, axis % rank if rank else 0


def axis_operand(graph: Graph, node: Node, tag: str, xshape: tuple[int, ...]):
    """A Q/DQ's scale or zero point as a pointwise operand (tag, array, shape, node): per tensor a
    scalar, per axis a tensor of the input's rank with its values along the axis."""
    scale, zero, axis = axis_params(graph, node, len(xshape))
    arr = scale if tag == "q_scale" else zero
    if arr.size == 1:
        return (tag, arr.reshape(()), (), node)
    if xshape[axis] != arr.size:
        raise unsupported(node, f"got {arr.size} scales for axis {axis} of {xshape}")
    shape = tuple(arr.size if d == axis else 1 for d in range(len(xshape)))
    return (tag, arr.reshape(shape), shape, node)


def q_expr(node: Node, operand, graph: Graph) -> str:
    """Pointwise C of QuantizeLinear (x / scale rounded half to even, plus the zero point, saturated: ONNX
    Runtime's order) and DequantizeLinear ((x - zero point) * scale)."""
    if node.op == "DequantizeLinear":
        return f"(v - {operand(('q_zero', node))}) * {operand(('q_scale', node))}"
    lo, hi = INT_CODED[quant_dtype(graph, node)]
    return (f"sat_clampf(rintf(v / {operand(('q_scale', node))}) + {operand(('q_zero', node))}, "
            f"{c_float(lo)}, {c_float(hi)})")


def q_vec_expr(node: Node, operand, graph: Graph) -> str | None:
    """q_expr on 8 AVX lanes (None when an operand has no vector load). Rounding adds and subtracts
    1.5 * 2**23, which rounds half to even exactly for |t| < 2**22: t is saturated first (ORT's order
    too), so |t| <= 2**17."""
    s, z = operand(("q_scale", node)), operand(("q_zero", node))
    if s is None or z is None:
        return None
    if node.op == "DequantizeLinear":
        return f"_mm256_mul_ps(_mm256_sub_ps(v, {z}), {s})"
    lo, hi = INT_CODED[quant_dtype(graph, node)]
    magic = "_mm256_set1_ps(12582912.0f)"
    t = (f"_mm256_min_ps(_mm256_max_ps(_mm256_div_ps(v, {s}), _mm256_sub_ps(_mm256_set1_ps({c_float(lo)}), {z})), "
         f"_mm256_sub_ps(_mm256_set1_ps({c_float(hi)}), {z}))")
    return f"_mm256_add_ps(_mm256_sub_ps(_mm256_add_ps({t}, {magic}), {magic}), {z})"


def check_node(graph: Graph, node: Node, dtypes: dict, shapes: dict) -> str | None:
    """Why a quantized op cannot run in C (None when it can): its parameters must be constants of the kinds
    the kernels read, its data of the dtypes they hold."""
    x = dtypes.get(node.inputs[0])
    try:
        if node.op in ("QuantizeLinear", "DequantizeLinear"):
            for tag in ("q_scale", "q_zero"):
                axis_operand(graph, node, tag, shapes[node.inputs[0]])
        if node.op == "QuantizeLinear":
            quant_dtype(graph, node)
            return None if x == "float32" else f"quantizes float32 only ('{node.inputs[0]}' is {x})"
        if node.op == "DequantizeLinear":
            if x not in INT_CODED:
                return f"dequantizes 8- and 16-bit integers only ('{node.inputs[0]}' is {x})"
            zp = _const(graph, node, 2, "zero point")
            return None if zp is None or zp.dtype.name == x else "needs a zero point of its input's dtype"
        params = qlinear_params(graph, node)
    except SaturateError as err:
        return str(err).split("the C backend ", 1)[-1]
    if x != params["xdtype"]:
        return f"needs '{node.inputs[0]}' ({x}) of its zero point's dtype, int8 or uint8"
    return None


def out_dtype(graph: Graph, node: Node) -> str:
    """The dtype a quantized op's output has (held in C as INT_CODED floats when an integer)."""
    return "float32" if node.op == "DequantizeLinear" else quant_dtype(graph, node)


def qlinear_params(graph: Graph, node: Node) -> dict:
    """Zero points, scales and weights of a QLinearConv/QLinearMatMul, checked: 8-bit data, per-tensor x and
    y, per-tensor or per-output-channel w, constant weights (a 2-D B for QLinearMatMul)."""
    zx, zw, zy = (_const(graph, node, k, "zero point") for k in (2, 5, 7))
    sx, sw, sy = (_scale(graph, node, k) for k in (1, 4, 6))
    w = _const(graph, node, 3, "weight")
    if w is None:
        raise unsupported(node, "needs constant weights")
    if w.dtype.name not in ("int8", "uint8"):
        raise unsupported(node, f"runs int8 and uint8 weights only, not {w.dtype}")
    for z, what in ((zx, "x"), (zy, "y")):
        if z is not None and (z.size != 1 or z.dtype.name not in ("int8", "uint8")):
            raise unsupported(node, f"needs one int8 or uint8 zero point for {what}")
    if sx.size != 1 or sy.size != 1:
        raise unsupported(node, "runs per-tensor input and output scales only")
    if zw is not None and zw.dtype != w.dtype:
        raise unsupported(node, "needs a weight zero point of the weights' dtype")
    if node.op == "QLinearMatMul":
        if w.ndim != 2:
            raise unsupported(node, "runs a 2-D constant B only")
        m, wk = w.shape[1], w.T.reshape(w.shape[1], -1)
    else:
        # taps in (ky, kx, channel) order, as qgemm.h gathers them from its channels-last bytes
        m, wk = w.shape[0], np.moveaxis(w, 1, -1).reshape(w.shape[0], -1)
        group = int(node.attr("group", 1))
        if w.ndim < 3 or group < 1 or m % group:
            raise unsupported(node, f"got weights {w.shape} for {group} groups")
    zwv = np.zeros(1, np.int64) if zw is None else zw.reshape(-1).astype(np.int64)
    if sw.size not in (1, m) or zwv.size not in (1, m):
        raise unsupported(node, f"got {sw.size} weight scales for {m} output channels")
    bias = _const(graph, node, 8, "bias") if node.op == "QLinearConv" else None
    if bias is not None and (bias.dtype != np.int32 or bias.size != m):
        raise unsupported(node, f"needs an int32 bias of {m} values")
    if wk.shape[1] == 0 or wk.shape[1] * 255 * 128 >= 2**31:
        raise unsupported(node, f"runs reductions of 1 to {(2**31 - 1) // (255 * 128)} taps, not {wk.shape[1]}")
    # the kernels' epilogues add the sums in 32-bit lanes: every sum, bias included, must fit them
    if bias is not None and wk.shape[1] * 255 * 255 + int(np.abs(bias.astype(np.int64)).max()) >= 2**31:
        raise unsupported(node, "runs sums that fit 32 bits only (its bias is too large for its taps)")
    return {"zx": 0 if zx is None else int(zx.reshape(-1)[0]), "xdtype": "uint8" if zx is None else zx.dtype.name,
            "zy": 0 if zy is None else int(zy.reshape(-1)[0]), "ydtype": "uint8" if zy is None else zy.dtype.name,
            "zw": np.broadcast_to(zwv, (m,)), "sx": sx[0], "sw": np.broadcast_to(sw, (m,)), "sy": sy[0],
            "w": wk, "bias": np.zeros(m, np.int64) if bias is None else bias.reshape(-1).astype(np.int64)}


def lower_matmul_of_activations(graph: Graph, node: Node, shapes: dict, dtypes: dict) -> list[Node] | None:
    """A QLinearMatMul of two activations (an int8 transformer's attention products) as ops C runs on floats,
    all standard ONNX: DequantizeLinear(a, 1, za) and (b, 1, zb), MatMul, Mul by sa * sb / sy (float32, as
    qgemm.h's), QuantizeLinear(., 1, zy). The MatMul multiplies and adds integers (a - za)(b - zb): exact, the
    int32 sum ONNX Runtime makes, while K |a - za| |b - zb| stays below 2^24; then float(sum) times the
    multiplier, rounded half to even, plus zy, saturated, as ONNX Runtime requantizes. None (the node stays as
    it is) where a parameter is not a per-tensor constant, a shape is unknown or the bound does not hold. New
    constants go into `graph`, `shapes` and `dtypes`."""
    if len(node.inputs) != 8 or node.inputs[3] in graph.constants or node.domain not in ("", "ai.onnx"):
        return None
    a, b, y = node.inputs[0], node.inputs[3], node.outputs[0]
    try:
        sa, sb, sy = (_scale(graph, node, k) for k in (1, 4, 6))
        za, zb, zy = (_const(graph, node, k, "zero point") for k in (2, 5, 7))
    except SaturateError:
        return None
    if any(z is None or z.size != 1 for z in (za, zb, zy)) or any(s.size != 1 for s in (sa, sb, sy)):
        return None
    if any(z.dtype.name not in ("int8", "uint8") for z in (za, zb, zy)) or \
            (dtypes.get(a), dtypes.get(b)) != (za.dtype.name, zb.dtype.name):
        return None
    if shapes.get(a) is None or shapes.get(b) is None or not shapes[a]:
        return None

    def spread(z: np.ndarray) -> int:
        lo, hi = INT_CODED[z.dtype.name]
        return max(abs(lo - int(z.reshape(-1)[0])), abs(hi - int(z.reshape(-1)[0])))

    if shapes[a][-1] * spread(za) * spread(zb) >= 2 ** 24:
        return None
    names = set(graph.constants) | set(graph.values) | {v for n in graph.nodes for v in (*n.inputs, *n.outputs)}

    def fresh(tag: str) -> str:
        name, k = f"{y}/{tag}", 1
        while name in names:
            name, k = f"{y}/{tag}{k}", k + 1
        names.add(name)
        return name

    unit, scale = fresh("qmm_unit"), fresh("qmm_scale")
    graph.constants[unit] = np.float32(1.0)
    graph.constants[scale] = np.float32(np.float32(sa[0]) * np.float32(sb[0]) / np.float32(sy[0]))
    for c in (unit, scale):
        shapes[c], dtypes[c] = (), "float32"
    ta, tb, s, m = fresh("qmm_a"), fresh("qmm_b"), fresh("qmm_sum"), fresh("qmm_scaled")
    label = node.name or y
    return [Node("DequantizeLinear", [a, unit, node.inputs[2]], [ta], {}, f"{label}/a"),
            Node("DequantizeLinear", [b, unit, node.inputs[5]], [tb], {}, f"{label}/b"),
            Node("MatMul", [ta, tb], [s], {}, f"{label}/matmul"),
            Node("Mul", [s, scale], [m], {}, f"{label}/scale"),
            Node("QuantizeLinear", [m, unit, node.inputs[7]], [y], {}, label)]


def _bytes_as_floats(arr: np.ndarray) -> np.ndarray:
    """Raw bytes of `arr` as float32 words for the weights blob (bits kept: only copied, never computed)."""
    raw = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
    return np.concatenate([raw, np.zeros((-raw.size) % 4, np.uint8)]).view(np.float32)


def packed(params: dict, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int, int]:
    """(packed weights, corr, bz, scale, K, xoff, xpad) for sat_qconv (see qgemm.h)."""
    w = params["w"].astype(np.int64)
    m, k = w.shape
    woff = 128 if params["w"].dtype == np.uint8 else 0
    xoff = 128 if params["xdtype"] == "int8" else 0
    ws = w - woff
    mg, k4 = m // group, -(-k // 4)
    panels = -(-mg // 16)
    full = np.zeros((group, panels * 16, k4 * 4), np.int8)
    full[:, :mg, :k] = ws.reshape(group, mg, k)
    pw = full.reshape(group, panels, 16, k4, 4).transpose(0, 1, 3, 2, 4)
    a = params["zx"] + xoff
    bz = params["zw"].astype(np.int64) - woff
    corr = params["bias"] - a * ws.sum(axis=1) + k * a * bz
    scale = (np.float32(params["sx"]) * params["sw"].astype(np.float32) / np.float32(params["sy"])).astype(np.float32)
    return pw, corr.astype(np.int64), bz.astype(np.int32), scale, k, xoff, a


def emit_qlinear(em, step, chain, out, oshape) -> None:
    """One sat_qconv call for a QLinearConv or QLinearMatMul step (no epilogue: their outputs are integers)."""
    node, sh = step.anchor, em.shapes
    params = qlinear_params(em.g, node)
    lo, hi = INT_CODED[params["ydtype"]]
    x = sh[node.inputs[0]]
    if node.op == "QLinearMatMul":
        rows, group = math.prod(x[:-1]), 1
        c, h, wd, mo = x[-1], 1, 1, oshape[-1]
        geo = "1, 1, 1, 1, 1, 1, 0, 0, 1, 1"
    else:
        w = sh[node.inputs[3]]
        win = conv_window(node, x, w)
        rows, group, c, mo = x[0], int(node.attr("group", 1)), x[1], w[0]
        h, wd = (x[2], x[3]) if len(x) == 4 else (1, x[2])
        geo = f"{win.kh}, {win.kw}, {win.oh}, {win.ow}, {win.sh}, {win.sw}, {win.ph}, {win.pw}, {win.dh}, {win.dw}"
        hp = max((win.oh - 1) * win.sh + (win.kh - 1) * win.dh + 1, win.ph + h)
        wp = max((win.ow - 1) * win.sw + (win.kw - 1) * win.dw + 1, win.pw + wd)
        check_bytes(rows * c * hp * wp, f"the padded input bytes of node {node.name!r} ({node.op})")
    pw, corr, bz, scale, k, xoff, xpad = packed(params, group)
    check_bytes(QTILE * 4 * (-(-k // 4)), f"the gathered taps of node {node.name!r} ({node.op})")
    if math.prod(oshape) == 0:
        return
    wp = em.weight(("qw", node.inputs[3], group), _bytes_as_floats(pw))
    cp = em.weight(("qcorr", id(node)), _bytes_as_floats(corr))
    bp = em.weight(("qbz", id(node)), _bytes_as_floats(bz))
    sp = em.weight(("qscale", id(node)), scale)
    em.body.append(f"    sat_qconv({em.ptr(node.inputs[0])}, {wp}, {cp}, {bp}, {sp}, {out}, {rows}, {c}, {h}, {wd}, "
                   f"{mo}, {geo}, {group}, {k}, {xoff}, {xpad}, {c_float(params['zy'])}, {c_float(lo)}, "
                   f"{c_float(hi)}, {int(node.op == 'QLinearMatMul')});\n")
