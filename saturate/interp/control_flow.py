"""Reference interpreter, control flow: If, Loop, Scan and SequenceMap, each subgraph run by run_graph,
so that its nodes take the interpreter's kernels, dtype checks, errors and memory limit.

A node with subgraphs lists, after its own inputs, the outer values its subgraphs read
(frontend.onnx_scope): a subgraph is run as a graph whose inputs are its own, then those names.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy as np

from saturate.core.errors import MemoryLimitError, SaturateError
from saturate.core.ir import Graph, Node, OpaqueAttr, ValueInfo
from saturate.core.limits import check_bytes
from saturate.interp.sequences import TensorSequence, is_sequence

CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})
# What a value kept per iteration (a scan output's item) costs beside its bytes: the array object.
_ITEM_OVERHEAD = 128


def run_control_flow(node: Node, args: Sequence[Any], opset: int, run_graph: Callable[..., dict[str, Any]]) -> list[Any]:
    """Evaluate a control-flow node on its inputs (its own, then the outer values its subgraphs read),
    its subgraphs run by `run_graph` (the interpreter's, handed in: it runs this module too)."""
    from saturate.frontend.onnx_scope import subgraph_reads

    reads = subgraph_reads(node)
    if len(args) < len(reads):
        raise SaturateError(f"{node.where()}: lists {len(args)} inputs, fewer than the {len(reads)} outer values "
                            f"its subgraphs read")
    cut = len(args) - len(reads)
    outer = dict(zip(reads, args[cut:]))
    run = {"If": _if, "Loop": _loop, "Scan": _scan, "SequenceMap": _sequence_map}[node.op]
    results = run(node, list(args[:cut]), outer, opset, run_graph)
    if len(node.outputs) > len(results):
        raise SaturateError(f"{node.where()}: lists {len(node.outputs)} outputs, its subgraph computes "
                            f"{len(results)}")
    return results


class _Body:
    """One subgraph attribute of a node, ready to run: its Graph, its own inputs' count and the
    types it declares for its outputs."""

    def __init__(self, node: Node, attr: str, opset: int, run_graph: Callable[..., dict[str, Any]]) -> None:
        value = node.attrs.get(attr)
        if not isinstance(value, OpaqueAttr) or value.kind != "GRAPH":
            raise SaturateError(f"{node.where()}: attribute '{attr}' (a graph) is missing")
        self.node, self.attr, self.run_graph = node, attr, run_graph
        try:
            self.graph, self.arity, self.declared = _import(value.payload, opset)
        except SaturateError as err:
            raise SaturateError(f"{node.where()}, subgraph '{attr}': {err}") from None

    def run(self, own: list[Any], outer: dict[str, Any]) -> list[Any]:
        if len(own) != self.arity:
            raise SaturateError(f"{self.node.where()}: subgraph '{self.attr}' takes {self.arity} inputs, "
                                f"the node gives it {len(own)}")
        names = self.graph.inputs
        feed = dict(zip(names, own))
        feed.update((n, outer[n]) for n in names[self.arity:])
        try:
            got = self.run_graph(self.graph, feed)
        except SaturateError as err:
            cls = MemoryLimitError if isinstance(err, MemoryLimitError) else SaturateError
            raise cls(f"{self.node.where()}, subgraph '{self.attr}': {err}") from None
        return [got[o] for o in self.graph.outputs]

    def empty(self, k: int, extra_axis: int | None = 0) -> np.ndarray:
        """What output k stacks to when no iteration ran: no items, each of the declared shape (an
        unknown dimension taken as 0, as ONNX Runtime takes it)."""
        info = self.declared[k] if k < len(self.declared) else None
        dtype = info.dtype if info is not None and info.dtype != "unknown" else "float32"
        item = [d if isinstance(d, int) else 0 for d in (info.shape or ())] if info is not None else []
        item.insert(extra_axis % (len(item) + 1), 0)
        return np.zeros(item, dtype)


@functools.lru_cache(maxsize=256)
def _import(payload: bytes, opset: int) -> tuple[Graph, int, list[ValueInfo | None]]:
    from saturate.frontend.onnx_io import import_subgraph
    from saturate.frontend.onnx_scope import parse_attribute
    from saturate.frontend.onnx_tensors import type_info

    sub = parse_attribute(payload).g
    declared = []
    for vi in sub.output:
        try:
            declared.append(type_info(vi.type))
        except SaturateError:
            declared.append(None)
    return import_subgraph(sub, opset), len(sub.input), declared


def _flag(node: Node, value: Any, what: str) -> bool:
    """The one bool a condition holds."""
    if value is None or is_sequence(value):
        raise SaturateError(f"{node.where()}: {what} must be a bool tensor, got "
                            f"{'nothing' if value is None else 'a sequence'}")
    if value.dtype != np.bool_ or value.size != 1:
        raise SaturateError(f"{node.where()}: {what} must be one bool, got {value.dtype.name}{list(value.shape)}")
    return bool(value.reshape(-1)[0])


def _if(node: Node, own: list[Any], outer: dict[str, Any], opset: int,
        run_graph: Callable[..., dict[str, Any]]) -> list[Any]:
    if len(own) != 1:
        raise SaturateError(f"{node.where()}: takes one input, the condition; got {len(own)}")
    branch = "then_branch" if _flag(node, own[0], "the condition") else "else_branch"
    return _Body(node, branch, opset, run_graph).run([], outer)


class _Stacks:
    """The items scan outputs collect, one list per output, their memory counted as they come."""

    def __init__(self, node: Node, count: int, first: int) -> None:
        self.node, self.items = node, [[] for _ in range(count)]
        self.first = first          # the body output of the first item list
        self.nbytes = 0

    def add(self, k: int, value: Any, step: int, same_shape: bool = True) -> None:
        if value is None or is_sequence(value):
            raise SaturateError(f"{self.node.where()}: output {k} of the body must be a tensor, iteration {step} "
                                f"gave {'nothing' if value is None else 'a sequence'}")
        items = self.items[k]
        if items and (value.shape != items[0].shape and same_shape or value.dtype != items[0].dtype):
            raise SaturateError(f"{self.node.where()}: scan output {k}: iteration {step} gives "
                                f"{value.dtype.name}{list(value.shape)}, the first gave "
                                f"{items[0].dtype.name}{list(items[0].shape)}")
        self.nbytes += value.nbytes + _ITEM_OVERHEAD
        check_bytes(self.nbytes, f"{self.node.where()}: outputs collected over {step + 1} iterations")
        items.append(value)

    def stacked(self, k: int, axis: int, body: _Body, reverse: bool = False) -> np.ndarray:
        items = self.items[k]
        if not items:
            return body.empty(self.first + k, axis)
        rank = items[0].ndim
        if not -rank - 1 <= axis <= rank:
            raise SaturateError(f"{self.node.where()}: scan output axis {axis} is out of range for items of "
                                f"rank {rank}")
        check_bytes(sum(a.nbytes for a in items), f"{self.node.where()}: scan output {k}")
        return np.stack(items[::-1] if reverse else items, axis=axis)


def _loop(node: Node, own: list[Any], outer: dict[str, Any], opset: int,
          run_graph: Callable[..., dict[str, Any]]) -> list[Any]:
    body = _Body(node, "body", opset, run_graph)
    trip = own[0] if own else None
    cond = own[1] if len(own) > 1 else None
    carried = list(own[2:])
    if body.arity != 2 + len(carried):
        raise SaturateError(f"{node.where()}: body takes {body.arity} inputs, the loop gives it "
                            f"{2 + len(carried)} (iteration, condition and {len(carried)} loop-carried)")
    scans = len(body.graph.outputs) - 1 - len(carried)
    if scans < 0:
        raise SaturateError(f"{node.where()}: body computes {len(body.graph.outputs)} outputs, fewer than the "
                            f"condition and {len(carried)} loop-carried values")
    limit = None
    if trip is not None:
        if is_sequence(trip) or trip.dtype != np.int64 or trip.size != 1:
            raise SaturateError(f"{node.where()}: trip count must be one int64")
        limit = int(trip.reshape(-1)[0])
    going = True if cond is None else _flag(node, cond, "the condition")
    # ONNX Runtime and onnx.reference stop when the body's condition turns false even where the
    # loop was given none (the spec's table calls it ignored then): as ONNX Runtime runs models.
    stacks = _Stacks(node, scans, 1 + len(carried))
    step = 0
    while going and (limit is None or step < limit):
        outs = body.run([np.array(step, np.int64), np.array(going), *carried], outer)
        going = _flag(node, outs[0], f"the body's condition (iteration {step})")
        carried = outs[1:1 + len(carried)]
        for k, value in enumerate(outs[1 + len(carried):]):
            stacks.add(k, value, step)
        step += 1
    return carried + [stacks.stacked(k, 0, body) for k in range(scans)]


def _ints(node: Node, key: str, count: int) -> list[int]:
    value = node.attrs.get(key)
    if value is None:
        return [0] * count
    value = [int(v) for v in value]
    if len(value) != count:
        raise SaturateError(f"{node.where()}: attribute '{key}' lists {len(value)} values, expected {count}")
    return value


def _scan(node: Node, own: list[Any], outer: dict[str, Any], opset: int,
          run_graph: Callable[..., dict[str, Any]]) -> list[Any]:
    if opset < 9:
        raise SaturateError(f"{node.where()}: Scan before opset 9 (with a batch axis) is not supported")
    body = _Body(node, "body", opset, run_graph)
    count = node.attrs.get("num_scan_inputs")
    if not isinstance(count, int) or not 1 <= count <= len(own):
        raise SaturateError(f"{node.where()}: num_scan_inputs {count} does not fit its {len(own)} inputs")
    states, xs = list(own[:len(own) - count]), own[len(own) - count:]
    axes, directions = _ints(node, "scan_input_axes", count), _ints(node, "scan_input_directions", count)
    scans = len(body.graph.outputs) - len(states)
    if body.arity != len(own) or scans < 0:
        raise SaturateError(f"{node.where()}: body takes {body.arity} inputs and computes "
                            f"{len(body.graph.outputs)} outputs, for {len(states)} states and {count} scan inputs")
    out_axes, out_directions = _ints(node, "scan_output_axes", scans), _ints(node, "scan_output_directions", scans)
    for key, values in (("scan_input_directions", directions), ("scan_output_directions", out_directions)):
        if any(d not in (0, 1) for d in values):
            # 0 is forward, 1 reverse; ONNX Runtime refuses any other value, where truth would read it as reverse.
            raise SaturateError(f"{node.where()}: attribute '{key}' holds {values}: each must be 0 (forward) "
                                f"or 1 (reverse)")
    length = None
    for k, (x, axis) in enumerate(zip(xs, axes)):
        if x is None or is_sequence(x) or x.ndim == 0:
            raise SaturateError(f"{node.where()}: scan input {k} must be a tensor of rank 1 or more")
        if not -x.ndim <= axis < x.ndim:
            raise SaturateError(f"{node.where()}: scan input axis {axis} is out of range for rank {x.ndim}")
        axes[k] = axis % x.ndim
        if length is not None and x.shape[axes[k]] != length:
            raise SaturateError(f"{node.where()}: scan inputs have lengths {length} and {x.shape[axes[k]]}")
        length = x.shape[axes[k]]
    stacks = _Stacks(node, scans, len(states))
    for step in range(length or 0):
        slices = [x[(slice(None),) * axis + (length - 1 - step if backward else step,)]
                  for x, axis, backward in zip(xs, axes, directions)]
        outs = body.run(states + slices, outer)
        states = outs[:len(states)]
        for k, value in enumerate(outs[len(states):]):
            stacks.add(k, value, step)
    return states + [stacks.stacked(k, out_axes[k], body, bool(out_directions[k])) for k in range(scans)]


def _sequence_map(node: Node, own: list[Any], outer: dict[str, Any], opset: int,
                  run_graph: Callable[..., dict[str, Any]]) -> list[Any]:
    body = _Body(node, "body", opset, run_graph)
    if not own or not is_sequence(own[0]):
        raise SaturateError(f"{node.where()}: input 0 must be a sequence")
    length = len(own[0])
    for k, a in enumerate(own[1:], 1):
        if is_sequence(a) and len(a) != length:
            raise SaturateError(f"{node.where()}: input {k} holds {len(a)} tensors, input 0 holds {length}")
    stacks = _Stacks(node, len(body.graph.outputs), 0)
    for step in range(length):
        outs = body.run([a[step] if is_sequence(a) else a for a in own], outer)
        for k, value in enumerate(outs):
            stacks.add(k, value, step, same_shape=False)
    results = []
    for k, values in enumerate(stacks.items):
        info = body.declared[k] if k < len(body.declared) else None
        dtype = info.dtype if info is not None and info.dtype != "unknown" else None
        results.append(TensorSequence(values, values[0].dtype if values else dtype))
    return results
