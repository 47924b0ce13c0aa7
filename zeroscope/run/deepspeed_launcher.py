"""``zeroscope run`` with the DeepSpeed launcher's flags: ``deepspeed [flags] train.py [args]``
becomes ``zeroscope run [flags] train.py [args]``.

As with torchrun we re-implement nothing: the job runs DeepSpeed's own launcher
(``deepspeed.launcher.runner.main``, inside :mod:`zeroscope.run.deepspeed_main`), which resolves
the hostfile, ``--include``/``--exclude`` and ``--num_gpus``/``--num_nodes`` itself and starts
``deepspeed.launcher.launch`` (each rank gets ``--local_rank=N`` as under ``deepspeed``).

Which launcher runs is decided by the flags: any flag only DeepSpeed's launcher has
(``--num_gpus``, ``--hostfile`` ...) picks it; otherwise torchrun. The flags both launchers have
(``--master_addr``, ``--master_port``, ``--node_rank``, ``--module``, ``--no_python``) go to
whichever runs; a flag only torchrun has beside one only DeepSpeed has is a usage error.
"""

from __future__ import annotations

import argparse
import sys

from zeroscope.run.launch import TORCHRUN_OPTIONS

DEEPSPEED_ONLY_OPTIONS: tuple[tuple[tuple[str, ...], bool], ...] = (
    # DeepSpeed 0.19's deepspeed.launcher.runner parser, less the options torchrun's table
    # already has (SHARED below); True when it takes a value. tests/test_run_deepspeed_flags.py
    # checks both tables against the installed DeepSpeed's own parser.
    (("-H", "--hostfile"), True),
    (("-i", "--include"), True),
    (("-e", "--exclude"), True),
    (("--num_nodes",), True),
    (("--num_gpus", "--num_accelerators"), True),
    (("--launcher",), True),
    (("--launcher_args",), True),
    (("--no_local_rank",), False),
    (("--no_ssh",), False),
    (("--no_ssh_check",), False),
    (("--force_multi",), False),
    (("--save_pid",), False),
    (("--enable_each_rank_log",), True),
    (("--autotuning",), True),
    (("--bind_cores_to_rank",), False),
    (("--bind_core_list",), True),
    (("--ssh_port",), True),
    (("--venv_script",), True),
    (("--log_level",), True),
    (("-q", "--quiet"), False),
)
SHARED_OPTIONS: tuple[tuple[str, bool], ...] = (
    # DeepSpeed's spelling (sent to its launcher); torchrun's table defines the option and its
    # destination (the same name in both parsers).
    ("--master_port", True),
    ("--master_addr", True),
    ("--node_rank", True),
    ("--module", False),
    ("--no_python", False),
)
DEEPSPEED_MODULE = "zeroscope.run.deepspeed_main"
"""DeepSpeed's launcher, supervised: it dies with zeroscope and stops its ranks on request."""


def _dest(names: tuple[str, ...]) -> str:
    return next(n for n in names if n.startswith("--"))[2:]


def _shared_dests() -> set[str]:
    return {name[2:] for name, _ in SHARED_OPTIONS}


def _torchrun_only_dests() -> list[tuple[str, str]]:
    """(destination, the flag as shown) of every option only torchrun has."""
    out = []
    for names, _ in TORCHRUN_OPTIONS:
        long = next(n for n in names if n.startswith("--"))
        dest = long[2:].replace("-", "_")
        if dest not in _shared_dests():
            out.append((dest, long))
    return out


def add_deepspeed_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "DeepSpeed launcher (any of these runs deepspeed.launcher.runner instead of torchrun)"
    )
    for names, takes_value in DEEPSPEED_ONLY_OPTIONS:
        if takes_value:
            group.add_argument(*names, dest=_dest(names), default=None)
        else:
            group.add_argument(*names, dest=_dest(names), action="store_true")


def uses_deepspeed_launcher(args: argparse.Namespace) -> bool:
    """True when a flag only DeepSpeed's launcher has was given."""
    return any(getattr(args, _dest(names), None) for names, _ in DEEPSPEED_ONLY_OPTIONS)


def mixed_launcher_flags(args: argparse.Namespace) -> str | None:
    """The torchrun-only flag given beside DeepSpeed launcher flags (a usage error), or None."""
    if not uses_deepspeed_launcher(args):
        return None
    for dest, shown in _torchrun_only_dests():
        if getattr(args, dest, None):
            return shown
    return None


def deepspeed_argv(args: argparse.Namespace, script: str, script_args: list[str]) -> list[str]:
    """``python -m zeroscope.run.deepspeed_main [launcher flags] script [args]`` for this
    interpreter; DeepSpeed's own parser reads the flags (``--flag=value``, so a value that
    starts with a dash stays a value)."""
    argv = [sys.executable, "-m", DEEPSPEED_MODULE]
    flags = [
        (_dest(n), next(x for x in n if x.startswith("--")), v) for n, v in DEEPSPEED_ONLY_OPTIONS
    ]
    flags += [(name[2:], name, v) for name, v in SHARED_OPTIONS]
    for dest, flag, takes_value in flags:
        value = getattr(args, dest, None)
        if takes_value and value is not None:
            argv.append(f"{flag}={value}")
        elif not takes_value and value:
            argv.append(flag)
    return [*argv, script, *script_args]
