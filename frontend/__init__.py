"""Frontends: ONNX import/export, the readable text form, and built-in example models."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from saturate.core.errors import SaturateError
from saturate.core.fileio import check_writable, write_atomic
from saturate.core.ir import Graph
from saturate.core.inputs import open_regular
from saturate.core.limits import check_bytes, max_memory_bytes

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
        from saturate.frontend import text

        return text.parse_graph(source, file=str(spec))
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
        _load_external_data(model, path)
        return onnx_io.import_model(model)
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


def save_graph(graph: Graph, path: str) -> None:
    """Write `graph` as ONNX or text (by extension), atomically: temp file, then rename."""
    target = Path(path)
    if target.suffix.lower() in TEXT_SUFFIXES:
        from saturate.frontend import text

        pieces = [text.print_graph(graph).encode("utf-8")]
    else:
        from saturate.frontend import onnx_io

        if sum(a.nbytes for a in graph.constants.values()) > EXTERNAL_DATA_BYTES:
            # Protobuf cannot hold 2 GB: the weights go to a file beside the model, written first.
            model = onnx_io.export_model(graph)
            data_name = f"{target.name}.data"
            chunks = _externalize(model, data_name)
            check_writable(target)
            write_atomic(target.parent / data_name, lambda f: [f.write(c) for c in chunks])
            pieces = [model.SerializeToString()]
        else:
            pieces = onnx_io.model_pieces(graph)
    write_atomic(target, lambda f: [f.write(p) for p in pieces])


# Weights beyond this many bytes are saved as external data (protobuf's limit is 2 GB).
EXTERNAL_DATA_BYTES = 2**31 - 2**27


def _load_external_data(model: onnx.ModelProto, path: Path) -> None:
    """Read tensors stored beside the model (ONNX spec: a location relative to the model's folder).

    Every location must stay inside that folder once symbolic links are resolved, name a regular
    file, and hold exactly the bytes the tensor's dims and type need; the size is checked before
    anything is read. onnx's own loader is not used: it opens whatever the location names.
    """
    from onnx import external_data_helper

    from saturate.frontend import onnx_io

    tensors = [t for t in external_data_helper._get_all_tensors(model)
               if t.data_location == onnx.TensorProto.EXTERNAL]
    if not tensors:
        return
    folder = path.resolve().parent
    for t in tensors:
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
            t.raw_data = read_regular_file(source, "external data file", offset, needed)
        except SaturateError as err:
            raise SaturateError(f"{what}: {err}") from None
        t.data_location = onnx.TensorProto.DEFAULT
        del t.external_data[:]


def _externalize(model: onnx.ModelProto, data_name: str) -> list[bytes]:
    """Move large initializers' bytes out of `model` into chunks of one data file named `data_name`."""
    chunks: list[bytes] = []
    offset = 0
    for tensor in model.graph.initializer:
        if not tensor.HasField("raw_data") or len(tensor.raw_data) < 1024:
            continue
        raw = tensor.raw_data
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(len(raw)))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        chunks.append(raw)
        offset += len(raw)
    return chunks


__all__ = ["load_graph", "save_graph"]
