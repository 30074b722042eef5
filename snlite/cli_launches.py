"""``snlite launches NET``: the launch report of one training iteration (:mod:`kernels.launches`),
with each conv step's algorithm and chunk as :func:`snlite.simulate` chooses them on the meta device.

The report itself lives in ``kernels.launches``, which never imports snlite; building the network
and planning its convolutions is snlite's part, so the command is here."""
from __future__ import annotations

from kernels import launches as L
from snlite.cli_args import EXIT_OK, CliError, _budget, _positive_int


def add_launches_command(sub) -> None:
    p = sub.add_parser("launches", help="what one training iteration launches on a GPU, and how well each launch "
                                        "fills it (on the CPU: no GPU, no data)",
                       description="Run every layer's launchers on shape-only arrays (every launch recorded, none "
                                   "run) with the conv algorithms snlite.simulate chooses, then count blocks, "
                                   "occupancy and waves on a GPU. Registers come from kernels/registers.json "
                                   "(re-measure it with python -m kernels.launches --registers).")
    p.add_argument("net", metavar="NET", help="a model of the zoo (snlite.models), e.g. alexnet, resnet50")
    p.add_argument("--batch", type=_positive_int, help="batch size (default: the model's)")
    p.add_argument("--gpu", choices=sorted(L.GPUS), default="H200", help="the GPU to count waves on")
    p.add_argument("--workspace", choices=("none", "fastest", "dynamic"), default="dynamic",
                   help="conv workspace policy for snlite.simulate (default dynamic; unlimited = fastest)")
    p.add_argument("--budget", type=_budget, metavar="SIZE", help="device memory budget (default: unlimited)")
    p.add_argument("--conv", action="store_true", help="only the convolutions' rows")
    p.add_argument("--ptxas", action="store_true", help="measure registers with ptxas now, not from the table")


def cmd_launches(args) -> int:
    import snlite
    from snlite import MemoryConfig

    try:
        graph = snlite.models.get_model(args.net, batch=args.batch)
    except ValueError as e:
        raise CliError(str(e)) from None
    config = MemoryConfig(liveness=True, workspace=args.workspace, budget_bytes=args.budget)
    trace = snlite.simulate(graph, config)
    rows = L.network_launches(graph, trace.conv_choices)
    used = {launch.kernel for r in rows for launch in r.launches}
    measured = L.measure_resources(used, (L.GPUS[args.gpu].arch,)) if args.ptxas else None
    print(f"launch report: {graph.name}, batch {graph.input_shape[0]}, one training iteration (forward, backward, "
          f"SGD); conv algorithms as snlite.simulate chose them under {config.describe()}")
    print(L.format_report(rows, L.GPUS[args.gpu], measured, conv_only=args.conv))
    return EXIT_OK
