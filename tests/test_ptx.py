"""Every CUDA kernel compiles to PTX for real GPUs (compute capability 9.0 and 7.5), on the CPU;
none uses floating-point atomics; and kernels/registers.json (what the launch report reads:
registers, spills, shared memory per kernel) is what ptxas says now.

The simulator runs kernels as Python and checks no types, so a kernel that only works there
would pass every other test. This compiles each registered kernel with the simulator off, in a
subprocess, for both architectures (typed and lowered once, then NVVM for each:
``kernels.registers.compile_ptx_per_arch``), and assembles it with ``ptxas -v`` where ptxas is installed.

It compiles only what could have changed (a minute of CPU for a hundred kernels): kernels/registers.json
was written by compiling every kernel (``python -m kernels.launches --registers``, which refuses one
with floating-point atomics), and records the digest of what it compiled, every kernels/*.py and the
compiler's versions (``kernels.registers.source_digest``). Where the digest here is the same, the PTX
would be the same, and the table's results stand for the compile; where it differs (a kernel edited,
another numba), every kernel is compiled again, and the table must be measured again to match.
"""
import json
import os
import subprocess
import sys

import pytest

import kernels
from kernels import registers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARCHS = ("sm_90", "sm_75")
SCRIPT = r"""
import json, re, sys
import kernels
for fam in kernels.FAMILIES:
    kernels.family(fam)
from kernels.registers import compile_ptx_per_arch, ptxas_path, run_ptxas
from kernels.registers import FLOAT_ATOMIC
ptxas = ptxas_path()
archs = json.loads(sys.argv[1])
out = {}
for spec in kernels.registered_kernels():
    try:
        ptxs = compile_ptx_per_arch(spec, archs)
    except Exception as e:
        out[spec.name] = dict.fromkeys(archs, {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]})
        continue
    out[spec.name] = {}
    for arch, ptx in ptxs.items():
        atomics = sorted(set(m.group(0) for m in FLOAT_ATOMIC.finditer(ptx)))
        res = run_ptxas(ptx, arch, ptxas).__dict__ if ptxas else None
        out[spec.name][arch] = {"ok": True, "float_atomics": atomics, "resources": res}
json.dump(out, sys.stdout)
"""


def _kernel_names():
    for fam in kernels.FAMILIES:
        kernels.family(fam)
    return [spec.name for spec in kernels.registered_kernels()]


@pytest.fixture(scope="module")
def ptx_results():
    table = json.loads(registers.REGISTERS_FILE.read_text())
    digest = table.get("source_digest") == registers.source_digest()
    if digest and set(table["kernels"]) == set(_kernel_names()):  # compiled from these sources, by this
        # compiler: the table's results are what compiling again would give
        return {name: {arch: {"ok": True, "float_atomics": [], "resources": per_arch[arch]} for arch in ARCHS}
                for name, per_arch in table["kernels"].items()}
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(ARCHS)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=1800)
    assert proc.returncode == 0, f"PTX compile script failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout)


@pytest.mark.parametrize("name", _kernel_names())
def test_kernel_compiles_to_ptx(name, ptx_results):
    for arch in ARCHS:
        res = ptx_results[name][arch]
        assert res["ok"], f"{name} does not compile for {arch}: {res.get('error')}"
        assert not res["float_atomics"], \
            f"{name} uses floating-point atomics {res['float_atomics']}: {registers.ATOMICS_FIX}"


@pytest.fixture(scope="module")
def table():
    return json.loads(registers.REGISTERS_FILE.read_text())


def test_registers_table_covers_every_kernel_without_spills(ptx_results, table):
    """The launch report's table lists every kernel a fresh import registers, on every architecture it
    knows, and no kernel spills registers to local memory."""
    missing, gone = \
        sorted(set(ptx_results) - set(table["kernels"])), sorted(set(table["kernels"]) - set(ptx_results))
    where = "" if registers.ptxas_path() else (" where ptxas is installed (the CUDA toolkit; there is none "
                                               "here, so commit the kernel and measure it there)")
    assert not missing and not gone, ("kernels/registers.json is stale: run `python -m kernels.launches "
                                      f"--registers`{where} (missing: {missing}, gone: {gone})")
    for name, per_arch in table["kernels"].items():
        assert set(per_arch) == set(table["archs"]) >= set(ARCHS), name
        for arch, res in per_arch.items():
            assert res["spill_bytes"] == 0, f"{name} spills {res['spill_bytes']} bytes on {arch}"


def _ptxas_or_skip(table):
    ptxas = registers.ptxas_path()
    if ptxas is None:
        pytest.skip("ptxas not found (install the CUDA toolkit or set CUDA_HOME): registers not re-measured")
    version = registers.ptxas_version(ptxas)
    if version != table["ptxas"]:
        pytest.skip(f"ptxas here is {version!r}, the table was measured with {table['ptxas']!r}: "
                    "counts may differ")


@pytest.mark.parametrize("name", _kernel_names())
def test_registers_table_is_what_ptxas_says(name, ptx_results, table):
    _ptxas_or_skip(table)
    if name not in table["kernels"]:
        pytest.fail(f"{name} is not in kernels/registers.json: run `python -m kernels.launches --registers`")
    for arch in ARCHS:
        if not ptx_results[name][arch]["ok"]:
            pytest.fail(f"{name} does not compile for {arch} (test_kernel_compiles_to_ptx says why)")
        measured = ptx_results[name][arch]["resources"]
        assert measured == table["kernels"][name][arch], (
            f"{name} on {arch}: ptxas says {measured}, kernels/registers.json "
            f"{table['kernels'][name][arch]}: run `python -m kernels.launches --registers`")


def test_every_kernel_is_registered():
    """A kernel written with plain @cuda.jit would escape the PTX check; all must use @cuda_kernel.
    Read from the syntax tree of every kernels/*.py: a pattern over the text missed
    ``@cuda.jit("void(float32[::1], ...)")``, the signature's parentheses ending it early."""
    import ast
    import pathlib

    offenders = []
    for path in sorted(pathlib.Path(ROOT, "kernels").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for deco in node.decorator_list:
                call = deco if isinstance(deco, ast.Call) else None
                target = ast.unparse(call.func if call else deco)
                device = call is not None and any(k.arg == "device" and ast.unparse(k.value) == "True"
                                                  for k in call.keywords)
                if target in ("cuda.jit", "numba.cuda.jit", "jit") and not device:
                    offenders.append(f"{path.relative_to(ROOT).as_posix()}: {node.name}")
    assert not offenders, f"kernels not registered with @cuda_kernel: {offenders}"


def test_the_digest_changes_with_any_kernel_source(tmp_path, monkeypatch):
    """One byte of any kernels/*.py (a kernel, a device function, a block size) changes the digest,
    so the PTX check compiles everything again; the same files give the same digest."""
    import shutil

    here = registers.source_digest()
    for path in (registers.REGISTERS_FILE.parent).glob("*.py"):
        shutil.copy(path, tmp_path / path.name)
    monkeypatch.setattr(registers, "__file__", str(tmp_path / "registers.py"))
    assert registers.source_digest() == here
    src = tmp_path / "attention.py"
    src.write_text(src.read_text().replace("BLOCK = 128", "BLOCK = 64"))
    assert registers.source_digest() != here
