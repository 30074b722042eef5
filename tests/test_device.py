"""The three devices share one interface and agree on arena views, bytes, copies and kernels."""
import numpy as np
import pytest

from snlite.device import (ALIGNMENT_BYTES, CudaDevice, HostDevice, MetaArray, MetaDevice, align_up,
                           get_device, nbytes_of)

DATA_DEVICES = [HostDevice, CudaDevice]  # CudaDevice is the simulator in CI


def _layout(dev):
    """Carve three tensors out of one arena, as the tensor pool will."""
    arena = dev.alloc_arena(8 * 1024)
    shapes = [(2, 3, 5, 5), (7,), (4, 9)]
    views, offset = [], 0
    for shape in shapes:
        views.append(dev.view(arena, offset, shape))
        offset = align_up(offset + nbytes_of(shape))
    return arena, views


def test_device_names():
    assert isinstance(get_device("host"), HostDevice)
    assert isinstance(get_device("meta"), MetaDevice)
    assert isinstance(get_device("cuda"), CudaDevice)
    assert isinstance(get_device("auto"), HostDevice), "auto must pick host when no real GPU is present"
    dev = HostDevice()
    assert get_device(dev) is dev
    with pytest.raises(ValueError, match="unknown device 'gpu'.*'cuda', 'host', 'meta', 'auto'"):
        get_device("gpu")


def test_all_devices_account_the_same_bytes_and_offsets():
    results = []
    for cls in (HostDevice, CudaDevice, MetaDevice):
        dev = cls()
        arena, views = _layout(dev)
        dev.alloc_pinned(3 * ALIGNMENT_BYTES)
        results.append((dev.arena_bytes, dev.pinned_bytes, [tuple(v.shape) for v in views],
                        [np.dtype(v.dtype) for v in views]))
    assert results[0] == results[1] == results[2]
    assert results[0][0] == 8 * 1024 and results[0][1] == 3 * ALIGNMENT_BYTES


@pytest.mark.parametrize("cls", [HostDevice, CudaDevice, MetaDevice])
def test_view_rules(cls):
    dev = cls()
    arena = dev.alloc_arena(1024)
    with pytest.raises(ValueError, match="not a multiple of 256"):
        dev.view(arena, 100, (4,))
    with pytest.raises(ValueError, match="does not fit"):
        dev.view(arena, 768, (65,))
    with pytest.raises(ValueError, match="positive size"):
        dev.alloc_arena(0)
    with pytest.raises(ValueError, match="belongs to the"):
        (HostDevice() if cls is not HostDevice else MetaDevice()).view(arena, 0, (1,))


@pytest.mark.parametrize("cls", DATA_DEVICES)
def test_fresh_arena_reads_as_nan_and_views_do_not_overlap(cls):
    dev = cls()
    _, (a, b, c) = _layout(dev)
    assert np.isnan(dev.read(a)).all(), "a fresh arena must be poisoned so reads before writes show up"
    dev.write(np.ones(a.shape, np.float32), a)
    dev.write(np.full(b.shape, 2, np.float32), b)
    assert np.isnan(dev.read(c)).all()
    assert (dev.read(a) == 1).all() and (dev.read(b) == 2).all()


@pytest.mark.parametrize("cls", DATA_DEVICES)
def test_async_copies_round_trip_through_pinned_views(cls, rng):
    dev = cls()
    _, (a, b, _) = _layout(dev)
    slab = dev.alloc_pinned(nbytes_of(a.shape) + ALIGNMENT_BYTES)
    host = dev.view(slab, 0, a.shape)
    data = rng.standard_normal(a.shape).astype(np.float32)
    dev.write(data, a)
    copy_stream = dev.stream()
    done = dev.event()
    dev.copy_to_host(a, host, stream=copy_stream)
    done.record(copy_stream)
    done.synchronize()
    assert done.query()
    np.testing.assert_array_equal(host, data)
    dev.write(np.zeros(a.shape, np.float32), a)
    dev.copy_to_device(host, a, stream=copy_stream)
    copy_stream.synchronize()
    np.testing.assert_array_equal(dev.read(a), data)
    with pytest.raises(ValueError, match=r"source is \(7,\) float32 but destination is \(2, 3, 5, 5\)"):
        dev.copy_to_host(b, host)


def test_host_and_cuda_run_the_same_kernels(rng):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    y = rng.standard_normal((3, 4, 5)).astype(np.float32)
    outs = []
    for dev in (HostDevice(), CudaDevice()):
        arena = dev.alloc_arena(4096)
        vx, vy, vz = (dev.view(arena, i * 512, x.shape) for i in range(3))
        dev.write(x, vx)
        dev.write(y, vy)
        dev.run("add", vx, vy, vz)
        dev.run("scale", vz, vz, alpha=0.5)
        dev.run("accumulate", vz, vx, version="v1")
        outs.append(dev.read(vz))
        assert dev.kernel_calls == 3
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], 0.5 * (x + y) + x, rtol=1e-6)


def test_the_simulator_runs_its_own_default_version_and_the_callers_wins():
    from kernels._common import Op
    from snlite.device import SIMULATOR_VERSIONS, simulator_enabled

    if not simulator_enabled():
        pytest.skip("the simulator's defaults apply on the simulator only")
    seen = []
    dev = CudaDevice()
    for name in ("bias_backward", "add"):
        op = Op(name, None, lambda *a, **kw: seen.append(kw.get("version")))
        dev._run(op, (), None, {})
        dev._run(op, (), None, {"version": "v2"})
    assert seen == [SIMULATOR_VERSIONS["bias_backward"], "v2", None, "v2"]


def test_meta_device_checks_and_counts_without_data():
    dev = MetaDevice()
    arena = dev.alloc_arena(4096)
    v = dev.view(arena, 512, (4, 8))
    assert isinstance(v, MetaArray) and v.nbytes == 128 and v.offset_bytes == 512
    assert v.reshape(32).shape == (32,)
    dev.run("add", v, v, v)
    assert dev.kernel_calls == 1
    with pytest.raises(ValueError, match="unknown kernel 'nope'"):
        dev.run("nope", v)
    with pytest.raises(TypeError, match="NumPy array"):
        dev.run("add", np.zeros(3, np.float32), v, v)
    with pytest.raises(RuntimeError, match="holds no data"):
        dev.read(v)
