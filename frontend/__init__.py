"""Frontends: ONNX import/export, the readable text form, and built-in example models."""

from __future__ import annotations

from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from saturate.core.errors import SaturateError
from saturate.core.fileio import write_atomic
from saturate.core.ir import Graph

TEXT_SUFFIXES = (".sat", ".txt")


def load_graph(spec: str) -> Graph:
    """Load a graph from a .onnx file, a text graph (.sat) or `example:NAME`."""
    if spec.startswith("example:"):
        from saturate.frontend import examples

        return examples.build(spec[len("example:"):])
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
    try:
        return onnx_io.import_model(model)
    except SaturateError as err:
        raise SaturateError(f"{spec}: {err}") from None


def save_graph(graph: Graph, path: str) -> None:
    """Write `graph` as ONNX or text (by extension), atomically: temp file, then rename."""
    target = Path(path)
    if target.suffix.lower() in TEXT_SUFFIXES:
        from saturate.frontend import text

        data = text.print_graph(graph).encode("utf-8")
    else:
        from saturate.frontend import onnx_io

        model = onnx_io.export_model(graph)
        data = model.SerializeToString()
    write_atomic(target, lambda f: f.write(data))


__all__ = ["load_graph", "save_graph"]
