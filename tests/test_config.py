"""MemoryConfig: presets, validation with clear messages, immutability."""
import dataclasses

import pytest

from snlite.config import MemoryConfig, baseline, superneurons


def test_presets():
    assert MemoryConfig() == baseline() == MemoryConfig.baseline()
    sn = superneurons()
    assert (sn.liveness, sn.offload, sn.cache, sn.recompute, sn.workspace, sn.allocator) == (
        True, True, True, "cost_aware", "dynamic", "pool")
    assert superneurons(budget_bytes=1 << 30).budget_bytes == 1 << 30
    assert baseline().describe() == "baseline"
    assert sn.describe() == ("liveness + offload + cache + update_in_backward + recompute=cost_aware + "
                           "workspace=dynamic + schedule=H200 + optimizer_state=auto")


@pytest.mark.parametrize("field,value,match", [
    ("recompute", "fast", r"recompute must be one of \('off', 'speed', 'memory', 'cost_aware'\), got 'fast'"),
    ("workspace", "max", r"workspace must be one of"),
    ("allocator", "malloc", r"allocator must be one of \('pool', 'raw'\)"),
    ("count", "weights", r"count must be one of \('all', 'paper'\)"),
    ("fit", "worst", r"fit must be one of"),
    ("liveness", 1, r"liveness must be True or False, got 1"),
    ("budget_bytes", -5, r"budget_bytes must be a positive int or None"),
    ("budget_bytes", 1.5e9, r"budget_bytes must be a positive int or None"),
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
