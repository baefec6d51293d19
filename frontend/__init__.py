"""Frontends: ONNX import/export, the readable text form, and built-in example models."""

from __future__ import annotations

from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from saturate.core.errors import SaturateError
from saturate.core.fileio import check_writable, write_atomic
from saturate.core.ir import Graph

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
    if not path.exists():
        raise SaturateError(f"{spec}: no such file")
    if path.is_dir():
        raise SaturateError(f"{spec}: is a directory, not a model")
    if path.suffix.lower() in TEXT_SUFFIXES:
        try:
            source = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise SaturateError(f"{spec}: not a text graph (not UTF-8)") from None
        from saturate.frontend import text

        return text.parse_graph(source, file=str(spec))
    from saturate.frontend import onnx_io

    model = onnx.ModelProto()
    try:
        # The file's bytes are not kept: for big models they are as large as the weights.
        model.ParseFromString(path.read_bytes())
    except (DecodeError, ValueError, RuntimeError):
        raise SaturateError(f"{spec}: not an ONNX model (protobuf decoding failed)") from None
    if not model.HasField("graph") or not model.opset_import:
        raise SaturateError(f"{spec}: not an ONNX model (no graph or opset)")
    _load_external_data(model, path)
    try:
        return onnx_io.import_model(model)
    except SaturateError as err:
        raise SaturateError(f"{spec}: {err}") from None


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
    """Read tensors stored beside the model, relative to the model's own folder (ONNX spec)."""
    from onnx import external_data_helper

    tensors = [t for t in external_data_helper._get_all_tensors(model) if external_data_helper.uses_external_data(t)]
    if not tensors:
        return
    try:
        external_data_helper.load_external_data_for_model(model, str(path.resolve().parent))
    except (OSError, ValueError, onnx.checker.ValidationError) as err:
        raise SaturateError(f"{path}: cannot read external data: {str(err).splitlines()[0]}") from None


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
