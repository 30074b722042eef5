"""Golden digests of the planner's programs: the flag matrix on a small net and the zoo under every
preset, each ``Program.to_json()`` hashed. A refactor of the planner must leave every one unchanged.

    python tests/program_digests.py --write     # store the digests of the code as it is
    python tests/program_digests.py             # compare; prints each case that changed

``tests/test_program_digests.py`` checks the small-net cases on every run; the zoo cases (a minute)
are checked by running this file.
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import sys

from snlite.config import MemoryConfig
from snlite.models import get_model
from snlite.errors import BudgetError
from snlite import bench
from snlite.pipeline import place

HERE = pathlib.Path(__file__).parent
STORE = HERE / "data" / "program_digests.json"
ZOO = ("lenet", "alexnet", "vgg16", "resnet50", "inception_v4", "densenet121")
PRESETS = {  # the benchmark's presets, and more corners of the config
    **bench.PRESETS,
    "superneurons-paper": MemoryConfig.superneurons(schedule="paper"),
    "offload-H200": MemoryConfig(liveness=True, offload=True, schedule="H200", workspace="dynamic"),
    "raw-best": MemoryConfig(liveness=True, recompute="memory", allocator="raw", workspace="fastest"),
    "best-fit": MemoryConfig(liveness=True, offload=True, recompute="speed", fit="best", count="paper"),
}


def digest(fn) -> str:
    """The sha256 of the program ``fn()`` returns, or of the error it raises (its text is output too)."""
    try:
        text = json.dumps(fn().to_json(), sort_keys=True)
    except (BudgetError, ValueError) as e:
        text = f"{type(e).__name__}: {e}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def small_cases():
    """The flag matrix on the mixed net, in three modes, with and without a tight budget, and with
    copies retimed for a GPU."""
    sys.path.insert(0, str(HERE))
    from nets import ALL_CONFIGS, mixed_net

    g = mixed_net()
    arena = {}  # config -> its arena without a budget, placed once

    def budgeted(c, frac, schedule):
        if c not in arena:
            arena[c] = place(g, c).arena_bytes
        return c.replace(budget_bytes=max(1024, int(arena[c] * frac) // 1024 * 1024), schedule=schedule)

    for i, c in enumerate(ALL_CONFIGS):
        for mode in ("train", "grads", "infer", "update"):
            yield f"mixed/{i}/{mode}", (lambda c=c, m=mode: place(g, c, m, optimizer=m != "grads"))
        if c.cache or c.offload:
            for frac in (0.5, 0.7, 0.85):
                for sched in ("paper", "H200"):
                    yield f"mixed/{i}/{frac}/{sched}", \
                        (lambda c=c, f=frac, s=sched: place(g, budgeted(c, f, s)))
    full = arena[MemoryConfig.superneurons()] = place(g, MemoryConfig.superneurons()).arena_bytes
    for sched in ("paper", "H200", "T4"):
        for frac in (None, 0.5, 0.7):
            budget = frac and int(full * frac) // 1024 * 1024
            c = MemoryConfig.superneurons(schedule=sched, budget_bytes=budget)
            yield f"mixed/superneurons/{sched}/{frac}", (lambda c=c: place(g, c))
            c = c.replace(host_budget_bytes=1024)
            yield f"mixed/superneurons/{sched}/{frac}/host", (lambda c=c: place(g, c))


def zoo_cases():
    sys.path.insert(0, str(HERE))
    from nets import convnext_net, gated_net, grouped_net, swin_net, vit_net

    # the zoo, and the small nets of torchvision's later layers (grouped convs; the gated activations;
    # ConvNeXt's layer norms, Linears over channels and layer scale; a vision transformer's attention
    # and token layers; a Swin Transformer's window attention and patch merging)
    for name, g in [(name, get_model(name, batch=8)) for name in ZOO] + [
            ("grouped", grouped_net(n=4)), ("gated", gated_net(n=4)), ("convnext", convnext_net(n=4)),
            ("vit", vit_net(n=4)), ("swin", swin_net(n=4))]:
        for label, c in PRESETS.items():
            yield f"{name}/{label}", (lambda g=g, c=c: place(g, c))
            if c.cache:
                for frac in (0.25, 0.5, 0.75):
                    full = place(g, c.replace(budget_bytes=None)).arena_bytes
                    b = max(1024, int(full * frac) // 1024 * 1024)
                    yield f"{name}/{label}/{frac}", (lambda g=g, c=c.replace(budget_bytes=b): place(g, c))


def compute(which=("small", "zoo")) -> dict:
    out = {}
    for kind, cases in (("small", small_cases), ("zoo", zoo_cases)):
        if kind in which:
            out.update({key: digest(fn) for key, fn in cases()})
    return out


def main(argv) -> int:
    if "--write" in argv:
        STORE.write_text(json.dumps(compute(), indent=0, sort_keys=True) + "\n")
        print(f"wrote {STORE}")
        return 0
    stored = json.loads(STORE.read_text())
    now = compute()
    changed = [k for k in sorted(set(stored) | set(now)) if stored.get(k) != now.get(k)]
    for k in changed:
        print(f"changed: {k} {stored.get(k)} -> {now.get(k)}")
    print(f"{len(now) - len(changed)} of {len(now)} programs unchanged")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
