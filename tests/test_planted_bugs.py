"""Every grader rejects planted wrong solutions, deterministically (docs/INSTRUCTORS.md).

Each planted bug is a plausible wrong answer to one assignment: no coalescing, an off-by-one in
the block rounding, freeing one step early, the wrong tie-break, an untiled kernel, a prefetch one
segment late, ``<`` for ``<=``... For each, the graders of that assignment run in this process
(pytester) with the bug patched in, and with every hypothesis test deselected: the rejection must
come from fixed cases, at least two (one case alone is one edit away from letting the bug
through), so that every grading run rejects the bug, whatever seed hypothesis draws. A control
run without any bug must pass the same deselected graders.

This file holds near-solutions, so it is left out of the student copy (``INSTRUCTOR_ONLY``).
"""
import bisect
import dataclasses
import importlib
import os
import sys
from pathlib import Path

import hypothesis.strategies  # noqa: F401  (imported here so each inner run does not import it again: 1 s each)
import pytest
from numba import cuda, float32

from kernels.gemm import TILE_MAX, _batch_range, _mat, _op_at, _store
from snlite import liveness, offload, recompute
from snlite import workspace as ws
from snlite.pool import TensorPool

pytest_plugins = ("pytester",)

GRADERS = str(Path(__file__).resolve().parent / "test_assignments.py")


# ---------------------------------------------------------------- assignment 1: liveness analysis
def frees_one_step_early(steps, persistent=frozenset()):
    first, last = ORIGINAL[liveness, "first_and_last_use"](steps, persistent)
    return first, {t: max(first[t], i - 1) for t, i in last.items()}


def counts_weights_as_live(steps, persistent=frozenset()):
    return ORIGINAL[liveness, "first_and_last_use"](steps, frozenset())


def rescans_the_route_per_step(steps, persistent=frozenset()):
    """The paper's O(N^2) construction: right answers, but every step rescans the whole route."""
    out = []
    for i in range(len(steps)):
        uses = {}
        for j, s in enumerate(steps):
            for t in (*s.reads, *s.writes):
                if t not in persistent:
                    uses.setdefault(t, []).append(j)
        order = list(uses)
        out.append(liveness.StepLiveness(
            i, tuple(t for t in order if uses[t][0] < i <= uses[t][-1]),
            tuple(t for t in order if uses[t][0] <= i < uses[t][-1]),
            tuple(t for t in order if uses[t][-1] == i)))
    return out


# ---------------------------------------------------------------- assignment 2: the pool allocator
def free_without_coalescing(self, offset):
    size = self._release(offset)
    bisect.insort(self._free, (offset, size))


def free_merging_the_right_neighbour_only(self, offset):
    start, end = offset, offset + self._release(offset)
    i = bisect.bisect_left(self._free, (offset,))
    if i < len(self._free) and self._free[i][0] == end:
        end += self._free.pop(i)[1]
    self._free.insert(i, (start, end - start))


def alloc_rounding_down(self, nbytes, name, step=None):
    return ORIGINAL[TensorPool, "alloc"](self, max(1, nbytes // self.block_bytes * self.block_bytes),
                                         name, step)


def alloc_one_block_too_many_at_exact_multiples(self, nbytes, name, step=None):
    exact = nbytes % self.block_bytes == 0
    return ORIGINAL[TensorPool, "alloc"](self, nbytes + 1 if exact else nbytes, name, step)


def best_fit_ties_to_the_highest_address(self, need):
    if self.fit == "first":
        return ORIGINAL[TensorPool, "_find"](self, need)
    fits = [(size, -off, i) for i, (off, size) in enumerate(self._free) if size >= need]
    return min(fits)[2] if fits else None


def first_fit_takes_the_last_region(self, need):
    if self.fit != "first":
        return ORIGINAL[TensorPool, "_find"](self, need)
    return next((i for i in reversed(range(len(self._free))) if self._free[i][1] >= need), None)


# ---------------------------------------------------------------- assignment 3: the tiled GEMM kernel
# Each wrong kernel is the solution with one thing wrong. They are module-level functions, because
# the simulator runs a kernel by swapping ``cuda`` in its module's globals (a closure's would not be).
def sums_k_backwards(a, b, c, trans_a, trans_b, alpha, beta, use_beta, reduce):
    sa = cuda.shared.array((TILE_MAX, TILE_MAX), float32)
    sb = cuda.shared.array((TILE_MAX, TILE_MAX), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    tk = min(cuda.blockDim.x, cuda.blockDim.y)
    row = cuda.blockIdx.y * cuda.blockDim.y + ty
    col = cuda.blockIdx.x * cuda.blockDim.x + tx
    _, m_, n_ = c.shape
    k_ = a.shape[1] if trans_a else a.shape[2]
    z0, z1 = _batch_range(a, b, reduce)
    for z in range(z0, z1):
        za, zb = _mat(a, z), _mat(b, z)
        acc = float32(0.0)
        for k0 in range((k_ - 1) // tk * tk, -1, -tk):  # the tiles, and k within each, last first
            if tx < tk:
                sa[ty, tx] = _op_at(a, za, row, k0 + tx, trans_a, m_, k_)
            if ty < tk:
                sb[ty, tx] = _op_at(b, zb, k0 + ty, col, trans_b, k_, n_)
            cuda.syncthreads()
            for kk in range(min(tk, k_ - k0) - 1, -1, -1):
                acc += sa[ty, kk] * sb[kk, tx]
            cuda.syncthreads()
        if row < m_ and col < n_:
            _store(c, z, z == z0, reduce, row, col, acc, alpha, beta, use_beta)


def reads_c_even_when_beta_is_zero(a, b, c, trans_a, trans_b, alpha, beta, use_beta, reduce):
    sa = cuda.shared.array((TILE_MAX, TILE_MAX), float32)
    sb = cuda.shared.array((TILE_MAX, TILE_MAX), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
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
                acc += sa[ty, kk] * sb[kk, tx]
            cuda.syncthreads()
        if row < m_ and col < n_:  # C = alpha * AB + beta * C, whatever beta
            zc = 0 if reduce else z
            c[zc, row, col] = alpha * acc + (float32(1.0) if z != z0 else beta) * c[zc, row, col]


def gemm_kernels():
    """The wrong v2 kernels, registered under v2's name so that the launcher runs them (the naive
    one is v1's code under that name)."""
    from kernels._common import Kernel, KernelSpec
    from kernels.gemm import _gemm_v1

    def as_v2(fn, dispatcher=None):
        return Kernel(KernelSpec("kernels.gemm._gemm_v2", fn, _gemm_v1.spec.signature),
                      dispatcher or cuda.jit(fn))

    return {"untiled (the naive kernel)": as_v2(_gemm_v1.spec.py_func, _gemm_v1.dispatcher),
            "sums k backwards": as_v2(sums_k_backwards),
            "reads C even when beta is 0": as_v2(reads_c_even_when_beta_is_zero)}


# ---------------------------------------------------------------- assignment 4: offload and prefetch
def releases_one_op_early(ops, graph):
    return [dataclasses.replace(t, release_before=t.release_before - 1)
            for t in ORIGINAL[offload, "schedule"](ops, graph)]


def prefetches_one_segment_late(ops, graph):
    """The copy back starts when backward reaches the tensor's own CONV, after the step before reads it."""
    own = {graph.output_tensor(op.layer): op.index for op in ops if op.phase == "backward"}
    return [dataclasses.replace(t, prefetch_before=own[t.tensor])
            for t in ORIGINAL[offload, "schedule"](ops, graph)]


def never_prefetches(ops, graph):
    return [dataclasses.replace(t, prefetch_before=None) for t in ORIGINAL[offload, "schedule"](ops, graph)]


def keeps_the_first_conv_output(ops, graph):
    return ORIGINAL[offload, "schedule"](ops, graph)[1:]


def moves_only_what_backward_reads_first(ops, graph):
    """Skips an output whose first reader after the release is not a backward op: under recomputation
    that is often a recompute op, and then nothing moves."""
    def first_reader(t):
        return next(op for op in ops[t.release_before:] if t.tensor in op.reads)
    return [t for t in ORIGINAL[offload, "schedule"](ops, graph) if first_reader(t).phase == "backward"]


# ---------------------------------------------------------------- assignment 5: cost-aware recomputation
def cost_aware_rule(compare, with_backward=True):
    def choose(graph, strategy, persistent, keep=()):
        if strategy != "cost_aware":
            return ORIGINAL[recompute, "choose_strategies"](graph, strategy, persistent, keep)
        steps, tensors = graph.steps(), graph.tensors()
        sizes = recompute.step_bytes(steps, tensors, persistent)
        fwd = {s.layer: sizes[s.index] for s in steps if s.phase == "forward"}
        bwd = {s.layer: sizes[s.index] for s in steps if s.phase == "backward"}
        members = {}
        for layer, root in recompute.segments(graph, keep).items():
            members.setdefault(root, []).append(layer)
        return {r: "speed" if compare(sum(fwd[m] for m in ms)
                                      + (max(bwd[m] for m in ms) if with_backward else 0), max(sizes))
                else "memory" for r, ms in members.items()}

    return choose


def speed_centric_everywhere(graph, strategy, persistent, keep=()):
    return ORIGINAL[recompute, "choose_strategies"](graph, "speed" if strategy == "cost_aware" else strategy,
                                                    persistent, keep)


def window_skipping_the_first_backward_step(graph, strategy, persistent, keep=()):
    """The solution, but each segment's window starts one step late: the backward step that first
    reads a dropped tensor, where speed-centric rebuilds the segment whole, is never counted."""
    if strategy != "cost_aware":
        return ORIGINAL[recompute, "choose_strategies"](graph, strategy, persistent, keep)
    steps, tensors = graph.steps(), graph.tensors()
    sizes = recompute.step_bytes(steps, tensors, persistent)
    _, last = liveness.first_and_last_use(steps, persistent)
    drop = recompute.droppable(graph, keep)
    first_read = {}
    for s in steps:
        for t in s.reads if s.phase == "backward" else ():
            if t in drop:
                first_read.setdefault(t, s.index)
    fwd = {s.layer: s for s in steps if s.phase == "forward"}
    owned = {}
    for layer, r in recompute.segments(graph, keep).items():
        owned.setdefault(r, set()).update(t for t in (*fwd[layer].reads, *fwd[layer].writes)
                                          if t not in persistent)
    chosen = {}
    for r, mine in owned.items():
        starts = [first_read[t] for t in mine if t in first_read]
        if not starts:
            chosen[r] = "speed"
            continue
        start, end = min(starts), max(last[t] for t in mine)
        held = sum(tensors[t].nbytes for t in mine if last[t] >= start)
        dies = {}
        for t in mine:
            if last[t] >= start:
                dies[last[t]] = dies.get(last[t], 0) + tensors[t].nbytes
        held -= dies.get(start, 0)
        peak = 0
        for i in range(start + 1, end + 1):  # the bug: start + 1
            s = steps[i]
            own = sum(tensors[t].nbytes for t in liveness.step_tensors(s.reads, s.writes, s.inplace)
                      if t in mine)
            peak = max(peak, held + sizes[i] - own)
            held -= dies.get(i, 0)
        chosen[r] = "speed" if peak <= max(sizes) else "memory"
    return chosen


# ---------------------------------------------------------------- assignment 6: dynamic convolution workspace
def dynamic(pick):
    """``workspace.choose`` with mode "dynamic" under a limit answered by ``pick(ranking, largest free
    block)``; every other case as the solution answers it."""
    def choose(layer, op, mode, largest_free_bytes, model=ws.CostModel(), ranked=None):
        if mode != "dynamic" or largest_free_bytes is None:
            return ORIGINAL[ws, "choose"](layer, op, mode, largest_free_bytes, model, ranked)
        return pick(ws.candidates(layer, op, model) if ranked is None else ranked, largest_free_bytes)

    return choose


def refuses_an_exact_fit(ranked, free):
    direct = next(c for c in ranked if (c.algo, c.chunk) == ws.DIRECT)
    return next((c for c in ranked if c.workspace_bytes < free), direct)


def ignores_the_free_block(ranked, free):
    return ranked[0]


def least_workspace_that_fits(ranked, free):
    return min((c for c in ranked if c.workspace_bytes <= free), key=lambda c: c.workspace_bytes)


def ties_to_more_workspace(layer, op, model=ws.CostModel()):
    ranked = ORIGINAL[ws, "candidates"](layer, op, model)
    return sorted(ranked, key=lambda c: (c.est_ms, -c.workspace_bytes))


def ties_by_name(layer, op, model=ws.CostModel()):
    ranked = ORIGINAL[ws, "candidates"](layer, op, model)
    return sorted(ranked, key=lambda c: (c.est_ms, c.workspace_bytes, c.algo, c.chunk))


ORIGINAL = {(liveness, "first_and_last_use"): liveness.first_and_last_use,
            (liveness, "analyze"): liveness.analyze, (TensorPool, "free"): TensorPool.free,
            (TensorPool, "alloc"): TensorPool.alloc, (TensorPool, "_find"): TensorPool._find,
            (offload, "schedule"): offload.schedule,
            (recompute, "choose_strategies"): recompute.choose_strategies,
            (ws, "choose"): ws.choose, (ws, "candidates"): ws.candidates}

# (assignment, the wrong solution): (object, attribute, replacement)
PLANTED = {
    (1, "frees each tensor one step early"): (liveness, "first_and_last_use", frees_one_step_early),
    (1, "counts weights as live"): (liveness, "first_and_last_use", counts_weights_as_live),
    (1, "rescans the route for every step (O(N^2))"): (liveness, "analyze", rescans_the_route_per_step),
    (2, "no coalescing"): (TensorPool, "free", free_without_coalescing),
    (2, "coalesces with the right neighbour only"): (TensorPool, "free",
                                                     free_merging_the_right_neighbour_only),
    (2, "off-by-one alignment: rounds down to whole blocks"): (TensorPool, "alloc", alloc_rounding_down),
    (2, "off-by-one alignment: an extra block at exact multiples"):
        (TensorPool, "alloc", alloc_one_block_too_many_at_exact_multiples),
    (2, "best fit breaks ties toward the highest address"): (TensorPool, "_find",
                                                             best_fit_ties_to_the_highest_address),
    (2, "first fit takes the last region that fits"): (TensorPool, "_find", first_fit_takes_the_last_region),
    (3, "untiled (the naive kernel)"): ("kernels.gemm", "_gemm_v2", "untiled (the naive kernel)"),
    (3, "sums k backwards"): ("kernels.gemm", "_gemm_v2", "sums k backwards"),
    (3, "reads C even when beta is 0"): ("kernels.gemm", "_gemm_v2", "reads C even when beta is 0"),
    (4, "releases the device copy one op early"): (offload, "schedule", releases_one_op_early),
    (4, "prefetches one segment late"): (offload, "schedule", prefetches_one_segment_late),
    (4, "never prefetches"): (offload, "schedule", never_prefetches),
    (4, "keeps the first CONV output on the device"): (offload, "schedule", keeps_the_first_conv_output),
    (4, "moves only what a backward op reads first (nothing under recomputation)"):
        (offload, "schedule", moves_only_what_backward_reads_first),
    (5, "< instead of <= against l_peak"): (recompute, "choose_strategies",
                                            cost_aware_rule(lambda a, b: a < b)),
    (5, "forgets the segment's backward step"):
        (recompute, "choose_strategies", cost_aware_rule(lambda a, b: a <= b, with_backward=False)),
    (5, "speed-centric everywhere"): (recompute, "choose_strategies", speed_centric_everywhere),
    (5, "the window skips the segment's first backward step"):
        (recompute, "choose_strategies", window_skipping_the_first_backward_step),
    (6, "an exact fit does not fit (< instead of <=)"): (ws, "choose", dynamic(refuses_an_exact_fit)),
    (6, "dynamic ignores the free block"): (ws, "choose", dynamic(ignores_the_free_block)),
    (6, "dynamic takes the least workspace, not the fastest that fits"):
        (ws, "choose", dynamic(least_workspace_that_fits)),
    (6, "ties in time go to more workspace"): (ws, "candidates", ties_to_more_workspace),
    (6, "ties in time and workspace go by name, not the options' order"): (ws, "candidates", ties_by_name),
}


class Plant:
    """A pytest plugin: patches one wrong solution in for the session; deselects the hypothesis tests
    (the rejection must not depend on a random draw) and the PTX compile (a subprocess, which no
    planted bug reaches)."""

    def __init__(self, target=None):
        self.target, self.undo = target, pytest.MonkeyPatch()

    def pytest_sessionstart(self, session):
        ws._SHARED.clear()  # rankings an earlier run memoized, with its own bug or none
        if self.target is not None:
            self.undo.setattr(*self.target)

    def pytest_sessionfinish(self, session):
        self.undo.undo()
        ws._SHARED.clear()

    def pytest_collection_modifyitems(self, config, items):
        # (test_a3_v2_compiles_for_a_real_gpu runs a subprocess: no planted bug reaches it)
        randomized = [i for i in items if getattr(getattr(i, "obj", None), "is_hypothesis_test", False)
                      or i.name == "test_a3_v2_compiles_for_a_real_gpu"]
        if randomized:
            items[:] = [i for i in items if i not in randomized]
            config.hook.pytest_deselected(items=randomized)


def target_of(obj, attr, replacement):
    if isinstance(obj, str):  # a kernel: patch kernels.gemm's module global, which the launcher looks up
        module = importlib.import_module(obj)
        return module, attr, gemm_kernels()[replacement]
    return obj, attr, replacement


def grade(pytester, markers, target=None, maxfail=None):
    """The graders selected by ``markers`` (``a2``, ``a1 or a2``), run in this process with ``target``
    planted, stopping after ``maxfail`` failures (None: never).

    The graders module is imported afresh inside the run, after the bug is planted, as a grading
    run imports it: its ``from snlite.liveness import analyze`` then binds the planted function.
    (When the whole suite runs, the outer session has imported it already, with the solutions.)"""
    args = [GRADERS, "-m", markers, "-p", "no:cacheprovider", "-q"]
    args += [f"--maxfail={maxfail}"] if maxfail else []
    graders = {n: m for n, m in sys.modules.items() if getattr(m, "__file__", None) == GRADERS}
    for name in graders:
        del sys.modules[name]
    try:
        return pytester.inline_run(*args, plugins=[Plant(target)])
    finally:
        sys.modules.update(graders)


@pytest.fixture(scope="module", autouse=True)
def trained_once():
    """One training step before any inner run, which imports what training imports on first use
    (Numba's CPU target, the host kernels). pytester drops the modules an inner run imported when
    it ends, and Numba's type registry does not take a second import of them (``KeyError:
    duplicate registration``): without this, a training grader would fail in every inner run
    after the first that trained, whatever was planted."""
    import numpy as np

    from snlite.graph import Graph
    from snlite.train import Model

    g = Graph(input_shape=(1, 1, 4, 4), num_classes=2, name="warm_up")
    g.softmax_loss(g.linear(g.flatten(g.relu(g.conv2d(g.input(), 2, 3, padding=1))), 2))
    Model(g, device="host").step(np.zeros((1, 1, 4, 4), np.float32), np.zeros(1, np.int32), lr=0.1)


def real_gpu():
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "0"


def test_at_least_two_planted_bugs_per_assignment():
    from snlite.assignments import scan

    numbers = sorted({r.number for r in scan()[0]})
    per = {k: sum(1 for n, _ in PLANTED if n == k) for k in numbers}
    assert all(v >= 2 for v in per.values()), f"planted bugs per assignment: {per}"


def test_without_a_planted_bug_the_fixed_graders_pass(pytester):
    numbers = sorted({n for n, _ in PLANTED})
    rec = grade(pytester, " or ".join(f"a{k}" for k in numbers))
    passed, skipped, failed = rec.listoutcomes()
    assert not failed and not rec.getfailedcollections(), \
        f"the graders fail on the real solution: {[r.nodeid for r in failed]}"
    ran = {k for k in numbers for r in passed if f"test_a{k}_" in r.nodeid}
    assert ran == set(numbers), f"no fixed grader passed for assignments {set(numbers) - ran}"


CATCHES = 2  # fixed cases that must reject each planted bug


@pytest.mark.parametrize("number,bug", sorted(PLANTED), ids=[f"a{n}-{b}" for n, b in sorted(PLANTED)])
def test_the_graders_reject_each_planted_bug(pytester, number, bug):
    """At least CATCHES fixed cases fail with the bug planted (a bug that one case alone catches is
    one edit of that case away from passing), and they fail on the bug, not on a planted function
    that does not fit the interface (a TypeError or an AttributeError)."""
    if number == 3 and real_gpu():
        pytest.skip("the planted kernels are checked on the simulator (the read-counting grader needs it)")
    rec = grade(pytester, f"a{number}", target_of(*PLANTED[number, bug]), maxfail=CATCHES)
    assert not rec.getfailedcollections(), f"the graders did not even load with {bug!r} planted"
    passed, skipped, failed = rec.listoutcomes()
    names = [r.nodeid.split("::")[-1] for r in failed]
    assert len(failed) >= CATCHES, \
        f"assignment {number}: {len(failed)} fixed case(s) reject the wrong solution {bug!r}: {names}"
    for r in failed:
        message = r.longrepr.reprcrash.message
        assert r.when == "call", f"{r.nodeid} errored in {r.when}, not on the planted bug: {message}"
        assert not message.startswith(("TypeError", "AttributeError")), \
            f"{r.nodeid} failed on the planted function's interface, not on its bug: {message}"


def test_instructors_md_states_the_real_counts(pytester):
    """docs/INSTRUCTORS.md states each assignment's number of graders ("**a2** (18 tests)"), their
    total ("61 tests in one pytest session"), the number of planted bugs ("(20 in all)") and the
    fixed cases each must fail ("at least two fixed cases"): the real ones."""
    import re

    from snlite.assignments import scan

    text = (Path(GRADERS).parent.parent / "docs" / "INSTRUCTORS.md").read_text()
    items, _ = pytester.inline_genitems(GRADERS, "-p", "no:cacheprovider")
    numbers = sorted({r.number for r in scan()[0]})
    real = {k: sum(1 for item in items if item.get_closest_marker(f"a{k}")) for k in numbers}
    stated = {int(k): int(n) for k, n in re.findall(r"\*\*a(\d+)\*\* \((\d+) tests\)", text)}
    assert stated == real, f"graders per assignment: INSTRUCTORS.md says {stated}, there are {real}"
    total = re.findall(r"(\d+) tests in one pytest session", text)
    assert total and all(int(n) == sum(real.values()) for n in total), \
        f"INSTRUCTORS.md says {total} tests in all, there are {sum(real.values())}"
    assert re.findall(r"\((\d+) in all\)", text) == [str(len(PLANTED))], \
        f"INSTRUCTORS.md's number of planted bugs is not {len(PLANTED)}"
    words = {"one": 1, "two": 2, "three": 3, "four": 4}
    catches = [words.get(w) for w in re.findall(r"at least (\w+) fixed\s+cases", text)]
    assert catches and set(catches) == {CATCHES}, \
        f"INSTRUCTORS.md should say that each bug fails at least {CATCHES} fixed cases, not {catches}"


def test_planting_restores_the_solution():
    assert all(getattr(obj, attr) is fn for (obj, attr), fn in ORIGINAL.items()), \
        "a planted bug outlived its run"
