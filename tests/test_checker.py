"""The race checker: CUDA's ordering rules on hand-made programs; the fast checker agrees with the
definition; every wait whose removal creates a race is caught, and the adversarial device turns the
release and prefetch races into wrong numbers."""
import numpy as np
import pytest

from nets import mixed_net, train_steps
from snlite.adversary import COPY_TIES, AdversarialDevice
from snlite.checker import ProgramError, RaceError, check, find_races, races_by_definition
from snlite.config import MemoryConfig
from snlite.pipeline import place, simulate
from snlite.program import (Alloc, Copy, Free, HostRead, HostWait, HostWrite, Launch, Program, Record, Wait)
from snlite.together import check_together, together
from snlite.train import Model


# ------------------------------------------------------------------------------ the rules, by hand
def tiny(*body, setup=()):
    """A program over two 1 KiB device tensors x, y and a 1 KiB pinned slot."""
    tensors = {"x": ((256,), "float32", "activation"), "y": ((256,), "float32", "activation")}
    return Program("tiny", "by hand", "train", "pool", tensors, tuple(setup), tuple(body), 4096, 1024)


ALLOC_X, ALLOC_Y, SLOT = \
    Alloc("x", "arena", 0, 1024), Alloc("y", "arena", 1024, 1024), Alloc("x", "slab", 0, 1024)
WRITE_X = Launch(0, 0, "a", "forward", "compute", (), ("x",))
READ_X = Launch(1, 1, "b", "forward", "compute", ("x",), ("y",))
D2H = Copy("x", "offload", "arena", 0, "slab", 0, 1024, "copy_out")
H2D = Copy("x", "prefetch", "slab", 0, "arena", 0, 1024, "copy_in")


def test_a_copy_of_a_kernels_output_needs_an_event():
    racy = tiny(ALLOC_X, SLOT, WRITE_X, D2H)
    (race,) = find_races(racy, iterations=1)
    assert race.kind == "read after write" and race.first.at == (0, 2) and race.second.at == (0, 3)
    assert race.first.stream == "compute" and race.second.stream == "copy_out"
    fixed = tiny(ALLOC_X, SLOT, WRITE_X, Record("e", "compute"), Wait("e", "copy_out"), D2H)
    assert find_races(fixed, iterations=1) == []


def test_one_stream_is_ordered_and_waits_are_transitive():
    same_stream = tiny(ALLOC_X, ALLOC_Y, WRITE_X, READ_X)
    assert find_races(same_stream, iterations=1) == []
    # compute -> copy_out -> copy_in: copy_in is ordered after compute through copy_out's event
    chain = tiny(ALLOC_X, SLOT, WRITE_X, Record("a", "compute"), Wait("a", "copy_out"),
                 Record("b", "copy_out"), Wait("b", "copy_in"), H2D)
    assert [r.kind for r in find_races(chain, iterations=1)] == []
    broken = tiny(ALLOC_X, SLOT, WRITE_X, Record("a", "compute"), Record("b", "copy_out"),
                  Wait("b", "copy_in"), H2D)
    assert [r.kind for r in find_races(broken, iterations=1)] == ["write after write"]
    assert find_races(broken, iterations=1)[0].on_data


def test_a_free_is_a_write_so_releasing_a_block_under_a_copy_is_a_race():
    body = [ALLOC_X, SLOT, WRITE_X, Record("e", "compute"), Wait("e", "copy_out"), D2H,
            Record("d", "copy_out")]
    racy = tiny(*body, Free("x", "arena", 0, 1024), ALLOC_Y)
    (race,) = find_races(racy, iterations=1)
    assert race.kind == "freed while another stream may still read it" and race.first.tensor == "x"
    assert race.second.at == (0, 7) and not race.on_data
    text = race.explain(racy)
    assert "copy x device -> host" in text and "free x" in text
    assert "record an event on copy_out after the first and make compute wait for it before the " \
           "second" in text
    assert find_races(tiny(*body, Wait("d", "compute"), Free("x", "arena", 0, 1024)), iterations=1) == []


def test_the_host_orders_what_it_enqueues_after_it_but_not_what_came_before():
    staged = tiny(ALLOC_X, SLOT, HostWrite("x", 0, 1024), H2D)
    assert find_races(staged, iterations=1) == []  # the copy was enqueued after the host wrote the slot
    unsynced = tiny(ALLOC_X, SLOT, WRITE_X, Record("e", "compute"), Wait("e", "copy_out"), D2H,
                    HostRead("x", 0, 1024))
    assert [r.kind for r in find_races(unsynced, iterations=1)] == ["read after write"]
    synced = tiny(ALLOC_X, SLOT, WRITE_X, Record("e", "compute"), Wait("e", "copy_out"), D2H,
                  Record("d", "copy_out"), HostWait("d"), HostRead("x", 0, 1024))
    assert find_races(synced, iterations=1) == []


def test_two_iterations_catch_work_left_running_at_the_end():
    """The copy stream frees x after its copy, but the iteration's end waits for compute only: the
    next iteration's kernel may overwrite x's block before that free (and the copy) have run."""
    body = (ALLOC_X, SLOT, WRITE_X, Record("e", "compute"), Wait("e", "copy_out"), D2H,
            Free("x", "arena", 0, 1024, "copy_out"), Free("x", "slab", 0, 1024, "copy_out"),
            Record("end", "compute"), HostWait("end"))
    assert find_races(tiny(*body), iterations=1) == []
    races = find_races(tiny(*body), iterations=2)
    assert races and {r.second.at[0] for r in races} == {1}, "the race is with the second iteration"
    with pytest.raises(RaceError):  # what check() and snlite check run: two iterations by default
        check(tiny(*body))


def test_malformed_programs_are_program_errors():
    with pytest.raises(ProgramError, match="overlaps x"):
        find_races(tiny(ALLOC_X, Alloc("y", "arena", 0, 1024)))
    # a body that never frees x is a valid program once; run twice, its next iteration allocates x again
    with pytest.raises(ProgramError, match=r"instruction \(1, 0\): allocates x again while it is still "
                                           r"live at arena \[0x0, 0x400\): a Free is missing"):
        find_races(tiny(ALLOC_X, WRITE_X), iterations=2)
    with pytest.raises(ProgramError, match="touches x, which holds no device memory"):
        find_races(tiny(ALLOC_X, Free("x", "arena", 0, 1024), READ_X))
    with pytest.raises(ProgramError, match="waits for e, which was not recorded"):
        find_races(tiny(ALLOC_X, Wait("e", "compute")))
    with pytest.raises(ProgramError, match="not the start of a live pinned slot made for x"):
        find_races(tiny(ALLOC_X, WRITE_X, D2H))


# ------------------------------------------------------------------------------ real programs, mutated
def _tight(g, **flags):
    relaxed = simulate(g, MemoryConfig(liveness=True, cache=True))
    return MemoryConfig(liveness=True, cache=True, budget_bytes=relaxed.peak_bytes - 8 * 1024, **flags)


REPRESENTATIVE = {
    "eager offload": lambda: (mixed_net(), MemoryConfig(liveness=True, offload=True)),
    "cache under a tight budget": lambda: (mixed_net(n=4), _tight(mixed_net(n=4))),
    "cache and recompute": lambda: (mixed_net(n=4), _tight(mixed_net(n=4), recompute="cost_aware")),
    "raw allocator with offload": lambda: (mixed_net(),
                                           MemoryConfig(liveness=True, offload=True, allocator="raw")),
}


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_every_removed_wait_is_caught_exactly_when_it_creates_a_race(name):
    g, config = REPRESENTATIVE[name]()
    program = place(g, config)
    assert races_by_definition(program) == [] and find_races(program) == []
    waits = [i for i, ins in enumerate(program.body) if type(ins) is Wait]
    caught = set()
    for i in waits:
        mutant = program.without(i)
        fast, slow = find_races(mutant), races_by_definition(mutant)
        assert bool(fast) == bool(slow), \
            f"removing #{i} ({program.body[i]}): checker {fast} vs definition {slow}"
        assert {(r.first.at, r.second.at) for r in fast} <= set(slow)
        if fast:
            caught.add(program.body[i].why)
            with pytest.raises(RaceError, match=r"race on [\w.#@]+"):
                check(mutant)
    needed = {program.body[i].why for i in waits if program.body[i].why in ("ready", "release", "landed")}
    assert needed and needed <= caught, f"{name}: removing a {needed - caught} wait went unnoticed"


@pytest.mark.parametrize("name", ["eager offload", "cache under a tight budget"])
def test_the_adversarial_device_turns_missing_release_and_prefetch_waits_into_wrong_numbers(name):
    """Every release or prefetch wait whose removal lets two accesses of the bytes race (not only a
    free run early, which the checker also rejects) gives wrong numbers in the late or early order,
    with the copy streams' ties broken either way or at random (test_adversary shows why both)."""
    g, config = REPRESENTATIVE[name]()
    program = place(g, config, "grads")  # what Model.step runs before its SGD update
    base = train_steps(g, config, "host")
    targets = [i for i, ins in enumerate(program.body)
               if type(ins) is Wait and ins.why in ("release", "landed") and _after_transfer(program, ins)
               and any(r.on_data for r in find_races(program.without(i)))]
    assert {program.body[i].why for i in targets} == {"release", "landed"}
    for i in targets:
        mutant = program.without(i)
        changed = []
        for order, copies in [(o, c) for o in ("late", "early") for c in COPY_TIES]:
            try:
                run = train_steps(g, config, AdversarialDevice(order, seed=i, copies=copies), mutant)
            except (ValueError, FloatingPointError) as e:  # NaN labels or shapes: also a wrong result
                changed.append(f"{order}, {copies}: {type(e).__name__}")
                continue
            if run[0] != base[0] or any(not np.array_equal(run[1][n], v) for n, v in base[1].items()):
                changed.append(f"{order}, {copies}")
        assert changed, f"{name}: without #{i} ({program.body[i]}) every order still gives the right numbers"


def _after_transfer(program, wait) -> bool:
    """Whether ``wait``'s event marks an offload, eviction, prefetch or fetch copy (not a result)."""
    k = next(k for k, ins in enumerate(program.body) if type(ins) is Record and ins.event == wait.event)
    prev = program.body[k - 1]
    return type(prev) is Copy and prev.why in ("offload", "evict", "prefetch", "fetch")


# ---------------------------------------------------------------------------- programs that share an executor
TOGETHER = {"baseline": MemoryConfig.baseline(), "superneurons": MemoryConfig.superneurons(),
            "in backward, momentum on the host": MemoryConfig.superneurons(update_in_backward=True,
                                                                           optimizer_state="host")}


@pytest.mark.parametrize("name", TOGETHER)
def test_a_models_programs_run_one_after_another_without_races(name):
    model = Model(mixed_net(), TOGETHER[name], device="meta")
    model._program("grads")  # forward_backward's program too, where steps update inside backward
    assert len(model.programs) == 3
    check_together(model.programs, graph=model.graph)
    a, b = list(model.programs.values())[:2]
    seq = together((a, b, a, b))
    assert len(seq.body) > 2 * (len(a.body) + len(b.body)) - 1 and f"; {a.mode} -> {b.mode} -> " in seq.config
    assert len({i.event for i in seq.body if type(i) is Record}) == \
        2 * sum(type(i) is Record for i in a.body + b.body)


def test_check_together_catches_work_one_program_leaves_running_into_the_next():
    """Without its end-of-iteration host wait, a program's copies may still run when the next program
    (or its own next iteration) starts: caught alone and together. Without the wait that orders the
    batch's copy into its block after the block's previous users, the inference program alone is
    fine (its own previous iteration left that block free), but after a training program it races."""
    model = Model(mixed_net(), MemoryConfig.baseline(), device="meta")
    infer = model.programs["infer"]
    end = next(i for i, ins in enumerate(infer.body) if type(ins) is HostWait)
    reuse = next(i for i, ins in enumerate(infer.body) if type(ins) is Wait and ins.why == "reuse")
    for k, alone in ((end, True), (reuse, False)):
        mutant = dict(model.programs, infer=infer.without(k))
        assert bool(find_races(mutant["infer"])) == alone
        with pytest.raises(RaceError, match=r"race on [\w.#@]+") as e:
            check_together(mutant)
        assert "-> infer" in str(e.value)


def test_a_deep_program_under_a_tight_budget_is_race_free():
    """The suite's hook checks programs up to conftest.HOOK_CHECKS_UP_TO instructions; this one is
    longer: a 602-layer ResNet under superneurons() in 60% of its arena, so the cache evicts and
    fetches, with the copies retimed for a GPU."""
    from conftest import HOOK_CHECKS_UP_TO

    from snlite.models import resnet

    g = resnet(3 * 200 + 2, batch=2)
    arena = place(g, MemoryConfig.superneurons()).arena_bytes
    program = place(g, MemoryConfig.superneurons(budget_bytes=arena * 6 // 10 // 1024 * 1024))
    assert len(program) > HOOK_CHECKS_UP_TO and program.stats["cache_misses"] > 0
    check(program, graph=g)
