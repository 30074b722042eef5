"""snlite.measure and the planning commands: plan, compare, maxbatch, maxdepth, bench (meta device)."""
import dataclasses
import json
import re
import sys
import types
import warnings

import numpy as np
import pytest

from nets import alexnet, run
from snlite import budget
from snlite import BudgetError, Graph, MemoryConfig, Model, cli, cli_args, measure, search, simulate
from snlite.models import get_model, resnet
from snlite.scheduler import Scheduler, validate_plan


# ---------------------------------------------------------------- sizes
@pytest.mark.parametrize("text,nbytes", [
    ("4096", 4096), ("64KiB", 65536), ("64kib", 65536), ("500MB", 500_000_000), ("1.5GB", 1_500_000_000),
    ("12GiB", 12 * 2**30), ("12 gib", 12 * 2**30), ("0.5KiB", 512), ("2TB", 2 * 10**12), ("7b", 7),
    ("2.1GiB", 2_254_857_830), ("0.0001KiB", None),
])
def test_parse_size(text, nbytes):
    if nbytes is None:  # a unit, but less than a byte
        with pytest.raises(ValueError, match="at least 1 byte"):
            measure.parse_size(text)
        return
    assert measure.parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "GiB", "12XB", "12 G", "-5MB", "0", "1e9", "1.2.3MB", "0.1B"])
def test_parse_size_rejects_with_a_clear_message(text):
    with pytest.raises(ValueError, match="size"):
        measure.parse_size(text)


def test_format_size():
    assert measure.format_size(512) == "512 B"
    assert measure.format_size(65536) == "64.0 KiB"
    assert measure.format_size(3 * 2**30 // 2) == "1.50 GiB"
    assert measure.format_size(None) == "-"


# ---------------------------------------------------------------- flags -> MemoryConfig
def test_every_memory_config_field_is_a_flag_and_flags_override_the_preset():
    fields = {f.name for f in dataclasses.fields(MemoryConfig)}
    flags = set(cli_args.MEMORY_FLAGS) | {"budget_bytes", "host_budget_bytes"}  # --budget, --host-budget
    assert fields == flags, (f"MemoryConfig fields without a flag: {sorted(fields - flags)}; flags of no "
                             f"field: {sorted(flags - fields)} (snlite/cli_args.py: MEMORY_FLAGS and "
                             "add_memory_flags)")
    parser = cli.build_parser()
    args = parser.parse_args(["plan", "lenet", "--no-cache", "--preset", "superneurons",
                              "--recompute", "speed", "--workspace", "none", "--allocator", "raw",
                              "--fit", "best", "--count", "paper", "--budget", "64MiB",
                              "--host-budget", "1GiB"])
    assert cli.memory_config(args) == MemoryConfig.superneurons(
        cache=False, recompute="speed", workspace="none", allocator="raw", fit="best", count="paper",
        budget_bytes=64 * 2**20, host_budget_bytes=2**30)
    assert cli.memory_config(parser.parse_args(["plan", "lenet"])) == MemoryConfig.baseline()
    args = parser.parse_args(["train", "lenet", "--liveness", "--offload"])
    assert cli.memory_config(args) == MemoryConfig(liveness=True, offload=True)


def test_bad_size_flag_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["plan", "lenet", "--budget", "12XB"])
    assert e.value.code == 2 and "not a size: '12XB'" in capsys.readouterr().err


# ---------------------------------------------------------------- plan
def test_plan_prints_the_peak_the_live_tensors_and_the_conv_table(capsys):
    code, out, err = run(capsys, "plan", "alexnet", "--batch", 8, "--preset", "superneurons", "--steps")
    assert code == 0, err
    for text in ("Scheduler for alexnet", "peak ", "l_peak (largest step)", "peak / l_peak",
                 "recomputation: ", "transfers: ", "cache: ", "convolution workspace", "per step (KiB)"):
        assert text in out, text
    trace = simulate(alexnet(8), MemoryConfig.superneurons())
    assert measure.format_size(trace.peak_bytes) in out
    at = re.search(r"at step (\d+) \((\S+) (forward|backward)", out)
    assert at and int(at[1]) == trace.peak_step
    assert trace.peak_tensors[0][0] in out
    for kind, (on_device, on_host) in trace.by_kind().items():  # the peak by kind, device and host
        assert re.search(rf"^{kind} +{re.escape(measure.format_size(on_device))} +"
                         rf"{re.escape(measure.format_size(on_host))}$", out, re.M), kind


def test_plan_json_has_totals_steps_config_and_conv_choices(tmp_path, capsys):
    file = tmp_path / "plan.json"
    code, out, err = run(capsys, "plan", "lenet", "--batch", 4, "--liveness", "--recompute", "cost_aware",
                         "--json", file)
    assert code == 0, err
    data = json.loads(file.read_text())
    config = MemoryConfig(liveness=True, recompute="cost_aware")
    trace = simulate(get_model("lenet", 4), config)
    paper = simulate(get_model("lenet", 4), config.replace(count="paper"))
    assert data["config"] == json.loads(json.dumps(dataclasses.asdict(config))) and data["batch"] == 4
    assert data["totals"]["peak_bytes"] == trace.peak_bytes \
        and data["totals"]["paper_peak_bytes"] == paper.peak_bytes
    assert data["totals"]["extra_flops"] == trace.extra_flops > 0
    assert len(data["steps"]) == len(trace.steps) and data["steps"][0]["device_bytes"]
    assert {c["op"] for c in data["conv_choices"]} == {"forward", "backward_data", "backward_filter"}
    assert data["recompute"]["count"] == trace.recompute_count


def test_plan_with_a_budget_that_fits(capsys):
    code, out, _ = run(capsys, "plan", "lenet", "--batch", 4, "--budget", "64MiB")
    assert code == 0 and "budget: fits 64.0 MiB" in out


def test_train_runs_under_a_config_and_a_budget_too_small_is_one_line(capsys):
    argv = ["train", "lenet", "--data", "synthetic", "--device", "host", "--epochs", "1", "--limit", "64",
            "--batch", "16"]
    code, out, err = run(capsys, *argv, "--preset", "superneurons", "--no-cache")
    assert code == 0, err
    assert "memory: liveness + offload + update_in_backward + recompute=cost_aware + workspace=dynamic" in out
    code, out, err = run(capsys, *argv, "--liveness", "--budget", "1MiB")
    assert code == cli.EXIT_DOES_NOT_FIT and len(err.strip().splitlines()) == 1 and "does not fit" in err


# ---------------------------------------------------------------- compare and sqrt(N)
def test_compare_prints_one_row_per_strategy_in_order(capsys):
    code, out, err = run(capsys, "compare", "alexnet", "--batch", 32)
    assert code == 0, err
    labels = list(measure.COMPARE) + [measure.SQRT_LABEL]
    assert all(label in out for label in labels)
    code, out, _ = run(capsys, "compare", "alexnet", "--batch", 32, "--json")
    rows = {r["label"]: r for r in json.loads(out)["rows"]}
    assert list(rows) == labels
    for key in ("peak_bytes", "paper_peak_bytes"):
        for recompute in ("speed", "memory", "cost_aware"):
            chain = [rows[k][key]
                     for k in ("baseline", "liveness", "+ offload", f"+ offload + recompute {recompute}")]
            assert chain == sorted(chain, reverse=True), (key, recompute, chain)
        assert rows["+ offload"][key] < rows["baseline"][key]
    assert rows["+ offload"]["d2h_bytes"] > 0 and rows[measure.SQRT_LABEL]["extra_flops"] > 0


def test_min_budget_is_the_first_budget_that_fits_and_compare_prints_it(capsys):
    """superneurons()'s smallest budget: it fits, one 1 KiB block less does not, and it is at least
    l_peak plus the weights, their gradients and momentum (which every budget must hold)."""
    from snlite.budget import fits

    g = alexnet(16)
    m = search.min_budget(g)
    cfg = MemoryConfig.superneurons()
    assert fits(g, cfg.replace(budget_bytes=m.budget_bytes))
    assert not fits(g, cfg.replace(budget_bytes=m.budget_bytes - 1024))
    assert m.l_peak_bytes == simulate(g, cfg.replace(count="paper")).l_peak_bytes
    assert m.budget_bytes >= m.l_peak_bytes + m.persistent_bytes and m.ratio >= 1
    code, out, err = run(capsys, "compare", "alexnet", "--batch", 16, "--json")
    assert code == 0, err
    assert json.loads(out)["min_budget"]["budget_bytes"] == m.budget_bytes
    code, out, _ = run(capsys, "compare", "alexnet", "--batch", 16)
    assert f"superneurons() runs in {measure.format_size(m.budget_bytes)} at the least, " \
           f"{m.ratio:.2f} x" in out


def test_compare_under_a_budget_says_which_fit(capsys):
    code, out, err = run(capsys, "compare", "alexnet", "--batch", 16, "--budget", "850MiB", "--json")
    assert code == 0, err
    fits = {r["label"]: r["fits"] for r in json.loads(out)["rows"]}
    assert fits["baseline"] is False and fits["+ offload + recompute cost_aware"] is True


def test_a_row_that_fits_its_bytes_but_not_its_blocks_says_fragmented(capsys):
    """With 1900 MiB, "+ offload + recompute speed" peaks at 1.78 GiB and was marked a bare "no"; its
    first-fit arena is what does not fit. And no percentage prints as -0.0%."""
    code, out, err = run(capsys, "compare", "alexnet", "--batch", 200, "--budget", "1900MiB")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("+ offload + recompute speed "))
    assert " 1.78 GiB " in row and row.endswith("  no (fragmented)"), row
    assert "no (fragmented): the bytes live at once fit the budget, but no placement of the pool's " \
        "first fit does" in out and "-0.0%" not in out
    assert re.search(r"^baseline .* \+0\.0% +no$", out, re.M)
    # under best fit, the note blamed first fit all the same
    code, out, err = run(capsys, "compare", "alexnet", "--batch", 200, "--budget", "1900MiB", "--fit", "best")
    assert code == 0 and re.search(r"^sqrt\(N\) checkpoints .* no \(fragmented\)$", out, re.M), err
    assert "but no placement of the pool's best fit does" in out and "first fit" not in out


def small_net(batch=2):
    """Conv, BN, ReLU, a residual add, pooling, dropout, FC: every kind of tensor the plan drops."""
    g = Graph((batch, 3, 8, 8), 5, name="small")
    x = g.relu(g.batchnorm(g.conv2d(g.input(), 4, 3, padding=1)))
    y = g.relu(g.batchnorm(g.conv2d(x, 4, 3, padding=1)))
    x = g.maxpool(g.relu(g.add(x, y)), 2)
    x = g.dropout(g.relu(g.linear(g.flatten(x), 16)), 0.5)
    g.softmax_loss(g.linear(x, 5))
    return g


@pytest.mark.parametrize("net", [small_net(), get_model("resnet50", 1), get_model("inception_v4", 1)],
                         ids=["small", "resnet50", "inception_v4"])
def test_checkpoint_plan_is_valid_and_saves_memory(net):
    plan = measure.checkpoint_plan(net)
    validate_plan(plan, Scheduler(net).persistent())
    trace = simulate(net, plan.config.replace(count="paper"), plan=plan)
    assert trace.recompute_count > 0 and trace.extra_flops <= net.flops()
    assert trace.peak_bytes <= simulate(net, MemoryConfig(count="paper")).peak_bytes


def test_checkpoint_plan_computes_the_same_loss_and_gradients():
    g = small_net()
    rng = np.random.default_rng(0)
    x, labels = rng.standard_normal(g.input_shape).astype(np.float32), np.array([1, 3])
    model = Model(g, MemoryConfig(liveness=True), device="host")
    loss, grads = model.forward_backward(x, labels)
    plan = measure.checkpoint_plan(g, every=2)
    model = Model(g, plan.config, device="host", plan=plan)
    loss2, grads2 = model.forward_backward(x, labels)
    assert model.trace.recompute_count > 0 and loss2 == loss
    for name in grads:
        assert np.array_equal(grads[name], grads2[name]), name


# ---------------------------------------------------------------- searches
def test_largest_gallops_and_bisects():
    for edge in (-1, 0, 1, 7, 63, 99):
        for start in (0, 5, 50, 99):
            calls = []

            def ok(i):
                calls.append(i)
                return i <= edge
            assert search.largest(100, ok, start) == (None if edge < 0 else edge)
            assert len(calls) <= 16


def test_maxbatch_result_fits_and_one_more_does_not(capsys):
    code, out, err = run(capsys, "maxbatch", "lenet", "--budget", "12MiB")
    assert code == 0, err
    assert all(label in out for label in search.SEARCH) and "count all" in out and "took " in out
    code, out, _ = run(capsys, "maxbatch", "lenet", "--budget", "12MiB", "--json")
    rows = {r["strategy"]: r for r in json.loads(out)["rows"]}
    batch = rows["liveness"]["batch"]
    config = MemoryConfig(liveness=True, budget_bytes=12 * 2**20)
    assert batch > 1 and rows["liveness"]["next"] == batch + 1
    assert budget.fits(get_model("lenet", batch), config) \
        and not budget.fits(get_model("lenet", batch + 1), config)
    assert rows["superneurons"]["batch"] >= rows["baseline"]["batch"]


def test_a_batch_search_draws_its_line_past_fixed_costs():
    """AlexNet under superneurons(): at batches 8 and 32 the largest step is fc6's update (its weights,
    gradient and momentum, whatever the batch), so a line through them all but misses the batch's
    cost; drawn again further out it lands next to the answer, and the search needs few probes."""
    def build(b):
        return get_model("alexnet", b)

    config = MemoryConfig.superneurons(budget_bytes=12 * 2**30, count="all")
    near = search._estimate(build, config, (8, 32))
    far = search._estimate(build, config, (8, 32), further=True)
    found = search.max_batch(build, config)
    assert abs(far - found.value) <= 0.02 * found.value < abs(near - found.value)
    assert found.probes <= 6  # the guess (slack as a ratio, to 0.1%) lands 3 short: 1 + 2 log2(3) probes


def test_a_batch_search_builds_no_batch_beyond_its_ceiling():
    """Under --max-batch 40 the line was drawn again through batches 256 and 2,048 (and min_budget run
    at 2,048 under the cache), to start a search that could only start at 40."""
    built = []

    def build(b):
        built.append(b)
        return get_model("alexnet", b)

    found = search.max_batch(build, MemoryConfig.superneurons(budget_bytes=64 * 2**30), hi=40)
    assert found.value == 40 and found.probes == 1 and max(built) == 40, sorted(set(built))


def test_maxbatch_shows_the_papers_figures(capsys):
    code, out, _ = run(capsys, "maxbatch", "alexnet", "--budget", "2GiB")
    assert code == 0 and "SuperNeurons 1,792; the best other framework 1,408" in out


def test_maxdepth_result_fits_and_the_next_valid_depth_does_not(capsys):
    """Also the rows by kind: the baseline holds weights, their gradients and momentum on the device
    all iteration; superneurons() one layer's gradient at most, and the momentum waits on the host."""
    code, out, err = run(capsys, "maxdepth", "--batch", 1, "--budget", "1GiB", "--json")
    assert code == 0, err
    rows = {r["strategy"]: r for r in json.loads(out)["rows"]}
    assert list(rows) == list(search.SEARCH)
    depth = rows["liveness"]["depth"]
    units = (depth - 2) // 3
    next_depth = {16: 101, 33: 152}.get(units, depth + 3)
    assert rows["liveness"]["next"] == next_depth
    config = MemoryConfig(liveness=True, budget_bytes=2**30)
    assert budget.fits(resnet(depth, 1), config) and not budget.fits(resnet(next_depth, 1), config)
    depths = [rows[k]["depth"] for k in ("baseline", "liveness", "+ offload", "+ recompute")]
    assert depths == sorted(depths)
    base, sn = rows["baseline"]["by_kind"], rows["superneurons"]["by_kind"]
    assert base["weight gradients"]["device_bytes"] >= 0.99 * base["weights"]["device_bytes"]
    assert base["optimizer state"]["device_bytes"] >= 0.99 * base["weights"]["device_bytes"]
    assert sn["weight gradients"]["device_bytes"] < 0.01 * sn["weights"]["device_bytes"]
    assert sn["optimizer state"]["host_bytes"] >= 0.99 * sn["weights"]["device_bytes"]
    assert rows["superneurons"]["depth"] > 2 * rows["+ recompute"]["depth"]
    # each search started on its answer: one probe there, one at the next depth
    assert all(r["probes"] == 2 for r in rows.values()), {k: r["probes"] for k, r in rows.items()}


def test_the_depth_guess_under_the_cache_counts_the_slack_beyond_l_peak(monkeypatch):
    """With the cache a search guesses from l_peak, which a placement needs plus some slack
    (fragmentation, the workspace, momentum fetched for its update): without the slack the line
    overshoots a ResNet's answer by units, with it (the same bytes at every depth) it lands on it."""
    config = MemoryConfig.superneurons(budget_bytes=768 * 2**20, count="all")
    guesses, estimate = [], search._estimate
    monkeypatch.setattr(search, "_estimate", lambda *a, **k: guesses.append(estimate(*a, **k)) or guesses[-1])
    found = search.max_depth(16, config, max_units=1000)
    units = (found.value - 2) // 3
    assert units <= guesses[0] < units + 1 and found.probes == 2
    monkeypatch.setattr(search, "_least", lambda graph, config, l_peak: l_peak)  # no slack
    assert estimate(search._resnet_builder(16), config, (50, 100)) > units + 5


def test_maxdepth_prints_the_table_and_its_time(capsys):
    code, out, err = run(capsys, "maxdepth", "--batch", 16, "--budget", "5GiB", "--max-units", 60)
    assert code == 0, err
    assert "SuperNeurons 1,920" in out and re.search(r"took \d+\.\d s", out)
    assert re.search(r"^superneurons +>= 182 +60 .* 1,920$", out, re.M)
    assert ">=: still fits at the ceiling 182 (60 residual units; --max-units 60); raise it with " \
           "--max-units" in out
    assert re.search(r"^baseline +\d+ +\d+ ", out, re.M)
    assert re.search(r"^strategy +weights +weight grads +momentum +on host +the rest +on host$", out, re.M)


def test_maxdepth_names_the_deepest_valid_resnet_under_its_ceiling(capsys):
    """--max-units 40 said "the ceiling 122 (40 residual units)", a ResNet that does not exist (no valid
    depth between 101 and 152), while the table said ">= 101"."""
    code, out, err = run(capsys, "maxdepth", "--batch", 16, "--budget", "3GiB", "--max-units", 40, "--quiet")
    assert code == 0 and re.search(r"^superneurons +>= 101 +33 ", out, re.M), err
    assert ">=: still fits at the ceiling 101 (33 residual units, the deepest valid ResNet within 40; " \
           "--max-units 40); raise it with --max-units" in out


def test_resnet_units_are_the_valid_depths():
    units = search.resnet_units(60)
    assert units[:4] == [16, 33, 50, 51] and units[-1] == 60
    for u in units:
        resnet(3 * u + 2, 1)  # raises for an invalid depth


# ---------------------------------------------------------------- bench, plots, help, errors
def test_bench_says_no_gpu_and_times_the_planning(capsys):
    code, out, err = run(capsys, "bench", "--units", 50)
    assert code == 0, err
    assert "no GPU here" in out and "ResNet-152 (50 residual units" in out and "superneurons" in out


def fake_plot(monkeypatch, fail=False):
    calls = []

    class PlotUnavailable(RuntimeError):
        pass

    def record(name):
        def draw(data, path, title=None, **kw):
            if fail:
                raise PlotUnavailable("matplotlib is not installed: pip install matplotlib")
            calls.append((name, data, path, title))
        return draw
    module = types.SimpleNamespace(PlotUnavailable=PlotUnavailable, plot_timeline=record("timeline"),
                                   plot_tradeoff=record("tradeoff"))
    from snlite import cli_common

    monkeypatch.setattr(cli_common, "plot", module)  # the plot module the planning commands draw with
    return calls


def test_plot_flags_call_the_plot_module(monkeypatch, tmp_path, capsys):
    calls = fake_plot(monkeypatch)
    assert run(capsys, "plan", "lenet", "--batch", 2, "--plot", tmp_path / "t.png")[0] == 0
    assert run(capsys, "compare", "lenet", "--batch", 2, "--plot", tmp_path / "c.png")[0] == 0
    (kind1, trace, path1, _), (kind2, rows, path2, _) = calls
    assert kind1 == "timeline" and trace.steps and path1.endswith("t.png")
    assert kind2 == "tradeoff" and path2.endswith("c.png")
    assert set(rows[0]) == {"label", "peak_bytes", "extra_flops", "moved_bytes"} and len(rows) == 8


def test_plot_unavailable_is_a_one_line_error(monkeypatch, tmp_path, capsys):
    fake_plot(monkeypatch, fail=True)
    code, _, err = run(capsys, "compare", "lenet", "--batch", 2, "--plot", tmp_path / "c.png")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "pip install matplotlib" in err


@pytest.mark.parametrize("command", ["plan", "compare", "maxbatch", "maxdepth", "bench"])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--help"])
    assert e.value.code == 0 and f"usage: snlite {command}" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message,status", [
    (["plan", "lenett"], "unknown model 'lenett'", 2),
    (["compare", "resnet51"], "no bottleneck ResNet of depth 51", 2),
    (["maxbatch", "nope", "--budget", "1GiB"], "unknown model 'nope'", 2),
    (["plan", "lenet", "--json", "/no/such/dir/x.json"], "its folder does not exist", 1),
])
def test_errors_are_one_line(argv, message, status, capsys):
    code, _, err = run(capsys, *argv)
    assert code == status and len(err.strip().splitlines()) == 1 and message in err, err


# ---------------------------------------------------------------- never silent
def test_compare_asks_superneurons_itself_and_every_fit_before_saying_nothing_fits(capsys):
    """superneurons() is no row of the table (it updates in backward, which no row does): LeNet's rows all
    said no at 11 MiB, and compare said "no strategy fits", exit 3, under "superneurons() runs in 10.4 MiB
    at the least". A row that fits only under another --fit counted for nothing either."""
    code, out, err = run(capsys, "compare", "lenet", "--budget", "11MiB")
    assert code == 0, err
    assert "no strategy fits" not in out and "; under the budget 11.0 MiB it fits\n" in out
    assert out.rstrip().endswith("no row of the table fits its budget 11.0 MiB; what does: superneurons()")
    code, js, _ = run(capsys, "compare", "lenet", "--budget", "11MiB", "--json")
    data = json.loads(js)
    assert code == 0 and not any(r["fits"] for r in data["rows"])
    assert data["by_fit"]["first"]["superneurons_fits"] is True
    # what compare says, against placing superneurons() under the budget
    assert budget.fits(get_model("lenet", 64), MemoryConfig.superneurons(budget_bytes=11 * 2**20))
    code, out, err = run(capsys, "compare", "lenet", "--budget", "12MiB", "--host-budget", "1MiB", "--fit",
                         "first", "offline")
    assert code == 0 and "what does: + offload + cache (fit=offline), superneurons()" in out, out[-1500:]
    code, out, _ = run(capsys, "compare", "lenet", "--budget", "5MiB")
    assert code == 3 and "under the budget 5.0 MiB it does not fit" in out
    assert "no strategy fits 5.0 MiB" in out


def test_nothing_fits_is_exit_status_3_everywhere(capsys):
    """compare lenet --budget 1KiB used to exit 0 with a table of 'no'."""
    code, out, err = run(capsys, "compare", "lenet", "--batch", 2, "--budget", "1KiB")
    assert code == 3 and "no strategy fits 1.0 KiB" in out \
        and "snlite plan lenet --batch 2 --budget 1024" in out
    assert run(capsys, "compare", "lenet", "--batch", 2, "--budget", "1KiB", "--json")[0] == 3
    code, out, err = run(capsys, "maxbatch", "lenet", "--budget", "4KiB", "--max-batch", 4)
    assert code == 3 and "not even a batch of 1 fits" in out
    code, out, _ = run(capsys, "maxdepth", "--budget", "1MiB", "--max-units", 16)
    assert code == 3 and "not even ResNet-50 fits" in out


def test_a_budget_below_the_first_weight_says_nothing_else_was_live(capsys):
    """The runtime's message used to end in 'Live there: .'."""
    code, out, err = run(capsys, "plan", "lenet", "--budget", "1KiB")
    assert code == 3 and "Live there: ." not in out
    assert "conv1.weight needs 2,000 bytes but the largest free block is 1,024 bytes. Nothing else was " \
           "live there." in out
    with pytest.raises(BudgetError, match=r"largest free block is 1,024 bytes\. Nothing else was live "
                                                    r"there\. The smallest budget"):
        Model(get_model("lenet", 2), MemoryConfig(budget_bytes=1024), device="host")


def test_maxdepth_never_reports_a_depth_above_max_units(capsys):
    """--max-units 3 used to report depth 101 (33 units); below ResNet-50's 16 units is a usage error."""
    with pytest.raises(SystemExit) as e:
        cli.main(["maxdepth", "--max-units", "3"])
    assert e.value.code == 2 and "--max-units: expected at least 16" in capsys.readouterr().err
    with pytest.raises(ValueError, match="max_units must be at least 16"):
        search.resnet_units(3)
    assert search.resnet_units(20) == [16]
    code, out, _ = run(capsys, "maxdepth", "--budget", "12GiB", "--max-units", 20, "--json")
    assert code == 0 and {r["depth"] for r in json.loads(out)["rows"]} == {50}


LENET = get_model("lenet", batch=2)
BUDGETED = MemoryConfig.superneurons(budget_bytes=1 << 30)


@pytest.mark.parametrize("call, message", [
    (lambda: search.max_batch(lambda b: get_model("lenet", batch=b), BUDGETED, lo=10, hi=5),
     "max_batch searches the batches from lo to hi, and lo 10 is above hi 5"),  # an IndexError
    (lambda: search.max_batch(LENET, BUDGETED), r"max_batch takes build, a function of the batch giving "
                                                r"the network's Graph \(e.g. lambda b: get_model\('alexnet', "
                                                r"batch=b\)\), not Graph"),  # 'Graph' object is not callable
    (lambda: search.max_depth(0, BUDGETED), r"max_depth's batch must be an integer >= 1, got 0"),
    (lambda: search.max_depth(16, BUDGETED, build=LENET), "max_depth takes build, a function of the number"),
    (lambda: search.min_budget(LENET, resolution=0), r"min_budget's resolution \(blocks of 1 KiB\) must be "
                                                     r"an integer >= 1, got 0"),  # a ZeroDivisionError
    (lambda: search.min_budget(lambda b: LENET), r"graph must be a snlite\.Graph, got function"),
])
def test_a_search_given_the_wrong_arguments_says_which_and_what_it_takes(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("flags,named", [
    (["--recompute", "cost_aware", "--no-liveness"], "--recompute cost_aware without liveness"),
    (["--cache"], "--cache without liveness"),
    (["--preset", "superneurons", "--no-liveness"],
     "--offload, --cache and --recompute cost_aware without liveness"),
])
def test_optimizations_without_liveness_are_warned_about(flags, named, capsys):
    code, out, err = run(capsys, "plan", "lenet", "--batch", 2, *flags)
    assert code == 0 and err.startswith(f"snlite plan: warning: {named} analysis") and "add --liveness" in err
    assert len(err.strip().splitlines()) == 1
    _, _, err = run(capsys, "plan", "lenet", "--batch", 2, *flags, "--liveness")
    assert err == ""


def test_a_fit_under_the_raw_allocator_is_warned_about(capsys):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, err = run(capsys, "plan", "lenet", "--batch", 2, "--allocator", "raw", "--fit", "offline")
    assert code == 0 and err.startswith("snlite plan: warning: --fit offline has no effect under --allocator")
    assert err.count("no effect") == 1 and not caught, "once, as flags: not again as a Python warning"
    assert "  allocator raw, peak counted" in out
    for flags in (["--allocator", "raw"], ["--fit", "offline"]):
        assert run(capsys, "plan", "lenet", "--batch", 2, *flags)[2] == ""


def test_layers_kept_without_recomputation_are_warned_about(capsys):
    code, _, err = run(capsys, "plan", "lenet", "--batch", 2, "--liveness", "--recompute-keep", "relu1")
    assert code == 0 and err.startswith("snlite plan: warning: --recompute-keep has no effect without ")
    flags = ("plan", "lenet", "--batch", 2, "--liveness", "--recompute-keep", "relu1", "--recompute", "speed")
    assert run(capsys, *flags)[2] == ""


class Terminal:
    """A stderr that says it is a terminal, and keeps what was written."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s

    def flush(self):
        pass


@pytest.mark.parametrize("argv,shown", [
    (["maxbatch", "lenet", "--budget", "12MiB", "--max-batch", "100"],
     [r"snlite maxbatch: baseline: estimating from batch 8 and batch 32 \[strategy 1/5\]  \(\d+ s\)",
      r"snlite maxbatch: superneurons: probe \d+, batch [0-9,]+ \[strategy 5/5\]"]),
    (["maxdepth", "--budget", "3GiB", "--max-units", "20"],
     [r"snlite maxdepth: liveness: probe 1, depth 50 \(16 units\) \[strategy 2/5\]"]),
    (["compare", "lenet", "--batch", "2"],
     [r"snlite compare: lenet: baseline \(1/8\)", r"snlite compare: lenet: sqrt\(N\) checkpoints \(8/8\)"]),
])
def test_long_commands_show_what_they_probe_on_a_terminal(argv, shown, monkeypatch, capsys):
    """Only on a terminal (capsys's stderr is not one), never with --quiet; the line is wiped before the
    results."""
    code, _, err = run(capsys, *argv)
    assert code == 0 and err == ""
    monkeypatch.setenv("COLUMNS", "300")  # a narrow terminal truncates the line
    for quiet in (False, True):
        tty = Terminal()
        with monkeypatch.context() as m:
            m.setattr(sys, "stderr", tty)
            code = cli.main(argv + ["--quiet"] * quiet)
        assert code == 0
        if quiet:
            assert tty.text == ""
        else:
            for pattern in shown:
                assert re.search(pattern, tty.text), tty.text
            assert tty.text.endswith("\r\033[K")


def test_the_progress_line_fits_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    tty = Terminal()
    status = cli_args.Status("snlite maxdepth", stream=tty)
    status("superneurons: probe 3, depth 2,819 (939 units) [strategy 5/5]")
    line = tty.text.removeprefix("\r").removesuffix("\033[K")
    assert len(line) == 39 and line.startswith("snlite maxdepth: superneurons") \
        and line.endswith("...  (0 s)")
    status.clear()
    assert tty.text.endswith("\r\033[K")


def test_max_batch_starts_at_the_smallest_valid_batch():
    """A BatchNorm over a 1x1 map has one value per channel at batch 1: the search starts at 2."""
    def pooled(batch):
        g = Graph((batch, 3, 8, 8), num_classes=4, name="pooled")
        g.softmax_loss(g.linear(g.flatten(g.batchnorm(g.avgpool(g.conv2d(g.input(), 8, 3), 6))), 4))
        return g

    with pytest.raises(ValueError, match="a batch of at least 2"):
        pooled(1)
    assert search.smallest_batch(pooled)[0] == 2
    assert search.smallest_batch(lambda b: get_model("lenet", b)) == (1, None)
    found = search.max_batch(pooled, MemoryConfig(liveness=True, budget_bytes=1 << 20), hi=64)
    assert found.value is not None and found.value >= 2
    with pytest.raises(ValueError, match="max_batch takes build, a function"):
        search.max_batch_table(pooled(2), 1 << 20)


POOLED = """from snlite import Graph

def pooled(batch=8):
    g = Graph((batch, 3, 8, 8), num_classes=4, name="pooled")
    g.softmax_loss(g.linear(g.flatten(g.batchnorm(g.avgpool(g.conv2d(g.input(), 8, 3), 6))), 4))
    return g
"""


def test_maxbatch_of_a_net_file_starts_at_its_smallest_valid_batch(tmp_path, capsys):
    """A NET function whose graph refuses batch 1 (snlite's ValueError, from inside the user's code)
    ended maxbatch with exit 1 instead of starting at batch 2, as a torchvision NET does; and a
    --max-batch below that batch said "lo 2 is above hi 1", max_batch's own words, with exit 1."""
    (tmp_path / "pooled.py").write_text(POOLED)
    net = f"{tmp_path / 'pooled.py'}:pooled"
    code, out, err = run(capsys, "maxbatch", net, "--budget", "1MiB", "--max-batch", 4, "--json")
    assert code == 0 and json.loads(out)["smallest_batch"] == 2, err
    assert all(r["batch"] == 4 for r in json.loads(out)["rows"])
    code, out, err = run(capsys, "maxbatch", net, "--budget", "1MiB", "--max-batch", 1)
    assert code == 2 and not out and err.startswith(f"snlite maxbatch: error: --max-batch 1 is below {net}'s "
                                                    "smallest valid batch, 2 (a batch of 1 is no valid input "
                                                    "here: ") and err.rstrip().endswith("give --max-batch 2 "
                                                                                        "or more"), err
    code, out, err = run(capsys, "plan", net, "--batch", 1)  # no search: the one line of the user's code
    assert code == 1 and "pooled(1) raised ValueError: batchnorm 'bn1'" in err, err


def test_the_searches_refuse_a_config_that_is_no_memory_config_and_name_a_custom_one():
    build = lambda b: get_model("lenet", b)  # noqa: E731
    for search_of in (lambda c: search.max_batch(build, c), lambda c: search.max_depth(1, c)):
        with pytest.raises(ValueError, match="config must be a MemoryConfig .*got dict"):
            search_of({"budget_bytes": 8 << 20})
    assert search.min_budget(get_model("lenet", 4), MemoryConfig(liveness=True)).label == "liveness"
    assert search.min_budget(get_model("lenet", 4)).label == "superneurons()"
