"""Frontends: ONNX import/export, the readable text form, and built-in example models."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from saturate.core.errors import SaturateError
from saturate.core.fileio import check_writable, same_file, write_atomic
from saturate.core.ir import Graph
from saturate.core.inputs import open_regular
from saturate.core.limits import check_bytes, max_memory_bytes
from saturate.core.mapped import current_arena, write_pieces

if TYPE_CHECKING:
    # onnx is imported where a model is read: the engine reaches this package (frontend.infer),
    # and `saturate optimize --help` goes without onnx.
    import onnx

TEXT_SUFFIXES = (".sat", ".txt")


def load_graph(spec: str) -> Graph:
    """Load a graph from a .onnx file, a text graph (.sat), `example:NAME` or `corpus:NAME`."""
    if spec.startswith("example:"):
        from saturate.frontend import examples

        return examples.build(spec[len("example:"):])
    if spec.startswith("corpus:"):
        # A real exported model from frontend/corpus, its weights refilled from a fixed seed.
        from saturate.frontend import corpus, onnx_io

        model = corpus.load_model(spec[len("corpus:"):])
        try:
            return onnx_io.import_model(model)
        except SaturateError as err:
            raise SaturateError(f"{spec}: {err}") from None
    path = Path(spec)
    data = read_regular_file(path, "model")
    if path.suffix.lower() in TEXT_SUFFIXES:
        try:
            source = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SaturateError(f"{spec}: not a text graph (not UTF-8)") from None
        del data
        from saturate.frontend import onnx_export, text

        graph = text.parse_graph(source, file=str(spec))
        try:
            onnx_export.check_types(graph)
        except SaturateError as err:
            raise SaturateError(f"{spec}: {err}") from None
        return graph
    import onnx
    from google.protobuf.message import DecodeError

    from saturate.frontend import onnx_io

    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError):
        raise SaturateError(f"{spec}: not an ONNX model (protobuf decoding failed)") from None
    # The file's bytes are not kept: for big models they are as large as the weights.
    del data
    if not model.HasField("graph") or not model.opset_import:
        raise SaturateError(f"{spec}: not an ONNX model (no graph or opset)")
    try:
        mapped = _load_external_data(model, path)
        return onnx_io.import_model(model, mapped)
    except SaturateError as err:
        raise SaturateError(f"{spec}: {err}") from None


def read_regular_file(path: Path, what: str, offset: int = 0, length: int | None = None) -> bytes:
    """The bytes of a regular file (`length` bytes from `offset`, else all of it), the size read
    checked against the memory limit first. Anything else (a FIFO, a device) is refused without
    reading (core/inputs.py's open_regular): a FIFO would block and /dev/zero never ends."""
    if not os.path.lexists(path):
        raise SaturateError(f"{path}: no such file")
    if path.is_dir():
        raise SaturateError(f"{path}: is a directory, not a {what}")
    # A whole file must fit the limit; a slice of one (external data) is checked by its own size.
    limit = max_memory_bytes() if length is None else sys.maxsize
    with open_regular(path, limit, what) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            available = max(size - offset, 0)
            wanted = available if length is None else length
            if offset > size or wanted > available:
                raise SaturateError(f"{path}: {wanted} bytes at offset {offset} asked for, but the file "
                                    f"holds {size} bytes")
            check_bytes(wanted, f"{path}: reading this {what}")
            f.seek(offset)
            data = f.read(wanted)
        except OSError as err:
            raise SaturateError(f"{path}: cannot read: {err.strerror or err}") from None
    if len(data) != wanted:
        raise SaturateError(f"{path}: cannot read: the file changed while it was read")
    return data


def save_graph(graph: Graph, path: str, keep_data_file: bool = False) -> None:
    """Write `graph` as ONNX or text (by extension), atomically: temp file, then rename.

    With `keep_data_file`, an ONNX output keeps referring to the weights that are still in an
    input's external data file in the output's folder (nothing of them is copied); the others
    go to the output's own data file."""
    target = Path(path)
    if target.suffix.lower() in TEXT_SUFFIXES:
        from saturate.frontend import text

        pieces = [text.print_graph(graph).encode("utf-8")]
    else:
        from saturate.frontend import onnx_io

        if keep_data_file or sum(a.nbytes for a in graph.constants.values()) > EXTERNAL_DATA_BYTES:
            # Protobuf cannot hold 2 GB: the weights go to a file beside the model, written first.
            # Weights folded beside it (core.mapped.folds_beside) are already in place there.
            data_name = f"{target.name}.data"
            arena = current_arena()
            if arena is not None and (arena.name != data_name or not same_file(arena.folder, target.parent or ".")):
                arena = None
            folder = target.resolve().parent if keep_data_file else None
            pieces, chunks, adopted = onnx_io.external_pieces(graph, data_name, arena, folder)
            check_writable(target)
            if chunks or adopted:      # every weight kept where it was: no data file of its own
                write_atomic(target.parent / data_name, lambda f: write_pieces(f, chunks),
                             adopt=arena.adopt() if adopted else None)
        else:
            pieces = onnx_io.model_pieces(graph)
    write_atomic(target, lambda f: write_pieces(f, pieces))


# Weights beyond this many bytes are saved as external data (protobuf's limit is 2 GB).
EXTERNAL_DATA_BYTES = 2**31 - 2**27


def _load_external_data(model: onnx.ModelProto, path: Path) -> dict[str, np.ndarray]:
    """Tensors stored beside the model (ONNX spec: a location relative to the model's folder).

    Every location must stay inside that folder once symbolic links are resolved, name a regular
    file, and hold exactly the bytes the tensor's dims and type need; the size is checked before
    anything is read. onnx's own loader is not used: it opens whatever the location names.
    A large initializer is not read: it is returned (by name) as a read-only view of its file's
    mapping, and stays external in `model`; any other tensor's bytes are read into the model.
    """
    import onnx
    from onnx import external_data_helper

    from saturate.core.mapped import DataFiles
    from saturate.frontend import onnx_io

    # The graph's own initializers come first (then those of subgraphs, then attributes).
    top = len(model.graph.initializer)
    tensors = [(k < top, t) for k, t in enumerate(external_data_helper._get_all_tensors(model))
               if t.data_location == onnx.TensorProto.EXTERNAL]
    if not tensors:
        return {}
    files, arrays = DataFiles(), {}
    folder = path.resolve().parent
    for initializer, t in tensors:
        what = f"external data of tensor '{t.name}'"
        keys = {e.key: e.value for e in t.external_data}
        location = keys.get("location", "")
        if not location or "\0" in location:
            raise SaturateError(f"{what}: no file location given")
        if Path(location).is_absolute() or ".." in Path(location).parts:
            raise SaturateError(f"{what}: location '{location}' is not a path inside the model's folder")
        source = (folder / location).resolve()
        if folder not in source.parents:
            raise SaturateError(f"{what}: location '{location}' leads outside the model's folder")
        try:
            offset = int(keys.get("offset", "0"))
            length = int(keys["length"]) if "length" in keys else None
        except ValueError:
            raise SaturateError(f"{what}: offset and length must be integers") from None
        if offset < 0 or (length is not None and length < 0):
            raise SaturateError(f"{what}: negative offset or length")
        # Its dims against the memory limit first (import_model checks every other tensor).
        onnx_io.check_tensor(t, f"tensor '{t.name}'")
        needed = onnx_io.raw_size(t, f"tensor '{t.name}'")
        if needed is None:
            raise SaturateError(f"{what}: {onnx_io.dtype_name(t.data_type)} tensors cannot be stored externally")
        if length is not None and length != needed:
            raise SaturateError(f"{what}: {length} bytes declared; {onnx_io.describe(t)} needs {needed}")
        try:
            # Only initializers the skeleton (onnx_io._without_weights) leaves out: no checker
            # or inference ever sees a tensor without its data.
            if initializer and onnx_io.mappable(t) and t.name not in arrays:
                arrays[t.name] = files.array(source, offset, needed, onnx_io.raw_dtype(t), tuple(t.dims))
                continue
            t.raw_data = read_regular_file(source, "external data file", offset, needed)
        except SaturateError as err:
            raise SaturateError(f"{what}: {err}") from None
        t.data_location = onnx.TensorProto.DEFAULT
        del t.external_data[:]
    return arrays


__all__ = ["load_graph", "save_graph"]
