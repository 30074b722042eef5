# %% [markdown]
# # 08 How far from optimal?
#
# What you will learn:
# - the best recomputation plan of a network as an integer program: what its variables mean, and one of
#   its memory constraints written out for AlexNet (`snlite.optimal`, solved by HiGHS through scipy);
# - that the program counts memory exactly as the trace does: its optimum is the peak the runtime then
#   measures, and the plan is an ordinary plan the same runtime executes;
# - where SuperNeurons' recomputation and sqrt(N) checkpointing stand against the exact frontier of
#   peak against extra FLOPs, and which of the paper's choices cost memory (`snlite.gap`).
#
# Run it: `python tutorials/08_how_far_from_optimal.py` from the repository root (after
# `pip install -e ".[optimal]"`), or cell by cell. About 9 s on a CPU (quick mode: fewer frontier
# points, 4 s).

# %% Setup: quick mode, the output folder, plots and checked claims, from one helper (snlite.lesson)
import snlite
from snlite import gap, measure, optimal
from snlite.lesson import MiB, QUICK, expect, save_plot

# %% [markdown]
# ## The plans, and the integer program
# A plan *drops* some layers: their outputs (and what their forward saves) are freed after their last
# forward use, and in backward each dropped layer is re-run before steps that need its outputs, as often
# as the plan likes; each re-run makes a new incarnation, freed after its last use. Any layer may be
# dropped, convolutions included; SuperNeurons drops only the cheap ones. Its speed-centric segments
# (re-run once, keep) and memory-centric ones (re-run for each step, kept only while the next step reads
# them) are plans of this kind.
#
# The decisions, 0 or 1: `d[L]` layer L is dropped; `R[L,j]` L is re-run before backward step j. And
# `C[u,j]`: the incarnation of L's output u is kept from step j - 1 into step j. Linear constraints say
# that a step (or a re-run) that reads u finds it (`C[u,j] + R[L,j] >= d[L]`), and that only what
# existed can be kept (so C, though the solver may treat it as any number from 0 to 1, is 1 exactly
# where it must be). At every moment a launch can happen (each forward step, each possible re-run,
# each backward step) a variable `i[u,slot]` says whether an incarnation of u holds its block there (one
# variable serves every moment and tensor with the same reasons to be held, so its name gives the
# first). The memory at each such moment is a linear sum, at most `peak`, which the program minimises.
# Here is that sum at the busiest moment of AlexNet's optimal plan, in the paper's count (activations
# and gradients at their own sizes).

# %%
batch = 8
net = snlite.models.alexnet(batch=batch)
model = optimal.Model(net, "paper")
best = optimal.solve(net, model=model)
held = model.slot_bytes(best.reruns)  # the bytes at every slot, the program's sums evaluated exactly
at = max(range(len(held)), key=held.__getitem__)
kind, j, layer = model.slots[at]
where = f"{net.steps()[model.bstages[j]].layer}'s backward" if kind == "b" else f"slot {at}"
terms = model.memory[at]
print(f"AlexNet, batch {batch}: {len(model.cands)} layers it may drop, {len(model.slots)} moments, "
      f"{len(model.names)} variables ({model.binaries} binary)")
print(f"the memory at {where}, in bytes:")
print(f"  {terms[-1]:,.0f}   (what is held there whatever the plan)")
for v, c in sorted(terms.items(), key=lambda vc: model.names[vc[0]] if vc[0] >= 0 else ""):
    if v >= 0:
        print(f"  {c:+,.0f} * {model.names[v]}")
print(f"  <= peak\noptimal plan: drop {', '.join(best.dropped)}; peak {best.peak_bytes / MiB:,.1f} MiB, "
      f"+{best.extra_flops / net.flops():.1%} of a forward pass; {best.status}, {best.solve_s:.2f} s")
expect("the sum is a constant (what no plan changes), minus the bytes of each original a drop frees there "
       "(times d), plus the bytes of each incarnation that may be held there (times i)",
       terms[-1] > 0 and any(c < 0 and model.names[v].startswith("d[") for v, c in terms.items() if v >= 0)
       and any(c > 0 and model.names[v].startswith("i[") for v, c in terms.items() if v >= 0))
plan_trace = measure.measure(net, best.plan.config, plan=best.plan).paper
expect(f"the runtime executes the optimal plan with the peak the program predicted, "
       f"{best.peak_bytes / MiB:,.2f} MiB, to the byte", plan_trace.peak_bytes == best.peak_bytes == held[at],
       why="the sums count what the trace counts (the same sizes, in-place dx once, a tensor held from its "
           "allocation to its last use, re-runs in forward order), and the plan is an ordinary snlite plan.")

# %% [markdown]
# ## The gap: each heuristic against the exact planner
# Every strategy runs with liveness on and nothing offloaded, so they differ only in what they recompute.
# For each one the solver answers: the least peak any plan reaches with at most the same extra FLOPs
# (the gap is how far above it the heuristic is), and the fewest extra FLOPs for its peak.

# %%
rows = gap.gap_rows(net, "paper")
fwd = net.flops()
print(f"{'strategy':27} {'peak MiB':>9} {'extra FLOPs':>12} {'least peak, same FLOPs':>23} {'gap':>7} "
      f"{'fewest FLOPs, same peak':>24}")
for r in rows:
    print(f"{r.label:27} {r.peak_bytes / MiB:9,.1f} {r.extra_flops / fwd:12.1%} "
          f"{r.best_peak_bytes / MiB:23,.1f} {r.gap_pct:+6.1f}% {r.fewest_flops / fwd:24.1%}")
row = {r.label: r for r in rows}
ca, sq, opt = row["cost-aware (SuperNeurons)"], row[gap.SQRT], row[gap.OPTIMAL]
expect(f"sqrt(N) checkpointing is far from optimal: {sq.gap_pct:+.0f}% above the least peak for its "
       f"{sq.extra_flops / fwd:.0%} extra FLOPs", sq.gap_pct > 10,
       why="it keeps every 5th layer whatever its size, so it re-runs expensive convolutions to save "
           "small tensors.")
expect(f"cost-aware's peak is the least any plan reaches with its extra FLOPs (gap {ca.gap_pct:+.1f}%), and "
       f"speed-centric's is not ({row['speed-centric'].gap_pct:+.1f}%); but that peak needs only "
       f"{ca.fewest_flops / fwd:.2%} extra FLOPs, not cost-aware's {ca.extra_flops / fwd:.2%}",
       ca.gap_pct == 0 and row["speed-centric"].gap_pct > 0 and ca.fewest_flops < ca.extra_flops,
       why="memory-centric segments re-run whole chains from the checkpoint for every backward step; the "
           "optimum keeps what is cheap to keep and re-runs only the layers whose outputs are large.")
expect("the exact planner reaches a lower peak than any heuristic, by dropping convolutions",
       all(opt.peak_bytes < r.peak_bytes for r in rows[:-1])
       and any(net.layers[L].checkpoint for L in best.dropped))

# %% [markdown]
# ## The frontier
# The least peak for at most 0, 0.1%, 0.2%, ... 100% of a forward pass in extra FLOPs, each a proven
# optimum (`gap.frontier`); the heuristics are drawn as points against it.

# %%
fractions = (0.0, 0.005, 0.5) if QUICK else gap.FRACTIONS
points = gap.frontier(net, "paper", fractions=fractions)
for p in points:
    print(f"peak {p.peak_bytes / MiB:6,.1f} MiB   +{p.extra_flops / fwd:6.1%}   drop "
          f"{', '.join(p.dropped) or '-'}")
expect("along the frontier the peak falls as the extra FLOPs rise, every point proven optimal",
       all(a.peak_bytes > b.peak_bytes and a.extra_flops < b.extra_flops for a, b in zip(points, points[1:]))
       and all(p.optimal for p in points))
save_plot("plot_tradeoff", [{"label": f"exact {i + 1}", "peak_bytes": p.peak_bytes,
                             "extra_flops": p.extra_flops, "base_flops": fwd} for i, p in enumerate(points)]
          + [{"label": r.label, "peak_bytes": r.peak_bytes, "extra_flops": r.extra_flops, "base_flops": fwd}
             for r in rows[:-1]],
          "08_alexnet_frontier.png", title=f"AlexNet batch {batch}: the exact frontier and the heuristics")

# %% [markdown]
# ## Which of the paper's choices cost memory?
# SuperNeurons drops only cheap layers (its checkpoint rule). Give the exact planner the same rule and
# see what the rule alone costs, separately from how the segments are then recomputed.

# %%
cheap = [L for L in optimal.candidates(net) if not net.layers[L].checkpoint]  # the paper's rule
ruled = optimal.solve(net, model=optimal.Model(net, "paper", allowed=cheap))
print(f"exact, cheap layers only: peak {ruled.peak_bytes / MiB:,.1f} MiB, +{ruled.extra_flops / fwd:.1%} "
      f"(drop {', '.join(ruled.dropped)})")
print(f"exact, any layer:         peak {opt.peak_bytes / MiB:,.1f} MiB, +{opt.extra_flops / fwd:.1%}")
print(f"cost-aware:               peak {ca.peak_bytes / MiB:,.1f} MiB, +{ca.extra_flops / fwd:.1%}")
expect("under the paper's checkpoint rule the exact planner reaches cost-aware's peak and no lower: the "
       "rule, not the choice between speed- and memory-centric, is what stands between SuperNeurons "
       "and the optimum",
       ruled.peak_bytes == ca.peak_bytes > opt.peak_bytes)

# %% [markdown]
# ## Exercise
# 1. Change the rule: let the exact planner drop the cheap layers and `conv2` only
#    (`allowed=cheap + ["conv2"]`). How much of the gap between the rule and "any layer" does one
#    convolution close, and for how many extra FLOPs?
# 2. Set `batch = 64`. Does the optimal plan drop the same layers? (The weights do not grow with the batch.)
# 3. Solve in the "all" count (`optimal.Model(net)`): the weights and their gradients now count too. Why
#    does the gap in percent shrink so much?
# 4. Restrict the plans to one re-run per layer, kept until its last use: `gap.gap_rows(net, "paper",
#    reruns="once")`. Which heuristics now have a negative gap, and why?
# 5. The second exact model moves data instead of recomputing: `gap.offload_rows(net, "paper")` (or
#    `snlite optimal alexnet --batch 8 --count paper --offload`). Which tensors does its optimum send to the
#    host that SuperNeurons, which offloads only CONV outputs, keeps?
