"""The CUDA device: Numba CUDA on a real NVIDIA GPU, or on the CUDA simulator when the environment
variable ``NUMBA_ENABLE_CUDASIM=1`` was set before numba was first imported. The only module of
snlite that imports ``numba.cuda``.
"""
from __future__ import annotations

import os
import time

import numba
import numpy as np
from numba import cuda

from snlite.device_base import Device, _ops, _same_layout, nbytes_of

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
    "conv2d_backward_filter", "linear_forward", "linear_backward_data", "bias_backward",
    "batchnorm_forward_train", "batchnorm_backward", "softmax_xent_forward")}


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


class CudaDevice(Device):
    """Numba CUDA: a real GPU, or the simulator when NUMBA_ENABLE_CUDASIM=1 was set before numba
    was imported. Work runs on the stream it is given (None: the default stream)."""

    def __init__(self) -> None:
        super().__init__()
        if not cuda.is_available():
            raise RuntimeError("no CUDA GPU found. Use the host device (NumPy) or the meta device "
                               "(planning only), or run with NUMBA_ENABLE_CUDASIM=1 set before Python "
                               "starts to use the CUDA simulator")
        self._cuda = cuda
        self.simulated = simulator_enabled()
        self.name = "cuda"
        self.gpu_name = "CUDA simulator" if self.simulated else _decode(cuda.get_current_device().name)

    def _alloc(self, nbytes, pinned, stream):
        if pinned:
            return self._cuda.pinned_array(nbytes, dtype=np.uint8)
        raw = self._cuda.device_array(nbytes, dtype=np.uint8)
        usable = nbytes // 4  # poison with NaN, as the host device does
        if self.simulated:  # a simulated fill kernel costs minutes for a few MiB: copy NaN bytes in
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


def simulator_enabled() -> bool:
    """True when numba.cuda is the simulator (NUMBA_ENABLE_CUDASIM=1 before numba was imported)."""
    return bool(getattr(numba.config, "ENABLE_CUDASIM", 0)) or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def real_gpu_available() -> bool:
    if simulator_enabled():
        return False
    try:
        return bool(cuda.is_available())
    except Exception:  # a broken driver counts as no GPU
        return False


def _decode(name) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)
