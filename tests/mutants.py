"""Planted bugs, and the tests that must catch each one: a test earns its place by failing when the
code is wrong.

    python tests/mutants.py            # plant each bug in a scratch copy, run its tests, report
    python tests/mutants.py --list     # the bugs, one line each

Each bug is one exact text replacement in one file (a wait deleted, a block freed early, an
off-by-one, a tie flipped, a write left undeclared), with the test files that must fail once it is
planted. The run copies the working tree's tracked files to a scratch folder, runs all the named
tests there once as they are (they must pass, or no verdict would mean anything), then plants the
bugs one at a time and runs each one's tests (the CUDA simulator, stopping at the first failure),
printing KILLED with the test that failed, or SURVIVED; it exits 1 if any survived. It takes a few
minutes, so the suite only checks that every bug still applies to the code as it is
(tests/test_mutants.py).

The list grows the way its entries came: plant a bug that the suite should notice, watch the suite
pass, write the test that fails, keep the bug here so that the test stays able to fail.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

ROOT = pathlib.Path(__file__).resolve().parent.parent


class Mutant(NamedTuple):
    path: str  # the file, from the repository root
    old: str  # text that occurs exactly once in it
    new: str  # what the bug puts there
    bug: str  # what is wrong, in words
    tests: tuple[str, ...]  # the test files that must fail


MUTANTS = (
    # the program's waits and the walk's bookkeeping
    Mutant("snlite/checker.py", "races = find_races(program, iterations, graph=graph)",
           "races = find_races(program, 1, graph=graph)",
           "check() looks at one iteration: work left running into the next is not seen",
           ("tests/test_checker.py",)),
    Mutant("snlite/copies.py", '            self.out.append(Wait(event, COMPUTE, "release"))',
           "            pass", "a block freed while a copy may still read it (the release wait deleted)",
           ("tests/test_checker.py",)),
    Mutant("snlite/copies.py", '        self.out.append(Wait(self.pending.pop(name), COMPUTE, "landed"))',
           "        self.pending.pop(name)", "a kernel reads a tensor before its copy in lands",
           ("tests/test_checker.py",)),
    Mutant("snlite/cache.py", "               if not t.locked and t.state is State.ON_DEVICE)",
           "               if t.state is State.ON_DEVICE)",
           "the cache evicts a tensor the running layer has locked",
           ("tests/test_placement.py", "tests/test_evict.py")),
    Mutant("snlite/residency.py", "offset, self.reserved(nbytes),\n", "offset, nbytes,\n",
           "an allocation books the bytes asked for, not the pool's whole blocks",
           ("tests/test_program.py",)),
    # what offload and the cache move
    Mutant("snlite/residency.py",
           "        if t.start_offload(t.host_offset):  # False: a clean eviction",
           "        if t.start_offload(t.host_offset) or True:  # False: a clean eviction",
           "a clean eviction copies to the host what the host already holds", ("tests/test_moves.py",)),
    Mutant("snlite/residency.py",
           "        if host is not None:\n            self._free_host_slot(old.name, host, old.nbytes)\n",
           "", "an in-place write over a tensor with a pinned slot leaks the slot", ("tests/test_moves.py",)),
    Mutant("snlite/placement.py", "            self._release_block(workspace, workspace.free())\n", "",
           "a conv workspace is never freed", ("tests/test_moves.py",)),
    # what each launch declares (the race checker sees nothing else)
    Mutant("snlite/placement.py",
           "writes = op.writes + ((g.output_grads(op.layer)[0],) if op.accumulate else ())",
           "writes = op.writes", "a fork's summed gradient missing from its launch's writes",
           ("tests/test_audit.py",)),
    Mutant("snlite/scheduler.py", 'tuple(x for p in params for x in (p, f"{p}.momentum")))',
           "tuple(x for p in params for x in (p,)))", "an SGD step's momentum missing from its writes",
           ("tests/test_audit.py",)),
    Mutant("snlite/audit.py", "        self.data[~self.may_touch] = poison[~self.may_touch]\n", "",
           "the audit poisons nothing (an undeclared read goes unseen)", ("tests/test_audit.py",)),
    Mutant("snlite/audit.py", "            self.may_write[offset:offset + nbytes] = name in writes",
           "            self.may_write[offset:offset + nbytes] = True",
           "the audit lets a launch write what it only reads", ("tests/test_audit.py",)),
    # the time-aware schedule
    Mutant("snlite/overlap.py", "        free = end = begin + copy_ms(prof, nbytes[tr.tensor], to_host=True)",
           "        end = begin + copy_ms(prof, nbytes[tr.tensor], to_host=True)",
           "releases timed as if each copy out ran alone (no copy_out queue)", ("tests/test_overlap.py",)),
    Mutant("snlite/overlap.py", "        op = min(max(op, tr.release_before + 1), need)",
           "        op = min(max(op, tr.release_before), need)", "a prefetch allowed at its release op",
           ("tests/test_overlap.py",)),
    Mutant("snlite/overlap.py", "    late_release = old.release_before <= op < new.release_before",
           "    late_release = old.release_before < op < new.release_before",
           "the peak check misses a late release's first op", ("tests/test_overlap.py",)),
    Mutant("snlite/overlap.py", "        if e.last_use < e.at:", "        if e.last_use <= e.at:",
           "write-behind started at the eviction's own op", ("tests/test_overlap.py",)),
    Mutant("snlite/overlap.py", "        if found is not None and found[0] <= peak:",
           "        if found is not None and found[0] < peak:", "a retimed plan at the same peak refused",
           ("tests/test_timing.py",)),
    Mutant("snlite/timing.py", "    return prof.copy_latency_us * 1e-3 + nbytes / (bw * 1e6)",
           "    return nbytes / (bw * 1e6)", "copies cost no latency", ("tests/test_timing.py",)),
    # what a user is told
    Mutant("snlite/train.py", "        return float(np.mean(logits.argmax(axis=1) == labels))",
           "        return float(np.mean(logits.argmax(axis=1)[1:] == labels[1:]))",
           "evaluate's accuracy leaves out the first sample", ("tests/test_train.py",)),
    Mutant("snlite/arguments.py", "bad |= ~np.isfinite(a) | (a != np.round(a))", "bad |= ~np.isfinite(a)",
           "a label of 2.7 truncated to class 2 instead of refused", ("tests/test_train.py",)),
    # the plan
    Mutant("snlite/scheduler.py",
           "handed = {i: {old for _, old in op.inplace} for i, op in enumerate(ops) if op.inplace}",
           "handed = {}", "liveness frees a tensor at the op whose in-place write took its block over",
           ("tests/test_executor.py",)),
    # decisions
    Mutant("snlite/pipeline.py", 'states = ("device", "host")', 'states = ("host", "device")',
           'optimizer_state="auto" sends the momentum to the host where the device fits',
           ("tests/test_update_in_backward.py",)),
    Mutant("snlite/pipeline.py", "        tried.append(mid)\n", "",
           "offline's last resort forgets the bisected budgets whose offsets overshot",
           ("tests/test_offline.py",)),
    Mutant("snlite/cli_plan.py",
           "    if config.budget_bytes is not None or config.host_budget_bytes is not None:\n",
           "    if config.budget_bytes is not None:\n",
           "plan with a host budget alone reports it as fitting when it does not",
           ("tests/test_explain.py",)),
    Mutant("snlite/search.py", "    lowest = config.replace(host_budget_bytes=None)\n",
           "    lowest = config\n",
           "min_budget's device bound is worked out under the host budget (it refuses budgets that fit)",
           ("tests/test_explain.py",)),
    Mutant("snlite/search.py", 'traces[i] = "host" if isinstance(e, HostBudgetError) else "device"',
           'traces[i] = "device"',
           "a search under a host budget blames the device for what the host ran out of",
           ("tests/test_explain.py",)),
    Mutant("snlite/workspace.py", "        if c.workspace_bytes <= largest_free_bytes:\n            return c",
           "        if c.workspace_bytes < largest_free_bytes:\n            return c",
           "the dynamic workspace refuses a block it would fill exactly", ("tests/test_placement.py",)),
    Mutant("snlite/placement.py",
           "            if t.state is State.ON_HOST and self.pool.can_fit(max(t.nbytes, 1)):",
           "            if t.state is State.ON_HOST:",
           "a read-ahead fetch evicts to make room for itself", ("tests/test_moves.py",)),
    Mutant("tests/simulator_blocks.py", "    me.syncthreads = block.switch",
           "    me.syncthreads = lambda: None",
           "the simulator's barrier lets each thread go on without waiting for the block",
           ("tests/test_simulator_blocks.py",)),
    Mutant("tests/simulator_blocks.py", "                _named(g.switch, (), point, grid_point)",
           "                g.switch()", "a failing thread's error is raised without naming the thread",
           ("tests/test_simulator_blocks.py",)),
    Mutant("tests/simulator_blocks.py",
           "vars(m) for m in f.__globals__.values() if type(m) is type(threading)", "",
           "a kernel whose barrier is in a module's device function runs its threads in turn",
           ("tests/test_simulator_blocks.py",)),
    Mutant("tests/simulator_blocks.py",
           "me.thread_id = point[0] + block_dim[0] * (point[1] + block_dim[1] * point[2])",
           "me.thread_id = point[0]", "the simulator's threads number their lanes by x alone",
           ("tests/test_simulator_blocks.py",)),
    Mutant("tests/simulator_blocks.py", "    _depth -= 1\n    if _depth == 0:\n",
           "    _depth -= 1\n    if True:\n",
           "a pytest session inside the session (pytester) puts the simulator's slow manager back for good",
           ("tests/test_simulator_blocks.py",)),
)


def plant(text: str, m: Mutant) -> str:
    """``text`` with ``m`` planted; ValueError if its old text is not there exactly once."""
    if text.count(m.old) != 1:
        raise ValueError(f"{m.path}: the text to replace for {m.bug!r} occurs {text.count(m.old)} times, "
                         "not once: update its entry in tests/mutants.py")
    return text.replace(m.old, m.new)


def _copy_tree(dest: pathlib.Path) -> None:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in files.splitlines():
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _pytest(scratch: pathlib.Path, tests) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(scratch), NUMBA_ENABLE_CUDASIM="1", PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-rfE", "-p", "no:xdist", "-p",
                           "no:cacheprovider", "-o", "addopts=", *tests], cwd=scratch, env=env,
                          capture_output=True, text=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--list"]:
        for m in MUTANTS:
            print(f"{m.path}: {m.bug} (caught by {', '.join(m.tests)})")
        return 0
    if argv:
        print(__doc__.split("\n\n")[1])
        return 2
    survived = 0
    with tempfile.TemporaryDirectory(prefix="snlite-mutants-") as tmp:
        scratch = pathlib.Path(tmp)
        _copy_tree(scratch)
        control = _pytest(scratch, sorted({t for m in MUTANTS for t in m.tests}))
        if control.returncode != 0:
            print(f"the tests fail with no bug planted, so no verdict would mean anything:\n{control.stdout}")
            return 2
        for k, m in enumerate(MUTANTS, 1):
            target = scratch / m.path
            original = target.read_text()
            target.write_text(plant(original, m))
            t0 = time.perf_counter()
            try:
                run = _pytest(scratch, m.tests)
            finally:
                target.write_text(original)
            failed = next((line.split(" - ")[0] for line in run.stdout.splitlines()
                           if line.startswith(("FAILED ", "ERROR "))), "")
            verdict = f"KILLED: {failed}" if run.returncode == 1 else \
                "SURVIVED" if run.returncode == 0 else f"ERROR (pytest exit {run.returncode})"
            survived += run.returncode != 1
            print(f"[{k}/{len(MUTANTS)}] {m.path}: {m.bug}\n    {verdict} ({time.perf_counter() - t0:.1f} s)",
                  flush=True)
    print(f"{len(MUTANTS) - survived} of {len(MUTANTS)} planted bugs caught")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
