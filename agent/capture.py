"""CUDA graph capture: no device timing while the training thread's stream is capturing.

An agent-API user may capture a step into a CUDA graph (``torch.cuda.graph``). Inside the
capture nothing runs: kernels are recorded for later replays. Recording a timing event there
and querying it (the sender thread reads every event with ``query()`` and ``elapsed_time``) is
illegal in the default global capture mode: the capture fails, or the query raises. So while
``torch.cuda.is_current_stream_capturing()``:

- a phase or step mark carries no device event (its instant is the host's; the step falls back
  to the host axis when its start or end has none);
- a collective is recorded with its bytes and no time (0 s, left out of the bus bandwidth): a
  captured op does not run now, and its replays are not seen by the agent;
- the sender thread touches no event (``underway``) until the training thread's next mark
  outside a capture, and at close.

The first capture is said once, as an ``info`` Event. A capture with no agent call inside it is
not seen: capturing with ``capture_error_mode="thread_local"`` keeps the sender's queries legal
then too (docs/agent-api.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

SAID = (
    "CUDA graph capture: device timing is skipped while a stream is capturing (phases and "
    "collectives in the captured region carry host instants and no device time; the graph's "
    "replays are not timed by the agent)"
)


class CaptureState:
    """Whether the training thread last saw a capture underway (read by the sender thread)."""

    __slots__ = ("underway",)

    def __init__(self) -> None:
        self.underway = False


state = CaptureState()
"""The process's one training thread's view (the sender checks it before touching events)."""


def capturing() -> bool:
    """``torch.cuda.is_current_stream_capturing()``, False where it cannot be asked."""
    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:
        return False


def watched(make: Callable[[], Any], first: Callable[[], None]) -> Callable[[], Any]:
    """``make`` (a device event maker) that makes None while the stream is capturing, keeps
    ``state.underway`` current, and calls ``first`` on the first capture it sees."""
    seen = False

    def event() -> Any:
        nonlocal seen
        if capturing():
            state.underway = True
            if not seen:
                seen = True
                first()
            return None
        state.underway = False
        return make()

    return event
