"""HiGHS through ``scipy.optimize.milp``, as both exact planners call it (:mod:`snlite.milp` for
recomputation, :mod:`snlite.optimal_offload` for offload): quietly, timed, its status in words.
scipy is the optional extra ``snlite[optimal]``: it is imported when a program is solved."""
from __future__ import annotations

import contextlib
import os
import sys
import time

STATUS = {0: "optimal", 1: "time limit", 2: "infeasible", 3: "unbounded", 4: "solver error (tolerances)"}


def run(c, integrality, lb, ub, A, lo, hi, time_limit: float, presolve: bool = True):
    """min c @ x with lb <= x <= ub, lo <= A @ x <= hi, and x[i] whole where integrality[i] is 1.
    Returns (scipy's result, seconds)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    t0 = time.perf_counter()
    with quiet_fd1():
        res = milp(c, integrality=integrality, bounds=Bounds(lb, ub), constraints=LinearConstraint(A, lo, hi),
                   options={"time_limit": time_limit, "disp": False, "presolve": presolve})
    return res, time.perf_counter() - t0


@contextlib.contextmanager
def quiet_fd1():
    """Some HiGHS builds print debugging lines ("...transformNewIntegerFeasibleSolution...") straight
    to file descriptor 1, past Python: point it at /dev/null while the solver runs."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
