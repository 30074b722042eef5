"""Programs that share an executor, run one after another: a :class:`~snlite.train.Model` runs its
"train", "grads", "update" and "infer" programs on one arena, so work one leaves running (a copy not
waited for) must not race with the next one's. :func:`together` makes one program of a sequence of
them, and :func:`check_together` runs the race checker (:mod:`snlite.checker`) over every pair in
both orders, each twice; each program alone is :func:`snlite.checker.check`'s business.
"""
from __future__ import annotations

import dataclasses

from snlite.checker import RaceError, find_races
from snlite.program import COMPUTE, Free, HostWait, Program, Record, Wait, program_of
from snlite.validate import ProgramError


def check_together(programs, *, graph=None) -> None:
    """Raise :class:`RaceError` if programs that share an executor (a :class:`~snlite.train.Model`'s
    "grads", "update", "infer"...) can race when run one after another: work one leaves running (a
    copy not waited for) against the next one's. For each ordered pair (a, b), the sequences a, a, b, b
    and a, b, a, b are checked as one program (:func:`together`), each with its own events; each
    program alone is :func:`snlite.checker.check`'s business. Linear in the programs' length (times 8
    per pair)."""
    programs = [program_of(p) for p in (programs.values() if isinstance(programs, dict) else programs)]
    for a in programs:
        for b in programs:
            if a is b:
                continue
            for seq in ((a, a, b, b), (a, b, a, b)):
                combined = together(seq)
                races = find_races(combined, 1, graph=graph)
                if races:
                    raise RaceError(races, combined)


def together(seq) -> "Program":
    """The programs of ``seq`` run one after another on one executor, as one program. The setups are
    installed once, up front, as a :class:`~snlite.train.Model` installs them (a tensor two of them
    place must be placed alike); the bodies follow one another, each with its own events (``2.e17``:
    body 2's e17). A tensor another program installed but this one does not place (the weight
    gradients a "grads" program keeps, to an "infer" program) is free memory to it: its block is
    freed (a write on compute) before this body and placed again after it."""
    first = seq[0]
    tensors, installed = {}, {}
    for k, program in enumerate(seq):
        if program.allocator != first.allocator or program.net != first.net:
            raise ProgramError(f"program {k + 1} is for {program.net} with the {program.allocator} "
                               f"allocator, the first for {first.net} with the {first.allocator} allocator: "
                               "they cannot share an executor")
        for name, spec in program.tensors.items():
            if tensors.setdefault(name, spec) != spec:
                raise ProgramError(f"program {k + 1} gives {name} the spec {spec}, an earlier one "
                                   f"{tensors[name]}")
        for ins in program.setup:
            if installed.setdefault(ins.tensor, ins) != ins:
                raise ProgramError(f"program {k + 1} places {ins.tensor} elsewhere than an earlier one "
                                   f"({ins}, not {installed[ins.tensor]}): programs that share an executor "
                                   "place it alike")
    body = []
    for k, program in enumerate(seq):
        own = {ins.tensor for ins in program.setup}
        foreign = [ins for name, ins in installed.items() if name not in own]
        body += [Free(i.tensor, i.space, i.offset, i.nbytes, COMPUTE) for i in foreign]
        for ins in program.body:
            t = type(ins)
            if t is Record or t is Wait or t is HostWait:
                ins = dataclasses.replace(ins, event=f"{k + 1}.{ins.event}")
            body.append(ins)
        body += foreign
    runs = " -> ".join(p.mode for p in seq)
    return Program(first.net, f"{first.config}; {runs}", first.mode, first.allocator, tensors,
                   tuple(installed.values()), tuple(body), max(p.arena_bytes for p in seq),
                   max(p.slab_bytes for p in seq))


__all__ = ["check_together", "together"]
