"""The direct algorithm of :mod:`kernels.conv`: its CUDA kernels, and the geometry and work of
each launch (pure: what the launch report and the cost model read without a GPU).

- v1 (forward, backward_data, backward_filter): naive, one thread per output element.
- v2 (forward, backward_filter): an implicit GEMM, w/dy and column tiles of TILE x TILE staged in
  shared memory; the column tiles are built from x on the fly (no column buffer).
- v3 (backward_filter): v2's tiles with the reduction over images split across grid z, each
  image's partial sum s_n in a workspace slab, then ``fold_v1`` adds the slabs onto dw in order.

The canonical summation orders are :mod:`kernels.conv`'s (its docstring); the launchers that choose
among these kernels, and the im2col algorithm, are there too. The kernels are registered under the
family's name, ``kernels.conv._forward_v2`` and so on (``FAMILY``).
"""
from __future__ import annotations

from numba import cuda, float32

from kernels import gemm as _gemm
from kernels._common import Launch, ceil_div, cuda_kernel, unravel4
from kernels.im2col import _col_value, _out_index, _tap

FAMILY = "kernels.conv"  # the registered names' module
BLOCK = 128  # threads per block of the 1-D (v1) launches
TILE = 16  # v2 tiles are TILE x TILE, one thread per output element of the tile

_SIG4 = "float32[:, :, :, ::1]"
_SIG3 = "float32[:, :, ::1]"
_SIG2 = "float32[:, ::1]"


# Groups need no argument: the shapes say them. w holds C/groups input channels, so groups =
# C / w.shape[1], and output channel co belongs to group co // (Cout/groups), whose input channels
# start at that group times C/groups. Each direct kernel is built twice (``_direct_kernels``):
# ``grouped`` is a constant of its closure, so the groups=1 kernels compile without the group
# arithmetic (the registers the launch report and the cost model read stay those of a plain
# convolution), and the ``*_grouped`` twins with it.
def _direct_kernels(grouped: bool) -> dict:
    """The direct algorithm's kernels, by name (``forward_v1``, ...), for groups=1 or for any groups."""
    suffix = "_grouped" if grouped else ""

    def register(signature):
        def deco(fn):
            fn.__name__ = fn.__qualname__ = f"{fn.__name__}{suffix}"
            return cuda_kernel(signature, FAMILY)(fn)
        return deco

    @cuda.jit(device=True, inline=True)
    def first_channel(co, c_, cg, co_):
        """The first input channel of output channel co's group (cg = C/groups input channels each)."""
        return co // (co_ // (c_ // cg)) * cg if grouped else 0

    @cuda.jit(device=True, inline=True)
    def group_tile(co_, k_, c_, khw):
        """The block's group and this thread's output channel, for the tiled kernels (grid y = the
        groups' TILE-row tiles, ``Geometry.co_tiles``): (group, co, whether co is in the group)."""
        if not grouped:
            co = cuda.blockIdx.y * TILE + cuda.threadIdx.y
            return 0, co, co < co_
        cog = co_ // (c_ // (k_ // khw))
        tiles = (cog + TILE - 1) // TILE
        grp = cuda.blockIdx.y // tiles
        local = cuda.blockIdx.y % tiles * TILE + cuda.threadIdx.y
        return grp, grp * cog + local, local < cog

    @cuda.jit(device=True, inline=True)
    def filter_tile_sum(x, dy3, dyt, ct, n, grp, co, co_ok, k_, kh_, kw_, ow_, sh, sw, ph, pw):
        """s_n[co, k] for this thread's (k, co) of the block's TILE x TILE tile of dw (in group grp:
        ``group_tile``): the sum over p ascending of dy[n, co, p] * col[n, grp*K + k, p], p in tiles
        of dy and col (built from x) staged in the shared arrays dyt and ct. Every thread of the
        block must call it (it has barriers)."""
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        if not grouped:  # as group_tile has it, computed here where the loads use it
            co = cuda.blockIdx.y * TILE + ty
            co_ok = co < dy3.shape[1]
        kt = cuda.blockIdx.x * TILE + ty  # the k this thread stages into the col tile
        k0 = grp * k_ if grouped else 0  # the group's first row of col
        p_ = dy3.shape[2]
        s = float32(0.0)
        for p0 in range(0, p_, TILE):
            dyt[ty, tx] = dy3[n, co, p0 + tx] if co_ok and p0 + tx < p_ else float32(0.0)
            inside = kt < k_ and p0 + tx < p_
            ct[tx, ty] = _col_value(x, n, k0 + kt, p0 + tx, kh_, kw_, ow_, sh, sw, ph, pw) if inside \
                else float32(0.0)
            cuda.syncthreads()
            for pp in range(min(TILE, p_ - p0)):
                s += dyt[ty, pp] * ct[pp, tx]
            cuda.syncthreads()
        return s

    @register(f"void({_SIG4}, {_SIG4}, {_SIG4}, int64, int64, int64, int64)")
    def _forward_v1(x, w, y, sh, sw, ph, pw):
        # Naive: one thread per element of y; k = (ci, kh, kw) ascending, padded taps add w * 0.0.
        i = cuda.grid(1)
        n_, co_, oh_, ow_ = y.shape
        if i < n_ * co_ * oh_ * ow_:
            n, co, oh, ow = unravel4(i, co_, oh_, ow_)
            c0 = first_channel(co, x.shape[1], w.shape[1], co_)
            acc = float32(0.0)
            for ci in range(w.shape[1]):
                for kh in range(w.shape[2]):
                    for kw in range(w.shape[3]):
                        acc += w[co, ci, kh, kw] * _tap(x, n, c0 + ci, oh * sh - ph + kh, ow * sw - pw + kw)
            y[n, co, oh, ow] = acc

    @register(f"void({_SIG4}, {_SIG2}, {_SIG3}, int64, int64, int64, int64, int64, int64, int64)")
    def _forward_v2(x, w2, y3, kh_, kw_, ow_, sh, sw, ph, pw):
        # Implicit GEMM: y[n] (Cout x P) = w (Cout x K) @ col[n] (K x P), per group: a TILE x TILE
        # block of one group stages a tile of w and a tile of the group's rows of col (built from x
        # on the fly) in shared memory, k ascending.
        wt = cuda.shared.array((TILE, TILE), float32)
        ct = cuda.shared.array((TILE, TILE), float32)
        tx, ty, n = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockIdx.z
        p = cuda.blockIdx.x * TILE + tx
        co_, k_ = w2.shape
        grp, co, co_ok = group_tile(co_, k_, x.shape[1], kh_ * kw_)
        p_ = y3.shape[2]
        acc = float32(0.0)
        for k0 in range(0, k_, TILE):
            wt[ty, tx] = w2[co, k0 + tx] if co_ok and k0 + tx < k_ else float32(0.0)
            inside = k0 + ty < k_ and p < p_
            kc = grp * k_ + k0 + ty  # the row of col: the group's rows come one after the other
            ct[ty, tx] = _col_value(x, n, kc, p, kh_, kw_, ow_, sh, sw, ph, pw) if inside else float32(0.0)
            cuda.syncthreads()
            for kk in range(min(TILE, k_ - k0)):
                acc += wt[ty, kk] * ct[kk, tx]
            cuda.syncthreads()
        if co_ok and p < p_:
            y3[n, co, p] = acc

    @register(f"void({_SIG4}, {_SIG4}, {_SIG4}, int64, int64, int64, int64)")
    def _backward_data_v1(dy, w, dx, sh, sw, ph, pw):
        # Naive: one thread per element of dx; per tap (kh, kw ascending) a sum over the co of c's
        # group, then added.
        i = cuda.grid(1)
        n_, c_, h_, w_ = dx.shape
        co_, cg, kh_, kw_ = w.shape
        if i < n_ * c_ * h_ * w_:
            n, c, ih, iw = unravel4(i, c_, h_, w_)
            cog = co_ // (c_ // cg) if grouped else co_
            co0, cl = (c // cg * cog, c % cg) if grouped else (0, c)
            total = float32(0.0)
            for kh in range(kh_):
                oh = _out_index(ih + ph - kh, sh, dy.shape[2])
                if oh >= 0:
                    for kw in range(kw_):
                        ow = _out_index(iw + pw - kw, sw, dy.shape[3])
                        if ow >= 0:
                            acc = float32(0.0)
                            for co in range(co0, co0 + cog):
                                acc += w[co, cl, kh, kw] * dy[n, co, oh, ow]
                            total += acc
            dx[n, c, ih, iw] = total

    @register(f"void({_SIG4}, {_SIG4}, {_SIG4}, int64, int64, int64, int64)")
    def _backward_filter_v1(x, dy, dw, sh, sw, ph, pw):
        # Naive: one thread per element of dw; per image a sum over (oh, ow), then the gemm epilogue.
        i = cuda.grid(1)
        co_, c_, kh_, kw_ = dw.shape
        if i < co_ * c_ * kh_ * kw_:
            co, c, kh, kw = unravel4(i, c_, kh_, kw_)
            ci = first_channel(co, x.shape[1], c_, co_) + c
            dwv = float32(0.0)
            for n in range(dy.shape[0]):
                s = float32(0.0)
                for oh in range(dy.shape[2]):
                    for ow in range(dy.shape[3]):
                        s += dy[n, co, oh, ow] * _tap(x, n, ci, oh * sh - ph + kh, ow * sw - pw + kw)
                dwv = _gemm._epilogue(s, dwv, float32(1.0), float32(1.0), n > 0)
            dw[co, c, kh, kw] = dwv

    @register(f"void({_SIG4}, {_SIG3}, {_SIG2}, int64, int64, int64, int64, int64, int64, int64)")
    def _backward_filter_v2(x, dy3, dw2, kh_, kw_, ow_, sh, sw, ph, pw):
        # Implicit GEMM per image: s_n (Cout x K) = dy[n] (Cout x P) @ col[n]^T, p ascending in tiles
        # of dy and col staged in shared memory; then dw = 1*s_n (+ 1*dw) as the gemm epilogue does.
        dyt = cuda.shared.array((TILE, TILE), float32)
        ct = cuda.shared.array((TILE, TILE), float32)
        k = cuda.blockIdx.x * TILE + cuda.threadIdx.x
        co_, k_ = dw2.shape
        grp, co, co_ok = group_tile(co_, k_, x.shape[1], kh_ * kw_)
        dwv = float32(0.0)
        for n in range(dy3.shape[0]):
            s = filter_tile_sum(x, dy3, dyt, ct, n, grp, co, co_ok, k_, kh_, kw_, ow_, sh, sw, ph, pw)
            dwv = _gemm._epilogue(s, dwv, float32(1.0), float32(1.0), n > 0)
        if co_ok and k < k_:
            dw2[co, k] = dwv

    @register(f"void({_SIG4}, {_SIG3}, {_SIG2}, {_SIG3}, int64, int64, int64, int64, int64, int64, int64, "
              "int64)")
    def _backward_filter_v3(x, dy3, dw2, part, n0, kh_, kw_, ow_, sh, sw, ph, pw):
        # Split over images: block (x, y, z) computes s_n of image n = n0 + z for one tile (v2's sum
        # for one image), so a chunk fills the GPU. Image n0 adds straight onto dw (the epilogue);
        # the others go to part[z - 1], which _fold_v1 then adds onto dw in order.
        dyt = cuda.shared.array((TILE, TILE), float32)
        ct = cuda.shared.array((TILE, TILE), float32)
        z = cuda.blockIdx.z
        k = cuda.blockIdx.x * TILE + cuda.threadIdx.x
        co_, k_ = dw2.shape
        grp, co, co_ok = group_tile(co_, k_, x.shape[1], kh_ * kw_)
        s = filter_tile_sum(x, dy3, dyt, ct, n0 + z, grp, co, co_ok, k_, kh_, kw_, ow_, sh, sw, ph, pw)
        if co_ok and k < k_:
            if z == 0:
                dw2[co, k] = _gemm._epilogue(s, dw2[co, k] if n0 > 0 else float32(0.0), float32(1.0),
                                             float32(1.0), n0 > 0)
            else:
                part[z - 1, co, k] = s

    return {"forward_v1": _forward_v1, "forward_v2": _forward_v2, "backward_data_v1": _backward_data_v1,
            "backward_filter_v1": _backward_filter_v1, "backward_filter_v2": _backward_filter_v2,
            "backward_filter_v3": _backward_filter_v3}


DIRECT = {False: _direct_kernels(False), True: _direct_kernels(True)}  # grouped -> kernels


@cuda_kernel(f"void({_SIG3}, {_SIG2})", FAMILY)
def _fold_v1(part, dw2):
    # The second level of v3's reduction: dw = 1*part[0] + 1*dw, then part[1], ... in order.
    j = cuda.grid(1)
    co_, k_ = dw2.shape
    if j < co_ * k_:
        co, k = j // k_, j % k_
        dwv = dw2[co, k]
        for i in range(part.shape[0]):
            dwv = _gemm._epilogue(part[i, co, k], dwv, float32(1.0), float32(1.0), True)
        dw2[co, k] = dwv


fold_v1 = _fold_v1  # the second level of v3's reduction, launched by conv2d_backward_filter


# ---------------------------------------------------------------- launch geometry (pure)
# Work per launch (see kernels._common.Launch): the direct kernels do one FMA per two loads
# (fma_share 1/3); the naive ones (v1) load one operand per FMA from global memory (the other is
# the same for the whole warp), the tiled ones each operand once per tile that needs it.
def _name(g, kernel):
    """The registered name of direct kernel ``kernel`` for the geometry's groups."""
    return f"{FAMILY}._{kernel}{'_grouped' if g.groups > 1 else ''}"


def _macs(g, images):
    return images * g.co * g.k * g.p


def forward_v1_geometry(g) -> Launch:
    out = g.n * g.co * g.p
    return Launch(_name(g, "forward_v1"), ceil_div(out, BLOCK), BLOCK, flops=2 * _macs(g, g.n),
                  bytes=4 * (_macs(g, g.n) + out), fma_share=1 / 3)


def forward_v2_geometry(g) -> Launch:
    tiles = 4 * g.n * (g.co * g.k * ceil_div(g.p, TILE) + g.k * g.p * g.co_tiles + g.co * g.p)
    return Launch(_name(g, "forward_v2"), (ceil_div(g.p, TILE), g.co_tiles, g.n), (TILE, TILE),
                  flops=2 * _macs(g, g.n), bytes=tiles, fma_share=1 / 3)


def backward_data_v1_geometry(g) -> Launch:  # each dx sums the Cout/groups outputs of its group
    out = g.n * g.c * g.h * g.w
    return Launch(_name(g, "backward_data_v1"), ceil_div(out, BLOCK), BLOCK, flops=2 * _macs(g, g.n),
                  bytes=4 * (_macs(g, g.n) + out), fma_share=1 / 3)


def backward_filter_v1_geometry(g) -> Launch:
    out = g.co * g.k
    return Launch(_name(g, "backward_filter_v1"), ceil_div(out, BLOCK), BLOCK, flops=2 * _macs(g, g.n),
                  bytes=4 * (_macs(g, g.n) + out), fma_share=1 / 3)


def backward_filter_tiled_geometry(g, version, images) -> Launch:
    """v2 (all images in each block) or v3's first launch (one image per block, grid z = images)."""
    tiles = 4 * images * (g.co * g.p * ceil_div(g.k, TILE) + g.k * g.p * g.co_tiles)
    slabs = 4 * g.co * g.k * (2 if version == "v2" else images + 1)  # v3 writes a slab per image, reads dw
    return Launch(_name(g, f"backward_filter_{version}"),
                  (ceil_div(g.k, TILE), g.co_tiles, 1 if version == "v2" else images), (TILE, TILE),
                  flops=2 * _macs(g, images), bytes=tiles + slabs, fma_share=1 / 3)


def fold_geometry(g, slabs) -> Launch:
    out = g.co * g.k
    return Launch(f"{FAMILY}._fold_v1", ceil_div(out, BLOCK), BLOCK, flops=0, bytes=4 * out * (slabs + 2))
