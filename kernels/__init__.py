"""snlite's kernel library: Numba CUDA kernels with a NumPy reference for each.

One module per family. Each holds, in this order: NumPy references (``op_ref``), CUDA kernels
(``_op_v1`` naive, ``_op_v2``... faster), launchers ``op(..., out, *, stream=0, version=...)`` that
never allocate, ``OPS`` (name -> :class:`~kernels._common.Op`) and ``examples`` for the
self-check ``python -m kernels.<family>`` (conv keeps its direct algorithm's kernels in
``conv_direct``). This package never imports ``snlite``.
"""
from __future__ import annotations

import importlib

from kernels._common import Op, registered_kernels

FAMILIES = (
    "elementwise", "gemm", "linear", "im2col", "conv", "pooling", "activation", "batchnorm", "lrn",
    "dropout", "softmax", "concat", "sgd", "sigmoid", "layernorm", "elu", "attention", "tokens",
    "window_attention", "patch_merge",
)


def family(name: str):
    """Import and return the module ``kernels.<name>``."""
    if name not in FAMILIES:
        raise ValueError(f"unknown kernel family {name!r}; choose one of {FAMILIES}")
    return importlib.import_module(f"kernels.{name}")


def all_ops() -> dict[str, Op]:
    """Every public op of every family, by name (names are unique across families)."""
    ops: dict[str, Op] = {}
    for name in FAMILIES:
        for op_name, op in family(name).OPS.items():
            if op_name in ops:
                raise RuntimeError(f"op {op_name!r} is defined by two kernel families")
            ops[op_name] = op
    return ops


__all__ = ["FAMILIES", "Op", "all_ops", "family", "registered_kernels"]
