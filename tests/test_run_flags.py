"""``zeroscope run``'s torchrun flags, checked against torch's own parser (the oracle is
``torch.distributed.run.get_args_parser()`` of the installed torch), and its usage errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from torch.distributed.run import get_args_parser

from tests.test_run import _zeroscope
from zeroscope.cli import main
from zeroscope.run.launch import TORCHRUN_MODULE, TORCHRUN_OPTIONS, torchrun_argv


def _torch_options() -> dict[frozenset[str], bool]:
    """torchrun's options: their spellings -> whether they take a value."""
    out = {}
    for action in get_args_parser()._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            out[frozenset(action.option_strings)] = action.nargs != 0
    return out


def test_every_torchrun_option_with_every_spelling_is_known() -> None:
    ours = {frozenset(names): takes_value for names, takes_value in TORCHRUN_OPTIONS}
    assert ours == _torch_options()


def _run_parser() -> argparse.ArgumentParser:
    from zeroscope.cli import build_parser

    return build_parser("run")


USER_ARGVS = [
    # (torchrun flags as a user types them, the script and its arguments)
    (["--nproc_per_node", "4", "--nnodes=2", "--node-rank", "1", "--master-addr", "h0"], []),
    (
        ["--standalone", "--nproc-per-node", "2", "--rdzv_conf", "a=1,b=2", "--max-restarts", "3"],
        [],
    ),
    (["-m", "--role", "trainer", "--log-dir", "/tmp/l", "-r", "3", "-t", "0:1"], ["--x", "1"]),
    (["--no-python", "--tee", "3", "--redirects", "1", "--local-ranks-filter", "0"], []),
    (["--run-path", "--monitor-interval", "0.5", "--start_method", "fork"], []),
    (
        [
            "--signals-to-handle",
            "SIGTERM,SIGUSR1",
            "--shutdown-timeout",
            "5",
            "--virtual-local-rank",
        ],
        [],
    ),
    (["--duplicate-stdout-filters", "loss,,x", "--event-log-handler", "null"], ["--nnodes", "9"]),
]


@pytest.mark.parametrize(("flags", "script_args"), USER_ARGVS)
def test_torchrun_reads_what_the_user_typed(flags: list[str], script_args: list[str]) -> None:
    """torchrun's parser, fed our argv, must see what it would have seen from the user."""
    args = _run_parser().parse_args(["run", *flags, "train.py", *script_args])
    argv = torchrun_argv(args, args.script, args.script_args)
    assert argv[1:3] == ["-m", TORCHRUN_MODULE]
    expected = get_args_parser().parse_args([*flags, "train.py", *script_args])
    assert get_args_parser().parse_args(argv[3:]) == expected
    # The script's own flags stay its own, even when they look like torchrun's.
    assert argv[argv.index("train.py") + 1 :] == script_args


def test_a_bad_flag_shows_runs_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--nprocs-per-node", "2", "train.py"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    # Run's usage lists every torchrun flag (25 lines): a mistyped flag gets one usage line,
    # the pointer to --help and the nearest real flag, not that wall.
    assert err.splitlines() == [
        "usage: zeroscope run [flags] ... (every flag: zeroscope run --help)",
        "zeroscope run: error: unrecognized arguments: --nprocs-per-node"
        " (did you mean --nproc-per-node?)",
    ]
    full = capsys.readouterr
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert len(full().out.split("options:")[0].splitlines()) > 3  # the wall of usage it spares


def test_a_bad_flag_of_another_verb_shows_that_verbs_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["summary", "--jsn", "t.zstrace"])
    err = capsys.readouterr().err
    assert err.startswith("usage: zeroscope summary ")
    assert err.splitlines()[-1] == (
        "zeroscope summary: error: unrecognized arguments: --jsn (did you mean --json?)"
    )


def test_a_module_or_a_program_is_not_looked_for_as_a_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A missing file is refused before anything starts ...
    assert main(["run", "--headless", "no/such/train.py"]) == 2
    assert "no such training script" in capsys.readouterr().err
    # ... but -m names a module and --no-python a program: torchrun resolves those.
    from zeroscope.run.launch import runs_a_file

    parser = _run_parser()
    assert not runs_a_file(parser.parse_args(["run", "-m", "pkg.train"]))
    assert not runs_a_file(parser.parse_args(["run", "--no-python", "echo"]))
    assert runs_a_file(parser.parse_args(["run", "train.py"]))


@pytest.mark.slow
def test_module_role_log_dir_and_redirects_reach_torchrun(tmp_path: Path) -> None:
    package = tmp_path / "pkgx"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(
        "import os\nprint(f\"role={os.environ['ROLE_NAME']} rank={os.environ['RANK']}\")\n"
    )
    run = _zeroscope(
        "run",
        "--headless",
        "--nproc-per-node",
        "2",
        "--role",
        "trainer",
        "--log-dir",
        "logs",
        "--redirects",
        "3",
        "-m",
        "pkgx.train",
        cwd=tmp_path,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    # torchrun's own layout: <log-dir>/<run id>/attempt_0/<local rank>/stdout.log
    outs = sorted(tmp_path.glob("logs/*/attempt_0/*/stdout.log"))
    assert [p.read_text().strip() for p in outs] == ["role=trainer rank=0", "role=trainer rank=1"]
    assert "role=" not in run.stdout  # redirected, as asked


@pytest.mark.slow
def test_no_python_runs_a_program(tmp_path: Path) -> None:
    run = _zeroscope(
        *("run", "--headless", "--nproc-per-node", "1", "--no-python", "echo", "hello"),
        cwd=tmp_path,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "hello" in run.stdout.splitlines()
