"""The bench harness's pure-Python pieces (no timing): alternation order, medians and paired
ratios, verdicts, table rendering (markdown and JSON), the machine description, CLI parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.__main__ import parse_args, update_docs
from bench.contenders import Spec, ds_config, specs
from bench.harness import (
    Table,
    cell,
    machine_description,
    median,
    paired_ratio,
    render_markdown,
    rotated,
    to_json,
    verdict,
)


def test_rotation_puts_every_contender_in_every_position() -> None:
    names = ["a", "b", "c"]
    orders = [rotated(names, r) for r in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    for position in range(3):
        assert {o[position] for o in orders} == set(names)
    assert rotated(names, 4) == orders[1]
    assert rotated([], 2) == []


def test_paired_ratio_cancels_drift_that_hits_a_whole_round() -> None:
    # The machine gets 10x slower in round 2; b is always 2x a within a round.
    a, b = [1.0, 10.0, 1.0], [2.0, 20.0, 2.0]
    assert paired_ratio(b, a) == 2.0
    assert median(b) / median(a) == 2.0  # type: ignore[operator]
    # One round where the load hit only a: the ratio of medians is fooled, the pairs are not.
    a, b = [1.0, 10.0, 10.0], [2.0, 2.0, 20.0]
    assert median(b) / median(a) == pytest.approx(0.2)  # type: ignore[operator]
    assert paired_ratio(b, a) == 2.0
    assert paired_ratio([1.1, 2.2, 3.3], [1.0, 2.0, 3.0]) == pytest.approx(1.1)
    assert paired_ratio([], []) is None and median([]) is None


def test_verdict_reads_the_ratio_of_zeroscope_to_the_other() -> None:
    assert verdict(1.2).startswith("loses (+20%)")
    assert verdict(0.5).startswith("wins (-50%)")
    assert verdict(1.01) == "par" and verdict(None) == "NA"
    assert verdict(1.2, tolerance=0.3) == "par (noise ±30%)"


def test_table_renders_markdown_and_json_with_na_never_zero() -> None:
    t = Table(title="T", columns=["name", "ms", "ok"], note="a note")
    t.add("x|y", 1.234, True)
    t.add("z", None, False)
    with pytest.raises(ValueError, match="2 cells, expected 3"):
        t.add("a", 1)
    with pytest.raises(ValueError, match="no columns"):
        Table(title="empty", columns=[])
    machine = {"date": "2026-11-29", "cpu": "test cpu"}
    md = render_markdown(machine, [t], command="python -m bench --quick")
    assert "| x\\|y | 1.23 | yes |" in md and "| z | NA | no |" in md
    assert "`python -m bench --quick` on 2026-11-29" in md and "| cpu | test cpu |" in md
    doc = json.loads(to_json(machine, [t], command="python -m bench"))
    assert doc["tables"][0]["rows"][1] == {"name": "z", "ms": None, "ok": False}
    assert cell(0.0) == "0.00" and cell(None) == "NA"


def test_machine_description_names_the_machine() -> None:
    m = machine_description()
    assert m["cores (os.cpu_count)"] and m["torch"] and m["date"]


def test_contenders_pair_each_stage_and_share_one_config() -> None:
    all_specs = specs({"torch", "zeroscope", "deepspeed"})
    stages = {s.stage for s in all_specs}
    for stage in stages:  # every comparison group has exactly one zeroscope row
        mine = [s for s in all_specs if s.stage == stage and s.family == "zeroscope"]
        assert len([s for s in mine if s.kind != "aa"]) == 1
    assert {s.family for s in specs({"torch"})} == {"torch"}
    zs, ds = Spec("z", "zeroscope", "3+offload"), Spec("d", "deepspeed", "3+offload")
    assert ds_config(zs, 800, 8)["zero_optimization"] == ds_config(ds, 800, 8)["zero_optimization"]
    zero = ds_config(zs, 800, 8)["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_param"]["device"] == "cpu"
    assert zero["reduce_bucket_size"] == 25 * 2**20 // 4  # torch DDP's bucket_cap_mb, fp32


def test_cli_parses_sections_and_rejects_unknown_ones(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_args(["--quick", "--only", "engine,agent"])
    assert args.quick and args.sections == ["engine", "agent"]
    with pytest.raises(SystemExit):
        parse_args(["--only", "engine,nope"])
    assert "unknown section(s) nope" in capsys.readouterr().err


def test_update_docs_replaces_only_the_marked_results(tmp_path: Path) -> None:
    doc = tmp_path / "bench.md"
    doc.write_text(
        "# B\nintro\n<!-- results:start (x) -->\nold table\n<!-- results:end -->\nreading\n"
    )
    update_docs(doc, "# results title\n\nnew table\n")
    assert doc.read_text() == (
        "# B\nintro\n<!-- results:start (x) -->\nnew table\n<!-- results:end -->\nreading\n"
    )
    (tmp_path / "plain.md").write_text("no markers")
    with pytest.raises(SystemExit, match="no <!-- results:start"):
        update_docs(tmp_path / "plain.md", "# t\nx")


def test_the_collective_cost_bench_runs_every_variant_through_the_real_agent() -> None:
    """bench/collective_cost.py end to end, two rounds (its figures are timings, not asserted):
    every variant is reported and the live agent's own counters saw the collectives."""
    import subprocess
    import sys

    from bench.collective_cost import VARIANTS

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "bench/collective_cost.py", "--rounds", "2"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    figures = dict(line.strip().rsplit(": ", 1) for line in out.splitlines())
    assert set(VARIANTS) <= set(figures)
    assert float(figures["agent counters us per collective"].split()[0]) > 0


def test_attach_rounds_pair_abccba_blocks() -> None:
    from bench.attach_figures import block_pairs

    # ABCCBA: a mode's two blocks of a round sit at positions 2k and 2k+1 of its list.
    assert block_pairs([1.0, 3.0, 2.0, 2.0]) == [4.0, 4.0]


def test_attach_agent_threads_are_charged_to_the_on_blocks() -> None:
    from bench.attach_figures import per_round

    # One round of ABCCBA blocks per mode (two each), per step: process CPU with the agent's
    # threads inside, and those threads' own CPU (woken on their own timers, in any block).
    rank = {
        "cpu": {"on": [10.0, 10.5], "off": [9.0, 9.5], "off-again": [8.5, 9.0]},
        "agent": {"on": [0.5, 0.0], "off": [1.0, 0.0], "off-again": [0.0, 0.5]},
        "main": {"on": [7.0, 7.0], "off": [6.0, 6.0], "off-again": [6.0, 6.0]},
    }
    cpu = per_round(rank, "cpu")
    # "off" blocks lose their agent-thread CPU; "on" keeps its own and gets what the "off"
    # blocks (next to it) spent beyond the "off-again" ones: 1.0 - 0.5.
    assert cpu == {"on": [20.5 + 0.5], "off": [18.5 - 1.0], "off-again": [17.5 - 0.5]}
    assert per_round(rank, "main") == {"on": [14.0], "off": [12.0], "off-again": [12.0]}


def test_interleaved_steps_charge_the_whole_loops_agent_cpu_to_on_steps() -> None:
    from bench.attach_figures import per_round

    # --interleave: blocks of one step; each block's own agent-thread CPU is taken out of its
    # process CPU, and the agent's CPU over the whole loop (3.0 here, two "on" steps) is
    # charged to the "on" steps alone, 1.5 each.
    rank = {
        "cpu": {"on": [10.0, 10.5], "off": [9.0, 9.5], "off-again": [8.5, 9.0]},
        "agent": {"on": [0.5, 0.0], "off": [1.0, 0.0], "off-again": [0.0, 0.5]},
        "interleave_agent_s": 3.0,
    }
    assert per_round(rank, "cpu") == {
        "on": [20.5 - 0.5 + 2 * 1.5],
        "off": [18.5 - 1.0],
        "off-again": [17.5 - 0.5],
    }


def test_the_goal_is_met_only_when_the_whole_interval_is_under_it() -> None:
    from bench import goal

    quiet = [1.002, 1.004, 0.998, 1.001, 1.003, 0.999, 1.0]
    low, high = goal.median_interval(quiet) or (0.0, 0.0)
    assert min(quiet) <= low <= 1.001 <= high <= max(quiet)
    assert goal.median_interval(quiet) == (
        low,
        high,
    )  # a fixed seed: the same figures, the same interval
    assert goal.median_interval([1.0, 1.0]) is None
    assert goal.verdict((low, high), 1.01) == "PASS"
    assert goal.verdict((1.02, 1.05), 1.0) == "FAIL"
    assert goal.verdict((1.0, 1.03), 1.0).startswith("UNREADABLE: interval")
    assert goal.verdict((low, high), 1.03).startswith("UNREADABLE: A/A")
    noisy = [0.95, 1.06, 1.0, 0.97, 1.05, 1.02]  # the same median, a wide interval: no claim
    assert goal.verdict(goal.median_interval(noisy), 1.0).startswith("UNREADABLE")


def test_the_recorder_bench_runs_each_ring_as_asked() -> None:
    """Each process must keep the ring its mode names (128 entries, none), else the bench
    raises: its figures compare what they say they compare. torch 2.13 records by default."""
    from bench import recorder_cost

    args = recorder_cost.parser().parse_args(["--rounds", "1", "--ops", "50", "--blocks", "1"])
    result = recorder_cost.run(args)
    assert result["rings"] == {"torch's default": 200, "zeroscope's 128": 128, "none": 0}
    keys = {f"{clock} {depth}" for clock in ("thread", "process") for depth in recorder_cost.DEPTHS}
    assert set(result["figures"]) == keys
    assert all(f["base_us"] > 0 for f in result["figures"].values())
