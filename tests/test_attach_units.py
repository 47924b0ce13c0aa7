"""The attach's parts without a launcher: the sitecustomize bootstrap (chaining, on/off), the
post-import hooks (never mid-import), the class-level ProcessGroup wrappers (bytes by
nccl-tests, completion by wait() or a requested future, no per-op future callback), standing
down when a job reports through the agent API, and activation hooks that keep the script's
own saved-tensor hooks working."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.distributed import free_port
from zeroscope.agent.activations import ActivationCounter
from zeroscope.agent.attach import BOOTSTRAP_DIR, pythonpath_with_bootstrap
from zeroscope.run.launch import job_environment

ROOT = Path(__file__).resolve().parent.parent


# -- activations ---------------------------------------------------------------------------------


def _tiny() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    return model, torch.randn(5, 8)


def test_counting_hooks_hand_tensors_to_the_scripts_own_hooks() -> None:
    model, x = _tiny()
    model(x).pow(2).sum().backward()
    reference = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    packed: list[int] = []
    unpacked: list[int] = []

    def pack(t: torch.Tensor) -> tuple[str, torch.Tensor]:  # like save_on_cpu: a copy elsewhere
        packed.append(t.numel())
        return ("moved", t.detach().clone())

    def unpack(box: tuple[str, torch.Tensor]) -> torch.Tensor:
        unpacked.append(1)
        return box[1]

    counter = ActivationCounter()
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        with counter.hooks():  # entered inside the script's hooks, as the agent's forward phase
            loss = model(x).pow(2).sum()
        loss.backward()
    assert packed and len(unpacked) == len(packed)  # the script's hooks still ran, both ways
    assert all(torch.equal(p.grad, r) for p, r in zip(model.parameters(), reference))
    assert counter.take_peak() > 0


def test_counting_hooks_alone_count_and_return_the_tensors() -> None:
    model, x = _tiny()
    counter = ActivationCounter()
    with counter.hooks():
        loss = model(x).pow(2).sum()
    loss.backward()
    # GELU input (5x16) and output of the first Linear share nothing with parameters; the
    # input x (5x8) is saved by the first Linear's weight gradient.
    assert counter.take_peak() >= 4 * (5 * 8 + 5 * 16)


# -- bootstrap -----------------------------------------------------------------------------------

PROBE = textwrap.dedent(
    """
    import sys
    import torch.distributed
    from torch._C._distributed_c10d import ProcessGroup, Work
    print("chained", "_zeroscope_chained_sitecustomize" in sys.modules)
    print("allreduce", ProcessGroup.allreduce.__module__)
    print("wait", Work.wait.__module__)
    """
)


def _probe(tmp_path: Path, collector: bool) -> list[str]:
    theirs = tmp_path / "theirs"
    theirs.mkdir(exist_ok=True)
    (theirs / "sitecustomize.py").write_text("print('their sitecustomize ran')\n")
    # An extra hook (how an import alias rides on the same bootstrap): module:function.
    (theirs / "zs_extra_hook.py").write_text("def install():\n    print('extra hook ran')\n")
    env = dict(os.environ)
    env.pop("ZEROSCOPE_COLLECTOR", None)
    env["ZEROSCOPE_BOOTSTRAP_HOOKS"] = "zs_extra_hook:install"
    env["PYTHONPATH"] = pythonpath_with_bootstrap(os.pathsep.join([str(ROOT), str(theirs)]))
    if collector:  # nothing is sent until an engine is found: no collector needs to listen
        env["ZEROSCOPE_COLLECTOR"] = f"tcp://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_bootstrap_chains_and_wraps_only_when_zeroscope_runs_the_job(tmp_path: Path) -> None:
    on = _probe(tmp_path, collector=True)
    assert on[:3] == ["their sitecustomize ran", "extra hook ran", "chained True"]
    assert on[3] == "allreduce zeroscope.agent.attach.collectives"
    assert on[4] == "wait zeroscope.agent.attach.collectives"
    off = _probe(tmp_path, collector=False)  # no collector: extra hooks still run, no attach
    assert off[:3] == ["their sitecustomize ran", "extra hook ran", "chained True"]
    assert "zeroscope" not in off[3] and "zeroscope" not in off[4]


def test_run_puts_the_bootstrap_first_and_keeps_the_jobs_path() -> None:
    env = job_environment({"PYTHONPATH": os.pathsep.join(["a", "b"])}, "tcp://x:1", "j")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(BOOTSTRAP_DIR), "a", "b"]
    again = job_environment(env, "tcp://x:1", "j")  # never twice
    assert again["PYTHONPATH"] == env["PYTHONPATH"]
    assert (BOOTSTRAP_DIR / "sitecustomize.py").is_file()


AS_DEEPSPEED_PROBE = textwrap.dedent(
    """
    import sys
    import deepspeed
    from torch._C._distributed_c10d import ProcessGroup
    print("alias", deepspeed.__name__)
    print("chained", "_zeroscope_chained_sitecustomize" in sys.modules)
    print("their", sys.modules["_zeroscope_chained_sitecustomize"].__file__)
    print("allreduce", ProcessGroup.allreduce.__module__)
    print("reader", "zeroscope.agent.attach.deepspeed_engine" in sys.modules)
    """
)


def test_the_attach_bootstrap_and_the_as_deepspeed_alias_both_load(tmp_path: Path) -> None:
    """The environment of ``zeroscope run --as-deepspeed``: the attach's sitecustomize first,
    chaining to the alias's (engine/deepspeed/boot), which chains to the job's own. The alias
    wins the import (the real DeepSpeed is installed here) and the attach installs no DeepSpeed
    reader on the bundled engine, which reports for itself."""
    from zeroscope.run.as_deepspeed import alias_environment, boot_folder

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("print('their sitecustomize ran')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(theirs)]))
    env = job_environment(alias_environment(env), f"tcp://127.0.0.1:{free_port()}", "j")
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(BOOTSTRAP_DIR), str(boot_folder())]
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", AS_DEEPSPEED_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "their sitecustomize ran"  # the end of the chain ran, once
    assert lines[1:] == [
        "alias zeroscope.engine.deepspeed",
        "chained True",
        f"their {boot_folder() / 'sitecustomize.py'}",
        "allreduce zeroscope.agent.attach.collectives",
        "reader False",
    ]
    assert "zeroscope:" not in done.stderr  # neither bootstrap reported a failure


# -- post-import hooks ---------------------------------------------------------------------------


def test_a_hook_fires_once_its_module_and_every_parent_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zeroscope.agent.attach import postimport

    pkg = tmp_path / "zs_probe_pkg"
    pkg.mkdir()
    # The parent imports the watched submodule from its __init__ (as torch does), then finishes.
    (pkg / "__init__.py").write_text("from . import sub\nREADY = True\n")
    (pkg / "sub.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[tuple[str, object]] = []
    postimport.when_imported(
        "zs_probe_pkg.sub",
        lambda m: seen.append((m.__name__, getattr(sys.modules["zs_probe_pkg"], "READY", None))),
    )
    postimport.when_imported("zs_probe_pkg.sub", lambda m: 1 / 0)  # a broken hook
    assert not seen
    import zs_probe_pkg  # noqa: F401  (the import under test)

    assert seen == [("zs_probe_pkg.sub", True)]
    assert any("ZeroDivisionError" in e for e in postimport.errors())
    later: list[str] = []
    postimport.when_imported("zs_probe_pkg", lambda m: later.append(m.__name__))
    assert later == ["zs_probe_pkg"]  # already imported: at once


def test_a_hook_asked_for_inside_a_hook_while_the_parent_still_imports_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attach's parts are installed by a hook that runs as ``import torch`` closes (torch
    imports ``torch.distributed`` from its ``__init__``), and one of them asks for a module
    torch imported on its way (``torch.distributed.device_mesh``): imported, with its parent
    still closing, no load of it would come. Its hook never ran, so no DeviceMesh was watched
    and a tensor-parallel job showed no collective; it runs once the parent finishes."""
    from zeroscope.agent.attach import postimport

    pkg = tmp_path / "zs_nested_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import early, late\nREADY = True\n")
    (pkg / "early.py").write_text("VALUE = 1\n")
    (pkg / "late.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[str] = []

    def parts(module: object) -> None:  # as install._torch_ready asks for device_mesh
        seen.append("late")
        postimport.when_imported("zs_nested_pkg.early", lambda m: seen.append(m.__name__))

    postimport.when_imported("zs_nested_pkg.late", parts)
    import zs_nested_pkg  # noqa: F401  (the import under test)

    assert seen == ["late", "zs_nested_pkg.early"]


# -- ProcessGroup wrappers -----------------------------------------------------------------------


@pytest.fixture
def gloo() -> object:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_every_group_of_every_device_mesh_is_watched_in_the_flight_recorder(
    gloo: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mesh built by ``init_device_mesh`` and one built over the job's own group with
    ``DeviceMesh.from_group`` (which sets its groups after ``__init__``): each group read from
    torch's Flight Recorder, labelled by its dimension (agent/attach/device_mesh.py); nothing
    left wrapped once the attach is put back."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    from zeroscope.agent.attach import device_mesh, patches
    from zeroscope.agent.attach.flight_recorder import FlightRecorderReader

    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "16")
    reader = FlightRecorderReader()
    monkeypatch.setattr(device_mesh, "RECORDER", reader)
    mark = patches.checkpoint()
    device_mesh.install()
    try:
        init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
        assert {n: g.label for n, g in reader.groups.items()} == {dist.group.WORLD.group_name: "tp"}
        own = dist.new_group([0])
        DeviceMesh.from_group(own, "cpu")  # no dimension names
        assert reader.groups[own.group_name].label == "mesh"
        # Flattened (torchtitan's dp_shard_cp: built by __init__) and unflattened (given its
        # groups after __init__). One process has one group of every size here, watched
        # already: what is read is what was asked.
        asked: list[str] = []
        watch = reader.watch
        monkeypatch.setattr(
            reader, "watch", lambda g, label: (asked.append(label), watch(g, label))
        )
        grid = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "cp"))
        grid["dp", "cp"]._flatten("dp_cp")
        assert asked[-1] == "dp_cp"
        world = init_device_mesh("cpu", (1,), mesh_dim_names=("world",))
        world._unflatten(0, (1, 1), ("pp", "ep"))
        assert asked[-2:] == ["pp", "ep"]
    finally:
        patches.rollback(mark)
    assert (
        DeviceMesh.__init__.__module__ == DeviceMesh.from_group.__module__ == DeviceMesh.__module__
    )


def test_a_dtensor_loss_is_read_locally_and_a_partial_one_not_at_all(gloo: object) -> None:
    """Tensor parallelism's ``loss_parallel`` hands ``backward()`` a DTensor: a replicated one
    is this rank's local copy (read like any loss), and one still a partial sum is not read,
    since reading it would be an all-reduce issued by the agent, off the job's schedule."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate

    from zeroscope.agent.attach.session import AttachSession

    mesh = init_device_mesh("cpu", (1,))
    session = AttachSession()
    session.add_loss(DTensor.from_local(torch.tensor(2.5), mesh, [Replicate()]))
    session.add_loss(DTensor.from_local(torch.tensor(7.0), mesh, [Partial()]))
    [(held, weight)] = session._losses
    assert type(held) is torch.Tensor and held.item() == 2.5 and weight == 1.0


def test_wrappers_record_nccl_tests_bytes_and_completion_without_callbacks(gloo: object) -> None:
    from torch._C._distributed_c10d import ProcessGroup, Work

    from zeroscope.agent.attach import collectives, patches

    original = ProcessGroup.allreduce
    futures: list[int] = []
    get_future = Work.get_future

    def counting(self: object, *a: object, **k: object) -> object:
        futures.append(1)
        return get_future(self, *a, **k)

    patches.replace(Work, "get_future", counting)
    collectives.install()
    log = collectives.LOG
    try:
        log.clear()
        t = torch.ones(6)
        dist.all_reduce(t)  # sync: c10d waits for it
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        full, shard = torch.empty(10), torch.ones(10)
        dist.all_gather_single(full, shard)  # world 1: the gathered size is 10 too
        dist.reduce_scatter_single(torch.empty(10), torch.ones(10))
        dist.broadcast(torch.ones(3, dtype=torch.float64), src=0)
        dist.all_reduce(torch.ones(5), async_op=True)  # never waited, dropped at once
        assert futures == []  # no future (nor its callback) was asked for on our behalf
        pending = dist.all_reduce(torch.ones(7), async_op=True)
        pending.get_future().wait()  # a consumer asks for the future: its completion counts
        assert futures == [1]
        start = log.records[0][collectives.START]
        taken = log.take_all()
        out = [op.resolve(start) for op in taken]
        # gloo at world 1 finishes every op at once, but on a loaded machine its worker thread
        # may not have marked one complete by the boundary: a pending report waits for it
        # (agent/pending.py), and so does this test; every op must resolve.
        deadline = time.monotonic() + 30
        while None in out and time.monotonic() < deadline:
            time.sleep(0.01)
            out = [op.resolve(start) for op in taken]
        assert None not in out
        ops = [(c.op, c.nbytes, c.group_size) for c in out]
        assert ops == [
            ("all_reduce", 24, 1),
            ("all_reduce", 24, 1),
            ("all_gather", 40, 1),
            ("reduce_scatter", 40, 1),
            ("broadcast", 24, 1),
            ("all_reduce", 20, 1),
            ("all_reduce", 28, 1),
        ]
        assert all(c.duration_s >= 0 and 0 <= c.exposed_s <= c.duration_s for c in out)
        assert out[0].start_s == 0.0 and all(
            b.start_s >= a.start_s for a, b in itertools.pairwise(out)
        )
        assert out[0].exposed_s > 0  # a synchronous op is waited for entirely
        assert not log.waiting and not log.records
    finally:
        patches.restore_all()
    assert ProcessGroup.allreduce is original and Work.get_future is get_future
    assert not log.recording
    dist.all_reduce(torch.ones(2))
    assert not log.records


def test_an_op_running_at_the_step_boundary_stays_in_its_step_until_it_completes() -> None:
    """The live agent takes a step's ops at its end and resolves them later (agent/pending.py):
    an op still running then is not stamped at the boundary, nor lost, nor moved to a later
    step; it resolves once its work object says it completed. Nobody waited on it, so no clock
    saw it end: its clock is ``none`` (bytes exact, duration and exposed NA)."""
    from zeroscope.agent.attach import collectives

    class SlowWork:
        done = False

        def is_completed(self) -> bool:
            return self.done

    log = collectives.CollectiveLog()
    work = SlowWork()
    issue = collectives._now()
    log.add("all_reduce", 64, 2, issue, work, False)
    (op,) = log.take_all()
    assert not log.records  # taken by the step that ended
    assert op.resolve(issue) is None  # still running: the report waits
    work.done = True
    done = op.resolve(issue)
    assert done is not None and (done.op, done.nbytes, done.group_size) == ("all_reduce", 64, 2)
    assert (done.clock, done.exposed_measured, done.duration_s) == ("none", False, 0.0)
    assert not log.waiting  # resolved: the Work wrappers no longer track it


def test_the_attach_stands_down_when_the_job_reports_through_the_api(
    gloo: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch._C._distributed_c10d import ProcessGroup
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import _global_optimizer_pre_hooks

    from zeroscope.agent import api
    from zeroscope.agent.attach import collectives, install
    from zeroscope.agent.attach.session import SESSION

    monkeypatch.delenv("ZEROSCOPE_COLLECTOR", raising=False)
    before = (ProcessGroup.allreduce, torch.Tensor.backward, DistributedDataParallel.__init__)
    hooks = len(_global_optimizer_pre_hooks)
    install.install()  # torch.distributed is imported already: everything installs at once
    try:
        assert ProcessGroup.allreduce is not before[0] and torch.Tensor.backward is not before[1]
        assert len(_global_optimizer_pre_hooks) == hooks + 1
        dist.all_reduce(torch.ones(4))
        assert len(collectives.LOG.records) == 1
        api.set_telemetry(None)
        api.telemetry()  # the bundled engine (or any API user) asks for its reporter
        assert SESSION.passive and not collectives.LOG.records
        after = (ProcessGroup.allreduce, torch.Tensor.backward, DistributedDataParallel.__init__)
        assert after == before and len(_global_optimizer_pre_hooks) == hooks
        dist.all_reduce(torch.ones(4))  # its collectives are its own to report: none here
        assert not collectives.LOG.records
    finally:
        api.set_telemetry(None)


# -- what the views say --------------------------------------------------------------------------


def test_the_header_and_summary_name_the_engine_found() -> None:
    from zeroscope.agent.schema import SCHEMA_VERSION, ConfigSummary, Hello
    from zeroscope.commands.run import silent_job_notice
    from zeroscope.state import ClusterState
    from zeroscope.state.lines import summary_lines
    from zeroscope.tui.header import header_segments

    def state_of(engine: str) -> ClusterState:
        state = ClusterState()
        config = ConfigSummary(stage=2, precision="bf16", dp_world_size=2)
        state.ingest(Hello(SCHEMA_VERSION, "j", 0, 2, config=config, engine=engine), received_s=1.0)
        return state

    attached = state_of("hf-trainer+deepspeed")
    assert "hf-trainer+deepspeed ZeRO-2 bf16 offload none" in [
        t for t, _ in header_segments(attached)
    ]
    assert (
        summary_lines(attached)[0]
        == "job j: 1 rank reported, no step completed (hf-trainer+deepspeed)"
    )
    bundled = state_of("zeroscope")  # the bundled engine's header is unchanged
    assert "ZeRO-2 bf16 offload none" in [t for t, _ in header_segments(bundled)]
    assert summary_lines(bundled)[0] == "job j: 1 rank reported, no step completed"
    assert silent_job_notice(bundled) == []
    (notice,) = silent_job_notice(ClusterState())
    assert "no rank reported" in notice and "PYTHONPATH" in notice
    assert "none reached the end of an optimizer step" in notice  # a script that ended early


# -- a job whose collector is gone ---------------------------------------------------------------


def _train_ddp(steps: int) -> list[str]:
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 2))
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(dist.get_rank())
    losses = []
    for _ in range(steps):
        x, y = torch.randn(4, 16, generator=data), torch.randn(4, 2, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item().hex())
    return losses


def _without_then_with_attach(rank: int, world: int, dead: str) -> dict:
    dist.init_process_group("gloo")
    before = _train_ddp(3)
    os.environ["ZEROSCOPE_COLLECTOR"] = dead  # nobody listens there
    from zeroscope.agent.attach import install
    from zeroscope.agent.attach.session import SESSION

    install.install()  # torch.distributed is imported: everything is installed at once
    after = _train_ddp(3)
    publisher = SESSION.tel.publisher
    return {
        "before": before,
        "after": after,
        "steps": SESSION.steps,
        "errors": SESSION.errors,
        "engine": SESSION.reader.kind,
        "sent": publisher.sent,
    }


def test_a_job_with_no_collector_trains_the_same_losses_and_never_blocks() -> None:
    from tests.distributed import run_ranks

    dead = f"tcp://127.0.0.1:{free_port()}"
    for result in run_ranks(_without_then_with_attach, 2, dead, timeout=180):
        assert result["after"] == result["before"]  # bit for bit, the same process
        assert (result["steps"], result["errors"], result["engine"]) == (3, 0, "ddp")
        assert result["sent"] == 0  # nothing went out, nothing waited for it


def _plain_loop_reports(rank: int, world: int, collector: str) -> dict:
    """A loop with no distributed wrapper: it all-reduces its gradients itself."""
    from zeroscope.agent.publish import Publisher
    from zeroscope.agent.schema import StepReport

    sent: list[StepReport] = []
    original = Publisher.send_batch

    def keep(self: Publisher, messages: list) -> int:
        sent.extend(m for m in messages if isinstance(m, StepReport))
        return original(self, messages)

    Publisher.send_batch = keep  # type: ignore[method-assign]
    os.environ["ZEROSCOPE_COLLECTOR"] = collector
    from zeroscope.agent.attach import install

    install.install()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(3):
        loss = model(torch.randn(2, 8)).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    from zeroscope.agent import api

    api.telemetry().drain()  # type: ignore[attr-defined]  # reports leave from the sampler thread
    return {
        "losses": losses,
        "reported": [r.loss for r in sent],
        "ops": [[(c.op, c.nbytes) for c in r.collectives] for r in sent],
        "memory": [(r.memory.params, r.memory.grads, r.memory.optim) for r in sent],
    }


def test_a_plain_loop_ends_steps_at_optimizer_step_with_its_own_collectives() -> None:
    from tests.distributed import run_ranks, sink_collector

    for result in run_ranks(_plain_loop_reports, 2, sink_collector(), timeout=180):
        assert result["reported"] == result["losses"]  # the scalar backward() was called on
        # Step 1 included: the loop's collectives issued before its first optimizer step count.
        assert result["ops"] == [[("all_reduce", 4 * 32), ("all_reduce", 4 * 4)]] * 3
        psi = 8 * 4 + 4
        # SGD's momentum buffer exists from the first step (created inside it)
        assert result["memory"] == [(4 * psi, 4 * psi, 4 * psi)] * 3


def test_a_part_whose_install_fails_half_way_leaves_nothing_behind_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A torch internal moved under one part of the attach: what that part had patched before
    it failed is put back (the class is as torch made it), and the run's console says once
    what is lost; the other parts' patches stay."""
    from zeroscope.agent.attach import patches
    from zeroscope.agent.attach.install import guarded

    class Target:
        def kept(self) -> str:
            return "torch's"

        def first(self) -> str:
            return "torch's"

    original = Target.__dict__["first"]
    other = guarded("an earlier part", lambda: patches.replace(Target, "kept", lambda s: "ours"))

    def half_way() -> None:
        patches.replace(Target, "first", lambda self: "ours")
        raise AttributeError("'FSDPState' has no attribute '_pre_forward'")

    try:
        assert other and not guarded("a drifted part", half_way)
        assert Target.__dict__["first"] is original and Target().first() == "torch's"
        assert Target().kept() == "ours"  # the earlier part stays installed
        assert not guarded("a drifted part", half_way)
        err = capsys.readouterr().err
        assert err.count("a drifted part: not seen") == 1 and "_pre_forward" in err
    finally:
        patches.restore_all()
    assert Target().kept() == "torch's"


def test_an_op_its_future_completes_after_the_boundary_leaves_the_waiting_list() -> None:
    """An op the step boundary took unfinished, then completed through its future's callback
    (the backend's thread: it may run after ``future.wait()`` returned), is resolved by the
    pending report and must leave ``waiting`` then: nothing else would ever remove it (it
    stayed, and the wrappers' test saw ``log.waiting`` non-empty on a loaded machine)."""
    from zeroscope.agent.attach import collectives

    class SlowWork:
        done = False

        def is_completed(self) -> bool:
            return self.done

    log = collectives.CollectiveLog()
    work = SlowWork()
    issue = collectives._now()
    log.add("all_reduce", 64, 2, issue, work, False)
    (op,) = log.take_all()
    assert id(work) in log.waiting  # unfinished at the boundary: still awaited
    collectives.stamp_end(log.waiting[id(work)])  # its future's callback, on gloo's thread
    work.done = True
    assert op.resolve(issue) is not None
    assert not log.waiting
