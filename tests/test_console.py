"""zeroscope's terminal shared by its own lines and the job's (zeroscope.run.console), on a real
pipe: a step line never lands at the end of a progress bar or inside a job's unfinished line,
and stdout and stderr on one file count as one."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator

import pytest

from zeroscope.run import console


@pytest.fixture
def screen() -> Iterator[tuple[io.BufferedWriter, io.TextIOWrapper, int]]:
    """A pipe as zeroscope's stdout: the binary stream the relay writes, the text stream
    zeroscope prints on, and the read end."""
    r, w = os.pipe()
    binary = open(w, "wb", closefd=True)  # noqa: SIM115
    text = io.TextIOWrapper(open(os.dup(w), "wb"), write_through=True)  # noqa: SIM115
    yield binary, text, r
    console.flush_due(force=True)
    binary.close()
    text.close()
    os.close(r)


def _read(fd: int) -> bytes:
    return os.read(fd, 1 << 16)


def test_a_step_line_after_a_progress_bar_gets_its_own_line(screen: tuple) -> None:
    binary, text, r = screen
    console.job_output(binary, b"progress 1/3\r")
    console.own_line(text, "step     1")
    assert _read(r) == b"progress 1/3\r\nstep     1\n"
    console.own_line(text, "step     2")  # already on a line start: nothing added
    assert _read(r) == b"step     2\n"


def test_a_step_line_waits_for_the_jobs_unfinished_line(screen: tuple) -> None:
    binary, text, r = screen
    console.job_output(binary, b"LOSS 1.")
    console.own_line(text, "step     1")
    assert _read(r) == b"LOSS 1."  # held back
    console.job_output(binary, b"2345\n")
    assert _read(r) == b"2345\nstep     1\n"


def test_once_the_job_is_over_nothing_waits(screen: tuple) -> None:
    binary, text, r = screen
    console.job_output(binary, b"Continue? [y/N] ")
    console.own_line(text, "step     1")
    console.flush_due(force=True)
    console.own_line(text, "job exit code 0", wait=False)
    assert _read(r) == b"Continue? [y/N] \nstep     1\njob exit code 0\n"


def test_stdout_and_stderr_on_one_file_are_one_screen(screen: tuple) -> None:
    binary, _, r = screen
    err = io.TextIOWrapper(open(os.dup(binary.fileno()), "wb"), write_through=True)  # noqa: SIM115
    try:
        console.job_output(binary, b"progress 2/3\r")
        console.own_line(err, "zeroscope: stopping the job")
        assert _read(r) == b"progress 2/3\r\nzeroscope: stopping the job\n"
    finally:
        err.close()
