"""Types of the agent's C seam (agent/_seam.c); agent/host_seam.py is its Python twin."""

from typing import Any

class HostWork:
    work: Any
    record: list[Any]
    counters: Recorder | None
    def __init__(self, work: Any, record: list[Any], counters: Recorder | None = None) -> None: ...
    def wait(self, timeout: Any = None) -> Any: ...
    def is_completed(self) -> bool: ...
    def get_future(self) -> Any: ...
    def __getattr__(self, name: str) -> Any: ...

class Recorder:
    pending: list[list[Any]]
    collective_ns: int
    host_ended: int
    def __init__(self, fallback: Any) -> None: ...
    def __call__(
        self,
        work: Any,
        *,
        op: str,
        nbytes: int,
        group_size: int,
        prefetched: bool = False,
        label: str = "",
    ) -> Any: ...
    def take(self) -> list[list[Any]]: ...

def now_ns() -> int: ...
