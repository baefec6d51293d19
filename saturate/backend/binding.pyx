# cython: language_level=3, boundscheck=False, wraparound=False
"""A model compiled by saturate's C backend, as a Python extension module.

`saturate compile MODEL -o DIR` writes this module into DIR (saturate_model.<python tag>.so) with the
model's code linked in, so `import saturate_model` with DIR on sys.path needs nothing but numpy:

    m = saturate_model.Model()          # reads DIR/weights.bin
    outs = m(x)                         # {output name: float32 array}; m.run([x]) gives a list

Inputs are read without copies: numpy arrays straight from their data pointer, other objects through
the buffer protocol (float32, C-contiguous, the compiled shape). A call's output arrays are never
written by a later call while anything holds a reference to them (a dict, a view, a memoryview): the
model keeps its last outputs and writes into them again only once it holds the last reference (the
caller dropped them), which saves allocating and page-faulting them every call. The GIL is released
while the C runs, and calls from several threads take turns.
"""

cimport numpy as cnp
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.dict cimport PyDict_GetItem
from cpython.list cimport PyList_GET_ITEM
from cpython.ref cimport PyObject
from libc.stdint cimport int64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcmp

import os

import numpy as np

cnp.import_array()


cdef extern from *:
    """
    /* Whether the one reference to `o` is the one it was borrowed from (the model's list of kept outputs):
     * read through a borrowed pointer, since an object variable would hold a reference of its own. */
    static int satb_sole_reference(PyObject *o) { return Py_REFCNT(o) == 1; }
    """
    bint satb_sole_reference(PyObject *o)


cdef extern from "binding.h" nogil:
    int sat_init(const char *weights_path)
    int64_t sat_workspace_bytes()
    float *sat_workspace_alloc()
    void sat_workspace_free(float *ws)
    void sat_free()
    int sat_num_inputs()
    int sat_num_outputs()
    const char *sat_input_name(int i)
    const char *sat_output_name(int i)
    const char *sat_input_dtype(int i)
    const char *sat_output_dtype(int i)
    int sat_input_rank(int i)
    int sat_output_rank(int i)
    const int64_t *sat_input_shape(int i)
    const int64_t *sat_output_shape(int i)
    int satb_run(void **inputs, void **outputs, void *workspace, int threads)
    double satb_time_runs(void **inputs, void **outputs, void *workspace, int threads, int64_t calls, int cpu_clock)
    double *satb_profile()
    int64_t sat_heap_bytes()
    int64_t sat_heap_peak_bytes()
    void sat_heap_reset_peak()


cdef list _describe(bint outputs):
    out = []
    cdef const int64_t *dims
    for i in range(sat_num_outputs() if outputs else sat_num_inputs()):
        dims = sat_output_shape(i) if outputs else sat_input_shape(i)
        rank = sat_output_rank(i) if outputs else sat_input_rank(i)
        name = sat_output_name(i) if outputs else sat_input_name(i)
        dtype = sat_output_dtype(i) if outputs else sat_input_dtype(i)
        out.append((name.decode("utf-8"), tuple(int(dims[d]) for d in range(rank)), dtype.decode()))
    return out


# What the compiled library takes and returns: [(name, shape, dtype)] in sat_run's order.
INPUTS = _describe(False)
OUTPUTS = _describe(True)
WORKSPACE_BYTES = int(sat_workspace_bytes())
cdef tuple _INPUT_NAMES = tuple(name for name, _, _ in INPUTS)
cdef tuple _OUTPUT_NAMES = tuple(name for name, _, _ in OUTPUTS)

# The shapes again, as numpy dimension arrays: a call checks and allocates arrays with no Python objects.
cdef int _NIN = len(INPUTS), _NOUT = len(OUTPUTS)
cdef int *_RANK = <int *>malloc(sizeof(int) * (_NIN + _NOUT + 1))
cdef cnp.npy_intp **_DIMS = <cnp.npy_intp **>malloc(sizeof(cnp.npy_intp *) * (_NIN + _NOUT + 1))


cdef int _shape_tables() except -1:
    if _RANK == NULL or _DIMS == NULL:
        raise MemoryError()
    for k, (_, shape, _) in enumerate(INPUTS + OUTPUTS):
        _RANK[k] = len(shape)
        _DIMS[k] = <cnp.npy_intp *>malloc(sizeof(cnp.npy_intp) * (len(shape) + 1))
        if _DIMS[k] == NULL:
            raise MemoryError()
        for d in range(len(shape)):
            _DIMS[k][d] = shape[d]
    return 0


_shape_tables()

# Calls with at most this many inputs and outputs keep their pointers on the stack.
cdef enum:
    _STACK_POINTERS = 16

# The weights file the library holds (the C keeps one set per loaded library), and the heap held once
# they were read: what the kernels hold beyond it is their scratch.
_weights = None
_heap_base = 0


cdef class Model:
    """The compiled model with its weights read and a workspace of its own.

    Model(weights=None, threads=1): `weights` defaults to weights.bin beside this module; `threads` is
    the default thread count of a call."""

    cdef float *_ws
    cdef public int threads
    cdef readonly list inputs, outputs
    cdef readonly int64_t workspace_bytes
    cdef list _kept  # the last outputs this model allocated, reused once it holds their only reference

    def __cinit__(self, weights=None, int threads=1):
        global _weights, _heap_base
        self._ws = NULL
        path = os.path.abspath(weights if weights is not None else
                               os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights.bin"))
        if _weights is not None and _weights != path:
            raise ValueError(f"this library already holds the weights of {_weights}; a second set needs its own copy "
                             f"of the module")
        if sat_init(os.fsencode(path)) != 0:
            raise OSError(f"cannot load weights from {path}: missing, unreadable or not the size this model was "
                          f"compiled with")
        if _weights is None:
            _heap_base = sat_heap_bytes()
        _weights = path
        if threads < 1:
            raise ValueError(f"thread count must be at least 1, got {threads}")
        self.threads = threads
        self.inputs, self.outputs = INPUTS, OUTPUTS
        self.workspace_bytes = WORKSPACE_BYTES
        self._kept = [None] * _NOUT
        self._ws = sat_workspace_alloc()
        if self._ws == NULL:
            raise MemoryError(f"cannot allocate the {WORKSPACE_BYTES}-byte workspace")

    def __dealloc__(self):
        sat_workspace_free(self._ws)

    def run(self, arrays, int threads=0, outputs=None):
        """Run on a sequence of float32, C-contiguous arrays (or any buffers) of the input shapes, in order;
        returns the outputs as a list of float32 arrays no one else holds (new, or this model's last
        ones once dropped), or fills `outputs`, buffers of the output shapes, and returns them."""
        if len(arrays) != _NIN:
            raise ValueError(f"the model takes {_NIN} input(s), got {len(arrays)}")
        if outputs is None:
            return self._run(tuple(arrays), threads if threads > 0 else self.threads, None, False)
        if len(outputs) != _NOUT:
            raise ValueError(f"the model has {_NOUT} output(s), got {len(outputs)} buffers")
        self._run(tuple(arrays), threads if threads > 0 else self.threads, tuple(outputs), False)
        return outputs

    def call(self, tuple args, int threads):
        """{output name: array} of a call on `args`: the input arrays in order, or one {name: array}
        dict; `threads` >= 1. What CompiledModel calls; raises TypeError or ValueError on what it refuses."""
        if threads < 1:
            raise ValueError(f"thread count must be at least 1, got {threads}")
        if len(args) == 1 and isinstance(args[0], dict):
            return self._run(_by_name(args[0]), threads, None, True)
        if len(args) != _NIN:
            raise ValueError(f"the model takes {_NIN} input(s), got {len(args)}")
        return self._run(args, threads, None, True)

    def __call__(self, *args, int threads=0, **kwargs):
        """Inputs by position, by name, or as one dict; returns {output name: array}."""
        if not kwargs:
            return self.call(args, threads if threads > 0 else self.threads)
        if len(args) > _NIN:
            raise ValueError(f"the model takes {_NIN} input(s), got {len(args)}")
        given = dict(zip(_INPUT_NAMES, args))
        given.update(kwargs)
        return self._run(_by_name(given), threads if threads > 0 else self.threads, None, True)

    cdef object _run(self, tuple arrays, int threads, tuple given, bint as_dict):
        """Run on `arrays` (the inputs in order) into `given` (output buffers) or new arrays; returns the
        outputs as a list, or a dict by name."""
        cdef void *stack[_STACK_POINTERS]
        cdef void **ptrs = stack
        cdef Py_buffer *views = NULL
        cdef int k, rc, total = _NIN + _NOUT
        cdef list fresh = None
        if given is None:
            fresh = self._outputs()
            given = tuple(fresh)
        if total > _STACK_POINTERS:
            ptrs = <void **>malloc(sizeof(void *) * total)
            if ptrs == NULL:
                raise MemoryError()
        try:
            _pointers(arrays, given, fresh is not None, ptrs, &views)
            with nogil:
                rc = satb_run(ptrs, ptrs + _NIN, self._ws, threads)
            if rc == 2:
                raise IndexError("an index input of the compiled model is out of range (its rows came out as zeros)")
            if rc != 0:
                raise RuntimeError("compiled model failed to run (weights not loaded)")
        finally:
            _release(views)
            if ptrs != stack:
                free(ptrs)
        if not as_dict:
            return fresh if fresh is not None else list(given)
        out = {}
        for k in range(_NOUT):
            out[_OUTPUT_NAMES[k]] = given[k]
        return out

    cdef list _outputs(self):
        """Arrays for this call's outputs: each one kept from an earlier call if the model holds its only
        reference (so nothing can see it written) and it still fits (its shape, dtype or flags may have
        been changed in place), else a new one, kept in its place."""
        cdef PyObject *kept
        cdef list out = []
        for k in range(_NOUT):
            kept = PyList_GET_ITEM(self._kept, k)
            if satb_sole_reference(kept) and _takes(<object>kept, _NIN + k):
                out.append(<object>kept)
                continue
            fresh = cnp.PyArray_EMPTY(_RANK[_NIN + k], _DIMS[_NIN + k], cnp.NPY_FLOAT32, 0)
            self._kept[k] = fresh
            out.append(fresh)
        return out

    def scratch_bytes(self, int threads=0):
        """Heap the kernels hold at the peak of one call on `threads` threads (run on zeros): each extra
        thread's convolution scratch and the per-thread buffers kernels grow and keep. The workspace
        (workspace_bytes) comes on top."""
        sat_heap_reset_peak()
        self.run([np.zeros(shape, np.float32) for _, shape, _ in INPUTS], threads)
        return int(sat_heap_peak_bytes() - _heap_base)

    def time_sat_run(self, arrays, int64_t calls, int threads=0, bint cpu_clock=True):
        """Seconds `calls` back-to-back sat_run calls on `arrays` take, timed in C around the loop (the
        calling thread's CPU time with `cpu_clock`, else wall time): the time inside sat_run, against which
        the bench measures what a call from Python adds."""
        cdef void *stack[_STACK_POINTERS]
        cdef void **ptrs = stack
        cdef Py_buffer *views = NULL
        cdef int n = threads if threads > 0 else self.threads
        cdef double seconds
        if len(arrays) != _NIN:
            raise ValueError(f"the model takes {_NIN} input(s), got {len(arrays)}")
        arrays = tuple(arrays)
        outputs = tuple(cnp.PyArray_EMPTY(_RANK[k], _DIMS[k], cnp.NPY_FLOAT32, 0) for k in range(_NIN, _NIN + _NOUT))
        if _NIN + _NOUT > _STACK_POINTERS:
            ptrs = <void **>malloc(sizeof(void *) * (_NIN + _NOUT))
            if ptrs == NULL:
                raise MemoryError()
        try:
            _pointers(arrays, outputs, True, ptrs, &views)
            with nogil:
                seconds = satb_time_runs(ptrs, ptrs + _NIN, self._ws, n, calls, cpu_clock)
        finally:
            _release(views)
            if ptrs != stack:
                free(ptrs)
        return seconds

    def step_seconds(self, int steps):
        """Accumulated seconds of each of the first `steps` kernel steps (profiling builds), else None."""
        cdef double *t = satb_profile()
        return None if t == NULL else [t[k] for k in range(steps)]


cdef tuple _by_name(dict given):
    """The inputs of a {name: array} dict in sat_run's order; ValueError naming unknown or missing ones."""
    cdef PyObject *item
    cdef list found = []
    for name in _INPUT_NAMES:
        item = PyDict_GetItem(given, name)
        if item == NULL:
            break
        found.append(<object>item)
    if len(found) == _NIN and len(given) == _NIN:
        return tuple(found)
    unknown = sorted(set(given) - set(_INPUT_NAMES))
    if unknown:
        raise ValueError(f"unknown input(s) {unknown}; the model takes {list(_INPUT_NAMES)}")
    raise ValueError(f"missing input(s) {[name for name in _INPUT_NAMES if name not in given]}")


cdef inline bint _takes(object obj, int k) noexcept:
    """Whether `obj` is a numpy array sat_run can read (k < _NIN) or write as value k with no copy and no
    buffer request: float32 in native byte order, aligned, C-contiguous, writable for an output, of the
    compiled shape. Anything else goes through the buffer protocol, which checks it and names the problem."""
    cdef cnp.ndarray a
    if not cnp.PyArray_Check(obj):
        return False
    a = <cnp.ndarray>obj
    if cnp.PyArray_TYPE(a) != cnp.NPY_FLOAT32 or cnp.PyArray_NDIM(a) != _RANK[k]:
        return False
    if not (cnp.PyArray_ISCARRAY(a) if k >= _NIN else cnp.PyArray_ISCARRAY_RO(a)):
        return False
    return memcmp(cnp.PyArray_DIMS(a), _DIMS[k], sizeof(cnp.npy_intp) * _RANK[k]) == 0


cdef int _pointers(tuple arrays, tuple outputs, bint fresh, void **ptrs, Py_buffer **views) except -1:
    """Fill ptrs with the data of the inputs, then the outputs (`fresh`: arrays this call allocated, known
    to fit). What is not a numpy array that fits is requested through the buffer protocol into *views
    (allocated on first need; the caller releases it with _release, whatever this raises)."""
    cdef int k, total = _NIN + _NOUT
    for k in range(total):
        obj = arrays[k] if k < _NIN else outputs[k - _NIN]
        if (fresh and k >= _NIN) or _takes(obj, k):
            ptrs[k] = cnp.PyArray_DATA(<cnp.ndarray>obj)
            continue
        if views[0] == NULL:
            views[0] = <Py_buffer *>calloc(total, sizeof(Py_buffer))
            if views[0] == NULL:
                raise MemoryError()
        _request(obj, k, &views[0][k])
        ptrs[k] = views[0][k].buf
    return 0


cdef void _release(Py_buffer *views) noexcept:
    """Release the buffers _pointers requested (a view never requested has no obj and releases nothing)."""
    if views == NULL:
        return
    for k in range(_NIN + _NOUT):
        PyBuffer_Release(&views[k])
    free(views)


cdef int _request(object obj, int k, Py_buffer *view) except -1:
    """Request value k's buffer from `obj` and check it, with a one-line TypeError or ValueError naming
    the value and what is wrong."""
    cdef bint is_input = k < _NIN
    name, shape, _ = INPUTS[k] if is_input else OUTPUTS[k - _NIN]
    what = "input" if is_input else "output buffer"
    flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (0 if is_input else PyBUF_WRITABLE)
    try:
        PyObject_GetBuffer(obj, view, flags)
    except (TypeError, BufferError, ValueError):
        raise TypeError(f"{what} '{name}' must be a C-contiguous float32 array{'' if is_input else ' that can be written'}, "
                        f"got {type(obj).__name__}") from None
    fmt = view.format.decode() if view.format != NULL else "B"
    if view.itemsize != 4 or fmt.lstrip("@=<") != "f":
        raise TypeError(f"{what} '{name}' has item format '{fmt}'; the compiled model takes float32")
    got = tuple(view.shape[d] for d in range(view.ndim))
    if got != shape:
        raise ValueError(f"{what} '{name}' has shape {got}; the compiled model expects {shape}")
    return 0


def release():
    """Free the weights the library holds (every Model of this module stops working until a new one loads)."""
    global _weights
    sat_free()
    _weights = None
