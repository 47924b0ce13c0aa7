"""The attach-overhead bench's figures (bench/attach_overhead.py): each rank's blocks of steps
made into per-round figures per mode (the agent's threads charged to "on"), the job's ratios
with their interval and verdict (bench/goal.py), and the lines printed."""

from __future__ import annotations

import statistics
from typing import Any

from bench import goal


def block_pairs(values: list[float]) -> list[float]:
    """Per-round sums of a mode's two blocks (ABCCBA: each mode runs twice per round)."""
    return [values[i] + values[i + 1] for i in range(0, len(values) - 1, 2)]


def per_round(r: dict[str, Any], key: str) -> dict[str, list[float]]:
    """One rank's figure per mode and round. For process CPU (``cpu``) the agent's threads
    (which wake on their own timers, in any block) are charged to "on": the "off" blocks lose
    their agent-thread CPU (a job without zeroscope runs none of those threads), and the "on"
    pair gains what its neighbouring "off" blocks' threads spent beyond the "off-again" ones'
    (work the "on" steps left for the sender, over the timer-paced rate that both "off" modes
    pay alike); the "on" blocks keep their own."""
    figures = {m: block_pairs(v) for m, v in r[key].items()}
    if key != "cpu":
        return figures
    agent = {m: block_pairs(v) for m, v in r["agent"].items()}
    if r.get("interleave_agent_s") is not None:  # the whole loop's agent CPU, on "on" steps
        per_on_pair = 2 * r["interleave_agent_s"] / len(r["cpu"]["on"])
        return {
            m: [
                c - a + (per_on_pair if m == "on" else 0.0)
                for c, a in zip(figures[m], agent[m], strict=True)
            ]
            for m in figures
        }
    left = [b - c for b, c in zip(agent["off"], agent["off-again"], strict=True)]
    return {
        "on": [c + x for c, x in zip(figures["on"], left, strict=True)],
        **{
            m: [c - a for c, a in zip(figures[m], agent[m], strict=True)]
            for m in ("off", "off-again")
        },
    }


def job(results: list[Any], key: str) -> dict[str, list[float]]:
    """Per mode, each round's figure summed over the ranks: the job's CPU, as one ratio."""
    per_rank = [per_round(r, key) for _, r in results]
    return {
        m: [sum(vals) for vals in zip(*(r[m] for r in per_rank), strict=True)] for m in per_rank[0]
    }


def row(figures: dict[str, list[float]]) -> dict[str, Any]:
    """on/off and A/A for one clock: medians over rounds, the on/off interval, the verdict."""
    on_off = goal.ratios(figures["on"], figures["off"])
    aa = goal.ratios(figures["off-again"], figures["off"])
    interval = goal.median_interval(on_off)
    aa_median = statistics.median(aa) if aa else None
    return {
        "on_off": statistics.median(on_off) if on_off else None,
        "interval": interval,
        "aa": aa_median,
        "aa_interval": goal.median_interval(aa),
        "verdict": goal.verdict(interval, aa_median),
        "per_round": on_off,
    }


def _on_steps(result: dict[str, Any]) -> int:
    """Steps run with the attach on: two blocks a round (ABCCBA)."""
    return 2 * int(result["rounds"]) * int(result["steps"])


def describe(result: dict[str, Any]) -> list[str]:
    """One line per rank: the ratios with their A/A control."""
    job = (
        result["engine"]
        + ("+amp" if result["amp"] else "")
        + ("+compile" if result["compile"] else "")
        + "".join(f" without {part}" for part in result["without"])
    )
    lines = []
    for r in result["ranks"]:
        lines.append(
            f"{job} rank {r['rank']}: CPU {r['cpu_off_s'] * 1e3:.2f} ms/step off; on/off "
            f"{r['cpu_on_off']:.4f} (A/A {r['cpu_aa']:.4f}); training thread on/off "
            f"{r['main_on_off']:.4f} (A/A {r['main_aa']:.4f}); wall on/off "
            f"{r['wall_on_off']:.4f} (A/A {r['wall_aa']:.4f}); {r['cpu_extra_us']:.0f} us/step "
            f"extra CPU; {r['collectives_per_step']:.1f} wrapped collectives/step; "
            f"{r['dumps_per_step']:.2f} recorder dumps/step; {r['steps_reported']} steps "
            f"reported, errors {r['errors']}; agent threads "
            + (
                # --interleave: the agent's threads over the whole loop, charged to "on" steps
                f"{r['interleave_agent_s'] / _on_steps(result) * 1e6:.0f} us per on-step (the "
                "whole loop's)"
                if r.get("interleave_agent_s") is not None
                else " / ".join(f"{v:.0f}" for v in r["agent_threads_us"].values())
                + " us/step in on / off / off-again blocks"
            )
            + (
                "; gc " + " / ".join(f"{v:.0f}" for v in r["gc_us"].values()) + " us/step, "
                f"{r['full_collections']} full collections"
                if result["gc"]
                else ""
            )
            + (
                f"; {r['frames_compiled_measuring']} frames compiled while measuring"
                if result["compile"]
                else ""
            )
        )
    for clock, name in (("cpu", "process CPU (the goal)"), ("main", "training thread CPU")):
        row = result[clock]
        interval = row["interval"]
        span = "NA" if interval is None else f"{interval[0]:.4f}-{interval[1]:.4f}"
        lines.append(
            f"{job} both ranks, {name}: on/off {row['on_off']:.4f} (90% interval {span}), "
            f"A/A {row['aa']:.4f}: {row['verdict']}"
        )
    lines.append(
        f"{result['rounds']} rounds x 6 blocks x {result['steps']} steps; load average "
        f"{result['load_start']:.1f} -> {result['load_end']:.1f}; collector: "
        f"{result['collector']['accepted']} messages accepted"
    )
    return lines
