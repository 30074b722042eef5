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
