"""``zeroscope advise TARGET``: which ds_config change buys how much memory or time.

TARGET is a trace (the advice is read off what was measured, zeroscope.state.advice) or a
ds_config file (preflight: what DeepSpeed will refuse or ignore at ``--world-size``). Text by
default; ``--json`` prints a list of ``{"rule", "evidence", "change", "saves_bytes", "saves_ms",
"confidence", ...}`` sorted by gain, then the rules that could not judge (``"change": null``,
``"missing"``: what they lacked). ``--verify -- CMD`` runs the job (as ``zeroscope run`` takes
it) with the top change applied and prints predicted against measured (zeroscope/run/advice_trial.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HELP = "which ds_config change buys how much memory or time, from a trace or a ds_config"

SQLITE_MAGIC = b"SQLite format 3\x00"


def _bytes(text: str) -> int:
    units = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30}
    t = text.strip().lower().removesuffix("b")
    for suffix in sorted(units, key=len, reverse=True):
        if t.endswith(suffix):
            try:
                return int(float(t[: -len(suffix)]) * units[suffix])
            except ValueError:
                break
    try:
        value = int(float(t))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 80GB, 24GiB)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"the size must be > 0, not {text!r}")
    return value


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--device-memory", type=_bytes, metavar="SIZE",
        help="device memory per rank to advise for (default: what the ranks reported)",
    )  # fmt: skip
    parser.add_argument("--world-size", type=int, default=None, help="preflight: ranks in all")
    parser.add_argument("--pipeline-stages", type=int, default=1, help="preflight: pp degree")
    parser.add_argument("--tensor-parallel", type=int, default=1, help="preflight: tp degree")
    parser.add_argument(
        "--per-device-train-batch-size", "--per_device_train_batch_size", type=int,
        dest="per_device", metavar="B",
        help='preflight of a Hugging Face config: the Trainer\'s value its "auto" keys take',
    )  # fmt: skip
    parser.add_argument(
        "--gradient-accumulation-steps", "--gradient_accumulation_steps", type=int,
        dest="accumulation", metavar="K", help="preflight of a Hugging Face config: the same",
    )  # fmt: skip
    parser.add_argument("--rule", help="--verify this rule's advice instead of the top one")
    parser.add_argument("--config", type=Path, help="--verify: the ds_config in the command")
    parser.add_argument("--timeout", type=float, default=None, help="--verify: trial limit [s]")
    parser.add_argument(
        "--verify", action="store_true",
        help="run the job (the command after --, as `zeroscope run` takes it) with the top "
        "change applied, and compare predicted with measured",
    )  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", type=Path, help="a trace, or a ds_config for preflight")
    _add_options(parser)
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="-- the job's command (with --verify)"
    )


def split_command(args: argparse.Namespace) -> None:
    """Options after TARGET land in ``command`` (argparse's remainder is greedy): read them
    up to ``--``; what follows ``--`` is the job's command."""
    rest = list(args.command)
    cut = rest.index("--") if "--" in rest else len(rest)
    options, args.command = rest[:cut], rest[cut + 1 :]
    if options:
        parser = argparse.ArgumentParser(prog="zeroscope advise", add_help=False)
        _add_options(parser)
        parser.parse_args(options, namespace=args)


def _is_trace(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def format_advice(advisory: Any, judged: str = "what was measured") -> str:
    """The text report: each advice with its evidence, change and price; then what was not
    judged and why (``judged``: what the rules read, a run or a ds_config)."""
    from zeroscope.state.viewmodel import price_words

    lines = []
    if not advisory.advice:
        lines.append(f"no advice: no rule found a change worth making in {judged}")
    for i, a in enumerate(advisory.advice, 1):
        price = price_words(a.saves_ms, a.saves_bytes)
        tag = "ERROR " if a.severity == "error" else ""
        lines.append(f"{i}. {tag}[{a.rule}] {a.title}")
        lines.append(f"   price:    {', '.join(price) or 'none'} (confidence {a.confidence})")
        lines += [f"   evidence: {e}" for e in a.evidence]
        lines.append(f"   change:   {a.change.text}")
        lines.append(f"   formula:  {a.formula}")
    for n in advisory.not_judged:
        lines.append(f"not judged [{n.rule}]: {n.missing}")
    return "\n".join(lines)


def format_trial(trial: Any) -> str:
    a = trial.advice
    lines = [f"verify [{a.rule}] {a.title}", f"  change: {a.change.text}"]
    if trial.config is not None:
        lines.append(f"  wrote {trial.config}")
    else:
        lines.append("  a code change: the command was run as given (it must carry the change)")
    lines.append(f"  trial: {trial.trace} (job exit code {trial.exit_code})")
    lines.append(
        f"  {'figure':<18} {'before':>12} {'after':>12} {'measured':>12} {'predicted':>12}  ratio"
    )
    for c in trial.checks:

        def f(v: float | None) -> str:
            return "NA" if v is None else f"{v:,.2f}"

        ok = {True: "ok", False: "NOT HELD", None: "NA"}[c.holds]
        ratio = "NA" if c.ratio is None else f"{c.ratio:.2f}"
        lines.append(
            f"  {c.metric:<18} {f(c.before):>12} {f(c.after):>12} {f(c.measured):>12} "
            f"{f(c.predicted):>12}  {ratio} {ok}"
        )
    if not trial.checks:
        lines.append("  nothing to compare: the advice predicts no measured figure")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from zeroscope.cli import CliError

    split_command(args)
    if args.command and not args.verify:
        raise CliError(
            f"unexpected arguments {' '.join(args.command)!r} (a command needs --verify)"
        )
    if not args.target.exists():
        raise CliError(f"no such trace or ds_config: {args.target}")
    if args.target.is_dir():
        raise CliError(f"{args.target} is a directory, not a trace or a ds_config")
    if not _is_trace(args.target):
        if args.target.suffix == ".zstrace":  # named as a trace, but no SQLite file
            raise CliError(f"{args.target}: not a zeroscope trace (no SQLite header)")
        return _preflight(args)
    from zeroscope.state.viewmodel import advise
    from zeroscope.store.feed import state_of_file
    from zeroscope.store.trace import TraceError

    try:
        state = state_of_file(args.target)
    except TraceError as exc:
        raise CliError(str(exc)) from None
    advisory = advise(state, capacity=args.device_memory)
    if not args.verify:
        if args.json:
            rows = [a.as_dict() for a in advisory.advice] + [
                n.as_dict() for n in advisory.not_judged
            ]
            json.dump(rows, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            print(format_advice(advisory))
        return 0
    return _verify(args, state, advisory)


def _verify(args: argparse.Namespace, state: Any, advisory: Any) -> int:
    from zeroscope.cli import CliError
    from zeroscope.run.advice_trial import TrialError, run_trial

    cmd = args.command
    candidates = [
        a for a in advisory.advice
        if (a.change.ds_config or a.change.code) and (a.ms_metric or a.bytes_metric)
        and (args.rule is None or a.rule == args.rule)
    ]  # fmt: skip
    if not candidates:
        raise CliError(
            "nothing to verify: no advice with a measurable prediction"
            + (f" for rule {args.rule!r}" if args.rule else "")
        )
    try:
        trial = run_trial(
            args.target, candidates[0], state, cmd, config=args.config, timeout=args.timeout
        )
    except TrialError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        json.dump(trial.as_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_trial(trial))
    return 0 if trial.exit_code == 0 else trial.exit_code


def _preflight(args: argparse.Namespace) -> int:
    from zeroscope.cli import CliError
    from zeroscope.run.advice_trial import TrialError, read_config
    from zeroscope.state.viewmodel import Advisory, preflight

    if args.world_size is None or args.world_size < 1:
        raise CliError("a ds_config needs --world-size N (the ranks it will run on)")
    given = (args.per_device, args.accumulation)
    if (given[0] is None) != (given[1] is None) or any(v is not None and v < 1 for v in given):
        raise CliError(
            "--per-device-train-batch-size and --gradient-accumulation-steps go together, "
            "each a positive count (the Trainer's values for the ds_config's \"auto\" keys)"
        )
    try:
        raw = read_config(args.target)
    except TrialError as exc:
        raise CliError(str(exc)) from None
    found = preflight(
        raw,
        args.world_size,
        pipeline_stages=args.pipeline_stages,
        tensor_parallel=args.tensor_parallel,
        trainer=None if args.per_device is None else (args.per_device, args.accumulation),
    )
    if args.json:
        json.dump([a.as_dict() for a in found], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_advice(Advisory(found, []), "the ds_config at this world size"))
    return 1 if any(a.severity == "error" for a in found) else 0
