"""The private names the attach reads from FSDP2, DeepSpeed and the HF Trainer
(zeroscope.agent.attach.private_api) against what is installed, so that a torch, DeepSpeed or
transformers upgrade that renamed one fails here, loudly, instead of leaving a reader to count
a renamed buffer as empty. Three oracles: the readers' own source (every private read is
listed), real engines built by tests/jobs/private_api_probe.py (every listed name is on them,
after construction and after a step), and the session's answer to a missing one (said once,
P/G/O NA)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.attach_support import JOBS, ROOT, job_env
from zeroscope.agent.attach import private_api

READERS = ["fsdp2.py", "deepspeed_engine.py", "hf_trainer.py"]


def _private_reads(path: Path) -> set[str]:
    """Names a reader reads off an engine's objects: ``getattr``/``hasattr`` constants and
    ``obj._name`` attributes, less the reader's own (``self.x = ...``, its methods)."""
    tree = ast.parse(path.read_text())
    own = {
        t.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }
    own |= {
        f.name
        for c in ast.walk(tree)
        if isinstance(c, ast.ClassDef)
        for f in c.body
        if isinstance(f, ast.FunctionDef)
    }
    names: set[str] = set()
    for n in ast.walk(tree):
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name)
            and n.func.id in ("getattr", "hasattr")
            and len(n.args) >= 2
            and isinstance(n.args[1], ast.Constant)
        ):
            names.add(str(n.args[1].value))
        elif (
            isinstance(n, ast.Attribute)
            and n.attr.startswith("_")
            and not n.attr.startswith("__")
            and n.attr not in own
        ):
            names.add(n.attr)
    return names


def test_every_private_name_the_readers_read_is_listed() -> None:
    listed = set(private_api.OPTIONAL)
    listed |= {name for names in private_api.INSTANCE.values() for name in names}
    listed |= {
        m for classes in private_api.CLASS_MEMBERS.values() for ms in classes.values() for m in ms
    }
    for reader in READERS:
        reads = _private_reads(ROOT / "agent" / "attach" / reader)
        assert reads, reader  # the scan sees the reads it is meant to check
        assert reads - listed == set(), reader


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_real_engines_have_every_private_name_the_attach_reads() -> None:
    env = job_env()
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29687", RANK="0", WORLD_SIZE="1")
    done = subprocess.run(
        [sys.executable, str(JOBS / "private_api_probe.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("PROBE ")]
    probe = json.loads(line.removeprefix("PROBE "))
    assert probe["class_members"] == []  # torch, DeepSpeed, transformers: every wrapped member
    assert probe["fsdp2"] == [] and probe["fsdp2_reader"] == []
    assert probe["fsdp2_reader_drifted"] == ["fsdp2.param._sharded_param_data"]
    for stage in (1, 2, 3):
        got = probe[f"zero{stage}"]
        assert got["built"] == got["stepped"] == got["reader"] == [], stage
        zero = "zero3" if stage == 3 else "zero12"
        assert got["reader_drifted"] == [f"deepspeed.{zero}.ipg_buckets"], stage


class _Reader:
    kind = "deepspeed"
    priority = 30
    counted = 0

    def alive(self) -> bool:
        return True

    def private_missing(self) -> list[str]:
        return ["deepspeed.zero12.ipg_buckets"]

    def hello(self) -> tuple[Any, Any, str]:
        from zeroscope.agent.schema import ConfigSummary, ParamCounts

        return ConfigSummary(stage=2, precision="fp32", dp_world_size=2), ParamCounts(1, 1), "cpu"

    def count_grads(self, census: Any) -> None:
        self.counted += 1

    def count_state(self, census: Any) -> None:
        self.counted += 1

    def memory_extras(self, memory: Any) -> None:
        pass

    def layout(self) -> Any:
        return None


class _Telemetry:
    engine = ""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.memory: list[Any] = []

    def event(self, kind: str, message: str, value: float | None = None) -> None:
        self.events.append(message)

    def hello(self, **kw: Any) -> None:
        pass

    def step_end(self, memory: Any, **kw: Any) -> None:
        self.memory.append(memory)


def test_an_engine_missing_a_private_name_reports_memory_na_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from zeroscope.agent.attach.session import AttachSession

    session = AttachSession()
    tel = session.tel = _Telemetry()
    reader = _Reader()
    session.found(reader)  # type: ignore[arg-type]
    session.claim_source("deepspeed")
    for _ in range(2):
        session.before_step("deepspeed")
        session.end_step("deepspeed", loss=1.0)
    assert reader.counted == 0  # a count missing what was renamed is never made
    assert [(m.params, m.grads, m.optim) for m in tel.memory] == [(None, None, None)] * 2
    said = "deepspeed's memory accounting (P, G, O): not seen (deepspeed.zero12.ipg_buckets gone)"
    assert said in capsys.readouterr().err
    assert tel.events == [
        "zeroscope lost deepspeed's memory accounting (P, G, O): deepspeed.zero12.ipg_buckets gone"
    ]
