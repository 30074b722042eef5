"""Graders for the assignments (docs/INSTRUCTORS.md): ``pytest -m a<k>`` grades assignment k,
as does ``python -m snlite.assignments grade <k>``.

Each test checks requirements listed in the docstring of a function the assignment stubs, against
an independent reference (a brute-force definition, a block bitmap, NumPy, the paper's rule
recomputed from step bytes) or a property (bit-identical training, valid plans), so any correct
design passes. The graders run in order: a test for assignment k may rely on the solutions of
assignments 1..k-1 and never on a later one (a1 simulates with the raw allocator so that it does
not need the pool of a2; a4, a5 and a6 train networks, which needs a1 and a2).
"""
import copy
import importlib
import math
import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from snlite import workspace as ws
from snlite.config import MemoryConfig
from snlite.graph import Graph
from snlite.liveness import analyze, first_and_last_use, format_table, frees_after
from snlite.pool import HostPool, PoolFullError, TensorPool
from snlite.pipeline import simulate
from snlite.scheduler import PERSISTENT_KINDS, Scheduler, validate_plan
from snlite.train import Model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KB = 1024
# the property-based graders draw the same examples on every run, and replay none saved from an earlier
# one, so a submission's grade is the same each time it is graded (it moved by a test from run to run)
# ... and a failure is shrunk to its smallest example but not "explained" (hypothesis's explain phase
# re-runs the failing example with its parts varied to annotate it: seconds per failing grader, three on
# a stub that raises at once, for comments no student needs)
GRADED = {"deadline": None, "derandomize": True, "database": None,
          "phases": tuple(p for p in Phase if p is not Phase.explain)}
# These graders grade the code of the checkout they are in, never an snlite installed from another
# (in a student copy, the instructor's solutions would pass them all).
_HERE = os.path.realpath(ROOT)
_ELSEWHERE = [f"{m.__name__} from {os.path.dirname(m.__file__)}"
              for m in map(importlib.import_module, ("snlite", "kernels"))
              if os.path.commonpath([os.path.realpath(m.__file__), _HERE]) != _HERE]
if _ELSEWHERE:
    raise ImportError(f"the graders in {ROOT} would grade {' and '.join(_ELSEWHERE)}, another checkout: run "
                      f"'python -m snlite.assignments grade' from {ROOT}")


def persistent_of(g):
    return {n for n, t in g.tensors().items() if t.kind in PERSISTENT_KINDS}


def conv_chain(n=2, hw=6, convs=4):
    """data -> (conv -> relu) x convs -> flatten -> fc -> softmax: the paper's offload setting."""
    g = Graph(input_shape=(n, 2, hw, hw), num_classes=3, name="conv_chain")
    y = g.input()
    for i in range(1, convs + 1):
        y = g.relu(g.conv2d(y, 3, 3, padding=1, name=f"conv{i}"), name=f"relu{i}")
    g.softmax_loss(g.linear(g.flatten(y, name="flat"), 3, name="fc"))
    return g


def branchy_net(n=2, hw=6):
    """A fork whose branch reads a CONV output after the next CONV starts, a residual add, BN, LRN,
    pooling and dropout: every case of the offload rule and every kind of cheap layer."""
    g = Graph(input_shape=(n, 2, hw, hw), num_classes=3, name="branchy")
    c1 = g.conv2d(g.input(), 3, 3, padding=1, name="conv1")
    a = g.relu(g.batchnorm(c1, name="bn1"), name="relu1")
    c2 = g.conv2d(a, 3, 3, padding=1, name="conv2")
    c3 = g.conv2d(c1, 3, 1, bias=False, name="conv3")  # reads conv1's output after conv2 has started
    s = g.lrn(g.add(g.relu(c2, name="relu2"), c3, name="add1"), size=3, alpha=0.5, name="lrn1")
    c4 = g.conv2d(g.maxpool(s, 2, name="pool1"), 4, 3, padding=1, name="conv4")
    y = g.dropout(g.flatten(g.relu(c4, name="relu4"), name="flat1"), p=0.3, name="drop1")
    g.softmax_loss(g.linear(y, 3, name="fc1"))
    return g


def train(g, config, steps=2):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(g.input_shape).astype(np.float32)
    labels = rng.integers(0, g.num_classes, g.input_shape[0]).astype(np.int32)
    model = Model(g, config, device="host", seed=4)
    losses = [model.step(x, labels, lr=0.1, momentum=0.9, weight_decay=1e-3) for _ in range(steps)]
    return losses, model.params, model


def assert_same_training(got, want, what):
    assert got[0] == want[0], f"{what}: losses {got[0]} differ from the baseline's {want[0]}"
    for name, value in want[1].items():
        assert np.array_equal(got[1][name], value), f"{what}: parameter {name} differs from the baseline"


# ================================================================ assignment 1: liveness analysis
@dataclass(frozen=True)
class S:
    reads: tuple
    writes: tuple


# docs/paper.md section 3, Fig. 4: DATA0 -> CONV1 -> POOL2 -> FC4 and DATA0 -> CONV3 -> FC4, SOFTMAX5,
# backward 6..11.
FIG4 = [("DATA", S((), ("t0",))), ("CONV", S(("t0",), ("t1",))), ("POOL", S(("t1",), ("t3",))),
        ("CONV", S(("t0",), ("t2",))), ("FC", S(("t3", "t2"), ("t4",))), ("SOFTMAX", S(("t4",), ("prob",))),
        ("SOFTMAX bwd", S(("prob",), ("t5",))), ("FC bwd", S(("t3", "t2", "t5"), ("t6",))),
        ("POOL bwd", S(("t1", "t3", "t6"), ("t7",))), ("CONV bwd", S(("t0", "t7"), ("t8",))),
        ("CONV bwd", S(("t0", "t6"), ("t9",))), ("DATA", S(("t8", "t9"), ()))]
FIG4_TABLE = [  # (in, out), exactly as the paper prints them (compared as sets: the paper lists t7 before t6)
    ((), ("t0",)), (("t0",), ("t0", "t1")), (("t0", "t1"), ("t0", "t1", "t3")),
    (("t0", "t1", "t3"), ("t0", "t1", "t3", "t2")),
    (("t0", "t1", "t3", "t2"), ("t0", "t1", "t3", "t2", "t4")),
    (("t0", "t1", "t3", "t2", "t4"), ("t0", "t1", "t3", "t2", "prob")),
    (("t0", "t1", "t3", "t2", "prob"), ("t0", "t1", "t3", "t2", "t5")),
    (("t0", "t1", "t3", "t2", "t5"), ("t0", "t1", "t3", "t6")),
    (("t0", "t1", "t3", "t6"), ("t0", "t7", "t6")),
    (("t0", "t7", "t6"), ("t0", "t6", "t8")), (("t0", "t6", "t8"), ("t8", "t9")), (("t8", "t9"), ())]


def reference_liveness(steps, persistent=frozenset()):
    """The definition, by brute force: (first, last, [(live_in, live_out, frees)]), tuples in order of
    first use."""
    names = []  # in order of first use
    for s in steps:
        for t in (*s.reads, *s.writes):
            if t not in persistent and t not in names:
                names.append(t)
    uses = {t: [i for i, s in enumerate(steps) if t in s.reads or t in s.writes] for t in names}
    first, last = {t: u[0] for t, u in uses.items()}, {t: u[-1] for t, u in uses.items()}
    rows = [(tuple(t for t in names if first[t] < i <= last[t]),
             tuple(t for t in names if first[t] <= i < last[t]),
             tuple(t for t in names if last[t] == i)) for i in range(len(steps))]
    return first, last, rows


def assert_liveness_matches(steps, persistent=frozenset(), what="route"):
    first, last, rows = reference_liveness(steps, persistent)
    got_first, got_last = first_and_last_use(steps, persistent)
    assert dict(got_first) == first, f"{what}: first uses differ from the definition"
    assert dict(got_last) == last, f"{what}: last uses differ from the definition"
    result = analyze(steps, persistent)
    assert [r.step for r in result] == list(range(len(steps))), f"{what}: one StepLiveness per step, in order"
    for r, (live_in, live_out, frees) in zip(result, rows):
        assert tuple(r.live_in) == live_in, f"{what} step {r.step}: in {r.live_in}, expected {live_in}"
        assert tuple(r.live_out) == live_out, f"{what} step {r.step}: out {r.live_out}, expected {live_out}"
        assert tuple(r.frees) == frees, f"{what} step {r.step}: frees {r.frees}, expected (last uses) {frees}"
    fast = frees_after(steps, persistent)
    assert {i: tuple(ts) for i, ts in fast.items()} == {i: row[2] for i, row in enumerate(rows) if row[2]}, \
        f"{what}: frees_after disagrees with the last uses"


@pytest.mark.a1
def test_a1_fig4_table_exactly():
    result = analyze([s for _, s in FIG4])
    assert len(result) == len(FIG4_TABLE)
    for r, (want_in, want_out) in zip(result, FIG4_TABLE):
        assert (set(r.live_in), set(r.live_out)) == (set(want_in), set(want_out)), \
            f"Fig. 4, step {r.step} ({FIG4[r.step][0]}): in {r.live_in} out {r.live_out}; the paper: " \
            f"{want_in} {want_out}"
    assert_liveness_matches([s for _, s in FIG4], what="Fig. 4")
    assert "{t0,t1,t3,t2,prob}" in format_table(result, [label for label, _ in FIG4])


@pytest.mark.a1
@pytest.mark.parametrize("name", ["cifar_resnet20", "alexnet"])
def test_a1_frees_are_the_last_uses_on_a_real_network(name):
    from snlite.models import get_model

    g = get_model(name, batch=2)
    steps, persistent = g.steps(), persistent_of(g)
    assert_liveness_matches(steps, persistent, what=name)
    result = analyze(steps, persistent)
    freed = [t for r in result for t in r.frees]
    assert len(freed) == len(set(freed)), f"{name}: a tensor is freed twice"
    assert not persistent & set(freed), f"{name}: a persistent tensor (a weight) was freed"
    assert result[-1].live_out == (), f"{name}: tensors still live after the last step"


@pytest.mark.a1
@settings(max_examples=60, **GRADED)
@given(st.lists(st.tuples(st.lists(st.sampled_from("abcdefgh"), max_size=3),
                          st.lists(st.sampled_from("abcdefgh"), max_size=2)), max_size=14),
       st.sets(st.sampled_from("abcdefgh"), max_size=2))
def test_a1_random_routes_match_the_definition(route, persistent):
    steps = [S(tuple(r), tuple(w)) for r, w in route]
    assert_liveness_matches(steps, frozenset(persistent),
                            what=f"route {route}, persistent {sorted(persistent)}")


class CountingStep:
    """A step that counts how often its ``reads`` and ``writes`` are looked at."""

    looks = 0

    def __init__(self, reads, writes):
        self._reads, self._writes = reads, writes

    @property
    def reads(self):
        CountingStep.looks += 1
        return self._reads

    @property
    def writes(self):
        CountingStep.looks += 1
        return self._writes


def _chain(n):
    """n forward steps then n backward steps: a plain chain, like a deep network's route."""
    fwd = [CountingStep((f"x{i - 1}",) if i else (), (f"x{i}",)) for i in range(n)]
    bwd = [CountingStep((f"x{i - 1}", f"g{i}") if i else (f"g{i}",), (f"g{i - 1}",) if i else ())
           for i in reversed(range(n))]
    return fwd + bwd


def _residual(n):
    """n forward steps, each also reading the output two steps back (a skip connection, as in a
    ResNet), then their n backward steps: tensors live across more steps than in a chain."""
    fwd = [CountingStep(tuple(f"x{j}" for j in (i - 1, i - 2) if j >= 0), (f"x{i}",)) for i in range(n)]
    bwd = [CountingStep((*(f"x{j}" for j in (i - 1, i - 2) if j >= 0), f"g{i}"),
                        tuple(f"g{j}" for j in (i - 1, i - 2) if j >= 0)) for i in reversed(range(n))]
    return fwd + bwd


@pytest.mark.a1
@pytest.mark.parametrize("route", [_chain, _residual], ids=["chain", "residual"])
@pytest.mark.parametrize("fn", [first_and_last_use, analyze, frees_after], ids=lambda f: f.__name__)
def test_a1_linear_time_a_constant_number_of_looks_per_step(fn, route):
    looks = []
    for n in (100, 400):
        steps = route(n)
        CountingStep.looks = 0
        fn(steps)
        looks.append(CountingStep.looks / len(steps))
    assert looks[1] <= looks[0] * 1.1 + 0.5, (
        f"{fn.__name__} looked at each step's reads/writes {looks[0]:.1f} times for a 200-step route but "
        f"{looks[1]:.1f} times for an 800-step one ({route.__name__.strip('_')}): the work must be O(N), a "
        "constant number of passes")


@pytest.mark.a1
def test_a1_liveness_lowers_the_peak_and_every_plan_stays_valid():
    from snlite.models import get_model

    g = get_model("cifar_resnet20", batch=2)
    raw = MemoryConfig(allocator="raw")  # one allocation per tensor: no need for the pool of assignment 2
    with_liveness = raw.replace(liveness=True)
    validate_plan(Scheduler(g, with_liveness).plan(), persistent_of(g))
    assert simulate(g, with_liveness).peak_bytes < simulate(g, raw).peak_bytes


# ================================================================ assignment 2: the pool allocator
def free_runs(used):
    """Maximal runs of free blocks in a bitmap: [(first block, length)], in address order."""
    runs, start = [], None
    for i, u in enumerate([*used, True]):
        if not u and start is None:
            start = i
        elif u and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


def expected_block(used, need, fit):
    fits = [(length, start) for start, length in free_runs(used) if length >= need]
    if not fits:
        return None
    return min(start for _, start in fits) if fit == "first" else min(fits)[1]


def state(pool):
    return pool.free_regions(), pool.allocations(), pool.stats()


def assert_pool_matches(pool, used, live):
    """The pool against a block bitmap: free list = the bitmap's free runs (sorted, coalesced, the exact
    complement of the live allocations), allocations = the model's, books balanced."""
    b = pool.block_bytes
    assert pool.free_regions() == tuple((s * b, n * b) for s, n in free_runs(used)), \
        f"free list {pool.free_regions()} but the free blocks are {free_runs(used)} (in blocks of {b})"
    assert {off: size for off, (_, size) in pool.allocations().items()} == \
        {off: n * b for off, n in live.items()}
    stats = pool.stats()
    assert stats.in_use_bytes == sum(live.values()) * b \
        and stats.free_bytes + stats.in_use_bytes == pool.capacity_bytes


@pytest.mark.a2
@pytest.mark.parametrize("fit", ["first", "best"])
@pytest.mark.parametrize("blocks", [1, 2, 3, 4])
def test_a2_choices_on_a_fragmented_pool(fit, blocks):
    pool = TensorPool(10 * KB, fit)
    offsets = [pool.alloc(n * KB, f"t{i}") for i, n in enumerate([3, 1, 2, 1, 1, 1])]
    for i in (0, 2):
        pool.free(offsets[i])
    used = [False] * 3 + [True] + [False] * 2 + [True] * 3 + [False]  # holes of 3, 2 and 1 blocks
    assert_pool_matches(pool, used, {3 * KB: 1, 6 * KB: 1, 7 * KB: 1, 8 * KB: 1})
    want = expected_block(used, blocks, fit)
    if want is None:
        before = state(pool)
        with pytest.raises(PoolFullError):
            pool.alloc(blocks * KB, "big")
        assert state(pool) == before, "a failed alloc must change nothing"
    else:
        assert pool.alloc(blocks * KB - 100, "x") == want * KB, f"{fit} fit for {blocks} blocks"


@pytest.mark.a2
@pytest.mark.parametrize("fit", ["first", "best"])
def test_a2_ties_go_to_the_lowest_address(fit):
    pool = TensorPool(12 * KB, fit)
    offsets = [pool.alloc(n * KB, f"t{i}") for i, n in enumerate([2, 1, 3, 1, 2, 1, 2])]  # holes: 2, 3, 2, 2
    for i in (0, 2, 4, 6):
        pool.free(offsets[i])
    used = [False] * 2 + [True] + [False] * 3 + [True] + [False] * 2 + [True] + [False] * 2
    assert_pool_matches(pool, used, {2 * KB: 1, 6 * KB: 1, 9 * KB: 1})
    assert pool.alloc(2 * KB, "x") == 0, f"{fit} fit: three 2-block holes tie; the lowest address wins"
    # first fit: the 3-block hole; best fit: the lowest of the 2-block ties left
    want = 3 if fit == "first" else 7
    assert pool.alloc(KB, "y") == want * KB, f"{fit} fit: 1 block from holes of 3, 2 and 2 blocks"


OPS = st.lists(st.one_of(st.tuples(st.just("alloc"), st.integers(0, 4 * KB)),
                         st.tuples(st.just("free"), st.integers(0, 50))), max_size=40)


def run_against_a_block_bitmap(fit, nblocks, ops):
    """Apply ``ops`` (("alloc", bytes) or ("free", index of a live allocation)) to a pool of
    ``nblocks`` blocks and, after each, compare it with a block bitmap (assert_pool_matches)."""
    pool = TensorPool(nblocks * KB, fit)
    used, live = [False] * nblocks, {}
    for i, (kind, arg) in enumerate(ops):
        if kind == "alloc":
            need = max(1, math.ceil(arg / KB))
            want = expected_block(used, need, fit)
            if want is None:
                before = state(pool)
                with pytest.raises(PoolFullError):
                    pool.alloc(arg, f"t{i}", step=i)
                assert state(pool) == before, "a failed alloc must change nothing"
                continue
            assert pool.alloc(arg, f"t{i}", step=i) == want * KB, \
                f"op {i}: {fit} fit of {need} blocks in {free_runs(used)} (free runs: (first block, length))"
            used[want:want + need] = [True] * need
            live[want * KB] = need
        elif live:
            off = sorted(live)[arg % len(live)]
            pool.free(off)
            need = live.pop(off)
            used[off // KB:off // KB + need] = [False] * need
        assert_pool_matches(pool, used, live)


@pytest.mark.a2
@settings(max_examples=200, **GRADED)
@given(fit=st.sampled_from(["first", "best"]), nblocks=st.integers(1, 16), ops=OPS)
def test_a2_any_sequence_matches_a_block_bitmap(fit, nblocks, ops):
    run_against_a_block_bitmap(fit, nblocks, ops)


def fixed_ops(seed, n=300):
    """A fixed busy sequence: allocs of 1..4 blocks (some exact multiples of the block, some not)
    and frees, about as many of each, on a 16-block pool."""
    rng = np.random.default_rng(seed)
    sizes = [KB, 2 * KB, 3 * KB, 4 * KB, 100, KB + 1, 2 * KB - 1, 3 * KB + 7]
    return [("alloc", sizes[rng.integers(len(sizes))]) if rng.random() < 0.55
            else ("free", int(rng.integers(50))) for _ in range(n)]


@pytest.mark.a2
@pytest.mark.parametrize("fit", ["first", "best"])
def test_a2_a_fixed_busy_sequence_matches_a_block_bitmap(fit):
    """The same check on a fixed sequence, so that every grading run makes the same hundreds of
    choices (ties between equal holes, frees between free neighbours, full pools), whatever
    hypothesis draws."""
    run_against_a_block_bitmap(fit, 16, fixed_ops(7))


@pytest.mark.a2
@settings(max_examples=60, **GRADED)
@given(sizes=st.lists(st.integers(1, 3 * KB), min_size=1, max_size=12), data=st.data())
def test_a2_freeing_everything_in_any_order_coalesces_to_one_region(sizes, data):
    pool = TensorPool(40 * KB)
    offsets = [pool.alloc(n, f"t{i}") for i, n in enumerate(sizes)]
    for off in data.draw(st.permutations(offsets)):
        pool.free(off)
    assert pool.free_regions() == ((0, pool.capacity_bytes),)
    assert pool.stats().in_use_bytes == 0


@pytest.mark.a2
def test_a2_free_coalesces_with_both_neighbours_at_once():
    pool = TensorPool(6 * KB)
    a, b, c, d = (pool.alloc(KB, n) for n in "abcd")  # blocks 0..3 used, 4..5 free
    pool.free(a)
    pool.free(c)
    assert pool.free_regions() == ((0, KB), (2 * KB, KB), (4 * KB, 2 * KB))
    pool.free(b)  # its left and right neighbours are free: one region of three blocks
    assert pool.free_regions() == ((0, 3 * KB), (4 * KB, 2 * KB))
    pool.free(d)
    assert pool.free_regions() == ((0, 6 * KB),)
    with pytest.raises(ValueError):
        pool.free(d)  # a double free is refused
    assert pool.free_regions() == ((0, 6 * KB),)


@pytest.mark.a2
def test_a2_host_pool_uses_the_same_logic_at_256_bytes():
    pool = HostPool(4 * KB)
    x = pool.alloc(300, "x")  # two 256-byte slots
    y = pool.alloc(1, "y")
    assert (x, y) == (0, 512)
    pool.free(x)
    assert pool.alloc(200, "z") == 0, "first fit reuses the hole at the start"
    pool.free(0)
    pool.free(y)
    assert pool.free_regions() == ((0, 4 * KB),)


@pytest.mark.a2
@pytest.mark.parametrize("fit", ["first", "best"])
def test_a2_training_in_the_pool_is_bit_identical_to_one_allocation_per_tensor(fit):
    g = conv_chain()
    want = train(g, MemoryConfig(liveness=True, allocator="raw"))
    got = train(g, MemoryConfig(liveness=True, fit=fit))
    assert_same_training(got, want, f"the pool ({fit} fit)")
    model = got[2]
    assert model.executor.arena.nbytes == max(p.arena_bytes for p in model.programs.values())


# ================================================================ assignment 3: the tiled GEMM kernel
def canonical_gemm(a, b, c, ta, tb, alpha, beta):
    """The canonical order in float32: acc = 0; acc += a*b for k = 0..K-1 (each step rounded), then the
    epilogue."""
    a_, b_ = (a.T if ta else a), (b.T if tb else b)
    acc = np.zeros((a_.shape[0], b_.shape[1]), np.float32)
    for k in range(a_.shape[1]):
        acc += a_[:, k:k + 1] * b_[k:k + 1, :]
    out = np.float32(alpha) * acc
    return out + np.float32(beta) * c if beta != 0 else out


def run_gemm(version, a, b, c, block, **kw):
    from numba import cuda

    from kernels.gemm import gemm

    d_c = cuda.to_device(c)
    gemm(cuda.to_device(a), cuda.to_device(b), d_c, version=version, block=block, **kw)
    return d_c.copy_to_host()


def operands(rng, m, n, k, ta, tb):
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    return a, b


def assert_v2_correct(a, b, c, ta, tb, alpha, beta, block):
    from kernels.gemm import gemm_ref

    got = run_gemm("v2", a, b, c, block, trans_a=ta, trans_b=tb, alpha=alpha, beta=beta)
    ref = c.astype(np.float64)
    gemm_ref(a.astype(np.float64), b.astype(np.float64), ref, trans_a=ta, trans_b=tb, alpha=alpha, beta=beta)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4,
                               err_msg=f"v2 vs NumPy, block {block}, ta={ta} tb={tb}")
    v1 = run_gemm("v1", a, b, c, block, trans_a=ta, trans_b=tb, alpha=alpha, beta=beta)
    assert np.array_equal(got, v1), f"v2 is not bit-identical to v1 (block {block}, ta={ta} tb={tb})"
    assert np.array_equal(got, canonical_gemm(a, b, c, ta, tb, alpha, beta)), \
        "v2 does not follow the canonical order"


@pytest.mark.a3
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_a3_v2_matches_numpy_and_v1_at_odd_shapes(rng, ta, tb):
    # M, N, K a multiple of nothing: 2 or 3 blocks each way, all of them cut by the edge, and a last
    # K tile of 3 of tk = 4 (a 9 x 10 x 11 product costs the simulator half of the 13 x 11 x 19 it was)
    a, b = operands(rng, 9, 10, 11, ta, tb)
    c = rng.standard_normal((9, 10)).astype(np.float32)
    assert_v2_correct(a, b, c, ta, tb, 0.75, -1.5, (8, 4) if ta == tb else (4, 8))


@pytest.mark.a3
def test_a3_beta_zero_never_reads_c_and_k_zero(rng):
    a, b = operands(rng, 9, 6, 11, False, True)
    nan = np.full((9, 6), np.nan, np.float32)
    got = run_gemm("v2", a, b, nan, (4, 4), trans_b=True, alpha=2.0)
    assert np.array_equal(got, canonical_gemm(a, b, nan, False, True, 2.0, 0.0)), \
        "with beta == 0, C is not read"
    nan = np.full((5, 6), np.nan, np.float32)
    empty = run_gemm("v2", np.zeros((5, 0), np.float32), np.zeros((0, 6), np.float32), nan, (4, 4))
    assert np.array_equal(empty, np.zeros((5, 6), np.float32)), "K = 0: C = alpha * 0"


@pytest.mark.a3
def test_a3_v2_batched_and_reduced_follow_the_canonical_order(rng):
    """A batch (grid z; a shared A) gives each matrix its own canonical product; reduce sums the batch
    into one C in order (C = P_0 + beta*C, then C = P_z + 1*C), as im2col convolution needs."""
    from numba import cuda

    from kernels.gemm import gemm_batched

    a = rng.standard_normal((1, 6, 5)).astype(np.float32)
    b = rng.standard_normal((3, 5, 7)).astype(np.float32)
    d_c = cuda.to_device(np.full((3, 6, 7), np.nan, np.float32))
    gemm_batched(cuda.to_device(a), cuda.to_device(b), d_c, version="v2", block=(4, 4))
    for z in range(3):
        want = canonical_gemm(a[0], b[z], None, False, False, 1.0, 0.0)
        assert np.array_equal(d_c.copy_to_host()[z], want), \
            f"matrix {z} of the batch is not its canonical product"
    a3 = rng.standard_normal((3, 6, 5)).astype(np.float32)
    c0 = rng.standard_normal((1, 6, 7)).astype(np.float32)
    d_c = cuda.to_device(c0)
    gemm_batched(cuda.to_device(a3), cuda.to_device(b), d_c, version="v2", block=(4, 4),
                 beta=0.5, reduce=True)
    want = canonical_gemm(a3[0], b[0], c0[0], False, False, 1.0, 0.5)
    for z in (1, 2):
        want = canonical_gemm(a3[z], b[z], want, False, False, 1.0, 1.0)
    assert np.array_equal(d_c.copy_to_host()[0], want), "reduce=True does not sum the batch into C in order"


@pytest.mark.a3
@settings(max_examples=6, **GRADED)
@given(m=st.integers(1, 10), n=st.integers(1, 10), k=st.integers(1, 12), ta=st.booleans(), tb=st.booleans(),
       block=st.sampled_from([(4, 4), (8, 4), (4, 8), (2, 8)]), seed=st.integers(0, 2**16))
def test_a3_v2_bit_identical_to_v1_on_random_shapes(m, n, k, ta, tb, block, seed):
    rng = np.random.default_rng(seed)
    a, b = operands(rng, m, n, k, ta, tb)
    assert_v2_correct(a, b, rng.standard_normal((m, n)).astype(np.float32), ta, tb, 1.25, 0.5, block)


def counted(host):
    """A simulator device array that counts the element reads kernels make from it."""
    from numba import cuda

    d, reads = cuda.to_device(host), []

    class Counting(np.ndarray):
        def __getitem__(self, index):
            reads.append(1)
            return super().__getitem__(index)

    d._ary = d._ary.view(Counting)
    return d, reads


@pytest.mark.a3
@pytest.mark.parametrize("ta,tb,block", [(False, False, (4, 4)), (True, True, (8, 4))],
                         ids=["square-block", "transposed-oblong-block"])
def test_a3_v2_is_tiled_each_value_read_from_global_memory_once_per_block(rng, ta, tb, block):
    from numba import config

    from kernels.gemm import gemm

    if not config.ENABLE_CUDASIM:
        pytest.skip("counts global reads through the CUDA simulator's arrays (run without "
                    "NUMBA_ENABLE_CUDASIM=0)")
    m, n, k, (bx, by) = 12, 16, 10, block
    a, b = operands(rng, m, n, k, ta, tb)
    bounds = {"A": m * k * math.ceil(n / bx), "B": k * n * math.ceil(m / by)}
    counts = {}
    for version in ("v1", "v2"):
        (d_a, reads_a), (d_b, reads_b), (d_c, reads_c) = \
            counted(a), counted(b), counted(np.zeros((m, n), np.float32))
        gemm(d_a, d_b, d_c, version=version, block=(bx, by), trans_a=ta, trans_b=tb)  # beta == 0: C unread
        assert np.array_equal(d_c.copy_to_host(), canonical_gemm(a, b, None, ta, tb, 1.0, 0.0))
        counts[version] = {"A": len(reads_a), "B": len(reads_b), "C": len(reads_c)}
    assert counts["v1"]["A"] > bounds["A"], "sanity: the naive kernel reads A once per output"
    assert counts["v2"]["C"] == 0, \
        f"with beta == 0, C is written without being read (v2 read it {counts['v2']['C']}x)"
    for what, bound in bounds.items():
        assert counts["v2"][what] <= bound, (
            f"v2 read {what} {counts['v2'][what]} times from global memory; a {bx}x{by} tiled kernel reads "
            f"each element at most once per block that needs it: {bound} (v1 read it "
            f"{counts['v1'][what]} times)")


PTX_TEST = "test_a3_v2_compiles_for_a_real_gpu"
PTX_SCRIPT = ("from kernels import gemm\nfrom kernels._common import registered_kernels\n"
              "from numba.cuda import compile_ptx\n"
              "spec = next(s for s in registered_kernels() if s.name == 'kernels.gemm._gemm_v2')\n"
              "ptx, _ = compile_ptx(spec.py_func, spec.signature, cc=(9, 0))\n"
              # a stub compiles too: the PTX of a tiled kernel holds its shared tiles and its barriers
              "marks = (('shared-memory tiles (cuda.shared.array)', '.shared'),\n"
              "         ('barrier (cuda.syncthreads())', 'bar.sync'))\n"
              "missing = [what for what, mark in marks if mark not in ptx]\n"
              "print('ok' if not missing else 'compiles, but its PTX has no ' + ' and no '.join(missing))\n")


@pytest.fixture(scope="module", autouse=True)
def ptx_check(request):
    """The PTX compile of _gemm_v2 for sm_90 in a subprocess (NUMBA_ENABLE_CUDASIM=0 needs a fresh
    interpreter; about 1.5 s of CPU, most of it importing Numba's CUDA target), started with the
    module's first test if test_a3_v2_compiles_for_a_real_gpu is selected, so that it runs
    alongside the other graders where a second core is free. That test waits for it."""
    if not any(item.name == PTX_TEST for item in request.session.items):
        yield None
        return
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0",
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-c", PTX_SCRIPT], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    yield proc
    if proc.poll() is None:  # the session stopped before the test (-x)
        proc.kill()
        proc.communicate()


@pytest.mark.a3
def test_a3_v2_compiles_for_a_real_gpu(ptx_check):
    stdout, stderr = ptx_check.communicate(timeout=300)
    assert ptx_check.returncode == 0, \
        f"_gemm_v2 does not compile to PTX (the simulator checks no types):\n{stderr[-3000:]}"
    assert stdout.strip() == "ok", f"_gemm_v2 {stdout.strip()}: is it tiled?"


# ================================================================ assignment 4: offload and prefetch
def route_ops(g):
    from snlite.recompute import expand

    return expand(g, "off")[0]


def expected_transfers(ops, g):
    """docs/paper.md section 4's rule, recomputed directly from the ops (see offload.schedule's docstring)."""
    from snlite.offload import Transfer

    convs = [op for op in ops if op.phase == "forward" and g.layers[op.layer].kind == "conv2d"]
    out = []
    for this, nxt in zip(convs, convs[1:]):
        t = g.output_tensor(this.layer)
        r = next((op for op in ops[nxt.index:] if t in op.reads), None)
        if r is None or r.phase == "forward":
            continue
        backward = next(op.index for op in ops if op.phase == "backward" and op.layer == nxt.layer)
        out.append(Transfer(t, this.index, nxt.index, min(backward, r.index)))
    return out


def assert_schedule_properties(ops, g, transfers):
    convs = [op for op in ops if op.phase == "forward" and g.layers[op.layer].kind == "conv2d"]
    conv_outputs = [g.output_tensor(op.layer) for op in convs]
    moved = [tr.tensor for tr in transfers]
    assert set(moved) <= set(conv_outputs[:-1]), f"only CONV outputs move, never the last CONV's: {moved}"
    assert moved == [t for t in conv_outputs if t in moved], "transfers are listed in forward order"
    for tr in transfers:
        k = conv_outputs.index(tr.tensor)
        assert tr.offload_after == convs[k].index, f"{tr.tensor}: offload right after its CONV's forward"
        assert tr.release_before == convs[k + 1].index, \
            f"{tr.tensor}: release when the next CONV's forward starts"
        assert tr.prefetch_before is not None and tr.release_before < tr.prefetch_before
        readers = [op.index for op in ops[tr.release_before:] if tr.tensor in op.reads]
        assert readers and tr.prefetch_before <= readers[0], \
            f"{tr.tensor}: prefetched after its first read back"
        assert ops[readers[0]].phase != "forward"


@pytest.mark.a4
def test_a4_offload_schedule_on_a_conv_chain():
    from snlite.offload import schedule

    g = conv_chain(convs=4)
    ops = route_ops(g)
    transfers = schedule(ops, g)
    assert_schedule_properties(ops, g, transfers)
    assert [tr.tensor for tr in transfers] == ["conv1", "conv2", "conv3"], "every CONV output but the last"
    bwd = {op.layer: op.index for op in ops if op.phase == "backward"}
    for k, tr in enumerate(transfers, 1):
        assert tr.prefetch_before == bwd[f"conv{k + 1}"], \
            f"conv{k} comes back when backward reaches conv{k + 1}"
    assert transfers == expected_transfers(ops, g)


@pytest.mark.a4
@pytest.mark.parametrize("name", ["branchy", "lenet", "alexnet", "cifar_resnet20"])
def test_a4_offload_schedule_follows_the_rule_and_plans_stay_valid(name):
    from snlite.models import get_model
    from snlite.offload import schedule

    g = branchy_net() if name == "branchy" else get_model(name, batch=2)
    ops = route_ops(g)
    transfers = schedule(ops, g)
    assert_schedule_properties(ops, g, transfers)
    assert transfers == expected_transfers(ops, g)
    plan = Scheduler(g, MemoryConfig(liveness=True, offload=True)).plan()
    validate_plan(plan, persistent_of(g))
    if name == "branchy":  # conv1's output is still read by conv3's forward after conv2 starts: it stays
        assert "conv1" not in {tr.tensor for tr in transfers} and transfers


@pytest.mark.a4
@pytest.mark.parametrize("name", ["alexnet", "cifar_resnet20"])
def test_a4_offload_schedule_under_recomputation(name, monkeypatch):
    """With recomputation on, the first op that reads c_k after its release is often a recompute op
    (a layer of the next segment rebuilt from c_k in backward): c_k still moves, and is back before
    that op runs. A schedule that moved only what a backward op reads first passed every other grader
    and moved nothing at all here. (Each segment's strategy is given here, not chosen by assignment 5,
    which comes later.)"""
    from snlite import recompute
    from snlite.models import get_model
    from snlite.offload import schedule

    g = get_model(name, batch=2)
    for strategy in ("speed", "memory"):
        monkeypatch.setattr(recompute, "choose_strategies", lambda graph, _, persistent, keep=(), s=strategy:
                            {r: s for r in dict.fromkeys(recompute.segments(graph, keep).values())})
        ops = recompute.expand(g, strategy)[0]
        assert any(op.phase == "recompute" for op in ops)
        transfers = schedule(ops, g)
        assert_schedule_properties(ops, g, transfers)
        assert transfers and transfers == expected_transfers(ops, g), f"recompute={strategy}"
        plan = Scheduler(g, MemoryConfig(liveness=True, offload=True, recompute=strategy)).plan()
        validate_plan(plan, persistent_of(g))


@pytest.mark.a4
@pytest.mark.parametrize("net", [conv_chain, branchy_net], ids=["conv_chain", "branchy"])
def test_a4_training_under_offload_is_bit_identical(net):
    g = net()
    want = train(g, MemoryConfig())
    got = train(g, MemoryConfig(liveness=True, offload=True))
    assert_same_training(got, want, "offload")
    trace, moved = got[2].trace, {tr.tensor for tr in got[2].plan.transfers}
    assert moved and trace.d2h_bytes == trace.h2d_bytes == sum(g.tensors()[t].nbytes for t in moved)
    assert trace.peak_bytes <= simulate(g, MemoryConfig(liveness=True)).peak_bytes


# ================================================================ assignment 5: cost-aware recomputation
def held(step, persistent):
    """The tensors one step holds, each once (a buffer written in place is the one it overwrites)."""
    new = {n for n, _ in step.inplace}
    return {t for t in set(step.reads) | set(step.writes) if t not in new and t not in persistent}


def speed_centric_peaks(g, persistent, skip=0):
    """Each segment's speed-centric peak, by brute force: at every backward step from the first
    that reads a dropped tensor of the segment to the last use of any of its tensors, the
    segment's tensors that some step from there on still uses, plus the step's own tensors;
    every live set rebuilt by scanning the rest of the route. None: no backward step reads a
    dropped tensor of the segment. ``skip``: leave out the window's first ``skip`` steps (0 for
    the rule; the tests use 1 to check that their nets need the first step)."""
    from snlite.recompute import droppable, segments

    steps, tensors, drop = g.steps(), g.tensors(), droppable(g)
    fwd = {s.layer: s for s in steps if s.phase == "forward"}
    members = defaultdict(list)
    for layer, root in segments(g).items():
        members[root].append(layer)
    peaks = {}
    for root, ms in members.items():
        mine = {t for m in ms for t in (*fwd[m].reads, *fwd[m].writes) if t not in persistent}
        needing = [s.index for s in steps if s.phase == "backward"
                   and any(t in drop and t in mine for t in s.reads)]
        if not needing:
            peaks[root] = None
            continue
        end = max(s.index for s in steps if mine & (set(s.reads) | set(s.writes)))
        peaks[root] = max(sum(tensors[t].nbytes for t in held(s, persistent) | {
            t for t in mine if any(t in set(u.reads) | set(u.writes) for u in steps[s.index:])})
            for s in steps[needing[0] + skip:end + 1])
    return peaks


def expected_strategies(g, persistent):
    """The paper's rule, sizes counted once: speed iff the segment's speed-centric peak <= l_peak."""
    l_peak = max(sum(g.tensors()[t].nbytes for t in held(s, persistent)) for s in g.steps())
    return {root: "speed" if peak is None or peak <= l_peak else "memory"
            for root, peak in speed_centric_peaks(g, persistent).items()}


NETS5 = ["branchy", "lenet", "alexnet", "cifar_resnet20", "vgg16"]


def net5(name):
    from snlite.models import get_model

    return branchy_net(n=4) if name == "branchy" else get_model(name, batch=8)


@pytest.mark.a5
@pytest.mark.parametrize("name", NETS5)
def test_a5_cost_aware_follows_the_papers_rule(name):
    from snlite.recompute import choose_strategies, segments

    g = net5(name)
    persistent = persistent_of(g)
    roots = set(segments(g).values())
    for fixed in ("speed", "memory"):
        assert choose_strategies(g, fixed, persistent) == dict.fromkeys(roots, fixed)
    got = choose_strategies(g, "cost_aware", persistent)
    assert set(got) == roots, "one entry per segment, keyed by its checkpoint"
    want = expected_strategies(g, persistent)
    wrong = {r: (got[r], want[r]) for r in roots if got[r] != want[r]}
    assert not wrong, f"{name}: segments given the wrong strategy (got, paper's rule): {wrong}"
    if name == "alexnet":
        assert set(want.values()) == {"speed", "memory"}, "alexnet has segments of both kinds"


@pytest.mark.a5
def test_a5_a_kept_cheap_layer_starts_a_segment_of_its_own():
    """MemoryConfig.recompute_keep: a cheap layer in ``keep`` counts as a checkpoint, so relu1 of
    AlexNet, kept, heads the segment of norm1 and pool1, and conv1's segment is gone."""
    from snlite.recompute import choose_strategies, segments

    g = net5("alexnet")
    persistent = persistent_of(g)
    keep = ("relu1",)
    got = choose_strategies(g, "cost_aware", persistent, keep)
    assert set(got) == set(segments(g, keep).values()), "one entry per segment of the kept layers' graph"
    assert "relu1" in got and "conv1" not in got
    assert choose_strategies(g, "memory", persistent, keep) == dict.fromkeys(got, "memory")


@pytest.mark.a5
def test_a5_a_segment_that_needs_exactly_l_peak_is_speed_centric():
    from snlite.recompute import choose_strategies

    # sizes found so the tie happens (l_peak is conv1's backward, after the segment)
    g = Graph(input_shape=(1, 3, 2, 2), num_classes=2, name="boundary")
    y = g.relu(g.conv2d(g.input(), 2, 1, name="conv1"), name="relu1")
    g.softmax_loss(g.linear(g.flatten(g.conv2d(y, 2, 1, name="conv2"), name="flat"), 2, name="fc"))
    persistent = persistent_of(g)
    l_peak = max(sum(g.tensors()[t].nbytes for t in held(s, persistent)) for s in g.steps())
    assert speed_centric_peaks(g, persistent)["conv1"] == l_peak, \
        "the test net no longer ties; pick new sizes"
    assert choose_strategies(g, "cost_aware", persistent)["conv1"] == "speed", "the rule is <= l_peak"


@pytest.mark.a5
def test_a5_a_segment_tensor_past_its_last_use_is_not_counted():
    """conv1 -> pool1 -> relu1 -> conv2: relu1's output is last used by relu1's backward, before
    pool1's backward, the segment's busiest step (it is l_peak itself); counting relu1 there too
    would push the segment over l_peak and wrongly make it memory-centric."""
    from snlite.recompute import choose_strategies

    g = Graph(input_shape=(1, 1, 4, 4), num_classes=2, name="pool_first")
    y = g.relu(g.maxpool(g.conv2d(g.input(), 8, 1, name="conv1"), 2, name="pool1"), name="relu1")
    g.softmax_loss(g.linear(g.flatten(g.conv2d(y, 1, 1, name="conv2"), name="flat"), 2, name="fc"))
    persistent = persistent_of(g)
    l_peak = max(sum(g.tensors()[t].nbytes for t in held(s, persistent)) for s in g.steps())
    assert speed_centric_peaks(g, persistent)["conv1"] == l_peak, "the test net changed; pick new sizes"
    assert choose_strategies(g, "cost_aware", persistent)["conv1"] == "speed", \
        "a segment's tensor counts only until its last use"


@pytest.mark.a5
def test_a5_the_backward_step_that_first_needs_a_segment_counts():
    """conv1 -> relu1 -> conv2 -> relu2, like VGG's first block: conv2's backward is the first
    step that reads relu1's dropped output, and there speed-centric rebuilds conv1's whole segment
    while conv2's gradients are live too: more than l_peak, at that step only. A window that
    starts one step late sees a segment that fits (so does VGG-16's first, in the rule test)."""
    from snlite.recompute import choose_strategies

    g = Graph(input_shape=(1, 3, 4, 4), num_classes=2, name="first_block")
    y = g.relu(g.conv2d(g.input(), 4, 3, padding=1, name="conv1"), name="relu1")
    y = g.relu(g.conv2d(y, 4, 3, padding=1, name="conv2"), name="relu2")
    g.softmax_loss(g.linear(g.flatten(y, name="flat"), 2, name="fc"))
    persistent = persistent_of(g)
    l_peak = max(sum(g.tensors()[t].nbytes for t in held(s, persistent)) for s in g.steps())
    whole, late = speed_centric_peaks(g, persistent), speed_centric_peaks(g, persistent, skip=1)
    assert all(whole[r] > l_peak >= late[r] for r in ("conv1", "conv2")), \
        "the test net changed; pick new sizes"
    assert choose_strategies(g, "cost_aware", persistent) == {"conv1": "memory", "conv2": "memory"}, \
        "a segment's window starts at the backward step that first reads one of its dropped tensors"


@pytest.mark.a5
@pytest.mark.parametrize("name", NETS5)
def test_a5_cost_aware_peak_is_at_most_speed_centric(name):
    g = net5(name)
    traces = {s: simulate(g, MemoryConfig(liveness=True, recompute=s))
              for s in ("speed", "memory", "cost_aware")}
    assert traces["cost_aware"].peak_bytes <= traces["speed"].peak_bytes
    assert traces["memory"].recompute_count >= traces["cost_aware"].recompute_count >= \
        traces["speed"].recompute_count


@pytest.mark.a5
def test_a5_training_under_cost_aware_recomputation_is_bit_identical():
    g = branchy_net(n=4)
    want = train(g, MemoryConfig())
    for cfg in (MemoryConfig(liveness=True, recompute="cost_aware"),
                MemoryConfig(liveness=True, offload=True, recompute="cost_aware")):
        got = train(g, cfg)
        assert_same_training(got, want, cfg.describe())
        assert got[2].trace.recompute_count > 0


# ================================================================ assignment 6: dynamic convolution workspace
# docs/paper.md section 6: each conv step runs the fastest algorithm whose workspace fits in the largest
# free block at that moment. The reference ranks by brute force; made-up cost models make the fastest
# need the most workspace, make every time tie, and count what is estimated.
def conv_pair(n=4, c=16, hw=16):
    """Two 3x3 convs and a grouped one: on the default cost model, backward-data's fastest is im2col
    over the whole batch (576 KiB of workspace) and backward-filter's the direct algorithm over the
    whole batch (27 KiB); a grouped conv runs the direct algorithm only."""
    g = Graph(input_shape=(n, c, hw, hw), num_classes=3, name="conv_pair")
    c1 = g.conv2d(g.input(), c, 3, padding=1, name="conv1")
    c2 = g.conv2d(g.relu(c1, name="relu1"), c, 3, padding=1, name="conv2")
    c3 = g.conv2d(g.relu(c2, name="relu2"), c, 3, stride=2, padding=1, groups=4, name="conv3")
    g.softmax_loss(g.linear(g.flatten(g.relu(c3, name="relu3")), 3, name="fc"))
    return g


class MadeUpCosts:
    """A cost model of made-up times, ``ms(layer, op, algo, chunk)``, that records every estimate."""

    def __init__(self, ms):
        self.ms, self.asked = ms, []

    def estimate(self, layer, op, algo, chunk):
        self.asked.append((layer.name, op, algo, chunk))
        return self.ms(layer, op, algo, chunk)


def more_workspace_is_faster(layer, op, algo, chunk):
    return 1.0 / (1 + layer.workspace_bytes(op, algo, chunk))


def every_time_ties(layer, op, algo, chunk):
    return 1.0


def reference_ranking(layer, op, model):
    """Every option with its workspace and time, by (time, workspace, place among the options)."""
    opts = ws.options(layer.in_shapes[0][0], layer.groups, op)
    rows = sorted((model.estimate(layer, op, a, c), layer.workspace_bytes(op, a, c), i, a, c)
                  for i, (a, c) in enumerate(opts))
    return [ws.Choice(a, c, w, t) for t, w, _, a, c in rows]


def reference_fit(ranking, largest_free):
    return next(c for c in ranking if c.workspace_bytes <= largest_free)


CONV_LAYERS = ("conv1", "conv3")


@pytest.mark.a6
@pytest.mark.parametrize("op", ws.CONV_OPS)
def test_a6_candidates_rank_every_option_once_fastest_first(op):
    g = conv_pair()
    for name in CONV_LAYERS:
        layer = g.layers[name]
        for ms in (None, more_workspace_is_faster):
            model = ws.CostModel() if ms is None else MadeUpCosts(ms)
            want = reference_ranking(layer, op, model)
            if ms is not None:
                model.asked.clear()
            got = ws.candidates(layer, op, model)
            assert got == want, f"{name} {op}: the ranking should be {want}, got {got}"
            if ms is not None:
                opts = ws.options(layer.in_shapes[0][0], layer.groups, op)
                assert sorted(model.asked) == sorted((name, op, a, c) for a, c in opts), \
                    f"{name} {op}: each option's time is asked once, and only the options': {model.asked}"


@pytest.mark.a6
@pytest.mark.parametrize("op", ws.CONV_OPS)
def test_a6_ties_in_time_go_to_less_workspace_then_keep_the_order_of_the_options(op):
    layer = conv_pair().layers["conv1"]
    got = ws.candidates(layer, op, MadeUpCosts(every_time_ties))
    want = reference_ranking(layer, op, MadeUpCosts(every_time_ties))
    assert [c.workspace_bytes for c in got] == sorted(c.workspace_bytes for c in got), \
        f"{op}: every time ties, so the least workspace comes first: {got}"
    assert got == want, f"{op}: ties on both time and workspace keep the order of options: {got}"
    flat = copy.copy(layer)  # the same conv, every option needing the same workspace: all tie on both
    flat.workspace_bytes = lambda op, algo, chunk: 1024
    got = ws.candidates(flat, op, MadeUpCosts(every_time_ties))
    assert [(c.algo, c.chunk) for c in got] == ws.options(4, 1, op), \
        f"{op}: where time and workspace tie, the ranking keeps the order of options: {got}"


@pytest.mark.a6
def test_a6_none_runs_direct_without_workspace_whatever_the_others_cost():
    g = conv_pair()
    for name in CONV_LAYERS:
        for op in ws.CONV_OPS:
            for free in (None, 0, 1 << 30):
                model = MadeUpCosts(more_workspace_is_faster)
                c = ws.choose(g.layers[name], op, "none", free, model)
                assert (c.algo, c.chunk, c.workspace_bytes) == ("direct", 1, 0), f"{name} {op}: {c}"
                assert model.asked == [(name, op, "direct", 1)], \
                    f"mode none ranks nothing: only direct's time is asked, not {model.asked}"


@pytest.mark.a6
@pytest.mark.parametrize("op", ws.CONV_OPS)
def test_a6_fastest_and_no_limit_take_the_first_of_the_ranking(op):
    layer = conv_pair().layers["conv1"]
    model = MadeUpCosts(more_workspace_is_faster)
    first = reference_ranking(layer, op, model)[0]
    assert first.workspace_bytes > 0, "the made-up model makes the fastest need workspace"
    assert ws.choose(layer, op, "fastest", 0, model) == first, "fastest ignores the free block"
    assert ws.choose(layer, op, "dynamic", None, model) == first, "no limit: the fastest"


@pytest.mark.a6
@pytest.mark.parametrize("op", ws.CONV_OPS)
def test_a6_dynamic_takes_the_fastest_that_fits_an_exact_fit_included(op):
    layer = conv_pair().layers["conv1"]
    for model in (MadeUpCosts(more_workspace_is_faster), ws.CostModel()):
        ranking = reference_ranking(layer, op, model)
        sizes = sorted({c.workspace_bytes for c in ranking})
        assert len(sizes) >= 3
        for free in sorted({0, *sizes, *(s - 1 for s in sizes if s), *(s + 1 for s in sizes)}):
            got = ws.choose(layer, op, "dynamic", free, model)
            want = reference_fit(ranking, free)
            assert got == want, f"{op}, largest free block {free:,d} bytes: want {want}, got {got}"


@pytest.mark.a6
def test_a6_a_ranking_given_is_used_as_it_is():
    layer = conv_pair().layers["conv1"]
    ranking = reference_ranking(layer, "backward_data", MadeUpCosts(more_workspace_is_faster))
    backwards = ranking[::-1]  # slowest first: a ranking of the caller's own
    model = MadeUpCosts(more_workspace_is_faster)
    assert ws.choose(layer, "backward_data", "fastest", None, model, ranked=backwards) == backwards[0]
    assert ws.choose(layer, "backward_data", "dynamic", 10**9, model, ranked=backwards) == backwards[0]
    assert model.asked == [], f"with a ranking given nothing is estimated again: {model.asked}"


@pytest.mark.a6
def test_a6_an_unknown_mode_is_refused_by_name():
    layer = conv_pair().layers["conv1"]
    with pytest.raises(ValueError, match="dynamic"):
        ws.choose(layer, "forward", "fast", None)


@pytest.mark.a6
def test_a6_dynamic_workspace_takes_what_fits_now_and_trains_bit_identically():
    """With room, every conv step runs its fastest algorithm; in a budget that only direct
    convolutions are sure to fit, some steps still find room for their fastest, others do not,
    the plan holds, and training is bit-identical to the baseline."""
    g = conv_pair()
    model = ws.CostModel()
    best = {(name, op): reference_ranking(g.layers[name], op, model)[0]
            for name in ("conv1", "conv2", "conv3") for op in ws.CONV_OPS}
    fastest = {key: (c.algo, c.chunk) for key, c in best.items()}
    roomy = simulate(g, MemoryConfig(liveness=True, workspace="dynamic"))
    assert {(c.layer, c.op): (c.algo, c.chunk) for c in roomy.conv_choices} == fastest
    budget = simulate(g, MemoryConfig(liveness=True)).arena_bytes  # every conv direct, no workspace
    tight = MemoryConfig(liveness=True, workspace="dynamic", budget_bytes=budget)
    picks = [(c.algo, c.chunk) == fastest[c.layer, c.op] for c in simulate(g, tight).conv_choices]
    assert any(picks) and not all(picks), \
        f"in {budget:,d} bytes some steps have room for their fastest algorithm, some do not: {picks}"
    assert_same_training(train(g, tight), train(g, MemoryConfig()), tight.describe())
