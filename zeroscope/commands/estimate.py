"""``zeroscope estimate``: model-state memory per rank by the ZeRO formulas (zeroscope.formulas).

Prints one row per stage (or only ``--stage``), the same figures the Memory screen shows as
"predicted", so an estimate made before a run can be held against what the run measures.
"""

from __future__ import annotations

import argparse

from zeroscope.formulas import GB, comm_bytes_per_step, model_state_bytes

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


def _gb(value: float) -> str:
    """GB with one decimal, like the paper; parts under 1 GB get three significant digits."""
    if value == 0 or value >= GB:
        return f"{value / GB:9.1f}"
    return f"{value / GB:9.3g}"


def main(args: argparse.Namespace) -> int:
    from zeroscope.cli import CliError

    if args.stage is not None and args.offload != "none" and args.stage == 0:
        raise CliError("--offload needs ZeRO stage 1, 2 or 3 (got --stage 0)")
    if args.offload_param != "none" and args.stage not in (None, 3):
        raise CliError(f"--offload-param needs ZeRO stage 3 (got --stage {args.stage})")
    stages = [args.stage] if args.stage is not None else [0, 1, 2, 3]
    print(
        f"model states of {args.params:.4g} parameters on {args.ranks} ranks, {args.precision}, "
        f"offload_optimizer={args.offload}, offload_param={args.offload_param} (GB = 1e9 bytes)"
    )
    print(f"{'stage':>5} {'P':>9} {'G':>9} {'O':>9} {'device':>9} {'host':>9} {'comm/step':>10}")
    for stage in stages:
        # Without --stage every stage is listed; offloads apply where that stage allows them.
        offload = args.offload if stage >= 1 else "none"
        offload_param = args.offload_param if stage == 3 else "none"
        m = model_state_bytes(
            args.params, args.ranks, stage, args.precision, offload, offload_param
        )
        comm = comm_bytes_per_step(args.params, stage, args.precision)
        print(
            f"{stage:>5} {_gb(m.params + m.host_params)} {_gb(m.grads + m.host_grads)} "
            f"{_gb(m.optim + m.host_optim)} {_gb(m.device_total)} {_gb(m.host_total)} "
            f"{comm / GB:9.1f}"
        )
    return 0
