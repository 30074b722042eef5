"""Every CUDA kernel compiles to PTX for a real GPU (compute capability 9.0), on the CPU.

The simulator runs kernels as Python and checks no types, so a kernel that only works there
would pass every other test. This compiles each registered kernel with the simulator off, in a
subprocess, and also proves no kernel uses floating-point atomics (results must be bit-exact).
"""
import json
import os
import re
import subprocess
import sys

import pytest

import kernels

SCRIPT = r"""
import json, re, sys
import kernels
for fam in kernels.FAMILIES:
    kernels.family(fam)
from numba.cuda import compile_ptx
FLOAT_ATOMIC = re.compile(r"\b(atom|red)(\.\w+)*\.f(16|32|64)\b")
out = {}
for spec in kernels.registered_kernels():
    try:
        ptx, _ = compile_ptx(spec.py_func, spec.signature, cc=(9, 0))
        out[spec.name] = {"ok": True, "float_atomics": sorted(set(m.group(0) for m in FLOAT_ATOMIC.finditer(ptx)))}
    except Exception as e:
        out[spec.name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
json.dump(out, sys.stdout)
"""


def _kernel_names():
    for fam in kernels.FAMILIES:
        kernels.family(fam)
    return [spec.name for spec in kernels.registered_kernels()]


@pytest.fixture(scope="module")
def ptx_results():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=root,
                          timeout=900)
    assert proc.returncode == 0, f"PTX compile script failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout)


@pytest.mark.parametrize("name", _kernel_names())
def test_kernel_compiles_to_ptx(name, ptx_results):
    res = ptx_results[name]
    assert res["ok"], f"{name} does not compile for sm_90: {res.get('error')}"
    assert not res["float_atomics"], f"{name} uses floating-point atomics {res['float_atomics']}: not deterministic"


def test_every_kernel_is_registered():
    """A kernel written with plain @cuda.jit would escape the PTX check; all must use @cuda_kernel."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    offenders = []
    for fam in kernels.FAMILIES:
        src = open(os.path.join(root, "kernels", f"{fam}.py")).read()
        for m in re.finditer(r"@cuda\.jit(\([^)]*\))?\s*\ndef (\w+)", src):
            if "device=True" not in (m.group(1) or ""):
                offenders.append(f"{fam}.{m.group(2)}")
    assert not offenders, f"kernels not registered with @cuda_kernel: {offenders}"
