"""The CUDA simulator's blocks, run on the launching thread: each CUDA thread in turn, or as a greenlet.

Numba's simulator runs each CUDA thread of a block as a new Python thread, and its block manager
finds out that all of them reached ``syncthreads`` by polling them in a loop. Both cost more than
most kernels of these tests do: creating a thread takes about 100 us, handing the GIL from thread
to thread costs a switch of the operating system's threads each time, and the polling loop competes
for the GIL with the threads it waits for. :func:`install` replaces ``BlockManager.run`` for the
test session with one that runs a block on the thread that launched it, in one of two ways:

- **in turn**, for a kernel that names nothing in TOGETHER (barriers, votes, shared memory), itself
  or in a device function it calls (elementwise, pooling, attention: each thread reads and writes
  its own elements): each CUDA thread runs to its end, one after another;
- **as greenlets** (https://greenlet.readthedocs.io), for the others: each CUDA thread is a
  greenlet, and ``syncthreads`` switches back to the block's loop, which resumes the threads in
  order; once each has finished or waits at a barrier, the barrier lets them all go on.

While a CUDA thread runs, the launching thread holds its ``threadIdx``, ``blockIdx`` and
``thread_id`` (what the simulator's ``cuda`` module reads off ``threading.current_thread()``).
The kernels' code, the order of the blocks (one at a time, in grid order), the semantics of
``syncthreads`` and the error a failing thread raises are the simulator's own:

- ``syncthreads`` returns when every thread of the block still running waits at one (a thread that
  has returned no longer counts), as the simulator's manager decides;
- ``syncthreads_count``, ``_and`` and ``_or`` are the simulator's own, on its manager's block state;
- a thread that raises ends the launch with its error, named ``tid=[..] ctaid=[..]: ...`` as the
  simulator names it; the threads after it in the block do not run on (the simulator's other
  threads went on to their next barrier, then stopped with "abort flag set").

The threads of a block interleave in one fixed order, so a test sees the same run every time.
Threads that share nothing but the arrays they are given compute the same in any order unless they
race, which would be a bug on a GPU too. A barrier the name scan cannot see (one reached through
``getattr``) in a kernel run in turn raises an error naming TOGETHER, never a wrong result.

On one core of the project's AMD machine (12-07), a one-line kernel took 62 us a thread on a pool
of Python threads with a waiting barrier (this module's previous way), 10 us in turn; the
simulator-heavy test files (test_train, test_executor, test_nonfinite, test_update_in_backward,
test_gemm, test_conv, test_audit, test_pooling, test_dropout) took 127 s with every block on the pool
and 107 s with the barrier-free ones in turn; with test_kernels too, 123 s that way and 92 s with
greenlets for the rest. Without greenlet installed (it comes with the
``test`` extra), :func:`install` leaves the simulator's own manager in place, slower but the same.
tests/test_simulator_blocks.py holds both ways to the simulator's own manager. The session fixture
of tests/conftest.py installs this where the simulator is on.
"""
from __future__ import annotations

import contextlib
import threading

try:
    import greenlet
except ImportError:  # the simulator's own manager then: slower, the same results
    greenlet = None

# what only threads running together can do: meet at a barrier, vote, exchange registers, share memory
TOGETHER = frozenset({"syncthreads", "syncthreads_count", "syncthreads_and", "syncthreads_or", "syncwarp",
                      "shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync", "all_sync", "any_sync",
                      "eq_sync", "ballot_sync", "match_any_sync", "match_all_sync", "activemask", "shared"})
VOTES = ("syncthreads_count", "syncthreads_and", "syncthreads_or")
HELD = ("blockIdx", "threadIdx", "thread_id", "_manager", "syncthreads") + VOTES  # set on the thread
_needs: dict = {}  # kernel function -> whether its threads must run together
_original = None  # the simulator's own BlockManager.run, while ours is installed
_depth = 0  # install() calls not yet undone


def waits_for_others(f) -> bool:
    """Whether ``f`` (a kernel's Python function) or a device function it calls names anything in
    TOGETHER: then its block's threads run as greenlets; otherwise one after another."""
    if f not in _needs:
        _needs[f] = _names_together(f, set())
    return _needs[f]


def _names_together(f, seen: set) -> bool:
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    seen.add(f)
    codes, names = [f.__code__], set()
    while codes:  # the function's code and the code of what it defines (comprehensions, closures)
        code = codes.pop()
        names |= set(code.co_names)
        codes += [c for c in code.co_consts if hasattr(c, "co_names")]
    if names & TOGETHER:
        return True
    scopes = [f.__globals__] + [vars(m) for m in f.__globals__.values() if type(m) is type(threading)]
    called = [scope[n] for scope in scopes for n in names if n in scope]
    called += [cell.cell_contents for cell in f.__closure__ or ()]
    return any(isinstance(c, FakeCUDAKernel) and c.fn not in seen and _names_together(c.fn, seen)
               for c in called)


def _run(self, grid_point, *args):
    """``BlockManager.run``: one block, on this thread; returns when all its threads finished."""
    import numpy as np

    if self._debug:  # the simulator's debug mode (np.seterr per thread): its own manager
        return _original(self, grid_point, *args)
    from numba.cuda.simulator.kernel import BlockThread
    from numba.cuda.simulator.kernelapi import Dim3

    me = threading.current_thread()
    block_dim = tuple(self._block_dim) + (1,) * (3 - len(self._block_dim))
    points = [tuple(p) + (0,) * (3 - len(p)) for p in np.ndindex(*self._block_dim)]
    me.blockIdx, me._manager = Dim3(*grid_point), self
    for vote in VOTES:  # the simulator's own, on its manager's block state
        setattr(me, vote, getattr(BlockThread, vote).__get__(me))
    try:
        if waits_for_others(self._f):
            _as_greenlets(self._f, args, me, points, block_dim, grid_point)
        else:
            me.syncthreads = _together
            for point in points:
                _enter(me, point, block_dim)
                _named(self._f, args, point, grid_point)
    finally:
        for name in HELD:
            me.__dict__.pop(name, None)


def _as_greenlets(f, args, me, points, block_dim, grid_point) -> None:
    """Each CUDA thread a greenlet, resumed in order until each has finished or waits at the barrier;
    then the barrier lets them go on."""
    block = greenlet.getcurrent()
    me.syncthreads = block.switch  # back to the loop below, until the barrier lets this thread go on
    live = [(greenlet.greenlet(lambda: f(*args), block), point) for point in points]
    try:
        while live:
            for g, point in live:
                _enter(me, point, block_dim)
                _named(g.switch, (), point, grid_point)
            live = [(g, point) for g, point in live if not g.dead]
    finally:  # after an error, the threads still waiting at a barrier end there
        for g, _ in live:
            if not g.dead:
                g.throw(greenlet.GreenletExit)


def _enter(me, point, block_dim) -> None:
    """The launching thread becomes the CUDA thread at ``point`` of its block."""
    from numba.cuda.simulator.kernelapi import Dim3

    me.threadIdx = Dim3(*point)
    me.thread_id = point[0] + block_dim[0] * (point[1] + block_dim[1] * point[2])


def _named(run, args, point, grid_point) -> None:
    """``run(*args)``; an error it raises named for the CUDA thread, as the simulator names it."""
    try:
        run(*args)
    except Exception as e:
        tid, ctaid = f"tid={list(point)}", f"ctaid={list(grid_point)}"
        msg = f"{tid} {ctaid}" if str(e) == "" else f"{tid} {ctaid}: {e}"
        try:
            error = type(e)(msg)
        except Exception:  # an exception type that takes other arguments: raised as it was
            raise e from None
        raise error.with_traceback(e.__traceback__) from None


def _together(*args):
    raise RuntimeError("tests/simulator_blocks.py ran this block's threads one after another, but the kernel "
                       "waits for the others: add the name it reaches them by to TOGETHER")


def install() -> None:
    """Run the simulator's blocks this module's way until as many :func:`uninstall` calls as
    ``install`` calls (a session inside the session, as ``pytester`` runs one, installs and
    uninstalls again: it must not undo the outer session's); without greenlet, leave the
    simulator's own manager."""
    global _original, _depth
    from numba.cuda.simulator import kernel

    if greenlet is None:
        return
    _depth += 1
    if _original is None:
        _original = kernel.BlockManager.run
        kernel.BlockManager.run = _run


def uninstall() -> None:
    """Undo one :func:`install`; the simulator's own manager again after the last."""
    global _original, _depth
    from numba.cuda.simulator import kernel

    if greenlet is None or _depth == 0:  # as install() did nothing
        return
    _depth -= 1
    if _depth == 0:
        kernel.BlockManager.run, _original = _original, None


@contextlib.contextmanager
def original_manager():
    """The simulator's own block manager for a while, whatever was installed."""
    from numba.cuda.simulator import kernel

    installed = kernel.BlockManager.run
    kernel.BlockManager.run = _original or installed
    try:
        yield
    finally:
        kernel.BlockManager.run = installed
