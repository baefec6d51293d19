"""C backend: emit one C file per graph, compile it against OpenBLAS into a shared library and a Cython
extension module, and run it on numpy arrays."""

from saturate.backend.emit import Emitted, emit
from saturate.backend.runtime import CompiledModel, compile_graph, load

__all__ = ["CompiledModel", "Emitted", "compile_graph", "emit", "load"]
