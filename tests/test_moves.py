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
from snlite.pipeline import place
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
