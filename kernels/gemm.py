"""GEMM: C = alpha * op(A) @ op(B) + beta * C, with op = transpose when the flag is set.

Used by linear layers and by im2col convolution. Run the self-check on the simulator:
    NUMBA_ENABLE_CUDASIM=1 python -m kernels.gemm

Every kernel is strided-batched: A, B and C are stacks of matrices (3-D, C-contiguous) and
block z of the grid computes C[z] = alpha * op(A[z]) @ op(B[z]) + beta * C[z]; an operand with
one matrix is shared by the whole batch (a convolution's weights). ``gemm`` is the batch of one,
``gemm_batched`` the general launch: one launch per im2col chunk, grid z = the chunk's images.
With ``reduce=True`` the grid has one z and each block sums the batch into C (one matrix), in
order: C = alpha*P_0 + beta*C, then C = alpha*P_z + 1*C for z = 1, 2, ... (P_z = op(A[z]) @
op(B[z])), bit for bit what one ``gemm`` per matrix with beta = 1 after the first would give.
Convolution's backward-filter uses it to sum a chunk's images inside one launch.

Three versions, same numbers:
- v1, naive: one thread per element of C, reading A and B from global memory.
- v2, tiled: a (bx, by) block stages tiles of op(A) and op(B) in shared memory.
- v3, register-blocked: each thread keeps a tm x tn micro-tile of C in registers and a block
  computes a (by*tm) x (bx*tn) tile from k-slices of A and B staged in shared memory.

Canonical order: every output's accumulator starts at float32 0.0 and adds ``acc += av * bv`` for
k = 0, 1, ..., K-1 in ascending order (the GPU compiler contracts each to one FMA), then the same
``_epilogue`` writes C. So all versions give bit-identical results (convolution relies on this:
the algorithm chosen for the workspace must never change the numbers). v3 pads the last k-slice
with zeros; adding 0*0 = +0.0 leaves an accumulator unchanged (it starts at +0.0, so it is never
-0.0). With beta == 0, C is written without being read (arena memory starts as garbage, maybe NaN).

``block`` is (threads in x, threads in y[, tm, tn]): v1 and v2 use the thread block only; v3 also
the micro-tile (default ``V3_MICRO``). Shared and local arrays need compile-time sizes, so v2
allocates ``TILE_MAX`` x ``TILE_MAX`` tiles and uses part of them, and v3 builds (and registers)
one kernel per block shape and pair of transpose flags with a small factory, `_make_gemm_v3`,
on first use (the default block's four are built at import, for the PTX check).
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32

from kernels._check import Example, example_arrays, main
from kernels._common import (MAX_GRID_Z, Launch, Op, ceil_div, check, check_apart, check_version, cuda_kernel,
                             grid_z_parts)

VERSIONS = ("v1", "v2", "v3")
TILE_MAX = 32  # v2: the largest block side; its shared tiles are TILE_MAX x TILE_MAX
V3_BK = 8  # v3: depth (in k) of the shared-memory slices of op(A) and op(B)
V3_PAD = 4  # v3: extra columns per shared row, so the staging stores do not hit one bank
V3_MICRO = (8, 8)  # v3: default micro-tile (tm, tn) when ``block`` gives only the thread block
DEFAULT_BLOCK = {"v1": (16, 16), "v2": (32, 32), "v3": (16, 16, 8, 8)}
# MAX_GRID_Z (kernels._common): CUDA's limit on grid z, the most matrices one batched launch takes;
# gemm_batched launches a larger batch in parts of at most that many


def gemm_flops(m: int, n: int, k: int) -> int:
    """Floating-point operations of an M x N x K matrix product (one multiply and one add each)."""
    return 2 * int(m) * int(n) * int(k)


# ---------------------------------------------------------------- NumPy reference
def gemm_ref(a, b, c, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0):
    a_ = a.T if trans_a else a
    b_ = b.T if trans_b else b
    prod = a_ @ b_
    if beta == 0:
        c[...] = c.dtype.type(alpha) * prod
    else:
        c[...] = c.dtype.type(alpha) * prod + c.dtype.type(beta) * c


# ---------------------------------------------------------------- device helpers
@cuda.jit(device=True, inline=True)
def _epilogue(acc, c_old, alpha, beta, use_beta):
    """The one place C is written from an accumulator; every version calls it."""
    if use_beta:
        return alpha * acc + beta * c_old
    return alpha * acc


@cuda.jit(device=True, inline=True)
def _index(v):
    """A thread or block index, written so the compiler can see it is not negative: Numba wraps
    negative array indices around (like NumPy), and this removes that check from every access
    the index feeds (in v3 it saves about 90 registers a thread)."""
    return max(v, 0)


@cuda.jit(device=True, inline=True)
def _batch_range(a, b, reduce):
    """(first, last + 1) of the matrices this block computes: all of them, in order, with
    ``reduce``; else matrix blockIdx.z."""
    if reduce:
        return 0, max(a.shape[0], b.shape[0])
    z = _index(cuda.blockIdx.z)
    return z, z + 1


@cuda.jit(device=True, inline=True)
def _mat(x, z):
    """The matrix of operand x that matrix z of the batch uses: z, or 0 if x is shared (one matrix)."""
    return z if x.shape[0] > 1 else 0


@cuda.jit(device=True, inline=True)
def _store(c, z, first, reduce, row, col, acc, alpha, beta, use_beta):
    """C[z] (C[0] with ``reduce``) at (row, col) = the epilogue of acc; a later matrix of a
    reduction (``first`` False) adds onto C with beta = 1. C is read only if it is added to."""
    zc = 0 if reduce else z
    chained = not first
    use = use_beta or chained
    old = c[zc, row, col] if use else float32(0.0)
    c[zc, row, col] = _epilogue(acc, old, alpha, float32(1.0) if chained else beta, use)


@cuda.jit(device=True, inline=True)
def _op_at(x, z, i, j, trans, rows, cols):
    """Element (i, j) of op(X[z]), a rows x cols matrix (X[z] is cols x rows if ``trans``); 0.0 outside."""
    v = float32(0.0)
    if i < rows and j < cols:
        v = x[z, j, i] if trans else x[z, i, j]
    return v


@cuda.jit(device=True, inline=True)
def _slot(tid, l, threads, k_major, width):
    """(kk, w) of slot tid + l*threads of a V3_BK x width slice, slots numbered in memory order.
    The launcher makes ``threads`` and the row length divide one another, so the split below is
    exact and the l-terms are compile-time constants (one address per thread, plus offsets)."""
    step = l * threads
    if k_major:
        return tid // width + step // width, tid % width + step % width
    return tid % V3_BK + step % V3_BK, tid // V3_BK + step // V3_BK


@cuda.jit(device=True, inline=True)
def _fetch(x, z, regs, loads, k_major, k0, w0, width, k_lim, w_lim, tid, threads):
    """regs[l] = element (k0 + kk, w0 + w) of the K x W operand x[z] (0.0 outside) for slot l
    of this thread; memory holds it as x[z, k, w] if ``k_major`` else x[z, w, k], and
    consecutive threads read consecutive addresses."""
    for l in range(loads):
        kk, w = _slot(tid, l, threads, k_major, width)
        v = float32(0.0)
        if kk < V3_BK and k0 + kk < k_lim and w0 + w < w_lim:
            v = x[z, k0 + kk, w0 + w] if k_major else x[z, w0 + w, k0 + kk]
        regs[l] = v


@cuda.jit(device=True, inline=True)
def _put(regs, s, loads, k_major, width, tid, threads):
    """s[kk, w] = what `_fetch` loaded into ``regs`` for slot (kk, w)."""
    for l in range(loads):
        kk, w = _slot(tid, l, threads, k_major, width)
        if kk < V3_BK:
            s[kk, w] = regs[l]


# ---------------------------------------------------------------- kernels
_M = "float32[:, :, ::1]"
_SIG = f"void({_M}, {_M}, {_M}, boolean, boolean, float32, float32, boolean, boolean)"
_SIG_V3 = f"void({_M}, {_M}, {_M}, float32, float32, boolean, boolean)"


@cuda_kernel(_SIG)
def _gemm_v1(a, b, c, trans_a, trans_b, alpha, beta, use_beta, reduce):
    # Naive: one thread per element of C, reading A and B straight from global memory.
    col, row = cuda.grid(2)
    _, m_, n_ = c.shape
    k_ = a.shape[1] if trans_a else a.shape[2]
    z0, z1 = _batch_range(a, b, reduce)
    if row < m_ and col < n_:
        for z in range(z0, z1):
            za, zb = _mat(a, z), _mat(b, z)
            acc = float32(0.0)
            for k in range(k_):
                av = a[za, k, row] if trans_a else a[za, row, k]
                bv = b[zb, col, k] if trans_b else b[zb, k, col]
                acc += av * bv
            _store(c, z, z == z0, reduce, row, col, acc, alpha, beta, use_beta)


@cuda_kernel(_SIG)
def _gemm_v2(a, b, c, trans_a, trans_b, alpha, beta, use_beta, reduce):
    """Tiled, batched GEMM: C[z] = alpha * op(A[z]) @ op(B[z]) + beta * C[z], one (bx, by) thread
    block per by x bx tile of one matrix z of C.

    Assignment 3 (tiled GEMM kernel on the simulator). Requirements (``pytest -m a3``):

    - A, B and C are stacks of matrices (3-D); ``_batch_range(a, b, reduce)`` gives the matrices
      z this block computes (blockIdx.z; all of them, in order, with ``reduce``) and
      ``_mat(a, z)`` / ``_mat(b, z)`` which matrix of each operand z uses (z, or 0 if shared);
    - thread (tx, ty) of block (x, y, z) owns C[z, y*by + ty, x*bx + tx] (the launcher's grid
      covers C with ceil(N / bx) x ceil(M / by) x batch blocks of ``block = (bx, by)``, bx and by
      at most TILE_MAX); M, N and K need not be multiples of the block: guard every index;
    - tiled: the block stages slices of op(A) and op(B) in ``cuda.shared.array`` tiles (at most
      TILE_MAX x TILE_MAX, one per source line) between ``cuda.syncthreads()`` barriers that every
      thread reaches, so each element of A is read from global memory at most ceil(N / bx) times
      and each element of B at most ceil(M / by) times (v1 reads each N or M times);
    - the canonical order: the accumulator starts at float32 0.0 and adds ``acc += av * bv`` for
      k = 0, 1, ..., K-1 in ascending order, then ``_store`` writes it through the epilogue, so
      the result is bit-identical to ``_gemm_v1`` (and within float32 rounding of ``gemm_ref``);
    - when ``use_beta`` is False, C is written without being read (it may hold NaN);
    - indices are written with ``cuda.threadIdx``/``cuda.blockIdx``/``cuda.blockDim``; no atomics.
    """
    # Tiled: a (bx, by) block computes a by x bx tile of C. Per step it stages a by x tk slice of
    # op(A) and a tk x bx slice of op(B) (tk = min(bx, by)) in shared memory, so every value read
    # from global memory serves a whole row or column of the tile.
    # BEGIN ASSIGNMENT 3: tiled GEMM kernel on the simulator
    sa = cuda.shared.array((TILE_MAX, TILE_MAX), float32)
    sb = cuda.shared.array((TILE_MAX, TILE_MAX), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    tk = min(cuda.blockDim.x, cuda.blockDim.y)
    row = cuda.blockIdx.y * cuda.blockDim.y + ty
    col = cuda.blockIdx.x * cuda.blockDim.x + tx
    _, m_, n_ = c.shape
    k_ = a.shape[1] if trans_a else a.shape[2]
    z0, z1 = _batch_range(a, b, reduce)
    for z in range(z0, z1):
        za, zb = _mat(a, z), _mat(b, z)
        acc = float32(0.0)
        for k0 in range(0, k_, tk):
            if tx < tk:
                sa[ty, tx] = _op_at(a, za, row, k0 + tx, trans_a, m_, k_)
            if ty < tk:
                sb[ty, tx] = _op_at(b, zb, k0 + ty, col, trans_b, k_, n_)
            cuda.syncthreads()
            for kk in range(min(tk, k_ - k0)):
                av = sa[ty, kk]
                bv = sb[kk, tx]
                acc += av * bv
            cuda.syncthreads()
        if row < m_ and col < n_:
            _store(c, z, z == z0, reduce, row, col, acc, alpha, beta, use_beta)
    # END ASSIGNMENT 3


def _make_gemm_v3(bx, by, tm, tn, trans_a, trans_b):
    """Build the register-blocked kernel for a (bx, by) thread block, a tm x tn micro-tile and
    the given transpose flags.

    Every size a shared or local array depends on, and the flags, are constants of this closure,
    so Numba compiles them in: the micro-tile loops unroll (the accumulators live in registers)
    and the staging code has no branch on the layout. Thread (tx, ty) owns rows ty + i*by and
    columns tx + j*bx of the block's tile: the shared reads of a warp are broadcasts (A) or
    consecutive (B), and its writes to C are coalesced. While the block multiplies one k-slice
    from shared memory, each thread already holds the next one's loads in registers (ra, rb).
    """
    bm, bn, threads = by * tm, bx * tn, bx * by
    a_cols, b_cols = bm + V3_PAD, bn + V3_PAD
    a_loads, b_loads = ceil_div(V3_BK * bm, threads), ceil_div(V3_BK * bn, threads)
    a_kmajor, b_kmajor = trans_a, not trans_b  # op(A)[r, k] = A[k, r] if trans_a; op(B)[k, j] = B[k, j]

    def kernel(a, b, c, alpha, beta, use_beta, reduce):
        sa = cuda.shared.array((V3_BK, a_cols), float32)  # sa[kk, r] = op(A)[row0 + r, k0 + kk]
        sb = cuda.shared.array((V3_BK, b_cols), float32)  # sb[kk, j] = op(B)[k0 + kk, col0 + j]
        acc = cuda.local.array((tm, tn), float32)
        af = cuda.local.array(tm, float32)
        bf = cuda.local.array(tn, float32)
        ra = cuda.local.array(a_loads, float32)
        rb = cuda.local.array(b_loads, float32)
        tx = _index(cuda.threadIdx.x)
        ty = _index(cuda.threadIdx.y)
        tid = ty * bx + tx
        row0 = _index(cuda.blockIdx.y) * bm
        col0 = _index(cuda.blockIdx.x) * bn
        _, m_, n_ = c.shape
        k_ = a.shape[1] if trans_a else a.shape[2]
        z0, z1 = _batch_range(a, b, reduce)
        for z in range(z0, z1):
            za, zb = _mat(a, z), _mat(b, z)
            for i in range(tm):
                for j in range(tn):
                    acc[i, j] = float32(0.0)
            _fetch(a, za, ra, a_loads, a_kmajor, 0, row0, bm, k_, m_, tid, threads)
            _fetch(b, zb, rb, b_loads, b_kmajor, 0, col0, bn, k_, n_, tid, threads)
            for k0 in range(0, k_, V3_BK):
                _put(ra, sa, a_loads, a_kmajor, bm, tid, threads)
                _put(rb, sb, b_loads, b_kmajor, bn, tid, threads)
                cuda.syncthreads()
                if k0 + V3_BK < k_:
                    _fetch(a, za, ra, a_loads, a_kmajor, k0 + V3_BK, row0, bm, k_, m_, tid, threads)
                    _fetch(b, zb, rb, b_loads, b_kmajor, k0 + V3_BK, col0, bn, k_, n_, tid, threads)
                for kk in range(V3_BK):
                    for i in range(tm):
                        af[i] = sa[kk, ty + i * by]
                    for j in range(tn):
                        bf[j] = sb[kk, tx + j * bx]
                    for i in range(tm):
                        for j in range(tn):
                            av = af[i]
                            bv = bf[j]
                            acc[i, j] += av * bv
                cuda.syncthreads()
            for i in range(tm):
                for j in range(tn):
                    row = row0 + ty + i * by
                    col = col0 + tx + j * bx
                    if row < m_ and col < n_:
                        _store(c, z, z == z0, reduce, row, col, acc[i, j], alpha, beta, use_beta)

    kernel.__name__ = kernel.__qualname__ = _v3_name(bx, by, tm, tn, trans_a, trans_b)
    return cuda_kernel(_SIG_V3)(kernel)


def _v3_name(bx, by, tm, tn, trans_a, trans_b):
    return f"_gemm_v3_{bx}x{by}_{tm}x{tn}_{'nt'[bool(trans_a)]}{'nt'[bool(trans_b)]}"


_V3_KERNELS: dict = {}  # (bx, by, tm, tn, trans_a, trans_b) -> kernel, each built and registered once


def _gemm_v3(bx, by, tm, tn, trans_a, trans_b):
    """The v3 kernel for this block shape, micro-tile and transposition (built on first use)."""
    key = (bx, by, tm, tn, bool(trans_a), bool(trans_b))
    if key not in _V3_KERNELS:
        _V3_KERNELS[key] = _make_gemm_v3(*key)
    return _V3_KERNELS[key]


for _flags in ((False, False), (False, True), (True, False), (True, True)):
    _gemm_v3(*DEFAULT_BLOCK["v3"], *_flags)  # built at import, so the PTX test compiles the default block


# ---------------------------------------------------------------- launch geometry (pure)
def gemm_shapes(a_shape, b_shape, trans_a=False, trans_b=False):
    """(M, N, K) of op(A) @ op(B); raises ValueError if the inner dimensions differ."""
    m, ka = (a_shape[1], a_shape[0]) if trans_a else tuple(a_shape)
    kb, n = (b_shape[1], b_shape[0]) if trans_b else tuple(b_shape)
    if ka != kb:
        raise ValueError(f"gemm: op(A) is {m}x{ka} but op(B) is {kb}x{n}; inner dimensions must match")
    return m, n, ka


def _block(version, block):
    """Validate ``block`` for ``version``; return (bx, by, tm, tn) (tm = tn = 1 for v1 and v2)."""
    block = tuple(int(v) for v in (DEFAULT_BLOCK[version] if block is None else block))
    if len(block) not in (2, 4) or min(block) < 1:
        raise ValueError(f"gemm block: expected (bx, by) or (bx, by, tm, tn) of positive ints, got {block}")
    bx, by = block[:2]
    tm, tn = (block[2:] or V3_MICRO) if version == "v3" else (1, 1)
    if bx * by > 1024:
        raise ValueError(f"gemm block: {bx}x{by} = {bx * by} threads, more than the 1024 a block may have")
    if version == "v2" and max(bx, by) > TILE_MAX:
        raise ValueError(f"gemm block: v2 tiles are at most {TILE_MAX} wide, got {(bx, by)}")
    if version == "v3":
        if max(tm, tn) > 8:
            raise ValueError(f"gemm block: v3 micro-tiles are at most 8x8 (registers), got {(tm, tn)}")
        for what, size in (("by*tm", by * tm), ("bx*tn", bx * tn), ("V3_BK", V3_BK)):
            if (bx * by) % size and size % (bx * by):
                raise ValueError(f"gemm block: v3 needs the thread count bx*by = {bx * by} and {what} = "
                                 f"{size} to divide one another, got block {block}")
        for what, width in (("by*tm", by * tm), ("bx*tn", bx * tn)):
            if bx * by > V3_BK * width:  # a thread with no slot of a slice would store past its row
                raise ValueError(f"gemm block: v3 needs at most V3_BK*{what} = {V3_BK * width} threads (one "
                                 f"element of each {V3_BK} x {width} slice each at least), got bx*by = "
                                 f"{bx * by} in block {block}: use a larger micro-tile or fewer threads")
    return bx, by, tm, tn


def gemm_geometry(version, m, n, k, batch=1, *, reduce=False, trans_a=False, trans_b=False, beta=0.0,
                  block=None) -> Launch:
    """The launch of a batch of ``batch`` M x N x K products (one C with ``reduce``): kernel,
    grid (ceil(N / (bx*tn)), ceil(M / (by*tm)), batch or 1), block, and its work. Bytes count
    each operand once per tile that reads it (v1 has no tiles: a thread reads its own row and
    column), plus C written (and read where it is added to)."""
    check_version(version, VERSIONS)
    bx, by, tm, tn = _block(version, block)
    if version == "v3":
        name, share = _v3_name(bx, by, tm, tn, trans_a, trans_b), tm * tn / (tm * tn + tm + tn)
    else:
        name, share = f"_gemm_{version}", 1 / 3  # one FMA per two loads
    bm, bn = (1, 1) if version == "v1" else (by * tm, bx * tn)
    grid = (ceil_div(n, bx * tn), ceil_div(m, by * tm), 1 if reduce else batch)
    c_reads = (batch - 1 if reduce else 0) + ((1 if reduce else batch) if beta != 0 else 0)
    operands = batch * (m * k * ceil_div(n, bn) + k * n * ceil_div(m, bm))
    nbytes = 4 * (operands + m * n * (batch + c_reads))  # C: written once per matrix, read where added to
    return Launch(f"kernels.gemm.{name}", grid, (bx, by), flops=batch * gemm_flops(m, n, k), bytes=nbytes,
                  fma_share=share)


# ---------------------------------------------------------------- launchers
def _kernel(version, bx, by, tm, tn, trans_a, trans_b):
    if version == "v3":
        return _gemm_v3(bx, by, tm, tn, trans_a, trans_b)
    return {"v1": _gemm_v1, "v2": _gemm_v2}[version]


def gemm_batched(a, b, c, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, reduce=False, stream=0,
                 version="v3", block=None):
    """C[z] = alpha * op(A[z]) @ op(B[z]) + beta * C[z] for each matrix z, in one launch (grid
    z = batch; a batch of more than MAX_GRID_Z matrices in several, each of at most that many);
    A or B may hold one matrix, shared by all. ``reduce=True``: C holds one matrix and gets the
    batch's products summed into it in order (see the module docstring), in one launch of grid
    z = 1 whatever the batch."""
    check_version(version, VERSIONS)
    for name, arr in (("a", a), ("b", b), ("c", c)):
        check(f"gemm_batched {name}", arr)
        if arr.ndim != 3:
            raise ValueError(f"gemm_batched {name}: expected a 3-D stack of matrices, got shape "
                             f"{tuple(arr.shape)}")
    batch = max(a.shape[0], b.shape[0])
    for name, arr in (("a", a), ("b", b)):
        if arr.shape[0] not in (1, batch):
            raise ValueError(f"gemm_batched {name}: {arr.shape[0]} matrices, but the batch is {batch} "
                             "(an operand holds 1 matrix, shared, or one per matrix of the batch)")
    m, n, k = gemm_shapes(a.shape[1:], b.shape[1:], trans_a, trans_b)
    check("gemm_batched c", c, shape=(1 if reduce else batch, m, n))
    check_apart("gemm_batched", ("c", c), ("a", a), ("b", b))
    if reduce and batch == 0:
        raise ValueError("gemm_batched: reduce=True needs at least one matrix to sum")
    geometry = gemm_geometry(version, m, n, k, batch, reduce=reduce, trans_a=trans_a, trans_b=trans_b,
                             beta=beta, block=block)
    if m == 0 or n == 0 or batch == 0:
        return
    kernel = _kernel(version, *_block(version, block), trans_a, trans_b)
    scalars = (np.float32(alpha), np.float32(beta), bool(beta != 0), bool(reduce))
    flags = () if version == "v3" else (bool(trans_a), bool(trans_b))
    if reduce or batch <= MAX_GRID_Z:  # reduce: grid z is 1 (each block loops over the whole batch)
        kernel.launch(geometry, stream, a, b, c, *flags, *scalars)
        return
    for z0, nz in grid_z_parts(batch, MAX_GRID_Z):  # each matrix is independent: the parts change no bits
        part = gemm_geometry(version, m, n, k, nz, trans_a=trans_a, trans_b=trans_b, beta=beta, block=block)
        kernel.launch(part, stream, _matrices(a, z0, nz), _matrices(b, z0, nz), c[z0:z0 + nz],
                      *flags, *scalars)


def _matrices(x, z0, nz):
    """Matrices z0 .. z0 + nz - 1 of operand x (all of it if it holds one, shared)."""
    return x if x.shape[0] == 1 else x[z0:z0 + nz]


def gemm(a, b, c, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, stream=0, version="v3", block=None):
    """C = alpha * op(A) @ op(B) + beta * C on the device (a batch of one); ``block``: see the
    module docstring."""
    check_version(version, VERSIONS)
    check("gemm a", a)
    check("gemm b", b)
    for name, arr in (("a", a), ("b", b)):
        if arr.ndim != 2:
            raise ValueError(f"gemm {name}: expected a 2-D array, got shape {tuple(arr.shape)}")
    m, n, _ = gemm_shapes(a.shape, b.shape, trans_a, trans_b)
    check("gemm c", c, shape=(m, n))
    _block(version, block)
    gemm_batched(a.reshape(1, *a.shape), b.reshape(1, *b.shape), c.reshape(1, m, n), trans_a=trans_a,
                 trans_b=trans_b, alpha=alpha, beta=beta, stream=stream, version=version, block=block)


OPS = {"gemm": Op("gemm", gemm_ref, gemm, VERSIONS)}


def examples(rng):
    r, nan = example_arrays(rng)
    out = []
    for ta in (False, True):
        for tb in (False, True):
            m, n, k = 13, 11, 19
            a = r(k, m) if ta else r(m, k)
            b = r(n, k) if tb else r(k, n)
            out.append(Example("gemm", (a, b, nan(m, n)), (2,), kwargs={"trans_a": ta, "trans_b": tb},
                               launch={"block": (8, 8, 2, 2) if ta == tb else (8, 4, 1, 2)}, rtol=1e-4,
                               atol=1e-5, label=f"13x11x19 ta={ta:d} tb={tb:d}"))
    out.append(Example("gemm", (r(7, 5), r(5, 9), r(7, 9)), (2,), kwargs={"alpha": 0.5, "beta": -2.0},
                       launch={"block": (4, 8, 2, 4)}, rtol=1e-4, atol=1e-5, label="alpha/beta"))
    out.append(Example("gemm", (r(3, 33), r(9, 33), nan(3, 9)), (2,), kwargs={"trans_b": True, "alpha": 2.0},
                       launch={"block": (8, 4, 1, 2)}, rtol=1e-4, atol=1e-5, label="3x9x33 k tail"))
    out.append(Example("gemm", (r(5, 0), r(0, 6), nan(5, 6)), (2,), launch={"block": (4, 4, 2, 2)},
                       label="K=0"))
    return out


if __name__ == "__main__":
    main(__import__(__name__))
