"""Devices: where snlite's tensors live and its kernels run. The only module of snlite that
imports ``numba.cuda``.

Three devices, one interface:

- :class:`CudaDevice`: Numba CUDA on a real NVIDIA GPU, or on the CUDA simulator when the
  environment variable ``NUMBA_ENABLE_CUDASIM=1`` was set before numba was first imported.
- :class:`HostDevice`: NumPy arrays, and each kernel's fast CPU version (:mod:`kernels.host`),
  else its NumPy reference: the fast CPU path.
- :class:`MetaDevice`: no storage and no compute, only shapes and byte counts, so the scheduler
  can plan a network of thousands of layers in seconds.

The interface: one arena buffer of a given size, with tensors as 256-byte-aligned views into it;
pinned host buffers (a slab, also carved into views); named streams and events (no-ops where the
device has none); asynchronous host<->device copies; the CPU's own reads and writes of pinned
memory; and running a kernel by name on a stream (``device.run("relu_forward", x, y, stream=s)``).
There is no hidden stream: during an iteration every operation names one of the program's streams
(:mod:`snlite.executor`); ``stream=None`` means the default stream and is for work outside an
iteration (tests, setting weights). Each device counts the bytes it has allocated (``arena_bytes``,
``pinned_bytes``): on all three the same program allocates the same bytes.
"""
from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import dataclass

import numpy as np

ALIGNMENT_BYTES = 256  # every tensor view starts at a multiple of this offset into the arena
DEVICE_NAMES = ("cuda", "host", "meta", "auto")
# The version the simulator runs where the caller names none: v1 (one thread per output element,
# per channel, per row) where that is cheaper to simulate than the GPU's default. The simulator runs
# every thread as a Python thread through every barrier, so a block of 128 threads reducing one
# channel through a shared-memory tree costs it minutes (bias_backward v2: 176 s for an (8, 500)
# gradient), as do tiles most of whose threads idle (measured on a digits LeNet, batch 4:
# linear_forward v3 22 s, and v1 5 s at batch 16; conv2's backward-filter v2 64 s, v1 28 s). Not the
# conv forward, nor a linear layer's weight gradient: there v1's one thread per output, each with a
# long loop, simulates slower than the tiles (conv2's forward v1 168 s at batch 16, v2 25 s at
# batch 4). Conv and gemm versions give the same bits; bias_backward, batch normalization and
# softmax sum in another order in v1, and every run on the simulator uses it, so results stay
# bit-identical across configurations there too.
SIMULATOR_VERSIONS = {name: "v1" for name in (
    "conv2d_backward_filter", "linear_forward", "linear_backward_data", "bias_backward", "batchnorm_forward_train",
    "batchnorm_backward", "softmax_xent_forward")}


def align_up(nbytes: int, alignment: int = ALIGNMENT_BYTES) -> int:
    """Round ``nbytes`` up to a multiple of ``alignment``."""
    return -(-int(nbytes) // alignment) * alignment


def nbytes_of(shape, dtype=np.float32) -> int:
    """Exact bytes of a dense tensor of ``shape`` and ``dtype``."""
    return math.prod(int(s) for s in shape) * np.dtype(dtype).itemsize


# ---------------------------------------------------------------- buffers and views
@dataclass(frozen=True)
class Buffer:
    """One allocation made by a device: the arena, or a pinned host slab."""

    device: "Device"
    nbytes: int
    raw: object  # the device's own storage: a numba device array, a numpy array, or None on meta
    pinned: bool = False  # a host slab rather than device memory


@dataclass(frozen=True)
class MetaArray:
    """A tensor on the meta device: shape, dtype and where it sits, but no data."""

    shape: tuple
    dtype: np.dtype
    offset_bytes: int = 0

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
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape a meta tensor of shape {self.shape} to {shape}")
        return MetaArray(tuple(shape), self.dtype, self.offset_bytes)


# ---------------------------------------------------------------- streams and events
class NullStream:
    """A stream on a device that runs everything at once, in order (host and meta)."""

    raw = 0

    def __init__(self, name: str = "default"):
        self.name = name

    def synchronize(self) -> None:
        pass


class NullEvent:
    """An event on a device without asynchrony: always complete."""

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_ms(self, end: "NullEvent") -> float:
        return 0.0


class WallEvent(NullEvent):
    """A timing event on the host, where work runs as it is issued: ``elapsed_ms`` is the wall-clock
    time between the two records."""

    def __init__(self):
        self.wall = None

    def record(self, stream=None) -> None:
        self.wall = time.perf_counter()

    def elapsed_ms(self, end: "WallEvent") -> float:
        return (end.wall - self.wall) * 1e3


class CudaStream:
    def __init__(self, raw, name: str = "default"):
        self.raw, self.name = raw, name

    def synchronize(self) -> None:
        self.raw.synchronize()


class CudaEvent:
    """A CUDA event; ``wait(stream)`` makes ``stream`` wait for it without blocking the host.
    On the simulator, which runs everything synchronously and records no times, ``elapsed_ms``
    is host wall-clock time between the two records (the cost of simulating, not of a GPU)."""

    def __init__(self, raw, simulated: bool = False):
        self.raw = raw
        self.simulated = simulated
        self.wall = None

    def record(self, stream: CudaStream) -> None:
        self.raw.record(stream.raw)
        if self.simulated:
            self.wall = time.perf_counter()

    def wait(self, stream: CudaStream) -> None:
        self.raw.wait(stream.raw)

    def query(self) -> bool:
        query = getattr(self.raw, "query", None)  # the simulator's events are always complete
        return True if query is None else bool(query())

    def synchronize(self) -> None:
        self.raw.synchronize()

    def elapsed_ms(self, end: "CudaEvent") -> float:
        if self.simulated:
            return (end.wall - self.wall) * 1e3
        return float(self.raw.elapsed_time(end.raw))


# ---------------------------------------------------------------- the interface
class Device:
    """What every device offers. Subclasses provide storage, copies and kernels."""

    name = "abstract"
    has_data = True  # False on the meta device: arrays there hold no values

    def __init__(self) -> None:
        self.arena_bytes = 0  # bytes of arena memory allocated through this device
        self.pinned_bytes = 0  # bytes of pinned host memory allocated through this device
        self.kernel_calls = 0  # kernels run through this device

    # storage ---------------------------------------------------------------
    def alloc_arena(self, nbytes: int, stream=None) -> Buffer:
        """Allocate a device buffer (the one arena; with the raw allocator, one per tensor), filled with
        NaN bytes on ``stream`` (None: before this returns), so a read before any write shows."""
        nbytes = _positive(nbytes, "arena")
        buf = Buffer(self, nbytes, self._alloc(nbytes, pinned=False, stream=stream))
        self.arena_bytes += nbytes
        return buf

    def alloc_pinned(self, nbytes: int) -> Buffer:
        """Allocate a slab of pinned host memory, taken once and carved into views."""
        nbytes = _positive(nbytes, "pinned slab")
        buf = Buffer(self, nbytes, self._alloc(nbytes, pinned=True, stream=None), pinned=True)
        self.pinned_bytes += nbytes
        return buf

    def view(self, buf: Buffer, offset_bytes: int, shape, dtype=np.float32):
        """A tensor of ``shape`` at ``offset_bytes`` into ``buf`` (must be 256-byte aligned)."""
        if buf.device is not self:
            raise ValueError(f"this buffer belongs to the {buf.device.name} device, not the {self.name} device")
        shape = tuple(int(s) for s in shape)
        nbytes = nbytes_of(shape, dtype)
        if offset_bytes % ALIGNMENT_BYTES:
            raise ValueError(f"view offset {offset_bytes} is not a multiple of {ALIGNMENT_BYTES} bytes; "
                             f"round it with align_up()")
        if offset_bytes < 0 or offset_bytes + nbytes > buf.nbytes:
            raise ValueError(f"a view of {nbytes} bytes at offset {offset_bytes} does not fit in a buffer of "
                             f"{buf.nbytes} bytes")
        return self._view(buf, offset_bytes, shape, np.dtype(dtype))

    # streams, copies, kernels -------------------------------------------------
    def stream(self, name: str = "default"):
        return NullStream(name)

    def event(self, timing: bool = False):
        return NullEvent()

    def copy_to_host(self, src, dst, stream=None) -> None:
        """Start copying the device view ``src`` into the pinned host view ``dst``."""
        _same_layout("copy_to_host", src, dst)
        self._copy_to_host(src, dst, stream)

    def copy_to_device(self, src, dst, stream=None) -> None:
        """Start copying the pinned host view ``src`` into the device view ``dst``."""
        _same_layout("copy_to_device", src, dst)
        self._copy_to_device(src, dst, stream)

    def run(self, op_name: str, *args, stream=None, **kwargs) -> None:
        """Run the kernel ``op_name`` (see ``kernels.all_ops()``) on this device's arrays."""
        op = _ops().get(op_name)
        if op is None:
            raise ValueError(f"unknown kernel {op_name!r}; known kernels: {', '.join(sorted(_ops()))}")
        self.kernel_calls += 1
        self._run(op, args, stream, kwargs)

    def synchronize(self) -> None:
        pass

    def host_write(self, dst, src) -> None:
        """The CPU writes ``src`` into the pinned host view ``dst`` (a staged input)."""
        _same_layout("host_write", src, dst)
        np.copyto(dst, src)

    def host_read(self, src) -> np.ndarray:
        """The CPU reads the pinned host view ``src`` (a result); a copy."""
        return np.array(src, copy=True)

    def read(self, array) -> np.ndarray:
        """Copy a device view to a new NumPy array, synchronously (for inspection and tests)."""
        raise NotImplementedError

    def write(self, src: np.ndarray, dst) -> None:
        """Copy a NumPy array into an existing device view, synchronously."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


# ---------------------------------------------------------------- the three devices
class HostDevice(Device):
    """NumPy arrays and NumPy kernels: :mod:`kernels.host`'s fast versions where there is one, else
    the references (they agree within the tests' tolerances, and are deterministic). Fresh memory
    is filled with NaN bytes (0xFF), so a kernel that reads a tensor before anything wrote it shows
    up as NaN, as it could on a GPU."""

    name = "host"

    def event(self, timing: bool = False):
        return WallEvent() if timing else NullEvent()

    def _alloc(self, nbytes, pinned, stream):
        return np.full(nbytes, 0xFF, dtype=np.uint8)

    def _view(self, buf, offset, shape, dtype):
        return buf.raw[offset:offset + nbytes_of(shape, dtype)].view(dtype).reshape(shape)

    def _copy_to_host(self, src, dst, stream):
        np.copyto(dst, src)

    _copy_to_device = _copy_to_host

    def _run(self, op, args, stream, kwargs):
        from kernels._common import LAUNCH_ONLY
        from kernels.host import host_kernel

        host_kernel(op)(*args, **{k: v for k, v in kwargs.items() if k not in LAUNCH_ONLY})

    def read(self, array):
        return np.array(array, copy=True)

    def write(self, src, dst):
        _same_layout("write", src, dst)
        np.copyto(dst, src)


class CudaDevice(Device):
    """Numba CUDA: a real GPU, or the simulator when NUMBA_ENABLE_CUDASIM=1 was set before numba
    was imported. Work runs on the stream it is given (None: the default stream)."""

    def __init__(self) -> None:
        super().__init__()
        from numba import cuda

        if not cuda.is_available():
            raise RuntimeError("no CUDA GPU found. Use the host device (NumPy) or the meta device (planning only), or "
                               "run with NUMBA_ENABLE_CUDASIM=1 set before Python starts to use the CUDA simulator")
        self._cuda = cuda
        self.simulated = simulator_enabled()
        self.name = "cuda"
        self.gpu_name = "CUDA simulator" if self.simulated else _decode(cuda.get_current_device().name)

    def _alloc(self, nbytes, pinned, stream):
        if pinned:
            return self._cuda.pinned_array(nbytes, dtype=np.uint8)
        raw = self._cuda.device_array(nbytes, dtype=np.uint8)
        usable = nbytes // 4  # poison with NaN, as the host device does
        if self.simulated:  # a simulated fill kernel costs minutes for a few MiB: copy NaN bytes in instead
            raw.copy_to_device(np.full(nbytes, 0xFF, np.uint8), stream=self._stream(stream))
        elif usable:
            self._run(_ops()["fill"], (raw[:usable * 4].view(np.float32),), stream, {"value": np.nan})
            if stream is None:
                self._cuda.synchronize()  # outside an iteration: done before anything uses it
        return raw

    def _view(self, buf, offset, shape, dtype):
        return buf.raw[offset:offset + nbytes_of(shape, dtype)].view(dtype).reshape(shape)

    def stream(self, name: str = "default"):
        return CudaStream(self._cuda.stream(), name)

    def event(self, timing: bool = False):
        if self.simulated:  # the simulator's events take no arguments
            return CudaEvent(self._cuda.event(), simulated=True)
        return CudaEvent(self._cuda.event(timing=timing))

    def _stream(self, stream):
        return 0 if stream is None else stream.raw

    def _copy_to_host(self, src, dst, stream):
        src.copy_to_host(dst, stream=self._stream(stream))

    def _copy_to_device(self, src, dst, stream):
        dst.copy_to_device(src, stream=self._stream(stream))

    def _run(self, op, args, stream, kwargs):
        if self.simulated and "version" not in kwargs and op.name in SIMULATOR_VERSIONS:
            kwargs = {**kwargs, "version": SIMULATOR_VERSIONS[op.name]}
        op.launch(*args, stream=self._stream(stream), **kwargs)

    def synchronize(self):
        self._cuda.synchronize()

    def read(self, array):
        self.synchronize()
        return array.copy_to_host()

    def write(self, src, dst):
        _same_layout("write", src, dst)
        dst.copy_to_device(np.ascontiguousarray(src))
        self.synchronize()

    def __repr__(self) -> str:
        return f"<CudaDevice {self.gpu_name}>"


class MetaDevice(Device):
    """Shapes and bytes only: allocations are counted, views are :class:`MetaArray`, kernels and
    copies check their arguments' layout and do nothing else."""

    name = "meta"
    has_data = False

    def _alloc(self, nbytes, pinned, stream):
        return None

    def _view(self, buf, offset, shape, dtype):
        return MetaArray(shape, dtype, offset)

    def host_write(self, dst, src) -> None:
        _same_layout("host_write", src, dst)

    def host_read(self, src):
        return None

    def _copy_to_host(self, src, dst, stream):
        pass

    _copy_to_device = _copy_to_host

    def _run(self, op, args, stream, kwargs):
        for a in args:
            if isinstance(a, np.ndarray):
                raise TypeError(f"{op.name} on the meta device got a NumPy array; pass meta views")

    def read(self, array):
        raise RuntimeError("the meta device holds no data: plan on it, run on 'host' or 'cuda' to see values")

    def write(self, src, dst):
        _same_layout("write", src, dst)


# ---------------------------------------------------------------- choosing a device
def simulator_enabled() -> bool:
    """True when numba.cuda is the simulator (NUMBA_ENABLE_CUDASIM=1 before numba was imported)."""
    from numba import config

    return bool(getattr(config, "ENABLE_CUDASIM", 0)) or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def real_gpu_available() -> bool:
    if simulator_enabled():
        return False
    from numba import cuda

    try:
        return bool(cuda.is_available())
    except Exception:  # a broken driver counts as no GPU
        return False


def get_device(spec="auto") -> Device:
    """A device from ``"cuda"``, ``"host"``, ``"meta"``, ``"auto"`` (CUDA on a real GPU, else host)
    or a :class:`Device` (returned as is)."""
    if isinstance(spec, Device):
        return spec
    if spec == "auto":
        return CudaDevice() if real_gpu_available() else HostDevice()
    if spec == "cuda":
        return CudaDevice()
    if spec == "host":
        return HostDevice()
    if spec == "meta":
        return MetaDevice()
    raise ValueError(f"unknown device {spec!r}; choose one of {DEVICE_NAMES}")


# ---------------------------------------------------------------- helpers
@functools.lru_cache(maxsize=None)
def _ops():
    import kernels

    return kernels.all_ops()


def _positive(nbytes, what) -> int:
    nbytes = int(nbytes)
    if nbytes <= 0:
        raise ValueError(f"the {what} must have a positive size in bytes, got {nbytes}")
    return nbytes


def _same_layout(what, src, dst) -> None:
    if tuple(src.shape) != tuple(dst.shape) or np.dtype(src.dtype) != np.dtype(dst.dtype):
        raise ValueError(f"{what}: source is {tuple(src.shape)} {np.dtype(src.dtype)} but destination is "
                         f"{tuple(dst.shape)} {np.dtype(dst.dtype)}")


def _decode(name) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)
