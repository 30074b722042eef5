"""Why a plan does not fit, and what would make it fit: every change not already on (liveness,
offload, the cache, recomputation, updating in backward, momentum on the host where the device is
full, no workspace, all together, offline placement, alone and with all the rest, a smaller batch),
each simulated on the meta device under the same budget and ranked by what it costs. Where the
pinned host budget is what ran out, the changes are those that pin less (no offload, no cache, the
momentum on the device, all together, a smaller batch).

    explain_budget(lambda b: get_model("alexnet", b), 200, cfg)   # an Explanation, ranked suggestions

``snlite plan NET --budget B`` (or ``--host-budget H``) prints it when a plan does not fit
(:mod:`snlite.cli_plan`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from snlite.config import MemoryConfig
from snlite.errors import BudgetError, HostBudgetError
from snlite.measure import Measurement, measure
from snlite.pipeline import simulate
from snlite.search import max_batch

COSTS = ("nothing", "bytes moved", "slower convolutions", "extra FLOPs", "a smaller batch")


@dataclass
class Suggestion:
    """A change to the configuration (or the batch), simulated under the same budget. ``peak_bytes``
    is the peak of that run where it fits, else of the run without a budget (what it would need)."""

    change: str  # as flags: "--liveness", "--recompute cost_aware", "--batch 96"
    what: str
    config: MemoryConfig
    batch: int
    fits: bool
    peak_bytes: int | None
    saved_bytes: int | None
    extra_flops: int = 0
    forward_flops: int = 0
    moved_bytes: int = 0
    host_peak_bytes: int = 0
    cost: str = "nothing"  # one of COSTS

    @property
    def extra_pct(self) -> float:
        return 100.0 * self.extra_flops / self.forward_flops if self.forward_flops else 0.0

    def rank_key(self):
        return (not self.fits, COSTS.index(self.cost), self.extra_flops, self.moved_bytes,
                self.peak_bytes or 0)


@dataclass
class Explanation:
    """Whether ``batch`` fits ``config``; if not, the runtime's account of where it failed, the run
    without a budget (``need``: its peak, the step and the tensors live there) and the ranked changes."""

    net: str
    batch: int
    config: MemoryConfig
    fits: bool
    message: str = ""
    need: Measurement | None = None
    suggestions: list[Suggestion] = field(default_factory=list)
    ran_out: str = "device"  # the budget that ran out: "device" (budget_bytes) or "host" (host_budget_bytes)
    # where the host budget ran out: the pinned bytes it needs with the device budget kept (under it the
    # cache parks more on the host than a run without budgets does); None where the device budget fails
    host_needed: int | None = None


def _changes(c: MemoryConfig) -> list[tuple[str, str, dict]]:
    out = []
    if not c.liveness:
        out.append(("--liveness", "turn on liveness analysis", {"liveness": True}))
    if not c.offload:
        out.append(("--offload", "offload CONV outputs to the host", {"offload": True}))
    if not c.cache:
        out.append(("--cache", "turn on the LRU tensor cache", {"cache": True}))
    if c.recompute not in ("cost_aware", "memory"):
        out.append(("--recompute cost_aware", "cost-aware recomputation", {"recompute": "cost_aware"}))
    if c.recompute != "memory":
        out.append(("--recompute memory", "memory-centric recomputation", {"recompute": "memory"}))
    if not c.update_in_backward:
        out.append(("--update-in-backward", "each layer's SGD step in backward, freeing its gradient",
                    {"update_in_backward": True}))
    if c.optimizer_state == "device":
        out.append(("--optimizer-state auto", "momentum to pinned host memory if the device is full",
                    {"optimizer_state": "auto"}))
    if c.workspace != "none":
        out.append(("--workspace none", "no convolution workspace", {"workspace": "none"}))
    return out


def _host_changes(c: MemoryConfig) -> list[tuple[str, str, dict]]:
    """The changes that pin less host memory (the staged batch and results stay: a smaller batch)."""
    out = []
    if c.offload:
        out.append(("--no-offload", "keep CONV outputs on the device", {"offload": False}))
    if c.cache:
        out.append(("--no-cache", "no LRU tensor cache: nothing evicted to the host", {"cache": False}))
    if c.optimizer_state != "device":
        out.append(("--optimizer-state device", "keep SGD's momentum on the device",
                    {"optimizer_state": "device"}))
    return out


def _cost(m: Measurement, changes: dict, need: Measurement) -> str:
    """What a change costs, by what it turns on (offload and the cache cost nothing if they moved
    nothing). Offline placement places the same program: it costs nothing unless fitting the budget
    made it move more bytes than the run without a budget (the cache evicting), or choose another
    convolution algorithm than that run's fastest (less room for the workspace)."""
    moved = 1 if m.moved_bytes else 0
    rank = {"liveness": 0, "update_in_backward": 0, "offload": moved, "cache": moved,
            "optimizer_state": moved, "workspace": 2, "recompute": 3}
    costs = [rank[k] for k in changes if k != "fit"]
    if "fit" in changes:
        costs.append(2 if m.trace.conv_choices != need.trace.conv_choices
                     else 1 if m.moved_bytes > need.moved_bytes else 0)
    return COSTS[max(costs)]


def explain_budget(build, batch: int, config: MemoryConfig) -> Explanation:
    """Does ``build(batch)`` fit ``config``'s budgets (``budget_bytes``, ``host_budget_bytes`` or
    both)? If not: why (the runtime's message, and the run without a budget), and every change not
    already on, each simulated under the same budgets (liveness, offload, the cache, cost-aware or
    memory-centric recomputation, updating in backward, ``optimizer_state="auto"``, no workspace,
    all of them together; offline placement, where a first or best fit pool's fragmentation may be
    what failed, alone and with all the rest; and the largest batch that fits as it is), ranked:
    those that fit first; then by what they cost: nothing < bytes moved < slower convolutions < extra
    FLOPs < a smaller batch; then fewer extra FLOPs, fewer bytes moved, a lower peak. Where the host
    budget ran out (``ran_out`` "host"), the changes are those that pin less: no offload, no cache,
    the momentum on the device, all of them together, a smaller batch."""
    if config.budget_bytes is None and config.host_budget_bytes is None:
        raise ValueError("explain_budget needs a budget (config.budget_bytes or config.host_budget_bytes)")
    config = config.replace(count="all")
    graph = build(batch)
    try:
        simulate(graph, config)
        return Explanation(graph.name, batch, config, True)
    except BudgetError as e:
        message, ran_out = str(e), "host" if isinstance(e, HostBudgetError) else "device"
    need = measure(graph, config.replace(budget_bytes=None, host_budget_bytes=None))
    changes = _host_changes(config) if ran_out == "host" else _changes(config)
    together = [c for c in changes if c[0] != "--recompute memory" or config.recompute == "cost_aware"]
    all_flags, all_kw = " ".join(flag for flag, _, _ in together), {k: v for _, _, kw in together
                                                                     for k, v in kw.items()}
    if len(together) > 1:
        changes.append((all_flags, "all of the above together", all_kw))
    if ran_out == "device" and config.allocator == "pool" and config.fit != "offline":
        changes.append(("--fit offline", "offline placement, from the lifetimes", {"fit": "offline"}))
        if together:
            changes.append((f"{all_flags} --fit offline", "all of the above, placed offline",
                            {**all_kw, "fit": "offline"}))
    suggestions = []
    for flag, what, kw in changes:
        m = measure(graph, config.replace(**kw))
        suggestions.append(Suggestion(flag, what, config.replace(**kw), batch, bool(m.fits), m.peak_bytes,
                                      need.peak_bytes - m.peak_bytes, m.trace.extra_flops, m.forward_flops,
                                      m.moved_bytes, m.trace.host_peak_bytes, _cost(m, kw, need)))
    if batch > 1:
        found = max_batch(build, config, lo=1, hi=batch - 1)
        if found.value is not None:
            t = found.trace
            suggestions.append(Suggestion(f"--batch {found.value}",
                                          "the largest batch that fits as configured",
                                          config, found.value, True, t.peak_bytes,
                                          need.peak_bytes - t.peak_bytes, t.extra_flops,
                                          build(found.value).flops(), t.d2h_bytes + t.h2d_bytes,
                                          t.host_peak_bytes, "a smaller batch"))
    suggestions.sort(key=Suggestion.rank_key)
    host_needed = None
    if ran_out == "host":
        lifted = measure(graph, config.replace(host_budget_bytes=None))
        host_needed = lifted.program.slab_bytes if lifted.fits is not False else None  # (None: none left)
    return Explanation(graph.name, batch, config, False, message, need, suggestions, ran_out, host_needed)
