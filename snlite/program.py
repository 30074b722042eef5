"""The program: one training (or inference) iteration with every memory decision already made.

The placement pass (:mod:`snlite.placement`) turns the scheduler's plan into a program: a list of
plain, frozen instructions. Nothing is left to decide when it runs, so the same program runs on the
meta, host and CUDA devices (:mod:`snlite.executor`), is checked for races without a GPU
(:mod:`snlite.checker`), is timed and traced without running (:mod:`snlite.trace`), prints as a table
and round-trips through JSON::

    prog = snlite.place(graph, MemoryConfig.superneurons())
    print(prog.table(limit=40))
    prog.save("alexnet.json"); Program.load("alexnet.json") == prog     # True

Memory spaces: ``arena`` (the one device allocation, in 1 KiB blocks), ``slab`` (the one pinned host
allocation, in 256-byte slots) and ``raw`` (``allocator="raw"``: one device allocation per tensor,
``offset`` is its handle). Streams: ``compute`` runs kernels, ``copy_out`` device-to-host copies,
``copy_in`` host-to-device copies; ``host`` is the CPU thread that enqueues everything.

CUDA's ordering rules, which the checker encodes: work on one stream runs in order; ``Record(e, s)``
marks everything enqueued on ``s`` so far; ``Wait(e, s2)`` makes later work on ``s2`` start after that
mark; ``HostWait(e)`` blocks the CPU until it; a GPU instruction starts after every host instruction
before it (the host enqueued it afterwards). Nothing else orders two streams. A block freed on a
stream may be reused by later work on that stream at once; another stream must wait for it (the
rule of PyTorch's caching allocator).
"""
from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass, field

from snlite import files
from snlite.records import record, without_cycle_collection  # noqa: F401 (the passes import it from here)

COMPUTE, COPY_OUT, COPY_IN, HOST = "compute", "copy_out", "copy_in", "host"
STREAMS = (COMPUTE, COPY_OUT, COPY_IN)  # the device streams every program uses
SPACES = ("arena", "slab", "raw")
MODES = ("train", "grads", "update", "infer")  # a whole step; forward + backward; SGD alone; inference
COPY_REASONS = ("offload", "evict", "prefetch", "fetch", "state", "input", "result")  # state: optimizer state
FORMAT = "snlite-program/1"


# ---------------------------------------------------------------------------- instructions
@record
class Alloc:
    """``tensor`` gets ``nbytes`` (whole blocks) at ``offset`` of ``space``. Bookkeeping in the arena
    and the slab; with ``space="raw"`` one device allocation (handle ``offset``) whose NaN fill runs on
    ``stream``."""

    tensor: str
    space: str
    offset: int
    nbytes: int
    stream: str | None = None

    def __str__(self):
        fill = f" (filled with NaN on {self.stream})" if self.stream else ""
        return f"alloc {self.tensor} at {_where(self.space, self.offset)}, {_size(self.nbytes)}{fill}"


@record
class Free:
    """``tensor``'s block returns to its pool: from here, work on ``stream`` may reuse it at once;
    work on another stream must first wait for an event recorded on ``stream`` after this point."""

    tensor: str
    space: str
    offset: int
    nbytes: int
    stream: str = COMPUTE

    def __str__(self):
        return f"free {self.tensor} at {_where(self.space, self.offset)}"


@record
class HandOver:
    """An in-place write has happened: ``new`` now owns ``old``'s block, and ``old`` is dead."""

    new: str
    old: str

    def __str__(self):
        return f"{self.new} takes over {self.old}'s block"


@record
class Copy:
    """An asynchronous copy of ``nbytes`` of ``tensor`` on ``stream``, from ``src`` at ``src_offset``
    to ``dst`` at ``dst_offset``; ``why`` is one of :data:`COPY_REASONS`."""

    tensor: str
    why: str
    src: str
    src_offset: int
    dst: str
    dst_offset: int
    nbytes: int
    stream: str

    @property
    def to_host(self) -> bool:
        return self.dst == "slab"

    def __str__(self):
        return (f"copy {self.tensor} {'device -> host' if self.to_host else 'host -> device'} ({self.why}, "
                f"{_size(self.nbytes)}) {_where(self.src, self.src_offset)} -> "
                f"{_where(self.dst, self.dst_offset)}")


@record
class Record:
    """Event ``event`` marks everything enqueued on ``stream`` so far."""

    event: str
    stream: str

    def __str__(self):
        return f"record {self.event}"


WAIT_REASONS = {
    "ready": "a copy out waits until the kernels that wrote its tensor have finished",
    "reuse": "a copy into a block waits until the block's previous users have finished",
    "release": "compute waits until a copy has read a block, before freeing it",
    "landed": "compute waits until a copy into a block has finished, before reading it",
    "end": "the end of the iteration: compute waits for every copy stream",
}


@record
class Wait:
    """Later work on ``stream`` starts only after ``event``'s mark; ``why``: one of :data:`WAIT_REASONS`."""

    event: str
    stream: str
    why: str = ""

    def __str__(self):
        return f"wait for {self.event}" + (f" ({self.why})" if self.why else "")


@record
class HostWait:
    """The CPU blocks until ``event``'s mark has run (the end of an iteration)."""

    event: str
    stream: str = HOST

    def __str__(self):
        return f"host waits for {self.event}"


@record
class HostWrite:
    """The CPU writes an input of the iteration (the batch, its labels) into its pinned slot."""

    tensor: str
    offset: int
    nbytes: int
    stream: str = HOST

    def __str__(self):
        return f"host writes {self.tensor} into {_where('slab', self.offset)}"


@record
class HostRead:
    """The CPU reads a result (the loss, the logits) from its pinned slot."""

    tensor: str
    offset: int
    nbytes: int
    stream: str = HOST

    def __str__(self):
        return f"host reads {self.tensor} from {_where('slab', self.offset)}"


@record
class Launch:
    """One op of the plan: a layer step's kernels on ``stream``. ``reads``/``writes`` name the
    tensors (recomputed incarnations resolved); ``inplace`` pairs (new, old) write ``new`` into
    ``old``'s block; ``accumulate`` are fork gradients summed into the first output gradient first;
    ``convs`` the conv algorithms chosen, as (conv op, algorithm, images per chunk, workspace bytes);
    ``workspace`` the workspace tensor. ``phase`` "update" is one layer's SGD step."""

    op: int
    step: int
    layer: str
    phase: str  # forward, backward, recompute, update
    stream: str
    reads: tuple = ()
    writes: tuple = ()
    inplace: tuple = ()
    names: tuple = ()  # (tensor, incarnation) where a recomputed tensor stands in for its original
    accumulate: tuple = ()
    convs: tuple = ()
    workspace: str | None = None

    def __str__(self):
        algo = "".join(f"; {op} {a}" + (f" x{c}" if a != "direct" else "") for op, a, c, _ in self.convs)
        return f"launch {self.layer} {self.phase}" + (f" (op {self.op})" if self.op >= 0 else "") + algo


INSTRUCTIONS = {c.__name__: c for c in (Alloc, Free, HandOver, Copy, Record, Wait, HostWait, HostWrite,
                                        HostRead, Launch)}


def stream_of(ins) -> str | None:
    """The stream an instruction runs on; None for pure bookkeeping (a pool Alloc, a HandOver)."""
    return getattr(ins, "stream", None)


# ---------------------------------------------------------------------------- the program
@dataclass(frozen=True)
class Program:
    """One iteration of ``net`` under ``config``, fully resolved.

    ``setup`` places the persistent tensors (weights, their gradients, buffers, momentum) once;
    ``body`` is the iteration, run again every step. ``arena_bytes`` and ``slab_bytes`` are the
    high-water marks of the placement: the device and pinned host memory this program needs.
    ``tensors`` gives each tensor's ``(shape, dtype, kind)`` (recomputed incarnations such as
    ``relu1#r2`` use their original's). ``stats`` holds what the placement counted without an
    instruction of its own (cache hits and misses, recomputation)."""

    net: str
    config: str
    mode: str
    allocator: str
    tensors: dict
    setup: tuple
    body: tuple
    arena_bytes: int
    slab_bytes: int
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.body)

    def __repr__(self) -> str:  # one line, not every instruction
        return (f"Program({self.net!r}, {self.config!r}, mode={self.mode!r}, {len(self.setup):,d} setup and "
                f"{len(self.body):,d} body instructions, arena {self.arena_bytes:,d} bytes, slab "
                f"{self.slab_bytes:,d} bytes)")

    def spec(self, name: str) -> tuple:
        """``(shape, dtype, kind)`` of a tensor or one of its recomputed incarnations."""
        return self.tensors[name.split("#", 1)[0]]

    def launches(self):
        return (i for i in self.body if isinstance(i, Launch))

    def without(self, index: int) -> "Program":
        """This program with body instruction ``index`` removed (for mutation tests and lessons)."""
        return dataclasses.replace(self, body=self.body[:index] + self.body[index + 1:])

    def without_updates(self) -> "Program":
        """The same iteration without its SGD steps: gradients only (``Model.forward_backward``)."""
        body = tuple(i for i in self.body if not (isinstance(i, Launch) and i.phase == "update"))
        return dataclasses.replace(self, mode="grads", body=body)

    # ------------------------------------------------------------ reading it
    def table(self, limit: int | None = None, start: int = 0) -> str:
        """One row per body instruction: index, stream, what it does."""
        rows = [f"{self.net} under {self.config} ({self.mode}): {len(self.body):,d} instructions, arena "
                f"{_size(self.arena_bytes)}, pinned slab {_size(self.slab_bytes)}",
                f"{'#':>6}  {'stream':8}  instruction"]
        end = len(self.body) if limit is None else min(len(self.body), start + limit)
        for i in range(start, end):
            ins = self.body[i]
            rows.append(f"{i:>6}  {stream_of(ins) or '':8}  {ins}")
        if end < len(self.body):
            rows.append(f"... {len(self.body) - end:,d} more instructions")
        return "\n".join(rows)

    def diff(self, other: "Program", context: int = 2) -> str:
        """A unified diff of the two programs' tables (empty when they are the same)."""
        a, b = self.table().splitlines(), other.table().splitlines()
        return "\n".join(difflib.unified_diff(a, b, "a", "b", n=context, lineterm=""))

    # ------------------------------------------------------------ saving it
    def to_json(self) -> dict:
        return {"format": FORMAT, "net": self.net, "config": self.config, "mode": self.mode,
                "allocator": self.allocator, "arena_bytes": self.arena_bytes, "slab_bytes": self.slab_bytes,
                "stats": self.stats,
                "tensors": {n: [None if s is None else list(s), d, k]
                            for n, (s, d, k) in self.tensors.items()},
                "setup": [_ins_json(i) for i in self.setup], "body": [_ins_json(i) for i in self.body]}

    @classmethod
    def from_json(cls, data: dict) -> "Program":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            if isinstance(data, (str, bytes)):
                raise ValueError("Program.from_json takes the parsed JSON, a dict: "
                                 "from_json(json.loads(text)), or Program.load(path) for a file")
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            if isinstance(found, str) and found.startswith(FORMAT.split("/")[0] + "/"):
                raise ValueError(f"an snlite program of another format, {found!r}; this snlite reads "
                                 f"{FORMAT!r}: plan it again here (snlite plan NET --save-program FILE)")
            what = ("the numbers snlite plan --json writes, not a program (save one with snlite plan NET "
                    "--save-program FILE)" if isinstance(data, dict) and "totals" in data and "net" in data
                    else f"expected format {FORMAT!r}, found {found!r}")
            raise ValueError(f"not an snlite program: {what}")
        for name, (kind, what) in JSON_FIELDS.items():
            if name not in data:
                raise ValueError(f"a corrupt snlite program: it has no {name!r} ({what})")
            value = data[name]
            if not isinstance(value, kind) or isinstance(value, bool):  # 1e15, "6410240": no byte counts
                shown = f" {json.dumps(value)[:40]}" if isinstance(value, (int, float, str)) else ""
                raise ValueError(f"a corrupt snlite program: {name!r} is {_json_type(value)}{shown}, not "
                                 f"{JSON_TYPES[kind]} ({what})")
        tensors = {}
        for n, spec in data["tensors"].items():
            if not (isinstance(spec, list) and len(spec) == 3 and isinstance(spec[0], (list, type(None)))):
                raise ValueError(f"a corrupt snlite program: tensor {n!r} is {spec!r:.60}, not "
                                 "[shape, dtype, kind]")
            tensors[n] = (None if spec[0] is None else tuple(spec[0]), spec[1], spec[2])
        return cls(data["net"], data["config"], data["mode"], data["allocator"], tensors,
                   tuple(_ins_from(x, "setup", i) for i, x in enumerate(data["setup"])),
                   tuple(_ins_from(x, "body", i) for i, x in enumerate(data["body"])),
                   data["arena_bytes"], data["slab_bytes"], dict(data["stats"]))

    def save(self, path) -> None:
        """Write the program to ``path`` as JSON (whole or not at all: :mod:`snlite.files`)."""
        files.write_text(path, json.dumps(self.to_json(), separators=(",", ":")) + "\n")

    @classmethod
    def load(cls, path) -> "Program":
        try:
            with open(path) as f:
                data = json.load(f)
        except (ValueError, UnicodeDecodeError) as e:  # not JSON, not text, or a number of 5,000 digits
            what = ("not JSON" if isinstance(e, json.JSONDecodeError) else "not text (a binary file)"
                    if isinstance(e, UnicodeDecodeError) else "not JSON snlite reads")
            raise ValueError(f"{path}: {what} ({e}); a program is saved by Program.save or "
                             f"snlite plan NET --save-program FILE") from None
        return cls.from_json(data)


def program_of(program) -> Program:
    """``program``, refused unless it is a :class:`Program` (what :func:`snlite.simulate` returns, a
    Trace, is not; nor is a saved program's path or its JSON), saying how to get one."""
    if not isinstance(program, Program):
        raise ValueError(f"program must be a snlite.program.Program, got {type(program).__name__} "
                         f"{program!r:.60}; make one with snlite.place(graph, config), read a saved one with "
                         "Program.load(PATH) (its JSON: Program.from_json), or take a Model's "
                         "model.programs[model.step_mode]")
    return program


def _ins_json(ins) -> list:
    return [type(ins).__name__, [_listify(getattr(ins, f.name)) for f in dataclasses.fields(ins)]]


def _listify(v):
    return [_listify(x) for x in v] if isinstance(v, tuple) else v


def _tuplify(v):
    return tuple(_tuplify(x) for x in v) if isinstance(v, list) else v


JSON_FIELDS = {"net": (str, "the net's name"), "config": (str, "what the configuration was called"),
               "mode": (str, "train, grads, update or infer"), "allocator": (str, "pool or raw"),
               "tensors": (dict, "each tensor's [shape, dtype, kind]"), "setup": (list, "instructions"),
               "body": (list, "instructions"), "arena_bytes": (int, "bytes"), "slab_bytes": (int, "bytes"),
               "stats": (dict, "what the placement counted")}


JSON_TYPES = {str: "text", int: "a whole number", float: "a number", list: "a list", dict: "an object"}


def _json_type(value) -> str:
    """How JSON calls ``value``'s type: "a list", "text", "a number", "null"..."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return JSON_TYPES.get(type(value), type(value).__name__)


def _ins_from(x, part: str = "body", i: int = 0):
    """The instruction ``x`` (``[NAME, [field, ...]]``) at ``part`` #``i``; ValueError, naming it, if
    it is not one."""
    where = f"a corrupt snlite program: {part} #{i}"
    if not (isinstance(x, list) and len(x) == 2 and isinstance(x[0], str) and isinstance(x[1], list)):
        raise ValueError(f"{where} is {x!r:.60}, not [INSTRUCTION, [field, ...]]")
    name, values = x
    cls = INSTRUCTIONS.get(name)
    if cls is None:
        raise ValueError(f"{where}: unknown instruction {name!r}; known: {sorted(INSTRUCTIONS)}")
    fields = [f.name for f in dataclasses.fields(cls)]
    needed = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
    if not len(needed) <= len(values) <= len(fields):
        raise ValueError(f"{where}: {name} takes the fields ({', '.join(fields)}), got {len(values)} values")
    try:
        return cls(*(_tuplify(v) for v in values))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {name} {values!r:.60}: {e}") from None


def _where(space: str, offset: int) -> str:
    return f"raw #{offset}" if space == "raw" else f"{space}+{offset:#x}"


def format_size(nbytes: int | None) -> str:
    """``2.57 GiB``, ``812.0 MiB``, ``64.0 KiB``, ``512 B`` (binary units); ``-`` for None."""
    if nbytes is None:
        return "-"
    n = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.{2 if unit == 'GiB' else 1}f} {unit}"
        n /= 1024
    return f"{n:,.2f} GiB"


_size = format_size
