"""MemoryConfig: the one place the switches live. Frozen, and passed to each stage (never a global):
the scheduler plans from it, the placement pass carries the plan out under its budgets, fit, cache
and schedule, and the command line builds one in one place (``snlite.cli_args.memory_config``).

    MemoryConfig()                      # == baseline(): nothing on
    MemoryConfig.superneurons()         # everything the paper does
    dataclasses.replace(cfg, offload=True)

What each field does, saves and costs: the table in docs/memory-config.md (the one copy of it).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from snlite.checks import is_int, known_fields

MIN_BUDGET_BYTES = 1024  # one block of the pool: a smaller arena holds nothing
MIN_HOST_BUDGET_BYTES = 256  # one slot of the pinned slab

CHOICES = {
    "recompute": ("off", "speed", "memory", "cost_aware"),
    "workspace": ("none", "fastest", "dynamic"),
    "allocator": ("pool", "raw"),
    "fit": ("first", "best", "offline"),  # offline: snlite.offline, after the walk
    "count": ("all", "paper"),
    "schedule": ("paper", "H200", "H100", "A100", "T4", "K40"),  # paper, then snlite.timing.PROFILES
    "optimizer_state": ("device", "host", "auto"),
    "evict": ("lru", "largest", "belady"),  # the cache's victim: snlite.cache.victim_rank
}


def _as_bytes(value) -> str:
    """How to write a budget given as text or as a float in bytes (the error's last words)."""
    if isinstance(value, str):
        return f"; a size written as text is read by snlite.measure.parse_size({value!r})"
    if isinstance(value, float) and value.is_integer() and value > 0:
        return f"; bytes are a whole number: {int(value)}"
    return ""


@known_fields  # a misspelled field is named, with the closest one (snlite.checks)
@dataclass(frozen=True)
class MemoryConfig:
    """Which SuperNeurons optimizations a run uses (docs/memory-config.md explains each field)."""

    liveness: bool = False  # free each tensor after its last use
    offload: bool = False  # CONV outputs wait in pinned host memory between forward and backward
    cache: bool = False  # the LRU tensor cache: data moves only when an allocation would fail
    recompute: str = "off"  # drop cheap layers' outputs after forward, rebuild them in backward
    workspace: str = "none"  # conv algorithms: direct only, the fastest, or the fastest that fits now
    allocator: str = "pool"  # one arena, or one device allocation per tensor
    fit: str = "first"  # the pool's policy over its 1 KiB blocks, or offline (knowing every lifetime)
    budget_bytes: int | None = None  # the device memory allowed
    count: str = "all"  # what the trace's peak counts: everything, or activations + gradients (paper)
    host_budget_bytes: int | None = None  # the pinned host memory allowed
    schedule: str = "paper"  # when copies run: the paper's points, or retimed for a GPU to hide them
    update_in_backward: bool = False  # each layer's SGD step inside backward, freeing its gradient
    optimizer_state: str = "device"  # where SGD's momentum waits between updates
    # cheap layers kept like checkpoints (snlite.recompute.expensive_layers)
    recompute_keep: tuple[str, ...] = ()
    evict: str = "lru"  # the cache's victim: least recently used, largest, or next use furthest (Belady)

    def __post_init__(self):
        keep = self.recompute_keep
        if (isinstance(keep, str) or not isinstance(keep, (tuple, list))
                or not all(isinstance(k, str) for k in keep)):
            raise ValueError(f"MemoryConfig.recompute_keep must be a tuple of layer names, got {keep!r}")
        object.__setattr__(self, "recompute_keep", tuple(sorted(set(keep))))  # hashable, one order
        for name in ("liveness", "offload", "cache", "update_in_backward"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"MemoryConfig.{name} must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.schedule, str):  # a GPU in any case, as --gpu and timing.profile take it
            spelled = {c.lower(): c for c in CHOICES["schedule"]}.get(self.schedule.lower(), self.schedule)
            object.__setattr__(self, "schedule", spelled)
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"MemoryConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name in ("budget_bytes", "host_budget_bytes"):  # a NumPy integer is an int (and stays one)
            if is_int(getattr(self, name)):
                object.__setattr__(self, name, int(getattr(self, name)))
        b = self.budget_bytes
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < MIN_BUDGET_BYTES):
            raise ValueError(f"MemoryConfig.budget_bytes must be a positive int or None, at least "
                             f"{MIN_BUDGET_BYTES:,d} (one block of the pool), got {b!r}{_as_bytes(b)}")
        h = self.host_budget_bytes
        if h is not None and (isinstance(h, bool) or not isinstance(h, int) or h < MIN_HOST_BUDGET_BYTES):
            raise ValueError("MemoryConfig.host_budget_bytes must be a positive int or None, at least "
                             f"{MIN_HOST_BUDGET_BYTES} (one slot of the pinned slab), got {h!r}"
                             f"{_as_bytes(h)}")

    @classmethod
    def baseline(cls) -> "MemoryConfig":
        """Nothing on: every tensor keeps its memory for the whole iteration."""
        return cls()

    @classmethod
    def superneurons(cls, **overrides) -> "MemoryConfig":
        """Everything the paper does: liveness, offload with the LRU cache, cost-aware
        recomputation, dynamic convolution workspace, one pool; copies scheduled to hide behind
        compute on an H200 (``schedule``); each layer's SGD step in backward, so its weight gradient
        lives only until then; momentum on the host only where the device cannot hold it."""
        return dataclasses.replace(cls(liveness=True, offload=True, cache=True, recompute="cost_aware",
                                       workspace="dynamic", schedule="H200", update_in_backward=True,
                                       optimizer_state="auto"), **overrides)

    def replace(self, **changes) -> "MemoryConfig":
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """One line naming what is on, e.g. ``liveness + offload + recompute=cost_aware``: every field
        that changes the program (not ``count``, which changes only what a trace counts, nor the
        budgets, which are said apart)."""
        parts = [n for n in ("liveness", "offload", "cache", "update_in_backward") if getattr(self, n)]
        changed = ("recompute", "workspace", "schedule", "optimizer_state", "evict", "allocator", "fit")
        parts += [f"{n}={getattr(self, n)}" for n in changed
                  if getattr(self, n) not in ("off", "none", "paper", "device", "lru", "pool", "first")]
        if self.recompute_keep:
            parts.append(f"recompute_keep={','.join(self.recompute_keep)}")
        return " + ".join(parts) or "baseline"


baseline = MemoryConfig.baseline
superneurons = MemoryConfig.superneurons


class ConfigWarning(UserWarning):
    """A setting of a :class:`MemoryConfig` that changes nothing (:func:`no_effect` says why)."""


def _as_field(field: str, value=None) -> str:
    """A setting as Python writes it: ``fit='best'``, ``cache=True``, or the bare field (None)."""
    return field if value is None else f"{field}={value!r}"


def no_effect(config: MemoryConfig, setting=_as_field) -> list[str]:
    """The settings of ``config`` that change nothing, each in a sentence that says why and what to
    do instead; ``setting(field, value)`` writes a setting (the command line spells its flags).
    :func:`snlite.place` warns of each (a :class:`ConfigWarning`); the command line prints them."""
    out = []
    if config.allocator == "raw" and config.fit != "first":
        out.append(f"{setting('fit', config.fit)} has no effect under {setting('allocator', 'raw')} (one "
                   f"device allocation per tensor: no arena to place blocks in); use "
                   f"{setting('allocator', 'pool')}, or leave {setting('fit')} out")
    if config.evict != "lru" and not config.cache:
        out.append(f"{setting('evict', config.evict)} has no effect without the cache (nothing is evicted); "
                   f"add {setting('cache', True)}")
    if config.recompute_keep and config.recompute == "off":
        out.append(f"{setting('recompute_keep')} has no effect without recomputation (nothing is dropped to "
                   f"keep); add {setting('recompute', 'cost_aware')} (or speed, memory)")
    return out


def config_of(config) -> MemoryConfig:
    """``config``, or the baseline for None; anything else (a dict, a preset's name) is refused,
    saying how to build one."""
    if config is None:
        return MemoryConfig()
    if not isinstance(config, MemoryConfig):
        raise ValueError(f"config must be a MemoryConfig (or None), got {type(config).__name__} "
                         f"{config!r:.60}; build one with MemoryConfig(liveness=True, ...) or "
                         "MemoryConfig.superneurons()")
    return config
