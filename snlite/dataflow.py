"""The dataflow check: every value a program reads was written first, in this iteration.

The race checker (:mod:`snlite.checker`) proves that no two streams touch the same bytes
unordered. It cannot see a program that is ordered but wrong: a kernel dropped from a hand-edited
program leaves its output's block holding whatever was there before; two kernels swapped read a
tensor before it is written; an SGD step moved before a backward step updates the weights that
backward still reads. This pass follows the program in its own order (one stream's order is
enough: the race checker has already shown every cross-stream access is ordered) and tracks,
for each tensor, whether its device block and its pinned slot hold its current value:

- a tensor's device block holds a value once a kernel writes it or a copy brings it from the
  host; a fresh block (a pool block, or a raw allocation's NaN fill) holds none; an in-place
  write (``Launch.inplace``) overwrites the old tensor's value, and a ``Free`` ends it;
- a pinned slot holds a tensor's value once a copy sends it there from a block that holds it, or
  the host writes it (the batch); a copy back brings the value only if the slot holds it, and a
  host read must find it there (a copy of a value never written, such as an inference program's
  unused labels evicted by the cache, is harmless until something reads what it brought);
- what lives across iterations (weights, BatchNorm statistics, momentum) holds its value from the
  start; everything else, weight gradients included, is written anew every iteration (a program of
  mode ``update`` reads the gradients a ``grads`` program left); a kernel's write makes the
  tensor's pinned copies stale, so momentum kept on the host must be copied back after its update;
- the input layer's step writes nothing: the batch and labels it names come from their copies;
- every result copied to the host is read there, and a ``train`` or ``grads`` program reads its
  loss (a tensor ``LAYER.loss``);
- a weight is not read, written or given a gradient after its SGD update in the same iteration,
  and a ``train`` or ``update`` program updates every weight exactly once; a ``grads`` program
  leaves every weight gradient written.

``check_dataflow(program)`` raises :class:`snlite.checker.ProgramError` at the first read of a
missing value, naming the instruction; :func:`snlite.checker.check` runs it after the race search.
"""
from __future__ import annotations

import bisect

from snlite.program import Alloc, Copy, Free, HandOver, HostRead, HostWrite, Launch

PERSISTENT = ("weight", "buffer", "optimizer")  # hold their values from one iteration to the next


class _Slots:
    """The pinned slab's contents: offset -> the tensor whose value was written there (sorted, so a
    freed range is cleared in logarithmic time)."""

    def __init__(self):
        self.holds: dict[int, str] = {}
        self.offsets: list[int] = []
        self.copies: dict[str, set] = {}  # tensor -> the offsets holding its current value

    def get(self, offset: int) -> str | None:
        return self.holds.get(offset)

    def put(self, offset: int, tensor: str) -> None:
        if offset in self.holds:
            self.copies[self.holds[offset]].discard(offset)
        else:
            bisect.insort(self.offsets, offset)
        self.holds[offset] = tensor
        self.copies.setdefault(tensor, set()).add(offset)

    def clear(self, lo: int, hi: int) -> None:
        a, b = bisect.bisect_left(self.offsets, lo), bisect.bisect_left(self.offsets, hi)
        for o in self.offsets[a:b]:
            self.copies[self.holds.pop(o)].discard(o)
        del self.offsets[a:b]

    def outdate(self, tensor: str) -> None:
        """The device has written a new value of ``tensor``: its pinned copies are stale."""
        for o in self.copies.pop(tensor, ()):
            del self.holds[o]
            del self.offsets[bisect.bisect_left(self.offsets, o)]


class DataflowError(ValueError):
    """A read of a value the program never wrote (the checker re-raises it as a ProgramError)."""


def check_dataflow(program, iterations: int = 2) -> None:
    """Raise :class:`DataflowError` at the first read of a value the program has not written."""
    kind = {name: spec[2] for name, spec in program.tensors.items()}
    weights = sorted(n for n, k in kind.items() if k == "weight")
    grads = {f"{w}.grad" for w in weights}
    slab = _Slots()
    persistent = [i for i in program.setup if kind.get(i.tensor) in PERSISTENT]
    kept = {i.offset: i.tensor for i in persistent if i.space == "slab"}
    for offset, tensor in kept.items():  # momentum kept in the pinned slab holds its value from the start
        slab.put(offset, tensor)
    lasting = {i.tensor for i in persistent if i.space != "slab"}
    if program.mode == "update":  # it reads the gradients (and the loss) a grads program left
        lasting |= {ins.tensor for ins in program.setup if ins.tensor in grads}
        lasting |= {n for n, k in kind.items() if n.endswith(".loss")}
    _check_results(program)
    for it in range(iterations):
        held, updated = set(lasting), set()
        for i, ins in enumerate(program.body):
            _step(ins, held, slab, kind, updated, (i, ins, it))
        at = f"at the end of iteration {it + 1}"
        stale = [t for o, t in kept.items() if slab.get(o) != t]
        if stale:
            raise DataflowError(f"{at}: the pinned slot of {stale[0]} does not hold its new value (the copy "
                                "back to the host after its update is missing)")
        if program.mode in ("train", "update") and updated != set(weights):
            missing = sorted(set(weights) - updated)
            raise DataflowError(f"{at}: the {program.mode} program never updates {missing[0]}"
                                + (f" (nor {len(missing) - 1} more weights)" if len(missing) > 1 else ""))
        if program.mode == "grads" and not grads <= held:
            missing = sorted(grads - held)
            raise DataflowError(f"{at}: the grads program leaves {missing[0]} unwritten (the backward step "
                                "that computes it is missing)")


def _check_results(program) -> None:
    """Every result copied to the host is read there, and a training program returns its loss (the
    same in every iteration: checked once)."""
    sent = [i.tensor for i in program.body if type(i) is Copy and i.why == "result"]
    read = {i.tensor for i in program.body if type(i) is HostRead}
    unread = [t for t in sent if t not in read]
    if unread:
        raise DataflowError(f"{unread[0]} is copied to the host as a result, but the host never reads it")
    losses = [t for t in program.tensors if t.endswith(".loss")]
    if program.mode in ("train", "grads") and losses and not read.intersection(losses):
        raise DataflowError(f"the {program.mode} program never gives the host its loss ({losses[0]})")


def _where(at: tuple) -> str:
    """Where body instruction ``at`` = (index, instruction, iteration) is, for a message: written only
    when one is raised (an instruction's text formats its sizes, and the check visits each one twice)."""
    i, ins, it = at
    return f"body #{i} ({ins})" + (f", iteration {it + 1}" if it else "")


def _need(name: str, held: set, what: str, at: tuple) -> None:
    if name not in held:
        raise DataflowError(f"{_where(at)}: {what} {name}, whose value was never written in this iteration "
                            "(a kernel or copy that writes it is missing, or comes later)")


def _step(ins, held, slab, kind, updated, at) -> None:
    t = type(ins)
    if t is Launch:
        _launch(ins, held, slab, kind, updated, at)
    elif t is Copy:  # a copy carries a value if its source holds one; a copy of nothing leaves nothing
        if ins.to_host:
            if ins.tensor in held:
                slab.put(ins.dst_offset, ins.tensor)
            else:
                slab.clear(ins.dst_offset, ins.dst_offset + 1)
        elif slab.get(ins.src_offset) == ins.tensor:
            held.add(ins.tensor)
        else:
            held.discard(ins.tensor)
    elif t is HostWrite:
        slab.put(ins.offset, ins.tensor)
    elif t is HostRead:
        if slab.get(ins.offset) != ins.tensor:
            raise DataflowError(f"{_where(at)}: reads {ins.tensor} from a pinned slot that does not hold it "
                                "(the copy of the result is missing or comes later)")
    elif t is Alloc or t is Free:
        if ins.space == "slab":
            slab.clear(ins.offset, ins.offset + ins.nbytes)  # a new slot holds nothing, nor a freed one
        else:
            held.discard(ins.tensor)  # a fresh block holds no value; a freed one is gone
    elif t is HandOver:
        held.discard(ins.old)


def _launch(ins, held, slab, kind, updated, at) -> None:
    update = ins.phase == "update"
    if not update:
        for name in (*ins.reads, *ins.writes):
            if _weight_of(name) in updated:
                raise DataflowError(f"{_where(at)}: touches {name} after the SGD update of "
                                    f"{_weight_of(name)} in this iteration (an update comes after the "
                                    "layer's last backward step)")
    for name in ins.reads:
        _need(name, held, "reads", at)
    inplace = dict(ins.inplace)
    for name in ins.writes:
        if kind.get(name) == "input":  # the input layer names the batch and labels: their copies write them
            continue
        held.add(name)
        slab.outdate(name)
        if name in inplace:
            held.discard(inplace[name])  # its block now holds the new tensor's value
    if update:
        for name in ins.writes:
            if kind.get(name) == "weight":
                if name in updated:
                    raise DataflowError(f"{_where(at)}: updates {name} a second time in this iteration")
                updated.add(name)


def _weight_of(name: str) -> str:
    """The weight a name belongs to: ``conv1.weight.grad`` -> ``conv1.weight``; else the name."""
    for suffix in (".grad", ".momentum"):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


__all__ = ["DataflowError", "check_dataflow"]
