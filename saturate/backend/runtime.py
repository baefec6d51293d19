"""C backend, runtime stage: load a compiled model's Python extension module (binding.pyx) and call it on
numpy arrays; install a build into an output directory."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from saturate.backend.build import (BLAS_FILE, BUILD_FILES, EXTENSION, MODULE, BuildConfig, build, mismatch, runs_here,
                                    verify)
from saturate.backend.cache import read_small
from saturate.backend.capi import api_source, header
from saturate.backend.emit import Emitted, emit
from saturate.backend.segments import Partition, Piece, partition
from saturate.backend.shapes import HELD, INDEX_DTYPES
from saturate.core.errors import SaturateError
from saturate.core.ir import Graph
from saturate.core.limits import check_allocation, check_bytes

# Extension modules loaded in this process: resolved path -> (build key, module).
_MODULES: dict[str, tuple[str, object]] = {}


def load_module(directory: Path):
    """The compiled model's extension module in `directory`, loaded once per build. The dynamic loader
    hands back a library it already holds by file name, so a directory rebuilt since it was loaded is
    loaded from a fresh copy of the module instead of returning the old code."""
    path = Path(directory) / EXTENSION
    if not path.is_file():
        raise SaturateError(f"{directory}: no compiled model ({EXTENSION} is missing); "
                            "write one with 'saturate compile MODEL -o DIR'")
    runs_here(directory)
    verify(directory)
    try:
        key = read_small(Path(directory) / "build.key")
    except OSError as err:
        raise SaturateError(f"{directory}: cannot load build.key: {err.strerror or err}; compile the model again") \
            from None
    real = str(path.resolve())
    if real in _MODULES and _MODULES[real][0] == key:
        return _MODULES[real][1]
    with tempfile.TemporaryDirectory(prefix="saturate-module-") as tmp:
        source = path
        if real in _MODULES:
            # The copy finds OpenBLAS without it beside it: the loader matches the needed name to the
            # library of that soname the first load of this path brought in.
            source = Path(tmp) / EXTENSION
            shutil.copyfile(path, source)
        spec = importlib.util.spec_from_file_location(MODULE, source)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ImportError as err:
            raise SaturateError(f"{path}: cannot load the compiled model ({str(err).splitlines()[0]})") from None
    _MODULES[real] = (key, module)
    return module


class Segment:
    """One C segment loaded from its directory: float32 arrays in, float32 arrays out. `emitted` (the
    program and its plan) is known when this process compiled it, None when loaded from a directory."""

    def __init__(self, directory: Path, emitted: Emitted | None = None):
        self.emitted = emitted
        self.directory = Path(directory)
        self.module = load_module(self.directory)
        # What the model allocates (its workspace now, outputs at each call) and what a call takes, against
        # the memory limit before any of it is allocated.
        for side, values in (("input", self.module.INPUTS), ("output", self.module.OUTPUTS)):
            for name, shape, _ in values:
                check_allocation(shape, 4, f"{self.directory}: {side} '{name}'")
        check_bytes(int(self.module.WORKSPACE_BYTES), f"{self.directory}: the workspace")
        try:
            self.model = self.module.Model(str(self.directory / "weights.bin"))
        except (OSError, ValueError) as err:
            raise SaturateError(str(err)) from None
        self.inputs = [(name, shape) for name, shape, _ in self.module.INPUTS]
        self.outputs = [(name, shape) for name, shape, _ in self.module.OUTPUTS]
        self.workspace_bytes = int(self.module.WORKSPACE_BYTES)

    def run(self, arrays: list[np.ndarray], n: int) -> list[np.ndarray]:
        """Run on contiguous float32 arrays of the planned shapes, on `n` threads."""
        try:
            return self.model.run(arrays, n)
        except (TypeError, ValueError, RuntimeError, IndexError) as err:
            raise SaturateError(str(err)) from None

    def scratch_bytes(self, threads: int) -> int:
        """Heap the kernels hold at the peak of a call on `threads` threads, beyond the workspace (measured)."""
        return int(self.model.scratch_bytes(threads))

    def step_seconds(self) -> list[tuple[str, float]]:
        """Accumulated seconds per step (profiling builds only): (nodes of the step, seconds)."""
        steps = self.emitted.plan.steps if self.emitted is not None else []
        times = self.model.step_seconds(len(steps))
        if times is None or self.emitted is None:
            raise SaturateError("not a profiling build: compile with profile=True")
        return [("+".join(n.op for n in s.nodes()), float(t)) for s, t in zip(steps, times)]


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
        # A graph that is one C segment taking the graph's inputs and giving its outputs is called straight
        # through the module's Model.call (arrays in order or one dict; it checks each array itself and
        # returns the dict); anything it refuses takes _call, whose messages name the problem in the
        # model's terms.
        whole = len(segments) == 1 and len(part.pieces) == 1 and part.pieces[0].kind == "c"
        direct = whole and [n for n, _ in segments[0].inputs] == [n for n, _ in self.inputs] \
            and [n for n, _ in segments[0].outputs] == [o for o, _ in self.outputs] \
            and all(part.dtypes.get(n) == "float32" for n, _ in [*self.inputs, *self.outputs])
        self._direct_call = segments[0].model.call if direct else None

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
        if self._direct_call is not None and not kwargs:
            try:
                return self._direct_call(args, threads or self.threads)
            except (TypeError, ValueError):
                pass
            except RuntimeError as err:
                raise SaturateError(str(err)) from None
        return self._call(args, kwargs, int(threads or self.threads))

    def _call(self, args, kwargs, n: int) -> dict[str, np.ndarray]:
        from saturate.interp import eval_node

        arrays = self._arrays(args, kwargs)
        if n < 1:
            raise SaturateError(f"thread count must be at least 1, got {n}")
        g = self.partition.graph
        env: dict[str, np.ndarray] = {name: a for (name, _), a in zip(self.inputs, arrays)}
        segments = iter(self.segments)
        for piece in self.partition.pieces:
            if piece.kind == "c":
                seg = next(segments)
                outs = seg.run([self._c_input(env[i], i, shape, self.partition.indices.get(i))
                                for i, (_, shape) in zip(piece.inputs, seg.inputs)], n)
                # integers and bools come out of C as floats of their values (shapes.HELD)
                env.update((o, v if self.partition.dtypes.get(o) in (None, "float32")
                            else v.astype(self.partition.dtypes[o])) for o, v in zip(piece.outputs, outs))
                continue
            for node in piece.nodes:
                args = [None if not i else env[i] if i in env else g.constants[i] for i in node.inputs]
                env.update((o, r) for o, r in zip(node.outputs, eval_node(node, args, g.opset)) if o)
        return {o: _output(env[o] if o in env else g.constants[o]) for o, _ in self.outputs}

    @staticmethod
    def _c_input(value: np.ndarray, name: str, shape: tuple, index: tuple[int, str] | None = None) -> np.ndarray:
        """An input or interpreter result handed to a C segment: it must have the shape the segment was planned
        for. Indices (`index`: the axis they pick from and its node) must pick inside it."""
        a = np.asarray(value)
        if index is not None and a.dtype.name in INDEX_DTYPES and a.size:
            n, where = index
            lo, hi = int(a.min()), int(a.max())
            if lo < -n or hi >= n:
                raise SaturateError(f"{where}: index {lo if lo < -n else hi} in '{name}' is out of range for an axis "
                                    f"of {n} (indices go from {-n} to {n - 1})")
            a = a.astype(np.float32)
        if a.dtype.name in HELD:  # quantized values and bools enter C as floats of the same values
            a = a.astype(np.float32)
        if a.dtype != np.float32 or tuple(a.shape) != tuple(shape):
            raise SaturateError(f"value '{name}' came out of the interpreter as {a.dtype}{list(a.shape)}; the next C "
                                f"segment was compiled for float32{list(shape)}")
        return a if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(a.shape)

    def step_seconds(self) -> list[tuple[str, float]]:
        """Accumulated seconds per C step (profiling builds only): (nodes of the step, seconds)."""
        return [row for s in self.segments for row in s.step_seconds()]

    def scratch_bytes(self, threads: int | None = None) -> int:
        """What the kernels allocate beyond `workspace_bytes` at `threads` threads (each extra thread's conv
        scratch, per-thread buffers kept between calls), measured on one call per segment on zeros; summed
        over segments, so at most what a call holds at once."""
        return sum(s.scratch_bytes(int(threads or self.threads)) for s in self.segments)


def _output(value: Any) -> Any:
    """A graph output as the interpreter gives it: an array, or a sequence (a list of arrays) or
    empty optional (None) that an interpreter segment made, as they are."""
    return value if value is None or isinstance(value, list) else np.array(value)


def compile_graph(graph: Graph, threads: int = 1, out_dir: str | Path | None = None,
                  input_shapes: dict | None = None, sanitize: bool = False, profile: bool = False,
                  config: BuildConfig | None = None) -> CompiledModel:
    """Partition, emit, compile (cached by hash) and load a graph; returns a callable on numpy arrays.

    `config` says how to build (BuildConfig.from_env() with `sanitize` and `profile` when not given): the
    settings are read once, here, for every segment.

    With `out_dir`, a graph that is one C segment on float32 inputs and outputs, giving every output, is
    installed there (model.c, model.h, weights.bin, model.so, the extension module, a copy of OpenBLAS they
    find beside them, build.key, build.json); any other graph (cut by interpreter nodes, or with an output
    that is an input or a constant) gets segment k in `out_dir`/segK plus manifest.json and graph.onnx
    (what the interpreter runs and those outputs come from). The directory is assembled beside its final
    name and renamed into place, so it never mixes two builds."""
    config = config or BuildConfig.from_env(sanitize=sanitize, profile=profile)
    root = Path(out_dir) if out_dir else None
    if root is not None:
        check_output_dir(root)
    part = partition(graph, input_shapes)
    c_pieces = [p for p in part.pieces if p.kind == "c"]
    # One C segment is installed alone only when it takes and gives float32: integers (quantized values)
    # cross C as floats of their values, and the cut layout's graph.onnx keeps their dtypes for load().
    # It must also give every graph output: one that is an input or a constant comes from graph.onnx.
    floats = all(part.dtypes.get(n) == "float32" for n in [*(i for i, _, _ in part.inputs), *part.graph.outputs])
    whole = (len(part.pieces) == 1 and len(c_pieces) == 1 and floats
             and set(part.graph.outputs) <= set(c_pieces[0].outputs))
    built = []
    for piece in c_pieces:
        emitted = emit(piece.graph, None, config)
        built.append((emitted, build(emitted.source + api_source(emitted), emitted.weights,
                                     header(emitted, piece.graph.name), config)))
    if root is None:
        segments = [Segment(d, e) for e, d in built]
        return CompiledModel(part, segments, segments[0].directory if whole else None, threads)
    install(root, [d for _, d in built], whole, part, graph, input_shapes)
    dirs = [root] if whole else [root / f"seg{k}" for k in range(len(built))]
    return CompiledModel(part, [Segment(d, e) for (e, _), d in zip(built, dirs)], root, threads)


# What a compiled output directory may hold besides BUILD_FILES and segK/ folders (cut graphs; a graph
# past 2 GB keeps its weights in graph.onnx.data).
CUT_FILES = ("manifest.json", "graph.onnx", "graph.onnx.data")


def check_output_dir(root: Path) -> None:
    """An output directory is new, empty or an earlier compiled model (which a compile replaces whole);
    anything else is refused rather than deleted."""
    if root.exists() and not root.is_dir():
        raise SaturateError(f"{root}: exists and is not a directory; compile writes a directory")
    if root.is_dir():
        names = {p.name for p in root.iterdir()}
        ours = set(BUILD_FILES) | set(CUT_FILES)
        foreign = sorted(n for n in names if n not in ours and not (n.startswith("seg") and n[3:].isdigit()))
        if foreign and names:
            raise SaturateError(f"{root}: holds files that are not a compiled model ({', '.join(foreign[:3])}"
                                f"{', ...' if len(foreign) > 3 else ''}); choose a new or empty directory")


def install(root: Path, built: list[Path], whole: bool, part: Partition, graph: Graph,
            input_shapes: dict | None) -> None:
    """Copy finished builds into a fresh directory beside `root`, then swap it into place: an interrupted
    compile leaves either the old directory or the new one, never new weights beside an old library. The
    copies are checked against the digests their build recorded before the swap, so a cache entry changed
    meanwhile never replaces a good directory; a full disk or unwritable folder is one line, `root` as it was."""
    try:
        _install(root, built, whole, part, graph, input_shapes)
    except OSError as err:
        where = f" ({err.filename})" if err.filename else ""
        raise SaturateError(f"cannot write {root}{where}: {err.strerror or err}") from None


def _install(root: Path, built: list[Path], whole: bool, part: Partition, graph: Graph,
             input_shapes: dict | None) -> None:
    root.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}."))
    old = None
    try:
        mask = os.umask(0)
        os.umask(mask)
        first_blas = None
        for k, src in enumerate(built):
            dest = stage if whole else stage / f"seg{k}"
            dest.mkdir(exist_ok=True)
            for name in BUILD_FILES:
                if name == BLAS_FILE and first_blas is not None:
                    _link_or_copy(first_blas, dest / name)
                else:
                    # A real copy, never a link into the cache: the directory is shipped on its own.
                    shutil.copyfile(src / name, dest / name)
            first_blas = first_blas or dest / BLAS_FILE
            problem = mismatch(dest)
            if problem is not None:
                raise SaturateError(f"the cached build {src} changed while it was copied ({problem}); "
                                    f"{root} is left as it was: compile again")
            if not whole:
                dest.chmod(0o777 & ~mask)
        if not whole:
            from saturate.frontend import save_graph

            write_manifest(stage / "manifest.json", part, input_shapes)
            save_graph(graph, str(stage / "graph.onnx"))
        stage.chmod(0o777 & ~mask)
        if root.exists():
            old = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}.old."))
            os.rename(root, old / root.name)
        try:
            os.rename(stage, root)
        except OSError:
            if old is not None:  # put the earlier directory back rather than lose both
                os.rename(old / root.name, root)
            raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _link_or_copy(src: Path, dest: Path) -> None:
    """The segments of a cut graph share one OpenBLAS copy inside the output directory (hard links; a copy
    where the file system has none)."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def load(directory: str | Path, threads: int = 1) -> CompiledModel:
    """A model `saturate compile -o DIR` wrote, loaded through its extension module: the same callable
    compile_graph returns. A cut graph's interpreter pieces come from DIR/graph.onnx."""
    root = Path(directory)
    if not root.is_dir():
        raise SaturateError(f"{root}: not a directory of a compiled model")
    manifest = root / "manifest.json"
    if not manifest.is_file():
        seg = Segment(root)
        g = Graph(inputs=[n for n, _ in seg.inputs], outputs=[n for n, _ in seg.outputs], name=root.name)
        piece = Piece("c", [], list(g.inputs), list(g.outputs))
        shapes = dict(seg.inputs + seg.outputs)
        part = Partition(g, [piece], shapes, {n: "float32" for n in shapes},
                         [(n, shape, "float32") for n, shape in seg.inputs], [])
        return CompiledModel(part, [seg], root, threads)
    from saturate.frontend import load_graph

    try:
        data = json.loads(read_small(manifest))
        shapes = {name: tuple(shape) for name, shape in data["input_shapes"].items()}
        pieces = data["pieces"]
        _check_manifest(shapes, pieces)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise SaturateError(f"{manifest}: not a manifest saturate wrote") from None
    part = partition(load_graph(str(root / "graph.onnx")), shapes)
    if [(p.kind, p.inputs, p.outputs) for p in part.pieces] != [(p["kind"], p["inputs"], p["outputs"]) for p in pieces]:
        raise SaturateError(f"{manifest}: its pieces do not match {root / 'graph.onnx'}; compile the model again")
    segments = [Segment(root / p["dir"]) for p in pieces if p["kind"] == "c"]
    return CompiledModel(part, segments, root, threads)


def _check_manifest(shapes: dict, pieces: Any) -> None:
    """ValueError unless the manifest's parts have the types write_manifest gives them: dims are
    ints, pieces are objects of a kind, value names and (a C piece) the name of a folder of the
    compiled directory itself."""
    if not all(isinstance(n, str) and all(type(d) is int for d in dims) for n, dims in shapes.items()):
        raise ValueError("input shapes")
    if not isinstance(pieces, list):
        raise ValueError("pieces")
    for p in pieces:
        names = [v for key in ("inputs", "outputs") for v in p[key]]
        if not (isinstance(p["kind"], str) and isinstance(p["inputs"], list) and isinstance(p["outputs"], list)
                and all(isinstance(v, str) for v in names)):
            raise ValueError("piece")
        if p["kind"] == "c" and not (isinstance(p["dir"], str) and p["dir"] not in ("", ".", "..")
                                     and Path(p["dir"]).name == p["dir"]):
            raise ValueError("piece folder")


def write_manifest(path: Path, part: Partition, input_shapes: dict | None = None) -> None:
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
    shapes = {name: list(map(int, shape)) for name, shape in (input_shapes or {}).items()}
    path.write_text(json.dumps({"graph": part.graph.name, "input_shapes": shapes, "pieces": pieces}, indent=1) + "\n",
                    encoding="utf-8")
