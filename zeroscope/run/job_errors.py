"""The ranks' own error lines, read from the job's output as it streams by.

A failing job prints a traceback per rank (torch prefixes every line of an uncaught exception
with ``[rankN]: ``, distributed_c10d's excepthook, once the process group exists; its C++
warnings get ``[rankN]:`` too, and pass), and torchrun
adds its shutdown chatter. At the end a person needs one line: the exception the first failing
rank raised (``ConfigError: ... did you mean 'reduce_bucket_size'?``). :class:`ErrorScanner`
reads the output line by line and keeps each rank's last exception line in arrival order. Every
line of the job's own reaches the terminal as it would under torchrun, tracebacks included (a
traceback the script prints for an error it handled, ``traceback.print_exc()``, is the job's
output too: hiding tracebacks lost those); only torchrun's own shutdown chatter, which the end
of the run tells again, and the tracebacks of a stop the user asked for (Ctrl-C) are kept to
the log file.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

RANK_PREFIX = re.compile(r"^\[rank(\d+)\]: ?(.*)$")
"""torch.distributed's excepthook prefix (distributed_c10d.py: ``f"[rank{get_rank()}]"``)."""

ELASTIC_LOG = re.compile(
    r"^[WE]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S*torch/distributed/elastic/(multiprocessing|agent)/\S+\] "
)
"""torchrun's own warnings and errors about stopping workers ("Sending process 123 closing
signal SIGTERM", "failed (exitcode: 1) local_rank: 0 ..."): the end of the job tells the same."""

TRACEBACK = "Traceback (most recent call last):"
BARE_FRAME = re.compile(r'^  File ".*", line \d+$')
"""A frame line with no traceback header: how Python prints a SyntaxError in the script it was
asked to run (the frame, the source line, the caret, then ``SyntaxError: ...``)."""
EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(: |$)")
CHAINED = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)


@dataclass(frozen=True, slots=True)
class RankError:
    """The exception line of a rank's traceback (``rank`` None: an unprefixed traceback, raised
    before the process group existed or by torchrun itself)."""

    rank: int | None
    line: str
    seq: int
    """Arrival order of the traceback that ended with this line (smaller = earlier)."""


class _Block:
    """Where one stream of traceback lines (a rank's, or the unprefixed one) stands."""

    __slots__ = ("bare", "ended", "inside", "started")

    def __init__(self) -> None:
        self.inside = False
        self.bare = False
        """Inside a headerless frame (a SyntaxError's): its end must read as an exception."""
        self.ended = False
        """An exception line just ended a traceback: a chaining note may follow."""
        self.started = 0


class ErrorScanner:
    """Feed it the job's output lines (without their line ends); ask for the ranks' errors.

    Thread-safe: the job's stdout and stderr are read on two threads.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a signal handler may ask while its thread reads
        self._blocks: dict[int | None, _Block] = {}
        self._errors: dict[int | None, RankError] = {}
        self._seq = 0
        self._hid_last = False
        self.stopping = False
        """Set when the job is stopped on request (Ctrl-C): the tracebacks the interrupt makes
        every rank print (``KeyboardInterrupt``) are then kept to the log: the user asked for
        the stop, and the end of the run says it."""

    def feed(self, line: str) -> bool:
        """Take one line; True when a terminal should show it (False: torchrun's chatter)."""
        with self._lock:
            self._seq += 1
            show = self._judge(line)
            self._hid_last = not show
            return show

    def _judge(self, line: str) -> bool:
        match = RANK_PREFIX.match(line)
        if match:
            # Uncaught exceptions carry the prefix, and so do torch's own C++ warnings once the
            # group is up ("[rank0]:[W... reducer.cpp:1529] Warning: find_unused_parameters
            # ...").
            return not (self._read(int(match.group(1)), match.group(2)) and self.stopping)
        if self.stopping and not line.strip() and self._hid_last:
            return False  # torch leaves a traceback's blank lines without the prefix
        if ELASTIC_LOG.match(line):
            return False
        return not (self._read(None, line) and self.stopping)

    def _read(self, rank: int | None, text: str) -> bool:
        """Follow a traceback; True while ``text`` belongs to one."""
        block = self._blocks.setdefault(rank, _Block())
        if text == TRACEBACK:
            if not block.inside:
                block.started = self._seq
            block.inside, block.bare = True, False
            return True
        if not block.inside and BARE_FRAME.match(text):
            block.started, block.inside, block.bare = self._seq, True, True
            return True
        if not block.inside:
            # Between the exceptions of a chain: a blank line and the chaining note.
            block.ended = block.ended and (not text or text in CHAINED)
            return block.ended
        if not text or text[0].isspace():
            return True  # frames, source lines, carets
        # The first unindented line after the frames is the exception ("ValueError: ...");
        # with chained exceptions the last one is what was raised. A rank keeps the place of
        # its first traceback in the order of failures.
        if block.bare and not EXCEPTION.match(text.strip()):
            block.inside = block.bare = False  # a frame-like line the job printed itself
            return False
        first = self._errors.get(rank)
        seq = first.seq if first is not None else block.started
        self._errors[rank] = RankError(rank, text.strip(), seq)
        block.inside, block.bare, block.ended = False, False, True
        return True

    def errors(self) -> list[RankError]:
        """Every rank's latest exception line, earliest traceback first."""
        with self._lock:
            return sorted(self._errors.values(), key=lambda e: e.seq)

    def error_of(self, rank: int) -> str | None:
        with self._lock:
            found = self._errors.get(rank)
            return found.line if found else None
