"""C backend, runtime stage: load a compiled model with ctypes and call it on numpy arrays."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import numpy as np

from saturate.backend.build import build
from saturate.backend.emit import Emitted, emit
from saturate.backend.partition import Partition, partition
from saturate.core.errors import SaturateError
from saturate.core.ir import Graph

_FLOAT_PP = ctypes.POINTER(ctypes.c_void_p)


class Segment:
    """One C segment loaded from its shared library: float32 arrays in, float32 arrays out."""

    def __init__(self, emitted: Emitted, directory: Path):
        self.emitted = emitted
        self.directory = Path(directory)
        self.inputs = emitted.inputs
        self.outputs = emitted.outputs
        self.lib = ctypes.CDLL(str(self.directory / "model.so"))
        self.lib.sat_init.argtypes = [ctypes.c_char_p]
        self.lib.sat_run.argtypes = [_FLOAT_PP, _FLOAT_PP, ctypes.c_void_p, ctypes.c_int]
        self.lib.sat_workspace_bytes.restype = ctypes.c_int64
        if self.lib.sat_init(str(self.directory / "weights.bin").encode()) != 0:
            raise SaturateError(f"cannot load weights from {self.directory / 'weights.bin'}")
        self.workspace_bytes = int(self.lib.sat_workspace_bytes())
        # The arena is planned in 64-byte units; start it on a 64-byte boundary too.
        raw = np.empty(self.workspace_bytes // 4 + 32, np.float32)
        skip = (-raw.ctypes.data % 64) // 4
        self._ws = raw[skip:]

    def run(self, arrays: list[np.ndarray], n: int) -> list[np.ndarray]:
        """Run on contiguous float32 arrays of the planned shapes, on `n` threads."""
        outs = [np.empty(shape, np.float32) for _, shape in self.outputs]
        ins = (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays])
        outp = (ctypes.c_void_p * max(len(outs), 1))(*[o.ctypes.data for o in outs])
        rc = self.lib.sat_run(ctypes.cast(ins, _FLOAT_PP), ctypes.cast(outp, _FLOAT_PP),
                              ctypes.c_void_p(self._ws.ctypes.data), n)
        if rc != 0:
            raise SaturateError("compiled model failed to run (weights not loaded)")
        return outs

    def step_seconds(self) -> list[tuple[str, float]]:
        """Accumulated seconds per step (profiling builds only): (nodes of the step, seconds)."""
        if not hasattr(self.lib, "sat_profile"):
            raise SaturateError("not a profiling build: compile with profile=True")
        self.lib.sat_profile.restype = ctypes.POINTER(ctypes.c_double)
        times = self.lib.sat_profile()
        steps = self.emitted.plan.steps
        return [("+".join(n.op for n in s.nodes()), float(times[k])) for k, s in enumerate(steps)]


class CompiledModel:
    """A graph compiled to C segments, with the ops the C backend lacks run by the numpy interpreter
    between them. Call it with arrays (positional, keyword or one dict); it returns {output name:
    array}, like saturate.interp.run_graph. `fallback_ops` lists (op, count, node names) of the
    interpreter's share."""

    def __init__(self, part: Partition, segments: list[Segment], directory: Path | None, threads: int = 1):
        self.partition = part
        self.segments = segments
        self.directory = directory
        self.threads = threads
        self.inputs = [(name, shape) for name, shape, _ in part.inputs]
        self.input_dtypes = {name: dtype for name, _, dtype in part.inputs}
        self.outputs = [(o, part.shapes.get(o)) for o in dict.fromkeys(part.graph.outputs)]
        self.fallback_ops = part.fallback_ops()
        # The one segment of a fully compiled graph (None when the graph is cut or has no C at all).
        self.emitted = segments[0].emitted if len(segments) == 1 else None
        self.workspace_bytes = sum(s.workspace_bytes for s in segments)

    def _arrays(self, args, kwargs) -> list[np.ndarray]:
        if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
            given = dict(args[0])
        else:
            if len(args) > len(self.inputs):
                raise SaturateError(f"model takes {len(self.inputs)} inputs, got {len(args)}")
            given = {name: a for (name, _), a in zip(self.inputs, args)}
            given.update(kwargs)
        unknown = set(given) - {n for n, _ in self.inputs}
        if unknown:
            raise SaturateError(f"unknown input(s) {sorted(unknown)}; the model takes {[n for n, _ in self.inputs]}")
        arrays = []
        for name, shape in self.inputs:
            if name not in given:
                raise SaturateError(f"missing input '{name}' of shape {shape}")
            a = given[name]
            if not isinstance(a, np.ndarray):
                raise SaturateError(f"input '{name}' must be a numpy array, got {type(a).__name__}")
            want = self.input_dtypes[name]
            if a.dtype != np.dtype(want):
                raise SaturateError(f"input '{name}' has dtype {a.dtype}; the compiled model expects {want}")
            if tuple(a.shape) != tuple(shape):
                raise SaturateError(f"input '{name}' has shape {tuple(a.shape)}; the compiled model expects {tuple(shape)}")
            arrays.append(a if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(a.shape))
        return arrays

    def __call__(self, *args, threads: int | None = None, **kwargs) -> dict[str, np.ndarray]:
        from saturate.interp import eval_node

        arrays = self._arrays(args, kwargs)
        n = int(threads or self.threads)
        if n < 1:
            raise SaturateError(f"thread count must be at least 1, got {n}")
        g = self.partition.graph
        env: dict[str, np.ndarray] = {name: a for (name, _), a in zip(self.inputs, arrays)}
        segments = iter(self.segments)
        for piece in self.partition.pieces:
            if piece.kind == "c":
                seg = next(segments)
                outs = seg.run([self._c_input(env[i], i, shape) for i, (_, shape) in zip(piece.inputs, seg.inputs)], n)
                env.update(zip(piece.outputs, outs))
                continue
            for node in piece.nodes:
                args = [None if not i else env[i] if i in env else g.constants[i] for i in node.inputs]
                env.update((o, r) for o, r in zip(node.outputs, eval_node(node, args, g.opset)) if o)
        return {o: np.array(env[o] if o in env else g.constants[o]) for o, _ in self.outputs}

    @staticmethod
    def _c_input(value: np.ndarray, name: str, shape: tuple) -> np.ndarray:
        """An interpreter result handed to a C segment: it must have the shape the segment was planned for."""
        a = np.asarray(value)
        if a.dtype != np.float32 or tuple(a.shape) != tuple(shape):
            raise SaturateError(f"value '{name}' came out of the interpreter as {a.dtype}{list(a.shape)}; the next C "
                                f"segment was compiled for float32{list(shape)}")
        return a if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(a.shape)

    def step_seconds(self) -> list[tuple[str, float]]:
        """Accumulated seconds per C step (profiling builds only): (nodes of the step, seconds)."""
        return [row for s in self.segments for row in s.step_seconds()]


def compile_graph(graph: Graph, threads: int = 1, out_dir: str | Path | None = None,
                  input_shapes: dict | None = None, sanitize: bool = False, profile: bool = False) -> CompiledModel:
    """Partition, emit, compile (cached by hash) and load a graph; returns a callable on numpy arrays.

    A graph that is one C segment builds into `out_dir` itself (model.c, weights.bin, model.so); a graph
    cut by interpreter nodes builds segment k into `out_dir`/segK and writes `out_dir`/manifest.json."""
    part = partition(graph, input_shapes)
    c_pieces = [p for p in part.pieces if p.kind == "c"]
    whole = len(part.pieces) == 1 and len(c_pieces) == 1
    root = Path(out_dir) if out_dir else None
    segments = []
    for k, piece in enumerate(c_pieces):
        emitted = emit(piece.graph, None, sanitize)
        where = None if root is None else (root if whole else root / f"seg{k}")
        segments.append(Segment(emitted, build(emitted.source, emitted.weights, where, sanitize, profile)))
    if root is not None and not whole:
        root.mkdir(parents=True, exist_ok=True)
        write_manifest(root / "manifest.json", part)
    directory = root if root is not None else (segments[0].directory if whole else None)
    return CompiledModel(part, segments, directory, threads)


def write_manifest(path: Path, part: Partition) -> None:
    """The run order of a cut graph: C segments (their directory and values) and interpreter nodes."""
    pieces, k = [], 0
    for p in part.pieces:
        entry = {"kind": p.kind, "inputs": p.inputs, "outputs": p.outputs}
        if p.kind == "c":
            entry["dir"] = f"seg{k}"
            k += 1
        else:
            entry["nodes"] = [{"name": n.name or n.outputs[0], "op": n.op} for n in p.nodes]
        pieces.append(entry)
    path.write_text(json.dumps({"graph": part.graph.name, "pieces": pieces}, indent=1) + "\n", encoding="utf-8")
