"""Validation: a program's numbers checked against each other before the race search trusts them.

The race checker (:mod:`snlite.checker`) reasons about byte ranges, and the executor
(:mod:`snlite.executor`) views every tensor by its spec's shape and copies whole views. So a hand-edited
program whose ``Alloc`` is smaller than its tensor, whose copy moves another number of bytes or lands
at another tensor's offset, or whose arena is smaller than its allocations, would be certified "no
races" and then run wrong. :func:`validate` refuses such a program, in one pass over setup and body
(linear: the programs of deep nets have hundreds of thousands of instructions). It holds the program
to what the placement pass (:mod:`snlite.placement`) guarantees:

- the header: a known mode and allocator, ``arena_bytes`` and ``slab_bytes`` non-negative integers,
  ``stats`` counts (the recomputation's, where counted, as the body's recompute launches make it);
- every tensor spec: a shape of positive integers (``None`` only for a conv workspace, sized by its
  Alloc), a known dtype and kind; with the net's ``graph``, the graph's shapes, dtypes and kinds, and
  no tensor the net does not have (besides momentum, workspaces and the staging slots ``NAME:in`` and
  ``NAME:out``);
- every instruction: fields of the right types, known streams (a copy on ``copy_out`` to the host, on
  ``copy_in`` to the device), spaces that match the allocator, known copy and wait reasons, phases;
- an ``Alloc``: whole blocks at an aligned offset (the arena: 1 KiB; the slab and raw allocations:
  256 bytes), at least its tensor's bytes, inside ``arena_bytes`` or ``slab_bytes``; a raw handle not
  held by a live allocation; a tensor not already placed in that space;
- a ``Free``: the space, offset and size of that tensor's live allocation;
- a ``HandOver``: the old tensor holds a device block, the new one none, both of the same size;
- a ``Copy``: exactly its tensor's bytes, from or to that tensor's own live device allocation (its
  arena offset or raw handle), to or from the start of a live pinned slot made for that tensor (named
  after it: ``NAME``, or the staging slots ``NAME:in``, ``NAME:out``); ``HostWrite`` and
  ``HostRead`` likewise;
- a ``Launch``: every tensor it names known (incarnations such as ``relu1#r2`` resolve to their
  original), its layer one of the net's (with ``graph``), its workspace a live block of a workspace
  tensor large enough for the conv algorithms it names.

Each refusal is a :class:`ProgramError` of one line: where (setup or body and the index), the
instruction, the number that is wrong and what it should be.
"""
from __future__ import annotations

import dataclasses
import math

from kernels.conv import ALGORITHMS
from snlite.program import COPY_REASONS, HOST, MODES, STREAMS, WAIT_REASONS, Alloc, Copy, Free, HandOver, \
    HostRead, HostWait, HostWrite, Launch, Record, Wait, program_of
from snlite.workspace import CONV_OPS

ALLOCATORS = {"pool": "arena", "raw": "raw"}  # the allocator -> the space device tensors live in
BLOCK = {"arena": 1024, "slab": 256, "raw": 256}  # TensorPool blocks, HostPool slots, cudaMalloc alignment
ITEMSIZE = {"float32": 4, "float16": 2, "float64": 8, "int32": 4, "int64": 8, "uint8": 1, "bool": 1}
KINDS = ("input", "weight", "weight_grad", "buffer", "optimizer", "activation", "gradient", "workspace")
PHASES = ("forward", "backward", "recompute", "update")
STAGING = (":in", ":out")  # the batch staged in NAME:in, results read back from NAME:out


class ProgramError(ValueError):
    """The program is malformed: a number that contradicts the rest of it, overlapping allocations, use
    after free, an unrecorded event."""


def validate(program, graph=None) -> None:
    """Raise :class:`ProgramError` at the first number of ``program`` that contradicts the rest of it
    (or ``graph``, the net it was planned for, when given)."""
    program = program_of(program)
    _header(program)
    nbytes = _tensors(program, graph)
    v = _Validator(program, nbytes, graph)
    for part, seq in (("setup", program.setup), ("body", program.body)):
        if not isinstance(seq, tuple):
            raise ProgramError(f"the {part} is a {type(seq).__name__}, not a tuple of instructions")
        for i, ins in enumerate(seq):
            v.at = (part, i, ins)
            v.check(ins)
    _stats(program, graph)


# ---------------------------------------------------------------------------- the header and the tensors
def _header(program) -> None:
    if program.mode not in MODES:
        raise ProgramError(f"mode {program.mode!r} is not one of {MODES}")
    if program.allocator not in ALLOCATORS:
        raise ProgramError(f"allocator {program.allocator!r} is not one of {tuple(ALLOCATORS)}")
    for name in ("net", "config"):
        if not isinstance(getattr(program, name), str):
            raise ProgramError(f"{name} is {getattr(program, name)!r:.60}; it should be text, the "
                               + ("net's name" if name == "net" else "configuration's description"))
    for name in ("arena_bytes", "slab_bytes"):
        value = getattr(program, name)
        if not _is_int(value) or not 0 <= value < 2**63:
            raise ProgramError(f"{name} is {value!r}; it should be a number of bytes >= 0 (and less than "
                               "2**63, a 64-bit address space)")
    if not isinstance(program.tensors, dict):
        raise ProgramError(f"tensors is a {type(program.tensors).__name__}, not a dict of name -> "
                           "(shape, dtype, kind)")
    if not isinstance(program.stats, dict):
        raise ProgramError(f"stats is a {type(program.stats).__name__}, not a dict of what the placement "
                           "counted")


COPY_TO_HOST = ("offload", "evict", "state", "result")  # the reasons of each direction ("state": momentum)
COPY_TO_DEVICE = ("prefetch", "fetch", "state", "input")

STATS = {"cache_hits": "the cache's hits", "cache_misses": "the cache's misses",
         "recompute_count": "recomputed ops", "extra_flops": "the recomputations' FLOPs"}


def _stats(program, graph) -> None:
    """What the placement counted without an instruction of its own: counts (>= 0), the optimizer
    state's place; the recomputation's count (and, given the net, its FLOPs), where counted, as the
    launches say."""
    stats = program.stats
    for key, value in stats.items():
        if key == "optimizer_state":
            if value not in ("device", "host"):
                raise ProgramError(f"stats: optimizer_state is {value!r}, not 'device' or 'host'")
        elif key not in STATS:
            raise ProgramError(f"stats: {key!r} is not one of {(*STATS, 'optimizer_state')}")
        elif not _is_int(value) or value < 0:
            raise ProgramError(f"stats: {key} ({STATS[key]}) is {value!r}, not a count >= 0")
    recomputed = [ins.layer for ins in program.body if type(ins) is Launch and ins.phase == "recompute"]
    said = {"recompute_count": len(recomputed)}
    if graph is not None:
        said["extra_flops"] = sum(graph.layers[layer].flops() for layer in recomputed)
    for key, value in said.items():
        if key in stats and stats[key] != value:  # a program that only runs the backward counts none
            raise ProgramError(f"stats: {key} is {stats[key]!r}, but the body's recompute launches make it "
                               f"{value:,d}")


def _tensors(program, graph) -> dict:
    """Each tensor's bytes (None for a workspace, sized by its Alloc), once its spec is checked."""
    out = {}
    for name, spec in program.tensors.items():
        if not isinstance(spec, tuple) or len(spec) != 3:
            raise ProgramError(f"tensor {name!r}: spec {spec!r} should be (shape, dtype, kind)")
        shape, dtype, kind = spec
        if kind not in KINDS:
            raise ProgramError(f"tensor {name}: kind {kind!r} is not one of {KINDS}")
        if dtype not in ITEMSIZE:
            raise ProgramError(f"tensor {name}: dtype {dtype!r} is not one of {tuple(ITEMSIZE)}")
        if shape is None:
            if kind != "workspace":
                raise ProgramError(f"tensor {name}: shape None, which only a workspace "
                                   "(sized by its Alloc) may have")
            out[name] = None
            continue
        if not isinstance(shape, tuple) or not shape or not all(_is_int(d) and d > 0 for d in shape):
            raise ProgramError(f"tensor {name}: shape {shape!r} should be a tuple of positive integers")
        out[name] = math.prod(shape) * ITEMSIZE[dtype]
    if graph is not None:
        against_graph(program, graph)
    return out


def against_graph(program, graph) -> None:
    """The program's tensors are the net's: the same shapes, dtypes and kinds, and nothing else but
    momentum, workspaces and staging slots (ProgramError otherwise: a graph of another batch, say)."""
    specs = graph.tensors()
    for name, (shape, dtype, kind) in program.tensors.items():
        t = specs.get(name)
        if t is None:
            base = name[:-len(".momentum")] if name.endswith(".momentum") else None
            staged = next((name[:-len(s)] for s in STAGING if name.endswith(s)), None)
            if base is not None and base in specs and specs[base].kind == "weight":
                t = dataclasses.replace(specs[base], name=name, kind="optimizer")
            elif staged is not None and staged in specs:
                t = specs[staged]
            elif (kind == "workspace" and name.endswith(".workspace")
                  and name[:-len(".workspace")] in graph.layers):
                continue
            else:
                raise ProgramError(f"tensor {name}: {graph.name} has no such tensor (nor is it momentum, a "
                                   "workspace or a staging slot)")
        if tuple(t.shape) != shape or t.dtype != dtype or t.kind != kind:
            raise ProgramError(f"tensor {name}: ({shape}, {dtype}, {kind}) in the program, but "
                               f"({tuple(t.shape)}, {t.dtype}, {t.kind}) in {graph.name}")
    if program.net != graph.name:
        net = program.net
        raise ProgramError(f"the program is for net {net!r}, the graph given is {graph.name!r}: check it "
                           f"against the graph it was planned for (from_torch(..., name={net!r}) or "
                           f"Graph(..., name={net!r}) names one so)")


# ---------------------------------------------------------------------------- the instructions
FIELD_TYPES = {"str": (str,), "int": (int,), "str | None": (str, type(None)), "tuple": (tuple,)}
FIELDS = {cls: [(f.name, FIELD_TYPES[f.type]) for f in dataclasses.fields(cls)]
          for cls in (Alloc, Free, HandOver, Copy, Record, Wait, HostWait, HostWrite, HostRead, Launch)}


class _Validator:
    """The pass: live allocations by (space, tensor), raw handles held, and the current instruction."""

    def __init__(self, program, nbytes: dict, graph):
        self.program, self.nbytes, self.graph = program, nbytes, graph
        self.device = ALLOCATORS[program.allocator]
        self.limit = {"arena": program.arena_bytes, "slab": program.slab_bytes}
        self.live: dict[tuple, tuple] = {}  # (space, tensor) -> (offset, nbytes); device space: arena or raw
        self.handles: dict[int, str] = {}  # raw handle -> the tensor holding it
        self.at = None

    def fail(self, what: str):
        part, i, ins = self.at
        try:
            text = str(ins)
        except (TypeError, ValueError):
            text = repr(ins)
        raise ProgramError(f"{part} #{i} ({text}): {what}")

    def check(self, ins) -> None:
        handler = self._handlers.get(type(ins))
        if handler is None:
            self.fail(f"a {type(ins).__name__}, not an instruction")
        for name, types in FIELDS[type(ins)]:
            value = getattr(ins, name)
            if not isinstance(value, types) or (value.__class__ is bool):
                self.fail(f"{name} is {value!r}, which should be {' or '.join(t.__name__ for t in types)}")
        handler(self, ins)

    # ------------------------------------------------------------ names and sizes
    def bytes_of(self, name: str) -> int | None:
        """A known tensor's bytes (an incarnation's are its original's); None for a workspace."""
        base = name.split("#", 1)[0]
        if base not in self.nbytes:
            self.fail(f"{name} is not a tensor of the program (its tensors do not name {base})")
        return self.nbytes[base]

    def slot_owner(self, name: str) -> str:
        """The tensor a pinned slot is made for: ``NAME``, ``NAME:in`` or ``NAME:out`` hold NAME."""
        for suffix in STAGING:
            if name.endswith(suffix):
                return name[:-len(suffix)]
        return name

    def stream(self, ins, allowed, what="stream") -> None:
        if ins.stream not in allowed:
            self.fail(f"{what} {ins.stream!r} is not one of {tuple(allowed)}")

    def space(self, space: str) -> None:
        if space not in ("slab", self.device):
            self.fail(f"space {space!r}: a program of the {self.program.allocator} allocator places tensors "
                      f"in the {self.device} and the slab")

    def device_block(self, tensor: str) -> tuple:
        loc = self.live.get((self.device, tensor))
        if loc is None:
            self.fail(f"{tensor} holds no {self.device} allocation here (never allocated, or already freed)")
        return loc

    # ------------------------------------------------------------ one handler per instruction type
    def _alloc(self, ins: Alloc) -> None:
        self.space(ins.space)
        owner = self.slot_owner(ins.tensor) if ins.space == "slab" else ins.tensor
        need = self.bytes_of(owner)
        self.stream(ins, STREAMS if ins.space == "raw" else (None,),
                    "stream (a raw allocation's fill runs on one)")
        block, word = BLOCK[ins.space], {"arena": "offset", "slab": "offset", "raw": "handle"}[ins.space]
        if ins.offset < 0:
            self.fail(f"{word} {ins.offset} is negative")
        if ins.space != "raw" and ins.offset % block:
            self.fail(f"offset {ins.offset:#x} is not a multiple of {block} (the {ins.space}'s blocks)")
        least = block * -(-max(need or 0, 1) // block)
        if ins.nbytes < least or ins.nbytes % block:
            size = "its conv workspace" if need is None else f"{owner}'s {need:,d} bytes"
            self.fail(f"nbytes {ins.nbytes:,d} should be at least {least:,d}, in whole {block}-byte blocks "
                      f"({size})")
        if ins.space != "raw" and ins.offset + ins.nbytes > self.limit[ins.space]:
            self.fail(f"ends at {ins.offset + ins.nbytes:#x}, past {ins.space}_bytes "
                      f"{self.limit[ins.space]:,d}; {ins.space}_bytes should be at least "
                      f"{ins.offset + ins.nbytes:,d}")
        if (ins.space, ins.tensor) in self.live:
            self.fail(f"{ins.tensor} already holds a live {ins.space} allocation")
        if ins.space == "raw":
            if ins.offset in self.handles:
                self.fail(f"handle {ins.offset} is still held by {self.handles[ins.offset]}; a new "
                          "allocation needs a new handle")
            self.handles[ins.offset] = ins.tensor
        self.live[ins.space, ins.tensor] = (ins.offset, ins.nbytes)

    def _free(self, ins: Free) -> None:
        self.space(ins.space)
        self.stream(ins, (*STREAMS, HOST))
        loc = self.live.pop((ins.space, ins.tensor), None)
        if loc is None:
            self.fail(f"{ins.tensor} holds no live {ins.space} allocation to free")
        if (ins.offset, ins.nbytes) != loc:
            word = "handle" if ins.space == "raw" else "offset"
            self.fail(f"{word} {ins.offset:#x}, nbytes {ins.nbytes:,d}, but {ins.tensor}'s allocation is "
                      f"{word} {loc[0]:#x}, nbytes {loc[1]:,d}")
        if ins.space == "raw":
            del self.handles[ins.offset]

    def _hand_over(self, ins: HandOver) -> None:
        new, old = self.bytes_of(ins.new), self.bytes_of(ins.old)
        loc = self.device_block(ins.old)
        if (self.device, ins.new) in self.live:
            self.fail(f"{ins.new} already holds a block of its own")
        if new != old:
            self.fail(f"{ins.new} has {new:,d} bytes, but the block it takes over holds {ins.old}'s {old:,d}")
        del self.live[self.device, ins.old]
        self.live[self.device, ins.new] = loc
        if self.device == "raw":
            self.handles[loc[0]] = ins.new

    def _copy(self, ins: Copy) -> None:
        if ins.why not in COPY_REASONS:
            self.fail(f"reason {ins.why!r} is not one of {COPY_REASONS}")
        to_host = ins.dst == "slab"
        if ins.why not in (COPY_TO_HOST if to_host else COPY_TO_DEVICE):
            way = ("to the device", "device -> host") if to_host else ("to the host", "host -> device")
            self.fail(f"reason {ins.why!r} is a copy {way[0]}, but this one goes {way[1]}")
        device, device_offset = (ins.src, ins.src_offset) if to_host else (ins.dst, ins.dst_offset)
        slab_side, slab_offset = (ins.dst, ins.dst_offset) if to_host else (ins.src, ins.src_offset)
        if slab_side != "slab" or device != self.device:
            self.fail(f"copies {ins.src} -> {ins.dst}; a copy goes between the {self.device} and the slab")
        self.stream(ins, ("copy_out",) if to_host else ("copy_in",), "stream (a copy to the "
                    f"{'host runs on copy_out' if to_host else 'device runs on copy_in'})")
        need = self.bytes_of(ins.tensor)
        if ins.nbytes != need:
            self.fail(f"nbytes {ins.nbytes:,d}, but {ins.tensor} has {need:,d} bytes")
        block = self.device_block(ins.tensor)
        if device_offset != block[0]:
            word = "handle" if device == "raw" else "offset"
            self.fail(f"{device} {word} {device_offset:#x}, but {ins.tensor}'s block is at {block[0]:#x}")
        self.slot(ins.tensor, slab_offset, need)

    def slot(self, tensor: str, offset: int, need: int) -> None:
        """``offset`` is the start of a live pinned slot made for ``tensor``, which holds ``need`` bytes."""
        for name in (tensor, *(tensor + s for s in STAGING)):
            loc = self.live.get(("slab", name))
            if loc is not None and loc[0] == offset:
                if need > loc[1]:
                    self.fail(f"{need:,d} bytes do not fit the {loc[1]:,d} of slot {name}")
                return
        slots = [f"{n} at {self.live['slab', n][0]:#x}" for n in (tensor, *(tensor + s for s in STAGING))
                 if ("slab", n) in self.live]
        self.fail(f"slab offset {offset:#x} is not the start of a live pinned slot made for {tensor} (its "
                  f"slots: {', '.join(slots) or 'none'})")

    def _event(self, ins) -> None:
        if type(ins) is HostWait:
            self.stream(ins, (HOST,))
        else:
            self.stream(ins, STREAMS)
        if type(ins) is Wait and ins.why and ins.why not in WAIT_REASONS:
            self.fail(f"reason {ins.why!r} is not one of {tuple(WAIT_REASONS)}")

    def _host(self, ins) -> None:
        self.stream(ins, (HOST,))
        need = self.bytes_of(ins.tensor)
        if ins.nbytes != need:
            self.fail(f"nbytes {ins.nbytes:,d}, but {ins.tensor} has {need:,d} bytes")
        self.slot(ins.tensor, ins.offset, need)

    def _launch(self, ins: Launch) -> None:
        self.stream(ins, STREAMS)
        if ins.op < -1:
            self.fail(f"op {ins.op} should be its op's index (>= 0), or -1 for an SGD update after backward")
        if ins.phase not in PHASES:
            self.fail(f"phase {ins.phase!r} is not one of {PHASES}")
        if self.graph is not None and ins.layer not in self.graph.layers:
            self.fail(f"layer {ins.layer!r} is not a layer of {self.graph.name}")
        for field in ("reads", "writes", "accumulate"):
            for name in getattr(ins, field):
                if not isinstance(name, str):
                    self.fail(f"{field} names {name!r}, which is not a tensor name")
                self.bytes_of(name)
        for field in ("inplace", "names"):
            for pair in getattr(ins, field):
                if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(n, str) for n in pair)):
                    self.fail(f"{field} holds {pair!r}, which should be a pair of tensor names")
                for name in pair:
                    self.bytes_of(name)
        largest = 0
        for conv in ins.convs:
            if not (isinstance(conv, tuple) and len(conv) == 4 and isinstance(conv[0], str)
                    and isinstance(conv[1], str) and _is_int(conv[2]) and conv[2] > 0 and _is_int(conv[3])
                    and conv[3] >= 0):
                self.fail(f"convs holds {conv!r}, which should be (conv op, algorithm, images per chunk >= "
                          "1, workspace bytes >= 0)")
            if conv[0] not in CONV_OPS or conv[1] not in ALGORITHMS:
                self.fail(f"convs holds {conv!r}: a conv op is one of {CONV_OPS}, an algorithm one of "
                          f"{ALGORITHMS}")
            largest = max(largest, conv[3])
        if ins.workspace is not None:
            if self.program.tensors.get(ins.workspace, (0, 0, None))[2] != "workspace":
                self.fail(f"workspace {ins.workspace} is not a workspace tensor of the program")
            block = self.device_block(ins.workspace)
            if block[1] < largest:
                self.fail(f"the workspace block holds {block[1]:,d} bytes, but the conv algorithms need "
                          f"{largest:,d}")
        elif largest:
            self.fail(f"the conv algorithms need a workspace of {largest:,d} bytes, but the "
                      "launch names none")

    # each instruction's check, as plain functions (bound methods held by the pass would make a cycle)
    _handlers = {Alloc: _alloc, Free: _free, HandOver: _hand_over, Copy: _copy, Record: _event, Wait: _event,
                 HostWait: _event, HostWrite: _host, HostRead: _host, Launch: _launch}


def _is_int(v) -> bool:
    return isinstance(v, int) and v.__class__ is not bool


__all__ = ["ProgramError", "against_graph", "validate"]
