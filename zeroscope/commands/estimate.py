"""``zeroscope estimate``: model-state memory per rank by the ZeRO formulas (the rows of
zeroscope.state.estimate.stage_estimates; this module only parses and formats).

Prints one row per stage (or only ``--stage``), the same figures the Memory screen shows as
"predicted", so an estimate made before a run can be held against what the run measures.
"""

from __future__ import annotations

import argparse

from zeroscope.state import units
from zeroscope.state.viewmodel import stage_estimates

HELP = "model-state memory per rank by the ZeRO formulas"


def _count(text: str) -> float:
    """Parameter counts as users write them: 7.5e9, 7.5B, 350M, 1.3b, 125k."""
    suffixes = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
    t = text.strip().lower().replace("_", "")
    scale = suffixes.get(t[-1:], 1.0)
    if t[-1:] in suffixes:
        t = t[:-1]
    try:
        value = float(t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a parameter count: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"the parameter count must be > 0, not {text!r}")
    return value


def _trainable(text: str) -> tuple[bool, float]:
    """``--trainable``: (is a share, value). A share of Ψ is below 1 (0.03, 3e-2) or written
    1.0; anything else is a count, written as ``--params`` takes it (3584, 20M)."""
    value = _count(text)
    return value < 1 or (value == 1 and "." in text), value


def trainable_count(psi: float, trainable: tuple[bool, float] | None) -> float:
    """Trainable parameters from ``--trainable``; all of Ψ without it."""
    if trainable is None:
        return psi
    share, value = trainable
    count = value * psi if share else value
    if count > psi:
        from zeroscope.cli import CliError

        raise CliError(f"--trainable {count:.4g} is more than --params {psi:.4g}")
    return count


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", type=_count, required=True, help="Ψ: 7.5e9, 7.5B, 350M")
    parser.add_argument("--ranks", type=_positive_int, default=1, help="data-parallel size N")
    parser.add_argument("--stage", type=int, choices=[0, 1, 2, 3], help="only this ZeRO stage")
    parser.add_argument(
        "--offload", choices=["none", "cpu", "nvme"], default="none", help="offload_optimizer"
    )
    parser.add_argument(
        "--offload-param", choices=["none", "cpu", "nvme"], default="none", help="stage 3 only"
    )
    parser.add_argument("--precision", choices=["fp16", "bf16", "fp32"], default="fp16")
    parser.add_argument(
        "--trainable",
        type=_trainable,
        help="parameters the optimizer steps (LoRA, partial fine-tuning): a share of Ψ such "
        "as 0.03, or a count such as 3584 or 20M (default: all). P holds every parameter, "
        "G and O only the trainable ones",
    )


def main(args: argparse.Namespace) -> int:
    from zeroscope.cli import CliError

    if args.stage is not None and args.offload != "none" and args.stage == 0:
        raise CliError("--offload needs ZeRO stage 1, 2 or 3 (got --stage 0)")
    if args.offload_param != "none" and args.stage not in (None, 3):
        raise CliError(f"--offload-param needs ZeRO stage 3 (got --stage {args.stage})")
    stages = [args.stage] if args.stage is not None else [0, 1, 2, 3]
    trainable = trainable_count(args.params, getattr(args, "trainable", None))
    share = f" ({trainable:.4g} trainable)" if trainable != args.params else ""
    print(
        f"model states per rank of {args.params:.4g} parameters{share} on {args.ranks} ranks, "
        f"{args.precision}, offload_optimizer={args.offload}, offload_param={args.offload_param}"
    )
    print(
        "P G O device: on each GPU; host: CPU memory; NVMe: on disk; comm/step: message bytes "
        "of a step's collectives (nccl-tests' sizes, as a run counts them); sent/rank: (N-1)/N "
        "of it, what a rank sends on a ring (1 GB = 1e9 bytes)"
    )
    head = ("stage", "P", "G", "O", "device", "host", "NVMe", "comm/step", "sent/rank")
    print(" ".join(f"{h:>9}" if i else f"{h:>5}" for i, h in enumerate(head)))
    for row in stage_estimates(
        args.params,
        args.ranks,
        stages,
        args.precision,
        args.offload,
        args.offload_param,
        trainable=trainable,
    ):
        m = row.memory
        cells = (m.params, m.grads, m.optim, m.device_total, row.host, row.nvme, row.comm, row.sent)
        print(f"{row.stage:>5} " + " ".join(f"{units.size(v):>9}" for v in cells))
    return 0
