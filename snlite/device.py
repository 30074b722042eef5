"""Devices: where snlite's tensors live and its kernels run.

Three devices, one interface (:class:`~snlite.device_base.Device`):

- :class:`CudaDevice` (:mod:`snlite.device_cuda`, the only module of snlite that imports
  ``numba.cuda``): Numba CUDA on a real NVIDIA GPU, or on the CUDA simulator when the environment
  variable ``NUMBA_ENABLE_CUDASIM=1`` was set before numba was first imported.
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
``pinned_bytes``): on all three the same program allocates the same bytes. This module holds the
two CPU devices and :func:`get_device`, and re-exports the rest.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from kernels._common import LAUNCH_ONLY
from kernels.host import host_kernel
from snlite.device_base import (ALIGNMENT_BYTES, Buffer, Device, NullEvent, NullStream, _same_layout,
                                align_up, nbytes_of)
from snlite.device_cuda import (SIMULATOR_VERSIONS, CudaDevice, CudaEvent, CudaStream, real_gpu_available,
                                simulator_enabled)

DEVICE_NAMES = ("cuda", "host", "meta", "auto")


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


class WallEvent(NullEvent):
    """A timing event on the host, where work runs as it is issued: ``elapsed_ms`` is the wall-clock
    time between the two records."""

    def __init__(self):
        self.wall = None

    def record(self, stream=None) -> None:
        self.wall = time.perf_counter()

    def elapsed_ms(self, end: "WallEvent") -> float:
        return (end.wall - self.wall) * 1e3


# ---------------------------------------------------------------- the two CPU devices
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
        host_kernel(op)(*args, **{k: v for k, v in kwargs.items() if k not in LAUNCH_ONLY})

    def read(self, array):
        return np.array(array, copy=True)

    def write(self, src, dst):
        _same_layout("write", src, dst)
        np.copyto(dst, src)


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
        raise RuntimeError("the meta device holds no data: plan on it, run on 'host' or 'cuda' to see "
                           "values")

    def write(self, src, dst):
        _same_layout("write", src, dst)


# ---------------------------------------------------------------- choosing a device
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


__all__ = ["ALIGNMENT_BYTES", "DEVICE_NAMES", "SIMULATOR_VERSIONS", "Buffer", "CudaDevice", "CudaEvent",
           "CudaStream", "Device", "HostDevice", "MetaArray", "MetaDevice", "NullEvent", "NullStream",
           "WallEvent", "align_up", "get_device", "nbytes_of", "real_gpu_available", "simulator_enabled"]
