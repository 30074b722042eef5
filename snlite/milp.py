"""The integer program behind :mod:`snlite.optimal`: variables, memory sums, HiGHS.

:class:`Model` builds, for one graph, the program whose optimum is the best plan of
:func:`snlite.optimal.plan_for`'s kind, with every memory sum counted as the trace counts it.

Slots are the moments a launch can happen: each forward step, and per backward position j each
possible re-run (in forward order) then the step itself. Per tensor and slot, ``_memory`` adds the
tensor's bytes as a constant (held whatever the plan), as ``1 - d[L]`` (an original a drop frees),
or as an ``alive`` variable bounded below by the reasons it must be held there (it exists there, and
something at or after the slot still reads this copy of it). :meth:`Model.slot_bytes` evaluates the
same sums for one plan without the solver; the tests compare it with the trace launch by launch.
Alive variables with the same reasons are one variable (the same tensor at several slots of a step,
or tensors that live and die together): on ResNet-20 that leaves 24 thousand variables of 203.
"""
from __future__ import annotations

import math

import numpy as np

from snlite import highs
from snlite.scheduler import optimizer_specs
from snlite.pool import TensorPool
from snlite.space import Space, as_reruns
from snlite.trace import KIND_CATEGORY, PAPER_CATEGORIES

OBJECTIVES = ("peak", "flops")


class _Expr(dict):
    """A linear expression: variable index -> coefficient, and a constant under key -1."""

    def add(self, other, k=1.0):
        for v, c in other.items():
            self[v] = self.get(v, 0.0) + k * c
        return self


PRESOLVE = True  # HiGHS's presolve (off: slower, for checking a suspicious answer)
# C[u, j] (an incarnation carried into j) need not be declared binary: once d and R are whole numbers,
# the constraints force C to 1 from a re-run to each read it serves and every memory sum grows with C,
# so the least C is whole and optimal; as continuous variables they leave HiGHS 2,307 binaries instead
# of 6,498 on ResNet-20 (the brute-force tests check the optimum is unchanged)
CARRY_INTEGER = False


class Model(Space):
    """The integer program of one graph under :data:`snlite.space.CONFIG` (count "all" or "paper"),
    built once; :meth:`solve` runs HiGHS on it with one objective. See the module docstring for what it means.
    ``allowed``: the layers it may drop (default: every candidate), e.g. only SuperNeurons' cheap ones.
    Built in three steps: the plans (:class:`~snlite.space.Space`: the candidates, where their re-runs
    may come, the slots), what each tensor counts for (:meth:`_sizes`), then the program (:meth:`_build`)."""

    def __init__(self, graph, count: str = "all", allowed=None, reruns: str = "any"):
        if count not in ("all", "paper"):
            raise ValueError(f"count must be 'all' or 'paper', got {count!r}")
        super().__init__(graph, allowed, reruns)
        self.count = count
        self._sizes()
        self._build()

    def _sizes(self) -> None:
        """What the program counts: each tensor's size (:meth:`size`), the grain every size is a whole
        number of, the unit the program counts in, and the bytes held throughout (``persistent_bytes``)."""
        self.tensors = self.graph.tensors()
        self.block = TensorPool(1024).reserved_bytes
        self.cats = PAPER_CATEGORIES if self.count == "paper" else None
        # every size is a whole number of grains (the pool's blocks under count "all"), so a budget is
        # too, and half a grain of slack absorbs HiGHS's tolerances; the program counts in KiB (HiGHS
        # is at its most accurate with numbers near 1; in bytes it returned suboptimal "optimal" answers)
        self.grain = math.gcd(*{self.size(t) for t in self.tensors if t not in self.persistent},
                              1024 if self.cats is None else 0)
        self.unit = 1024.0
        self.persistent_bytes = 0 if self.cats else (
            sum(self.block(max(t.nbytes, 1)) for n, t in self.tensors.items() if n in self.persistent)
            + sum(self.block(t.nbytes) for t in optimizer_specs(self.graph).values()))

    def size(self, name) -> int:
        """The bytes tensor ``name`` counts for: its pool block ("all"), or its own bytes if the paper
        counts its category, else 0 ("paper")."""
        spec = self.tensors[name]
        if self.cats is not None:
            return spec.nbytes if KIND_CATEGORY[spec.kind] in self.cats else 0
        return self.block(max(spec.nbytes, 1))

    # -------------------------------------------------------------- variables and expressions
    def _var(self, name, lb=0.0, ub=1.0, integer=False) -> int:
        self.names.append(name)
        self.lb.append(lb)
        self.ub.append(ub)
        self.integer.append(1 if integer else 0)
        return len(self.names) - 1

    def _row(self, expr: dict, lo: float, hi: float) -> None:
        """lo <= expr <= hi, with expr's constant (key -1) moved to the bounds."""
        k = expr.get(-1, 0.0)
        self.rows.append({v: c for v, c in expr.items() if v != -1 and c != 0.0})
        self.row_lo.append(lo - k)
        self.row_hi.append(hi - k)

    def st(self, L, j) -> _Expr:
        """started[L, j]: L's re-run has happened by backward position j (0 before the first)."""
        if j < 0 or not self.starts[L] or j < min(self.starts[L]):
            return _Expr()
        return _Expr({self.started[L][j]: 1.0})

    def rec(self, L, j) -> _Expr:
        """1 if L is re-run right before backward position j."""
        return self.st(L, j).add(self.st(L, j - 1), -1.0)

    def after(self, M, j, k) -> _Expr:
        """1 if M's re-run comes at or after the slot (j, k) (k: a forward position; inf for the step)."""
        e = self.st(M, len(self.bstages) - 1).add(self.st(M, j), -1.0)
        return e.add(self.rec(M, j)) if self.pos[M] >= k else e

    def alloc_by(self, L, j, k) -> _Expr:
        """1 if L's incarnation holds its block at slot (j, k), its re-run being at or before it."""
        e = self.st(L, j - 1)
        return e.add(self.rec(L, j)) if self.pos[L] <= k else e

    # "any": R[L, j] L is re-run before backward position j; C[u, j] the incarnation of u (an output of
    # L) is carried into j (per tensor: liveness frees each after its own last use); F[L, j] some re-run
    # of L comes at or after position j
    def R(self, L, j) -> _Expr:
        v = self.rv.get(L, {}).get(j)
        return _Expr() if v is None else _Expr({v: 1.0})

    def C(self, u, j) -> _Expr:
        v = self.cv.get(u, {}).get(j)
        return _Expr() if v is None else _Expr({v: 1.0})

    def F(self, L, j) -> _Expr:
        v = self.fv.get(L, {}).get(j)
        return _Expr() if v is None else _Expr({v: 1.0})

    def _reruns_from(self, M, j, k) -> list:
        """Expressions, one of which is 1 when a re-run of M comes at or after slot (j, k)."""
        if self.mode == "once":
            return [self.after(M, j, k)]
        return ([self.R(M, j)] if self.pos[M] >= k else []) + [self.F(M, j + 1)]

    def _ever(self, M) -> _Expr:
        """1 if M is re-run at all."""
        return self.st(M, len(self.bstages) - 1) if self.mode == "once" else self.F(M, 0)

    def _build_any(self) -> None:
        """The re-runs of "any": binaries R and C, per layer over the positions it may need them."""
        self.rv, self.cv, self.fv = {}, {}, {}
        for L in self.cands:  # every layer's variables first: the constraints tie producers to consumers
            S = self.starts[L]
            if S:
                self.rv[L] = {j: self._var(f"R[{L},{j}]", integer=True) for j in sorted(S)}
                self.fv[L] = {j: self._var(f"F[{L},{j}]") for j in range(0, max(S) + 1)}
                for u in self.outs[L]:
                    self.cv[u] = {j: self._var(f"C[{u},{j}]", integer=CARRY_INTEGER)
                                  for j in range(min(S) + 1, max(S) + 1)}
        for L in self.cands:
            S = self.starts[L]
            if not S:
                continue
            lo, hi = min(S), max(S)
            dL = {self.d[L]: 1.0}
            for u in self.outs[L]:
                need = set(self.bread.get(u, ()))
                for j in range(lo, hi + 1):
                    here = _Expr(self.C(u, j)).add(self.R(L, j))
                    # only if dropped; one incarnation at once
                    self._row(_Expr(here).add(dL, -1.0), -np.inf, 0.0)
                    if j > lo:  # what is carried into j existed at the end of j - 1
                        self._row(_Expr(self.C(u, j)).add(self.C(u, j - 1), -1.0).add(self.R(L, j - 1), -1.0),
                                  -np.inf, 0.0)
                    if j in need:  # a backward step reads it: there
                        self._row(_Expr(here).add(dL, -1.0), 0.0, np.inf)
                    for M in self.readers.get(u, ()):  # a dropped consumer's re-run reads it
                        if M != L and j in self.starts.get(M, ()):
                            self._row(_Expr(here).add(self.R(M, j), -1.0).add(dL, -1.0), -1.0, np.inf)
            for j in range(0, hi + 1):  # F[L, j] >= R[L, j], F[L, j + 1]
                self._row(_Expr(self.F(L, j)).add(self.R(L, j), -1.0), 0.0, np.inf)
                self._row(_Expr(self.F(L, j)).add(self.F(L, j + 1), -1.0), 0.0, np.inf)
            for j in S:
                self.extra.add(self.R(L, j), float(self.flops[L]))

    def _build_once(self) -> None:
        """The re-runs of "once": binaries started[L, j], pinned to the just-in-time rule."""
        nb = len(self.bstages)
        self.started = {L: {j: self._var(f"started[{L},{j}]", integer=True)
                            for j in range(min(self.starts[L]), nb)} for L in self.cands if self.starts[L]}
        for L in self.started:
            dL = {self.d[L]: 1.0}
            for j in range(min(self.starts[L]), nb):
                s = self.st(L, j)
                self._row(_Expr(s).add(dL, -1.0), -np.inf, 0.0)  # only a dropped layer re-runs
                if self.fb[L] is not None and j >= self.fb[L]:
                    self._row(_Expr(s).add(dL, -1.0), 0.0, np.inf)  # its own first need
                else:  # ... or not before a consumer's re-run needs it
                    e = _Expr(s)
                    for M in self.cons[L]:
                        e.add(self.st(M, j), -1.0)
                    self._row(e, -np.inf, 0.0)
                for M in self.cons[L]:  # a dropped consumer's re-run needs it
                    self._row(_Expr(s).add(self.st(M, j), -1.0).add(dL, -1.0), -1.0, np.inf)
            self.extra.add(self.st(L, nb - 1), float(self.flops[L]))

    def _build(self) -> None:
        """The program: peak, the decisions d[L], the re-runs (:meth:`_build_any` or :meth:`_build_once`),
        then the memory sum of every slot (:meth:`_memory`, which adds the ``alive`` variables)."""
        self.names, self.lb, self.ub, self.integer = [], [], [], []
        self.rows, self.row_lo, self.row_hi = [], [], []
        self.reasons = {}  # alive variable -> the expressions it is at least
        self._shared = {}  # its reasons -> an alive variable (one per distinct set of reasons)
        self.peak = self._var("peak", 0.0, np.inf)
        self.d = {L: self._var(f"d[{L}]", integer=True) for L in self.cands}
        self.flops = {L: self.graph.layers[L].flops() for L in self.cands}
        self.extra = _Expr()
        self.fgcd = math.gcd(*self.flops.values(), 0) or 1
        self.fscale = self.fgcd * max(1, max(self.flops.values(), default=1) // self.fgcd // 10**4)
        self.started = {}
        if self.mode == "any":
            self._build_any()
        else:
            self._build_once()
        self.memory = [self._memory(i) for i in range(len(self.slots))]
        self._mats = None

    def _alive(self, name, reasons) -> _Expr:
        """A variable >= each reason (an expression that is 1 when the tensor must hold its block)."""
        reasons = [r for r in reasons if any(v != -1 for v in r) or r.get(-1, 0.0) > 0]
        if not reasons:
            return _Expr()
        key = frozenset(tuple(sorted((v, c) for v, c in r.items() if c != 0.0)) for r in reasons)
        if key in self._shared:  # the same reasons at another slot, or for another tensor: the same value
            return _Expr({self._shared[key]: 1.0})
        v = self._shared[key] = self._var(name)
        self.reasons[v] = reasons
        for r in reasons:
            self._row(_Expr({v: 1.0}).add(r, -1.0), 0.0, np.inf)
        return _Expr({v: 1.0})

    def _memory(self, here) -> _Expr:
        """The bytes held at slot ``here`` (an index into ``slots``), as an expression."""
        kind, j, L_at = self.slots[here]
        mem = _Expr({-1: float(self.persistent_bytes)})
        k = self.pos[L_at] if kind == "r" else (np.inf if kind == "b" else None)
        for u in self.first:
            n = self.size(u)
            if n == 0:
                continue
            L = self.producer.get(u)
            base = self.first[u] <= here <= self.last[u]
            if kind == "f":
                if self.first[u] > here:
                    continue
                if L is None and base or L is not None and here <= self.lf[u]:
                    mem[-1] += n
                elif base:  # freed after its last forward use if dropped
                    mem.add({-1: 1.0, self.d[L]: -1.0}, n)
                else:  # its last use was earlier, unless a re-run in backward reads it
                    rs = [self._ever(M).add({self.d[L]: 1.0} if L else {}, -1.0)
                          for M in self.readers.get(u, ()) if M != L and self.starts.get(M)]
                    mem.add(self._alive(f"x[{u},{here}]", rs), n)
                continue
            if L is None:  # a tensor no plan drops: held as without recomputation, or longer for a re-run
                if base:
                    mem[-1] += n
                elif self.first[u] <= here:
                    mem.add(self._alive(f"x[{u},{here}]", [r for M in self.readers.get(u, ())
                                                           if self.starts.get(M) and max(self.starts[M]) >= j
                                                           for r in self._reruns_from(M, j, k)]), n)
                continue
            # the original: held in backward only if not dropped
            if base:
                mem.add({-1: 1.0, self.d[L]: -1.0}, n)
            else:
                rs = [r.add({self.d[L]: 1.0}, -1.0) for M in self.readers.get(u, ())
                      if M != L and self.starts.get(M) and max(self.starts[M]) >= j
                      for r in self._reruns_from(M, j, k)]
                mem.add(self._alive(f"o[{u},{here}]", rs), n)
            # the incarnation: from its re-run to its last use
            if not self.starts[L] or j < min(self.starts[L]):
                continue
            if self.mode == "any":
                own = kind == "r" and L_at == L
                mem.add(self._alive(f"i[{u},{here}]", self._incarnation_any(u, L, j, k, own)), n)
                continue
            a = self.alloc_by(L, j, k)
            rs = [_Expr(a)] if any(b >= j for b in self.bread.get(u, ())) else []
            if kind == "r" and L_at == L:  # the re-run writes it, even where nothing reads it later
                rs.append(self.rec(L, j))
            rs += [_Expr(a).add(self.after(M, j, k)).add({-1: 1.0}, -1.0) for M in self.readers.get(u, ())
                   if M != L and self.starts.get(M) and max(self.starts[M]) >= j]
            mem.add(self._alive(f"i[{u},{here}]", rs), n)
        return mem

    def _incarnation_any(self, u, L, j, k, own) -> list:
        """Why L's incarnation of u holds its block at slot (j, k) under "any": it exists there (carried
        in, or re-run at or before the slot) and this incarnation is still to be read: by the step,
        by a consumer's re-run later in the step, or carried on; or its own re-run writes it."""
        e = _Expr(self.C(u, j)).add(self.R(L, j)) if self.pos[L] <= k else self.C(u, j)
        later = _Expr() if self.pos[L] <= k else self.R(L, j)  # L's re-run in this step, after the slot
        rs = [_Expr(e)] if j in self.bread.get(u, ()) else []
        rs += [self.R(L, j)] if own else []
        # carried on into j + 1, so held here unless made by a re-run later in the step; this is
        # "exists here and carried on" (e + C[u, j + 1] - 1), made linear by C[u, j + 1] <= C[u, j] +
        # R[L, j] and C + R <= d, and much tighter for the LP relaxation (its bound on ResNet-20)
        rs += [_Expr(self.C(u, j + 1)).add(later, -1.0)]
        # a dropped consumer's re-run in this step, at or after the slot, reads it
        off = {self.d[L]: 1.0, -1: -1.0}  # d[L] - 1: 0 if L is dropped
        rs += [_Expr(self.R(M, j)).add(off).add(later, -1.0) for M in self.readers.get(u, ())
               if M != L and self.pos[M] >= k and j in self.starts.get(M, ())]
        return rs

    # -------------------------------------------------------------- solving
    @property
    def binaries(self) -> int:
        return sum(self.integer)

    def _matrices(self):
        """The program as sparse matrices, built once: every row but the memory sums (A, lo, hi), the
        memory sums in KiB without their constants (M, m0), each alive's reasons (W, w0, grouped by
        alive variable at ``starts``), and the extra FLOPs (e, e0)."""
        if self._mats is None:
            from scipy.sparse import csr_array

            def matrix(exprs, scale=1.0):
                data, ri, ci = [], [], []
                for r, e in enumerate(exprs):
                    for v, c in e.items():
                        if v != -1 and c != 0.0:
                            data.append(c / scale), ri.append(r), ci.append(v)
                return (csr_array((data, (ri, ci)), shape=(len(exprs), len(self.names))),
                        np.array([e.get(-1, 0.0) / scale for e in exprs]))

            alive = list(self.reasons)
            W, w0 = matrix([r for v in alive for r in self.reasons[v]])
            starts = np.cumsum([0] + [len(self.reasons[v]) for v in alive])[:-1]
            A, _ = matrix(self.rows)
            M, m0 = matrix(self.memory, self.unit)
            e, e0 = matrix([self.extra])
            self._mats = dict(A=A, lo=np.array(self.row_lo), hi=np.array(self.row_hi), M=M, m0=m0, W=W, w0=w0,
                              alive=np.array(alive, dtype=np.int64), starts=starts, e=e, e0=e0[0])
        return self._mats

    def solve(self, objective: str = "peak", allowance: int | None = None, budget: int | None = None,
              time_limit: float = 60.0, fixed: dict | None = None, cutoff: float | None = None):
        """HiGHS on the program: the least peak (bytes, under ``allowance`` extra FLOPs if given) or
        the fewest extra FLOPs (under ``budget`` bytes of peak). ``fixed``: layer -> 0/1 pins ``d``.
        ``cutoff``: the objective of a plan known to keep the limits (bytes or FLOPs), an upper bound that
        lets HiGHS prune from the start. Returns (scipy's result, the plan's re-runs or None, seconds)."""
        from scipy.sparse import csr_array, vstack

        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}; choose one of {OBJECTIVES}")
        if objective == "flops" and budget is None:
            raise ValueError("objective 'flops' needs a byte budget on the peak (budget=...)")
        m = self._matrices()
        mem, k, n = m["M"], m["m0"], len(self.names)
        if objective == "peak":  # mem - peak <= 0
            mem = mem - csr_array((np.ones(len(k)), (np.arange(len(k)), np.full(len(k), self.peak))),
                                  shape=mem.shape)
            limit = -k
        else:  # mem <= budget
            limit = (budget // self.grain + 0.5) * self.grain / self.unit - k
        parts, lo, hi = [m["A"], mem], [m["lo"], np.full(len(k), -np.inf)], [m["hi"], limit]
        flops = [a for a in (allowance, cutoff if objective == "flops" else None) if a is not None]
        if flops:  # plans' FLOPs are multiples of fgcd: half of it is slack for the tolerances
            parts.append(m["e"] / self.fscale)
            lo.append([-np.inf]), hi.append([(int(min(flops)) // self.fgcd + 0.5) * self.fgcd / self.fscale])
        A = vstack(parts, format="csr")
        c = np.zeros(n)
        if objective == "peak":
            c[self.peak] = 1.0
        else:
            c = m["e"].toarray()[0] / self.fscale
        lb, ub = np.array(self.lb, float), np.array(self.ub, float)
        if cutoff is not None and objective == "peak":
            ub[self.peak] = (int(cutoff) // self.grain + 0.5) * self.grain / self.unit
        for L, x in (fixed or {}).items():
            lb[self.d[L]] = ub[self.d[L]] = float(x)
        res, seconds = highs.run(c, np.array(self.integer), lb, ub, A, np.concatenate(lo), np.concatenate(hi),
                                 time_limit, PRESOLVE)
        self.size_info = {"variables": n, "binaries": self.binaries, "constraints": A.shape[0]}
        if res.x is None:
            return res, None, seconds
        dropped = tuple(L for L in self.cands if res.x[self.d[L]] > 0.5)
        if self.mode == "once":
            return res, self.choice(dropped), seconds
        return res, {L: tuple(self.bstages[j] for j, v in self.rv.get(L, {}).items() if res.x[v] > 0.5)
                     for L in dropped}, seconds

    def choice(self, dropped) -> dict:
        """Dropped layer -> the backward route steps it is re-run before (:func:`snlite.space.as_reruns`)."""
        return as_reruns(self.graph, dropped)

    def _assign(self, reruns: dict) -> np.ndarray:
        """The decision variables of one plan: ``d``, and ``started`` ("once") or R, C, F ("any")."""
        x = np.zeros(len(self.names))
        bpos = {s: j for j, s in enumerate(self.bstages)}
        for L, when in reruns.items():
            if L not in self.d:
                raise ValueError(f"this program may not drop {L}")
            x[self.d[L]] = 1.0
            js = sorted(bpos[s] for s in when)
            if self.mode == "once":
                if len(js) > 1:
                    raise ValueError(f"{L} is re-run {len(js)} times; "
                                     f"a Model(reruns='once') re-runs each layer once")
                for j, v in self.started.get(L, {}).items():
                    x[v] = float(bool(js) and j >= js[0])
                continue
            for j in js:
                if j not in self.rv.get(L, {}):
                    raise ValueError(f"{L} is re-run before backward step {self.bstages[j]}, "
                                     f"where nothing needs it")
                x[self.rv[L][j]] = 1.0
            for j, v in self.fv.get(L, {}).items():
                x[v] = float(any(q >= j for q in js))
            for u in self.outs[L]:
                uses = set(self.bread.get(u, ())) | {bpos[s] for M in self.readers.get(u, ()) if M != L
                                                     for s in reruns.get(M, ())}
                for j, v in self.cv.get(u, {}).items():  # kept into j: re-run before, read from j on
                    nxt = min((q for q in js if q >= j), default=np.inf)
                    x[v] = float(any(q < j for q in js) and any(j <= t < nxt for t in uses))
        return x

    def peak_of(self, dropped) -> int:
        """The program's peak for one plan (what :func:`snlite.optimal.plan_for` takes), in bytes: what
        the trace must then measure."""
        return max(self.slot_bytes(dropped))

    def slot_bytes(self, dropped) -> list[int]:
        """The bytes held at every slot for one plan, the program's sums evaluated exactly (integers,
        no solver): the decisions from the plan, each ``alive`` at its least, which is what the
        runtime holds at a launch there."""
        m, x = self._matrices(), self._assign(self.choice(dropped))
        if len(m["alive"]):
            x[m["alive"]] = np.maximum(np.maximum.reduceat(m["W"] @ x + m["w0"], m["starts"]), 0.0)
        return [int(b) for b in np.rint((m["M"] @ x + m["m0"]) * self.unit)]

    def extra_flops_of(self, dropped) -> int:
        """Extra FLOPs of one plan: each re-run of a layer, its forward FLOPs."""
        return sum(self.flops[L] * len(when) for L, when in self.choice(dropped).items())
