"""The CUDA simulator's blocks run on a pool of threads, with a barrier that waits instead of polling.

Numba's simulator runs each CUDA thread of a block as a new Python thread, and its block manager
finds out that all of them reached ``syncthreads`` by polling them in a loop. Both cost more than
most kernels of these tests do: creating a thread (its stack, its interpreter state) takes about
100 us, and the polling loop competes for the GIL with the threads it waits for (the kernel time
was a third system calls). :func:`install` replaces ``BlockManager.run`` for the test session with
one that hands each CUDA thread of a block to a thread kept from earlier blocks, and a block barrier
on a condition variable. The kernels' code, the order of blocks (one at a time, in grid order), the
semantics of ``syncthreads`` and the error a failing thread raises are the simulator's own:

- ``syncthreads`` returns when every thread of the block still running waits at one (a thread that
  has returned no longer counts), as the simulator's manager decides;
- a thread that raises aborts the others at their next ``syncthreads``, and the launch raises that
  first error, named ``tid=[..] ctaid=[..]: ...`` as the simulator names it (the aborted threads'
  own "abort flag set" errors are not the ones raised);
- the block's ``block_state`` (for ``syncthreads_count``/``and``/``or``) is the simulator's own
  manager's.

What differs is only which Python thread runs a CUDA thread, and that the launch returns (or
raises) once every thread of the block has finished, rather than at the first error while other
threads may still be running.

Most kernels never make a thread wait for another (elementwise, pooling, attention: each thread reads
and writes its own elements). Handing each of their CUDA threads to another Python thread cost more than
running them: a one-line kernel took 62 us a thread on the pool, 10 us in turn (on one core of the
project's AMD machine, 12-07). So a block of a kernel that names nothing in TOGETHER (barriers, votes,
warp exchanges, shared memory), itself or in a device function it calls, runs its threads one after
another on the launching thread, which holds a CUDA thread's ``threadIdx``, ``blockIdx`` and
``thread_id`` meanwhile; it stops at the first thread that raises, with the error named as above.
Threads that share nothing but the arrays they are given compute the same in any order unless they race,
which would be a bug on a GPU too (on the simulator a racing kernel's result depends on how the GIL
hands over either way). A barrier the scan cannot see (one reached through ``getattr``) raises an error
naming TOGETHER, never a wrong result.
tests/test_simulator_pool.py holds both ways to the simulator's original manager. The session
fixture of tests/conftest.py installs this where the simulator is on.
"""
from __future__ import annotations

import threading


class _Block:
    """One block's run: its function and arguments, its barrier, and the first error."""

    __slots__ = ("cond", "live", "waiting", "generation", "abort", "f", "args", "manager", "done", "error")

    def __init__(self, n: int, f, args, manager):
        self.cond = threading.Condition(threading.Lock())
        self.live, self.waiting, self.generation, self.abort = n, 0, 0, False
        self.f, self.args, self.manager = f, args, manager
        self.error = None  # (exception, traceback) of the first thread that raised
        self.done = threading.Lock()
        self.done.acquire()  # released by the last thread to finish

    def release_barrier(self) -> None:
        """Every thread still running waits at ``syncthreads``: let them all go on."""
        self.waiting = 0
        self.generation += 1
        self.cond.notify_all()


def _worker_class(BlockThread, Dim3):
    class Worker(BlockThread):
        """A pool thread: runs one CUDA thread of a block at a time, as the simulator's
        ``BlockThread`` would (the attributes ``kernelapi`` reads off ``threading.current_thread()``:
        ``threadIdx``, ``blockIdx``, ``thread_id``, ``syncthreads``...)."""

        def __init__(self):
            threading.Thread.__init__(self, daemon=True, name="simulator pool thread")
            self.go = threading.Lock()
            self.go.acquire()  # released by assign()
            self.block = None

        def assign(self, block: _Block, block_idx, thread_idx, block_dim) -> None:
            self.block, self._manager = block, block.manager
            self.blockIdx, self.threadIdx = Dim3(*block_idx), Dim3(*thread_idx)
            self.thread_id = thread_idx[0] + block_dim[0] * (thread_idx[1] + block_dim[1] * thread_idx[2])
            self.go.release()

        def run(self) -> None:
            while True:
                self.go.acquire()
                block = self.block
                error = None
                try:
                    block.f(*block.args)
                except BaseException as e:  # counted out of the block whatever it was, or the launch hangs
                    tid, ctaid = f"tid={list(self.threadIdx)}", f"ctaid={list(self.blockIdx)}"
                    msg = f"{tid} {ctaid}" if str(e) == "" else f"{tid} {ctaid}: {e}"
                    try:
                        error = (type(e)(msg), e.__traceback__)
                    except Exception:  # an exception type that takes other arguments: raised as it was
                        error = (e, e.__traceback__)
                with block.cond:
                    block.live -= 1
                    if error is not None:
                        if block.error is None and not block.abort:
                            block.error = error
                        block.abort = True
                        block.cond.notify_all()
                    elif block.waiting and block.waiting == block.live:
                        block.release_barrier()
                    if block.live == 0:
                        block.done.release()
                self.block = None

        def syncthreads(self) -> None:
            block = self.block
            with block.cond:
                if block.abort:
                    raise RuntimeError("abort flag set on syncthreads call")
                generation = block.generation
                block.waiting += 1
                if block.waiting == block.live:
                    block.release_barrier()
                else:
                    while generation == block.generation and not block.abort:
                        block.cond.wait()
                if block.abort:
                    raise RuntimeError("abort flag set on syncthreads clear")

    return Worker


_free: list = []  # idle pool threads
_lock = threading.Lock()
_original = None  # the simulator's own BlockManager.run, while the pool's is installed
_Worker = None  # the pool thread class, made by install() from the simulator's BlockThread
_Dim3 = None  # the simulator's Dim3, set by install()


def _run(self, grid_point, *args):
    """``BlockManager.run``: one block, each of its threads on a pool thread; returns when all finished."""
    import numpy as np

    if self._debug:  # the simulator's debug mode (np.seterr per thread): its own manager
        return _original(self, grid_point, *args)
    if not needs_threads(self._f):
        return _run_inline(self, grid_point, args)
    block_dim = tuple(self._block_dim) + (1,) * (3 - len(self._block_dim))
    points = [tuple(p) + (0,) * (3 - len(p)) for p in np.ndindex(*self._block_dim)]
    with _lock:
        while len(_free) < len(points):
            worker = _Worker()
            worker.start()
            _free.append(worker)
        workers = [_free.pop() for _ in points]
    block = _Block(len(points), self._f, args, self)
    for worker, point in zip(workers, points):
        worker.assign(block, grid_point, point, block_dim)
    block.done.acquire()  # (interrupted here, the block's threads are left out of the pool: still busy)
    with _lock:
        _free.extend(workers)
    if block.error is not None:
        raise block.error[0].with_traceback(block.error[1])



# what only threads running together can do: meet at a barrier, vote, exchange registers, share memory
TOGETHER = frozenset({"syncthreads", "syncthreads_count", "syncthreads_and", "syncthreads_or", "syncwarp",
                      "shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync", "all_sync", "any_sync",
                      "eq_sync", "ballot_sync", "match_any_sync", "match_all_sync", "activemask", "shared"})
_needs: dict = {}  # kernel function -> whether its threads must run together


def needs_threads(f) -> bool:
    """Whether ``f`` (a kernel's Python function) or a device function it calls names anything in
    TOGETHER: then its block's threads run on pool threads at once; otherwise one after another."""
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


def _together(*args):
    raise RuntimeError("tests/simulator_pool.py ran this block's threads one after another, but the kernel "
                       "waits for the others: add the name it reaches them by to TOGETHER")


def _run_inline(self, grid_point, args):
    """A block whose threads never wait for each other: each CUDA thread run in turn, on this thread."""
    import numpy as np

    me = threading.current_thread()
    block_dim = tuple(self._block_dim) + (1,) * (3 - len(self._block_dim))
    me.blockIdx, me.syncthreads = _Dim3(*grid_point), _together
    try:
        for point in np.ndindex(*self._block_dim):
            point = tuple(point) + (0,) * (3 - len(point))
            me.threadIdx = _Dim3(*point)
            me.thread_id = point[0] + block_dim[0] * (point[1] + block_dim[1] * point[2])
            try:
                self._f(*args)
            except BaseException as e:
                tid, ctaid = f"tid={list(point)}", f"ctaid={list(grid_point)}"
                msg = f"{tid} {ctaid}" if str(e) == "" else f"{tid} {ctaid}: {e}"
                try:
                    error = type(e)(msg)
                except Exception:  # an exception type that takes other arguments: raised as it was
                    raise e
                raise error.with_traceback(e.__traceback__) from None
    finally:
        for name in ("blockIdx", "threadIdx", "thread_id", "syncthreads"):
            me.__dict__.pop(name, None)


def install() -> None:
    """Run the simulator's blocks on the pool (until :func:`uninstall`)."""
    global _original, _Worker, _Dim3
    from numba.cuda.simulator import kernel
    from numba.cuda.simulator.kernelapi import Dim3

    if _original is None:
        _original = kernel.BlockManager.run
        _Worker, _Dim3 = _worker_class(kernel.BlockThread, Dim3), Dim3
        kernel.BlockManager.run = _run


def uninstall() -> None:
    """The simulator's own manager again."""
    global _original
    from numba.cuda.simulator import kernel

    if _original is not None:
        kernel.BlockManager.run, _original = _original, None
