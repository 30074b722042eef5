"""What a report of ``snlite paper`` holds and how it reads: :class:`Table`, :class:`Section` and
:class:`Report` (each renders itself as Markdown), the report's header, and the constants and
formatting every section shares (the paper's 12 GiB, the two counts, sizes in GB)."""
from __future__ import annotations

import datetime
import platform
from dataclasses import dataclass, field

from snlite.version import __version__

GIB = 1 << 30
MIB = 1 << 20
BUDGET = 12 * GIB  # the paper's GPU (12 GB K40), as a pool size
PAPER_COUNT = "paper count: activations + gradients"
ALL_COUNT = ("count all: everything on the device (weights, their gradients, momentum, the batch, "
             "activations, gradients, workspace)")


# ---------------------------------------------------------------------------- what a report holds
@dataclass
class Table:
    """A table and what it counts (``caption``); ``align`` per column, < or > (default: first left)."""

    caption: str
    head: list[str]
    rows: list[list]
    align: str | None = None

    def markdown(self) -> str:
        """A Markdown table, padded so that it also reads as plain text."""
        align = self.align or "<" + ">" * (len(self.head) - 1)
        cells = [[str(c) for c in r] for r in [self.head] + self.rows]
        widths = [max(3, *(len(r[i]) for r in cells)) for i in range(len(self.head))]

        def line(r):
            padded = (c.ljust(w) if a == "<" else c.rjust(w) for c, a, w in zip(r, align, widths))
            return "| " + " | ".join(padded) + " |"
        rule = "|" + "|".join("-" * (w + 1) + (":" if a == ">" else "-") for a, w in zip(align, widths)) + "|"
        return "\n".join([line(cells[0]), rule] + [line(r) for r in cells[1:]])


@dataclass
class Section:
    """One experiment: an introduction, tables, notes under them, figures (paths relative to the report)."""

    title: str
    text: str
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)  # (path, alt text)
    seconds: float = 0.0

    def markdown(self) -> str:
        parts = [f"## {self.title}", self.text]
        for t in self.tables:
            parts += [f"*{t.caption}*", t.markdown()]
        parts += self.notes
        parts += [f"![{alt}]({path})" for path, alt in self.figures]
        parts.append(f"<sub>({self.seconds:.1f} s)</sub>")
        return "\n\n".join(parts)


@dataclass
class Report:
    sections: list[Section]
    path: str
    seconds: float
    quick: bool
    plots: str | None  # None: drawn; else why not


# ---------------------------------------------------------------------------- formatting
def gb(nbytes: int) -> str:
    """Decimal GB, as the paper writes its traffic."""
    return f"{nbytes / 1e9:.2f} GB"


def where(trace) -> str:
    r = trace.steps[trace.peak_op]
    return f"{trace.peak_step}: {r.layer} ({r.phase})" if r.op >= 0 else trace.peak_at()


def found_cell(f) -> str:
    """A search's result (search.Found) as a table cell: the value, >= at the ceiling, or none fits."""
    return "none fits" if f.value is None else (f">= {f.value:,d}" if f.capped else f"{f.value:,d}")


def header(command: str, quick: bool, missing: str | None, seconds: float) -> str:
    """The report's opening: what made it, when and how, and how to read its numbers."""
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    lines = [
        "# SuperNeurons' byte-accounting experiments, reproduced by snlite",
        f"Made by `{command}` on {when} with snlite {__version__} (Python {platform.python_version()}, "
        f"{platform.machine()}), in {seconds:.1f} s, on the meta device: no GPU, no data.",
        "## How to read this",
        "Every number is one training iteration (forward, backward, SGD with momentum) simulated by "
        "`snlite.simulate` on the meta device, which allocates exactly what a real run then allocates from "
        "the pool, byte for byte. Two counts appear, and every table says which: the paper's count "
        "(activations and their gradients, what the paper plots) and count all (everything on the device: "
        "weights, their gradients, momentum, the input batch, activations, gradients, conv workspace; what "
        "has to fit a GPU). \"Fits 12 GiB\" always means the simulation ran in a 12 GiB pool, never a "
        "comparison of peaks. Sizes are binary (MiB, GiB) except the traffic, in decimal GB as the paper "
        "writes it. Columns marked \"paper\" are the paper's figures (docs/paper.md section 7), measured by "
        "the authors on their runtime and a 12 GB K40: references to compare the shape against, not numbers "
        "we expect to match.",
    ]
    if quick:
        lines.append("**Quick run** (`--quick`): fewer networks, batches and strategies; run without "
                     "`--quick` for the full tables.")
    if missing:
        lines.append(f"**No figures**: {missing}; then run the command again. Every table is here "
                     "without them.")
    return "\n\n".join(lines)
