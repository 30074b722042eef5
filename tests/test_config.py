"""MemoryConfig: presets, validation with clear messages, immutability."""
import dataclasses
import warnings

import numpy as np
import pytest

from snlite import simulate
from snlite.config import ConfigWarning, MemoryConfig, baseline, superneurons
from snlite.models import get_model


def test_presets():
    assert MemoryConfig() == baseline() == MemoryConfig.baseline()
    sn = superneurons()
    assert (sn.liveness, sn.offload, sn.cache, sn.recompute, sn.workspace, sn.allocator) == (
        True, True, True, "cost_aware", "dynamic", "pool")
    assert superneurons(budget_bytes=1 << 30).budget_bytes == 1 << 30
    assert baseline().describe() == "baseline"
    assert sn.describe() == ("liveness + offload + cache + update_in_backward + recompute=cost_aware + "
                           "workspace=dynamic + schedule=H200 + optimizer_state=auto")
    # every field that changes the program is named: the raw allocator's peak is not the baseline's
    assert MemoryConfig(allocator="raw").describe() == "allocator=raw"
    assert sn.replace(fit="offline").describe().endswith("optimizer_state=auto + fit=offline")
    assert MemoryConfig(count="paper").describe() == "baseline", "what a trace counts is no change of plan"


@pytest.mark.parametrize("field,value,match", [
    ("recompute", "fast", r"recompute must be one of \('off', 'speed', 'memory', 'cost_aware'\), got 'fast'"),
    ("workspace", "max", r"workspace must be one of"),
    ("allocator", "malloc", r"allocator must be one of \('pool', 'raw'\)"),
    ("count", "weights", r"count must be one of \('all', 'paper'\)"),
    ("fit", "worst", r"fit must be one of"),
    ("liveness", 1, r"liveness must be True or False, got 1"),
    ("budget_bytes", -5, r"budget_bytes must be a positive int or None"),
    ("budget_bytes", 1.5e9, r"budget_bytes must be a positive int or None, .*got 1500000000.0; bytes are a "
                            r"whole number: 1500000000$"),
    ("budget_bytes", 1.5, r"got 1.5$"),
    ("budget_bytes", "12GiB", r"got '12GiB'; a size written as text is read by "
                              r"snlite.measure.parse_size\('12GiB'\)"),
    ("host_budget_bytes", "500MB", r"host_budget_bytes .* got '500MB'; .*parse_size\('500MB'\)"),
])
def test_unknown_values_fail_clearly(field, value, match):
    with pytest.raises(ValueError, match=match):
        MemoryConfig(**{field: value})


def test_frozen_and_replace_checks_field_names():
    cfg = MemoryConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.liveness = True
    assert cfg.replace(liveness=True).liveness
    with pytest.raises(ValueError, match=r"unknown MemoryConfig field\(s\) \['livness'\]"):
        cfg.replace(livness=True)


@pytest.mark.parametrize("make", [lambda: MemoryConfig(offlaod=True),
                                  lambda: MemoryConfig.superneurons(offlaod=False),
                                  lambda: dataclasses.replace(MemoryConfig(), offlaod=True)],
                         ids=["constructor", "superneurons", "dataclasses.replace"])
def test_a_misspelled_field_is_named_with_the_closest_field_every_way_a_config_is_made(make):
    """Python's own error said only "__init__() got an unexpected keyword argument", even for a call of
    superneurons(); the error is a TypeError as Python's is, and a ValueError as a bad value is."""
    with pytest.raises(TypeError, match=r"unknown MemoryConfig field\(s\) \['offlaod'\]; 'offlaod': did you "
                                        r"mean 'offload'\?; fields: \['liveness', 'offload'") as e:
        make()
    assert isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match=r"\['zzz'\]; fields:"):  # nothing close: no guess
        MemoryConfig(zzz=1)


def test_a_numpy_integer_budget_is_an_int():
    """np.int64(4096) was refused as "must be a positive int or None ..., got np.int64(4096)"."""
    config = MemoryConfig(budget_bytes=np.int64(4096), host_budget_bytes=np.uint32(512))
    assert (config.budget_bytes, config.host_budget_bytes) == (4096, 512)
    assert type(config.budget_bytes) is int and type(config.host_budget_bytes) is int
    with pytest.raises(ValueError, match="at least 1,024"):
        MemoryConfig(budget_bytes=np.int64(1000))
    with pytest.raises(ValueError, match="positive int or None"):
        MemoryConfig(budget_bytes=np.bool_(True))


def test_a_gpu_schedule_is_taken_in_any_case_as_the_time_model_takes_it():
    """timing.profile("h100") and --gpu h100 worked where MemoryConfig(schedule="h100") was refused."""
    assert MemoryConfig(schedule="h100").schedule == "H100" == MemoryConfig(schedule="H100").schedule
    assert MemoryConfig(schedule="PAPER").schedule == "paper"
    assert MemoryConfig.superneurons(schedule="t4") == MemoryConfig.superneurons(schedule="T4")
    with pytest.raises(ValueError, match=r"schedule must be one of \('paper', 'H200'.*got 'h300'"):
        MemoryConfig(schedule="h300")
    from snlite import cli_args, cli

    args = cli.build_parser().parse_args(["plan", "lenet", "--schedule", "h100", "--fit", "Offline"])
    assert cli_args.memory_config(args).schedule == "H100" and args.fit == "offline"


@pytest.mark.parametrize("config", [{"liveness": True}, "superneurons", 3])
def test_whatever_takes_a_config_refuses_one_that_is_not_a_memory_config(config):
    """A dict or a preset's name fails at the door, saying how to build a config (an AttributeError
    from deep inside the pipeline, naming a field, was what place() and Scheduler said before)."""
    from snlite import Model, Scheduler, place, simulate
    from snlite.models import get_model

    g = get_model("lenet", batch=2)
    for call in (lambda: place(g, config), lambda: simulate(g, config), lambda: Scheduler(g, config),
                 lambda: Model(g, config, device="meta")):
        with pytest.raises(ValueError, match=r"config must be a MemoryConfig \(or None\), got .*"
                                             r"MemoryConfig\.superneurons\(\)"):
            call()
    assert place(g, None).config == MemoryConfig().describe()


@pytest.mark.parametrize("graph", ["lenet", None])
def test_whatever_takes_a_graph_refuses_one_that_is_not_a_graph(graph):
    """A model's name where a Graph goes fails at the door, saying how to build one."""
    from snlite import Model, Scheduler, place, simulate
    from snlite.budget import fits
    from snlite.search import min_budget

    for call in (lambda: place(graph), lambda: simulate(graph), lambda: Scheduler(graph),
                 lambda: Model(graph, device="meta"), lambda: fits(graph, MemoryConfig()),
                 lambda: min_budget(graph)):
        with pytest.raises(ValueError, match=r"graph must be a snlite\.Graph, got .* build one with "
                                             r"snlite\.models\.get_model\(NAME, batch\)"):
            call()


@pytest.mark.parametrize("what", ["trace", "path", "json"])
def test_whatever_takes_a_program_refuses_what_is_not_one(what, tmp_path):
    """simulate's Trace, a saved program's path or its JSON where a Program goes fails at the door,
    saying how to get one (an AttributeError naming a field of the Program was what each said)."""
    from snlite import checker, memory_snapshot, offline, place, simulate, timing, together
    from snlite.models import get_model
    from snlite.trace import trace_program

    g = get_model("lenet", batch=2)
    program = place(g)
    program.save(tmp_path / "lenet.json")
    wrong = {"trace": simulate(g), "path": str(tmp_path / "lenet.json"), "json": program.to_json()}[what]
    for call in (lambda: trace_program(wrong), lambda: checker.check(wrong),
                 lambda: checker.find_races(wrong), lambda: together.check_together([program, wrong]),
                 lambda: timing.estimate(wrong, g), lambda: offline.bounds(wrong),
                 lambda: memory_snapshot.snapshot(wrong)):
        with pytest.raises(ValueError, match=r"program must be a snlite\.program\.Program, got .* make one "
                                             r"with snlite\.place\(graph, config\), read a saved one with "
                                             r"Program\.load\(PATH\)"):
            call()


def test_a_setting_that_changes_nothing_is_warned_about_at_the_callers_line():
    """The command line warned of these; the Python API took them silently (evict='belady' without the
    cache gave LRU's figures, which looked like Belady's rule saving nothing)."""
    g = get_model("lenet", 2)
    with pytest.warns(ConfigWarning, match=r"^evict='belady' has no effect without the cache \(nothing is "
                                           r"evicted\); add cache=True$") as caught:
        simulate(g, MemoryConfig(liveness=True, evict="belady"))
    assert [w.filename for w in caught] == [__file__], "the warning names the user's line, not snlite's"
    with pytest.warns(ConfigWarning, match=r"^fit='offline' has no effect under allocator='raw'"):
        simulate(g, MemoryConfig(allocator="raw", fit="offline"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a setting that does something: no warning
        simulate(g, MemoryConfig(liveness=True, cache=True, evict="belady"))
        simulate(g, MemoryConfig(liveness=True, recompute="speed", recompute_keep=("relu1",)))
