"""C backend, runtime stage: load a compiled model with ctypes and call it on numpy arrays."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from saturate.backend.build import build
from saturate.backend.emit import Emitted, emit
from saturate.core.errors import SaturateError
from saturate.core.ir import Graph

_FLOAT_PP = ctypes.POINTER(ctypes.c_void_p)


class CompiledModel:
    """A graph compiled to a shared library. Call it with arrays (positional, keyword or one dict);
    it returns {output name: array}, like saturate.interp.run_graph."""

    def __init__(self, emitted: Emitted, directory: Path, threads: int = 1):
        self.emitted = emitted
        self.directory = Path(directory)
        self.threads = threads
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
            if a.dtype != np.float32:
                raise SaturateError(f"input '{name}' has dtype {a.dtype}; the compiled model expects float32")
            if tuple(a.shape) != tuple(shape):
                raise SaturateError(f"input '{name}' has shape {tuple(a.shape)}; the compiled model expects {tuple(shape)}")
            arrays.append(np.ascontiguousarray(a))
        return arrays

    def __call__(self, *args, threads: int | None = None, **kwargs) -> dict[str, np.ndarray]:
        arrays = self._arrays(args, kwargs)
        outs = [np.empty(shape, np.float32) for _, shape in self.outputs]
        ins = (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays])
        outp = (ctypes.c_void_p * max(len(outs), 1))(*[o.ctypes.data for o in outs])
        n = int(threads or self.threads)
        if n < 1:
            raise SaturateError(f"thread count must be at least 1, got {n}")
        rc = self.lib.sat_run(ctypes.cast(ins, _FLOAT_PP), ctypes.cast(outp, _FLOAT_PP),
                              ctypes.c_void_p(self._ws.ctypes.data), n)
        if rc != 0:
            raise SaturateError("compiled model failed to run (weights not loaded)")
        return {name: o for (name, _), o in zip(self.outputs, outs)}

    def step_seconds(self) -> list[tuple[str, float]]:
        """Accumulated seconds per step (profiling builds only): (nodes of the step, seconds)."""
        if not hasattr(self.lib, "sat_profile"):
            raise SaturateError("not a profiling build: compile with profile=True")
        self.lib.sat_profile.restype = ctypes.POINTER(ctypes.c_double)
        times = self.lib.sat_profile()
        steps = self.emitted.plan.steps
        return [("+".join(n.op for n in s.nodes()), float(times[k])) for k, s in enumerate(steps)]


def compile_graph(graph: Graph, threads: int = 1, out_dir: str | Path | None = None,
                  input_shapes: dict | None = None, sanitize: bool = False, profile: bool = False) -> CompiledModel:
    """Emit, compile (cached by hash) and load a graph; returns a callable on numpy arrays."""
    emitted = emit(graph, input_shapes, sanitize)
    directory = build(emitted.source, emitted.weights, Path(out_dir) if out_dir else None, sanitize, profile)
    return CompiledModel(emitted, directory, threads)
