"""The live viewer's receive clock: what a message's arrival and "now" are read on, for the
"rank silent" and "ranks missing" alerts (zeroscope.state.conditions, alerts).

Wall-clock seconds, but never stepped: the wall time when this module loaded plus the
monotonic time since. ``time.time()`` moves when the wall clock is set (NTP's step, a VM or a
laptop resumed): a step forward made every rank "silent" for the step's length until its next
message, and a step back hid a rank that really fell silent for as long. Only differences of
this clock are read, and ranks' own ``wall_ns`` are never compared with it (their clocks may
disagree anyway), so its drift from the wall clock over a long session changes nothing shown.
"""

from __future__ import annotations

import time

_WALL_AT_START = time.time()
_MONOTONIC_AT_START = time.monotonic()


def receive_now() -> float:
    """Seconds on the receive clock (see the module docstring)."""
    return _WALL_AT_START + (time.monotonic() - _MONOTONIC_AT_START)
