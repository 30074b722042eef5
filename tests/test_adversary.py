"""The adversarial device's copy-stream ties: ``copies`` decides which copy stream runs first when
both could, and an eviction and a fetch of the same bytes that forgot to wait for each other give
the right numbers under the old rule (copy_out first) and wrong ones under the other."""
import numpy as np
import pytest

from nets import mixed_net, train_steps
from snlite.adversary import COPY_TIES, AdversarialDevice
from snlite.anomaly import NonFiniteError
from snlite.checker import find_races
from snlite.config import MemoryConfig
from snlite.pipeline import place, simulate
from snlite.program import COPY_IN, COPY_OUT, Copy, Wait


def _right(run, base) -> bool:
    return run[0] == base[0] and all(np.array_equal(run[1][n], v) for n, v in base[1].items())


def _evict_fetch_race(program) -> bool:
    """Whether ``program`` lets an eviction (copy_out) and a fetch (copy_in) of the same bytes race."""
    for r in find_races(program):
        ends = [program.body[a.at[1]] for a in (r.first, r.second)]
        if r.on_data and {a.stream for a in (r.first, r.second)} == {COPY_OUT, COPY_IN} \
                and all(type(e) is Copy for e in ends) and {e.why for e in ends} == {"evict", "fetch"}:
            return True
    return False


def test_an_eviction_and_a_fetch_that_race_give_wrong_numbers_only_when_the_fetch_goes_first():
    """The cache under a tight budget evicts tensors to the pinned slab and fetches them back; a
    fetch waits for the eviction of the same bytes. Without that wait, the late order (compute first,
    copies as late as the events allow) leaves the two copies both ready: copy_out first (the only
    rule before ``copies``) evicts, then fetches, and the numbers are right; copy_in first fetches the
    slab's stale bytes, and they are wrong."""
    g = mixed_net(n=4)
    relaxed = simulate(g, MemoryConfig(liveness=True, cache=True))
    config = MemoryConfig(liveness=True, cache=True, budget_bytes=relaxed.peak_bytes - 8 * 1024)
    program = place(g, config, "grads")
    base = train_steps(g, config, "host")
    targets = [i for i, ins in enumerate(program.body) if type(ins) is Wait
               and _evict_fetch_race(program.without(i))]
    assert targets, "the tight cache must evict and fetch the same bytes behind a wait"
    hidden = []
    for i in targets:
        mutant = program.without(i)
        if _right(train_steps(g, config, AdversarialDevice("late", copies="out_first"), mutant), base):
            hidden.append(i)
        try:
            wrong = not _right(train_steps(g, config, AdversarialDevice("late", copies="in_first"),
                                           mutant), base)
        except (ValueError, FloatingPointError, NonFiniteError):  # NaN bytes fetched: also a wrong result
            wrong = True
        assert wrong, f"without #{i} ({program.body[i]}) the fetch ran first and still gave the right numbers"
    assert hidden, "the old tie rule (copy_out first) should hide at least one of these races"


def test_every_tie_rule_trains_a_correct_program_bit_identically():
    g = mixed_net(n=4)
    relaxed = simulate(g, MemoryConfig(liveness=True, cache=True))
    config = MemoryConfig(liveness=True, cache=True, budget_bytes=relaxed.peak_bytes - 8 * 1024)
    base = train_steps(g, MemoryConfig(), "host")
    for copies in COPY_TIES:
        assert _right(train_steps(g, config, AdversarialDevice("late", seed=1, copies=copies)), base), copies


def test_an_unknown_tie_rule_is_refused():
    with pytest.raises(ValueError, match=r"unknown copies 'both': how ties between the copy streams break; "
                                         r"choose one of \('out_first', 'in_first', 'random'\)"):
        AdversarialDevice("late", copies="both")
