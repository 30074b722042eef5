"""fit="offline": every arena offset chosen after the walk from the program's known lifetimes. The same
instructions as first fit, only the offsets and the arena differ; blocks live together never share a
byte; the arena is never above first fit's and reaches the lower bound on small nets; the race checker
catches a lifetime cut short; training is bit-identical; under a budget fitting is monotone."""
import dataclasses
import json
import random

import pytest

from nets import mixed_net
from snlite import offline, pipeline
from snlite.budget import fits, smallest_budget
from snlite.checker import check
from snlite.config import MemoryConfig
from snlite.errors import BudgetError
from snlite.models import get_model
from snlite.pipeline import place
from snlite.program import Alloc, Copy, Free, Wait
from snlite.validate import ProgramError

CONFIGS = [MemoryConfig(liveness=True), MemoryConfig(liveness=True, offload=True, recompute="memory"),
           MemoryConfig.superneurons(), MemoryConfig.superneurons(optimizer_state="host", schedule="paper")]


def without_offsets(program) -> list:
    """The body with every arena offset zeroed: what must not change between first fit and offline."""
    out = []
    for ins in program.body:
        if type(ins) in (Alloc, Free) and ins.space == "arena":
            ins = dataclasses.replace(ins, offset=0)
        elif type(ins) is Copy:
            ins = dataclasses.replace(ins, src_offset=0 if ins.src == "arena" else ins.src_offset,
                                      dst_offset=0 if ins.dst == "arena" else ins.dst_offset)
        out.append(ins)
    return out


def overlapping(blocks, offsets) -> list:
    """Pairs of blocks live at one instruction whose bytes meet (there must be none)."""
    return [(a, b) for a in range(len(blocks)) for b in range(a)
            if blocks[a].start <= blocks[b].end and blocks[b].start <= blocks[a].end
            and offsets[a] < offsets[b] + blocks[b].nbytes and offsets[b] < offsets[a] + blocks[a].nbytes]


def test_assign_never_overlaps_live_blocks_and_reaches_the_lower_bound_on_an_interval_graph():
    rng = random.Random(3)
    for _ in range(40):
        blocks = []
        for _ in range(rng.randint(1, 40)):
            start = rng.randint(0, 60)
            size = 1024 * rng.choice((1, 2, 3, 8, 16))
            blocks.append(offline.Block(start, start + rng.randint(0, 20), size))
        offsets = offline.assign(blocks)
        assert not overlapping(blocks, offsets)
        assert all(o % 1024 == 0 and o >= 0 for o in offsets)
        assert offline.arena_of(blocks, offsets) >= offline.lower_bound(blocks)
    same = [offline.Block(0, 5, 2048), offline.Block(6, 9, 4096), offline.Block(3, 7, 1024)]
    assert offline.lower_bound(same) == 5120 and offline.arena_of(same, offline.assign(same)) == 5120


def reference_greedy(blocks, order) -> list:
    """The greedy as the docstring states it, in plain Python over every pair of blocks: each block in
    ``order`` goes into the smallest gap that holds it (the lowest on a tie) among the placed blocks
    whose lifetimes meet its own, else above them all."""
    offsets = [None] * len(blocks)
    for k in order:
        b = blocks[k]
        met = sorted((offsets[j], offsets[j] + c.nbytes) for j, c in enumerate(blocks)
                     if offsets[j] is not None and c.start <= b.end and b.start <= c.end)
        floor, best = 0, None
        for low, top in met:
            if low - floor >= b.nbytes and (best is None or low - floor < best[0]):
                best = (low - floor, floor)
            floor = max(floor, top)
        offsets[k] = best[1] if best else floor
    return offsets


def test_each_order_wins_somewhere_and_assign_keeps_the_smallest_arena():
    """The orders are there because each one wins on a real program: area on AlexNet's recomputation
    (a long-lived block the largest-first orders leave on top), breadth on DenseNet-121."""
    g = get_model("alexnet", batch=200)
    blocks, _, _ = offline.lifetimes(place(g, MemoryConfig(liveness=True, offload=True, recompute="memory")))
    blocks.sort(key=lambda b: b.start)
    arenas = {name: offline.arena_of(blocks, offline._greedy(blocks, order.tolist()))
              for name, order in offline.orders(*offline._arrays(blocks)).items()}
    assert arenas["area"] == offline.lower_bound(blocks) < min(arenas["size"], arenas["breadth"])
    assert offline.arena_of(blocks, offline.assign(blocks)) == arenas["area"]


def test_the_fast_greedy_places_exactly_as_the_plain_statement_of_it():
    """The segment tree must find every placed block a block meets, the list by offset must stay in
    order, and the gap rule must be the one stated: every order, both ways, random lifetimes, some
    blocks alive almost throughout."""
    rng = random.Random(11)
    for _ in range(60):
        blocks = []
        for _ in range(rng.randint(1, 120)):
            start = rng.randint(0, 200)
            blocks.append(offline.Block(start, start + rng.choice((0, 3, 20, 150)),
                                        1024 * rng.choice((1, 2, 3, 5, 8, 16))))
        blocks.sort(key=lambda b: b.start)
        for order in offline.orders(*offline._arrays(blocks)).values():
            order = order.tolist()
            assert sorted(order) == list(range(len(blocks)))
            for scan in (True, False):  # going through every placed block, or finding those it meets
                assert offline._greedy(blocks, order, scan) == reference_greedy(blocks, order), scan


def test_a_wrong_assignment_is_caught_by_the_tests_own_overlap_check():
    blocks = [offline.Block(0, 5, 1024), offline.Block(5, 9, 1024)]  # both live at instruction 5
    assert overlapping(blocks, [0, 0]) and not overlapping(blocks, offline.assign(blocks))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.describe())
@pytest.mark.parametrize("net", ["mixed", "lenet", "alexnet"])
def test_offline_is_first_fits_program_with_other_offsets_and_an_arena_no_larger(net, config):
    g = mixed_net() if net == "mixed" else get_model(net, batch=8)
    first, off = place(g, config), place(g, config.replace(fit="offline"))
    assert without_offsets(off) == without_offsets(first) and off.setup == first.setup
    assert off.slab_bytes == first.slab_bytes and off.stats == first.stats
    arena, lower = offline.bounds(off)
    assert offline.bounds(first)[1] == lower <= arena <= first.arena_bytes
    assert arena <= 1.02 * lower, f"offline arena {arena:,d} is more than 2% above the lower bound {lower:,d}"
    blocks, _, base = offline.lifetimes(off)
    starts = [i for i, ins in enumerate(off.body) if type(ins) is Alloc and ins.space == "arena"]
    assert not overlapping(blocks, [off.body[i].offset for i in starts])
    assert all(off.body[i].offset >= base for i in starts)  # above the weights, gradients and momentum
    check(off, graph=g)


def test_the_checker_fails_a_lifetime_cut_short_or_two_live_blocks_at_one_offset():
    """Break the lifetimes: end an offloaded block at its copy out instead of at its free (after the
    compute stream's wait for that copy's event), or put two live blocks at one offset."""
    g = get_model("alexnet", batch=8)
    program = place(g, MemoryConfig(liveness=True, offload=True))
    blocks, which, base = offline.lifetimes(program)
    cut = list(blocks)
    for k, b in enumerate(blocks):
        out = [i for i in range(b.start, b.end) if which[i] == k and type(program.body[i]) is Copy
               and program.body[i].to_host]
        if out:
            assert any(type(program.body[i]) is Wait and program.body[i].why == "release"
                       for i in range(out[-1], b.end))  # the event the lifetime must outlast
            cut[k] = offline.Block(b.start, out[-1], b.nbytes)
    assert cut != blocks
    with pytest.raises(ProgramError, match="overlaps"):
        check(offline.with_offsets(program, which, [base + o for o in offline.assign(cut)]), graph=g)
    offsets = offline.assign(blocks)
    a, b = next((a, b) for a in range(len(blocks)) for b in range(a)
                if blocks[b].start < blocks[a].start <= blocks[b].end)
    offsets[a] = offsets[b]
    with pytest.raises(ProgramError, match="overlaps"):
        check(offline.with_offsets(program, which, [base + o for o in offsets]), graph=g)


def test_a_free_moved_before_its_release_wait_races_once_offline_reuses_the_block():
    """The lifetimes come from where the program frees each block: a free moved ahead of the wait for
    the copy still reading it lets offline hand the bytes to the next tensor, and the race checker
    names the copy and the kernel that overwrites what it reads."""
    from snlite.checker import RaceError

    g = get_model("lenet", batch=8)
    program = place(g, MemoryConfig(liveness=True, offload=True))
    body = list(program.body)
    k = next(i for i, ins in enumerate(body) if type(ins) is Wait and ins.why == "release")
    free = next(i for i in range(k, len(body)) if type(body[i]) is Free)
    body.insert(k, body.pop(free))  # the free now comes before the wait for the copy
    early = dataclasses.replace(program, body=tuple(body))
    blocks, which, base = offline.lifetimes(early)
    offsets = offline.assign(blocks)
    freed = which[k]
    reuser = next(j for j, b in enumerate(blocks) if blocks[freed].end < b.start and b.nbytes
                  <= blocks[freed].nbytes and not overlapping(blocks, [*offsets[:j], offsets[freed],
                                                                      *offsets[j + 1:]]))
    offsets[reuser] = offsets[freed]  # the next tenant of the bytes, as a tight placement would choose
    with pytest.raises(RaceError, match="copy"):
        check(offline.with_offsets(early, which, [base + o for o in offsets]), graph=g)


@pytest.mark.parametrize("net", ["mixed", "lenet", "alexnet"])
def test_fitting_is_monotone_in_the_budget_under_offline(net):
    """Over a sweep of budgets around the smallest one that fits, a budget that fits never stops
    fitting when raised (the dynamic workspace asks what fits now; the cache evicts by it), so
    bisection is safe."""
    g = mixed_net() if net == "mixed" else get_model(net, batch=8)
    for config in (MemoryConfig(liveness=True, offload=True, workspace="dynamic", fit="offline"),
                   MemoryConfig.superneurons(cache=False, fit="offline"),
                   MemoryConfig.superneurons(fit="offline")):
        least = smallest_budget(g, config)
        step = max(1024, least // 200 // 1024 * 1024)
        sweep = [fits(g, config.replace(budget_bytes=least + d * step)) for d in range(-8, 25)]
        assert sweep == [False] * 8 + [True] * 25, f"{net}: fitting is not monotone in the budget"


def test_under_a_budget_offline_fits_where_first_fit_fragments():
    g = get_model("alexnet", batch=8)
    config = MemoryConfig(liveness=True, offload=True)
    arena, lower = offline.bounds(place(g, config.replace(fit="offline")))
    assert place(g, config).arena_bytes > arena  # first fit's arena is larger
    tight = config.replace(budget_bytes=arena)
    with pytest.raises(BudgetError):
        place(g, tight)
    assert place(g, tight.replace(fit="offline")).arena_bytes == arena
    assert arena == lower  # no fragmentation left: a block less and the live bytes no longer fit
    with pytest.raises(BudgetError, match="norm2.grad needs"):
        place(g, tight.replace(fit="offline", budget_bytes=lower - 1024))


def test_where_the_caches_budget_is_cut_too_far_offline_bisects_back_to_a_fit():
    """ResNet-50 at batch 8 under superneurons(), 1% over first fit's smallest budget: first fit
    fragments there, the offline walk's offsets overshoot the budget, and the cache's budget, cut by
    twice as much each time, goes from overshooting (211 MB) to too small for the walk (187 MB).
    Between those two offline finds one that fits, where first fit at a budget 1% smaller fits too."""
    g = get_model("resnet50", batch=8)
    config = MemoryConfig.superneurons()
    least = smallest_budget(g, config)
    budget = least + least // 100
    assert fits(g, config.replace(budget_bytes=least)) and not fits(g, config.replace(budget_bytes=budget)), \
        "first fit no longer fragments 1% over its smallest budget here: pick another case"
    program = place(g, config.replace(budget_bytes=budget, fit="offline"))
    arena, lower = offline.bounds(program)
    assert lower <= arena <= budget
    check(program, graph=g)


def test_where_every_offline_walk_overshoots_first_fit_under_a_smaller_budget_is_the_last_resort(monkeypatch):
    """Inception-v4 at batch 4 under superneurons(), 2% over first fit's smallest budget (259,934,208
    bytes, as smallest_budget finds it): first fit fragments there, and the offline walk's offsets
    overshoot at every budget the cache is planned against that its bytes fit (277 MB for 265 MB).
    First fit planned against one of those smaller budgets fits, within it, so offline fits there."""
    g = get_model("inception_v4", batch=4)
    config = MemoryConfig.superneurons(budget_bytes=265_132_032)
    assert fits(g, config.replace(budget_bytes=259_934_208)) and not fits(g, config), \
        "first fit no longer fragments 2% over its smallest budget here: pick another case"
    program = place(g, config.replace(fit="offline"))
    arena, lower = offline.bounds(program)
    assert lower <= arena <= config.budget_bytes
    check(program, graph=g)
    monkeypatch.setattr(pipeline, "_first_fit_below", lambda walk, config, budgets: None)
    with pytest.raises(BudgetError, match="the bytes live at once fit .* but placing them needs an arena"):
        place(g, config.replace(fit="offline"))


def test_plan_takes_fit_offline_and_prints_the_lower_bound_next_to_the_arena(capsys):
    from snlite import bench, cli

    assert cli.main(["plan", "lenet", "--batch", "8", "--liveness", "--offload", "--fit", "offline"]) == 0
    out = capsys.readouterr().out
    program = place(get_model("lenet", batch=8), MemoryConfig(liveness=True, offload=True, fit="offline"))
    arena, lower = offline.bounds(program)
    assert "allocator pool (offline fit)" in out and arena == lower
    assert "lower bound" in out.split("memory needed: device arena", 1)[1].splitlines()[0]
    table = bench.fit_table(nets=("lenet",)).splitlines()
    assert len(table) == 3 and table[2].startswith("| lenet (64) |") and "offline" in table[0]
    first, best, off = (float(c.split("(")[1].rstrip(") ")) for c in table[2].split("|")[3:6])
    assert off == 1.0 and first >= off and best >= off


@pytest.mark.parametrize("net", ["mixed", "lenet", "alexnet"])
def test_without_the_cache_or_the_dynamic_workspace_the_smallest_budget_is_the_offline_arena(net):
    """Nothing then asks what fits now: the walk decides the same at every budget, so offline fits
    exactly the budgets at or above its arena (no budget), and bisection finds that arena."""
    g = mixed_net() if net == "mixed" else get_model(net, batch=8)
    config = MemoryConfig(liveness=True, offload=True, recompute="speed", workspace="fastest", fit="offline")
    arena = place(g, config).arena_bytes
    assert smallest_budget(g, config) == arena
    assert smallest_budget(g, config.replace(fit="first")) >= arena


def test_a_budget_between_the_lower_bound_and_the_offline_arena_says_so():
    g = get_model("alexnet", batch=8)
    config = MemoryConfig(liveness=True, workspace="fastest", fit="offline")
    arena, lower = offline.bounds(place(g, config))
    assert lower < arena
    with pytest.raises(BudgetError, match=f"the bytes live at once fit \\({lower:,d} at most\\), but placing "
                                          f"them needs an arena of {arena:,d} bytes"):
        place(g, config.replace(budget_bytes=lower))
    with pytest.raises(BudgetError, match="largest free block"):  # the live bytes themselves do not fit
        place(g, config.replace(budget_bytes=lower - 1024))


def test_the_live_pool_limits_the_bytes_in_use_not_where_they_are():
    from snlite.pool import LivePool, PoolFullError, TensorPool

    KB = 1024
    first, live = TensorPool(8 * KB), LivePool(8 * KB, 64 * KB, spare_bytes=KB)
    for pool in (first, live):
        held = [pool.alloc(KB, f"t{i}") for i in range(8)]
        for off in held[::2]:
            pool.free(off)  # four free blocks, none next to another
    with pytest.raises(PoolFullError):
        first.alloc(2 * KB, "x")  # first fit: no two free blocks touch
    assert live.alloc(2 * KB, "x") % KB == 0 and live.in_use_bytes == 6 * KB  # offline: 4 KB are free
    assert live.largest_free_block() == 8 * KB - 6 * KB - KB  # the room the workspace is offered
    with pytest.raises(PoolFullError, match="y"):
        live.alloc(3 * KB, "y")
    with pytest.raises(PoolFullError, match="c"):
        LivePool(4 * KB, 64 * KB).alloc_all([("a", 2 * KB), ("b", KB), ("c", 2 * KB)])


def test_compare_shows_each_strategys_arena_under_each_fit_and_the_smallest_budgets(capsys):
    from snlite import cli, measure, search

    g = get_model("lenet", batch=8)
    argv = ["compare", "lenet", "--batch", "8", "--fit", "first", "offline"]
    assert cli.main(argv + ["offline", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fit"] == "first" and list(out["by_fit"]) == ["first", "offline"]  # each fit once, in order
    for fit, got in out["by_fit"].items():
        rows = measure.compare(g, fit=fit)
        assert [r["label"] for r in got["rows"]] == [r.label for r in rows]
        assert [(r["arena_bytes"], r["lower_bound_bytes"]) for r in got["rows"]] == [offline.bounds(r.program)
                                                                                      for r in rows]
        least = search.min_budget(g, MemoryConfig.superneurons(fit=fit))
        assert got["min_budget"]["budget_bytes"] == least.budget_bytes
    first, off = (out["by_fit"][f] for f in ("first", "offline"))
    assert all(o["arena_bytes"] <= f["arena_bytes"] for o, f in zip(off["rows"], first["rows"]))
    assert off["min_budget"]["budget_bytes"] <= first["min_budget"]["budget_bytes"]
    assert out["min_budget"] == first["min_budget"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    head = next(line for line in text.splitlines() if line.startswith("strategy") and "fit=" in line)
    assert head.split() == ["strategy", "fit=first", "fit=offline"]
    assert "arena by fit:" in text and "superneurons(fit='offline') runs in " in text
    assert cli.main(["compare", "alexnet", "--batch", "16", "--budget", "850MiB", "--fit", "first",
                     "offline"]) == 0
    arenas = capsys.readouterr().out.split("arena by fit:", 1)[1].split("\n\n", 1)[0].splitlines()
    rows = {line.split("  ")[0]: line for line in arenas[2:]}
    assert rows["baseline"].endswith(" no") and not rows["liveness"].endswith(" no")  # 898.5 MiB: too much
    with pytest.raises(SystemExit, match="2"):
        cli.main(["compare", "lenet", "--fit", "worst"])
    assert "argument --fit: invalid choice: 'worst'" in capsys.readouterr().err


def test_the_searches_take_fit_offline(capsys):
    from snlite import cli, search

    argv = ["maxbatch", "lenet", "--budget", "16MiB", "--max-batch", "256", "--quiet", "--json", "-"]
    found = {}
    for fit in ("first", "offline"):
        assert cli.main(argv + ["--fit", fit]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["fit"] == fit
        found[fit] = {r["strategy"]: r["batch"] for r in out["rows"]}
    config = MemoryConfig.superneurons(fit="offline", budget_bytes=16 << 20)
    build = lambda b: get_model("lenet", batch=b)  # noqa: E731
    assert found["offline"]["superneurons"] == search.max_batch(build, config, hi=256).value
    assert found["offline"]["superneurons"] >= found["first"]["superneurons"]
    assert cli.main(argv[:-2] + ["--fit", "offline"]) == 0
    heading = capsys.readouterr().out.splitlines()[0]
    assert heading.endswith("on the device), every arena offset by fit=offline")
