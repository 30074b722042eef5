"""Shared plumbing for every kernel family: grid sizes, kernel registration, argument checks.

Every ``@cuda_kernel(signature)`` records the kernel's Python function and the Numba type
signature it is meant to run with. The PTX test (``tests/test_ptx.py``) compiles each one with
``numba.cuda.compile_ptx`` for a real GPU, on the CPU, because the simulator checks no types.

Conventions every family follows (see ``kernels/README.md``):
- float32, C-contiguous, NCHW; integer labels are int32, dropout masks uint8.
- A launcher ``op(inputs..., outputs..., *, hyper=..., stream=0, version=...)`` returns None and
  never allocates device memory; its NumPy reference ``op_ref`` takes the same positional and
  hyper-parameter arguments and writes the same outputs in place.
- Ints are passed to kernels as Python ints (int64), floats as ``np.float32``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from numba import cuda


def ceil_div(a: int, b: int) -> int:
    """Number of blocks of size ``b`` needed to cover ``a`` items."""
    return -(-int(a) // int(b))


@dataclass(frozen=True)
class KernelSpec:
    """A CUDA kernel as written (``py_func``) and the signature the PTX check compiles it with."""

    name: str
    py_func: Callable
    signature: str


_KERNELS: list[KernelSpec] = []


def cuda_kernel(signature: str):
    """Decorator: ``cuda.jit`` the function lazily and record ``signature`` for the PTX check.

    The jit stays lazy (no signature passed to Numba) so the simulator accepts the same code;
    the recorded signature uses C-contiguous layouts (``float32[:, ::1]``), int64 for Python
    ints and float32 for floats, which is what the launchers pass.
    """

    def deco(fn):
        _KERNELS.append(KernelSpec(f"{fn.__module__}.{fn.__name__}", fn, signature))
        return cuda.jit(fn)

    return deco


@cuda.jit(device=True, inline=True)
def unravel4(i, d1, d2, d3):
    """Flat index -> (a, b, c, d) of a C-contiguous 4-D array of shape (_, d1, d2, d3)."""
    return i // (d1 * d2 * d3), (i // (d2 * d3)) % d1, (i // d3) % d2, i % d3


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


LAUNCH_ONLY = ("stream", "version", "block")  # launcher arguments a reference does not take


def check(name: str, a, shape=None, dtype=np.float32) -> None:
    """Raise a ValueError naming ``name`` if ``a`` has the wrong shape or dtype."""
    if a is None:
        raise ValueError(f"{name}: expected an array, got None")
    if dtype is not None and np.dtype(a.dtype) != np.dtype(dtype):
        raise ValueError(f"{name}: expected dtype {np.dtype(dtype)}, got {a.dtype}")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(a.shape)}")


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
