"""Check the import-linter contracts of pyproject.toml ([tool.importlinter]).

engine/ and agent/ ship as ``zeroscope.engine`` and ``zeroscope.agent`` (pyproject's
package-dir), but on disk they sit beside zeroscope/, and import-linter (grimp) finds a package's
modules by walking its folder. So the graph is built over a temporary tree laid out as installed:
``zeroscope/`` whose entries link to the real ones, plus ``engine`` and ``agent`` links. Extra
``--probe PATH=SOURCE`` arguments add a file to that tree only (tests/test_layering.py uses them
to prove that each contract fails on a deliberate violation).

Usage: python .ci/lint_imports.py [--probe zeroscope/tui/_probe.py='import torch'] ...
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _mirror(tree: Path, probes: dict[str, str]) -> None:
    """Lay out ``tree/zeroscope`` as the installed package, then write each probe into it (the
    folders a probe lands in become real folders of links, so the repository is never written)."""
    pkg = tree / "zeroscope"
    pkg.mkdir()
    for entry in (ROOT / "zeroscope").iterdir():
        (pkg / entry.name).symlink_to(entry)
    (pkg / "engine").symlink_to(ROOT / "engine")
    (pkg / "agent").symlink_to(ROOT / "agent")
    for rel, source in probes.items():
        parts = Path(rel).parts
        if parts[0] in ("engine", "agent"):
            parts = ("zeroscope", *parts)
        folder = tree
        for name in parts[:-1]:
            folder = folder / name
            if folder.is_symlink():
                real = folder.resolve()
                folder.unlink()
                folder.mkdir()
                for entry in real.iterdir():
                    (folder / entry.name).symlink_to(entry)
        target = folder / parts[-1]
        if target.is_symlink():  # a probe replacing a real module: never write through the link
            target.unlink()
        target.write_text(source)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe", action="append", default=[], metavar="PATH=SOURCE")
    parser.add_argument("--contract", action="append", default=[])
    args = parser.parse_args(argv)
    probes = dict(p.split("=", 1) for p in args.probe)
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    with tempfile.TemporaryDirectory(prefix="zeroscope-imports-") as tmp:
        _mirror(Path(tmp), probes)
        cmd = [lint, "--no-cache", str(ROOT / "pyproject.toml")]
        for contract in args.contract:
            cmd += ["--contract", contract]
        env = {**os.environ, "PYTHONPATH": tmp}
        return subprocess.run(cmd, cwd=tmp, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
