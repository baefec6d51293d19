"""C backend: emit one C file per graph, compile it against OpenBLAS, run it through ctypes."""

from saturate.backend.emit import Emitted, emit
from saturate.backend.runtime import CompiledModel, compile_graph

__all__ = ["CompiledModel", "Emitted", "compile_graph", "emit"]
