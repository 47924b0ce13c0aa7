"""``zeroscope advise TRACE --verify -- CMD``: run the job again with one piece of advice applied
and set predicted against measured.

The trial writes the changed ds_config next to the original (``<name>.advised-<rule>.json``;
the original is never touched), runs the job under ``zeroscope run --headless --record``, then
reads both traces through ClusterState and compares the figures the advice predicted
(zeroscope.state.advice.measure). A code change (activation checkpointing, ``zero.Init``) cannot
be applied here: the command given must already carry it, and the trial says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zeroscope.state.advice import Advice, Check, checks, measure
from zeroscope.state.advice.patch import apply_change

CONFIG_FLAGS = ("--deepspeed_config", "--deepspeed-config", "--ds_config", "--ds-config")


class TrialError(Exception):
    """A trial that cannot be set up or run (one line)."""


def read_config(path: Path) -> dict[str, Any]:
    """A ds_config as DeepSpeed reads it (hjson accepts // comments)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise TrialError(f"cannot read ds_config {path}: {exc.strerror}") from None
    import hjson

    try:
        raw = hjson.loads(text)
    except (hjson.HjsonDecodeError, ValueError) as exc:
        raise TrialError(f"ds_config {path} is not JSON/hjson: {exc}") from None
    if not isinstance(raw, dict):
        raise TrialError(f"ds_config {path} is not a JSON object")
    return json.loads(json.dumps(raw))


def normalize(cmd: list[str]) -> list[str]:
    """What follows ``zeroscope run``: torchrun flags, the script, its arguments. Accepts the
    command also as ``zeroscope run ...`` or ``torchrun ...``; drops --headless / --record."""
    cmd = list(cmd)
    for lead in (["zeroscope", "run"], ["torchrun"], ["python", "-m", "torch.distributed.run"]):
        if cmd[: len(lead)] == lead:
            cmd = cmd[len(lead) :]
            break
    out, skip = [], False
    for arg in cmd:
        if skip:
            skip = False
        elif arg == "--record":
            skip = True
        elif arg != "--headless" and not arg.startswith("--record="):
            out.append(arg)
    if not out:
        raise TrialError("no command after --: give the job as `zeroscope run` takes it")
    return out


def find_config(cmd: list[str], given: Path | None) -> tuple[int, Path, str] | None:
    """(argument index, path, prefix) of the ds_config in the command; prefix is "--flag="
    when it rides in one argument."""
    for i, arg in enumerate(cmd):
        for flag in CONFIG_FLAGS:
            if arg == flag and i + 1 < len(cmd):
                return i + 1, Path(cmd[i + 1]), ""
            if arg.startswith(flag + "="):
                return i, Path(arg.split("=", 1)[1]), flag + "="
    for i, arg in enumerate(cmd):
        if given is not None and Path(arg).resolve() == given.resolve():
            return i, given, ""
        if given is None and arg.endswith(".json") and Path(arg).is_file():
            return i, Path(arg), ""
    return None


@dataclass
class Trial:
    advice: Advice
    config: Path | None
    """The changed ds_config written for the trial (None: a code change, run as given)."""
    trace: Path
    argv: list[str]
    exit_code: int
    checks: list[Check]
    before: dict[str, float | None]
    after: dict[str, float | None]

    def as_dict(self) -> dict[str, Any]:
        return {
            "advice": self.advice.as_dict(),
            "config": None if self.config is None else str(self.config),
            "trial_trace": str(self.trace),
            "command": self.argv,
            "exit_code": self.exit_code,
            "checks": [
                {
                    "metric": c.metric,
                    "before": c.before,
                    "after": c.after,
                    "measured": c.measured,
                    "predicted": c.predicted,
                    "ratio": c.ratio,
                    "holds": c.holds,
                }
                for c in self.checks
            ],
            "before": self.before,
            "after": self.after,
        }


def _unused(path: Path) -> Path:
    n, candidate = 1, path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return candidate


def run_trial(
    trace: Path,
    advice: Advice,
    before_state: Any,
    cmd: list[str],
    *,
    config: Path | None = None,
    timeout: float | None = None,
) -> Trial:
    """Apply ``advice`` to the job's command, run it recorded, compare with ``trace``."""
    argv = normalize(cmd)
    written = None
    if advice.change.ds_config:
        found = find_config(argv, config)
        if found is None:
            raise TrialError(
                "no ds_config in the command (--deepspeed_config PATH, or give --config PATH)"
            )
        index, path, prefix = found
        changed = apply_change(read_config(path), advice.change.ds_config)
        written = _unused(path.with_name(f"{path.stem}.advised-{advice.rule}.json"))
        written.write_text(json.dumps(changed, indent=2) + "\n")
        argv[index] = prefix + str(written)
    out = _unused(trace.with_name(f"{trace.stem}.trial-{advice.rule}.zstrace"))
    run = [sys.executable, "-m", "zeroscope", "run", "--headless", "--record", str(out), *argv]
    log = out.with_suffix(".log")
    with open(log, "w") as sink:
        try:
            done = subprocess.run(run, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TrialError(f"the trial ran past {timeout:g} s (output in {log})") from None
    if not out.exists():
        raise TrialError(f"the trial recorded nothing (exit {done.returncode}, output in {log})")
    from zeroscope.store.feed import state_of_file

    after_state = state_of_file(out)
    before, after = measure(before_state), measure(after_state)
    return Trial(
        advice, written, out, run, done.returncode, checks(advice, before, after), before, after
    )
