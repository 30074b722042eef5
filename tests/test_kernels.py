"""Every example of every kernel family, every version, on the CUDA simulator, against the
NumPy reference; launchers run with device allocation forbidden."""
import numpy as np
import pytest

import kernels
from kernels._check import compare, run_example


def _cases():
    for fam in kernels.FAMILIES:
        mod = kernels.family(fam)
        for i, ex in enumerate(mod.examples(np.random.default_rng(0))):
            if ex.op not in mod.OPS:  # at collection: a bare KeyError stopped every test of the suite
                raise ValueError(f"kernels/{fam}.py: an example runs {ex.op!r}, which its OPS does not name: "
                                 f"add an Op of that name (its reference, its launcher) to OPS")
            for version in ex.versions or mod.OPS[ex.op].versions:
                yield pytest.param(fam, i, version, id=f"{fam}.{ex.op}[{ex.label or i}]-{version}")


@pytest.mark.parametrize("fam,index,version", list(_cases()))
def test_kernel_matches_reference(fam, index, version):
    mod = kernels.family(fam)
    ex = mod.examples(np.random.default_rng(0))[index]
    want, got = run_example(mod.OPS, ex, version)
    err = compare(ex, want, got)
    assert err is None, err


def test_op_names_are_unique_and_complete():
    ops = kernels.all_ops()
    for name, op in ops.items():
        assert op.name == name
        assert callable(op.reference) and callable(op.launch)
    # every op has at least one example, so none goes untested
    tested = {ex.op for fam in kernels.FAMILIES
              for ex in kernels.family(fam).examples(np.random.default_rng(0))}
    assert set(ops) <= tested, f"ops without a self-check example: {sorted(set(ops) - tested)}"


def _views(*shapes):
    """Device views of the given shapes into one buffer, each starting where the last one's first
    half ends: each overlaps the one before it."""
    from numba import cuda

    sizes = [int(np.prod(s)) for s in shapes]
    buf = cuda.to_device(np.arange(sum(sizes), dtype=np.float32))
    out, start = [], 0
    for shape, size in zip(shapes, sizes):
        out.append(buf[start:start + size].reshape(shape))
        start += size // 2
    return out


def _dev(*shape):
    from numba import cuda

    return cuda.to_device(np.ones(shape, np.float32))


def _layer_scale_backward_into_x(x, dx):
    kernels.layernorm.layer_scale_backward(x, _dev(4), _dev(1, 4, 2, 2), dx, _dev(4))


@pytest.mark.parametrize("call,match", [
    (lambda: kernels.concat.channel_shuffle(*_views((1, 4, 2, 2), (1, 4, 2, 2)), groups=2),
     "channel_shuffle y: overlaps x"),
    (lambda: kernels.gemm.gemm(*(lambda a, c: (a, _dev(4, 4), c))(*_views((4, 4), (4, 4)))),
     "gemm_batched c: overlaps a"),
    (lambda: kernels.patch_merge.patch_merge_forward(*_views((1, 2, 4, 4), (1, 8, 2, 2))),
     "patch_merge_forward y: overlaps x"),
    (lambda: kernels.patch_merge.patch_merge_backward(*_views((1, 8, 2, 2), (1, 2, 4, 4))),
     "patch_merge_backward dx: overlaps dy"),
    (lambda: _layer_scale_backward_into_x(*_views((1, 4, 2, 2), (1, 4, 2, 2))),
     "layer_scale_backward dx: overlaps x"),
    (lambda: (lambda qkv, y: kernels.attention.attention_forward(qkv, y, _dev(1, 2, 4), heads=2))(
        *_views((1, 12, 2, 2), (1, 4, 2, 2))), "attention_forward y: overlaps qkv"),
])
def test_a_launcher_refuses_an_output_over_what_its_kernel_reads(call, match):
    """Documented "must not alias", never checked: channel_shuffle(x, x) computed something else on
    the simulator and would race on a GPU. Each launcher compares the outputs' bytes with its inputs'."""
    with pytest.raises(ValueError, match=match):
        call()
