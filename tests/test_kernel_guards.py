"""What keeps a kernel or a launcher honest where the simulator would let it through (kernels/_common,
kernels/_check): a strided or host array given to a launcher, a block larger than a GPU takes, a
kernel launched with other types than it declares, a launcher that allocates under an imported name
or returns its result, an example that compares nothing. Each is refused with what to do instead."""
import sys
import types

import numpy as np
import pytest
from numba import cuda

from kernels import _check, _common, elementwise
from kernels._check import AllocationError, Example, no_device_allocation, run_example
from kernels._common import Op, checking_types



def dev(*shape, fill=1.0):
    return cuda.to_device(np.full(shape, fill, np.float32))


def test_a_strided_or_host_array_is_refused_by_name():
    """A strided output was silently left unwritten by 47 ops: the simulator's reshape copies it, so the
    kernel wrote the copy."""
    x, out = dev(4, 6), dev(4, 12, fill=-7.0)
    with pytest.raises(ValueError, match=r"scale out: expected a C-contiguous array, got a strided view of "
                                         r"shape \(4, 6\)"):
        elementwise.scale(x, out[:, :6], alpha=2.0)
    assert (out.copy_to_host() == -7).all()
    with pytest.raises(ValueError, match="scale x: expected a device array, got a NumPy array"):
        elementwise.scale(np.ones((4, 6), np.float32), dev(4, 6), alpha=2.0)
    with pytest.raises(ValueError, match="scale x: expected a device array, got list"):
        elementwise.scale([1.0, 2.0], dev(2), alpha=2.0)
    with pytest.raises(ValueError, match="an array used flat: expected a C-contiguous array"):
        _common.flat(out[:, ::2])


def test_a_kernel_refuses_a_block_a_gpu_refuses_and_a_host_array():
    x, out = dev(64), dev(64)
    with pytest.raises(ValueError, match=r"_scale_v1: a block of \(2048, 1, 1\) threads; CUDA takes at most "
                                         r"1024 threads a block"):
        elementwise._scale_v1[1, 2048](x, out, np.float32(2))
    with pytest.raises(ValueError, match=r"a block of \(32, 32, 2\) threads"):
        elementwise._scale_v1[1, (32, 32, 2)](x, out, np.float32(2))
    with pytest.raises(ValueError, match=r"_scale_v1: argument 1 is a NumPy array of shape \(64,\): a kernel "
                                         r"reads device arrays"):
        elementwise._scale_v1[1, 64](x, np.zeros(64, np.float32), np.float32(2))
    elementwise._scale_v1[1, 64](x, out, np.float32(2))
    assert (out.copy_to_host() == 2).all()


def test_under_checking_types_a_launch_must_match_the_declared_signature():
    """The PTX check compiles the declared signature; the lazy jit of a GPU compiles what is passed (a
    Python float: float64 arithmetic), and the simulator checks neither."""
    x, out = dev(64), dev(64)
    elementwise._scale_v1[1, 64](x, out, 2.0)  # not checked outside the block
    with checking_types():
        with pytest.raises(TypeError, match=r"_scale_v1: argument 2 is float64, but its @cuda_kernel "
                                            r"signature declares float32"):
            elementwise._scale_v1[1, 64](x, out, 2.0)
        with pytest.raises(TypeError, match=r"argument 0 is array\(float32, 2d, C\), but .* declares "
                                            r"array\(float32, 1d, C\)"):
            elementwise._scale_v1[1, 64](cuda.to_device(np.ones((8, 8), np.float32)), out, np.float32(2))
        with pytest.raises(TypeError, match="declared with 3 arguments"):
            elementwise._scale_v1[1, 64](x, out)
        elementwise._scale_v1[1, 64](x, out, np.float32(2))


def test_an_allocation_under_an_imported_name_is_caught_too():
    """``from numba.cuda import device_array_like`` bound the real function before the guard patched
    ``cuda.device_array_like``, so a launcher allocating that way passed."""
    module = types.ModuleType("kernels._guard_probe")
    module.device_array_like = cuda.device_array_like
    sys.modules[module.__name__] = module
    try:
        with no_device_allocation():
            with pytest.raises(AllocationError, match="numba.cuda.device_array_like: launchers must never "
                                                      "allocate"):
                module.device_array_like(np.zeros(3, np.float32))
        assert module.device_array_like is cuda.device_array_like, "put back after"
    finally:
        del sys.modules[module.__name__]


def test_a_launcher_that_returns_its_result_or_an_example_that_compares_nothing_is_refused():
    def copy_ref(x, out):
        out[...] = x

    def returns(x, out, *, version="v1"):
        elementwise.copy(x, out)
        return out

    ops = {"copy": Op("copy", copy_ref, returns)}
    x = np.arange(6, dtype=np.float32)
    with pytest.raises(AssertionError, match=r"copy \(v1\) returned a \w+: a launcher writes into"):
        run_example(ops, Example("copy", (x, np.zeros(6, np.float32)), (1,)), "v1")
    with pytest.raises(AssertionError, match="an example of copy names no output"):
        run_example(ops, Example("copy", (x, np.zeros(6, np.float32)), ()), "v1")
    ops["copy"] = Op("copy", copy_ref, elementwise.copy)
    want, got = run_example(ops, Example("copy", (x, np.zeros(6, np.float32)), (1,)), "v1")
    assert _check.compare(Example("copy", (), (1,)), want, got) is None


def test_the_self_check_reports_a_launch_that_raises_and_goes_on(capsys):
    """``python -m kernels.<family>`` stopped at the first launch that raised, with a traceback: the
    examples after it were neither run nor listed."""
    def copy_ref(x, out):
        out[...] = x

    def broken(x, out, *, version="v1"):
        raise IndexError("index 7 is out of bounds")

    family = types.SimpleNamespace(
        OPS={"broken": Op("broken", copy_ref, broken), "copy": Op("copy", copy_ref, elementwise.copy)},
        examples=lambda rng: [Example(op, (np.ones(4, np.float32), np.zeros(4, np.float32)), (1,), label=op)
                              for op in ("broken", "copy")])
    assert _check.self_check(family) == 1
    out = capsys.readouterr().out
    assert "FAIL: raised IndexError: index 7 is out of bounds" in out
    assert any(line.startswith("copy ") and line.endswith(" ok") for line in out.splitlines()), out
