"""The trace: what the runtime did, op by op, and the totals people ask about.

Every byte here is what the pool reserved (requests rounded up to its blocks), so the trace of a
run on the meta device equals, byte for byte, what the host and CUDA devices then hold.

Categories: ``weights`` (weights and BatchNorm buffers), ``weight_grads``, ``optimizer``
(momentum), ``input`` (the batch and its labels), ``activations`` (layer outputs and what
forward saves for backward), ``gradients`` (activation gradients), ``workspace`` (conv),
``in_flight`` (a device copy still held while it is copied to the host). The paper's count
(``count="paper"``) is activations + gradients.
"""
from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES = ("weights", "weight_grads", "optimizer", "input", "activations", "gradients", "workspace", "in_flight")
KIND_CATEGORY = {"weight": "weights", "buffer": "weights", "weight_grad": "weight_grads", "optimizer": "optimizer",
                 "input": "input", "activation": "activations", "gradient": "gradients", "workspace": "workspace"}
PAPER_CATEGORIES = ("activations", "gradients")


def counted(device_bytes: dict, count: str) -> int:
    """Bytes that count under ``count`` ("all" or "paper")."""
    cats = PAPER_CATEGORIES if count == "paper" else CATEGORIES
    return sum(device_bytes.get(c, 0) for c in cats)


@dataclass(frozen=True)
class StepRecord:
    """The device's state at the busiest moment of one op (its inputs, outputs and workspace held)."""

    op: int
    step: int
    layer: str
    phase: str
    device_bytes: dict  # category -> bytes
    host_bytes: int
    live_tensors: int
    counted_bytes: int  # under the trace's count
    working_set_bytes: int  # l_i: what this op itself touches, under the same count


@dataclass(frozen=True)
class ConvChoice:
    step: int
    layer: str
    op: str  # forward, backward_data, backward_filter
    algo: str
    chunk: int
    workspace_bytes: int


@dataclass
class Trace:
    count: str = "all"
    steps: list[StepRecord] = field(default_factory=list)
    peak_bytes: int = 0
    peak_step: int = -1
    peak_op: int = -1
    peak_tensors: tuple = ()  # (name, bytes) resident at the peak, largest first
    l_peak_bytes: int = 0
    recompute_count: int = 0
    extra_flops: int = 0
    d2h_bytes: int = 0
    h2d_bytes: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    host_peak_bytes: int = 0
    conv_choices: list[ConvChoice] = field(default_factory=list)
    arena_bytes: int = 0

    @property
    def ratio(self) -> float:
        """peak / l_peak: the paper's aim is about 1."""
        return self.peak_bytes / self.l_peak_bytes if self.l_peak_bytes else float("nan")

    def summary(self) -> str:
        mib = 1 << 20
        peak_layer = self.steps[self.peak_op].layer if 0 <= self.peak_op < len(self.steps) else "-"
        return "\n".join([
            f"peak {self.peak_bytes / mib:,.2f} MiB ({self.count} count) at step {self.peak_step} ({peak_layer}); "
            f"l_peak {self.l_peak_bytes / mib:,.2f} MiB; peak/l_peak {self.ratio:.2f}",
            f"recomputed {self.recompute_count} layer forwards (+{self.extra_flops:,d} FLOPs); "
            f"to host {self.d2h_bytes / mib:,.2f} MiB, back {self.h2d_bytes / mib:,.2f} MiB; "
            f"cache hits {self.cache_hits}, misses {self.cache_misses}; host peak {self.host_peak_bytes / mib:,.2f} MiB",
        ])

    def table(self, limit: int | None = None) -> str:
        """One row per op: bytes by category (KiB)."""
        short = {"weights": "wts", "weight_grads": "wgrad", "optimizer": "opt", "input": "input",
                 "activations": "act", "gradients": "grad", "workspace": "wksp", "in_flight": "flight"}
        head = f"{'op':>5} {'step':>5} {'layer':22} {'phase':9}" + "".join(f"{short[c]:>9}" for c in CATEGORIES)
        rows = [head + f"{'host':>9}{'counted':>10}"]
        for r in self.steps[:limit]:
            rows.append(f"{r.op:>5} {r.step:>5} {r.layer[:22]:22} {r.phase:9}"
                        + "".join(f"{r.device_bytes.get(c, 0) // 1024:>9,d}" for c in CATEGORIES)
                        + f"{r.host_bytes // 1024:>9,d}{r.counted_bytes // 1024:>10,d}")
        return "\n".join(rows)
