"""The simulator's blocks run on the launching thread (tests/simulator_blocks.py, installed for the
whole session by tests/conftest.py) compute what the simulator's own block manager computes: the
same results with barriers, early returns and the block-wide votes, the same error from a failing
thread, and no new thread per CUDA thread. A kernel that reaches a barrier, a vote or shared memory
(itself, or through a device function) runs its threads as greenlets; the others run them in turn."""
import threading
import types

import numpy as np
import pytest
from numba import config, cuda, float32, int32

import simulator_blocks

pytestmark = pytest.mark.skipif(not config.ENABLE_CUDASIM or simulator_blocks.greenlet is None,
                                reason="on the simulator, with greenlet installed (the test extra)")


@cuda.jit(device=True)
def _tree_sum(value):
    """A block's sum, in shared memory, with the barriers: a kernel calling it must run its threads
    together (in turn, the first thread would wait at the first barrier for threads not yet run)."""
    s = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    s[t] = value
    cuda.syncthreads()
    step = 32
    while step > 0:
        if t < step:
            s[t] += s[t + step]
        cuda.syncthreads()
        step //= 2
    total = s[0]
    cuda.syncthreads()  # everyone has read it before a next call writes
    return total


@cuda.jit
def _block_sums(x, out):
    """A tree reduction in shared memory: wrong unless every syncthreads waits for the whole block."""
    total = _tree_sum(x[cuda.grid(1)])
    if cuda.threadIdx.x == 0:
        out[cuda.blockIdx.x] = total


@cuda.jit
def _early_return(x, out):
    """Half the threads return first; the others still meet at their barriers."""
    s = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    if t % 2 == 1:
        return
    s[t] = x[cuda.grid(1)]
    cuda.syncthreads()
    out[cuda.grid(1)] = s[(t + 2) % 64]


@cuda.jit
def _votes(x, out):
    i = cuda.grid(1)
    out[i, 0] = cuda.syncthreads_count(x[i] > 0)
    out[i, 1] = cuda.syncthreads_and(x[i] > 0)
    out[i, 2] = cuda.syncthreads_or(x[i] > 0)


@cuda.jit
def _fails_in_one_thread(x, out):
    t = cuda.threadIdx.x
    if cuda.blockIdx.x == 1 and t == 5:
        raise ValueError("thread 5 of block 1 fails")
    cuda.syncthreads()
    out[cuda.grid(1)] = x[cuda.grid(1)]


@cuda.jit
def _two_dimensional(out):
    x, y = cuda.grid(2)
    out[y, x] = (cuda.blockIdx.y * 100 + cuda.blockIdx.x) * 10_000 + cuda.threadIdx.y * 100 + cuda.threadIdx.x


@cuda.jit
def _lanes(out):
    """Sync-free, 2-D blocks of 64 threads: the thread's linear id and its lane, as CUDA numbers them."""
    x, y = cuda.grid(2)
    out[y, x, 0] = cuda.threadIdx.x + cuda.blockDim.x * cuda.threadIdx.y
    out[y, x, 1] = cuda.laneid


def _launch(kernel, grid, block, *args, timeout=20):
    """Launch on a thread of its own, failing (not hanging) if it never returns."""
    result = {}

    def go():
        try:
            kernel[grid, block](*args)
        except Exception as e:
            result["error"] = e

    worker = threading.Thread(target=go, daemon=True)
    worker.start()
    worker.join(timeout)
    assert not worker.is_alive(), f"the launch of {kernel.__name__} never returned: a barrier never let go"
    if "error" in result:
        raise result["error"]


@pytest.fixture
def original_manager():
    """Run a test's launches on the simulator's own block manager, then ours again."""
    with simulator_blocks.original_manager():
        yield


def _run_all(rng):
    x = rng.standard_normal(256).astype(np.float32)
    sums, early, votes = np.zeros(4, np.float32), np.zeros(256, np.float32), np.zeros((256, 3), np.int32)
    _launch(_block_sums, 4, 64, x, sums)
    _launch(_early_return, 4, 64, x, early)
    _launch(_votes, 4, 64, x, votes)
    grid2, lanes = np.zeros((6, 8), np.int64), np.zeros((8, 32, 2), np.int64)
    _launch(_two_dimensional, (2, 3), (4, 2), grid2)
    _launch(_lanes, (2, 2), (16, 4), lanes)
    return x, sums, early, votes, grid2, lanes


def test_our_blocks_compute_what_the_simulators_own_manager_computes(rng):
    x, sums, early, votes, grid2, lanes = _run_all(rng)
    np.testing.assert_allclose(sums, x.reshape(4, 64).sum(axis=1), rtol=1e-5)
    even = np.arange(256) % 2 == 0
    np.testing.assert_array_equal(early[even], x.reshape(4, 64)[:, (np.arange(0, 64, 2) + 2) % 64].ravel())
    positive = (x.reshape(4, 64) > 0)
    np.testing.assert_array_equal(votes[:, 0], np.repeat(positive.sum(axis=1), 64))
    np.testing.assert_array_equal(votes[:, 1], np.repeat(positive.all(axis=1), 64))
    np.testing.assert_array_equal(votes[:, 2], np.repeat(positive.any(axis=1), 64))
    ys, xs = np.mgrid[0:6, 0:8]
    np.testing.assert_array_equal(grid2, (ys // 2 * 100 + xs // 4) * 10_000 + ys % 2 * 100 + xs % 4)
    ys, xs = np.mgrid[0:8, 0:32]
    np.testing.assert_array_equal(lanes[..., 0], xs % 16 + 16 * (ys % 4))
    np.testing.assert_array_equal(lanes[..., 1], (xs % 16 + 16 * (ys % 4)) % 32)
    with simulator_blocks.original_manager():
        again = _run_all(np.random.default_rng(0))
    for ours, theirs in zip(_run_all(np.random.default_rng(0)), again):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("manager", ["ours", "original"])
def test_a_failing_thread_raises_its_own_error_named_as_the_simulator_names_it(manager, request):
    if manager == "original":
        request.getfixturevalue("original_manager")
    x, out = np.arange(128, dtype=np.float32), np.zeros(128, np.float32)
    with pytest.raises(ValueError, match=r"^tid=\[5, 0, 0\] ctaid=\[1, 0, 0\]: thread 5 of block 1 fails$"):
        _launch(_fails_in_one_thread, 2, 64, x, out)
    _launch(_block_sums, 2, 64, x, out[:2])  # and the next launch runs normally
    np.testing.assert_allclose(out[:2], x.reshape(2, 64).sum(axis=1))


def test_no_python_thread_is_started_for_a_cuda_thread(monkeypatch):
    started, start = [], threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: started.append(self) or start(self))
    x, out, ones = np.ones(512, np.float32), np.zeros(8, np.float32), np.zeros(256, np.int64)
    _block_sums[8, 64](x, out)  # as greenlets
    _adds_one[4, 64](ones)  # in turn
    assert started == [], f"{len(started)} threads started for 12 blocks of 64 CUDA threads"
    np.testing.assert_array_equal(out, 64)
    np.testing.assert_array_equal(ones, 1)


def test_a_dynamic_shared_array_and_int_types_still_work():
    @cuda.jit
    def shift(x, out):
        s = cuda.shared.array(0, int32)
        t = cuda.threadIdx.x
        s[t] = x[t]
        cuda.syncthreads()
        out[t] = s[(t + 1) % cuda.blockDim.x]

    x, out = np.arange(32, dtype=np.int32), np.zeros(32, np.int32)
    shift[1, 32, 0, 32 * 4](x, out)
    np.testing.assert_array_equal(out, np.roll(x, -1))


@cuda.jit(device=True)
def _add_one(x, i):
    x[i] += 1


@cuda.jit(device=True)
def _calls_tree_sum(value):
    return _tree_sum(value)


helpers = types.ModuleType("helpers")  # a device function reached as a module's attribute
helpers.tree_sum = _tree_sum


@cuda.jit
def _sums_through_a_call(x, out):  # names no barrier and no shared memory itself
    out[cuda.grid(1)] = _calls_tree_sum(x[cuda.grid(1)])


@cuda.jit
def _sums_through_a_module(x, out):
    out[cuda.grid(1)] = helpers.tree_sum(x[cuda.grid(1)])


@cuda.jit
def _adds_one(x):
    _add_one(x, cuda.grid(1))


def _closure_kernel():
    barrier = _tree_sum

    @cuda.jit
    def kernel(x):
        x[cuda.grid(1)] = barrier(x[cuda.grid(1)])

    return kernel


@cuda.jit
def _hides_its_barrier(x):
    x[cuda.grid(1)] = 1
    getattr(cuda, "sync" + "threads")()


@cuda.jit
def _fails_without_waiting(x):
    if cuda.blockIdx.x == 1 and cuda.threadIdx.x == 5:
        raise ValueError("thread 5 of block 1 fails")
    x[cuda.grid(1)] = 1


def test_which_kernels_run_their_threads_together():
    together = [_block_sums, _early_return, _votes, _sums_through_a_call, _sums_through_a_module,
                _closure_kernel(), TestSharedOnly.kernel]
    apart = [_two_dimensional, _lanes, _adds_one, _fails_without_waiting]
    assert [simulator_blocks.waits_for_others(k.py_func) for k in together] == [True] * len(together)
    assert [simulator_blocks.waits_for_others(k.py_func) for k in apart] == [False] * len(apart)


class TestSharedOnly:
    """Shared memory alone (no barrier in sight) still runs together: as CUDA would, not in turn."""

    @staticmethod
    @cuda.jit
    def kernel(out):
        s = cuda.shared.array(32, int32)
        s[cuda.threadIdx.x] = cuda.threadIdx.x
        out[cuda.threadIdx.x] = s[cuda.threadIdx.x]


def test_a_block_that_never_waits_runs_its_threads_in_turn_on_the_launching_thread():
    x = np.zeros(256, np.int64)
    before = {t.ident for t in threading.enumerate()}
    _adds_one[4, 64](x)  # on this thread, in turn
    assert {t.ident for t in threading.enumerate()} == before
    np.testing.assert_array_equal(x, 1)
    main = threading.current_thread()
    assert not {"threadIdx", "blockIdx", "thread_id", "syncthreads"} & set(vars(main)), \
        "the launching thread keeps a CUDA thread's attributes after the launch"


def test_a_barrier_the_scan_cannot_see_fails_loudly_instead_of_running_in_turn():
    x = np.zeros(64, np.float32)
    with pytest.raises(RuntimeError, match="ran this block's threads one after another.*TOGETHER"):
        _launch(_hides_its_barrier, 1, 64, x)


@pytest.mark.parametrize("manager", ["ours", "original"])
def test_a_failing_thread_of_a_block_run_in_turn_is_named_as_the_simulator_names_it(manager, request):
    if manager == "original":
        request.getfixturevalue("original_manager")
    x = np.zeros(128, np.float32)
    with pytest.raises(ValueError, match=r"^tid=\[5, 0, 0\] ctaid=\[1, 0, 0\]: thread 5 of block 1 fails$"):
        _launch(_fails_without_waiting, 2, 64, x)
    _launch(_adds_one, 2, 64, x)  # and the next launch runs normally (the failed one copied nothing back)
    assert x.tolist() == [1] * 128


def test_kernels_that_call_their_barriers_compute_the_block_sums():
    x = np.arange(128, dtype=np.float32)
    for kernel in (_sums_through_a_call, _sums_through_a_module):
        out = np.zeros(128, np.float32)
        _launch(kernel, 2, 64, x, out)
        np.testing.assert_array_equal(out, np.repeat(x.reshape(2, 64).sum(axis=1), 64),
                                      err_msg=kernel.__name__)


def test_a_session_inside_the_session_leaves_our_blocks_installed():
    """``pytester`` runs a pytest session inside this one (tests/test_planted_bugs.py does): its
    conftest installs and uninstalls again, and every test after it ran on the simulator's own
    manager, several times slower, until installs were counted."""
    from numba.cuda.simulator import kernel

    assert kernel.BlockManager.run is simulator_blocks._run
    simulator_blocks.install()
    simulator_blocks.uninstall()
    assert kernel.BlockManager.run is simulator_blocks._run
    with simulator_blocks.original_manager():
        assert kernel.BlockManager.run is not simulator_blocks._run
    assert kernel.BlockManager.run is simulator_blocks._run


def test_without_greenlet_the_simulators_own_manager_runs(monkeypatch):
    """greenlet comes with the test extra; a checkout without it runs the simulator as it comes."""
    from numba.cuda.simulator import kernel

    with simulator_blocks.original_manager():
        own = kernel.BlockManager.run
        monkeypatch.setattr(simulator_blocks, "greenlet", None)
        simulator_blocks.install()
        assert kernel.BlockManager.run is own
        simulator_blocks.uninstall()  # undoes nothing: the session's own install stays counted
        assert kernel.BlockManager.run is own and simulator_blocks._depth >= 1
        x, out = np.ones(128, np.float32), np.zeros(2, np.float32)
        _launch(_block_sums, 2, 64, x, out)
        np.testing.assert_array_equal(out, 64)
