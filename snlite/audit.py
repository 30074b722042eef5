"""The access audit: every launch touches only the tensors its :class:`~snlite.program.Launch` names.

The race checker (:mod:`snlite.checker`) and the dataflow check (:mod:`snlite.dataflow`) reason about a
program from what each launch declares it reads and writes. The executor does not use those names:
it hands a layer's step the views the graph's roles give it (:meth:`snlite.executor.Executor._step`).
So a launch that leaves out a tensor its kernels touch (a fork's gradient summed in place, say) would
leave both checks blind to every race and every stale read on that tensor. The audit holds the two
together on real data: with ``Model.audit`` on, on the host device, around every launch it

1. fills every device byte that no tensor the launch names holds with a poison (a float32 NaN with
   a payload no kernel makes), keeping what was there;
2. runs the launch;
3. checks the poison is intact outside the tensors the launch writes (and its workspace): a write
   anywhere else is refused, naming the tensor whose bytes it changed;
4. puts back what was there.

A kernel that reads a tensor its launch does not name reads the poison, so its results are NaN or
differ: a training run audited gives the same losses and weights, bit for bit, as one that is not
(``tests/test_audit.py`` checks a sample of the flag combinations, offline placement, a budget
that makes the cache move data and the presets, and plants both kinds of omission).

The audit needs a device that runs work as it is issued, with its memory in NumPy arrays: the host
device (not the adversarial one, which defers work, nor the meta device, which holds no data), and a
program of the pool allocator: the arena is what it watches (the raw allocator's launches name the
same tensors).
"""
from __future__ import annotations

import numpy as np

# a quiet float32 NaN whose payload no kernel computes: an undeclared read spreads it, an undeclared
# write is seen wherever it is no longer there
POISON = 0x7FA5A5A5


class Audit:
    """The arena one executor holds, and its allocations (read live)."""

    def __init__(self, arena, placed: dict):
        self.arena, self.placed = arena, placed
        self.poison = None  # the arena's bytes all poison, made at the first launch audited

    def launch(self, ins, run) -> str | None:
        """Run ``run()``, the kernels of launch ``ins``, audited (see the module docstring); return
        what it wrote without declaring it, or None."""
        inplace = dict(ins.inplace)  # (new, old): the new tensor is written into old's block
        writes = {inplace.get(n, n) for n in ins.writes} | ({ins.workspace} if ins.workspace else set())
        named = writes | {inplace.get(n, n) for n in ins.reads}
        if self.arena is None:
            raise ValueError("the access audit watches the arena: audit a program of allocator='pool'")
        if self.poison is None:  # (the arena is whole 1 KiB blocks: whole float32 words)
            self.poison = np.full(self.arena.nbytes // 4, POISON, dtype="<u4").view(np.uint8)
        blocks = {n: at for (space, n), at in self.placed.items() if space == "arena"}
        memory = _Memory(self.arena.raw, blocks, named, writes)
        memory.poison(self.poison)
        try:
            run()
            return memory.undeclared_write()
        finally:
            memory.restore()


class _Memory:
    """The arena around one launch: what it held where the launch may not look, poisoned meanwhile."""

    def __init__(self, data, blocks: dict, named: set, writes: set):
        self.data, self.blocks = data, blocks
        self.may_touch, self.may_write = np.zeros(data.size, bool), np.zeros(data.size, bool)
        for name in named & blocks.keys():  # (a name with no block: the executor finds no view either)
            offset, nbytes = blocks[name]
            self.may_touch[offset:offset + nbytes] = True
            self.may_write[offset:offset + nbytes] = name in writes
        self.kept = data[~self.may_touch]
        self.before = None

    def poison(self, poison) -> None:
        self.data[~self.may_touch] = poison[~self.may_touch]
        self.before = self.data.copy()

    def undeclared_write(self) -> str | None:
        changed = np.flatnonzero((self.data != self.before) & ~self.may_write)
        if not changed.size:
            return None
        byte = int(changed[0])
        # (programs sharing the executor may put their own tensors where another's persistent ones are)
        owners = " or ".join(n for n, (o, b) in self.blocks.items() if o <= byte < o + b) or "free memory"
        return (f"the launch changed {changed.size:,d} bytes it does not declare writing, the first at "
                f"arena byte {byte:,d} ({owners}): the race checker and the dataflow "
                "check see only what a launch names, so its writes must list every tensor its kernels "
                "write")

    def restore(self) -> None:
        self.data[~self.may_touch] = self.kept
