"""C backend, segmenting stage: fold compile-time values, lower ops, and cut the graph into C segments and
interpreter pieces."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from saturate.backend import quant
from saturate.backend.shapes import (HELD, INDEX_DTYPES, _out_shape, gather_rows, runs_in_c, runtime_indices,
                                     unsupported)
from saturate.core import geometry
from saturate.core.errors import SaturateError
from saturate.core.ir import Graph, Node, ValueInfo
from saturate.ops.registry import lookup


def _has(node: Node, flag: str) -> bool:
    """The op registry entry's flag for this node's op."""
    d = lookup(node.op, node.domain)
    return d is not None and bool(getattr(d, flag))


@dataclass
class Piece:
    """A run of nodes executed together: one compiled C segment (`graph` is its subgraph) or nodes
    the numpy interpreter evaluates in order."""

    kind: str                      # "c" or "interpreter"
    nodes: list[Node]
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    graph: Graph | None = None


@dataclass
class Partition:
    """The graph after folding and lowering, its pieces in run order, and what fell back and why."""

    graph: Graph
    pieces: list[Piece]
    shapes: dict[str, tuple[int, ...] | None]
    dtypes: dict[str, str | None]
    inputs: list[tuple[str, tuple[int, ...], str]]
    fallback: list[tuple[Node, str]]
    # Values C kernels read as indices (shapes.runtime_indices) -> (the smallest axis they index, the node of
    # that axis): each call checks them before they enter C.
    indices: dict[str, tuple[int, str]] = field(default_factory=dict)

    def fallback_ops(self) -> list[tuple[str, int, list[str]]]:
        """(op, count, node names) of the nodes the interpreter runs, most frequent first."""
        by_op: dict[str, list[str]] = {}
        for node, _ in self.fallback:
            by_op.setdefault(node.op, []).append(node.name or node.outputs[0])
        return sorted(((op, len(names), names) for op, names in by_op.items()), key=lambda t: (-t[1], t[0]))


def runtime_input_shapes(graph: Graph, overrides: dict | None = None) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, static shape, dtype) of every input fed at run time; a symbolic dimension is an error."""
    out = []
    for name in graph.inputs:
        if name in graph.constants:
            continue
        info = graph.info(name)
        if overrides and name in overrides:
            out.append((name, tuple(int(d) for d in overrides[name]), info.dtype or "float32"))
            continue
        if not info.is_static():
            raise SaturateError(f"graph input '{name}' has shape {info.shape}; the C backend needs static "
                                f"shapes (pass input_shapes)")
        out.append((name, tuple(info.shape), info.dtype or "float32"))
    return out


def _lower_swish(nodes: list[Node], outputs: set[str], origins: dict) -> list[Node]:
    """Mul(x, Sigmoid(x)) -> Swish(x): one pointwise op, so it fuses into x's producer. Swish is a C kernel
    only (ONNX has it from opset 24): `origins` maps each new node to the nodes it replaces, which run
    instead wherever it would fall back to the interpreter."""
    users: dict[str, list[Node]] = {}
    for n in nodes:
        for i in n.inputs:
            users.setdefault(i, []).append(n)
    sig = {n.outputs[0]: n for n in nodes if n.op == "Sigmoid" and n.domain in ("", "ai.onnx")}
    drop, swap = set(), {}
    for n in nodes:
        if n.op != "Mul" or len(n.inputs) != 2 or n.domain not in ("", "ai.onnx"):
            continue
        for s, x in (n.inputs, n.inputs[::-1]):
            src = sig.get(s)
            if src is not None and src.inputs[0] == x and len(users[s]) == 1 and s not in outputs:
                drop.add(id(src))
                swap[id(n)] = Node("Swish", [x], list(n.outputs), {"alpha": 1.0}, n.name)
                origins[id(swap[id(n)])] = [src, n]
                break
    return [swap.get(id(n), n) for n in nodes if id(n) not in drop]


def _lower_gelu(nodes: list[Node], outputs: set[str], constants: dict, origins: dict) -> list[Node]:
    """x * 0.5 * (1 + Erf(x / sqrt 2)), as both torch exporters spell nn.GELU, -> Gelu(x): one pointwise op
    instead of five, so it fuses into the MatMul that makes x (`origins` as for _lower_swish: ONNX has Gelu
    from opset 20)."""
    users: dict[str, list[Node]] = {}
    for n in nodes:
        for i in n.inputs:
            users.setdefault(i, []).append(n)
    producer = {o: n for n in nodes for o in n.outputs}

    def scalar(v) -> float | None:
        c = constants.get(v)
        return float(np.asarray(c).reshape(-1)[0]) if c is not None and np.asarray(c).size == 1 else None

    def sole(v) -> Node | None:
        u = users.get(v, [])
        return u[0] if len(u) == 1 and v not in outputs and u[0].domain in ("", "ai.onnx") else None

    def other(node: Node, v: str) -> str | None:
        if len(node.inputs) != 2 or v not in node.inputs:
            return None
        return node.inputs[1] if node.inputs[0] == v else node.inputs[0]

    drop, swap = set(), {}
    for erf in nodes:
        div = producer.get(erf.inputs[0]) if erf.op == "Erf" else None
        if div is None or div.op != "Div" or sole(div.outputs[0]) is not erf:
            continue
        x, c = div.inputs
        add = sole(erf.outputs[0])
        if c == x or add is None or add.op != "Add" or abs((scalar(c) or 0) - 2 ** 0.5) > 1e-4:
            continue
        if scalar(other(add, erf.outputs[0])) != 1.0:
            continue
        # Then times x and times 0.5, in either order (TorchScript: x first; dynamo: 0.5 first).
        mul = sole(add.outputs[0])
        last = sole(mul.outputs[0]) if mul is not None and mul.op == "Mul" else None
        if last is None or last.op != "Mul":
            continue
        roles = {"x" if v == x else "half" if scalar(v) == 0.5 else "?"
                 for v in (other(mul, add.outputs[0]), other(last, mul.outputs[0]))}
        if roles != {"x", "half"}:
            continue
        drop.update({id(div), id(erf), id(add), id(mul)})
        swap[id(last)] = Node("Gelu", [x], list(last.outputs), {}, last.name)
        origins[id(swap[id(last)])] = [div, erf, add, mul, last]
    return [swap.get(id(n), n) for n in nodes if id(n) not in drop]


def _split_sizes(graph: Graph, node: Node, dim: int) -> list[int]:
    given = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] else None
    if given and given not in graph.constants:
        raise unsupported(node, f"needs '{given}' to be a constant")
    split = np.asarray(graph.constants[given]).reshape(-1) if given else node.attr("split")
    try:
        return geometry.split_sizes(dim, len(node.outputs), split, node.attr("num_outputs"))
    except geometry.GeometryError as err:
        raise unsupported(node, str(err)) from None


def _lower_split(graph: Graph, node: Node, x: tuple[int, ...]) -> list[Node]:
    """Split -> one Slice per output (the attribute form), each a strided copy of the input."""
    axis = int(node.attr("axis", 0)) % len(x)
    sizes = _split_sizes(graph, node, x[axis])
    out, at = [], 0
    for k, (o, s) in enumerate(zip(node.outputs, sizes)):
        if o:
            out.append(Node("Slice", [node.inputs[0]], [o], {"starts": [at], "ends": [at + s], "axes": [axis]},
                            f"{node.name or node.outputs[0]}/{k}"))
        at += s
    return out


def _infer_fallback(graph: Graph, node: Node, shapes: dict, dtypes: dict) -> list[tuple]:
    """(static shape or None, dtype or None) per output of a node the interpreter runs, from ONNX shape
    inference on that node alone: a data-dependent shape (NonZero, a runtime Reshape target) is None."""
    import onnx

    from saturate.frontend.onnx_io import export_model

    mini = Graph(inputs=[], outputs=[o for o in node.outputs if o], opset=graph.opset, name="node",
                 meta={k: v for k, v in graph.meta.items() if k == "opset_imports"})
    for i in dict.fromkeys(i for i in node.inputs if i):
        if i in graph.constants:
            mini.constants[i] = graph.constants[i]
        else:
            mini.inputs.append(i)
            mini.values[i] = ValueInfo(dtypes.get(i) or "float32", shapes.get(i))
    mini.nodes = [node]
    unknown = [(None, None)] * len(node.outputs)
    proto = export_model(mini)
    # The outputs go in untyped: a declared type (float32 when the graph has none for the value) would
    # win over the inferred one and leave the shape unknown (IsNaN's bool output).
    names = [vi.name for vi in proto.graph.output]
    del proto.graph.output[:]
    proto.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    try:
        model = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:  # inference is advisory: no answer only means the shape is not static
        return unknown
    from saturate.frontend.onnx_io import dtype_name

    found = {vi.name: vi for vi in list(model.graph.value_info) + list(model.graph.output)}
    out = []
    for o in node.outputs:
        vi = found.get(o)
        if vi is None or not vi.type.HasField("tensor_type"):
            out.append((None, None))
            continue
        t = vi.type.tensor_type
        try:
            dtype = dtype_name(t.elem_type) if t.elem_type else None
        except SaturateError:
            dtype = None
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim] if t.HasField("shape") else None
        shape = tuple(dims) if dims is not None and all(d is not None for d in dims) else None
        out.append((shape, dtype))
    return out


def _interpreter_can_run(node: Node, opset: int) -> bool:
    from saturate.interp.interpreter import supported_ops

    return node.domain in ("", "ai.onnx") and node.op in supported_ops(opset)


def partition(graph: Graph, input_shapes: dict | None = None) -> Partition:
    """Fold what depends only on constants and static shapes, pick C or the interpreter for every other
    node, and group the nodes into maximal C segments: C nodes are scheduled as soon as their inputs
    exist, so interpreter nodes split the graph only where the data really flows through them."""
    graph.validate()
    g = Graph(nodes=[], inputs=list(graph.inputs), outputs=list(graph.outputs), constants=dict(graph.constants),
              values=dict(graph.values), name=graph.name, opset=graph.opset, meta=dict(graph.meta))
    inputs = runtime_input_shapes(graph, input_shapes)
    shapes: dict = {k: tuple(int(d) for d in v.shape) for k, v in g.constants.items()}
    dtypes: dict = {k: v.dtype.name for k, v in g.constants.items()}
    for name, shape, dtype in inputs:
        shapes[name], dtypes[name] = shape, dtype
    graph_outputs = set(graph.outputs)
    origins: dict[int, list[Node]] = {}  # a lowered node -> the nodes it stands for
    nodes = _lower_gelu(_lower_swish(list(graph.nodes), graph_outputs, origins), graph_outputs, g.constants, origins)
    read = {i for n in nodes for i in n.inputs if i} | graph_outputs
    kinds: list[str] = []
    fallback: list[tuple[Node, str]] = []
    indices: dict[str, tuple[int, str]] = {}
    pending = list(nodes)
    while pending:
        node = pending.pop(0)
        standard = node.domain in ("", "ai.onnx")
        present = [i for i in node.inputs if i]
        # Compile-time values: constant inputs (shape arithmetic of exports), or the shape of a static value.
        if standard and not _has(node, "nondeterministic") and (node.inputs or node.op == "Constant") and (
                all(i in g.constants for i in present)
                or (node.op in ("Shape", "Size") and shapes.get(node.inputs[0]) is not None)
                or (node.op == "CastLike" and node.inputs[0] in g.constants and dtypes.get(node.inputs[1]))):
            folded = _fold(g, node, shapes, dtypes)
            if folded:
                continue
        ins = [shapes.get(i) if i else None for i in node.inputs]
        index = runtime_indices(g, node)  # the input its kernel reads as indices at run time, if any
        why = None
        quantized = _has(node, "quant")
        typed = getattr(lookup(node.op, node.domain), "c_dtype", None)
        out_dtype = "float32"
        if not runs_in_c(node) and not (standard and node.op == "Split"):
            why = f"has no kernel for op '{node.op}'"
        elif quantized and node.op == "QLinearMatMul" and standard and (
                lowered := quant.lower_matmul_of_activations(g, node, shapes, dtypes)):
            pending[:0] = lowered
            continue
        elif quantized:
            x = node.inputs[0]
            why = (f"needs a static shape for '{x}'" if x not in g.constants and shapes.get(x) is None
                   else quant.check_node(g, node, dtypes, shapes))
        else:
            data = present[:1] if _has(node, "param_inputs") else present
            # Views and casts take every dtype C holds; an entry's c_dtype hook judges the dtypes itself.
            held = HELD if _has(node, "int_move") or node.op == "Cast" else ("float32",)
            bad = [i for i in data if i not in g.constants
                   and (shapes.get(i) is None or not typed and dtypes.get(i) not in held)]
            if bad:
                why = (f"needs a static shape for '{bad[0]}'" if shapes.get(bad[0]) is None
                       else f"runs float32 only ('{bad[0]}' is {dtypes.get(bad[0])})")
            elif index and (shapes.get(index) is None or dtypes.get(index) not in INDEX_DTYPES):
                why = (f"needs a static shape for '{index}'" if shapes.get(index) is None
                       else f"reads int32 or int64 indices only ('{index}' is {dtypes.get(index)})")
            elif index and dtypes.get(node.inputs[0]) not in HELD:
                why = f"gathers by run-time indices from data C holds only ('{node.inputs[0]}' is " \
                      f"{dtypes.get(node.inputs[0])})"
            elif _has(node, "param_inputs") and any(i not in g.constants and i != index for i in present[1:]):
                why = f"needs the parameter inputs of '{node.op}' to be constants"
            elif typed:
                try:
                    out_dtype = typed(g, node, [dtypes.get(i) if i else None for i in node.inputs])
                except SaturateError as err:
                    why = str(err).split("the C backend ", 1)[-1]
        if why is None and node.op == "CastLike" and dtypes.get(node.inputs[1]) != "float32":
            why = "casts to float32 only"
        if why is None and node.op == "Split":
            try:
                pending[:0] = _lower_split(g, node, ins[0])
                continue
            except SaturateError as err:
                why = str(err).split("the C backend ", 1)[-1]
        if why is None and any(o for o in node.outputs[1:]):
            if _has(node, "droppable_outputs") and not any(o in read for o in node.outputs[1:]):
                node = Node(node.op, list(node.inputs), node.outputs[:1], dict(node.attrs), node.name, node.domain)
            else:
                why = f"computes only the first output of '{node.op}'"
        if why is None:
            try:
                out = _out_shape(g, node, ins)
                g.nodes.append(node)
                kinds.append("c")
                shapes[node.outputs[0]] = tuple(int(d) for d in out)
                if index:
                    bound = gather_rows(node, shapes[node.inputs[0]], shapes[index])[1]
                    if index not in indices or bound < indices[index][0]:
                        indices[index] = (bound, node.where())
                dtypes[node.outputs[0]] = (quant.out_dtype(g, node) if quantized
                                           else dtypes.get(node.inputs[0]) if _has(node, "int_move") else out_dtype)
                continue
            except SaturateError as err:
                why = str(err).split("the C backend ", 1)[-1]
        if id(node) in origins:  # the interpreter runs what the model wrote, never a C-only lowering
            pending[:0] = origins.pop(id(node))
            continue
        if not _interpreter_can_run(node, g.opset):
            raise unsupported(node, f"has no kernel for op '{node.op}' and the interpreter cannot run it either")
        g.nodes.append(node)
        kinds.append("interpreter")
        fallback.append((node, why))
        for o, (shape, dtype) in zip(node.outputs, _infer_fallback(g, node, shapes, dtypes)):
            if o:
                shapes[o], dtypes[o] = shape, dtype
    pieces = _segments(g, kinds, shapes)
    running = {id(n) for p in pieces for n in p.nodes}
    fallback = [(n, why) for n, why in fallback if id(n) in running]
    return Partition(g, pieces, shapes, dtypes, inputs, fallback, indices)


def _fold(g: Graph, node: Node, shapes: dict, dtypes: dict) -> bool:
    """Evaluate a node at compile time into constants; False when the interpreter cannot."""
    from saturate.interp import eval_node

    args = []
    for i in node.inputs:
        if not i:
            args.append(None)
        elif i in g.constants:
            args.append(g.constants[i])
        else:  # Shape/Size of a static value, CastLike's type witness: a zero-stride stand-in
            args.append(np.broadcast_to(np.zeros((), dtypes.get(i) or "float32"), shapes.get(i) or ()))
    try:
        results = eval_node(node, args, g.opset)
    except SaturateError:
        return False
    for o, r in zip(node.outputs, results):
        if o:
            arr = np.array(r)  # owned and contiguous: folded values may be views of their inputs
            g.constants[o] = arr
            shapes[o], dtypes[o] = tuple(arr.shape), arr.dtype.name
    return True


def _segments(g: Graph, kinds: list[str], shapes: dict) -> list[Piece]:
    """Maximal runs of one kind: repeatedly take every C node whose inputs exist, then every ready
    interpreter node, in graph order."""
    avail = set(g.inputs) | set(g.constants)
    todo = list(zip(g.nodes, kinds))
    pieces: list[Piece] = []
    want = "c"
    while todo:
        taken, rest = [], []
        for node, kind in todo:
            if kind == want and all(not i or i in avail for i in node.inputs):
                taken.append(node)
                avail.update(o for o in node.outputs if o)
            else:
                rest.append((node, kind))
        if taken:
            pieces.append(Piece(want, taken))
        todo = rest
        want = "interpreter" if want == "c" else "c"
    later_reads: set[str] = set(g.outputs)
    live = []
    for piece in reversed(pieces):
        made = {o for n in piece.nodes for o in n.outputs if o}
        piece.inputs = list(dict.fromkeys(i for n in piece.nodes for i in n.inputs
                                          if i and i not in made and i not in g.constants))
        piece.outputs = [o for o in dict.fromkeys(o for n in piece.nodes for o in n.outputs if o) if o in later_reads]
        if not piece.outputs:  # dead code: nothing after it reads what it makes
            continue
        live.append(piece)
        later_reads.update(piece.inputs)
    live.reverse()
    for piece in live:
        if piece.kind == "c":
            sub = Graph(nodes=piece.nodes, inputs=list(piece.inputs), outputs=list(piece.outputs), opset=g.opset,
                        name=f"{g.name}_seg{sum(p.kind == 'c' for p in live[:live.index(piece)])}")
            sub.constants = {i: g.constants[i] for n in piece.nodes for i in n.inputs if i in g.constants}
            sub.values = {i: ValueInfo("float32", shapes[i]) for i in piece.inputs}
            piece.graph = sub
    return live
