"""Test set-up: the CUDA simulator is on unless a real-GPU run is asked for; BLAS uses one thread.

This runs before numba and numpy are imported anywhere, which is what NUMBA_ENABLE_CUDASIM and
the BLAS thread count need.
A real-GPU run: ``NUMBA_ENABLE_CUDASIM=0 pytest`` on a machine with an NVIDIA GPU; only then do
the ``gpu``-marked tests run (elsewhere they are skipped, with the reason shown by ``-ra``).
"""
import os

REAL_GPU_REQUESTED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "0"
if not REAL_GPU_REQUESTED:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

# One BLAS thread, for this process and every tutorial, CLI and grader subprocess, unless the caller
# chose: the host device multiplies tiny matrices, where BLAS threads only wait for each other, and
# on a busy 2-core machine their spinning made training several times slower (tutorial 07's 132
# steps: 17.7 s with OpenBLAS's two threads, 3.7 s with one). Read once, when numpy is imported.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import importlib.util  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

import simulator_blocks  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent  # the checkout these tests belong to


def imported_from_elsewhere() -> dict[str, str]:
    """snlite and kernels where they would come from (or came from), if not from this checkout.
    setup.cfg's ``pythonpath = .`` puts the checkout first, so this is empty unless something
    imported them before (``pytest -p snlite.grading`` with another snlite installed)."""
    out = {}
    for name in ("snlite", "kernels"):
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None) if module is not None else None
        if origin is None:
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec is not None else None
        if origin and not Path(origin).resolve().is_relative_to(ROOT):
            out[name] = str(Path(origin).resolve().parent)
    return out


def pytest_configure(config):
    """Refuse to test code from another checkout: in a student copy, an snlite installed (editable)
    from the instructor's repository would pass every grader on the stubs."""
    elsewhere = imported_from_elsewhere()
    if elsewhere:
        where = ", ".join(f"{name} from {path}" for name, path in elsewhere.items())
        raise pytest.UsageError(
            f"these tests are {ROOT}'s, but they would import {where}: they would test that code, not "
            f"this checkout's. Grade this checkout with 'python -m snlite.assignments grade' run from "
            f"{ROOT}, or run pytest there without '-p snlite.grading'")
    # pytest-xdist hands out whole files (--dist loadfile) in the order the workers collected them,
    # LONGEST_FIRST below, only if told not to sort them by their number of tests first (it does by
    # default: test_kernels' 256 quick tests went first, the notebooks' 10 slow ones near the end)
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    # Each xdist worker (gw0, gw1, ...) on one core of its own, and so its subprocesses: the CUDA
    # simulator runs a block's threads (up to 256 Python threads) taking turns at the GIL, which is
    # cheap on one core and costly when the threads are spread over two (each hand-over wakes a
    # thread on the other core). Under -n 2 unpinned, with the simulator's own block manager, the
    # simulator tests took 2 to 6 times as long as on one core alone (test_concat's round trip 11 s
    # against 1.8 s), the others 1.1 times.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker[:2] == "gw" and worker[2:].isdigit() and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[int(worker[2:]) % len(cpus)]})


def _cuda_mode() -> tuple[str, bool]:
    from numba import cuda

    if not REAL_GPU_REQUESTED:
        return ("CUDA simulator (NUMBA_ENABLE_CUDASIM=1): kernels run as Python, streams are synchronous",
                False)
    if cuda.is_available():
        dev = cuda.get_current_device()
        return f"real GPU: {dev.name.decode() if isinstance(dev.name, bytes) else dev.name}", True
    return "NUMBA_ENABLE_CUDASIM=0 but no CUDA GPU found: CUDA tests will fail", False


def pytest_report_header(config):
    return f"snlite kernels run on: {_cuda_mode()[0]}"


# The longest test files, longest first: pytest-xdist hands each worker whole files in collection
# order (see pytest_configure), so running these first lets the two workers finish together (longest
# processing time first) instead of one of them starting a 40-second file when the other has nothing
# left to do. By their time under -n 2 on 12-07 (the simulator's blocks run by tests/simulator_blocks.py),
# from test_tutorials_notebooks.py's 69 s down to test_checker.py's 6 s; test_ptx.py third, as it takes
# about a minute where a kernel changed since kernels/registers.json (1 s otherwise).
LONGEST_FIRST = ("test_tutorials_notebooks.py", "test_student_copy.py", "test_ptx.py", "test_from_torch.py",
                 "test_measure.py", "test_executor.py", "test_planted_bugs.py", "test_optimal.py",
                 "test_report.py", "test_cli.py", "test_docs.py", "test_train.py", "test_offline.py",
                 "test_placement.py", "test_tutorials.py", "test_kernels.py", "test_audit.py",
                 "test_launches.py", "test_gpucheck.py", "test_plot.py", "test_nonfinite.py",
                 "test_checker.py")


def _order(item) -> int:
    name = item.path.name
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_order)  # stable: each file's tests keep their order
    if _cuda_mode()[1]:
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU: run NUMBA_ENABLE_CUDASIM=0 pytest -m gpu on one")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(0)


@pytest.fixture(autouse=True, scope="session")
def _quick_safe_simulator():
    """Two fixes for the CUDA simulator for the whole session (undone afterwards; nothing on a GPU):
    - shared-array get-or-create under a lock: the simulator's ``cuda.shared.array`` checks and
      then creates without a lock, so two threads of a launch's first block can (rarely) get
      different arrays and compute garbage;
    - a block's threads run on the thread that launched it, in turn or as greenlets
      (tests/simulator_blocks.py): kernels run several times faster, the same code, the blocks
      in the same order."""
    from numba import config

    if not config.ENABLE_CUDASIM:
        yield
        return
    import numpy as np
    from numba.cuda.simulator import kernelapi

    original, lock = kernelapi.FakeCUDAShared.array, threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic shared memory or an error: the original path
            return original(self, shape, dtype, alignment)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)  # the simulator's key: one array per source line
        with lock:
            if key not in self._allocations:
                as_numpy = isinstance(dtype, kernelapi.types.Type)
                numpy_dtype = kernelapi.numpy_support.as_dtype(dtype) if as_numpy else dtype
                self._allocations[key] = np.empty(shape, numpy_dtype)
            return self._allocations[key]

    kernelapi.FakeCUDAShared.array = array
    simulator_blocks.install()
    yield
    simulator_blocks.uninstall()
    kernelapi.FakeCUDAShared.array = original


# Programs longer than this are not checked by the hook below: they are the deep ResNets a depth
# search places by the dozen (the same layers repeated thousands of times, 60% of such a test's time
# spent checking them); tests/test_checker.py checks one that long, with the cache moving data.
HOOK_CHECKS_UP_TO = 20_000  # instructions


def _identity(program, graph) -> tuple:
    """What the race checker's verdict on ``program`` (for ``graph``) depends on, hashed: two programs
    alike in all of it get the same verdict."""
    return (program.net, program.config, program.mode, program.allocator, program.arena_bytes,
            program.slab_bytes, graph.input_shape, hash(tuple(sorted(program.tensors.items()))),
            hash(program.setup), hash(program.body))


@pytest.fixture(autouse=True, scope="session")
def _every_program_is_checked():
    """Every program the suite places (up to HOOK_CHECKS_UP_TO instructions) is run through the
    race checker (and the checker's own consistency checks) before anything uses it: a placement
    that could race fails the test that built it, wherever that is. A Model checks its programs
    again itself; there, a program alike in everything to one already proven race-free is not
    checked a second time (tests build the same models again and again)."""
    from snlite import checker, pipeline, train

    checked = set()  # programs already checked: tests place the same net under the same config often

    def check(program, graph):
        if len(program) > HOOK_CHECKS_UP_TO:
            return
        key = _identity(program, graph)
        if key not in checked:
            checker.check(program, graph=graph)  # its tensors and layers the net's too
            checked.add(key)

    def model_check(program, iterations=2, *, graph=None):
        key = _identity(program, graph) if graph is not None and iterations == 2 else None
        if key is None or key not in checked:
            checker.check(program, iterations, graph=graph)
            if key is not None:
                checked.add(key)

    pipeline.AFTER_PLACEMENT.append(check)
    train.check = model_check
    yield
    train.check = checker.check
    pipeline.AFTER_PLACEMENT.remove(check)
