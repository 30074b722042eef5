"""What every tutorial needs, in one import: quick mode, the output folder, plots, and checked claims.

A tutorial's setup cell is one line::

    from snlite.lesson import KiB, MiB, GiB, OUT, QUICK, expect, save_plot

- ``QUICK``: True when ``SNLITE_TUTORIAL_QUICK=1`` (the test suite sets it): smaller everything.
- ``OUT``: where plots go: ``SNLITE_TUTORIAL_OUT``, else ``out/`` next to the script being run (in a
  notebook: next to the notebook, the kernel's working folder). Created on the first plot.
- ``save_plot(kind, data, name, **kwargs)``: ``snlite.plot.<kind>(data, OUT / name, **kwargs)``; the
  PNG is saved, and in a notebook (a Jupyter kernel: Jupyter, VS Code's interactive window) it is also
  shown inline. Without matplotlib it prints one line saying how to install it, and the lesson goes on.
- ``expect(claim, holds, why="")``: prints what the lesson says you should see, then whether this run
  shows it, then why (if given). A claim the run does not show raises :class:`ClaimNotShown`, so a
  wrong lesson fails its test (``tests/test_tutorials.py``) instead of printing a stray ``False``.

Importing it prints nothing and creates nothing. It imports the ``snlite`` package, and with it
numba, so tutorial 00 sets ``NUMBA_ENABLE_CUDASIM`` before this import.
"""
from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

from snlite import plot

KiB, MiB, GiB = 2**10, 2**20, 2**30
WIDTH = 110  # characters per printed line of a claim

QUICK = os.environ.get("SNLITE_TUTORIAL_QUICK") == "1"


class ClaimNotShown(AssertionError):
    """A tutorial said "you should see X" and this run does not show X."""


def in_notebook() -> bool:
    """True inside a Jupyter kernel (a notebook, VS Code's interactive window), False in a script."""
    ipython = sys.modules.get("IPython")  # a kernel has imported it already; a script usually has not
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return shell is not None and getattr(shell, "kernel", None) is not None


def _default_out() -> Path:
    if os.environ.get("SNLITE_TUTORIAL_OUT"):
        return Path(os.environ["SNLITE_TUTORIAL_OUT"])
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    if script and not in_notebook():
        return Path(script).resolve().parent / "out"
    return Path.cwd() / "out"


OUT = _default_out()


def expect(claim: str, holds, why: str = "") -> None:
    """Print ``claim`` (what you should see), then whether this run shows it, then ``why`` if given.

    ``holds`` is the check, computed from what the run printed. It returns nothing (a notebook shows
    no stray ``True``); a claim that does not hold raises :class:`ClaimNotShown` after printing it.
    If you changed the code for an exercise, that may be the point: read the claim again and
    explain why it no longer holds.
    """
    ok = bool(holds)
    print(textwrap.fill(claim, WIDTH, initial_indent="You should see: ", subsequent_indent="  ",
                        break_on_hyphens=False))
    print(f"  -> {'yes: this run shows it' if ok else 'NO: this run does not show it'}")
    if why:
        print(textwrap.fill(why, WIDTH, initial_indent="  Why: ", subsequent_indent="  ",
                            break_on_hyphens=False))
    if not ok:
        raise ClaimNotShown(f"the lesson claims: {claim!r}, but this run does not show it. If you changed "
                            "the code (an exercise), that may be the point: explain why it no longer holds.")


def save_plot(kind: str, data, name: str, **kwargs) -> None:
    """``snlite.plot.<kind>(data, OUT / name, **kwargs)``, and shown inline in a notebook. Without
    matplotlib, one line says why and how to install it. Returns nothing, so a notebook cell that ends
    with it shows only the plot."""
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        path = getattr(plot, kind)(data, OUT / name, **kwargs)
    except plot.PlotUnavailable as e:  # matplotlib is not installed; the message says how to install it
        print(f"plot {name} skipped: {e}")
        return
    print(f"plot saved: {path}")
    if in_notebook():
        from IPython.display import Image, display

        display(Image(filename=str(path)))
