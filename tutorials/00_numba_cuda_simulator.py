# %% [markdown]
# # 00 Numba CUDA on the simulator
#
# What you will learn:
# - how a Numba CUDA kernel is written and launched: a grid of blocks of threads, one thread per element;
# - a reduction with shared memory and barriers (`cuda.syncthreads`), summed in a fixed order;
# - what the CUDA simulator can show (the kernel's logic, against a NumPy reference) and what it cannot
#   (speed, races): it runs every CUDA thread as a Python thread;
# - the PTX check: compiling the same kernels for a real GPU (sm_90) on a CPU, with the simulator off;
# - how snlite checks its own kernels: `kernels.gemm` against its NumPy reference, all three versions.
#
# Run it: `python tutorials/00_numba_cuda_simulator.py` from the repository root (after
# `pip install -e ".[test]"`), or cell by cell (`# %%` cells: VS Code's "Run Cell", or Jupyter through
# jupytext). About 12 s on one CPU core.
# `SNLITE_TUTORIAL_QUICK=1` makes everything smaller.

# %% Setup: the simulator switch must be set before numba is imported
import os

# NUMBA_ENABLE_CUDASIM is read once, when numba is first imported: set it before any `import numba`
# (and before importing snlite or kernels, which import numba). setdefault keeps an explicit
# NUMBA_ENABLE_CUDASIM=0 from the command line, so on a machine with an NVIDIA GPU
# `NUMBA_ENABLE_CUDASIM=0 python tutorials/00_numba_cuda_simulator.py` runs the same cells on hardware.
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import inspect  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import timeit  # noqa: E402

import numpy as np  # noqa: E402
from numba import config, cuda, float32  # noqa: E402

from snlite.lesson import QUICK, expect  # noqa: E402  (quick mode and checked claims; it imports numba too)

SIMULATOR = bool(config.ENABLE_CUDASIM)
print(f"numba.cuda runs on: {'the CUDA simulator (Python threads)' if SIMULATOR else 'a real GPU'}")
if SIMULATOR:
    # The simulator's block manager polls its threads while they wait at a barrier; a short GIL
    # switch interval makes kernels with cuda.syncthreads() several times faster. It changes nothing
    # else. (The tests go further: tests/simulator_blocks.py runs a block's CUDA threads on one
    # Python thread, in turn or as greenlets, several times faster again.)
    sys.setswitchinterval(5e-4)


def ceil_div(a, b):
    return -(-a // b)


# %% [markdown]
# ## A first kernel: element-wise, one thread per element
# `cuda.grid(1)` is this thread's global index, `blockIdx.x * blockDim.x + threadIdx.x`. The grid is
# rounded up to whole blocks, so the last block has threads past the end: every index is guarded.

# %%
@cuda.jit
def saxpy(a, x, y, out):
    i = cuda.grid(1)
    if i < out.size:  # the guard: the last block may run past the end
        out[i] = a * x[i] + y[i]


n = 1000 if QUICK else 3000
block = 128
rng = np.random.default_rng(0)
x = rng.standard_normal(n).astype(np.float32)
y = rng.standard_normal(n).astype(np.float32)
d_x, d_y = cuda.to_device(x), cuda.to_device(y)  # host -> device copies
d_out = cuda.device_array(n, np.float32)  # device memory, not initialised
grid = ceil_div(n, block)
t0 = time.perf_counter()
saxpy[grid, block](np.float32(2.0), d_x, d_y, d_out)  # kernel[blocks, threads per block](args)
cuda.synchronize()
kernel_s = time.perf_counter() - t0
out = d_out.copy_to_host()  # device -> host
want = np.float32(2.0) * x + y
print(f"saxpy on {n:,d} elements: {grid} blocks x {block} threads = {grid * block:,d} threads "
      f"({grid * block - n} of them past the end, guarded)")
expect("the kernel matches NumPy exactly", np.array_equal(out, want),
       why="one multiply and one add per element, in the same order as NumPy.")

# %% [markdown]
# ## A reduction with shared memory
# Each block sums its slice in shared memory with a fixed-shape tree: at every level, thread t adds
# element t + width into element t, then all threads wait at a barrier. The tree has the same shape
# on every run, so the result is bit-reproducible (snlite forbids floating-point atomics, whose order
# changes from run to run). Each block writes one partial sum; a second, tiny launch sums those.

# %%
RED_BLOCK = 64  # a power of two; shared arrays need a compile-time size


@cuda.jit
def block_sum(x, partial):
    buf = cuda.shared.array(RED_BLOCK, float32)  # one array per block, visible to all its threads
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * RED_BLOCK + t
    buf[t] = x[i] if i < x.size else float32(0.0)
    cuda.syncthreads()  # every thread has written its element
    width = RED_BLOCK // 2
    while width > 0:
        if t < width:
            buf[t] += buf[t + width]
        cuda.syncthreads()  # this level is done before the next one reads it
        width //= 2
    if t == 0:
        partial[cuda.blockIdx.x] = buf[0]


def device_sum(d_x):
    """Sum a float32 device array: block partial sums, then the partials, until one value is left."""
    while d_x.size > 1:
        blocks = ceil_div(d_x.size, RED_BLOCK)
        d_partial = cuda.device_array(blocks, np.float32)
        block_sum[blocks, RED_BLOCK](d_x, d_partial)
        d_x = d_partial
    return d_x.copy_to_host()[0]


total = device_sum(d_x)
exact = x.astype(np.float64).sum()
print(f"sum of {n:,d} floats: kernel {total:.6f}, NumPy float64 {exact:.6f}, difference "
      f"{abs(total - exact):.2e}")
expect("a difference from the float64 sum of 1e-4 or less", abs(total - exact) <= 1e-4,
       why="float32 rounding, in a different order than NumPy's.")
expect("the same bits when run again", device_sum(d_x) == total,
       why="a fixed tree gives the same bits every run.")

# %% [markdown]
# ## What the simulator can and cannot show
# Timing: the simulator starts one Python thread per CUDA thread, so it runs a few thousand threads a
# second. Its timings say nothing about a GPU's.

# %%
# NumPy's saxpy takes microseconds: the best of 5 repeats of 20 runs, so that a moment the machine
# spends elsewhere cannot stretch it (one run of it once took 2 ms, on a busy machine)
numpy_s = min(timeit.repeat(lambda: np.float32(2.0) * x + y, number=20, repeat=5)) / 20
print(f"saxpy: kernel {kernel_s * 1e3:.1f} ms ({grid * block / kernel_s:,.0f} threads/s), NumPy "
      f"{numpy_s * 1e6:.1f} us")
if SIMULATOR:
    expect(f"on the simulator, the kernel is thousands of times slower than NumPy or more (here "
           f"{kernel_s / numpy_s:,.0f}x)", kernel_s > 1000 * numpy_s,
           why="on a GPU this launch would take a few microseconds.")

# %% [markdown]
# Threads are Python threads. On the simulator a kernel can call any Python: here each thread appends
# (block, thread, phase) to a Python list and names its thread class. Without a barrier each thread
# runs to its end before the next one starts; with `cuda.syncthreads()` all threads of the block reach
# the barrier before any goes on.

# %%
if SIMULATOR:
    events = []

    @cuda.jit
    def no_barrier(dummy):
        events.append((cuda.blockIdx.x, cuda.threadIdx.x, "a"))
        events.append((cuda.blockIdx.x, cuda.threadIdx.x, "b"))

    @cuda.jit
    def with_barrier(dummy):
        events.append((cuda.blockIdx.x, cuda.threadIdx.x, "a"))
        cuda.syncthreads()
        events.append((cuda.blockIdx.x, cuda.threadIdx.x, "b"))

    dummy = cuda.device_array(1, np.float32)
    orders = {}
    for kernel in (no_barrier, with_barrier):
        events.clear()
        kernel[1, 4](dummy)
        orders[kernel.__name__] = [f"{t}{p}" for _, t, p in events]
        print(f"{kernel.__name__:12} order of (block, thread, phase):", " ".join(orders[kernel.__name__]))

    threads = []

    @cuda.jit
    def who(dummy):
        threads.append(threading.current_thread())

    who[1, 2](dummy)
    print(f"each CUDA thread runs as a Python {type(threads[0]).__name__} (a threading.Thread)")
    expect("with the barrier, all four threads write their a before any thread writes its b",
           sorted(orders["with_barrier"][:4]) == ["0a", "1a", "2a", "3a"]
           and len(orders["with_barrier"]) == 8)
    expect("each CUDA thread of the launch is a Python thread of its own, not the one running this script",
           len({id(t) for t in threads}) == 2 and threading.current_thread() not in threads,
           why="without the barrier nothing orders the threads: on the simulator they usually run one at a "
               "time (0a 0b 1a 1b ...), each to its end before the next starts; on a GPU they interleave.")
else:
    print("(a real GPU: kernels cannot call Python there, so this cell only runs on the simulator)")

# %% [markdown]
# Races: threads that do `counter[0] += 1` without an atomic read the same old value and lose updates
# on a GPU. On the simulator each thread usually runs to its end before the next starts, so the
# race does not show: the simulator checks logic, not concurrency. The integer atomic is always right.

# %%
@cuda.jit
def racy_count(counter):
    counter[0] += 1  # read, add, write: three steps another thread can interleave with


@cuda.jit
def atomic_count(counter):
    cuda.atomic.add(counter, 0, 1)  # one indivisible step (integer atomics are deterministic)


n_threads = 4 * 64
counts = {}
for kernel in (racy_count, atomic_count):
    d_c = cuda.to_device(np.zeros(1, np.int32))
    kernel[4, 64](d_c)
    counts[kernel.__name__] = d_c.copy_to_host()[0]
    print(f"{kernel.__name__:12} {counts[kernel.__name__]:4d} of {n_threads} increments")
expect(f"the atomic count is exactly {n_threads}", counts["atomic_count"] == n_threads)
expect(f"the racy count is at most {n_threads} (here {counts['racy_count']})",
       counts["racy_count"] <= n_threads,
       why="a lost update can only lower it. On the simulator it is usually 256, right by luck; on a GPU it "
           "comes out far below 256.")

# %% [markdown]
# ## The PTX check: compile for a real GPU, on the CPU
# The simulator checks no types: a kernel that only works as Python would pass. `numba.cuda.compile_ptx`
# compiles a kernel for a real GPU (here compute capability 9.0) without one. It needs the simulator
# off, and that flag is read when numba is imported, so the check runs in a fresh Python process with
# `NUMBA_ENABLE_CUDASIM=0` (snlite's `tests/test_ptx.py` does this for every registered kernel).

# %%
PTX_SCRIPT = r'''
import json, re, sys
from numba import cuda, float32
from numba.cuda import compile_ptx
RED_BLOCK = %d
def ceil_div(a, b):
    return -(-a // b)
%s
%s
FLOAT_ATOMIC = re.compile(r"\b(atom|red)(\.\w+)*\.f(16|32|64)\b")
out = {}
for fn, sig in ((saxpy, "void(float32, float32[::1], float32[::1], float32[::1])"),
                (block_sum, "void(float32[::1], float32[::1])")):
    ptx, _ = compile_ptx(fn, sig, cc=(9, 0))
    out[fn.__name__] = {"lines": ptx.count("\n"), "target": re.search(r"\.target (\w+)", ptx).group(1),
                        "bar.sync": len(re.findall(r"\bbar\.sync\b", ptx)),
                        "shared": len(re.findall(r"\b(ld|st)\.shared", ptx)),
                        "float atomics": len(FLOAT_ATOMIC.findall(ptx))}
json.dump(out, sys.stdout)
'''


def kernel_source(kernel):
    """The kernel's Python source, without its decorator (the simulator keeps it as .py_func)."""
    src = inspect.getsource(getattr(kernel, "py_func", kernel))
    return src[src.index("def "):]


script = PTX_SCRIPT % (RED_BLOCK, kernel_source(saxpy), kernel_source(block_sum))
env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
t0 = time.perf_counter()
proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
if proc.returncode == 0:
    import json

    print(f"PTX compiled in a subprocess in {time.perf_counter() - t0:.1f} s:")
    print(f"{'kernel':10} {'target':7} {'lines':>6} {'bar.sync':>9} {'ld/st.shared':>13} "
          f"{'float atomics':>14}")
    ptx = json.loads(proc.stdout)
    for name, r in ptx.items():
        print(f"{name:10} {r['target']:7} {r['lines']:6d} {r['bar.sync']:9d} {r['shared']:13d} "
              f"{r['float atomics']:14d}")
    expect("target sm_90; saxpy uses no barrier and no shared memory; block_sum has bar.sync (the "
           "cuda.syncthreads() calls: 2 in the source, one per tree level too where the compiler unrolls "
           "the loop, 1 + log2(64) = 7) and ld/st.shared; no floating-point atomics anywhere",
           all(r["target"] == "sm_90" and r["float atomics"] == 0 for r in ptx.values())
           and ptx["saxpy"]["bar.sync"] == ptx["saxpy"]["shared"] == 0
           and ptx["block_sum"]["bar.sync"] > 0 and ptx["block_sum"]["shared"] > 0)
else:
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    print(f"PTX check unavailable here ({last[:160]}); it needs NVIDIA's NVVM: pip install "
          "'numba-cuda[cu13]'")

# %% [markdown]
# ## One of snlite's kernels against its NumPy reference
# Every kernel family in `kernels/` has NumPy references (`gemm_ref`), one or more kernel versions (GEMM has
# three: `v1` naive, `v2` tiled in shared memory, `v3` register-blocked; batchnorm and softmax two, the
# others one) and `examples(rng)`: small, odd shapes. `kernels._check.run_example`
# runs the reference on NumPy copies and the launcher on device copies, with device allocation forbidden
# inside the launcher. `python -m kernels.gemm` does this for every example.

# %%
import kernels.gemm as gemm  # noqa: E402
from kernels._check import compare, run_example  # noqa: E402

examples = gemm.examples(np.random.default_rng(0))[:2 if QUICK else 4]
print(f"{'example':20} {'version':8} {'max |kernel - reference|':>25} {'same bits as v1':>16}")
diffs, same = [], []
for ex in examples:
    first = None
    for version in gemm.VERSIONS:
        want, got = run_example(gemm.OPS, ex, version)
        assert compare(ex, want, got) is None, compare(ex, want, got)
        first = got[0] if first is None else first
        diffs.append(np.abs(got[0] - want[0]).max())
        same.append(np.array_equal(got[0], first))
        print(f"{ex.label[:20]:20} {version:8} {diffs[-1]:25.2e} {str(same[-1]):>16}")
expect("tiny differences from NumPy (under 1e-4), and True in the last column: all versions "
       "agree bit for bit",
       max(diffs) < 1e-4 and all(same),
       why="NumPy sums in another order; all of snlite's versions add acc += a*b for k = 0, 1, ... in the "
           "same order. snlite relies on it: the convolution algorithm the memory budget allows never "
           "changes the numbers.")

# %% [markdown]
# ## Exercise
# 1. In `block_sum`, delete the `cuda.syncthreads()` inside the loop and run again, twice. Even the
#    simulator now gives wrong sums, and different ones each run (its threads take turns at arbitrary
#    moments): explain which reads come too early, why a GPU would be as wrong, and why
#    `python -m pytest tests/test_ptx.py` would still pass.
# 2. Set `RED_BLOCK = 48` (not a power of two). Which elements does the tree skip? Check the sum.
# 3. Run `NUMBA_ENABLE_CUDASIM=0 python tutorials/00_numba_cuda_simulator.py` without a GPU: what fails,
#    and at which line? (The PTX cell never needed a GPU: why?)
