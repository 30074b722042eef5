"""Planning benchmarks that need no GPU (the GPU kernel benchmark is ``python -m kernels.bench``).

    python -m snlite.bench deep [--units 2500]   # simulate the deepest ResNet of the paper, timed
    python -m snlite.bench zoo [--batch 16]      # peak / l_peak of the zoo under each preset (Markdown)

Figures are printed, never asserted: timing belongs in benchmarks, not in unit tests.
"""
from __future__ import annotations

import argparse
import time

from snlite.config import MemoryConfig
from snlite.models import DEFAULT_BATCH, get_model, resnet
from snlite.placement import simulate

PRESETS = {
    "baseline": MemoryConfig(),
    "liveness": MemoryConfig(liveness=True),
    "+offload": MemoryConfig(liveness=True, offload=True),
    "+recompute": MemoryConfig(liveness=True, offload=True, recompute="cost_aware"),
    "superneurons": MemoryConfig.superneurons(),
}
ZOO = ("lenet", "alexnet", "vgg16", "resnet50", "resnet101", "resnet152", "inception_v4", "densenet121")


def deep(units: int = 2500, batch: int = 1) -> dict:
    """Build and simulate a ResNet of ``units`` bottleneck units (the paper's deepest run)."""
    depth = 3 * units + 2
    t0 = time.perf_counter()
    g = resnet(depth, batch=batch)
    g.steps()
    built = time.perf_counter() - t0
    out = {"depth": depth, "layers": len(g.layers), "build_s": built}
    for label in ("baseline", "superneurons"):
        t0 = time.perf_counter()
        tr = simulate(g, PRESETS[label].replace(count="paper"))
        out[label] = {"simulate_s": time.perf_counter() - t0, "peak_bytes": tr.peak_bytes,
                      "l_peak_bytes": tr.l_peak_bytes, "steps": len(tr.steps)}
    return out


def zoo_table(batch: int | None = None, count: str = "paper") -> str:
    """Markdown: peak MiB and peak / l_peak per model and preset."""
    head = "| model (batch) | " + " | ".join(PRESETS) + " |"
    rows = [head, "|---" * (len(PRESETS) + 1) + "|"]
    for name in ZOO:
        b = batch or DEFAULT_BATCH.get(name, 16)
        g = get_model(name, batch=b)
        cells = []
        for cfg in PRESETS.values():
            tr = simulate(g, cfg.replace(count=count))
            cells.append(f"{tr.peak_bytes / 2**20:,.0f} MiB ({tr.ratio:.2f})")
        rows.append(f"| {name} ({b}) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m snlite.bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    d = sub.add_parser("deep", help="simulate a ResNet with thousands of residual units, timed")
    d.add_argument("--units", type=int, default=2500)
    d.add_argument("--batch", type=int, default=1)
    z = sub.add_parser("zoo", help="peak and peak/l_peak of the zoo under each preset, as Markdown")
    z.add_argument("--batch", type=int, default=None, help="one batch for all (default: each model's)")
    z.add_argument("--count", choices=("all", "paper"), default="paper")
    args = p.parse_args(argv)
    if args.what == "deep":
        r = deep(args.units, args.batch)
        print(f"ResNet-{r['depth']} ({args.units} residual units, {r['layers']:,d} layers), batch {args.batch}: "
              f"built in {r['build_s']:.2f} s")
        for label in ("baseline", "superneurons"):
            s = r[label]
            print(f"  {label:13} simulated {s['steps']:,d} ops in {s['simulate_s']:.2f} s; peak "
                  f"{s['peak_bytes'] / 2**20:,.1f} MiB (paper count), l_peak {s['l_peak_bytes'] / 2**20:,.1f} MiB")
    else:
        print(zoo_table(args.batch, args.count))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
