"""snlite.explain and ``snlite plan --budget``/``--host-budget`` where a plan does not fit: where it
failed, the run without a budget, and the ranked changes, each simulated under the same budgets; then
``snlite compare`` and :func:`snlite.search.min_budget` under a pinned host budget."""
import json
import re

import pytest

from nets import alexnet, run
from snlite import MemoryConfig, budget, cli, explain, place, search, simulate
from snlite.errors import HostBudgetError
from snlite.measure import format_size, measure
from snlite.models import get_model

BUDGET = 830 * 2**20  # alexnet at batch 16: the baseline needs ~900 MiB, the weights alone ~714 MiB


def test_a_budget_too_small_explains_and_ranks_the_changes(capsys):
    code, out, err = run(capsys, "plan", "alexnet", "--batch", 16, "--budget", "830MiB")
    assert code == cli.EXIT_DOES_NOT_FIT, err
    assert "does NOT fit a budget of 830.0 MiB" in out and "where it failed:" in out and "Live there:" in out
    assert "without a budget it peaks at" in out
    assert re.search(r"^ *#  change +what +fits +peak +saves +extra FLOPs +moved +costs$", out, re.M)
    code, js, _ = run(capsys, "plan", "alexnet", "--batch", 16, "--budget", "830MiB", "--json")
    suggestions = json.loads(js)["explanation"]["suggestions"]
    assert code == cli.EXIT_DOES_NOT_FIT and len(suggestions) >= 6
    flags = [s["change"] for s in suggestions]
    assert {"--liveness", "--offload", "--cache", "--recompute cost_aware",
            "--recompute memory"} <= set(flags)
    assert any(f.startswith("--batch ") for f in flags)
    fits = [s["fits"] for s in suggestions]
    assert fits == sorted(fits, reverse=True), "the changes that fit come first"
    rows = [line.split() for line in out.split("costs\n", 1)[1].splitlines() if re.match(r"^ ?\d+  ", line)]
    assert [int(r[0]) for r in rows] == list(range(1, len(flags) + 1))
    for row, flag in zip(rows, flags):
        assert " ".join(row[1:]).startswith(flag)
    assert "try: " + flags[0] in out


def test_where_nothing_fits_it_says_what_the_plan_peaks_at_and_where_the_smallest_budget_is(capsys):
    code, out, err = run(capsys, "plan", "lenet", "--preset", "superneurons", "--budget", "20KiB")
    peak = re.search(r"without a budget it peaks at ([\d.]+ \w+) ", out)[1]
    assert code == cli.EXIT_DOES_NOT_FIT and peak != "0 B", err
    assert out.rstrip().endswith(f"nothing here fits: a larger --budget (without one it peaks at {peak}), "
                                 "or a smaller network; snlite compare lenet --batch 64 finds the smallest "
                                 "budget of superneurons()"), out[-600:]
    assert "(optimizer_state is auto, and this was its try with the momentum on the host: the device was " \
           "not tried" in out


def test_the_suggestions_that_say_they_fit_really_fit():
    ex = explain.explain_budget(alexnet, 16, MemoryConfig(budget_bytes=BUDGET))
    assert not ex.fits and "does not fit a budget" in ex.message and ex.need.peak_bytes > BUDGET
    assert ex.ran_out == "device"
    assert any(s.fits for s in ex.suggestions) and any(not s.fits for s in ex.suggestions)
    for s in ex.suggestions:
        assert s.config.budget_bytes == BUDGET
        assert budget.fits(alexnet(s.batch), s.config) == s.fits, s.change
    keys = [s.rank_key() for s in ex.suggestions]
    assert keys == sorted(keys)
    smaller = next(s for s in ex.suggestions if s.change.startswith("--batch"))
    assert smaller.batch < 16 and not budget.fits(alexnet(smaller.batch + 1), smaller.config)
    assert explain.explain_budget(alexnet, 16, MemoryConfig(budget_bytes=2**31)).fits


def test_where_first_fit_fragments_offline_placement_is_suggested_first_at_no_cost():
    """A budget of exactly the offline arena: first fit runs out of contiguous room where offline
    placement, the same program packed from its lifetimes, fits; so it ranks first and costs nothing.
    Already offline, it is not suggested. (Updating in backward, which costs nothing either and peaks
    lower, is on already: this is about fragmentation alone.)"""
    config = MemoryConfig(liveness=True, update_in_backward=True)
    arena = simulate(alexnet(16), config.replace(fit="offline")).arena_bytes
    config = config.replace(budget_bytes=arena)
    assert not budget.fits(alexnet(16), config), "first fit fits the offline arena here: pick a tighter case"
    top = explain.explain_budget(alexnet, 16, config).suggestions[0]
    assert (top.change, top.fits, top.cost, top.moved_bytes) == ("--fit offline", True, "nothing", 0)
    assert top.config == config.replace(fit="offline", count="all")
    smaller = config.replace(fit="offline", budget_bytes=arena - 2**20)
    assert "--fit offline" not in [s.change for s in explain.explain_budget(alexnet, 16, smaller).suggestions]


def test_what_superneurons_adds_to_the_stages_is_suggested_too():
    """LeNet at 11 MiB under liveness: offload, the cache and recomputation each fail, and the advice
    was to shrink the batch (from 64 to 53), though superneurons() fits the batch of 64: updating in
    backward and the momentum on the host where the device is full were never tried."""
    def lenet(batch):
        return get_model("lenet", batch)

    ex = explain.explain_budget(lenet, 64, MemoryConfig(liveness=True, budget_bytes=11 * 2**20))
    changes = [s.change for s in ex.suggestions]
    assert {"--update-in-backward", "--optimizer-state auto"} <= set(changes)
    assert any(c.endswith("--update-in-backward --optimizer-state auto --fit offline") for c in changes)
    assert ex.suggestions[0].fits and ex.suggestions[0].batch == 64, changes
    for s in ex.suggestions:
        assert budget.fits(lenet(s.batch), s.config) == s.fits, s.change


def test_nothing_fits_when_the_weights_do_not(capsys):
    code, out, err = run(capsys, "plan", "alexnet", "--batch", 2, "--budget", "100MiB", "--json", "-")
    assert code == cli.EXIT_DOES_NOT_FIT
    data = json.loads(out)
    assert data["fits"] is False and "weights and optimizer state" in data["explanation"]["message"]
    assert not any(s["fits"] for s in data["explanation"]["suggestions"])


# ---------------------------------------------------------------- the pinned host budget
OFFLOAD = MemoryConfig(liveness=True, offload=True, optimizer_state="host")  # pins CONV outputs and momentum


def test_a_host_budget_too_small_is_explained_never_reported_as_fitting(capsys):
    """Alone or with a device budget that fits, a host budget too small is what the explanation names,
    with the pinned memory the run without one needs and the changes that pin less."""
    pinned = measure(alexnet(16), OFFLOAD).slab_bytes
    flags = ["plan", "alexnet", "--batch", 16, "--liveness", "--offload", "--optimizer-state", "host",
             "--host-budget", pinned - 1024]
    for device in ([], ["--budget", "12GiB"]):
        code, out, err = run(capsys, *flags, *device)
        assert code == cli.EXIT_DOES_NOT_FIT, err
        assert out.startswith("alexnet, batch 16, does NOT fit a host budget of ")
        assert "of pinned memory" in out.splitlines()[0] and "host budget: fits" not in out
        assert f"pins {format_size(pinned)} of host memory" in out
        assert f"a --host-budget of {format_size(pinned)} or more fits" in out
        assert "the largest tensors live there" not in out  # the device's, beside the point here
        assert "--fit offline" not in out and "--recompute" not in out
        code, js, _ = run(capsys, *flags, *device, "--json", "-")
        data = json.loads(js)["explanation"]
        assert code == cli.EXIT_DOES_NOT_FIT and data["ran_out"] == "host"
        assert data["host_budget_bytes"] == pinned - 1024 and "host budget" in data["message"]
    code, out, _ = run(capsys, *flags[:-1], pinned)
    assert code == 0 and "host budget: fits" in out


def test_the_host_suggestions_pin_less_and_those_that_say_they_fit_really_fit():
    pinned = measure(alexnet(16), OFFLOAD).slab_bytes
    config = OFFLOAD.replace(host_budget_bytes=pinned - 1024)
    ex = explain.explain_budget(alexnet, 16, config)
    assert not ex.fits and ex.ran_out == "host" and ex.need.slab_bytes == pinned
    assert {s.change for s in ex.suggestions} == {
        "--no-offload", "--optimizer-state device", "--no-offload --optimizer-state device", "--batch 15"}
    for s in ex.suggestions:
        assert s.config.host_budget_bytes == pinned - 1024 and s.fits
        assert budget.fits(alexnet(s.batch), s.config), s.change
    assert [s.rank_key() for s in ex.suggestions] == sorted(s.rank_key() for s in ex.suggestions)
    assert explain.explain_budget(alexnet, 16, config.replace(host_budget_bytes=pinned)).fits
    staging = explain.explain_budget(alexnet, 16, OFFLOAD.replace(host_budget_bytes=1024))
    assert staging.ran_out == "host" and "while staging the batch" in staging.message
    assert not any(s.fits for s in staging.suggestions)  # not even a batch of 1 stages in 1 KiB


def test_compare_under_a_host_budget_says_which_memory_ran_out(capsys):
    """Each row runs under both budgets: a row that says it fits fits both, and one that does not
    names the memory it ran out of. Offload pins every CONV output whatever the device budget; the
    cache pins only what the device budget makes it evict, so 10 MiB less host memory fails it."""
    argv = ["compare", "alexnet", "--batch", 16, "--budget", "830MiB", "--host-budget"]
    code, js, err = run(capsys, *argv, "30MiB", "--json")
    assert code == 0, err
    data = json.loads(js)
    assert (data["budget_bytes"], data["host_budget_bytes"]) == (830 * 2**20, 30 * 2**20)
    rows = {r["label"]: r for r in data["rows"]}
    assert {k: (r["fits"], r["ran_out"]) for k, r in rows.items() if k in ("liveness", "+ offload",
                                                                           "+ offload + cache")} == {
        "liveness": (False, "device"), "+ offload": (False, "host"), "+ offload + cache": (True, None)}
    assert rows["+ offload + cache"]["d2h_bytes"] > 0  # it evicted: the device budget is tight
    budgets = dict(budget_bytes=830 * 2**20, host_budget_bytes=30 * 2**20)
    with pytest.raises(HostBudgetError):  # not the device's doing: it fails on an unlimited device too
        place(alexnet(16), MemoryConfig(liveness=True, offload=True, host_budget_bytes=30 * 2**20))
    cache = MemoryConfig(liveness=True, offload=True, cache=True)
    assert budget.fits(alexnet(16), cache.replace(**budgets))
    assert not budget.fits(alexnet(16), cache.replace(**{**budgets, "host_budget_bytes": 20 * 2**20}))
    code, js, _ = run(capsys, *argv, "20MiB", "--json")
    rows = {r["label"]: r for r in json.loads(js)["rows"]}
    assert (rows["+ offload + cache"]["fits"], rows["+ offload + cache"]["ran_out"]) == (False, "host")
    code, out, _ = run(capsys, *argv, "30MiB")
    assert out.startswith("alexnet, batch 16, budget 830.0 MiB, host budget 30.0 MiB: ")
    assert re.search(r"^\+ offload  .* no \(host\)$", out, re.M)
    assert re.search(r"^liveness  .* no \(device\)$", out, re.M)
    assert re.search(r"^\+ offload \+ cache  .* yes$", out, re.M)


def test_min_budget_under_a_host_budget_fits_both_and_ends_where_none_can(monkeypatch):
    """superneurons() with its momentum on the host pins more than 300 MiB at batch 200; with it on the
    device, less: the smallest device budget under that host budget exists and fits both budgets (the
    device's lower bound is worked out without the host budget). Under 100 MiB not even the staged
    batch fits: no device budget can help, and the search says so instead of galloping for ever."""
    g, host = alexnet(200), 300 * 2**20
    assert measure(g, MemoryConfig.superneurons(optimizer_state="host")).slab_bytes > host
    config = MemoryConfig.superneurons(host_budget_bytes=host)
    m = search.min_budget(g, config)
    assert budget.fits(g, config.replace(budget_bytes=m.budget_bytes))
    assert not budget.fits(g, config.replace(budget_bytes=m.budget_bytes - 1024))

    def probe(*_, **__):
        pytest.fail("min_budget probed a device budget where none meets the host budget: it gallops for ever")

    monkeypatch.setattr(search, "fits", probe)
    with pytest.raises(HostBudgetError, match="host budget of 104,857,600 bytes"):
        search.min_budget(g, config.replace(host_budget_bytes=100 * 2**20))


def test_compare_says_when_no_device_budget_meets_the_host_budget(capsys):
    code, out, err = run(capsys, "compare", "alexnet", "--batch", 200, "--host-budget", "100MiB")
    assert code == cli.EXIT_DOES_NOT_FIT, err
    assert "superneurons() fits no device budget with 100.0 MiB of pinned host memory" in out
    assert "no strategy fits a host budget of 100.0 MiB: see why, and what would, with snlite plan alexnet " \
           "--batch 200 --host-budget 104857600" in out
    code, js, _ = run(capsys, "compare", "alexnet", "--batch", 200, "--host-budget", "100MiB", "--json")
    data = json.loads(js)
    assert data["min_budget"] is None and not any(r["fits"] for r in data["rows"])
    assert {r["ran_out"] for r in data["rows"]} == {"host"}


def test_a_search_under_a_host_budget_says_which_memory_stopped_it(capsys):
    """maxbatch's next batch (the first that does not fit) ran out of device or host memory: the row
    says which, and placing that batch again raises that budget's error."""
    from snlite.errors import BudgetError
    from snlite.pipeline import probe_or_raise

    argv = ["maxbatch", "alexnet", "--budget", "2GiB", "--host-budget", "300MiB"]
    code, js, err = run(capsys, *argv, "--json")
    assert code == 0, err
    data = json.loads(js)
    assert (data["budget_bytes"], data["host_budget_bytes"]) == (2 * 2**30, 300 * 2**20)
    rows = {r["strategy"]: r for r in data["rows"]}
    assert rows["liveness"]["stopped_by"] == "device" and rows["+ offload"]["stopped_by"] == "host"
    for r in rows.values():
        config = search.SEARCH[r["strategy"]].replace(budget_bytes=2 * 2**30, host_budget_bytes=300 * 2**20)
        with pytest.raises(BudgetError) as e:
            probe_or_raise(alexnet(r["next"]), config)
        assert isinstance(e.value, HostBudgetError) == (r["stopped_by"] == "host"), r["strategy"]
    code, out, _ = run(capsys, *argv)
    assert out.startswith("largest batch of alexnet in 2.00 GiB and 300.0 MiB of pinned host memory, ")
    assert re.search(r"^strategy +batch +peak +host memory +probes +stopped by +paper$", out, re.M)
    assert re.search(r"^\+ offload +103 .* host$", out, re.M)
    code, out, _ = run(capsys, "maxbatch", "alexnet", "--budget", "2GiB")
    assert "stopped by" not in out


def test_where_no_change_pins_less_the_explanation_says_so_and_names_the_host_budget_that_fits(capsys):
    """The staged batch alone overflows 1 KiB: no change was tried, and the way out is a larger host
    budget, said in bytes, not the device's peak (it said 5.3 MiB) nor snlite compare (which sent the
    reader back to plan)."""
    pinned = place(get_model("lenet", batch=2), MemoryConfig()).slab_bytes
    code = cli.main(["plan", "lenet", "--batch", "2", "--host-budget", "1KiB"])
    out = capsys.readouterr().out
    assert code == cli.EXIT_DOES_NOT_FIT and "(no change of the configuration was tried" in out
    assert out.rstrip().endswith(f"nothing here fits: a --host-budget of {format_size(pinned)} or more, or a "
                                 "smaller batch"), out[-600:]
    assert cli.main(["plan", "lenet", "--batch", "2", "--host-budget", str(pinned)]) == 0


def test_under_a_device_budget_the_host_budget_said_to_fit_does():
    """The cache parks on the host what the device budget cannot hold: the explanation said the run
    without any budget's 9.5 MiB would do, where 87.8 MiB is needed."""
    config = MemoryConfig(liveness=True, cache=True, budget_bytes=807680000, host_budget_bytes=20 * 2**20)
    g = alexnet(16)
    ex = explain.explain_budget(lambda batch: alexnet(batch), 16, config)
    assert not ex.fits and ex.ran_out == "host" and ex.host_needed > ex.need.slab_bytes
    assert budget.fits(g, config.replace(host_budget_bytes=ex.host_needed))
    assert not budget.fits(g, config.replace(host_budget_bytes=ex.need.slab_bytes))
