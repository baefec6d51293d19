"""Reference interpreter: run a Graph with numpy, node by node, freeing values after last use."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from saturate.core.errors import SaturateError
from saturate.core.ir import Graph, Node
from saturate.core.limits import check_allocation, check_bytes
from saturate.ops.schema import newest_opset, spec
from saturate.interp.control_flow import CONTROL_FLOW_OPS, run_control_flow
from saturate.interp.kernels import Unhandled
from saturate.interp.reference import reference_ops, run_reference
from saturate.interp.sequences import (OPTIONAL_OPS, SEQUENCE_OPS, as_value, copy_value, is_sequence, run_sequence_op,
                                       value_nbytes)
from saturate.interp.sizes import check_inferred_sizes, check_output_sizes
from saturate.ops.registry import lookup, ops_with

__all__ = ["run_graph", "eval_node", "check_inputs", "supported_ops"]

# Errors numpy raises on shapes/values the op cannot take; reported as the node's error.
_NUMPY_ERRORS = (ValueError, TypeError, IndexError, ZeroDivisionError, OverflowError, MemoryError)


def supported_ops(opset: int | None = None) -> list[str]:
    """Names of the standard ops the interpreter can evaluate at `opset` (default: the newest)."""
    version = opset or newest_opset()
    return sorted({op for op in ops_with("evaluates") if spec(op, version) is not None} | reference_ops(version)
                  | {op for op in (*SEQUENCE_OPS, *OPTIONAL_OPS, *CONTROL_FLOW_OPS) if spec(op, version) is not None})


def eval_node(node: Node, inputs: Sequence[np.ndarray | None], opset: int | None = None) -> list[np.ndarray]:
    """Evaluate one node on concrete inputs (None: omitted optional input); one array per output.

    Ops whose registry entry has a numpy kernel (saturate/ops) run on it; every other default-domain op runs
    on onnx.reference at `opset` (pass the graph's; default: the newest ONNX defines).
    Results may be views of the inputs (Reshape, Transpose, Identity): copy before writing to them.
    A sequence value is a TensorSequence (a list of arrays), in and out. If, Loop, Scan and
    SequenceMap run their subgraphs on this interpreter (control_flow), the outer values those
    read being the node's trailing inputs.
    """
    standard = node.domain in ("", "ai.onnx")
    if node.op in CONTROL_FLOW_OPS and standard:
        version = opset or newest_opset()
        if spec(node.op, version) is None:
            raise SaturateError(f"{node.where()}: ONNX defines no such op at opset {version}")
        return _checked(node, run_control_flow(node, inputs, version, run_graph))
    # Tested inline on the way of every tensor op (a node costs microseconds): a sequence op, or
    # a list (a sequence value) among the inputs.
    if node.op in SEQUENCE_OPS or node.op in OPTIONAL_OPS:
        return _eval_sequences(node, inputs, standard, opset)
    for a in inputs:
        if isinstance(a, list):
            return _eval_sequences(node, inputs, standard, opset)
    entry = lookup(node.op, node.domain)
    impl = None if entry is None else entry.evaluate
    if impl is None:
        version = opset or newest_opset()
        # Any op ONNX defines goes there, so that one it cannot run says why (control flow...).
        if standard and spec(node.op, version) is not None:
            args = [None if a is None else np.asarray(a) for a in inputs]
            check_output_sizes(node, args)
            check_inferred_sizes(node, args, version)
            return _checked(node, run_reference(node, args, version))
        shown = f"{node.domain}::{node.op}" if node.domain else node.op
        raise SaturateError(f"no reference implementation for op '{shown}' (node '{node.name or node.outputs[0]}')")
    lo, hi = entry.arity
    # Trailing omitted optional inputs are the same as absent ones.
    args = list(inputs)
    while args and args[-1] is None and len(args) > lo:
        args.pop()
    if len(args) > hi:
        raise SaturateError(f"{node.where()}: takes at most {hi} inputs, got {len(args)}")
    for k in range(lo):
        if k >= len(args) or args[k] is None:
            raise SaturateError(f"{node.where()}: missing required input {k}")
    args = [None if a is None else np.asarray(a) for a in args]
    check_output_sizes(node, args)
    check_inferred_sizes(node, args, opset or newest_opset())
    try:
        with np.errstate(all="ignore"):
            result = impl(node, *args)
    except Unhandled:
        return _checked(node, run_reference(node, args, opset or newest_opset()))
    except SaturateError:
        raise
    except _NUMPY_ERRORS as err:
        raise SaturateError(f"{node.where()}: {str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
    results = list(result) if isinstance(result, tuple) else [result]
    if any(node.outputs[len(results):]):
        raise SaturateError(f"{node.where()}: computes {len(results)} output(s), "
                            f"the node asks for {len(node.outputs)}")
    return _checked(node, [np.asarray(r) for r in results])


def _eval_sequences(node: Node, inputs: Sequence, standard: bool, opset: int | None) -> list:
    """A sequence op, or Identity of a sequence, on the interpreter's sequence kernels; any other
    op reading a sequence is refused."""
    version = opset or newest_opset()
    if not (standard and (node.op in SEQUENCE_OPS or node.op in OPTIONAL_OPS
                          or node.op == "Identity" and inputs and is_sequence(inputs[0]))):
        k = next(k for k, a in enumerate(inputs) if is_sequence(a))
        raise SaturateError(f"{node.where()}: input {k} is a sequence; {node.op} takes tensors")
    if spec(node.op, version) is None:
        raise SaturateError(f"{node.where()}: ONNX defines no such op at opset {version}")
    try:
        return _checked(node, run_sequence_op(node, [as_value(a) for a in inputs]))
    except _NUMPY_ERRORS as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise SaturateError(f"{node.where()}: {reason}") from None


def _checked(node: Node, results: list) -> list:
    # A kernel this module does not size may still have made something over the limit (numpy
    # hands out untouched zero pages lazily): stop before later nodes build on it.
    for out, r in zip(node.outputs, results):
        if r is not None:
            shown = f"sequence of {len(r)}" if is_sequence(r) else str(list(r.shape))
            check_bytes(value_nbytes(r), f"{node.where()}: output '{out}' {shown}")
    return results


def check_inputs(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Validate input names, dtypes and shapes against the graph; return the arrays to feed."""
    unknown = [k for k in inputs if k not in graph.inputs]
    if unknown:
        raise SaturateError(f"'{unknown[0]}' is not an input of the graph (inputs: {', '.join(graph.inputs)})")
    feed: dict[str, np.ndarray] = {}
    symbols: dict[str, tuple[str, int]] = {}
    for name in graph.inputs:
        if name not in inputs:
            if name in graph.constants:  # an initializer listed as an input acts as its default
                continue
            raise SaturateError(f"missing graph input '{name}'")
        arr = as_value(inputs[name])
        info = graph.values.get(name)
        if info is not None and arr is None:
            raise SaturateError(f"input '{name}' is an empty optional, the graph expects a tensor")
        if info is not None and is_sequence(arr):
            raise SaturateError(f"input '{name}' is a sequence, the graph expects a tensor")
        if info is not None:
            if info.dtype and arr.dtype.name != info.dtype:
                raise SaturateError(f"input '{name}' has dtype {arr.dtype.name}, the graph expects {info.dtype}")
            if info.shape is not None:
                _check_shape(name, arr.shape, info.shape, symbols)
        feed[name] = arr
    return feed


def _check_shape(name: str, got: tuple, want: tuple, symbols: dict[str, tuple[str, int]]) -> None:
    def show(shape):
        return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"

    if len(got) != len(want):
        raise SaturateError(f"input '{name}' has shape {show(got)}, the graph expects {show(want)}")
    for actual, expected in zip(got, want):
        if isinstance(expected, int) and expected != actual:
            raise SaturateError(f"input '{name}' has shape {show(got)}, the graph expects {show(want)}")
        if isinstance(expected, str):
            # A symbolic dimension must take one size across all inputs.
            first = symbols.setdefault(expected, (name, actual))
            if first[1] != actual:
                raise SaturateError(f"input '{name}' gives dimension {expected}={actual}, "
                                    f"but input '{first[0]}' gave {expected}={first[1]}")


def _check_declared(graph: Graph, node: Node) -> None:
    """Refuse to run a node whose outputs the graph declares (or inference found) with a static
    shape over the memory limit, whatever its op."""
    for out in node.outputs:
        info = graph.values.get(out) if out else None
        if info is not None and info.is_static():
            try:
                itemsize = np.dtype(info.dtype).itemsize
            except TypeError:
                continue
            check_allocation(info.shape, itemsize, f"{node.where()}: output '{out}' {info.dtype}{list(info.shape)}")


def run_graph(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the graph on the given inputs; return graph output name -> array (a TensorSequence for
    a sequence output; a sequence input may be given as a list of arrays)."""
    env: dict[str, np.ndarray] = dict(graph.constants)
    env.update(check_inputs(graph, inputs))
    pinned = set(graph.outputs) | set(graph.constants)
    remaining: dict[str, int] = {}
    for node in graph.nodes:
        for i in node.inputs:
            if i:
                remaining[i] = remaining.get(i, 0) + 1

    for node in graph.nodes:
        _check_declared(graph, node)
        args = []
        for i in node.inputs:
            if not i:
                args.append(None)
            elif i in env:
                args.append(env[i])
            else:
                raise SaturateError(f"{node.where()} reads '{i}', which is not defined before it")
        results = eval_node(node, args, graph.opset)
        for out, value in zip(node.outputs, results):
            if out and (remaining.get(out) or out in pinned):
                env[out] = value
        # Free each input once its last reader has run, keeping outputs and constants.
        del args, results
        for i in node.inputs:
            if i:
                remaining[i] -= 1
                if remaining[i] == 0 and i not in pinned:
                    env.pop(i, None)

    outputs: dict[str, np.ndarray] = {}
    for name in graph.outputs:
        if name not in env:
            raise SaturateError(f"graph output '{name}' is not defined")
        value = env[name]
        if value is None:        # an empty optional
            outputs[name] = None
            continue
        # Never hand out a constant, an input, or a view into one: callers may write to results.
        if name in graph.constants or name in graph.inputs or is_sequence(value) or not value.flags.owndata:
            value = copy_value(value)
        outputs[name] = value
    return outputs
