"""One function per bench section: run the section's script at full or quick size and turn its
figures into tables. The scripts stay runnable alone (``python bench/<script>.py --help``)."""

from __future__ import annotations

from bench.harness import Table

DEMO = {"vocab": 47, "block": 64, "width": 64, "layers": 2, "heads": 4, "batch": 8}
"""examples/train_gpt.py's defaults: the tiny corpus's 47 characters, context 64, width 64,
2 layers, 4 heads, micro-batch 8 (examples/ds_config.json)."""
LARGER = {"vocab": 2048, "block": 64, "width": 192, "layers": 4, "heads": 4, "batch": 8}
"""The same GPT ~25x larger (2.6 M parameters): big enough that compute, not Python, dominates
a step, small enough for 16 contenders x 2 ranks on a 2-core box."""


def engine(quick: bool) -> list[Table]:
    from bench.contenders import deepspeed_available
    from bench.engine_compare import run

    families = {"torch", "zeroscope"} | ({"deepspeed"} if deepspeed_available() else set())
    tables = [
        run(
            "Engine, demo model (2 ranks, CPU, gloo)",
            DEMO,
            families,
            rounds=3 if quick else 10,
            steps=1 if quick else 2,
        )
    ]
    if not quick:
        tables.append(
            run("Engine, larger model (2 ranks, CPU, gloo)", LARGER, families, rounds=8, steps=1)
        )
    if "deepspeed" not in families:
        tables[0].note += " DeepSpeed is not installed: its rows are missing."
    return tables


def agent(quick: bool) -> list[Table]:
    from bench import agent_overhead

    t = Table(
        title="Agent overhead: live agent on vs off (2 ranks, CPU, gloo)",
        columns=[
            "model",
            "rank",
            "CPU ms/step off",
            "CPU on/off",
            "CPU A/A control",
            "wall on/off",
            "wall A/A control",
            "agent us/step (own counters)",
            "agent us/collective",
            "collectives/step",
            "agent threads us/step (interleaved)",
            "bytes on the wire per rank-step",
            "dropped",
            "goal <= 1.01 (CPU)",
        ],
    )
    t.digits = dict.fromkeys(
        ("CPU on/off", "CPU A/A control", "wall on/off", "wall A/A control"), 3
    )
    accepted = rejected = 0
    # Rounds of one step per mode: this VM's step-to-step CPU noise is ~10 %, and drifts over
    # seconds; adjacent single steps cancel the drift, many rounds the noise (a few minutes).
    # ZeRO-3's 150 ms steps vary most (two ranks meeting 195 times a step): at 300 rounds its
    # A/A control ranged 0.991-1.005 over four runs, at 600 0.995-1.017 over three, so it runs
    # 1000.
    for model, argv, rounds in (
        ("MLP 3 x 512", ["--width", "512"], 600),
        ("demo model, ZeRO-2", ["--model", "demo"], 1500),
        ("ZeRO-3 MLP 64 x 128", ["--model", "zero3", "--width", "128", "--layers", "64"], 1000),
    ):
        blocks = str(30 if quick else rounds)
        args = agent_overhead.parser().parse_args([*argv, "--blocks", blocks, "--steps", "1"])
        result = agent_overhead.run(args)
        for r in result["ranks"]:
            ratio = r["cpu_on_off"]
            t.add(
                model,
                r["rank"],
                r["cpu_off_s"] * 1e3,
                ratio,
                r["cpu_aa"],
                r["wall_on_off"],
                r["wall_aa"],
                r["agent_us_per_step"],
                r["agent_us_per_collective"],
                r["collectives_per_step"],
                f"{r['agent_threads_us_per_step']:.0f} "
                f"({r['agent_threads_interleaved_us_per_step']:.0f})",
                round(r["wire_bytes_per_step"]),
                r["dropped"],
                None if ratio is None else ("met" if ratio <= 1.01 else "MISSED"),
            )
        accepted += result["collector"]["accepted"]
        rejected += result["collector"]["rejected"] or 0
    t.note = (
        "Rounds of 1 step per mode (on, off, off-again, in an order rotated every round) in the "
        "same processes; ratios are medians of per-round pairs. "
        "CPU = process CPU time (the training thread, gloo's threads), far less sensitive to a "
        "shared machine than wall time, plus for 'on' steps the CPU of the agent's own threads "
        "(its sender, ZeroMQ's I/O and reaper: read by their per-thread clocks, "
        "bench/thread_cpu.py, taken out of every step they happened to run in) at their rate "
        "per step over a stretch of consecutive 'on' steps, as in a real run (in brackets: "
        "their rate while interleaved, which also pays heartbeats and timer wake-ups for three "
        "times the wall time per 'on' step); the off-again/off ratio (A/A) is the noise floor. Agent us: the agent's own counters (agent/cost.py) over the "
        "'on' steps: training-thread time per step outside collectives (budget ~30 us) and per "
        "collective (collective() and wait()'s bookkeeping, budget ~2 us). MLP: batch 64, its 6 "
        "gradients all-reduced by hand; demo: the bundled engine at stage 2 on the engine table's demo "
        "model; ZeRO-3: the bundled engine, nothing persistent, one layer per bucket, batch 64. Wire bytes: token + payload frames handed to ZeroMQ per measured "
        f"step (StepReport + heartbeats), ZMTP framing excluded. Collector accepted {accepted}, "
        f"rejected {rejected}. The counters miss most of a collective's cost: see the next table."
    )
    return [t, _collective_cost(quick)]


def _collective_cost(quick: bool) -> Table:
    """Per collective in place, by the training thread's CPU clock (bench/collective_cost.py)."""
    from bench import collective_cost

    t = Table(
        title="One collective in place: training-thread CPU over the no-op, per op (world 1, gloo)",
        columns=["variant", "us CPU per collective"],
    )
    figures = collective_cost.measure(rounds=30 if quick else 300, width=128)
    for name, us in figures.items():
        t.add(name, us)
    t.note = (
        "A real gloo all-reduce issued asynchronously, one 64 x 128 x 128 layer computed while "
        "it is in flight, then its wait(); blocks of 100 ops per variant in rotated rounds, "
        "medians per op of time.thread_time_ns, as differences from the no-op telemetry "
        "('off us per op' is the no-op's own time per op). 'agent': collective() and the "
        "handle's wait(); 'agent, raw wait': collective() and then the Work's own wait(); "
        "'agent, Python seam': the agent with the Python twin of its C seam (agent/_seam.c, "
        "which 'agent' uses where it was built); "
        "'3 clock reads': what timing an op needs (issue, wait entry, wait exit), the floor of "
        "any Python implementation. 'agent counters': what the agent's own counters say for the "
        "same ops (the agent's overhead budget: ~2 us)."
    )
    return t


def _span(interval: tuple[float, float] | None) -> str:
    return "NA" if interval is None else f"{interval[0]:.3f}-{interval[1]:.3f}"


def attach(quick: bool) -> list[Table]:
    from bench import attach_overhead

    t = Table(
        title="Attach overhead: unmodified DDP, FSDP2 and DeepSpeed ZeRO-3 jobs, attach on vs "
        "off (2 ranks, CPU, gloo, MLP 8 x 512)",
        columns=[
            "job",
            "CPU ms/step off (rank 0 / 1)",
            "CPU on/off",
            "90% interval",
            "CPU A/A",
            "training thread on/off",
            "training thread interval",
            "training thread A/A",
            "recorder dumps/step",
            "load avg",
            "goal <= 1.01 (CPU)",
        ],
        digits={"CPU on/off": 3, "CPU A/A": 3, "training thread on/off": 3},
    )
    for job, extra in (
        ("ddp", []),
        ("ddp+amp", ["--amp"]),
        ("ddp+compile", ["--compile"]),
        ("fsdp2", []),
        ("deepspeed", []),
    ):
        engine = job.split("+")[0]
        rounds = 12 if quick else {"fsdp2": 240, "deepspeed": 300}.get(engine, 400)
        argv = ["--engine", engine, "--interleave", "--rounds", str(rounds)]
        result = attach_overhead.run(attach_overhead.parser().parse_args([*argv, *extra]))
        cpu, main, ranks = result["cpu"], result["main"], result["ranks"]
        t.add(
            job,
            " / ".join(f"{r['cpu_off_s'] * 1e3:.1f}" for r in ranks),
            cpu["on_off"],
            _span(cpu["interval"]),
            cpu["aa"],
            main["on_off"],
            _span(main["interval"]),
            main["aa"],
            max(r["dumps_per_step"] for r in ranks),
            f"{result['load_start']:.1f}-{result['load_end']:.1f}",
            cpu["verdict"],
        )
    t.note = (
        "What `zeroscope run` installs in a job it does not own (ProcessGroup/Work wrappers, "
        "optimizer and backward hooks, the engine's reader, torch's Flight Recorder read by the "
        "sender thread, a StepReport per step to a real collector), toggled on one job per "
        "rank (built with the attach on, as in a real run) in blocks of 12 steps, each round "
        "ordered on, off, off-again, off-again, off, on; every 'on' block ends by draining what "
        "it handed over (on its own clock), and the agent's threads' CPU (per-thread clocks) "
        "is charged to the round's 'on' blocks. Ratios are medians over rounds of the rounds' "
        "CPU-time ratios (both ranks' whole processes), with a bootstrap interval of that "
        "median; the off-again/off ratio, taken the same way, is the noise floor. PASS: the "
        "interval is at or below 1.01 and the A/A within 2% of 1; FAIL: the interval is above "
        "1.01; else UNREADABLE. ddp+amp: fp16 CPU autocast with a torch.amp.GradScaler (the "
        "scaler's wrappers on). ddp+compile: DDP under torch.compile (aot_eager). DeepSpeed: "
        "ZeRO-3 with every parameter sharded."
    )
    return [t, recorder(quick)]


def _us_span(interval: tuple[float, float] | None) -> str:
    return "NA" if interval is None else f"{interval[0]:+.2f} to {interval[1]:+.2f}"


def recorder(quick: bool) -> Table:
    """What torch's Flight Recorder costs a collective, and zeroscope's ring size against
    torch's default (bench/recorder_cost.py): the attach rows above cannot see it."""
    from bench import recorder_cost

    args = recorder_cost.parser().parse_args(["--rounds", "3" if quick else "30"])
    r = recorder_cost.run(args)
    modes = [m for m in recorder_cost.MODES if m != recorder_cost.BASE]
    t = Table(
        title="torch's Flight Recorder: a gloo all-reduce's CPU by ring (1 process a mode, "
        "world 1), against torch's default ring",
        columns=[
            "clock",
            "stack depth",
            "us, torch's default ring",
            *(f"{m}: us more (90% interval)" for m in modes),
            "A/A",
        ],
        digits={"A/A": 3},
    )
    for key, row in r["figures"].items():
        clock, depth = key.split()
        cells = [f"{row[m]['extra_us']:+.2f} ({_us_span(row[m]['extra_interval'])})" for m in modes]
        t.add(clock, int(depth), row["base_us"], *cells, row["aa"])
    kept = ", ".join(f"{m} {n:.0f}" for m, n in r["rings"].items())
    t.note = (
        f"{args.rounds} rounds of four processes (torch's default, 128, none, torch's default "
        f"again: the A/A), the order rotated; {args.ops} all-reduces of 256 floats a block, "
        f"{args.blocks} blocks a depth; medians over rounds of each round's difference. "
        f"Entries each ring kept: {kept}. thread: the calling thread's CPU clock; process: the "
        "whole process's (gloo's worker threads included)."
    )
    return t


def ingest(quick: bool) -> list[Table]:
    from bench import ingest as ingest_bench

    argv = ["--ranks", "1024", "--steps", "3" if quick else "10"]
    r = ingest_bench.run(ingest_bench.parser().parse_args(argv))
    t = Table(
        title="Collector ingest: 1024 synthetic ranks (ZeRO-3-like reports)",
        columns=["path", "M records/s", "reports/s", "goal", "notes"],
    )
    per = r["records"] / r["reports"]  # type: ignore[operator]
    cpu = float(r["core_cpu"] or 0)
    t.add(
        "core, per CPU-second",
        cpu / 1e6,
        round(cpu / per),
        ">= 1 M: " + ("met" if cpu >= 1e6 else "MISSED"),
        "validate, decode, SQLite, publish on one thread",
    )
    wall = float(r["core_wall"] or 0)
    t.add("core, wall", wall / 1e6, round(wall / per), "", "the thread shares the machine")
    if "socket_wall" in r:
        sock = float(r["socket_wall"] or 0)
        lost = "nothing lost" if r["received"] == r["sent"] else "LOST"
        t.add(
            "socket (PUSH, HWM 1000), wall",
            sock / 1e6,
            round(sock / per),
            "",
            f"sent {r['sent']}, sender EAGAIN drops {r['dropped']}, received {r['received']}: "
            f"{lost}",
        )
    t.note = (
        f"{r['reports']} StepReports, {per:.0f} records each (64 collectives, 2 transfers, "
        f"memory), {float(r['report_bytes'] or 0):.0f} B each."
    )
    return [t]


def tui(quick: bool) -> list[Table]:
    from bench import tui_frame

    frames = tui_frame.bench_frames(1024, 6 if quick else 20)
    reports = 100_000 if quick else 1_000_000
    seek = tui_frame.bench_seek_fresh(1024, reports, 8 if quick else 20)
    t = Table(
        title="TUI: cluster frame at 1024 ranks; replay seek",
        columns=["what", "wall ms (median)", "wall ms (max)", "CPU ms (median)", "goal"],
    )
    for size, f in frames.items():
        t.add(
            f"cluster frame {size}" + ("" if "plots" in size else ", plots live") + ", 1024 ranks",
            f["frame_s"] * 1e3,
            f["frame_max_s"] * 1e3,
            f["frame_cpu_s"] * 1e3,
            "<= 50 ms: " + ("met" if f["frame_s"] <= 0.05 else "MISSED (wall)"),
        )
        if "plots" not in size:
            t.add(f"ingest of one 1024-rank step ({size} run)", f["ingest_s"] * 1e3, None, None, "")
    t.add(
        f"replay seek in {seek['reports']:,} step reports",
        seek["seek_s"] * 1e3,
        seek["seek_max_s"] * 1e3,
        seek["seek_cpu_s"] * 1e3,
        "<= 100 ms: " + ("met" if seek["seek_s"] <= 0.1 else "MISSED (wall)"),
    )
    t.add("ClusterState rebuild after a seek", seek["rebuild_s"] * 1e3, None, None, "")
    # 16,384 ranks: the node rows (the heatmap no longer fits); live plots only.
    big = tui_frame.bench_frames(16384, 3 if quick else 8, modes=("live",))
    for size, f in big.items():
        t.add(
            f"cluster frame {size} ({f['view']}), 16,384 ranks",
            f["frame_s"] * 1e3,
            f["frame_max_s"] * 1e3,
            f["frame_cpu_s"] * 1e3,
            "<= 50 ms: " + ("met" if f["frame_s"] <= 0.05 else "MISSED (wall)"),
        )
        t.add(
            f"ingest of one 16,384-rank step ({size} run)",
            f["ingest_s"] * 1e3,
            None,
            f["ingest_cpu_s"] * 1e3,
            "<= 100 ms: " + ("met" if f["ingest_s"] <= 0.1 else "MISSED (wall)"),
        )
    tables = [t, _tui_cpu(quick)]
    built = "" if seek["built_s"] is None else f", built in {seek['built_s']:.0f} s"
    t.note = (
        f"Replay memory: a fresh process that opens the trace and seeks peaks at "
        f"{seek['rss_peak'] / 2**20:.0f} MiB RSS ({seek['rss_base'] / 2**20:.0f} MiB after its "
        f"imports, so {(seek['rss_peak'] - seek['rss_base']) / 2**20:.0f} MiB for the replay); "
        "the trace file is "
        f"{seek['file_mb']:.0f} MB{built} (cached in .bench-cache/)."
    )
    return tables


def _tui_cpu(quick: bool) -> Table:
    """The live view's own CPU per wall second (bench/tui_cpu.py), against the idle view and
    the headless loop on the same stream."""
    from bench import tui_cpu

    seconds = 5.0 if quick else 20.0
    warmup = 2.0 if quick else tui_cpu.WARMUP_S
    t = Table(
        title="TUI: the live view's own CPU (160x48, synthetic steps at the job's pace)",
        columns=["what", "view, % of a core", "headless, % of a core", "goal"],
        digits={"view, % of a core": 1, "headless, % of a core": 1},
    )
    idle = tui_cpu.measure(2, 0.0, seconds, warmup=0.0, headless=False)
    t.add("idle view (nothing arriving)", idle["cores"] * 100, None, "")
    for ranks, pace in tui_cpu.rates([2, 8, 64, 1024]):
        r = tui_cpu.measure(ranks, pace, seconds, warmup=warmup)
        t.add(
            f"{ranks} ranks x {pace:g} steps/s",
            r["cores"] * 100,
            r["headless"] * 100,
            tui_cpu.verdict(ranks, r["cores"]),
        )
    t.note = (
        f"CPU time of the view's process over {seconds:g} s of wall time after {warmup:g} s of "
        "steps, less the thread that feeds it; Textual's headless driver (a real terminal's "
        "writes are left out). Headless: zeroscope run --headless's fold and step lines on the "
        "same stream, measured just before the view."
    )
    return t


def gpu(quick: bool) -> list[Table]:
    from bench import gpu_check

    return gpu_check.table(gpu_check.run(quick=quick))


def pipeline(quick: bool) -> list[Table]:
    from bench import pipeline_balance

    argv = ["--rounds", "3" if quick else "7"]
    result = pipeline_balance.run(pipeline_balance.parser().parse_args(argv))
    t = Table(
        title="Pipeline stage balance: partition_method 'profile' vs 'parameters' (2 stages, "
        "1F1B, m=4, 2 ranks, CPU, gloo)",
        columns=[
            "partition",
            "stage boundaries",
            "compute max/mean",
            "bubble",
            "bubble vs parameters",
            "step span ms",
            "span vs parameters",
        ],
    )
    for name, row in result.items():
        t.add(
            name,
            str(row["parts"]),
            row["imbalance"],
            row["bubble_fraction"],
            row["bubble_ratio"],
            None if row["span_s"] is None else row["span_s"] * 1e3,
            row["span_ratio"],
        )
    t.note = (
        "12 layers with equal parameters, the first four doing 3x the work, a unit of work "
        "being a fixed 20 ms sleep so that the load on a shared machine does not blur the "
        "stages' costs (bench/pipeline_balance.py; --work matmul for real compute). bubble = 1 - stage compute / (stages x span), the "
        "1F1B bound for balanced stages is 0.20. Ratios are medians of per-round pairs; the "
        "second 'parameters' row is the A/A control (noise floor)."
    )
    return [t]


def relay(quick: bool) -> list[Table]:
    from bench import relay_ingest

    sizes = "1024,4096" if quick else "1024,4096,16384"
    argv = ["--sizes", sizes, "--steps", "2" if quick else "3"]
    args = relay_ingest.parser().parse_args(argv)
    rows = relay_ingest.run(args)
    t = Table(
        title="Direct vs relayed ingest (one relay per node of 64 synthetic ranks)",
        columns=[
            "ranks",
            "path",
            "M records / collector CPU-s",
            "collector CPU ms/step",
            "x direct",
            "lost",
            "RSS MiB",
            "load",
        ],
    )
    direct: dict[int, float] = {}
    for r in rows:
        if r["path"] == "direct":
            direct[r["ranks"]] = r["cpu_per_step_ms"]
        rate = r["records_per_cpu_s"]
        t.add(
            r["ranks"],
            r["path"],
            rate / 1e6 if rate is not None else None,
            r["cpu_per_step_ms"],
            r["cpu_per_step_ms"] / direct[r["ranks"]],
            r["lost"],
            (r["rss_bytes"] or 0) / 2**20 if r["rss_bytes"] is not None else None,
            r["load_avg"],
        )
    t.note = (
        f"{args.steps} steps at {args.interval:g} s; each rank's report is its own ZeroMQ message "
        f"({args.collectives + 1} records); the senders are the agent's Publisher, one per node "
        "of 64 ranks, in 2 processes; relayed: one zeroscope relay per node in the same process, "
        "sending node batches the collector takes without decoding a report. Collector CPU is "
        "its whole process's (collector thread, trace writer thread and ZeroMQ's I/O thread) "
        "over the run, idle polling included. Goal at 16,384 ranks: relayed <= 0.5 x direct."
    )
    return [t]


def throughput(quick: bool) -> list[Table]:
    """The FLOP count's cost on the steps after the counted one (bench/flop_count_overhead.py)."""
    from bench import flop_count_overhead

    args = flop_count_overhead.parser().parse_args(["--rounds", "30" if quick else "300"])
    r = flop_count_overhead.run(args)
    t = Table(
        title="FLOP count: the work meter with the count on vs off (1 process, CPU)",
        columns=[
            "model",
            "CPU ms/step off",
            "CPU on/off",
            "CPU A/A control",
            "counted step / plain step (once)",
            "counts",
            "goal <= 1.01 (CPU)",
        ],
    )
    t.digits = dict.fromkeys(("CPU on/off", "CPU A/A control"), 3)
    ratio = r["cpu_on_off"]
    t.add(
        f"GPT d{args.dim} x 2 layers, seq {args.seq}, batch {args.batch}, AdamW",
        r["cpu_ms_per_step_off"],
        ratio,
        r["cpu_aa_control"],
        r["counted_step_ratio"],
        r["counts"],
        "met" if ratio <= 1.01 else "MISSED",
    )
    t.note = (
        "Rounds of one block of 4 training steps per mode (count on, off, off again: the A/A "
        "control), the order rotated every round; ratios are medians of per-round pairs of "
        "process CPU time. The count on ran once, on its first step (timed alone, beside an "
        "uncounted step: the one-time cost); after it the meters do the same work per step."
    )
    return [t]


def storage(quick: bool) -> list[Table]:
    """The trace's bytes per rank-step, kept in full and thinned, projected to 16,384 ranks at
    1 step/s; a late viewer's catch-up and first frame (bench/storage.py)."""
    from bench import storage as bench_storage

    argv = ["--ranks", "256"] if quick else []
    argv += ["--viewer-ranks", "4096" if quick else "16384"]
    args = bench_storage.parser().parse_args(argv)
    out = bench_storage.run(args)
    policy = out["policy"]
    trace = Table(
        title="Trace bytes per rank-step (synthetic ZeRO-3 reports)",
        columns=[
            "trace",
            "ranks x steps written",
            "payload B/report",
            "file B/rank-step",
            "formula B/rank-step",
            "GB/hour at 16,384 ranks x 1 step/s",
            "writer CPU ms/step",
            "goal",
        ],
    )
    full, thinned = out["full"], out["thinned"]
    trace.add(
        "every message",
        f"{full['ranks']} x {full['steps']}",
        full["payload_per_report"],
        full["bytes_per_rank_step"],
        None,
        full["gb_per_hour_16k"],
        full["writer_cpu_ms_per_step"],
        "",
    )
    trace.add(
        f"thinned (every {policy.every}, recent {policy.recent})",
        f"{thinned['ranks']} x {thinned['steps']}",
        thinned["payload_per_report"],
        thinned["bytes_per_rank_step"],
        thinned["formula_bytes_per_rank_step"],
        thinned["gb_per_hour_16k"],
        thinned["writer_cpu_ms_per_step"],
        "<= 2 GB/hour",
    )
    trace.note = (
        "file B/rank-step: the file's growth (after a WAL checkpoint) per rank-step, over the "
        "second half of the steps written (in full) or the last two thinning periods, well past "
        "the recent window (thinned). Formula: "
        "the full trace's cost / every (the kept reports; the node_steps rows, one per 8 ranks "
        "a step, come on top). Projection: x 16,384 ranks x 3,600 steps (every term scales with "
        "the ranks). Writer CPU: append + commit (+ thinning) per step, one commit a step."
    )
    v = out["viewer"]
    viewer = Table(
        title=f"A late viewer at {v['ranks']} ranks ({v['steps']} steps recorded)",
        columns=[
            "catch-up MB",
            "messages",
            "history MB (the old catch-up)",
            "received s (CPU)",
            "folded s (CPU)",
            "first frame 160x48 s (CPU)",
            "collector RSS MiB",
            "goal",
        ],
    )
    viewer.add(
        v["snapshot_bytes"] / 1e6,
        v["snapshot_messages"],
        v["history_bytes"] / 1e6,
        f"{v['received_s']:.2f} ({v['received_cpu_s']:.2f})",
        f"{v['folded_s']:.2f} ({v['folded_cpu_s']:.2f})",
        f"{v['first_frame_s']:.2f} ({v['first_frame_cpu_s']:.2f})",
        v["collector_rss_bytes"] / 2**20,
        "first frame <= 5 s",
    )
    viewer.note = (
        "From the viewer's connect: catch-up received (LiveSource), folded into a ClusterState, "
        "the cluster screen's first frame drawn (cumulative; CPU: this process's, the collector "
        "idle in it). The catch-up is the state snapshot (collector/snapshot.py) once the "
        "history exceeds 32 MB. Collector RSS: the process's growth while the collector took "
        "the steps (its history and snapshot)."
    )
    return [trace, viewer]
