"""An onnxsim-style API, `simplify(model) -> (model, ok)`, and what it shares with `saturate optimize`:
input shapes overridden before optimizing, rules skipped by name, and the check of a result
against ONNX Runtime on random inputs."""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from saturate.core.errors import SaturateError
from saturate.core.ir import Graph, ValueInfo
from saturate.core.limits import check_allocation

# The largest relative error (max |got - want| over max |want|, per output) a check allows: the
# tolerance the project's other comparisons with ONNX Runtime use (tests/test_corpus.py).
CHECK_TOLERANCE = 1e-4
# An output in a less precise float type is allowed this many of its machine epsilons (see tolerance).
EPSILONS = 4


class Unchecked(Exception):
    """The check could not run: ONNX Runtime is missing or cannot run the input model."""


@dataclass
class CheckFailure:
    """A result that differs from its input: the output, its error, on which random input."""

    output: str
    error: float
    sample: int
    samples: int
    detail: str = ""
    step: float = 0.0   # a quantized output's step: `error` is then absolute
    allowed: float = CHECK_TOLERANCE     # the relative error allowed the output (its dtype's)

    def __str__(self) -> str:
        if self.detail:
            return f"check against ONNX Runtime failed: {self.detail}"
        if self.step:
            return (f"check against ONNX Runtime failed: output '{self.output}' differs by "
                    f"{self.error / self.step:.3g} quantization steps of {self.step:.3g} (allowed 1) "
                    f"on random input {self.sample} of {self.samples}")
        return (f"check against ONNX Runtime failed: output '{self.output}' differs by a relative error of "
                f"{self.error:.3g} (allowed {self.allowed:.2g}) on random input {self.sample} of {self.samples}")


def simplify(model: Any, check_n: int = 1, overwrite_input_shapes: Mapping[str, Sequence[int]] | None = None,
             skip_rules: Iterable[str] = (), *, rules: Iterable[str | os.PathLike] | None = None, level: int = 3,
             target: str = "cpu", preserve: Iterable[str] = (), **options: Any):
    """Optimize an ONNX model as `saturate optimize` does; returns (onnx.ModelProto, ok).

    `model` is an onnx.ModelProto (left unchanged) or a path (.onnx, a text graph, example:NAME).
    `check_n` random inputs are run through the input and the result in ONNX Runtime: `ok` is
    False when an output differs by more than its dtype's `tolerance` (True with check_n=0,
    and, with a warning, when ONNX Runtime is missing or cannot run the input model).
    `overwrite_input_shapes` maps input names to static shapes; `skip_rules` names rules not to
    use; `rules` are more rules files or directories, loaded beside the standard library.
    Further keywords go to saturate.pipeline.optimize (timeout, max_nodes, ...)."""
    import onnx

    from saturate.frontend import load_graph
    from saturate.frontend.onnx_io import import_model
    from saturate.lang.parser import RULES_DIR, load_rules
    from saturate.pipeline import optimize

    if check_n < 0:
        raise SaturateError(f"check_n must be 0 or more, not {check_n}")
    if isinstance(model, onnx.ModelProto):
        graph = import_model(model)
    elif isinstance(model, (str, os.PathLike)):
        graph = load_graph(os.fspath(model))
    else:
        raise SaturateError(f"simplify takes an onnx.ModelProto or a path, not {type(model).__name__}")
    if overwrite_input_shapes:
        graph = with_input_shapes(graph, {k: _dims(k, v) for k, v in overwrite_input_shapes.items()})
    chosen = without_rules(load_rules([RULES_DIR, *map(os.fspath, rules or ())], level=level), skip_rules)
    result, _ = optimize(graph, chosen, level=level, target=target, preserve=tuple(preserve), **options)
    ok = True
    if check_n:
        try:
            ok = check_outputs(graph, result, check_n) is None
        except Unchecked as why:
            warnings.warn(f"saturate.simplify: not checked against ONNX Runtime: {why}", stacklevel=2)
    return to_model(result), ok


def _dims(name: str, dims: Any) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in dims)
    except (TypeError, ValueError):
        shape = ()
    if not shape or any(d < 1 for d in shape):
        raise SaturateError(f"overwrite_input_shapes['{name}']: expected positive sizes, not {dims!r}")
    return shape


def to_model(graph: Graph):
    """The ONNX model saturate would write for `graph`, checked as a written one is."""
    import onnx

    return onnx.load_from_string(to_bytes(graph))


def to_bytes(graph: Graph) -> bytes:
    """`graph` as the .onnx bytes saturate writes (serialized piece by piece: no weight copied twice)."""
    from saturate.frontend.onnx_io import model_pieces

    return b"".join(model_pieces(graph))


def without_rules(rules: list, names: Iterable[str]) -> list:
    """`rules` but those named in `names`; a name no loaded rule has is an error (a typo would
    otherwise skip nothing)."""
    skip = set(names)
    unknown = sorted(skip - {r.name for r in rules})
    if unknown:
        raise SaturateError(f"no rule named '{unknown[0]}' to skip among the rules loaded")
    return [r for r in rules if r.name not in skip]


def with_input_shapes(graph: Graph, shapes: Mapping[str, tuple[int, ...]]) -> Graph:
    """`graph` with these inputs given static shapes, every other shape inferred again from them
    (the model is exported and imported once more: ONNX's inference does the work)."""
    from saturate.commands.compile import check_shapes
    from saturate.frontend.onnx_io import export_model, import_model, type_proto

    check_shapes(graph, shapes)
    model = export_model(graph)
    for vi in model.graph.input:
        if vi.name in shapes:
            info = graph.info(vi.name)
            vi.type.CopyFrom(type_proto(ValueInfo(info.dtype, tuple(shapes[vi.name]))))
    # Values typed under the old shapes would contradict the new ones: inference starts afresh.
    model.graph.ClearField("value_info")
    try:
        shaped = import_model(model)
    except SaturateError as err:
        raise SaturateError(f"--input-shape: {err}") from None
    # What import read beside the model's fields (the nodes it marks as preserved) is kept.
    shaped.meta = {**graph.meta, **shaped.meta}
    return shaped


def check_outputs(before: Graph, after: Graph, samples: int, seed: int = 0,
                  after_model: bytes | None = None) -> CheckFailure | None:
    """Run both graphs in ONNX Runtime on `samples` random inputs (a symbolic dim taken as 1) and
    compare every output: the first difference over its tolerance (`tolerance` of its dtype; one
    quantization step for an output a DequantizeLinear writes, see quantization_steps), or None.
    `after_model` is `after` serialized, when it is not what export_model makes of it (a
    partitioned graph's functions). Raises Unchecked when ONNX Runtime is missing or cannot run
    `before`.

    One session at a time: the input's runs are done and its session freed (the pages of its
    mapped weights given back) before the result's is built, so a model of several GB is held
    once, not twice."""
    try:
        import onnxruntime  # noqa: F401  (only to know it is there)
    except ImportError:
        raise Unchecked("onnxruntime is not installed (pip install onnxruntime; --check 0 skips "
                        "the check)") from None
    for graph in (before, after):
        _check_value_sizes(graph)
    feeds = [_random_feed(before, seed + k) for k in range(samples)]
    try:
        session = _session(before)
    except Exception as err:
        raise Unchecked(f"ONNX Runtime cannot load the input model: {_first_line(err)}") from None
    names = [o.name for o in session.get_outputs()]
    wants = []
    for feed in feeds:
        try:
            wants.append(dict(zip(names, run_interruptibly(session, names, {**feed, **session.saturate_feed}))))
        except Exception as err:
            raise Unchecked(f"ONNX Runtime cannot run the input model on a random input: {_first_line(err)}") from None
    del session
    _give_back(before)
    try:
        session = _session(after, after_model)
    except Exception as err:
        return CheckFailure("", 0.0, 1, samples, f"ONNX Runtime cannot load the result: {_first_line(err)}")
    try:
        return _compare(session, names, feeds, wants, quantization_steps(before))
    finally:
        del session
        _give_back(after)


def run_interruptibly(session: Any, names: list[str], feed: dict) -> list[Any]:
    """`session.run(names, feed)` in a thread of its own while this one waits, so that SIGINT and
    SIGTERM end it: ONNX Runtime's run returns to Python only when done, and a model may ask for a
    Loop of 2^62 iterations; the signal's exception here sets the run's terminate flag (ONNX Runtime
    then stops within milliseconds) and goes on once the run has ended."""
    import threading

    import onnxruntime

    options = onnxruntime.RunOptions()
    # The run's own log would add a line of ONNX Runtime's to saturate's one when a signal stops it.
    options.log_severity_level = 4
    done: dict[str, Any] = {}
    # Waited on, not the thread: a join interrupted by a signal can leave a thread marked as ended
    # while it runs on, and the process then exits under ONNX Runtime (which aborts it).
    finished = threading.Event()

    def work() -> None:
        try:
            done["out"] = session.run(names, feed, options)
        except BaseException as err:  # noqa: BLE001  (raised again in the waiting thread)
            done["err"] = err
        finally:
            finished.set()

    threading.Thread(target=work, name="saturate-check-run", daemon=True).start()
    try:
        while not finished.wait(0.05):
            pass
    except BaseException:
        options.terminate = True
        finished.wait()
        raise
    if "err" in done:
        raise done["err"]
    return done["out"]


def _compare(session: Any, names: list[str], feeds: list[dict], wants: list[dict],
             steps: dict[str, float]) -> CheckFailure | None:
    """The first output of `session` on `feeds` off its `wants` by more than its tolerance."""
    for k, (feed, want) in enumerate(zip(feeds, wants)):
        try:
            got = dict(zip(names, run_interruptibly(session, names, {**feed, **getattr(session, "saturate_feed", {})})))
        except Exception as err:
            return CheckFailure("", 0.0, k + 1, len(feeds), f"ONNX Runtime cannot run the result: {_first_line(err)}")
        for name in names:
            pairs = _items(got[name], want[name])
            if pairs is None:
                return CheckFailure(name, float("inf"), k + 1, len(feeds), allowed=0.0)
            for got_item, want_item in pairs:
                error = _relative_error(got_item, want_item)
                allowed = tolerance(np.asarray(want_item).dtype)
                if not error <= allowed:        # `not <=`: NaN fails
                    step = steps.get(name)
                    if step is None:
                        return CheckFailure(name, error, k + 1, len(feeds), allowed=allowed)
                    off = _absolute_error(got_item, want_item)
                    if not off <= step * (1 + 1e-6):
                        return CheckFailure(name, off, k + 1, len(feeds), step=step)
    return None


def _items(got: Any, want: Any) -> list[tuple[Any, Any]] | None:
    """An output's tensors paired for comparison: the one tensor, each item of a sequence (ONNX
    Runtime hands one over as a list), none of an empty optional; None when the two differ in
    kind or length."""
    if isinstance(got, list) or isinstance(want, list):
        if not (isinstance(got, list) and isinstance(want, list)) or len(got) != len(want):
            return None
        return list(zip(got, want))
    if got is None or want is None:
        return [] if got is None and want is None else None
    return [(got, want)]


def tolerance(dtype: Any) -> float:
    """The relative error the check allows an output of `dtype`: CHECK_TOLERANCE, or EPSILONS
    machine epsilons of the dtype when that is more (float16: 3.9e-3). A fold rounds a constant
    once where the input rounded at every run, and the same sum taken in another order rounds
    differently: in half precision each such rounding alone is about 5e-4."""
    try:
        eps = float(np.finfo(dtype).eps)
    except (TypeError, ValueError):
        return CHECK_TOLERANCE
    return max(CHECK_TOLERANCE, EPSILONS * eps)


def _random_feed(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feed = {}
    for name in graph.inputs:
        if name not in graph.constants:
            info = graph.info(name)
            shape = tuple(d if isinstance(d, int) else 1 for d in (info.shape or ()))
            # An input no node reads (a graph output as it is) has no output size checked by
            # _check_value_sizes: its declared dims may ask for terabytes. numpy draws 64-bit values.
            check_allocation(shape, 8, f"input '{name}' ({info.dtype}{list(shape)}), drawn by --check,")
            feed[name] = _random_input(rng, shape, info.dtype)
    return feed


def _give_back(graph: Graph) -> None:
    """Give back the pages of `graph`'s mapped weights ONNX Runtime read (they stay in their files)."""
    from saturate.core.mapped import release

    for value in graph.constants.values():
        if isinstance(value, np.ndarray):
            release(value)


def _check_value_sizes(graph: Graph) -> None:
    """One line naming the node and op when a value the check would have ONNX Runtime compute is
    larger than --max-memory (a symbolic dim taken as 1, as the check's inputs do). Sizes are
    known from shape inference; an untrusted model's ConstantOfShape or Expand of terabytes is
    refused here instead of left to ONNX Runtime's allocator."""
    for node in graph.nodes:
        for out in node.outputs:
            info = graph.info(out) if out else None
            if info is None or info.shape is None:
                continue
            shape = tuple(d if isinstance(d, int) else 1 for d in info.shape)
            try:
                itemsize = np.dtype(info.dtype).itemsize
            except TypeError:
                itemsize = 1
            check_allocation(shape, itemsize, f"node '{node.name}' ({node.op}): output '{out}', run by --check,")


def quantization_steps(graph: Graph) -> dict[str, float]:
    """The step (largest scale) of each graph output a DequantizeLinear writes. Integer ops round
    once where the float ops of a QDQ graph round twice (and ONNX Runtime's own QDQ fusions do the
    same): two correct runs may put a value one step apart, so such an output is compared within
    one step."""
    steps = {}
    for node in graph.nodes:
        if (node.op == "DequantizeLinear" and node.outputs and node.outputs[0] in graph.outputs
                and len(node.inputs) > 1 and node.inputs[1] in graph.constants):
            scale = np.abs(np.asarray(graph.constants[node.inputs[1]], np.float64))
            if scale.size and np.isfinite(scale).all():
                steps[node.outputs[0]] = float(scale.max())
    return steps


def _absolute_error(got: Any, want: Any) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    worst = float(np.where(same, 0.0, np.abs(got - want)).max()) if got.size else 0.0
    return float("inf") if np.isnan(worst) else worst


# Weights of at least this many elements go to ONNX Runtime as arrays, not serialized in the model.
_SHARED_ELEMENTS = 64


def _session(graph: Graph, model: bytes | None = None):
    """An ONNX Runtime session that runs `graph` (or `model`, its serialized form) as it is.

    The weights are handed over as the graph's own arrays (external initializers): serializing
    them and ONNX Runtime parsing them back cost most of a check. ORT's own graph rewrites are off:
    they would cost more time than running a small model, and could hide a difference. A weight
    that is a view of a mapped file is an input fed at each run instead (`session.saturate_feed`):
    ONNX Runtime copies external initializers when the session starts, and runs on an input's
    memory where it is, so a model of several GB is not read into memory whole."""
    import onnx
    import onnxruntime as ort

    from saturate.core.mapped import is_mapped
    from saturate.frontend.onnx_io import _fill_tensor, export_model

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # Its warnings and errors would interleave with saturate's one line (an error of its own is
    # reported there, from the exception).
    opts.log_severity_level = 4
    # One thread: starting a pool of them cost more than it saved on one run (a third of a check
    # of MobileNetV2 went to it, more on a busy machine).
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    # Prepacking copies every MatMul's weight into ONNX Runtime's layout: the model twice over.
    opts.add_session_config_entry("session.disable_prepacking", "1")
    # An arena keeps the largest buffers a run needed (a float16 weight cast to float32) to the end.
    opts.enable_cpu_mem_arena = False
    # The default order runs every Cast ONNX Runtime puts before a float16 weight's consumer
    # first, all the float32 copies alive at once; by priority each runs next to its consumer.
    opts.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    arrays: list = []
    feed: dict[str, np.ndarray] = {}
    if model is None:
        proto = export_model(graph, weights=False)
        inputs = {i.name for i in proto.graph.input}
        names = []
        for name, value in graph.constants.items():
            arr = np.asarray(value)
            if arr.size < _SHARED_ELEMENTS or arr.dtype.kind not in "fiub":
                _fill_tensor(proto.graph.initializer.add(), name, arr)
                continue
            arr = np.ascontiguousarray(arr, arr.dtype.newbyteorder("="))
            if is_mapped(arr):
                feed[name] = arr
                if name not in inputs:
                    proto.graph.input.append(onnx.helper.make_tensor_value_info(
                        name, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
                continue
            tensor = proto.graph.initializer.add()
            tensor.name, tensor.data_type = name, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype)
            tensor.dims.extend(arr.shape)
            # Never read: every such tensor's data is given below, and ORT takes it from there.
            tensor.data_location = onnx.TensorProto.EXTERNAL
            tensor.external_data.add(key="location", value="weights-given-by-saturate")
            names.append(name)
            arrays.append(ort.OrtValue.ortvalue_from_numpy(arr))
        opts.add_external_initializers(names, arrays)
        model = proto.SerializeToString()
    session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    session.saturate_weights = (opts, arrays)   # the arrays must live as long as the session
    session.saturate_feed = feed
    return session


def _random_input(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Standard normal floats; 0 and 1 for integers (index-like inputs: token ids) and booleans;
    a few words for strings.
    (saturate.backend.bench.random_input draws alike; importing the backend costs more than a check.)"""
    kind = np.dtype(dtype).kind if dtype != "unknown" else "f"
    if kind in "OUS":  # ONNX strings: short words, the empty one and non-ASCII among them
        return rng.choice(np.array(["", "a", "ab", "x y", "\u00e9t\u00e9", "0.5", "A,b"], object), shape)
    if kind in "iub":
        return rng.integers(0, 2, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype if dtype != "unknown" else np.float32)


def _relative_error(got: Any, want: Any) -> float:
    """max |got - want| over max |want| (its finite values); the same NaN or infinity on both
    sides is no difference, a NaN on one side is an infinite one."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return float("inf")
    if got.dtype.kind in "OUS" or want.dtype.kind in "OUS":  # strings: equal or not
        return 0.0 if np.array_equal(got.astype(str), want.astype(str)) else float("inf")
    got, want = got.astype(np.float64), want.astype(np.float64)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    if same.all():
        return 0.0
    finite = np.isfinite(want)
    scale = max(float(np.abs(want[finite]).max()), 1e-12) if finite.any() else 1.0
    worst = float(np.where(same, 0.0, np.abs(got - want)).max())
    return float("inf") if np.isnan(worst) else worst / scale


def _first_line(err: BaseException) -> str:
    from saturate.core.errors import one_line

    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return one_line(_without_source_location(lines[0]) if lines else type(err).__name__)


_ORT_LOCATION = re.compile(r"(Status Message: )\S+\.(?:h|cc|cpp):\d+ ")


def _without_source_location(text: str) -> str:
    """An ONNX Runtime kernel's message without the C++ file, line and function signature it
    starts with (`Status Message: /src/x.h:164 Status f(const Tensor*, ...) what failed`)."""
    m = _ORT_LOCATION.search(text)
    if m is None:
        return text
    rest = text[m.end():]
    opened = rest.find("(")
    if opened < 0 or "::" not in rest[:opened]:
        return text[:m.start(1)] + m.group(1) + rest
    depth = 0
    for k in range(opened, len(rest)):
        depth += {"(": 1, ")": -1}.get(rest[k], 0)
        if depth == 0:
            tail = rest[k + 1:].removeprefix(" const").lstrip()
            return text[:m.start(1)] + m.group(1) + tail
    return text
