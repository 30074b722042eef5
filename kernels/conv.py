"""2-D convolution (PyTorch's Conv2d without bias or dilation): forward, backward data, backward
filter, each by two algorithms that give BIT-IDENTICAL results.

Run the self-check on the simulator:  NUMBA_ENABLE_CUDASIM=1 python -m kernels.conv

x (N, C, H, W), w (Cout, C/groups, KH, KW), y (N, Cout, OH, OW), OH = (H + 2*ph - KH)//sh + 1;
stride and padding are an int or an (h, w) pair. Bias is ``kernels.elementwise.bias_add``/``bias_backward``.

Groups, as PyTorch's: ``groups`` divides both C and Cout; group g's Cout/groups outputs see only
its C/groups input channels, g*C/groups onwards (``groups=C``: a depthwise convolution). Each
group is a convolution of its own, summed in the canonical order below with K = C/groups*KH*KW.
The direct algorithm runs every group in the same launches (its tiles never straddle two groups);
``im2col`` takes groups=1 only (its gemm shares one filter matrix across a batch), so
``snlite.workspace`` offers a grouped convolution the direct algorithm alone.

Algorithms (``ALGORITHMS``), chosen per call by the runtime ("the fastest whose workspace fits"),
both working on ``chunk`` images at a time where they need a workspace (1-D float32, at least
``workspace_bytes(...)``, from the caller):
- ``direct`` (its kernels: :mod:`kernels.conv_direct`): ``version`` picks the direct kernel: v1
  naive (one thread per output), v2 (forward, backward_filter) an implicit GEMM with w/dy and column
  tiles in shared memory, one launch. backward_filter v3 splits the reduction over images to fill a
  large GPU: per chunk, one launch sums each image's s_n in its own blocks (grid z = the chunk's
  images; the chunk's first image adds straight onto dw) and a second launch folds the others, kept
  in the workspace ((chunk - 1) x Cout x K floats), into dw in order. No workspace (chunk 1): v2.
  Forward and backward_data need no workspace.
- ``im2col``: column buffers (``kernels.im2col``) in the workspace, then ONE batched GEMM per chunk
  (``kernels.gemm.gemm_batched``, grid z = the chunk's images): two launches per chunk. Backward
  filter sums the chunk's images inside the GEMM (``reduce=True``). ``version`` (and ``block``)
  are the GEMM's, so this algorithm's versions are ``kernels.gemm.VERSIONS``.
  ``version=None`` means the algorithm's default. An op's ``Op.versions`` is the union of both
  lists; each example names the versions of its algorithm.

Canonical orders. Every reduction is ``acc = 0.0; acc += a * b`` in the order below (the gemm's
statement, so FMA contraction on a GPU is the same too) and ends with the gemm's epilogue:
- forward: y[n, co, oh, ow] = sum over k = (ci*KH + kh)*KW + kw ascending of w[co, k] * col[n, k, p],
  padded taps included as w * 0.0 (never skipped: that differs when acc is -0.0 or w is inf/NaN).
- backward_data: per tap, dcol[n, k, p] = sum over co ascending of w[co, k] * dy[n, co, p]; then
  dx = ((0.0 + dcol at tap (kh0, kw0)) + the next tap) ... for kh, then kw ascending (col2im's gather).
- backward_filter: per image, s_n[co, k] = sum over p = oh*OW + ow ascending of dy[n, co, p] * col[n, k, p];
  then dw = 1*s_0, dw = 1*s_n + 1*dw for n = 1, 2, ... (the gemm with beta=0, then beta=1).
Images are independent until that last fold, so a chunk's images run in parallel (grid z) in every
algorithm, and only the fold over n, kept in order, is sequential. Grid z holds at most MAX_GRID_Z
(65,535) blocks, so a batch or chunk of more images is launched in parts of at most that many, in
order (more launches, the same bits); ``launches`` and ``launch_counts`` count every part.

``launches(op, algo, ...)`` lists the launches a call makes (kernel, grid, block, work) without a
GPU: it runs the launcher itself on shape-only arrays and records them (``kernels._common``).
"""
from __future__ import annotations

import functools
from collections import Counter
from typing import NamedTuple

import numpy as np

from kernels import gemm as _gemm
from kernels._check import Example, example_arrays, main
from kernels._common import (MAX_GRID_Z, Launch, Op, ShapeArray, ceil_div, check, grid_z_parts, pair,
                             record_launches)
from kernels.conv_direct import (DIRECT, TILE, backward_data_v1_geometry, backward_filter_tiled_geometry,
                                 backward_filter_v1_geometry, fold_geometry, fold_v1, forward_v1_geometry,
                                 forward_v2_geometry)
from kernels.im2col import col2im, col2im_ref, im2col, im2col_ref, output_hw

ALGORITHMS = ("direct", "im2col")
DIRECT_VERSIONS = {"forward": ("v1", "v2"), "backward_data": ("v1",), "backward_filter": ("v1", "v2", "v3")}


# ---------------------------------------------------------------- shapes and workspace (pure)
class Geometry(NamedTuple):
    n: int
    c: int
    h: int
    w: int
    co: int
    kh: int
    kw: int
    oh: int
    ow: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    groups: int = 1

    @property
    def k(self):  # the reduction length of forward: a row of w, C/groups*KH*KW
        return self.c // self.groups * self.kh * self.kw

    @property
    def cog(self):  # output channels per group
        return self.co // self.groups

    @property
    def co_tiles(self):  # TILE-row tiles of output channels, per group: a tile never straddles two
        return self.groups * ceil_div(self.cog, TILE)

    @property
    def p(self):  # columns of a column buffer: output positions per image
        return self.oh * self.ow


def check_groups(c, co, groups, who="conv2d") -> int:
    """``groups`` as an int, if it is an integer >= 1 that divides both channel counts, as PyTorch
    asks; else a ValueError naming ``who`` and the numbers."""
    if isinstance(groups, (bool, np.bool_)) or not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ValueError(f"{who}: groups must be an integer >= 1, got {groups!r}")
    for what, n in (("in_channels", c), ("out_channels", co)):
        if n % groups:
            raise ValueError(f"{who}: {what} ({n}) must be divisible by groups ({groups})")
    return int(groups)


def _geometry(x_shape, w_shape, stride, padding, groups=1) -> Geometry:
    x_shape, w_shape = tuple(x_shape), tuple(w_shape)
    if len(x_shape) != 4 or len(w_shape) != 4:
        raise ValueError("conv2d: expected x (N, C, H, W) and w (Cout, C/groups, KH, KW), got x "
                         f"{x_shape}, w {w_shape}")
    n, c, h, wd = x_shape
    co, cw, kh, kw = w_shape
    groups = check_groups(c, co, groups)
    if c != cw * groups:
        per = f" / groups {groups}" if groups > 1 else ""
        raise ValueError(f"conv2d: x has {c} channels (shape {x_shape}){per} but w expects {cw} "
                         f"(shape {w_shape})")
    oh, ow = output_hw((h, wd), (kh, kw), stride, padding, who=f"conv2d (x {x_shape}, w {w_shape})")
    return Geometry(n, c, h, wd, co, kh, kw, oh, ow, pair(stride, "stride"), pair(padding, "padding"), groups)


def output_shape(x_shape, w_shape, stride=1, padding=0, groups=1) -> tuple[int, int, int, int]:
    """(N, Cout, OH, OW); ValueError on a channel mismatch or a kernel larger than the padded input."""
    g = _geometry(x_shape, w_shape, stride, padding, groups)
    return g.n, g.co, g.oh, g.ow


def conv_flops(x_shape, w_shape, stride=1, padding=0, groups=1) -> int:
    """Floating-point operations of the forward pass: 2 per multiply-add (C/groups*KH*KW of them
    per output element)."""
    g = _geometry(x_shape, w_shape, stride, padding, groups)
    return 2 * g.n * g.co * g.p * g.k


def workspace_bytes(op, algo, x_shape, w_shape, stride=1, padding=0, chunk=1, version=None, groups=1) -> int:
    """Exact workspace bytes ``conv2d_<op>`` needs with ``algo`` (and ``version``; None: the
    default), chunk capped at N: for im2col, one float32 column buffer (C*KH*KW x OH*OW) per image
    of a chunk; for direct backward_filter v3 (the default when chunk > 1), the partial sums of a
    chunk's images but its first ((chunk - 1) x Cout x C/groups*KH*KW floats); else 0. ValueError
    for im2col with groups > 1, which it does not run."""
    if op not in DIRECT_VERSIONS:
        raise ValueError(f"conv2d workspace_bytes: unknown op {op!r}; choose one of {tuple(DIRECT_VERSIONS)}")
    if algo not in ALGORITHMS:
        raise ValueError(f"conv2d workspace_bytes: unknown algo {algo!r}; choose one of {ALGORITHMS}")
    if not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise ValueError(f"conv2d workspace_bytes: chunk must be an int >= 1, got {chunk!r}")
    g = _geometry(x_shape, w_shape, stride, padding, groups)
    _check_algo_groups("conv2d workspace_bytes", algo, g)
    return 4 * _workspace_floats(op, algo, g, chunk, version)


def _check_algo_groups(name, algo, g):
    if algo == "im2col" and g.groups > 1:
        raise ValueError(f"{name}: algo 'im2col' runs groups=1 only, got groups={g.groups}; use 'direct'")


def _workspace_floats(op, algo, g, chunk, version):
    m = min(int(chunk), g.n)
    if algo == "im2col":  # groups=1: K = C*KH*KW, the rows of a column buffer
        return m * g.k * g.p
    if op == "backward_filter" and version in (None, "v3"):
        return max(m - 1, 0) * g.co * g.k
    return 0


# ---------------------------------------------------------------- NumPy references
# algo, workspace and chunk are accepted (same arguments as the launchers) and ignored: they never
# change the result. Each group is a convolution of its own: its slice of the channels of x (or dx),
# of w (or dw) and of y (or dy).
def _groups_of(g):
    """(input channel slice, output channel slice) of each group."""
    cg = g.c // g.groups
    return [(slice(i * cg, (i + 1) * cg), slice(i * g.cog, (i + 1) * g.cog)) for i in range(g.groups)]


def conv2d_forward_ref(x, w, y, *, stride=1, padding=0, groups=1, algo="im2col", workspace=None, chunk=1):
    g = _geometry(x.shape, w.shape, stride, padding, groups)
    col = np.empty((g.n, g.k, g.p), x.dtype)
    for cin, cout in _groups_of(g):
        im2col_ref(np.ascontiguousarray(x[:, cin]), col, kernel_size=(g.kh, g.kw), stride=stride,
                   padding=padding)
        y[:, cout] = np.matmul(w[cout].reshape(g.cog, g.k), col).reshape(g.n, g.cog, g.oh, g.ow)


def conv2d_backward_data_ref(dy, w, dx, *, stride=1, padding=0, groups=1, algo="im2col", workspace=None,
                             chunk=1):
    g = _geometry(dx.shape, w.shape, stride, padding, groups)
    dxg = np.empty((g.n, g.c // g.groups, g.h, g.w), dx.dtype)
    for cin, cout in _groups_of(g):
        dcol = np.matmul(w[cout].reshape(g.cog, g.k).T, dy[:, cout].reshape(g.n, g.cog, g.p))
        col2im_ref(dcol, dxg, kernel_size=(g.kh, g.kw), stride=stride, padding=padding)
        dx[:, cin] = dxg


def conv2d_backward_filter_ref(x, dy, dw, *, stride=1, padding=0, groups=1, algo="im2col", workspace=None,
                               chunk=1):
    g = _geometry(x.shape, dw.shape, stride, padding, groups)
    col = np.empty((g.n, g.k, g.p), x.dtype)
    for cin, cout in _groups_of(g):
        im2col_ref(np.ascontiguousarray(x[:, cin]), col, kernel_size=(g.kh, g.kw), stride=stride,
                   padding=padding)
        dw[cout] = np.einsum("nop,nkp->ok", dy[:, cout].reshape(g.n, g.cog, g.p), col).reshape(dw[cout].shape)


# ---------------------------------------------------------------- launchers
DIRECT_DEFAULT = {"forward": "v2", "backward_data": "v1", "backward_filter": "v2"}  # v3 when chunk > 1


def _prepare(name, op, g, algo, workspace, chunk, version):
    """Check algo, chunk and version; return (version, the 1-D view of the workspace floats the
    call needs, or None)."""
    if algo not in ALGORITHMS:
        raise ValueError(f"{name}: unknown algo {algo!r}; choose one of {ALGORITHMS}")
    if not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise ValueError(f"{name}: chunk must be an int >= 1, got {chunk!r}")
    _check_algo_groups(name, algo, g)
    versions = DIRECT_VERSIONS[op] if algo == "direct" else _gemm.VERSIONS
    if version is not None and version not in versions:
        raise ValueError(f"{name}: algo {algo!r} has versions {versions}, got {version!r}")
    if algo == "direct" and version is None:
        version = "v3" if op == "backward_filter" and min(int(chunk), g.n) > 1 else DIRECT_DEFAULT[op]
    need = _workspace_floats(op, algo, g, chunk, version)
    if need == 0:
        return version, None
    if workspace is None:
        raise ValueError(f"{name}: algo {algo!r} with chunk={chunk} needs a workspace of {4 * need} "
                         "bytes, got none")
    check(f"{name} workspace", workspace)
    if workspace.ndim != 1:
        raise ValueError(f"{name} workspace: expected a 1-D float32 array, got shape "
                         f"{tuple(workspace.shape)}")
    if workspace.size < need:
        raise ValueError(f"{name}: workspace too small for algo {algo!r} with chunk={chunk}: needs "
                         f"{4 * need} bytes, got {4 * workspace.size} bytes")
    return version, workspace[:need]


def _chunks(g, chunk):
    """Yield (first image, images) for each chunk of the batch."""
    step = min(int(chunk), g.n)
    for n0 in range(0, g.n, step):
        yield n0, min(step, g.n - n0)


def _gemm_kwargs(stream, version, block):
    kw = {"stream": stream}
    if version is not None:
        kw["version"] = version
    if block is not None:
        kw["block"] = block
    return kw


def _v2_args(g):
    return (g.kh, g.kw, g.ow) + g.stride + g.padding


def _window(g):
    return {"kernel_size": (g.kh, g.kw), "stride": g.stride, "padding": g.padding}


def conv2d_forward(x, w, y, *, stride=1, padding=0, groups=1, algo="im2col", workspace=None, chunk=1,
                   stream=0, version=None, block=None):
    """y = conv2d(x, w). ``version``: the direct kernel's or the gemm's; ``block``: the gemm's (im2col)."""
    name = "conv2d_forward"
    check(f"{name} x", x)
    check(f"{name} w", w)
    g = _geometry(x.shape, w.shape, stride, padding, groups)
    check(f"{name} y", y, shape=(g.n, g.co, g.oh, g.ow))
    version, ws = _prepare(name, "forward", g, algo, workspace, chunk, version)
    if y.size == 0:
        return
    y3, direct = y.reshape(g.n, g.co, g.p), DIRECT[g.groups > 1]
    if algo == "direct" and version == "v1":
        direct["forward_v1"].launch(forward_v1_geometry(g), stream, x, w, y, *g.stride, *g.padding)
    elif algo == "direct":  # grid z = images: at most MAX_GRID_Z of them a launch
        for n0, m in grid_z_parts(g.n, MAX_GRID_Z):
            direct["forward_v2"].launch(forward_v2_geometry(g._replace(n=m)), stream, x[n0:n0 + m],
                                        w.reshape(g.co, g.k), y3[n0:n0 + m], *_v2_args(g))
    else:  # per chunk: im2col, then y[n] = w @ col[n] for the chunk's images in one launch
        for n0, m in _chunks(g, chunk):
            col = ws[:m * g.k * g.p].reshape(m, g.k, g.p)
            im2col(x[n0:n0 + m], col, **_window(g), stream=stream)
            _gemm.gemm_batched(w.reshape(1, g.co, g.k), col, y3[n0:n0 + m],
                               **_gemm_kwargs(stream, version, block))


def conv2d_backward_data(dy, w, dx, *, stride=1, padding=0, groups=1, algo="im2col", workspace=None, chunk=1,
                         stream=0, version=None, block=None):
    """dx = d loss / d x from dy = d loss / d y (dx is written, not accumulated)."""
    name = "conv2d_backward_data"
    check(f"{name} w", w)
    check(f"{name} dx", dx)
    g = _geometry(dx.shape, w.shape, stride, padding, groups)
    check(f"{name} dy", dy, shape=(g.n, g.co, g.oh, g.ow))
    version, ws = _prepare(name, "backward_data", g, algo, workspace, chunk, version)
    if dx.size == 0:
        return
    if algo == "direct":
        DIRECT[g.groups > 1]["backward_data_v1"].launch(backward_data_v1_geometry(g), stream, dy, w, dx,
                                                         *g.stride, *g.padding)
        return
    dy3 = dy.reshape(g.n, g.co, g.p)
    for n0, m in _chunks(g, chunk):  # per chunk: dcol[n] = w^T @ dy[n] in one launch, then col2im
        dcol = ws[:m * g.k * g.p].reshape(m, g.k, g.p)
        _gemm.gemm_batched(w.reshape(1, g.co, g.k), dy3[n0:n0 + m], dcol, trans_a=True,
                           **_gemm_kwargs(stream, version, block))
        col2im(dcol, dx[n0:n0 + m], **_window(g), stream=stream)


def conv2d_backward_filter(x, dy, dw, *, stride=1, padding=0, groups=1, algo="im2col", workspace=None,
                           chunk=1, stream=0, version=None, block=None):
    """dw = d loss / d w from x and dy, summed over the batch (dw is written, not accumulated)."""
    name = "conv2d_backward_filter"
    check(f"{name} x", x)
    check(f"{name} dw", dw)
    g = _geometry(x.shape, dw.shape, stride, padding, groups)
    check(f"{name} dy", dy, shape=(g.n, g.co, g.oh, g.ow))
    version, ws = _prepare(name, "backward_filter", g, algo, workspace, chunk, version)
    if dw.size == 0:
        return
    dy3, dw2, direct = dy.reshape(g.n, g.co, g.p), dw.reshape(g.co, g.k), DIRECT[g.groups > 1]
    if g.n == 0 or (algo == "direct" and version == "v1"):  # an empty batch: dw = 0, by the direct kernel
        direct["backward_filter_v1"].launch(backward_filter_v1_geometry(g), stream, x, dy, dw, *g.stride,
                                            *g.padding)
    elif algo == "direct" and version == "v2":
        direct["backward_filter_v2"].launch(backward_filter_tiled_geometry(g, "v2", g.n), stream, x, dy3,
                                            dw2, *_v2_args(g))
    elif algo == "direct":  # v3, per chunk: each image's s_n in parallel, then the fold in order
        for c0, cm in _chunks(g, chunk):
            # grid z = images: a chunk of more than MAX_GRID_Z goes in parts, each folded onto dw in
            # turn, the same additions in the same order (dw = s_n + dw for n ascending)
            for n0, m in grid_z_parts(cm, MAX_GRID_Z):
                n0 += c0
                # the part's partial sums but the first; one image has none (dw stands in, untouched)
                if m > 1:
                    part = ws[:(m - 1) * g.co * g.k].reshape(m - 1, g.co, g.k)
                else:
                    part = dw.reshape(1, g.co, g.k)
                direct["backward_filter_v3"].launch(backward_filter_tiled_geometry(g, "v3", m), stream, x,
                                                    dy3, dw2, part, n0, *_v2_args(g))
                if m > 1:
                    fold_v1.launch(fold_geometry(g, m - 1), stream, part, dw2)
    else:  # per chunk: im2col, then dw (+)= the chunk's s_n, summed in order inside one launch
        for n0, m in _chunks(g, chunk):
            col = ws[:m * g.k * g.p].reshape(m, g.k, g.p)
            im2col(x[n0:n0 + m], col, **_window(g), stream=stream)
            _gemm.gemm_batched(dy3[n0:n0 + m], col, dw.reshape(1, g.co, g.k), trans_b=True,
                               beta=0.0 if n0 == 0 else 1.0, reduce=True,
                               **_gemm_kwargs(stream, version, block))


LAUNCHERS = {"forward": conv2d_forward, "backward_data": conv2d_backward_data,
             "backward_filter": conv2d_backward_filter}


def launches(op, algo, x_shape, w_shape, stride=1, padding=0, chunk=1, version=None,
             block=None, groups=1) -> list[Launch]:
    """The launches ``conv2d_<op>`` makes with these arguments, in order (kernel, grid, block and
    work), recorded from the launcher itself on shape-only arrays: nothing runs, no GPU needed. Each
    set of arguments is recorded once (a planner's searches ask for the same ones thousands of times)."""
    key = (op, algo, tuple(x_shape), tuple(w_shape), stride, padding, chunk, version, block, groups)
    try:
        return list(_recorded(*key))
    except TypeError:  # an argument that cannot be a key (a list): recorded afresh
        return _record(op, algo, x_shape, w_shape, stride, padding, chunk, version, block, groups)


@functools.lru_cache(maxsize=1 << 14)
def _recorded(*key) -> tuple:
    return tuple(_record(*key))


def _record(op, algo, x_shape, w_shape, stride, padding, chunk, version, block, groups) -> list[Launch]:
    if op not in LAUNCHERS:
        raise ValueError(f"conv2d launches: unknown op {op!r}; choose one of {tuple(LAUNCHERS)}")
    x, w = ShapeArray(x_shape), ShapeArray(w_shape)
    y = ShapeArray(output_shape(x_shape, w_shape, stride, padding, groups))
    need = workspace_bytes(op, algo, x_shape, w_shape, stride, padding, chunk, version, groups) // 4
    arrays = {"forward": (x, w, y), "backward_data": (y, w, x), "backward_filter": (x, y, w)}[op]
    with record_launches() as out:
        LAUNCHERS[op](*arrays, stride=stride, padding=padding, groups=groups, algo=algo, chunk=chunk,
                      version=version, block=block, workspace=ShapeArray((need,)) if need else None)
    return out


def launch_counts(op, algo, x_shape, w_shape, stride=1, padding=0, chunk=1, version=None, block=None,
                  groups=1) -> list:
    """``launches(...)`` as [(launch, times)], in order of first appearance, at a cost that does
    not grow with the number of chunks: every chunk between the first and the last launches the
    same, so the launcher is recorded on a batch of the first chunk and one more, and that one is
    counted for all the middle chunks (then the last, if it is smaller)."""
    n = x_shape[0]
    step = min(int(chunk), n)
    chunked = algo == "im2col" or (op == "backward_filter"
                                   and (version == "v3" or (version is None and step > 1)))
    if not chunked or n // step <= 3:
        every = launches(op, algo, x_shape, w_shape, stride, padding, chunk, version, block, groups)
        return list(Counter(every).items())
    full, tail = divmod(n, step)

    def record(images):
        return launches(op, algo, (images,) + tuple(x_shape[1:]), w_shape, stride, padding,
                        chunk, version, block, groups)

    two = record(2 * step)
    first, middle = two[:len(two) // 2], two[len(two) // 2:]
    counts = Counter(first)
    for launch in middle:
        counts[launch] += full - 1
    if tail:
        counts.update(record(step + tail)[len(first):])
    return list(counts.items())


def _versions(op):
    return tuple(dict.fromkeys(DIRECT_VERSIONS[op] + _gemm.VERSIONS))


OPS = {
    "conv2d_forward": Op("conv2d_forward", conv2d_forward_ref, conv2d_forward, _versions("forward")),
    "conv2d_backward_data": Op("conv2d_backward_data", conv2d_backward_data_ref, conv2d_backward_data,
                               _versions("backward_data")),
    "conv2d_backward_filter": Op("conv2d_backward_filter", conv2d_backward_filter_ref, conv2d_backward_filter,
                                 _versions("backward_filter")),
}

# (x shape, w shape, stride, padding, im2col chunk, label): stride 2, asymmetric kernels and padding,
# rows of y entirely in the padding (pad 3 > kernel 3 - 1), a chunk larger than the batch. The first
# case runs im2col with every gemm version, the others (the chunking) with the first only: the
# simulator is slow on the tiled gemms, and tests/test_conv.py checks all of them bit for bit.
EXAMPLE_CASES = (
    ((2, 3, 5, 6), (4, 3, 3, 3), 1, 1, 1, "3x3 pad 1"),
    ((2, 3, 7, 5), (4, 3, 1, 3), 2, (0, 1), 2, "1x3 s2 pad(0,1)"),
    ((3, 2, 6, 5), (5, 2, 3, 2), (2, 1), (3, 0), 4, "3x2 s(2,1) pad(3,0)"),
)
GEMM_BLOCK = (8, 8)  # the gemm block of the examples (few simulated threads)
# Grouped (direct only): (x shape, w shape, stride, padding, chunk, groups, label): two groups of 2
# inputs and 3 outputs; depthwise; depthwise with 2 outputs per channel; groups of 17 outputs, two
# TILE-row tiles each (a tile must not straddle two groups).
GROUPED_CASES = (
    ((2, 4, 5, 4), (6, 2, 3, 2), 1, (1, 0), 2, 2, "groups 2 3x2 pad(1,0)"),
    ((2, 3, 6, 5), (3, 1, 3, 3), 2, 1, 2, 3, "depthwise 3x3 s2 pad 1"),
    ((1, 2, 5, 5), (4, 1, 3, 3), 1, 1, 1, 2, "depthwise x2 3x3 pad 1"),
    ((2, 2, 3, 2), (34, 1, 1, 2), 1, 0, 2, 2, "groups 2 of 17 outputs 1x2"),
)


def examples(rng):
    r, nan = example_arrays(rng)
    out = []
    for case, (xs, ws, stride, padding, chunk, label) in enumerate(EXAMPLE_CASES):
        gemm_versions = _gemm.VERSIONS if case == 0 else _gemm.VERSIONS[:1]
        ys = output_shape(xs, ws, stride, padding)
        args = {"forward": (r(*xs), r(*ws), nan(*ys)), "backward_data": (r(*ys), r(*ws), nan(*xs)),
                "backward_filter": (r(*xs), r(*ys), nan(*ws))}
        for op, a in args.items():
            need = workspace_bytes(op, "im2col", xs, ws, stride, padding, chunk) // 4
            hyper = {"stride": stride, "padding": padding}
            out.append(Example(f"conv2d_{op}", a, (2,), kwargs={**hyper, "algo": "direct"}, rtol=1e-4,
                               atol=1e-5, versions=DIRECT_VERSIONS[op], label=f"direct {label}"))
            # v3 splits a chunk's images over the grid; the fold needs a workspace
            if op == "backward_filter":
                need_d = workspace_bytes(op, "direct", xs, ws, stride, padding, chunk) // 4
                out.append(Example(f"conv2d_{op}", a, (2,), kwargs={**hyper, "algo": "direct", "chunk": chunk,
                                                                    "workspace": nan(max(need_d, 1))},
                                   rtol=1e-4, atol=1e-5, versions=("v3",), label=f"direct c{chunk} {label}"))
            ws_ = nan(need + (3 if chunk == 2 else 0))  # exactly the bytes needed, or a few floats more
            out.append(Example(f"conv2d_{op}", a, (2,), kwargs={**hyper, "algo": "im2col", "workspace": ws_,
                                                                "chunk": chunk},
                               launch={"block": GEMM_BLOCK}, rtol=1e-4, atol=1e-5, versions=gemm_versions,
                               label=f"im2col c{chunk} {label}"))
    for xs, ws, stride, padding, chunk, groups, label in GROUPED_CASES:
        ys = output_shape(xs, ws, stride, padding, groups)
        args = {"forward": (r(*xs), r(*ws), nan(*ys)), "backward_data": (r(*ys), r(*ws), nan(*xs)),
                "backward_filter": (r(*xs), r(*ys), nan(*ws))}
        for op, a in args.items():
            hyper = {"stride": stride, "padding": padding, "groups": groups, "algo": "direct"}
            out.append(Example(f"conv2d_{op}", a, (2,), kwargs=hyper, rtol=1e-4, atol=1e-5,
                               versions=DIRECT_VERSIONS[op], label=label))
            if op == "backward_filter":
                need = workspace_bytes(op, "direct", xs, ws, stride, padding, chunk, groups=groups) // 4
                out.append(Example(f"conv2d_{op}", a, (2,), kwargs={**hyper, "chunk": chunk,
                                                                    "workspace": nan(max(need, 1))},
                                   rtol=1e-4, atol=1e-5, versions=("v3",), label=f"c{chunk} {label}"))
    return out


if __name__ == "__main__":
    main(__import__(__name__))
