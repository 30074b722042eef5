"""What every device offers (:mod:`snlite.device` describes the three): one arena buffer with
tensors as 256-byte-aligned views into it, pinned host buffers, streams and events (no-ops here,
where nothing runs asynchronously), asynchronous copies, the CPU's own reads and writes of pinned
memory, and running a kernel by name on a stream.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

import kernels

ALIGNMENT_BYTES = 256  # every tensor view starts at a multiple of this offset into the arena


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
        """Allocate a device buffer (the one arena; with the raw allocator, one per tensor), filled
        with NaN bytes on ``stream`` (None: before this returns), so a read before any write shows."""
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
            raise ValueError(f"this buffer belongs to the {buf.device.name} device, not the {self.name} "
                             "device")
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


# ---------------------------------------------------------------- helpers
@functools.lru_cache(maxsize=None)
def _ops():
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
