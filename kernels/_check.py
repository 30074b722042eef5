"""Compare a launcher with its NumPy reference: the harness behind every ``python -m kernels.X``.

Each family module defines ``examples(rng) -> list[Example]``: small, odd shapes (under about
2,000 threads a launch, so the simulator stays quick). :func:`run_example` runs the reference on
NumPy copies and the launcher on device copies (aliasing preserved, so an in-place backward is
tested in place), with device allocation forbidden while the launcher runs.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field

import numpy as np
from numba import cuda

from kernels._common import checking_types

_ALLOCATORS = (
    "device_array", "device_array_like", "to_device", "pinned_array", "pinned_array_like",
    "mapped_array", "mapped_array_like", "managed_array",
)


@dataclass
class Example:
    """One call of an op: positional arrays, hyper-parameters, and which positions it writes."""

    op: str
    args: tuple
    outputs: tuple[int, ...]
    kwargs: dict = field(default_factory=dict)  # hyper-parameters, given to both
    launch: dict = field(default_factory=dict)  # launcher-only tuning, e.g. {"block": (8, 8)}
    rtol: float = 1e-5
    atol: float = 1e-6
    versions: tuple[str, ...] | None = None  # None: every version of the op
    label: str = ""


def example_arrays(rng):
    """The two array makers of every family's ``examples(rng)``: ``r(*shape, loc=0.0)``, float32
    samples of a normal distribution shifted by ``loc``, drawn from ``rng``; ``nan(*shape)``, float32
    NaNs, for outputs (an element the launcher leaves unwritten stays NaN and fails the comparison)."""

    def r(*shape, loc=0.0):
        return (rng.standard_normal(shape) + loc).astype(np.float32)

    def nan(*shape):
        return np.full(shape, np.nan, np.float32)

    return r, nan


class AllocationError(AssertionError):
    pass


@contextlib.contextmanager
def no_device_allocation():
    """Make every numba.cuda allocation function raise while the block runs: ``cuda.device_array``,
    and the same functions under any name a module of ``kernels`` imported them as
    (``from numba.cuda import device_array_like``)."""
    saved = {name: getattr(cuda, name) for name in _ALLOCATORS if hasattr(cuda, name)}
    originals = {id(fn): name for name, fn in saved.items()}
    imported = [(module, attr, originals[id(value)]) for module in list(sys.modules.values())
                if getattr(module, "__name__", "").startswith("kernels")
                for attr, value in list(vars(module).items()) if id(value) in originals]

    def forbidden(name):
        def f(*a, **k):
            raise AllocationError(f"a launcher called numba.cuda.{name}: launchers must never allocate "
                                  "(they take their outputs, and any scratch, as arguments)")
        return f

    try:
        for name in saved:
            setattr(cuda, name, forbidden(name))
        for module, attr, name in imported:
            setattr(module, attr, forbidden(name))
        yield
    finally:
        for name, fn in saved.items():
            setattr(cuda, name, fn)
        for module, attr, name in imported:
            setattr(module, attr, saved[name])


def _clone(values, convert):
    """Copy the arrays in ``values`` with ``convert``, keeping aliases aliased."""
    memo = {}

    def one(v):
        if isinstance(v, np.ndarray):
            if id(v) not in memo:
                memo[id(v)] = convert(v)
            return memo[id(v)]
        return v

    return memo, one


def run_example(ops: dict, ex: Example, version: str):
    """Return ``(reference_outputs, device_outputs)`` as lists of NumPy arrays. The launcher runs with
    device allocation forbidden and every kernel's arguments checked against its declared signature
    (:func:`kernels._common.checking_types`), and must return None: it writes into its outputs."""
    if not ex.outputs:
        raise AssertionError(f"an example of {ex.op} names no output (Example.outputs): it would compare "
                             "nothing; name the positions of the arrays the op writes")
    op = ops[ex.op]
    _, ref_conv = _clone(ex.args, lambda a: a.copy())
    ref_args = [ref_conv(a) for a in ex.args]
    ref_kwargs = {k: ref_conv(v) for k, v in ex.kwargs.items()}
    op.reference(*ref_args, **ref_kwargs)

    _, dev_conv = _clone(ex.args, lambda a: cuda.to_device(np.ascontiguousarray(a)))
    dev_args = [dev_conv(a) for a in ex.args]
    dev_kwargs = {k: dev_conv(v) for k, v in ex.kwargs.items()}
    with no_device_allocation(), checking_types():
        returned = op.launch(*dev_args, **dev_kwargs, **ex.launch, version=version)
    if returned is not None:
        raise AssertionError(f"{ex.op} ({version}) returned a {type(returned).__name__}: a launcher writes "
                             "into the outputs it is given (out=...) and returns None")
    cuda.synchronize()
    return [ref_args[i] for i in ex.outputs], [dev_args[i].copy_to_host() for i in ex.outputs]


def compare(ex: Example, want, got) -> str | None:
    """None if every output matches within tolerance, else a message naming the first mismatch."""
    for pos, w, g in zip(ex.outputs, want, got):
        if w.shape != g.shape:
            return f"{ex.op}: output {pos} has shape {g.shape}, reference {w.shape}"
        bad = ~np.isclose(g, w, rtol=ex.rtol, atol=ex.atol, equal_nan=True)
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            return (f"{ex.op}: output {pos} differs at index {idx}: got {g[idx]!r}, reference {w[idx]!r} "
                    f"({int(bad.sum())} of {bad.size} elements outside rtol={ex.rtol}, atol={ex.atol})")
    return None


def self_check(module) -> int:
    """Run every example of ``module`` on every version; print a table; return the failure count."""
    rng = np.random.default_rng(0)
    failures = 0
    print(f"{'op':28} {'version':8} {'example':24} result")
    for ex in module.examples(rng):
        op = module.OPS[ex.op]
        for version in ex.versions or op.versions:
            try:
                want, got = run_example(module.OPS, ex, version)
                err = compare(ex, want, got)
            except Exception as e:  # noqa: BLE001 - a launch that fails is this example's FAIL, not the end
                err = f"raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            failures += err is not None
            print(f"{ex.op:28} {version:8} {ex.label[:24]:24} {'ok' if err is None else 'FAIL: ' + err}")
    print(f"{failures} failure(s)")
    return failures


def main(module) -> None:
    """Entry point of ``python -m kernels.<family>``: exits non-zero on any mismatch."""
    if not cuda.is_available():
        sys.exit("no CUDA device: set NUMBA_ENABLE_CUDASIM=1 to run this self-check on the simulator")
    sys.exit(1 if self_check(module) else 0)
