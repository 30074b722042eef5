"""Shared plumbing for every kernel family: grid sizes, kernel registration, argument checks.

Every ``@cuda_kernel(signature)`` records the kernel's Python function and the Numba type
signature it is meant to run with. The PTX test (``tests/test_ptx.py``) compiles each one with
``numba.cuda.compile_ptx`` for a real GPU, on the CPU, because the simulator checks no types.

The same registration records launches: inside ``with record_launches() as launches:`` a
registered kernel runs nothing, and each ``kernel[grid, block, stream](...)`` (or
``kernel.launch(geometry, stream, ...)``) appends a :class:`Launch` (kernel, grid, block, shared
memory and, where the launcher computes it, the launch's work) to ``launches``. Called with
:class:`ShapeArray` arguments (a shape and a dtype, no data), a launcher then reports exactly the
launches it would make, on any machine: ``kernels.launches`` builds its report that way.

Conventions every family follows (docs/kernels.md, "Kernel conventions", says more):
- float32, C-contiguous, NCHW; integer labels are int32, dropout masks uint8.
- A launcher ``op(inputs..., outputs..., *, hyper=..., stream=0, version=...)`` returns None and
  never allocates device memory; its NumPy reference ``op_ref`` takes the same positional and
  hyper-parameter arguments and writes the same outputs in place.
- Ints are passed to kernels as Python ints (int64), floats as ``np.float32``.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np
from numba import cuda, float32, typeof
from numba.core import sigutils, types


def ceil_div(a: int, b: int) -> int:
    """Number of blocks of size ``b`` needed to cover ``a`` items."""
    return -(-int(a) // int(b))


def flat(a, name: str = "an array used flat"):
    """``a`` viewed as 1-D, for the kernels that treat every element alike. A strided view is refused:
    the simulator's reshape copies it (the kernel then writes the copy, and the view keeps its old
    values, silently), a GPU's raises from inside Numba."""
    contiguous(name, a)
    return a.reshape(a.size)


def launch_1d(kernel, n, block, stream, *args):
    """``kernel`` with one thread per element of ``n``, in blocks of ``block``; nothing when ``n`` is 0
    (CUDA refuses a grid of no blocks)."""
    if n:
        kernel[ceil_div(n, block), block, stream](*args)


# CUDA's limits on a grid (blocks in x, y, z). Grid z is what grows with the batch (one image or
# matrix per z), so the launchers split a batch into launches of at most MAX_GRID_Z (`grid_z_parts`).
# The 1-D launches (x = ceil(elements / block)) would need more than (2**31 - 1) * 128 elements,
# over 1 TiB of float32, more than any device holds; grid y counts rows or channels of one matrix.
# `Kernel.launch` refuses a grid beyond these with a ValueError rather than a failed CUDA launch.
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_GRID_Z = MAX_GRID[2]


def grid_z_parts(total: int, most: int):
    """Yield (first, count) covering ``range(total)`` in order, ``count`` at most ``most``: the
    launches of a batch of ``total`` along grid z (one launch when it fits)."""
    for first in range(0, int(total), int(most)):
        yield first, min(int(most), int(total) - first)


def _check_grid(name: str, grid) -> None:
    for axis, blocks, most in zip("xyz", _dim3(grid), MAX_GRID):
        if blocks > most:
            raise ValueError(f"{name}: a grid of {blocks:,d} blocks in {axis}, more than CUDA's {most:,d} "
                             f"(grid {tuple(_dim3(grid))})")


MAX_BLOCK, MAX_THREADS = (1024, 1024, 64), 1024  # CUDA's limits on a block, every GPU since 2010


def _check_block(name: str, block) -> None:
    dims = _dim3(block)
    if math.prod(dims) > MAX_THREADS or any(d > most for d, most in zip(dims, MAX_BLOCK)) or min(dims) < 1:
        raise ValueError(f"{name}: a block of {dims} threads; CUDA takes at most {MAX_THREADS} threads a "
                         f"block, at most {MAX_BLOCK} in x, y, z (the simulator runs any; a GPU refuses it)")


def _check_args(name: str, args) -> None:
    """A kernel reads device arrays: a NumPy array given to one makes a GPU copy it to a fresh device
    buffer and back at every launch (an allocation outside the pool, synchronous, on no stream)."""
    for k, a in enumerate(args):
        if isinstance(a, np.ndarray) and a.ndim:
            raise ValueError(f"{name}: argument {k} is a NumPy array of shape {a.shape}: a kernel reads "
                             "device arrays (the pool's views, or cuda.to_device once, outside launchers)")


_CHECK_TYPES: contextvars.ContextVar = contextvars.ContextVar("kernels_check_types", default=False)


@contextlib.contextmanager
def checking_types():
    """Within the block, every kernel launch compares the types of what it is given with the signature
    its ``@cuda_kernel`` declares, which is what the PTX check compiles: the simulator checks no types,
    and on a GPU the lazy jit compiles for what is passed (a Python float makes float64 arithmetic of a
    kernel declared float32)."""
    token = _CHECK_TYPES.set(True)
    try:
        yield
    finally:
        _CHECK_TYPES.reset(token)


def _typeof(a):
    return typeof(getattr(a, "_ary", a))  # (the simulator's device array wraps a NumPy one)


def _check_types(spec: "KernelSpec", args) -> None:
    declared, _ = sigutils.normalize_signature(spec.signature)
    if len(declared) != len(args):
        raise TypeError(f"{spec.name}: declared with {len(declared)} arguments ({spec.signature}), "
                        f"launched with {len(args)}")
    for k, (want, a) in enumerate(zip(declared, args)):
        got = _typeof(a)
        if isinstance(want, types.Array):
            ok = (isinstance(got, types.Array) and got.dtype == want.dtype and got.ndim == want.ndim
                  and (want.layout != "C" or got.layout == "C"))
        else:
            ok = got == want
        if not ok:
            raise TypeError(f"{spec.name}: argument {k} is {got}, but its @cuda_kernel signature declares "
                            f"{want}, which is what the PTX check compiles: pass that type (np.float32(x) "
                            "for a float), or declare what it is")


@dataclass(frozen=True)
class KernelSpec:
    """A CUDA kernel as written (``py_func``) and the signature the PTX check compiles it with."""

    name: str
    py_func: Callable
    signature: str


_KERNELS: list[KernelSpec] = []


def _dim3(v) -> tuple[int, int, int]:
    v = (int(v),) if isinstance(v, (int, np.integer)) else tuple(int(d) for d in v)
    return v + (1,) * (3 - len(v))


@dataclass(frozen=True)
class Launch:
    """One kernel launch: the kernel, its grid and block as (x, y, z), its dynamic shared memory
    (static shared memory belongs to the compiled kernel: see ``kernels.launches``) and, where the
    launcher computes it, its work: ``flops`` (2 per multiply-add), ``bytes`` of global memory it
    moves under its own reuse (tiles), and ``fma_share``, the share of its inner loop's issue slots
    that are FMAs (1/3 for one FMA per two loads; ``tm*tn / (tm*tn + tm + tn)`` for a register
    micro-tile). ``kernels.launches.launch_ms`` turns these into an estimated time."""

    kernel: str
    grid: tuple
    block: tuple
    shared_bytes: int = 0
    flops: int | None = None
    bytes: int | None = None
    fma_share: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "grid", _dim3(self.grid))
        object.__setattr__(self, "block", _dim3(self.block))

    @property
    def blocks(self) -> int:
        return math.prod(self.grid)

    @property
    def threads_per_block(self) -> int:
        return math.prod(self.block)


_RECORDER: contextvars.ContextVar = contextvars.ContextVar("kernels_launch_recorder", default=None)


@contextlib.contextmanager
def record_launches():
    """Within the block, registered kernels run nothing and every launch is appended to the list
    this yields (nested blocks record into the innermost)."""
    launches: list[Launch] = []
    token = _RECORDER.set(launches)
    try:
        yield launches
    finally:
        _RECORDER.reset(token)


def _no_run(*args):
    return None


class Kernel:
    """A registered kernel: ``kernel[grid, block, stream](...)`` as with Numba, or
    ``kernel.launch(geometry, stream, ...)`` with a :class:`Launch` computed by the launcher's
    own pure geometry function. Both record instead of running inside :func:`record_launches`."""

    def __init__(self, spec: KernelSpec, dispatcher):
        self.spec, self.dispatcher = spec, dispatcher

    @property
    def name(self) -> str:
        return self.spec.name

    def __getitem__(self, config):
        _check_grid(self.name, config[0])
        _check_block(self.name, config[1])
        recorder = _RECORDER.get()
        if recorder is None:
            run = self.dispatcher[config]
            return lambda *args: self._run(run, args)
        recorder.append(Launch(self.name, config[0], config[1], int(config[3]) if len(config) > 3 else 0))
        return _no_run

    def _run(self, run, args) -> None:
        _check_args(self.name, args)
        if _CHECK_TYPES.get():
            _check_types(self.spec, args)
        run(*args)

    def launch(self, geometry: Launch, stream, *args) -> None:
        if geometry.kernel != self.name:
            raise ValueError(f"launch geometry is for {geometry.kernel}, not {self.name}")
        if not geometry.blocks:  # nothing to do: no launch
            return
        _check_grid(self.name, geometry.grid)
        _check_block(self.name, geometry.block)
        recorder = _RECORDER.get()
        if recorder is not None:
            recorder.append(geometry)
        else:
            self._run(self.dispatcher[geometry.grid, geometry.block, stream, geometry.shared_bytes], args)

    def __getattr__(self, name):  # everything else is the Numba dispatcher's
        return getattr(self.dispatcher, name)

    def __repr__(self) -> str:
        return f"<registered kernel {self.name}>"


def cuda_kernel(signature: str, module: str | None = None):
    """Decorator: ``cuda.jit`` the function lazily and record ``signature`` for the PTX check;
    returns a :class:`Kernel` (launched like a Numba kernel, and able to record its launches).
    The kernel is registered as ``<module>.<function name>``; ``module`` defaults to the function's
    own (a family whose kernels live in a module of their own, ``kernels.conv_direct``, names its
    family's instead, so the launch report and ``registers.json`` find them under the family).

    The jit stays lazy (no signature passed to Numba) so the simulator accepts the same code;
    the recorded signature uses C-contiguous layouts (``float32[:, ::1]``), int64 for Python
    ints and float32 for floats, which is what the launchers pass.
    """

    def deco(fn):
        where = module or fn.__module__
        if where == "__main__":  # python -m kernels.conv: the name it has when imported
            main_spec = getattr(sys.modules["__main__"], "__spec__", None)
            where = main_spec.name if main_spec else where
        spec = KernelSpec(f"{where}.{fn.__name__}", fn, signature)
        _KERNELS.append(spec)
        return Kernel(spec, cuda.jit(fn))

    return deco


EXP_OVERFLOW = 88.72283935546875  # the least float32 whose exp (and expm1) rounds to inf in float32


@cuda.jit(device=True, inline=True)
def exp32(t):
    """exp(t) in float32: inf from EXP_OVERFLOW up (NaN stays NaN), as expf gives; the simulator's
    math.exp would raise OverflowError there."""
    if t >= float32(EXP_OVERFLOW):
        return float32(math.inf)
    return float32(math.exp(t))


@cuda.jit(device=True, inline=True)
def unravel4(i, d1, d2, d3):
    """Flat index -> (a, b, c, d) of a C-contiguous 4-D array of shape (_, d1, d2, d3)."""
    return i // (d1 * d2 * d3), (i // (d2 * d3)) % d1, (i // d3) % d2, i % d3


def _address(a) -> int | None:
    """Where ``a``'s data starts: a CUDA array's device pointer, the simulator's NumPy buffer; None
    for a :class:`ShapeArray` (the meta device holds no memory)."""
    cai = getattr(a, "__cuda_array_interface__", None)  # (the simulator's arrays raise AttributeError)
    if cai is not None:
        return cai["data"][0]
    wrapped = getattr(a, "_ary", None)  # the simulator's FakeCUDAArray wraps a NumPy array
    return wrapped.__array_interface__["data"][0] if isinstance(wrapped, np.ndarray) else None


def check_apart(op: str, out: tuple, *inputs: tuple) -> None:
    """ValueError unless the output ``out`` = (name, array) shares no byte with any input (name,
    array): a kernel that reads an input after another thread wrote the output over it races on a
    GPU (on the simulator, whose threads run one after another, it computes something else)."""
    name, a = out
    start = _address(a)
    if start is None or a.nbytes == 0:
        return
    for what, b in inputs:
        other = _address(b) if b is not None else None
        if other is not None and b.nbytes and other < start + a.nbytes and start < other + b.nbytes:
            raise ValueError(f"{op} {name}: overlaps {what} (the kernel reads {what} while it writes "
                             f"{name}): give {name} a buffer of its own")


def registered_kernels() -> tuple[KernelSpec, ...]:
    """Every kernel recorded so far (import the family modules first)."""
    return tuple(_KERNELS)


@dataclass(frozen=True)
class Op:
    """A public operation: its NumPy reference and its CUDA launcher (same arguments)."""

    name: str
    reference: Callable
    launch: Callable
    versions: tuple[str, ...] = ("v1",)


@dataclass(frozen=True)
class ShapeArray:
    """An array with a shape and a dtype but no data: launchers accept it in place of a device
    array inside :func:`record_launches`, to report their launches without running anything.
    Supports what launchers do to arrays: ``shape``, ``dtype``, ``size``, ``ndim``, ``reshape``
    (one ``-1`` allowed) and basic indexing (ints and step-1 slices)."""

    shape: tuple
    dtype: np.dtype = np.dtype(np.float32)

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def reshape(self, *shape):
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if -1 in shape:
            rest = math.prod(d for d in shape if d != -1)
            shape = tuple(self.size // rest if d == -1 and rest else (0 if d == -1 else d) for d in shape)
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape an array of shape {self.shape} to {tuple(shape)}")
        return ShapeArray(shape, self.dtype)

    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        if len(index) > self.ndim:
            raise IndexError(f"too many indices for an array of shape {self.shape}")
        out = []
        for d, i in zip(self.shape, index):
            if isinstance(i, slice):
                start, stop, step = i.indices(d)
                if step != 1:
                    raise IndexError("ShapeArray supports step-1 slices only")
                out.append(max(stop - start, 0))
            elif not -d <= int(i) < d:
                raise IndexError(f"index {i} is out of bounds for an axis of size {d}")
        return ShapeArray(tuple(out) + self.shape[len(index):], self.dtype)


LAUNCH_ONLY = ("stream", "version", "block")  # launcher arguments a reference does not take


def check(name: str, a, shape=None, dtype=np.float32) -> None:
    """Raise a ValueError naming ``name`` unless ``a`` is a C-contiguous device array (or a
    :class:`ShapeArray`) of ``dtype`` and ``shape``."""
    if a is None or not (hasattr(a, "shape") and hasattr(a, "dtype")):
        raise ValueError(f"{name}: expected a device array, got {'None' if a is None else type(a).__name__}")
    if isinstance(a, np.ndarray):
        raise ValueError(f"{name}: expected a device array, got a NumPy array: a launcher runs on the device "
                         "(a GPU would copy it in and out at every launch, allocating); copy it once with "
                         "cuda.to_device, or use a view of the pool")
    if dtype is not None and np.dtype(a.dtype) != np.dtype(dtype):
        raise ValueError(f"{name}: expected dtype {np.dtype(dtype)}, got {a.dtype}")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(a.shape)}")
    contiguous(name, a)


def contiguous(name: str, a) -> None:
    """Raise a ValueError naming ``name`` if ``a`` is a strided view (not C-contiguous): kernels index
    their arrays as laid out whole. A :class:`ShapeArray` has no layout to check."""
    flags = getattr(a, "flags", None)  # NumPy, Numba's and CuPy's arrays have flags
    if flags is not None and not flags["C_CONTIGUOUS"]:
        raise ValueError(f"{name}: expected a C-contiguous array, got a strided view of shape "
                         f"{tuple(a.shape)}: pass the whole array, or a contiguous copy")


def check_version(version: str, versions: tuple[str, ...]) -> None:
    if version not in versions:
        raise ValueError(f"unknown kernel version {version!r}; choose one of {versions}")


def pair(v, name: str) -> tuple[int, int]:
    """Normalise an int or a pair of ints (stride, padding, kernel size) to ``(h, w)``."""
    if isinstance(v, (int, np.integer)):
        return int(v), int(v)
    try:
        h, w = v
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected an int or a pair of ints, got {v!r}") from None
    return int(h), int(w)
