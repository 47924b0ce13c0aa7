"""One formatter for every view (zeroscope.state.units): a size reads the same in the TUI, the
headless lines, ``summary`` and ``estimate``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures import RunShape, synthetic_run, write_trace
from zeroscope.cli import main
from zeroscope.state import ClusterState, units
from zeroscope.state.formulas import model_state_bytes
from zeroscope.state.lines import step_line


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [
        (None, "NA"),
        (0, "0B"),
        (999, "999B"),
        (1000, "1.0KB"),
        (31_250, "31.2KB"),
        (1_600_000, "1.6MB"),
        (99_960_000, "100MB"),  # rounds up to the next width, not "100.0MB"
        (999_960_000, "1.0GB"),  # nor "1000MB"
        (120e9, "120GB"),
        (3e15, "3.0PB"),
    ],
)
def test_size_is_decimal_with_a_unit(nbytes: float | None, text: str) -> None:
    assert units.size(nbytes) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "NA"),
        (0.0, "0ms"),
        (0.00004, "40µs"),
        (0.0032, "3.2ms"),
        (0.15, "150ms"),
        (2.5, "2.50s"),
    ],
)
def test_short_times_never_print_as_zero(value: float | None, text: str) -> None:
    assert units.seconds(value) == text


def test_summary_prints_sizes_as_the_live_view_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shape = RunShape(ranks=2, steps=4)
    path = tmp_path / "run.zstrace"
    write_trace(path, synthetic_run(shape))
    assert main(["summary", str(path)]) == 0
    table = capsys.readouterr().out
    # The formula's P per rank for the fixture (stage 3, 2 ranks, 12M parameters): 12.0MB.
    params = model_state_bytes(shape.psi, shape.ranks, 3, "fp16", "cpu").params
    row0 = next(line.split() for line in table.splitlines() if line.split()[:1] == ["0"])
    assert row0[3] == units.size(params) == "12.0MB"  # summary used to print "11.44 MiB"
    state = ClusterState()
    done = state.ingest_all(synthetic_run(shape))
    assert f"P {units.size(params)} " in step_line(done[-1])


def test_the_headless_line_shows_what_offload_moved_to_host_memory() -> None:
    # CPU optimizer offload: O is 0 on the device, the fp32 grads + optimizer states (16Ψ/N)
    # are in host memory. The line used to end at "O 0B" with no host figure.
    shape = RunShape(ranks=2, steps=2, offload_optimizer="cpu")
    state = ClusterState()
    line = step_line(state.ingest_all(synthetic_run(shape))[-1])
    host = 16 * shape.psi / shape.ranks
    assert "O 0B A " in line and f" host {units.size(host)} " in line
    plain = ClusterState()
    line = step_line(
        plain.ingest_all(synthetic_run(RunShape(ranks=2, steps=2, offload_optimizer="none")))[-1]
    )
    assert " host " not in line


def test_a_large_loss_scale_fits_its_column_and_events_say_it_exactly() -> None:
    """2^20 = 1048576 filled the rank table's scale column and ran into the offload one; the
    event log's "2.09715e+06" was cut to "2.0971" on a narrow screen."""
    from zeroscope.agent.loss_scale import scale_text
    from zeroscope.state import units

    assert [units.scale_short(v) for v in (65536.0, 999999.0, 2.0**20, 2.0**40, 3e6)] == [
        "65536",
        "999999",
        "2^20",
        "2^40",
        "3M",
    ]
    assert units.scale_short(None) == "NA" and units.scale_short(0.5) == "0.5"
    assert scale_text(2.0**21) == "2097152" and scale_text(0.25) == "0.25"
    assert scale_text(65536.0) == f"{65536.0:g}"  # unchanged where :g was already exact
