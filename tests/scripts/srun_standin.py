"""A stand-in for SLURM's ``srun`` where there is no SLURM: ``srun_standin.py [-n N]
[--export=ALL|NONE|VARS] command ...`` starts N copies of the command the way srun starts a
job step's tasks on one node: each with ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``,
``SLURM_NODEID`` and the environment srun's ``--export`` gives it (ALL, srun's default: the
caller's whole environment; NONE: none of it; a comma list: ALL plus those ``NAME=value``s,
or only the named ones without ALL), and exits with the first non-zero exit status."""

from __future__ import annotations

import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    tasks, export = 1, "ALL"
    while argv and argv[0].startswith("-"):
        flag = argv.pop(0)
        if flag in ("-n", "--ntasks"):
            tasks = int(argv.pop(0))
        elif flag.startswith("--ntasks="):
            tasks = int(flag.split("=", 1)[1])
        elif flag.startswith("--export="):
            export = flag.split("=", 1)[1]
    procs = []
    for task in range(tasks):
        env = _exported(export)
        env.update(
            SLURM_PROCID=str(task),
            SLURM_LOCALID=str(task),
            SLURM_NTASKS=str(tasks),
            SLURM_NODEID="0",
        )
        env.setdefault("PATH", os.defpath)
        procs.append(subprocess.Popen(argv, env=env))
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c), 0)


def _exported(export: str) -> dict[str, str]:
    items = export.split(",")
    env = dict(os.environ) if "ALL" in items else {}
    for item in items:
        name, eq, value = item.partition("=")
        if eq:
            env[name] = value
        elif item not in ("ALL", "NONE") and item in os.environ:
            env[item] = os.environ[item]
    return env


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
