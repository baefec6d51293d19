"""Frontend stage: the readable text form of a Graph (.sat): print, and parse back with lark."""

from __future__ import annotations

import json
import math
import re
import warnings
from typing import Any

import numpy as np
import onnx
from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from saturate.frontend.onnx_io import MAX_OPSET, dtype_name, elem_type
from saturate.core.errors import SaturateError, SourceError
from saturate.core.ir import Graph, Node, OpaqueAttr, ValueInfo
from saturate.core.limits import check_allocation
from saturate.ops.schema import op_table

AttrType = onnx.defs.OpSchema.AttrType

# The text form is saturate's own and is read as written, never converted: from opset 13, the first
# with today's forms of Softmax, Squeeze and Unsqueeze (ONNX models older than 14 are converted).
MIN_OPSET = 13

_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_./\-]+")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Floats print as the shortest decimal that reads back to the same bits (numpy's repr), so the
# text stays readable and diffable while round trips stay exact; other dtypes go out as raw hex.
_DECIMAL_KINDS = "fiub"
_parser: Lark | None = None


# ---- printing -------------------------------------------------------------------------------
def print_graph(g: Graph, max_elements: int | None = None, hex_data: bool = False) -> str:
    """The graph as text. With max_elements, big constants are abbreviated (display only)."""
    out = [f"graph {_name(g.name)} opset {g.opset}"]
    for domain, version in g.meta.get("opset_imports", {}).items():
        out.append(f"  import {json.dumps(domain)} {int(version)}")
    for key, value in g.meta.items():
        if key != "opset_imports" and _IDENT.fullmatch(key) and _printable(value):
            out.append(f"  meta {key} = {_attr(value, None, False)}")
    for name in g.inputs:
        out.append(f"  input {_decl(g, name)}")
    for name, arr in g.constants.items():
        data = _data(arr, max_elements, hex_data)
        out.append(f"  const {_value(name)}: {_tensor_type(arr)} = {data}")
    for n in g.nodes:
        results = ", ".join(_decl(g, o) if o else "_" for o in n.outputs)
        args = ", ".join(_value(i) if i else "_" for i in n.inputs)
        # An op of another domain may be named anything ONNX holds ("Foo-Bar"): quoted unless a name.
        op = n.op if _IDENT.fullmatch(n.op) else json.dumps(n.op)
        op = f"{json.dumps(n.domain)}.{op}" if n.domain else op
        line = f"  {results} = {op}({args})"
        if n.attrs:
            line += " {" + ", ".join(f"{_key(k)}={_attr(v, max_elements, hex_data)}" for k, v in n.attrs.items()) + "}"
        if n.name:
            line += f" @{json.dumps(n.name)}"
        out.append(line)
    for name in g.outputs:
        out.append(f"  output {_value(name)}")
    return "\n".join(out) + "\n"


def _name(name: str) -> str:
    return name if _IDENT.fullmatch(name) and name not in ("graph", "opset") else json.dumps(name)


def _value(name: str) -> str:
    return "%" + (name if _PLAIN_VALUE.fullmatch(name) else json.dumps(name))


def _key(key: str) -> str:
    if not _IDENT.fullmatch(key):
        raise SaturateError(f"attribute name '{key}' cannot be written in the text form")
    return key


def _decl(g: Graph, name: str) -> str:
    if name not in g.values:
        return _value(name)
    info = g.values[name]
    dims = "" if info.shape is None else "[" + ", ".join(_dim(d) for d in info.shape) + "]"
    return f"{_value(name)}: {written_dtype(info.dtype)}{dims}"


def _dim(d: Any) -> str:
    return "?" if d is None else json.dumps(d) if isinstance(d, str) else str(int(d))


def _tensor_type(arr: np.ndarray) -> str:
    return f"{written_dtype(arr.dtype)}[{', '.join(str(d) for d in arr.shape)}]"


def written_dtype(dtype: np.dtype | str) -> str:
    """A dtype as the text form writes it: numpy's name, but ONNX's `string` for numpy's object
    (a value's type holds the name import gives it, "object", as a constant's array does)."""
    name = dtype if isinstance(dtype, str) else dtype.name
    return "string" if name == "object" else name


# Characters of one string element shown when constants are abbreviated (display only).
_SHOWN_CHARS = 64


def _data(arr: np.ndarray, max_elements: int | None, hex_data: bool) -> str:
    flat = arr.reshape(-1)
    short = max_elements is not None and flat.size > max_elements
    if short:
        flat = flat[:max_elements]
    if arr.dtype == object:
        items, cut = [], False
        for s in flat:
            # (abbreviated, a long element is cut before it is decoded: a model may hold one of gigabytes)
            whole = len(s) <= _SHOWN_CHARS or max_elements is None
            text = s if whole else s[:4 * _SHOWN_CHARS]
            text = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
            items.append(json.dumps(text) if whole else json.dumps(text[:_SHOWN_CHARS]) + "...")
            cut = cut or not whole
        if cut and not short:
            return "[" + ", ".join(items) + f"] # strings cut at {_SHOWN_CHARS} characters"
    elif arr.dtype.kind not in _DECIMAL_KINDS or (hex_data and not short):
        return "0x" + np.ascontiguousarray(arr, arr.dtype.newbyteorder("<")).tobytes().hex()
    elif arr.dtype.kind == "b":
        items = ["1" if v else "0" for v in flat]
    else:
        items = [str(v) for v in flat]
    if short:
        items.append(f"...] # {arr.size} values")
        return "[" + ", ".join(items)
    return "[" + ", ".join(items) + "]"


def _printable(v: Any) -> bool:
    if isinstance(v, (list, tuple)):
        return all(_printable(x) for x in v)
    return isinstance(v, (int, float, str, bytes, np.ndarray, OpaqueAttr))


def _attr(v: Any, max_elements: int | None, hex_data: bool) -> str:
    if isinstance(v, (bool, np.bool_, np.integer)):
        v = int(v)
    elif isinstance(v, np.floating):
        v = float(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, bytes):
        return f'b"{v.hex()}"'
    if isinstance(v, np.ndarray):
        return f"tensor {_tensor_type(v)} {_data(v, max_elements, hex_data)}"
    if isinstance(v, OpaqueAttr):
        return f'opaque {v.kind} b"{v.payload.hex()}"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_attr(x, max_elements, hex_data) for x in v) + "]"
    raise SaturateError(f"attribute value {v!r} cannot be written in the text form")


# ---- parsing --------------------------------------------------------------------------------
def parse_graph(text: str, file: str = "<string>") -> Graph:
    """Parse the text form back into a Graph; errors point at file:line:col."""
    global _parser
    if _parser is None:
        # No cache=True: lark keeps it as a pickle in the shared temp directory, under a name anyone
        # can compute, and unpickles what it finds there.
        _parser = Lark.open_from_package("saturate.frontend", "text.lark", parser="lalr", propagate_positions=True)
    try:
        tree = _parser.parse(text)
    except UnexpectedInput as err:
        raise _syntax_error(err, text, file) from None
    return _Reader(text, file).graph(tree)


_INT64 = np.iinfo(np.int64)


def _syntax_error(err: UnexpectedInput, text: str, file: str) -> SourceError:
    line, col = max(err.line, 1), max(err.column, 1)
    if isinstance(err, UnexpectedToken) and err.token.type == "$END" or isinstance(err, UnexpectedEOF):
        msg = "unexpected end of input"
        line, col = text.count("\n") or 1, 1
    elif isinstance(err, UnexpectedToken):
        expected = sorted(_describe(t) for t in err.expected)[:8]
        msg = f"unexpected {_describe(err.token.type)} {str(err.token)!r}; expected {', '.join(expected)}"
    elif isinstance(err, UnexpectedCharacters):
        msg = f"unexpected character {err.char!r}"
    else:
        msg = "syntax error"
    lines = text.splitlines()
    return SourceError(file, line, col, msg, lines[line - 1] if 0 < line <= len(lines) else None)


_TERMINAL_NAMES = {"VALUE": "a %value", "IDENT": "a name", "INT": "an integer", "FLOAT": "a number",
                   "STRING": "a string", "DTYPE": "a dtype", "_NL": "end of line", "OMITTED": "'_'",
                   "LIST_DATA": "[data]", "HEX_DATA": "0x data", "BYTES": 'b"hex"'}


def _describe(terminal: str) -> str:
    if terminal in _TERMINAL_NAMES:
        return _TERMINAL_NAMES[terminal]
    try:
        return repr(_parser.get_terminal(terminal).pattern.value)
    except Exception:
        return terminal


# Meta entries saturate keeps in a structure of its own, which a text graph does not write as meta.
_OWN_META = {"opset_imports": ": write `import \"DOMAIN\" VERSION`", "functions": ""}


class _Reader:
    """Turns the parse tree into a Graph, checking names as it goes (text is in topological order)."""

    def __init__(self, text: str, file: str):
        self.lines, self.file = text.splitlines(), file
        self.defined: set[str] = set()

    def error(self, where: Token | Tree, message: str) -> SourceError:
        line = getattr(where, "line", None) or where.meta.line
        col = getattr(where, "column", None) or where.meta.column
        return SourceError(self.file, line, col, message, self.lines[line - 1] if line <= len(self.lines) else None)

    def graph(self, tree: Tree) -> Graph:
        header, *stmts = tree.children
        name_tok, opset = header.children
        if not MIN_OPSET <= int(opset) <= MAX_OPSET:
            raise self.error(opset, f"unsupported ONNX opset {opset}: saturate supports opsets {MIN_OPSET} to {MAX_OPSET}")
        g = Graph(name=self.string(name_tok.children[0]), opset=int(opset))
        for st in stmts:
            getattr(self, "st_" + st.data)(g, st)
        return g

    def string(self, tok: Token) -> str:
        return self.unquote(tok) if tok.type == "STRING" else str(tok)

    def unquote(self, tok: Token, text: str | None = None) -> Any:
        """A JSON string (or list of strings) as written: its escapes must spell Unicode text, which
        every name, attribute and string tensor is in ONNX (a lone surrogate, "\\ud800", cannot
        be written as UTF-8)."""
        value = json.loads(tok if text is None else text)
        for s in value if isinstance(value, list) else [value]:
            try:
                str(s).encode("utf-8")
            except UnicodeEncodeError:
                raise self.error(tok, f"string {json.dumps(s)} is not valid Unicode (a lone surrogate)") from None
        return value

    def value_name(self, tok: Token) -> str:
        body = tok[1:]
        return self.unquote(tok, body) if body.startswith('"') else body

    def define(self, tok: Token, g: Graph) -> str:
        name = self.value_name(tok)
        if name in self.defined:
            raise self.error(tok, f"value '%{name}' is defined twice")
        self.defined.add(name)
        return name

    def use(self, tok: Token) -> str:
        if tok.type == "OMITTED":
            return ""
        name = self.value_name(tok)
        if name not in self.defined:
            raise self.error(tok, f"value '%{name}' is used before it is defined")
        return name

    # ---- statements ----------------------------------------------------------------------
    def st_import_(self, g: Graph, st: Tree) -> None:
        domain, version = st.children
        if self.unquote(domain) in ("", "ai.onnx"):
            # One opset per domain: a second for ONNX's own was written beside the graph's.
            raise self.error(domain, "ONNX's own opset is the graph's: write it after `opset` in the header")
        if not 1 <= int(version) <= _INT64.max:
            raise self.error(version, f"opset version {version} is out of range (1 to {_INT64.max})")
        imports = g.meta.setdefault("opset_imports", {})
        if self.unquote(domain) in imports:
            raise self.error(domain, f"domain {domain} is imported twice")
        imports[self.unquote(domain)] = int(version)

    def st_meta(self, g: Graph, st: Tree) -> None:
        key, value = st.children
        if str(key) in _OWN_META:
            raise self.error(key, f"meta '{key}' cannot be set in a text graph{_OWN_META[str(key)]}")
        g.meta[str(key)] = self.attr_value(value)
        if str(key) == "preserve" and not (isinstance(g.meta["preserve"], list)
                                           and all(isinstance(v, str) for v in g.meta["preserve"])):
            raise self.error(key, "meta 'preserve' must be a list of strings (the nodes and ops to keep)")

    def st_input(self, g: Graph, st: Tree) -> None:
        decl = st.children[0]
        name = self.define(decl.children[0], g)
        g.inputs.append(name)
        if len(decl.children) > 1:
            g.values[name] = self.type(decl.children[1])

    def st_output(self, g: Graph, st: Tree) -> None:
        g.outputs.append(self.use(st.children[0]))

    def st_const(self, g: Graph, st: Tree) -> None:
        tok, ttype, data = st.children
        name = self.value_name(tok)
        # A const named like an input is that input's default value (an ONNX initializer
        # listed as a graph input): the input stays overridable.
        if not (name in g.inputs and name not in g.constants):
            name = self.define(tok, g)
        g.constants[name] = self.tensor(ttype, data)

    def st_node(self, g: Graph, st: Tree) -> None:
        results, op, args, attrs, label = (st.children + [None] * 5)[:5]
        if isinstance(attrs, Tree) and attrs.data == "label":
            attrs, label = None, attrs
        inputs = [self.use(a) for a in args.children] if args is not None else []
        domain, op_name = (self.string(op.children[0]), self.string(op.children[1])) if len(op.children) == 2 \
            else ("", self.string(op.children[0]))
        if not domain.isprintable():     # an op and its domain are printed as they are, in summaries
            raise self.error(op.children[0], f"domain {json.dumps(domain)} holds control characters")
        if not op_name.isprintable():
            raise self.error(op.children[-1], f"op {json.dumps(op_name)} holds control characters")
        if domain in ("", "ai.onnx") and op_name not in op_table():
            tok = op.children[-1]
            raise self.error(tok, f"unknown op '{op_name}': not an ONNX op; write another domain's op "
                                  f"as \"my.domain\".{op_name}")
        node = Node(op_name, inputs, [], domain=domain)
        if label is not None:
            node.name = self.unquote(label.children[0])
        for r in results.children:
            tok = r.children[0]
            if tok.type == "OMITTED":
                node.outputs.append("")
                continue
            name = self.define(tok, g)
            node.outputs.append(name)
            if len(r.children) > 1 and r.children[1] is not None:
                g.values[name] = self.type(r.children[1])
        if attrs is not None:
            for a in attrs.children:
                if a is None:
                    continue
                key, value = a.children
                if str(key) in node.attrs:
                    raise self.error(key, f"attribute '{key}' is given twice")
                if value.data == "opaque":
                    node.attrs[str(key)] = self.opaque(*value.children, key=key)
                else:
                    node.attrs[str(key)] = self.attr_value(value)
                    self.check_attribute_list(key, node.attrs[str(key)])
                    if domain in ("", "ai.onnx"):
                        self.check_attribute_kind(key, op_name, g.opset, node.attrs[str(key)])
        g.nodes.append(node)

    def check_attribute_list(self, key: Token, value: Any) -> None:
        """A list attribute is one ONNX can hold: numbers (ints, or floats), strings or tensors,
        not lists nor a mix of kinds; export could not write any other."""
        if not isinstance(value, list):
            return
        numbers = all(isinstance(x, (int, float)) for x in value)
        strings = all(isinstance(x, (str, bytes)) for x in value)
        if not (numbers or strings or all(isinstance(x, np.ndarray) for x in value)):
            raise self.error(key, f"attribute '{key}' must be a list of numbers, of strings or of tensors")

    def check_attribute_kind(self, key: Token, op: str, opset: int, value: Any) -> None:
        """An attribute's value is of the kind the op's schema declares (a float for LeakyRelu's
        alpha, not a string): every later stage reads it as that kind."""
        try:
            schema = onnx.defs.get_schema(op, opset)
        except onnx.defs.SchemaError:
            return          # no version of the op at this opset: the checker says so on import
        spec = schema.attributes.get(str(key))
        if spec is None:
            return
        numbers = (int, float, np.integer, np.floating)
        kinds = {
            AttrType.FLOAT: lambda v: isinstance(v, numbers) and not isinstance(v, bool),
            AttrType.INT: lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, bool),
            AttrType.STRING: lambda v: isinstance(v, (str, bytes)),
            AttrType.FLOATS: lambda v: isinstance(v, list) and all(isinstance(x, numbers) for x in v),
            AttrType.INTS: lambda v: isinstance(v, list) and all(isinstance(x, (int, np.integer)) for x in v),
            AttrType.STRINGS: lambda v: isinstance(v, list) and all(isinstance(x, (str, bytes)) for x in v),
            AttrType.TENSOR: lambda v: isinstance(v, np.ndarray),
        }
        fits = kinds.get(spec.type)
        if fits is not None and not fits(value):
            raise self.error(key, f"attribute '{key}' of {op} must be {spec.type.name}, not {value!r:.40}")

    # ---- types, data, attribute values -----------------------------------------------------
    def type(self, t: Tree) -> ValueInfo:
        dtype, shape = (t.children + [None])[:2]
        return ValueInfo(self.value_dtype(dtype), None if shape is None else self.shape(shape))

    def value_dtype(self, tok: Token) -> str:
        """A value's element type, spelled as ONNX import spells it ("unknown" where none is
        known): every later stage reads the name with numpy or maps it to ONNX."""
        if str(tok) == "unknown":
            return "unknown"
        try:
            code = elem_type(str(tok))
        except SaturateError:
            code = onnx.TensorProto.UNDEFINED
        if code == onnx.TensorProto.UNDEFINED:
            raise self.error(tok, f"unknown dtype '{tok}'")
        return dtype_name(code)

    def shape(self, s: Tree) -> tuple:
        dims = []
        for d in s.children:
            if d is None:
                continue
            tok = d.children[0]
            if tok.type == "INT":
                if not 0 <= int(tok) <= _INT64.max:
                    raise self.error(tok, f"dimension {tok} is out of range (0 to {_INT64.max})")
                dims.append(int(tok))
            else:
                dims.append(None if tok.type == "UNKNOWN_DIM" else self.unquote(tok))
        return tuple(dims)

    def tensor(self, ttype: Tree, data: Tree) -> np.ndarray:
        dtype_tok, shape_tree = ttype.children
        shape = self.shape(shape_tree)
        if any(not isinstance(d, int) or d < 0 for d in shape):
            raise self.error(shape_tree, "constant shapes must be concrete non-negative integers")
        dtype = self.dtype(dtype_tok)
        tok = data.children[0]
        try:
            # The data must be in the file, so a huge shape cannot parse; say why before trying.
            check_allocation(shape, dtype.itemsize, f"constant {written_dtype(dtype)}{list(shape)}")
        except SaturateError as err:
            raise self.error(shape_tree, str(err)) from None
        size = math.prod(shape)
        # The data's length is checked against the shape before it is decoded: numbers decode
        # to 8 bytes each, several times the text of a list of zeros.
        if tok.type == "HEX_DATA":
            digits = len(tok) - 2
            if digits % 2 or digits // 2 != size * dtype.itemsize or dtype == object:
                raise self.error(tok, f"hex data holds {digits / 2:g} bytes; {written_dtype(dtype)}{list(shape)} "
                                      f"needs {size * dtype.itemsize}")
            return np.frombuffer(bytes.fromhex(tok[2:]), dtype.newbyteorder("<")).astype(dtype).reshape(shape)
        body = tok[1:-1]
        if "..." in body:
            raise self.error(tok, "constant data is abbreviated ('...'); print the graph in full "
                                  "(saturate show --full) to get text that parses back")
        written = body.count(",") + 1 if body.strip() else 0
        if dtype != object and written != size:
            raise self.error(tok, f"constant data has {written} values; shape {list(shape)} needs {size}")
        if dtype == object:
            try:
                flat = np.array(self.unquote(tok), dtype=object)
            except json.JSONDecodeError:
                raise self.error(tok, "constant data is not a list of strings") from None
        else:
            flat = self.numbers(tok, body, dtype)
        if flat.size != size:
            raise self.error(tok, f"constant data has {flat.size} values; shape {list(shape)} needs {size}")
        return flat.reshape(shape)

    def numbers(self, tok: Token, body: str, dtype: np.dtype) -> np.ndarray:
        # numpy's text reader instead of a Python loop: big models have millions of values.
        expected = body.count(",") + 1 if body.strip() else 0
        # Integers are read 64-bit and range-checked (check_int_range): numpy wraps 300 to 44 when
        # it reads into uint8 itself.
        parse_as = (np.float64 if dtype.kind == "f" else np.uint64 if dtype == np.uint64
                    else np.int64 if dtype.kind in "biu" else dtype)
        with warnings.catch_warnings():
            # numpy reports text it cannot read as a DeprecationWarning and returns a prefix.
            warnings.simplefilter("error", DeprecationWarning)
            try:
                flat = np.fromstring(body, dtype=parse_as, sep=",") if expected else np.zeros(0, parse_as)
            except (ValueError, DeprecationWarning):
                flat = None
        if flat is None or flat.size != expected:
            raise self.error(tok, f"constant data is not a list of {written_dtype(dtype)} values")
        if dtype.kind in "biu" and flat.size:
            self.check_int_range(tok, body, flat, dtype)
        # A float past the dtype's range (70000 as float16) is infinity, as 1e999 is for float32
        # already: numpy's overflow warning would be a second line on stderr.
        with np.errstate(over="ignore"):
            return flat.astype(dtype)

    def check_int_range(self, tok: Token, body: str, flat: np.ndarray, dtype: np.dtype) -> None:
        """Refuse integer data that does not fit its dtype; numpy's reader clamps what does not fit
        64 bits to the type's extremes, so those values are read again exactly."""
        limits = np.iinfo(flat.dtype)
        clamped = flat == limits.max
        if limits.min < 0:
            clamped |= flat == limits.min
        if np.any(clamped):
            for text in body.split(","):
                if not limits.min <= int(text) <= limits.max:
                    raise self.error(tok, f"constant value {text.strip()} is out of range for {written_dtype(dtype)}")
        lo, hi = (0, 1) if dtype.kind == "b" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
        low, high = flat.min(), flat.max()
        if low < lo or high > hi:
            bad = low if low < lo else high
            raise self.error(tok, f"constant value {bad} is out of range for {written_dtype(dtype)} ({lo} to {hi})")

    def dtype(self, tok: Token) -> np.dtype:
        """A constant's element type: numpy's name or ONNX's, of a type ONNX has (numpy's
        datetime64 is neither saved nor run)."""
        if str(tok) == "string":
            return np.dtype(object)
        try:
            return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type(str(tok))))
        except Exception:
            raise self.error(tok, f"unknown dtype '{tok}'") from None

    def attr_value(self, v: Tree) -> Any:
        kind = v.data
        if kind == "int_":
            if not _INT64.min <= int(v.children[0]) <= _INT64.max:
                raise self.error(v.children[0], f"integer {v.children[0]} is out of range (64-bit)")
            return int(v.children[0])
        if kind == "float_":
            return float(v.children[0])
        if kind == "str_":
            return self.unquote(v.children[0])
        if kind == "bytes_":
            return self.hex_bytes(v.children[0])
        if kind == "tensor":
            return self.tensor(*v.children)
        if kind == "opaque":
            return self.opaque(v.children[0], v.children[1])
        items = [x for x in v.children if x is not None]
        # No attribute or meta value is a list of lists: refused here, before 10,000 nested
        # brackets would be read recursively.
        inner = next((x for x in items if x.data == "list_"), None)
        if inner is not None:
            raise self.error(inner, "a list may not hold lists")
        return [self.attr_value(x) for x in items]

    def hex_bytes(self, tok: Token) -> bytes:
        digits = tok[2:-1]
        if len(digits) % 2:
            raise self.error(tok, "bytes need an even number of hex digits")
        return bytes.fromhex(digits)

    def opaque(self, kind: Token, tok: Token, key: Token | None = None) -> OpaqueAttr:
        """An opaque attribute: a serialized AttributeProto of the kind it says (named as the
        attribute, when it is one), checked here so that a corrupt one is refused at its line
        rather than when the graph is exported or run."""
        from google.protobuf.message import DecodeError
        from onnx import AttributeProto

        payload = self.hex_bytes(tok)
        proto = AttributeProto()
        try:
            proto.ParseFromString(payload)
        except (DecodeError, ValueError, RuntimeError):
            raise self.error(tok, "opaque attribute is not a serialized ONNX AttributeProto") from None
        types = dict(AttributeProto.AttributeType.items())
        if types.get(str(kind)) != proto.type:
            got = next((name for name, code in types.items() if code == proto.type), str(proto.type))
            raise self.error(kind, f"opaque attribute holds an attribute of type {got}, not {kind}")
        if key is not None and proto.name != str(key):
            raise self.error(tok, f"opaque attribute is named '{proto.name}' inside, not '{key}'")
        return OpaqueAttr(str(kind), payload)
