"""The commands about the device a network runs on:

- ``snlite launches NET``: the launch report of one training iteration (:mod:`kernels.launches`),
  with each conv step's algorithm and chunk as :func:`snlite.simulate` chooses them on the meta
  device. The report lives in ``kernels.launches``, which never imports snlite; building the
  network and planning its convolutions is snlite's part, so the command is here.
- ``snlite costs NET``: every layer's forward time measured on a device (:mod:`snlite.costs`), and
  the cheap layers too slow there to re-run, as the ``--recompute-keep`` flag that keeps them."""
from __future__ import annotations

from kernels import launches as L
from kernels.registers import measure_resources
from snlite.cli_args import EXIT_OK, CliError, _batch, _budget, _float_in, _positive_int
from snlite.cli_common import add_net_argument, builder_of
from snlite.config import MemoryConfig
from snlite.costs import cost_table, measure_layer_costs
from snlite.device import DEVICE_NAMES
from snlite.pipeline import simulate
from snlite.recompute import expensive_layers


def _add_network(p) -> None:
    add_net_argument(p)
    p.add_argument("--batch", type=_batch, help="batch size (default: the model's; 32 for a PyTorch module)")


def _network(args):
    """NET (the zoo's or a PyTorch module) at --batch; an unknown name is a one-line error."""
    try:
        return builder_of(args)(args.batch)
    except ValueError as e:
        raise CliError(str(e)) from None


def add_launches_command(sub) -> None:
    p = sub.add_parser("launches", help="what one training iteration launches on a GPU, and how well each "
                                        "launch fills it (on the CPU: no GPU, no data)",
                       description="Run every layer's launchers on shape-only arrays (every launch recorded, "
                                   "none run) with the conv algorithms snlite.simulate chooses, then count "
                                   "blocks, occupancy and waves on a GPU. Registers come from "
                                   "kernels/registers.json (re-measure it with python -m kernels.launches "
                                   "--registers).")
    _add_network(p)
    p.add_argument("--gpu", type=str.upper, choices=sorted(L.GPUS), default="H200",
                   help="the GPU to count waves on (in any case, as elsewhere)")
    p.add_argument("--workspace", choices=("none", "fastest", "dynamic"), default="dynamic",
                   help="conv workspace policy for snlite.simulate (default dynamic; unlimited = fastest)")
    p.add_argument("--budget", type=_budget, metavar="SIZE", help="device memory budget (default: unlimited)")
    p.add_argument("--conv", action="store_true", help="only the convolutions' rows")
    p.add_argument("--ptxas", action="store_true",
                   help="measure registers with ptxas now, not from the table")


def cmd_launches(args) -> int:
    graph = _network(args)
    config = MemoryConfig(liveness=True, workspace=args.workspace, budget_bytes=args.budget)
    trace = simulate(graph, config)
    rows = L.network_launches(graph, trace.conv_choices)
    used = {launch.kernel for r in rows for launch in r.launches}
    measured = measure_resources(used, (L.GPUS[args.gpu].arch,)) if args.ptxas else None
    print(f"launch report: {graph.name}, batch {graph.input_shape[0]}, one training iteration (forward, "
          f"backward, SGD); conv algorithms as snlite.simulate chose them under {config.describe()}")
    print(L.format_report(rows, L.GPUS[args.gpu], measured, conv_only=args.conv))
    return EXIT_OK


def add_costs_command(sub) -> None:
    p = sub.add_parser("costs", help="every layer's forward time on a device, and the cheap layers too slow "
                                     "there to re-run",
                       description="Time each layer's forward on DEVICE (a profiled baseline step, the "
                                   "median of --reps), then name the cheap layers (ReLU, pooling, BN, LRN, "
                                   "dropout) slower than --ratio times the mean conv or linear layer: "
                                   "recomputing them there costs more than the paper assumed. Prints the "
                                   "--recompute-keep flag that keeps them.")
    _add_network(p)
    p.add_argument("--device", choices=[d for d in DEVICE_NAMES if d != "meta"], default="host",
                   help="where to measure (default host)")
    p.add_argument("--reps", type=_positive_int, default=3,
                   help="profiled steps; the median is shown (default 3)")
    p.add_argument("--ratio", type=_float_in(0.0, None, low_open=True, what="a ratio > 0"), default=0.5,
                   help="a cheap layer slower than this times the mean conv or linear layer is kept "
                        "(default 0.5)")


def cmd_costs(args) -> int:
    graph = _network(args)
    ms = measure_layer_costs(graph, args.device, reps=args.reps)
    keep = expensive_layers(graph, ms, args.ratio)
    print(f"{graph.name}, batch {graph.input_shape[0]}: forward times on the {args.device} device, median of "
          f"{args.reps} profiled steps")
    print(cost_table(graph, ms, keep))
    if keep:
        print(f"\ntoo slow to re-run here (over {args.ratio:g} x the mean conv or linear forward): keep them "
              f"with --recompute-keep {','.join(keep)}")
    else:
        print(f"\nno cheap layer is over {args.ratio:g} x the mean conv or linear forward here: the paper's "
              "rule stands")
    return EXIT_OK
