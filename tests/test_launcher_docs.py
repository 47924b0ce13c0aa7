"""The launcher pages of docs/engines/ say what tests them, and those tests exist; their
``zeroscope run`` command lines parse as ``zeroscope run``'s own parser reads them and pick the
launcher the page says. A page that names no test must say it is not yet tested."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from zeroscope.cli import build_parser
from zeroscope.run.deepspeed_launcher import uses_deepspeed_launcher

DOCS = Path(__file__).resolve().parent.parent / "docs" / "engines"
LAUNCHERS = ["torchrun", "deepspeed-launcher", "accelerate", "srun", "llama-factory"]


@pytest.mark.parametrize("page", LAUNCHERS)
def test_each_launcher_page_names_tests_that_exist(page: str) -> None:
    text = (DOCS / f"{page}.md").read_text()
    named = set(re.findall(r"tests/test_\w+\.py", text))
    for test in named:
        assert (DOCS.parent.parent / test).is_file(), (page, test)
    if not named:
        assert "not yet tested" in text.lower(), page
    else:
        assert "## Tested by" in text, page


def _commands(page: str) -> list[list[str]]:
    text = (DOCS / f"{page}.md").read_text().replace("\\\n", " ")
    return [shlex.split(line) for line in text.splitlines() if line.startswith("zeroscope run ")]


@pytest.mark.parametrize(("page", "deepspeed"), [("torchrun", False), ("deepspeed-launcher", True)])
def test_the_pages_run_commands_parse_and_pick_their_launcher(page: str, deepspeed: bool) -> None:
    commands = _commands(page)
    assert len(commands) >= 2
    for argv in commands:
        args = build_parser("run").parse_args(argv[1:])
        assert args.script == "train.py"
        assert uses_deepspeed_launcher(args) is deepspeed, argv


def test_the_llama_factory_commands_run_its_launcher_module_under_torchrun() -> None:
    """The page's ``zeroscope run`` lines start LLaMA-Factory's own torchrun module, as
    ``llamafactory-cli train`` does, under torchrun."""
    commands = _commands("llama-factory")
    assert len(commands) >= 2
    for argv in commands:
        args = build_parser("run").parse_args(argv[1:])
        assert args.module and args.script == "llamafactory.launcher", argv
        assert args.nproc_per_node == "2" and not uses_deepspeed_launcher(args)
