"""What offload and the LRU cache move, read off the programs: never a copy to the host of a value the
host already holds (an eviction whose host copy is still current drops the block and copies nothing:
a clean eviction), and nothing the body takes left held at its end (a pinned slot included, when an
in-place write takes over a tensor that has one). On the flag matrix under tight budgets and on
ResNet-50 at the smallest budgets its caches fit, where the clean evictions and those hand-overs
happen (each test counts them, so that it cannot pass by never meeting them)."""
import pytest

from program_digests import small_cases
from snlite.config import MemoryConfig
from snlite.errors import BudgetError
from snlite.models import get_model
from snlite import pipeline
from snlite.pipeline import place
from snlite.placement import EVICTABLE_KINDS
from snlite.program import Alloc, Copy, Free, HandOver, Launch
from snlite.search import min_budget


def moves(program) -> dict:
    """Walk ``program``'s body: ``leaked``, what it allocated and still holds at its end; ``again``,
    the copies to the host of a value the tensor's pinned slot already holds; ``clean``, device blocks
    dropped with the host copy current and nothing copied since the tensor came back; ``handed``,
    in-place hand-overs of a tensor that holds a pinned slot."""
    live = {(i.space, i.tensor) for i in program.setup if type(i) is Alloc}
    setup = set(live)
    current, back = set(), set()  # slot holds the tensor's value; came back from the host, unchanged
    out = {"leaked": [], "again": [], "clean": 0, "handed": 0}
    for ins in program.body:
        kind = type(ins)
        if kind is Alloc:
            live.add((ins.space, ins.tensor))
        elif kind is Free:
            live.discard((ins.space, ins.tensor))
            if ins.space == "slab":
                current.discard(ins.tensor)
            elif ins.tensor in back:
                back.discard(ins.tensor)
                out["clean"] += ins.tensor in current
        elif kind is HandOver:
            out["handed"] += ("slab", ins.old) in live
            space = "raw" if ("raw", ins.old) in live else "arena"
            live.discard((space, ins.old))
            live.add((space, ins.new))
            current.discard(ins.old)
            back.discard(ins.old)
        elif kind is Copy and ins.why not in ("input", "result"):  # the batch's and results' own slots
            if ins.dst == "slab":
                if ins.tensor in current:
                    out["again"].append(ins)
                current.add(ins.tensor)
                back.discard(ins.tensor)
            else:
                back.add(ins.tensor)
        elif kind is Launch:
            current.difference_update(ins.writes)  # (an in-place write's new tensor has no slot yet)
            back.difference_update(ins.writes)
    out["leaked"] = sorted(x for x in live if x not in setup)
    return out


def test_under_tight_budgets_nothing_is_copied_out_twice_and_nothing_is_left_held():
    """The flag matrix's programs (offload, the cache, or both) under 85% of their arena, then
    superneurons() under half and 70% of its arena, copies at the paper's times and retimed for GPUs."""
    clean = placed = 0
    for key, build in small_cases():
        if "/0.85/paper" not in key and "superneurons" not in key:  # (85%: most fit; each program the suite
            continue  # places is race-checked too, conftest.py)
        try:
            program = build()
        except BudgetError:
            continue
        m = moves(program)
        assert not m["again"], f"{key}: copied to the host what it already holds: {m['again'][:2]}"
        assert not m["leaked"], f"{key}: the body ends still holding {m['leaked'][:3]}"
        clean += m["clean"]
        placed += 1
    assert placed > 60 and clean > 300, "the tight budgets must make the cache evict clean copies"


@pytest.mark.parametrize("config", [MemoryConfig(liveness=True, cache=True, recompute="memory"),
                                    MemoryConfig(liveness=True, offload=True, cache=True),
                                    MemoryConfig.superneurons()], ids=lambda c: c.describe())
def test_a_deep_net_at_its_smallest_budget_leaves_nothing_held(config):
    g = get_model("resnet50", batch=2)
    budget = min_budget(g, config).budget_bytes
    m = moves(place(g, config.replace(budget_bytes=budget)))
    assert not m["again"] and not m["leaked"], (m["again"][:2], m["leaked"][:3])
    assert m["clean"] > 0
    if config.recompute == "memory":
        assert m["handed"] > 0, "a gradient back from the host must be taken over in place here"


@pytest.mark.parametrize("fraction", [0.5, 0.6])
def test_a_read_ahead_starts_only_where_its_block_fits_and_never_evicts(fraction, monkeypatch):
    """The cache's second placement fetches ahead of need only where the block fits as things stand
    (snlite.placement.Placer._read_ahead): a read-ahead that evicted to make room would move more bytes
    for an earlier start, which the time-aware placement then refuses whole. ResNet-50 at batch 8 under
    superneurons(), half and 60% of its arena, its first placement's evictions and fetches retimed for
    the H200: read-aheads start, some wait for room, and none evicts."""
    from snlite import overlap, placement, pipeline, timing

    seen = {"fetched": 0, "waited": 0, "evicted": 0, "evicted_ahead": 0}
    read_ahead, evict = placement.Placer._read_ahead, placement.Placer._evict

    def counted_read_ahead(self, op):
        self.ahead_now, before = True, self.stats["cache_misses"]
        try:
            read_ahead(self, op)
        except BudgetError:
            seen["evicted_ahead"] += 1  # nothing left to evict for it: it made room by force
            raise
        finally:
            self.ahead_now = False
        seen["fetched"] += self.stats["cache_misses"] - before
        seen["waited"] += len(self._ready)

    def counted_evict(self, t, step):
        seen["evicted_ahead" if getattr(self, "ahead_now", False) else "evicted"] += 1
        evict(self, t, step)

    g = get_model("resnet50", batch=8)
    config = MemoryConfig.superneurons()
    config = config.replace(budget_bytes=int(place(g, config).arena_bytes * fraction) // 1024 * 1024)
    job, first = pipeline._first(g, config, "train", None, None, True)
    start = timing.op_starts(first.program, g, config.schedule, len(job.plan.ops))
    nbytes = {n: t.nbytes for n, t in job.specs.items()}
    link = timing.profile(config.schedule)
    hints = overlap.cache_hints(first.evictions, first.fetches, start, nbytes, link)[0]  # the read-aheads
    monkeypatch.setattr(placement.Placer, "_read_ahead", counted_read_ahead)
    monkeypatch.setattr(placement.Placer, "_evict", counted_evict)
    try:
        placement.walk(g, job.config, job.plan, job.specs, job.costs, job.mode, hints)
    except BudgetError:
        pass  # an earlier fetch can leave a later op short: the pipeline then keeps the first placement
    assert seen["evicted_ahead"] == 0, f"a read-ahead evicted to make room: {seen}"
    assert seen["fetched"] > 10 and seen["waited"] > 0 and seen["evicted"] > 10, \
        f"the read-aheads must start, and at least one must wait for room: {seen}"


@pytest.mark.parametrize("name, batch", [("cifar_resnet20", 4), ("mini_inception", 2)])
def test_every_read_the_cache_manages_is_one_hit_or_one_miss(name, batch, monkeypatch):
    """Algorithm 2's statistics: each read of an activation, gradient or input an op makes is a hit
    (on the device, a write-behind copy still running included) or a miss (fetched back), never both
    and never neither; in every placement a search makes (the cache's time-aware second ones, whose
    write-behind copies are still running at some reads, included) at the smallest budget
    superneurons() fits and above it, where misses happen."""
    g = get_model(name, batch=batch)
    config = MemoryConfig.superneurons()
    least = min_budget(g, config).budget_bytes
    kinds = {n: t.kind for n, t in g.tensors().items()}
    walk, placed = pipeline._walk, []
    monkeypatch.setattr(pipeline, "_walk", lambda *a, **k: placed.append(walk(*a, **k)) or placed[-1])
    for budget in (least, least * 11 // 10):
        place(g, config.replace(budget_bytes=budget))
    assert len(placed) > 2
    for program in (p.program for p in placed):
        reads = sum(kinds.get(t.split("#", 1)[0]) in EVICTABLE_KINDS
                    for i in program.body if type(i) is Launch and i.op >= 0 for t in i.reads)
        hits, misses = program.stats["cache_hits"], program.stats["cache_misses"]
        assert misses > 0 and hits + misses == reads, (hits, misses, reads)
        assert misses == sum(type(i) is Copy and i.why == "fetch" for i in program.body)
