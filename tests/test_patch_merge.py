"""Swin's patch merging gather (kernels.patch_merge): the kernels on the simulator against the references,
bit for bit; the backward undoes the forward; the references against torchvision's own
_patch_merging_pad and its autograd; and the launchers refuse odd sides and wrong shapes by name. (Every
example of ``python -m kernels.patch_merge`` runs in tests/test_kernels.py.)"""
import importlib.util

import numpy as np
import pytest
from numba import cuda

from kernels import patch_merge as PM

SHAPES = [(2, 3, 4, 6), (1, 1, 2, 2), (2, 5, 6, 2), (1, 8, 4, 4)]


def _run(x, dy, block=PM.BLOCK):
    """Both launchers on the simulator: (y, dx) as NumPy arrays."""
    x_, dy_ = cuda.to_device(x), cuda.to_device(dy)
    y, dx = cuda.to_device(np.full(dy.shape, np.nan, np.float32)), cuda.to_device(np.full_like(x, np.nan))
    PM.patch_merge_forward(x_, y, block=block)
    PM.patch_merge_backward(dy_, dx, block=block)
    return y.copy_to_host(), dx.copy_to_host()


def _ref(x, dy):
    y, dx = np.empty_like(dy), np.empty_like(x)
    PM.patch_merge_forward_ref(x, y)
    PM.patch_merge_backward_ref(dy, dx)
    return y, dx


def _args(rng, n, c, h, w):
    return (rng.standard_normal((n, c, h, w)).astype(np.float32),
            rng.standard_normal((n, 4 * c, h // 2, w // 2)).astype(np.float32))


@pytest.mark.parametrize("shape", SHAPES)
def test_kernels_match_the_reference_bit_for_bit(rng, shape):
    x, dy = _args(rng, *shape)
    for got, want in zip(_run(x, dy, block=32), _ref(x, dy)):
        assert np.array_equal(got, want)


def test_the_backward_undoes_the_forward(rng):
    """Each element of dx is exactly one of dy: the backward of the forward's output is the input."""
    x, _ = _args(rng, 2, 3, 4, 6)
    y, _ = _run(x, np.zeros((2, 12, 2, 3), np.float32))
    _, back = _run(x, y)
    assert back.tobytes() == x.tobytes()


def test_the_channel_groups_are_torchvisions_order(rng):
    """Group g of y's channels holds the pixels (2i + dh, 2j + dw), (dh, dw) = (0, 0), (1, 0), (0, 1),
    (1, 1) for g = 0..3."""
    x, dy = _args(rng, 1, 2, 4, 4)
    y, _ = _ref(x, dy)
    for g, (dh, dw) in enumerate(((0, 0), (1, 0), (0, 1), (1, 1))):
        assert np.array_equal(y[:, 2 * g:2 * g + 2], x[:, :, dh::2, dw::2])


@pytest.mark.parametrize("shape", SHAPES)
def test_patch_merge_computes_what_torchvision_computes(rng, shape):
    """torchvision's _patch_merging_pad on x (N, H, W, C) in float64 and autograd's gradient, against the
    references and the kernels on the same values (copies: equal exactly)."""
    torch = pytest.importorskip("torch")
    if importlib.util.find_spec("torchvision") is None:
        pytest.skip("torchvision is not installed")
    from snlite.torch_import import import_torchvision

    import_torchvision()
    from torchvision.models.swin_transformer import _patch_merging_pad

    x, dy = _args(rng, *shape)
    tx = torch.tensor(x.transpose(0, 2, 3, 1).astype(np.float64), requires_grad=True)
    out = _patch_merging_pad(tx)
    out.backward(torch.from_numpy(dy.transpose(0, 2, 3, 1).astype(np.float64)))
    want = out.detach().numpy().transpose(0, 3, 1, 2), tx.grad.numpy().transpose(0, 3, 1, 2)
    for source, got in (("reference", _ref(x, dy)), ("kernel", _run(x, dy))):
        for name, g, w in zip(("y", "dx"), got, want):
            assert np.array_equal(g, w), f"{source} {name}"


def _refused(pattern):
    return pytest.raises(ValueError, match=pattern)


def test_launchers_name_what_is_wrong():
    def d(*shape):
        return cuda.to_device(np.zeros(shape, np.float32))

    with _refused(r"patch_merge_forward x: snlite's patch merge needs even sides, got \(H, W\) = \(3, 4\) "
                  r"\(torchvision pads an odd side"):
        PM.patch_merge_forward(d(2, 3, 3, 4), d(2, 12, 2, 2))
    with _refused(r"patch_merge_backward dx: snlite's patch merge needs even sides, got \(H, W\) = \(4, 5\)"):
        PM.patch_merge_backward(d(2, 12, 2, 3), d(2, 3, 4, 5))
    with _refused(r"patch_merge_forward y: expected shape \(2, 12, 2, 3\), got \(2, 3, 2, 3\)"):
        PM.patch_merge_forward(d(2, 3, 4, 6), d(2, 3, 2, 3))
    with _refused(r"patch_merge_backward dy: expected shape \(2, 12, 2, 3\), got \(2, 12, 3, 2\)"):
        PM.patch_merge_backward(d(2, 12, 3, 2), d(2, 3, 4, 6))
    with _refused(r"patch_merge_forward x: expected dtype float32, got float64"):
        PM.patch_merge_forward(cuda.to_device(np.zeros((2, 3, 4, 6))), d(2, 12, 2, 3))
    with _refused(r"patch_merge_forward x: expected an \(N, C, H, W\) array, got shape \(2, 3, 24\)"):
        PM.patch_merge_forward(d(2, 3, 24), d(2, 12, 2, 3))
    with _refused(r"patch_merge_backward dx: expected a C-contiguous array"):
        PM.patch_merge_backward(d(2, 12, 2, 3), d(2, 3, 4, 12)[:, :, :, :6])
    with _refused(r"unknown kernel version 'v2'"):
        PM.patch_merge_forward(d(2, 3, 4, 6), d(2, 12, 2, 3), version="v2")


@pytest.mark.gpu
def test_real_gpu_patch_merge_at_swin_t_stage_1():
    """On a real GPU: Swin-T's first merge, 96 channels of a 56x56 map, two images: exactly the
    reference's values, and the backward gives the input back."""
    rng = np.random.default_rng(0)
    x, dy = _args(rng, 2, 96, 56, 56)
    for got, want, name in zip(_run(x, dy), _ref(x, dy), ("y", "dx")):
        assert np.array_equal(got, want), name
    assert np.array_equal(_run(x, _ref(x, dy)[0])[1], x)
