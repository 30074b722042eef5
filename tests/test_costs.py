"""Measured per-layer costs and ``MemoryConfig.recompute_keep``: a cheap layer too slow to re-run on
a device keeps its output as a checkpoint does, the plan stays exact on every device, and training
stays bit-identical to the baseline."""
import numpy as np
import pytest

from nets import data_for, mixed_net
from snlite import MemoryConfig, cli, simulate
from snlite.costs import cost_table, measure_layer_costs, span_of
from snlite.models import lenet
from snlite.recompute import cheap_layers, droppable, expand, expensive_layers, segments
from snlite.train import Model


def test_a_kept_layer_is_a_checkpoint_of_its_own():
    g = mixed_net()
    assert "bn1" in segments(g) and any(layer == "bn1" for layer in droppable(g).values())
    roots = segments(g, keep=("bn1",))
    assert "bn1" not in roots and roots["relu1"] == "bn1"  # relu1's segment now starts at bn1
    assert all(layer != "bn1" for layer in droppable(g, keep=("bn1",)).values())
    ops, info = expand(g, "memory", keep=("bn1",))
    assert not [o for o in ops if o.phase == "recompute" and o.layer == "bn1"]
    _, before = expand(g, "memory")
    assert info.count < before.count and "bn1" not in {t.split(".")[0] for t in info.dropped}


@pytest.mark.parametrize("strategy", ["speed", "memory", "cost_aware"])
def test_keeping_layers_trains_bit_identically_and_the_meta_device_plans_its_bytes(strategy):
    g = mixed_net()
    x, labels = data_for(g)
    base = Model(g, MemoryConfig(), device="host", seed=3)
    cfg = MemoryConfig(liveness=True, recompute=strategy, recompute_keep=("bn1", "pool1"))
    kept = Model(g, cfg, device="host", seed=3)
    for _ in range(2):
        assert base.step(x, labels, lr=0.1, momentum=0.9) == kept.step(x, labels, lr=0.1, momentum=0.9)
    for name, value in base.params.items():
        np.testing.assert_array_equal(kept.params[name], value, err_msg=name)
    assert kept.trace.peak_bytes == simulate(g, cfg).peak_bytes
    assert kept.trace.recompute_count < simulate(g, cfg.replace(recompute_keep=())).recompute_count


def test_recompute_keep_names_cheap_layers_only():
    g = mixed_net()
    with pytest.raises(ValueError, match=r"'conv1' \(a checkpoint.*cheap layers of mixed: bn1, relu1"):
        simulate(g, MemoryConfig(recompute="speed", recompute_keep=("conv1",)))
    with pytest.raises(ValueError, match=r"'bn9' \(no such layer\)"):
        simulate(g, MemoryConfig(recompute="speed", recompute_keep=("bn9",)))
    with pytest.raises(ValueError, match="must be a tuple of layer names"):
        MemoryConfig(recompute_keep="bn1")
    cfg = MemoryConfig(recompute_keep=["relu1", "bn1", "bn1"])
    assert cfg.recompute_keep == ("bn1", "relu1") and hash(cfg)  # one order, hashable
    assert "recompute_keep=bn1,relu1" in cfg.describe()
    assert "flat1" not in cheap_layers(g) and "conv1" not in cheap_layers(g)


def test_expensive_layers_are_those_slower_than_ratio_times_the_mean_conv_or_linear():
    g = lenet(batch=2)
    ms = {n: 0.0 for n in g.layers}
    ms.update(conv1=2.0, conv2=4.0, ip1=1.5, ip2=0.5)  # mean 2.0: the limit is 1.0 at ratio 0.5
    ms.update(pool1=1.5, pool2=1.0, relu1=0.1)
    assert expensive_layers(g, ms) == ("pool1",)  # pool2 at the limit is not above it
    assert expensive_layers(g, ms, ratio=0.25) == ("pool1", "pool2")
    assert expensive_layers(g, ms, ratio=1.0) == ()
    with pytest.raises(ValueError, match="no time for pool2"):
        expensive_layers(g, {k: v for k, v in ms.items() if k != "pool2"})
    with pytest.raises(ValueError, match="milliseconds >= 0"):
        expensive_layers(g, dict(ms, relu1=float("nan")))
    with pytest.raises(ValueError, match="ratio must be a number > 0"):
        expensive_layers(g, ms, ratio=0)
    table = cost_table(g, ms, keep=("pool1",))
    assert "kept: too slow to re-run" in table.splitlines()[3] and "pool1" in table.splitlines()[3]


def test_the_host_measures_every_layer_and_the_meta_device_cannot():
    g = lenet(batch=4)
    ms = measure_layer_costs(g, "host", reps=1)
    assert set(ms) == set(g.layers)
    assert all(ms[n] > 0 for n in ("conv1", "conv2", "ip1", "pool1")) and all(v >= 0 for v in ms.values())
    keep = expensive_layers(g, ms)
    assert set(keep) <= set(cheap_layers(g))
    with pytest.raises(ValueError, match="meta device runs no kernels"):
        measure_layer_costs(g, "meta")
    with pytest.raises(ValueError, match="reps must be an int >= 1"):
        measure_layer_costs(g, "host", reps=0)


def test_the_cli_flag_keeps_layers_and_refuses_a_checkpoint(capsys):
    code = cli.main(["plan", "lenet", "--liveness", "--recompute", "cost_aware",
                     "--recompute-keep", "pool1, relu1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "recompute_keep=pool1,relu1" in out and "kept (too slow to re-run): pool1, relu1" in out
    assert cli.main(["plan", "lenet", "--recompute", "speed", "--recompute-keep", "conv1"]) == 2
    assert "recompute_keep names 'conv1' (a checkpoint" in capsys.readouterr().err
    assert cli.main(["plan", "lenet", "--recompute", "speed", "--recompute-keep", "flatten"]) == 2
    assert "recompute_keep names 'flatten' (a view of its input" in capsys.readouterr().err


def test_snlite_costs_prints_every_layer_and_the_flag_that_keeps_the_slow_ones(capsys):
    assert cli.main(["costs", "lenet", "--batch", "4", "--reps", "1", "--ratio", "1e-9"]) == 0
    out = capsys.readouterr().out
    assert "lenet, batch 4: forward times on the host device" in out
    assert all(f"\n{name} " in out for name in ("conv1", "pool1", "ip2", "softmax"))
    assert "--recompute-keep pool1,pool2,relu1" in out  # at a tiny ratio every cheap layer is too slow
    assert cli.main(["costs", "lenet", "--batch", "4", "--reps", "1", "--ratio", "1e9"]) == 0
    assert "the paper's rule stands" in capsys.readouterr().out


def test_a_span_names_its_layer_and_phase_or_a_copy():
    assert span_of("layer1.0.conv1 forward") == ("layer1.0.conv1", "forward")
    assert span_of("fc update") == ("fc", "update")
    assert span_of("softmax.loss to host") == ("copy", "to host")
