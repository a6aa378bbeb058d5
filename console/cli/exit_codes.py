"""The CLI's exit statuses, and the one place that maps an error to one.

=====  ==================================================================================
0      success
1      an action failed (a run failed, a command on a host exited non-zero), or the state
       database's disk took no more writes (``StateDiskFull``: what was being recorded was
       not; runs go on on their hosts, and ``attach`` stores them once there is space)
2      invalid input: a plan, a flag, a file, an unusable state database; nothing written
3      a host could not be reached, or a command specdeck itself ran on it (a probe, a
       kill) was ended by a signal: the host ended it before it could answer. (An item's
       run ended by a signal is that item's failure: 1.)
4      ``parity``: two of the items measured different drafters (their weights' sha256
       differ; for an older result without one, the recorded path, size, mtime); the
       report is printed all the same: a finding, not invalid input
130    interrupted by Ctrl-C (detached runs keep going; runs inside specdeck: interrupted)
143    terminated by SIGTERM (the same)
141    stdout's reader went away (``| head -1``), as git exits
=====  ==================================================================================

A remote command's own exit status never becomes specdeck's: a remote 127 exits 1, a
signalled one 3, and neither ever exits 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.errors import HostUnreachable, InvalidInput, RemoteCommandFailed, StateDiskFull

if TYPE_CHECKING:
    from core.faults import Interruption
    from core.state.records import RunSummary

OK = 0
FAILED = 1
INVALID = 2
UNREACHABLE = 3
DIFFERENT_DRAFTERS = 4
BROKEN_PIPE = 141


def for_error(exc: BaseException) -> int:
    """The exit status for an error that ended a command (never 0)."""
    import sqlite3

    if isinstance(exc, InvalidInput):  # a PlanError too
        return INVALID
    if isinstance(exc, HostUnreachable):
        return UNREACHABLE
    if isinstance(exc, RemoteCommandFailed):
        return UNREACHABLE if exc.signal else FAILED
    if isinstance(exc, StateDiskFull):
        return FAILED  # not invalid input: the file is good, its disk is full
    if isinstance(exc, (sqlite3.DatabaseError, RecursionError)):
        return INVALID  # an unusable state database; input nested too deeply to read
    return FAILED


def for_interruption(how: Interruption) -> int:
    """130 for Ctrl-C, 143 for SIGTERM: 128 + the signal's number, as shells report it."""
    return 128 + int(how.signum)


def for_run(summary: "RunSummary", *, named: bool) -> int:
    """The exit status of ``specdeck run`` from the runner's summary: 3 when a host could not
    be reached, 1 when an item failed, could not be recorded (a full state disk) or
    (``named`` items) one is still waiting on others."""
    if summary.unreachable:
        return UNREACHABLE
    if summary.failed or summary.unrecorded:
        return FAILED
    if named and (summary.waiting or summary.held) and not summary.unadopted:
        return FAILED
    return OK
