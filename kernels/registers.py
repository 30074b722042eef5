"""Registers, spills and shared memory per kernel, from ptxas: what bounds a launch's occupancy.

    python -m kernels.launches --registers        # re-measure every kernel into kernels/registers.json

Numba's CUDA compiler turns each registered kernel into PTX on the CPU (:func:`compile_ptx_per_arch`,
typed and lowered once, then NVVM for each architecture of ``ARCHS``); ``ptxas -v`` assembles it and
says what it uses (:func:`run_ptxas`). Measuring needs ptxas (the CUDA toolkit) and the simulator
off, so it runs in a subprocess (:func:`measure_resources`); the results are kept in
``kernels/registers.json`` (``tests/test_ptx.py`` checks the file against ptxas where ptxas is
installed), and :func:`resources` reads them from there for the launch report
(:mod:`kernels.launches`) and the cost model. A kernel that uses floating-point atomics (not
deterministic) is refused there and then, so the file exists only for kernels that compiled without
them; it records the :func:`source_digest` of what it was measured from.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

REGISTERS_FILE = Path(__file__).with_name("registers.json")
ARCHS = ("sm_90", "sm_80", "sm_75")
FLOAT_ATOMIC = re.compile(r"\b(atom|red)(\.\w+)*\.f(16|32|64)\b")  # in PTX: atom.add.f32 and the like
ATOMICS_FIX = ("not deterministic (the additions land in another order each run, and round differently): "
               "sum in a fixed order instead, e.g. a tree in shared memory as _bias_backward_v2 in "
               "kernels/elementwise.py does")
COMPILER = ("numba", "numba-cuda", "llvmlite", "nvidia-nvvm")  # the packages that turn a kernel into PTX


def source_digest() -> str:
    """A digest of everything the kernels' PTX is made from: every ``kernels/*.py`` (the kernels, the
    device functions and constants they use), Python's version and the compiler's packages'. The same
    digest, the same PTX: tests/test_ptx.py compiles the kernels again only when it changes."""
    h = hashlib.sha256(f"python {sys.version_info[0]}.{sys.version_info[1]}".encode())
    for dist in COMPILER:
        try:
            h.update(f"{dist} {metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist} -".encode())
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for one kernel on one architecture."""

    registers: int
    spill_bytes: int  # spill stores + spill loads
    shared_bytes: int  # static shared memory
    stack_bytes: int


def ptxas_path() -> str | None:
    """The ptxas executable (PATH, then $CUDA_HOME/bin), or None."""
    found = shutil.which("ptxas")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    cand = Path(home, "bin", "ptxas") if home else None
    return str(cand) if cand and cand.exists() else None


def ptxas_version(ptxas: str) -> str:
    out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=60).stdout
    return next((line.strip() for line in out.splitlines() if "release" in line), out.strip())


def parse_ptxas(text: str) -> Resources:
    """Resources from the ``ptxas -v`` log of one kernel."""
    def num(pattern):
        m = re.search(pattern, text)
        return int(m.group(1)) if m else 0

    if not re.search(r"Used (\d+) registers", text):
        raise ValueError(f"no register count in the ptxas output:\n{text[-2000:]}")
    return Resources(registers=num(r"Used (\d+) registers"),
                     spill_bytes=num(r"(\d+) bytes spill stores") + num(r"(\d+) bytes spill loads"),
                     shared_bytes=num(r"(\d+) bytes smem"), stack_bytes=num(r"(\d+) bytes stack frame"))


_NEWEST = {}  # ptxas path -> the newest PTX ISA version it said it reads, once it has refused a newer one


def run_ptxas(ptx: str, arch: str, ptxas: str) -> Resources:
    """Assemble ``ptx`` for ``arch`` with ``ptxas -v``. Numba's NVVM may write a newer PTX ISA
    version than this ptxas reads; then the ``.version`` line is lowered to the one ptxas names
    and it is assembled again (the kernels use nothing newer), and later PTX is lowered before its
    first try (one ptxas run per kernel and arch, not two)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, obj = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        for _ in range(2):
            if ptxas in _NEWEST:
                ptx = _at_most(ptx, _NEWEST[ptxas])
            Path(src).write_text(ptx)
            proc = subprocess.run([ptxas, f"-arch={arch}", "-v", src, "-o", obj], capture_output=True,
                                  text=True, timeout=300)
            if proc.returncode == 0:
                return parse_ptxas(proc.stdout + proc.stderr)
            m = re.search(r"Unsupported \.version \S+; current version is '([\d.]+)'", proc.stderr)
            if not m:
                break
            _NEWEST[ptxas] = m.group(1)
    raise RuntimeError(f"ptxas failed for {arch}:\n{proc.stderr[-2000:]}")


def _at_most(ptx: str, version: str) -> str:
    """``ptx`` with its ``.version`` line lowered to ``version`` if it names a newer one."""
    m = re.search(r"^\.version (\S+)", ptx, flags=re.M)

    def key(v):
        return tuple(int(p) for p in v.split("."))

    if m and key(m.group(1)) > key(version):
        ptx = ptx[:m.start(1)] + version + ptx[m.end(1):]
    return ptx


def compile_ptx_per_arch(spec, archs=ARCHS) -> dict:
    """{arch: PTX} for one registered kernel: typed and lowered to LLVM IR once, then NVVM for each
    arch. Numba-cuda's lowering reads the compute capability only to avoid instructions older GPUs
    lack (float64 atomic add below 6.0, fast tanh below 7.5), so IR lowered for the oldest arch asked
    for is valid for all; the PTX is ``numba.cuda.compile_ptx``'s for each arch but for the mangled
    names, in a little over half the time (typing and lowering are four fifths of a compile). Needs
    the simulator OFF in this process. The first half is a private function of numba-cuda: where a
    release has renamed it or changed its arguments, each arch is compiled by the public
    ``compile_ptx`` instead (the same PTX, in the full time; a kernel that does not compile fails there
    with its own error)."""
    from numba.cuda import compile_ptx
    from numba.cuda.cudadrv.error import CudaSupportError

    ccs = {arch: (int(arch[3]), int(arch[4])) for arch in archs}
    try:
        try:
            from numba.cuda.compiler import _compile_pyfunc_with_fixup  # compile_ptx's own first half
            lib, _ = _compile_pyfunc_with_fixup(spec.py_func, spec.signature, device=False, abi="numba",
                                                cc=min(ccs.values()))
        except (ImportError, TypeError):
            return {arch: compile_ptx(spec.py_func, spec.signature, cc=cc)[0] for arch, cc in ccs.items()}
    except CudaSupportError:  # numba-cuda looks for a GPU when typing fails in some overloads
        raise TypeError(f"{spec.name} does not type for a GPU: compiling it asked for a CUDA driver, which "
                        "numba-cuda does where a call or an index does not type (an allocation such as "
                        "np.empty in a kernel, a 2-D array indexed with one index, an argument of another "
                        f"type than its signature {spec.signature!r}); this is no missing GPU") from None
    out = {}
    for arch, cc in ccs.items():
        (out[arch],) = lib.get_asm_strs(cc=cc)  # compile_ptx's second half: NVVM for this arch
    return out


def compile_resources(names=None, archs=ARCHS) -> dict:
    """{kernel name: {arch: Resources as a dict}} for the registered kernels (those in ``names``,
    or all): PTX from :func:`compile_ptx_per_arch`, then ptxas. Needs the simulator OFF in this
    process (use :func:`measure_resources` from anywhere)."""
    import kernels

    for fam in kernels.FAMILIES:
        kernels.family(fam)
    ptxas = ptxas_path()
    if ptxas is None:
        raise RuntimeError("ptxas not found: install the CUDA toolkit (or set CUDA_HOME) to "
                           "measure registers")
    out = {}
    for spec in kernels.registered_kernels():
        if names is not None and spec.name not in names:
            continue
        try:
            ptxs = compile_ptx_per_arch(spec, archs)
        except Exception as e:  # noqa: BLE001 - whatever stops the compile, named with its kernel
            raise RuntimeError(f"{spec.name} does not compile to PTX: {type(e).__name__}: {e}") from None
        atomics = sorted({m.group(0) for ptx in ptxs.values() for m in FLOAT_ATOMIC.finditer(ptx)})
        if atomics:
            raise RuntimeError(f"{spec.name} uses floating-point atomics {atomics}: {ATOMICS_FIX}")
        out[spec.name] = {arch: run_ptxas(ptx, arch, ptxas).__dict__ for arch, ptx in ptxs.items()}
    return out


def measure_resources(names=None, archs=ARCHS) -> dict:
    """:func:`compile_resources` in a subprocess with the CUDA simulator off."""
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    script = ("import json, sys\nfrom kernels.registers import compile_resources\n"
              "names, archs = json.loads(sys.argv[1]), json.loads(sys.argv[2])\n"
              "print(json.dumps(compile_resources(names, archs)))\n")
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(sorted(names) if names else None),
                           json.dumps(list(archs))], capture_output=True, text=True, env=env, cwd=root,
                          timeout=1800)
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1:] or ["(nothing on stderr)"]
        raise RuntimeError(f"measuring registers failed: {last[0]}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


@functools.cache
def _table() -> dict:
    try:
        return json.loads(REGISTERS_FILE.read_text())
    except FileNotFoundError:
        return {"kernels": {}}


def measured_with() -> str:
    """The ptxas release kernels/registers.json was measured with ("no table" without the file)."""
    return _table().get("ptxas", "no table")


def resources(kernel: str, arch: str, measured: dict | None = None) -> Resources | None:
    """The kernel's resources on ``arch``: from ``measured`` (a :func:`measure_resources`
    result), else from kernels/registers.json; None if neither has it."""
    for table in (measured or {}, _table()["kernels"]):
        entry = table.get(kernel, {}).get(arch)
        if entry:
            return Resources(**entry)
    return None


def write_registers(path=None) -> dict:
    """Measure every registered kernel on every arch and write the table (``--registers``) to
    ``path`` (default kernels/registers.json)."""
    path = REGISTERS_FILE if path is None else path
    ptxas = ptxas_path()
    if ptxas is None:
        raise RuntimeError("ptxas not found: install the CUDA toolkit (or set CUDA_HOME) to "
                           "measure registers")
    table = {"ptxas": ptxas_version(ptxas), "archs": list(ARCHS), "source_digest": source_digest(),
             "kernels": measure_resources()}
    Path(path).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    _table.cache_clear()
    return table
