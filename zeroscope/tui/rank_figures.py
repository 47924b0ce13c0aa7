"""The rank detail's "every figure" pane: all that the rank's newest report and sampler carry,
NA where absent, laid out as label/value cells in as many columns as the width allows.

Formatting only: each value is a field of the wire schema or a figure of zeroscope.state.
"""

from __future__ import annotations

from rich.text import Text

from zeroscope.state import units
from zeroscope.state.viewmodel import RankState, rank_throughput


def _cells(rs: RankState) -> list[tuple[str, list[tuple[str, str]]]]:
    report, s, host = rs.latest, rs.summary, rs.host
    m = report.memory if report else None
    step = [
        ("step time", units.seconds(s.duration_s if s else None)),
        ("compute", units.seconds(s.compute_s if s else None)),
        ("comm wait", units.seconds(s.exposed if s else None)),
        ("exposed", units.percent(s.exposed_share if s else None)),
        ("slowness", "NA" if rs.slowness is None else f"{rs.slowness:.2f}x"),
        ("samples", "NA" if not s or not s.samples else str(s.samples)),
        ("loss", units.number(s.loss if s else None, ".4f")),
        ("grad norm", units.number(s.grad_norm if s else None, ".4g")),
        ("lr", units.number(s.lr if s else None, ".3g")),
        ("loss scale", units.scale(s.loss_scale if s else None)),
    ]
    memory = [
        ("P", units.params_size(m.params, m.frozen_params) if m else units.size(None)),
        ("G", units.size(m.grads if m else None)),
        ("O", units.size(m.optim if m else None)),
        ("A", units.size(m.activations if m else None)),
        ("A from step", str(m.activations_step) if m and m.activations_step else "NA"),
        ("gathered P", units.size(m.gathered_params if m else None)),
        ("persistent P", units.size(m.persistent_params if m else None)),
        ("host P", units.size(m.host_params if m else None)),
        ("host G", units.size(m.host_grads if m else None)),
        ("host O", units.size(m.host_optim if m else None)),
        ("NVMe", units.size(m.nvme_bytes if m else None)),
        ("dev alloc", units.size(m.device_allocated if m else None)),
        ("dev reserved", units.size(m.device_reserved if m else None)),
        ("dev peak", units.size(m.device_peak if m else None)),
    ]
    if m and m.census_step:  # the attach's P/G/O repeat an earlier count between counts
        memory.insert(3, ("P/G/O from", f"step {m.census_step}"))
    comm = [
        ("collectives", str(s.collectives) if s else "NA"),
        ("prefetched", str(s.prefetched) if s else "NA"),
        ("unfinished", str(report.collectives_unfinished) if report else "NA"),
        ("volume", units.size(s.comm_volume if s else None)),
        ("busbw", units.rate(s.busbw if s else None)),
        ("offload", units.rate(s.offload_bw if s else None)),
        ("dropped msgs", str(rs.dropped)),
    ]
    sampler = [
        ("cpu", "NA" if not host or host.cpu_percent is None else f"{host.cpu_percent:.0f}%"),
        ("rss", units.size(host.rss_bytes if host else None)),
        ("mem avail", units.size(host.mem_available_bytes if host else None)),
        ("gpu util", units.percent(None if not host or host.gpu_util_percent is None
                                   else host.gpu_util_percent / 100)),
        ("gpu mem", units.size(host.gpu_mem_used_bytes if host else None)),
        ("gpu total", units.size(host.gpu_mem_total_bytes if host else None)),
        ("gpu power", "NA" if not host or host.gpu_power_w is None else f"{host.gpu_power_w:.0f} W"),
        ("pcie tx", units.rate(host.pcie_tx_bytes_s if host else None)),
        ("pcie rx", units.rate(host.pcie_rx_bytes_s if host else None)),
    ]  # fmt: skip
    groups = [("step", step), ("memory", memory), ("comm", comm)]
    t = rank_throughput(rs)
    if t is not None:  # reported work: a rank that reports none keeps the pane as it was
        groups.append(
            (
                "model throughput",
                [
                    ("tokens", units.count(t.tokens_per_step)),
                    ("tokens/s", units.count(t.tokens_per_s)),
                    ("model FLOP/s", units.flop_rate(t.tflops_per_s)),
                    ("MFU", units.fine_percent(t.mfu)),
                    ("FLOPs/step", units.count(t.flops_per_step)),
                    ("predicted", units.count(t.predicted_flops_per_step)),
                    ("peak", units.flop_rate(t.peak_tflops)),
                ],
            )
        )
    return [*groups, ("host/GPU sampler", sampler)]


def _notes(rs: RankState) -> list[str]:
    """The throughput group's long words: which peak MFU divides by, and why a figure is NA."""
    t = rank_throughput(rs)
    if t is None:
        return []
    notes = [f"peak: {t.peak_source}"] if t.peak_source else []
    return notes + ([f"NA: {t.na}"] if t.na else [])


def rank_figures(rs: RankState | None, width: int) -> Text:
    """Every figure of the rank's newest step and sample, grouped, NA where absent."""
    if rs is None:
        return Text("NA")
    cell = 24
    per_line = max(1, width // cell)
    text = Text()
    for g, (group, cells) in enumerate(_cells(rs)):
        if g:
            text.append("\n")
        text.append(group, style="bold")
        for i, (label, value) in enumerate(cells):
            text.append("\n" if i % per_line == 0 else "")
            text.append(f"{label:<13}", style="dim")
            text.append(f"{value:<{cell - 14}} ")  # a space always: "1.75MFLOP/sMFU" read as one
        if group == "model throughput":
            for note in _notes(rs):
                text.append("\n" + note, style="dim")
    return text
