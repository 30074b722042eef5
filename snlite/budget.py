"""Does it fit? Budget questions answered by placing: whether one iteration fits a budget, and the
smallest budget that does. A search asks only "does it fit?", so it places without the cache's
time-aware second placement (which never raises the peak) and reuses the scheduler's plan, which
does not depend on the budget, across its probes.

The deepest network, the largest batch and the paper's "peak / l_peak" budget are :mod:`snlite.search`.
"""
from __future__ import annotations

import math

from snlite import placement
from snlite import workspace as ws
from snlite.checks import boolean, integer
from snlite.config import MemoryConfig, config_of
from snlite.errors import BudgetError
from snlite.graph import graph_of
from snlite.pipeline import place
from snlite.scheduler import Scheduler, optimizer_specs


def fits(graph, config: MemoryConfig, plan=None, costs=None, optimizer: bool = True) -> bool:
    """Whether one training iteration places within ``config``'s budgets (True where there are none)."""
    try:
        place(graph, config, "train" if optimizer else "grads", plan=plan, costs=costs, optimizer=optimizer,
              refine=False)
        return True
    except BudgetError:
        return False


def smallest_budget(graph, config: MemoryConfig, lo: int = 0, hi: int | None = None, block: int | None = None,
                    costs=None, optimizer: bool = True, host: bool = False) -> int:
    """The smallest ``budget_bytes`` (``host``: ``host_budget_bytes``), a multiple of ``block``
    (default: the pool's block, 1024 or 256), under which ``config`` places one training iteration,
    by a binary search over placements between ``lo`` and ``hi``. The answer always fits (it was
    placed). Fitting is not quite monotone in the budget, though (the dynamic workspace and the
    cache decide by what is free, and a larger arena can fragment where a smaller one did not), so
    a smaller budget the bisection skipped over can fit too: :func:`snlite.search.min_budget`
    searches up from the lower bound instead, for the paper's "peak / l_peak" figure."""
    graph, config = graph_of(graph), config_of(config)
    host = boolean(host, "smallest_budget's host")
    optimizer = boolean(optimizer, "smallest_budget's optimizer")
    lo = integer(lo, "smallest_budget's lo (bytes)", minimum=0)
    block = (256 if host else 1024) if block is None else integer(block, "smallest_budget's block (bytes)")
    if hi is not None and integer(hi, "smallest_budget's hi (bytes)") < lo:
        raise ValueError(f"smallest_budget's hi ({hi:,d} bytes) is below its lo ({lo:,d}): give hi >= lo, or "
                         "leave hi out (the unlimited arena)")
    field = "host_budget_bytes" if host else "budget_bytes"
    plan = Scheduler(graph, config).plan()  # the same for every budget: planned once
    # (a grads program cannot update in backward: it plans under its own config, each time)
    shared = plan if optimizer or not config.update_in_backward else None
    if hi is None:
        specs = {**graph.tensors(), **optimizer_specs(graph)} if optimizer else dict(graph.tensors())
        unlimited = placement.Placer(graph, config.replace(**{field: None}), plan, specs,
                                     costs or ws.CostModel(), "train")
        # a host budget holds the staged batch and results too, before the pool of what waits there
        hi = unlimited.layout.staging_bytes + unlimited.host.capacity_bytes if host else unlimited.capacity

    def fitting(nbytes):
        return fits(graph, config.replace(**{field: nbytes}), plan=shared, costs=costs, optimizer=optimizer)

    if not fitting(hi):
        raise BudgetError(f"{graph.name} does not fit even {hi:,d} bytes under {config.describe()}")
    # first_fitting tries the numbers above its lo: from lo's own block up (lo fits too: the answer)
    return first_fitting(lambda n: fitting(n * block), max(-(-lo // block) - 1, 0),
                         math.ceil(hi / block)) * block


def first_fitting(fitting, lo: int, hi: int | None = None, step: int = 1) -> int:
    """The smallest whole number above ``lo`` for which ``fitting`` holds, taking ``fitting(lo)`` to
    be False: by bisection of ``(lo, hi]`` where ``hi`` is known to fit, else by galloping up from
    ``lo`` first (``lo + step``, then steps twice as long) until a number fits. Fitting is taken to be
    monotone; where fragmentation bends that, the answer still fits and the number below it does not."""
    if hi is None:
        while not fitting(lo + step):
            lo, step = lo + step, 2 * step
        hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fitting(mid):
            hi = mid
        else:
            lo = mid
    return hi
