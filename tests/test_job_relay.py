"""The job's output relay on real pipes: every byte to the log, the job's lines (tracebacks
included) to the terminal, progress bars and endless lines passed on as they come, and a terminal that goes
away (| head) never stops the reading (the job would block on a full pipe)."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path

from zeroscope.run.job_errors import ErrorScanner
from zeroscope.run.job_relay import OutputRelay

TRACEBACK = (
    b"[rank0]: Traceback (most recent call last):\n"
    b'[rank0]:   File "train.py", line 1, in <module>\n'
    b"[rank0]: ValueError: bad config\n"
)


class _Gone(io.RawIOBase):
    """A sink whose reader went away."""

    def write(self, data: object) -> int:
        raise BrokenPipeError


def _relay(tmp_path: Path, out: object, err: object) -> tuple[OutputRelay, int, int, ErrorScanner]:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    scanner = ErrorScanner()
    relay = OutputRelay(
        out_r, err_r, log=str(tmp_path / "job.log"), forward=True, scanner=scanner,
        out=out, err=err,  # type: ignore[arg-type]
    )  # fmt: skip
    return relay, out_w, err_w, scanner


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def test_everything_to_the_log_and_the_jobs_lines_to_the_terminal(tmp_path: Path) -> None:
    out, err = io.BytesIO(), io.BytesIO()
    relay, out_w, err_w, scanner = _relay(tmp_path, out, err)
    stdout = b"step 1\rstep 2\rdone\n"
    for piece in (b"step 1\r", b"step 2\rdone\n"):
        os.write(out_w, piece)
    os.close(out_w)
    endless = b"x" * (3 << 20)  # one line with no end, larger than what is held back
    stderr = b"warning: slow disk\n" + TRACEBACK + b"\n" + endless
    writer = threading.Thread(target=_write_all, args=(err_w, stderr))
    writer.start()
    writer.join()
    os.close(err_w)
    assert relay.join(30)
    assert out.getvalue() == stdout
    assert err.getvalue() == stderr  # the traceback too: it is the job's output
    assert scanner.error_of(0) == "ValueError: bad config"
    log = (tmp_path / "job.log").read_bytes()
    assert len(log) == len(stdout) + len(stderr)
    assert TRACEBACK in log and stdout in log


def test_a_terminal_that_goes_away_stops_the_showing_not_the_reading(tmp_path: Path) -> None:
    relay, out_w, err_w, _ = _relay(tmp_path, _Gone(), io.BytesIO())
    data = b"loss 0.1\n" * 200_000  # 1.8 MB: far past a pipe's buffer
    _write_all(out_w, data)  # would block for ever if the relay stopped reading
    os.close(out_w)
    os.close(err_w)
    assert relay.join(30)
    assert (tmp_path / "job.log").read_bytes() == data
