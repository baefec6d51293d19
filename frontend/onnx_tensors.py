"""ONNX tensors and types for the frontend: dtype names and codes, a TensorProto's values read
(checked against its declared size first), and which initializers stay in their data files."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from saturate.core.errors import SaturateError
from saturate.core.ir import ValueInfo
from saturate.core.limits import check_allocation, element_count, max_memory_bytes


# Initializers up to this many elements keep their data for checking and shape inference
# (Reshape's target shape, Clip's bounds); larger ones only need their types.
_SKELETON_ELEMENTS = 4096


def mappable(t: TensorProto) -> bool:
    """Whether an initializer can stay in its external data file, imported as a view of the
    file's mapping: one the skeleton leaves out (`_without_weights`, so no checker or inference
    sees it without its data) whose raw bytes are a plain little-endian array."""
    return math.prod(t.dims) > _SKELETON_ELEMENTS and t.data_type in _RAW_DTYPES


def raw_dtype(t: TensorProto) -> np.dtype:
    """The numpy dtype of a `mappable` tensor's raw bytes."""
    return _RAW_DTYPES[t.data_type]


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else type(err).__name__


@functools.lru_cache(maxsize=None)
def dtype_name(elem_type: int) -> str:
    """Numpy spelling of an ONNX tensor element type ("float32", "int64", "bfloat16", ...)."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except Exception:
        return TensorProto.DataType.Name(elem_type).lower()


@functools.lru_cache(maxsize=None)
def elem_type(dtype: str) -> int:
    """ONNX tensor element type of a numpy dtype name."""
    try:
        return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    except Exception:
        try:
            return TensorProto.DataType.Value(dtype.upper())
        except ValueError:
            raise SaturateError(f"dtype '{dtype}' has no ONNX equivalent") from None


_ELEM_TYPES = frozenset(TensorProto.DataType.values())


def _array(t: TensorProto, what: str | None = None) -> np.ndarray:
    """The tensor's data as an array, once check_tensors has passed it: its raw_data must hold
    exactly the bytes its dims and type need."""
    what = what or f"tensor '{t.name}'"
    if t.HasField("raw_data"):
        # Each read of the field copies the bytes out of the protobuf: read it once, check its
        # length, and (plain little-endian types) keep that one copy as the array's memory; the
        # IR treats constants as immutable, so read-only is fine.
        raw = t.raw_data
        needed = raw_size(t, what)
        if needed is None:
            raise SaturateError(f"{what}: string tensors cannot hold raw_data")
        if len(raw) != needed:
            raise SaturateError(f"{what}: raw_data holds {len(raw)} bytes; {describe(t)} needs {needed}")
        dtype = _RAW_DTYPES.get(t.data_type)
        if dtype is not None:
            return np.frombuffer(raw, dtype=dtype).reshape(tuple(t.dims))
        del raw
    try:
        arr = np.array(numpy_helper.to_array(t), copy=True)
    except Exception as err:  # onnx raises ValueError, TypeError, KeyError... for malformed data
        raise SaturateError(f"{what}: cannot decode its data ({_first_line(err)})") from None
    if arr.shape != tuple(t.dims):
        raise SaturateError(f"{what}: its data holds {arr.size} values; {describe(t)} needs "
                            f"{math.prod(t.dims)}")
    return arr


# Elements of these types are packed into fewer than 8 bits in raw_data.
_PACKED_BITS = {getattr(TensorProto, name): bits for name, bits in
                (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2),
                 ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6)) if hasattr(TensorProto, name)}


# The repeated field each type's values go to when not in raw_data, and values per element there.
_TYPED_FIELDS = {TensorProto.FLOAT: ("float_data", 1), TensorProto.COMPLEX64: ("float_data", 2),
                 TensorProto.DOUBLE: ("double_data", 1), TensorProto.COMPLEX128: ("double_data", 2),
                 TensorProto.INT64: ("int64_data", 1), TensorProto.UINT32: ("uint64_data", 1),
                 TensorProto.UINT64: ("uint64_data", 1), TensorProto.STRING: ("string_data", 1)}
_TYPED_FIELDS.update({code: ("int32_data", 1) for code in
                      (TensorProto.INT32, TensorProto.INT16, TensorProto.INT8, TensorProto.UINT16,
                       TensorProto.UINT8, TensorProto.BOOL, TensorProto.FLOAT16, TensorProto.BFLOAT16)})


def describe(t: TensorProto) -> str:
    """`float32[3, 4]`: a tensor's type and dims as errors show them."""
    return f"{dtype_name(t.data_type)}{list(t.dims)}"


def _itemsize(t: TensorProto, what: str) -> int:
    size = _itemsize_of(t.data_type)
    if size is None:
        raise SaturateError(f"{what}: unknown element type {t.data_type}")
    return size


@functools.lru_cache(maxsize=None)
def _itemsize_of(code: int) -> int | None:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(code)).itemsize
    except Exception:
        return None


def raw_size(t: TensorProto, what: str) -> int | None:
    """Bytes the tensor's values take as raw_data (None for strings, which have no raw form)."""
    count = element_count(t.dims, what)
    if t.data_type == TensorProto.STRING:
        return None
    bits = _PACKED_BITS.get(t.data_type)
    if bits is not None:
        return (count * bits + 7) // 8
    return count * _itemsize(t, what)


def check_tensor(t: TensorProto, what: str, limit: int | None = None) -> None:
    """Refuse a tensor whose dims are negative or too large for the memory limit, or whose typed
    data fields do not hold exactly what its dims and type need: before anything is decoded or
    allocated, trusting no size the file declares. (raw_data's length is checked where it is
    read, _array: reading the field copies it.)"""
    if t.HasField("segment"):
        raise SaturateError(f"{what}: segmented tensors are not supported")
    itemsize = _itemsize(t, what)
    limit = max_memory_bytes() if limit is None else limit
    if any(d < 0 for d in t.dims) or math.prod(t.dims) * itemsize > limit:
        check_allocation(t.dims, itemsize, f"{what} ({describe(t)})")
    if t.data_location == TensorProto.EXTERNAL or t.HasField("raw_data"):
        return  # external bytes are checked against the dims when they are read (load_graph)
    count = math.prod(t.dims)
    field, per = _TYPED_FIELDS.get(t.data_type, (None, 1))
    if field is not None and len(getattr(t, field)) != count * per:
        raise SaturateError(f"{what}: {field} holds {len(getattr(t, field))} values; {describe(t)} "
                            f"needs {count * per}")


def check_tensors(model: onnx.ModelProto) -> None:
    """check_tensor on every initializer and tensor attribute of the model (subgraphs included)."""
    graphs = [model.graph]
    limit = max_memory_bytes()
    while graphs:
        g = graphs.pop()
        for init in g.initializer:
            check_tensor(init, f"initializer '{init.name}'", limit)
        if g.sparse_initializer:
            raise SaturateError(f"sparse initializer '{g.sparse_initializer[0].values.name}': "
                                f"sparse initializers are not supported")
        for on in g.node:
            for a in on.attribute:
                if a.type in (AttributeProto.FLOAT, AttributeProto.INT, AttributeProto.STRING,
                              AttributeProto.FLOATS, AttributeProto.INTS, AttributeProto.STRINGS):
                    continue
                where = f"node '{on.name or (on.output[0] if on.output else '')}' ({on.op_type}): attribute '{a.name}'"
                for t in ([a.t] if a.HasField("t") else []) + list(a.tensors):
                    check_tensor(t, where, limit)
                # A sparse tensor is kept as it is (opaque), but whatever densifies it (onnx's
                # reference Constant) allocates its dims: those must fit too.
                for sp in ([a.sparse_tensor] if a.HasField("sparse_tensor") else []) + list(a.sparse_tensors):
                    check_allocation(sp.dims, _itemsize(sp.values, where), f"{where} (sparse, dims {list(sp.dims)})")
                graphs.extend(([a.g] if a.HasField("g") else []) + list(a.graphs))


_RAW_DTYPES = {TensorProto.FLOAT: np.dtype("<f4"), TensorProto.DOUBLE: np.dtype("<f8"),
               TensorProto.INT64: np.dtype("<i8"), TensorProto.INT32: np.dtype("<i4"),
               TensorProto.FLOAT16: np.dtype("<f2"), TensorProto.INT8: np.dtype("i1"),
               TensorProto.UINT8: np.dtype("u1")}


def _short_float(v: float) -> float:
    # ONNX stores float32; the shortest decimal of that float32 (1e-05, not 9.9999997e-06) reads
    # back to the same bits on export and is what rules and users write.
    return float(str(np.float32(v)))


def _text(b: bytes) -> str | bytes:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b


# How deep a sequence or optional type may nest (ONNX's own types nest two or three deep).
_TYPE_DEPTH = 8


def container_type_text(tp: onnx.TypeProto) -> str | None:
    """A sequence or optional type as text (its serialized TypeProto in hex, element shapes and
    all): the type of a graph input or output the IR holds no ValueInfo for, kept so export
    declares it again. None for a tensor or a map type."""
    return tp.SerializeToString().hex() if _container(tp) else None


def container_type(text: str) -> onnx.TypeProto | None:
    """The sequence or optional type container_type_text wrote; None for any text it cannot have
    written (a text graph's meta is as untrusted as a model)."""
    tp = onnx.TypeProto()
    try:
        tp.ParseFromString(bytes.fromhex(text))
    except Exception:   # not hex, or not a TypeProto (protobuf's DecodeError)
        return None
    return tp if _container(tp) else None


def _container(tp: onnx.TypeProto, depth: int = 0) -> bool:
    """A sequence or optional type whose innermost element is a tensor, nested at most _TYPE_DEPTH deep."""
    which = tp.WhichOneof("value")
    if which not in ("sequence_type", "optional_type") or depth >= _TYPE_DEPTH:
        return False
    inner = getattr(tp, which).elem_type
    return inner.WhichOneof("value") == "tensor_type" or _container(inner, depth + 1)


def type_info(tp: onnx.TypeProto) -> ValueInfo | None:
    """The ValueInfo of a tensor TypeProto (None for sequences, maps and optionals)."""
    if not tp.HasField("tensor_type"):
        return None
    tt = tp.tensor_type
    if tt.elem_type and tt.elem_type not in _ELEM_TYPES:
        raise SaturateError(f"unknown tensor element type {tt.elem_type}")
    dtype = dtype_name(tt.elem_type) if tt.elem_type else "unknown"
    if not tt.HasField("shape"):
        return ValueInfo(dtype, None)
    dims: list[Any] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            # A negative dim can only come from inference on an invalid node (an Expand to -3):
            # unknown here, the node itself fails if it is run. Declared ones are refused on import.
            dims.append(int(d.dim_value) if d.dim_value >= 0 else None)
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return ValueInfo(dtype, tuple(dims))
