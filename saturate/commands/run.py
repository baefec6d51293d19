"""CLI stage: `saturate run MODEL` evaluates a model on an input and saves or prints its outputs."""

from __future__ import annotations

import argparse
import math
import sys
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

from saturate.core.errors import SaturateError, one_line
from saturate.core.fileio import check_outputs, model_files, write_atomic
from saturate.core.ir import Graph
from saturate.core.limits import check_allocation, check_bytes

NAME = "run"
HELP = ("run a model (.onnx, .sat or example:NAME), or a directory 'saturate compile' wrote, on an input and save "
        "or print its outputs")


def _numpy_backend(graph: Graph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from saturate.interp.interpreter import run_graph

    return run_graph(graph, inputs)


def _c_backend(graph: Graph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from saturate.backend import compile_graph

    # Symbolic input dimensions take the given array's; declared static shapes are checked instead.
    shapes = {k: np.shape(a) for k, a in inputs.items() if k in graph.inputs and not graph.info(k).is_static()}
    return compile_graph(graph, input_shapes=shapes)(inputs)


# Backend name -> function(graph, inputs) -> outputs by name. Other backends add an entry here.
BACKENDS: dict[str, Callable[[Graph, dict[str, np.ndarray]], dict[str, np.ndarray]]] = {
    "numpy": _numpy_backend,
    "c": _c_backend,
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a .onnx file, a .sat text graph, example:NAME, or a directory "
                                      "'saturate compile MODEL -o DIR' wrote (run through its extension module)")
    parser.add_argument("-i", "--input", metavar="FILE",
                        help="a .npy array (one-input models) or a .npz with one array per input name; "
                             "default: random normal input from a fixed seed")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="save outputs: .npy for a single output, .npz (one array per output name; "
                             "a sequence output's items as NAME.0, NAME.1, ...) for several; default: print "
                             "a summary of each output")
    parser.add_argument("--backend", choices=sorted(BACKENDS),
                        help="what evaluates the model (default: numpy, the reference interpreter; a compiled "
                             "directory runs its compiled C)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random input (default 0)")
    parser.add_argument("--values", type=int, default=6, metavar="K",
                        help="values printed per output without -o (default 6)")


def run(args: argparse.Namespace) -> int:
    if Path(args.model).is_dir():
        return run_compiled(args)
    from saturate.frontend import load_graph

    if args.output:  # before the load and the run, not after them
        check_outputs([("-o", args.output)], model_files(args.model) + ([args.input] if args.input else []))
    graph = load_graph(args.model)
    if args.output:
        check_output_path(args.output, graph.outputs)
    if args.input:
        inputs = load_inputs(graph, args.input)
    else:
        inputs = random_inputs(graph, args.seed)
        announce(inputs, args.seed)
    outputs = BACKENDS[args.backend or "numpy"](graph, inputs)
    report(outputs, args)
    return 0


def run_compiled(args: argparse.Namespace) -> int:
    """Run a compiled directory through saturate.backend.load (its extension module)."""
    from saturate.backend import load

    if args.backend not in (None, "c"):
        raise SaturateError(f"{args.model}: a compiled directory runs its compiled C; drop --backend {args.backend}")
    model = load(args.model)
    if args.output:  # checked once the directory is known to be a compiled model, before the run
        check_outputs([("-o", args.output)], _files_under(args.model) + ([args.input] if args.input else []))
        check_output_path(args.output, [name for name, _ in model.outputs])
    specs = [(name, shape, model.input_dtypes[name]) for name, shape in model.inputs]
    if args.input:
        inputs = read_inputs([name for name, _ in model.inputs], args.input, model.input_dtypes)
    else:
        inputs = random_arrays(specs, args.seed)
        announce(inputs, args.seed)
    report(model(inputs), args)
    return 0


def _files_under(directory: str) -> list[str]:
    """The files of a compiled directory (its segments' too): what running it reads."""
    return [str(p) for p in Path(directory).rglob("*") if p.is_file()]


def announce(inputs: dict[str, np.ndarray], seed: int) -> None:
    shown = ", ".join(f"{k} {a.dtype}{list(a.shape)}" for k, a in inputs.items())
    print(f"saturate: no --input given: random normal input from seed {seed}: {one_line(shown)}", file=sys.stderr)


def report(outputs: dict[str, np.ndarray], args: argparse.Namespace) -> None:
    """Save the outputs to -o, or print a summary line per output. A model's names and strings
    may hold line breaks and terminal escapes: they print escaped (one_line)."""
    if args.output:
        save_outputs(outputs, args.output)
        print(one_line(f"wrote {args.output}: " + ", ".join(_saved(k, a) for k, a in outputs.items())))
    else:
        for name, value in outputs.items():
            if value is None:
                print(one_line(f"{name}: an empty optional"))
            elif isinstance(value, list):  # a sequence output: a line for it, then one per item
                print(one_line(f"{name}: sequence of {len(value)} {_item_dtype(value)} tensor(s)"))
                for k, item in enumerate(value):
                    print(summary(f"{name}[{k}]", item, args.values))
            else:
                print(summary(name, value, args.values))


def _item_dtype(value: list) -> str:
    dtype = getattr(value, "dtype", None)
    return str(dtype if dtype is not None else value[0].dtype if value else "float32")


def _saved(name: str, value) -> str:
    if value is None:
        return f"{name} an empty optional (nothing saved)"
    if isinstance(value, list):
        items = f" as {name}.0 to {name}.{len(value) - 1}" if len(value) > 1 else f" as {name}.0" if value else \
            " (nothing saved)"
        return f"{name} sequence of {len(value)} {_item_dtype(value)}{items}"
    return f"{name} {value.dtype}{list(value.shape)}"


def graph_inputs(graph: Graph) -> list[str]:
    """Inputs a caller must feed (an initializer listed as an input has a default)."""
    return [i for i in graph.inputs if i not in graph.constants]


def load_inputs(graph: Graph, path: str) -> dict[str, np.ndarray]:
    """Read a .npy (single-input models) or .npz (one array per input name; a sequence input's
    items as NAME.0, NAME.1, ..., as `run -o` saves a sequence output)."""
    names = graph_inputs(graph)
    inputs = read_inputs(names, path, {n: graph.info(n).dtype for n in names if graph.info(n) is not None})
    for name, dtype in _sequence_inputs(graph).items():
        if name in inputs or f"{name}.0" not in inputs:
            continue
        from saturate.interp.sequences import TensorSequence

        items = []
        while f"{name}.{len(items)}" in inputs:
            items.append(inputs.pop(f"{name}.{len(items)}"))
        wrong = next((k for k, a in enumerate(items) if a.dtype != dtype), None)
        if wrong is not None:
            raise SaturateError(f"{path}: {name}.{wrong} has dtype {items[wrong].dtype}; input '{name}' is a "
                                f"sequence of {dtype} tensors")
        inputs[name] = TensorSequence(items, dtype)
    return inputs


def _sequence_inputs(graph: Graph) -> dict[str, np.dtype]:
    """The graph's sequence inputs (their types kept on import) and their items' dtype."""
    from saturate.frontend.onnx_meta import _strings
    from saturate.frontend.onnx_tensors import container_type, dtype_name

    found = {}
    for name, text in _strings(graph.meta.get("value_types"), 2):
        tp = container_type(text)
        if tp is not None and name in graph.inputs and tp.WhichOneof("value") == "sequence_type":
            item = tp.sequence_type.elem_type
            if item.WhichOneof("value") == "tensor_type" and item.tensor_type.elem_type:
                found[name] = np.dtype(dtype_name(item.tensor_type.elem_type))
    return found


def read_inputs(names: list[str], path: str, dtypes: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    """Read a .npy (when `names` is one input) or .npz (one array per input name). Each array's header
    is read first and its size checked against --max-memory and against the bytes the file holds for
    it, so a header claiming terabytes allocates nothing; arrays of Python objects are refused unread.
    `dtypes` gives the graph's type of each input (see as_declared)."""
    return as_declared(_read_arrays(names, path), dtypes or {})


def as_declared(arrays: dict[str, np.ndarray], dtypes: dict[str, str]) -> dict[str, np.ndarray]:
    """numpy saves bfloat16, float8 and int4 arrays (ml_dtypes' types) as raw bytes, a void type of
    their width ('|V2' for bfloat16) that it reads back as such: an input of that width whose graph type
    is one of these is read as that type."""
    for name, arr in arrays.items():
        if arr.dtype.kind != "V" or arr.dtype.names is not None or name not in dtypes:
            continue
        try:
            want = np.dtype(dtypes[name])
        except TypeError:
            continue
        if want.itemsize == arr.dtype.itemsize and want.kind == "V":
            arrays[name] = arr.view(want)
    return arrays


def _read_arrays(names: list[str], path: str) -> dict[str, np.ndarray]:
    if not Path(path).is_file():
        raise SaturateError(f"{path}: no such file")
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
            f.seek(0)
            if magic.startswith(b"PK"):
                return _read_npz(path)
            if len(names) != 1:
                if magic == b"\x93NUMPY":
                    raise SaturateError(f"{path}: one array given, but the model has {len(names)} inputs "
                                        f"({', '.join(names)}); pass a .npz with one array per input name")
                raise SaturateError(f"{path}: not a .npy or .npz array file")
            return {names[0]: _read_npy(f, Path(path).stat().st_size, f"input '{names[0]}' in {path}", path)}
    except (OSError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile) as err:
        raise SaturateError(f"{path}: unreadable array file ({str(err).splitlines()[0] if str(err) else 'truncated'})") \
            from None


def _read_npz(path: str) -> dict[str, np.ndarray]:
    arrays, total = {}, 0
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            name = info.filename.removesuffix(".npy")
            if name in arrays:
                raise SaturateError(f"{path}: holds the array '{name}' twice")
            with z.open(info) as member:
                arrays[name] = _read_npy(member, info.file_size, f"input '{name}' in {path}", path, total)
            total += arrays[name].nbytes
    return arrays


def _read_npy(f, size: int, what: str, path: str, before: int = 0) -> np.ndarray:
    """One .npy array from the stream `f` of `size` bytes, checked before it is allocated, alone and
    with the `before` bytes of the arrays read before it."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        else:
            raise ValueError(version)
    except (ValueError, SyntaxError, TypeError, EOFError):
        # numpy's own reasons ("pickled data", "cannot reshape") describe its parser, not the file.
        raise SaturateError(f"{path}: not a .npy or .npz array file") from None
    if dtype.hasobject:
        raise SaturateError(f"{what}: an array of Python objects, which saturate never unpickles")
    nbytes = check_allocation(shape, dtype.itemsize, what)
    if before:
        check_bytes(before + nbytes, f"{what} with the arrays before it")
    held = size - f.tell()
    if held < nbytes:
        raise SaturateError(f"{what}: its header says {dtype}{list(shape)} ({nbytes} bytes) but the file holds "
                            f"{max(held, 0)} bytes of data")
    array = np.empty(math.prod(shape), dtype=dtype)
    view, done = memoryview(array).cast("B"), 0
    while done < nbytes:
        got = f.readinto(view[done:])
        if not got:
            raise SaturateError(f"{what}: the file ends inside the array's data")
        done += got
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


def random_inputs(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    """One random array per graph input, shaped from the graph (symbolic dimensions become 1)."""
    specs = []
    for name in graph_inputs(graph):
        info = graph.info(name)
        if info.shape is None or any(d is None for d in info.shape):
            raise SaturateError(f"input '{name}' has no known shape; pass --input")
        specs.append((name, [d if isinstance(d, int) else 1 for d in info.shape], info.dtype))
    return random_arrays(specs, seed)


def random_arrays(specs: list[tuple[str, list[int], str]], seed: int) -> dict[str, np.ndarray]:
    """One random array per (name, shape, dtype), from a fixed seed."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for name, shape, dtype_name in specs:
        dtype = np.dtype(dtype_name)
        check_allocation(shape, dtype.itemsize, f"input '{name}' ({dtype_name}{list(shape)})")
        # numpy draws 64-bit values, then casts them.
        check_allocation(shape, 8, f"the random values for input '{name}' (drawn as 64-bit)")
        if dtype.kind == "f":
            inputs[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            inputs[name] = rng.integers(0, 10, shape).astype(dtype)
        elif dtype.kind == "b":
            inputs[name] = rng.integers(0, 2, shape).astype(bool)
        elif dtype.name == "float8_e8m0fnu":  # powers of two only, no sign, no zero
            inputs[name] = np.exp2(rng.integers(-4, 5, shape)).astype(dtype)
        elif dtype.name == "bfloat16" or dtype.name.startswith(("float8", "float4")):
            inputs[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.name in ("int4", "uint4"):
            inputs[name] = rng.integers(0, 8, shape).astype(dtype)
        else:
            raise SaturateError(f"input '{name}' has dtype {dtype_name}, which has no random generator; pass --input")
    return inputs


def check_output_path(path: str, names: list[str]) -> None:
    """An output file must be .npy (one output) or .npz, in an existing directory."""
    target = Path(path)
    if target.suffix.lower() not in (".npy", ".npz"):
        raise SaturateError(f"{path}: output must end in .npy or .npz")
    if len(names) != 1 and target.suffix.lower() == ".npy":
        raise SaturateError(f"{path}: the model has {len(names)} outputs ({', '.join(names)}); "
                            "save them to a .npz")
    if not target.parent.is_dir():
        raise SaturateError(f"{path}: directory '{target.parent}' does not exist")


def save_outputs(outputs: dict[str, np.ndarray], path: str) -> None:
    """Save one output as .npy or all as .npz, atomically (temp file in place, then rename). A
    sequence output is saved item by item in the .npz, as NAME.0, NAME.1, ...; a .npy holds one
    array, so a sequence is refused there. An empty optional saves nothing."""
    check_output_path(path, list(outputs))
    arrays: dict[str, np.ndarray] = {}
    for name, value in outputs.items():
        if value is None:       # an empty optional: nothing to save
            continue
        if not isinstance(value, list):
            arrays[name] = value
            continue
        if Path(path).suffix.lower() != ".npz":
            raise SaturateError(f"{path}: output '{name}' is a sequence of {len(value)} tensors; "
                                "save it to a .npz (one array per item, as NAME.0, NAME.1...)")
        for k, item in enumerate(value):
            key = f"{name}.{k}"
            if key in outputs:
                raise SaturateError(f"{path}: item {k} of sequence output '{name}' would be saved as '{key}', "
                                    "which is another output's name")
            arrays[key] = item

    def write(f) -> None:
        if Path(path).suffix.lower() == ".npz":
            np.savez(f, **arrays)
        else:
            np.save(f, next(iter(arrays.values())), allow_pickle=False)

    write_atomic(path, write)


def summary(name: str, value: np.ndarray, count: int) -> str:
    """One line: name, dtype[shape], the first values, and the range."""
    flat = value.reshape(-1)
    head = ", ".join(f"{v:.6g}" if flat.dtype.kind == "f" else str(v) for v in flat[:max(count, 0)])
    more = ", ..." if flat.size > count else ""
    line = f"{name}: {value.dtype}{list(value.shape)} [{head}{more}]"
    if flat.size and flat.dtype.kind in "fiub":
        line += f" min {flat.min():.6g} max {flat.max():.6g}"
    return one_line(line)
