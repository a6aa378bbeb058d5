"""The error tree every layer raises and the CLI and console show.

``SpecdeckError(message, title=, hint=)`` is the base: the console shows ``title`` and
``message`` in a notification or modal, the CLI prints ``message`` and the ``hint`` (what to do
next). The CLI's exit status for each is decided in one place, ``console/cli/exit_codes.py``.
"""

from __future__ import annotations


class SpecdeckError(Exception):
    """Base of every error specdeck shows to a person.

    Args:
        message: What went wrong, naming the file, item, field or host.
        title: A short heading for the console.
        hint: What to do next.
    """

    default_title = "specdeck error"

    def __init__(self, message: str, *, title: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.title = title or self.default_title
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  hint: {self.hint}"
        return self.message


class InvalidInput(SpecdeckError):
    """Bad input from the user (a plan, a flag, a file); nothing was written."""

    default_title = "Invalid input"


class PlanError(InvalidInput):
    """A plan failed validation. ``issues`` holds every problem found, each with its location."""

    default_title = "Invalid plan"

    def __init__(self, issues: list["PlanIssue"]):  # noqa: F821 - defined in core.plans.plan
        self.issues = issues
        super().__init__("\n".join(str(i) for i in issues))


class HostUnreachable(SpecdeckError):
    """The transport to a host failed (connect, auth, host key, dropped connection).

    Kept apart from :class:`RemoteCommandFailed`: the remote command never got to fail.
    """

    default_title = "Host unreachable"

    def __init__(self, host: str, reason: str, *, hint: str | None = None):
        self.host = host
        self.reason = reason
        super().__init__(f"host {host!r} unreachable: {reason}", hint=hint)


class HostKeyRejected(HostUnreachable):
    """The host's key is unknown or differs from known_hosts. Never bypassed silently."""

    default_title = "Host key rejected"


class RemoteCommandFailed(SpecdeckError):
    """A command ran on a host and exited non-zero (``check=True``).

    Attributes:
        host: The host name from the plan.
        command: The command as sent to the host's shell.
        remote_status: The remote command's exit status (None when killed by a signal);
            never the CLI's exit status (``console/cli/exit_codes.py`` decides that).
        signal: The signal name when it was killed by one.
        stderr: The last lines of its standard error.
    """

    default_title = "Command failed"

    def __init__(self, host: str, command: str, remote_status: int | None, stderr: str,
                 signal: str | None = None):
        self.host = host
        self.command = command
        self.remote_status = remote_status
        self.signal = signal
        tail = "\n".join(stderr.rstrip().splitlines()[-10:])
        how = f"signal {signal}" if signal else f"exit status {remote_status}"
        msg = f"on host {host!r}: `{command}` failed with {how}"
        if tail:
            msg += "\n" + "\n".join("    " + line for line in tail.splitlines())
        super().__init__(msg)


class RunMoveRefused(SpecdeckError):
    """A write would move a run between states its life (``core/runs/life.py``) does not
    connect (an ended run back to running, say): a bug in the writer, refused whole."""

    default_title = "Run state refused"


class ActionFailed(SpecdeckError):
    """An action ran and did not succeed; the item becomes failed."""

    default_title = "Action failed"


class InvalidFile(InvalidInput, ValueError):
    """A file given to specdeck is not what it claims to be: a config.json whose field holds
    the wrong type, a non-finite or out-of-range number, or nests too deeply; a safetensors
    file cut short, empty or not safetensors at all. Nothing was written.

    A ``ValueError`` too, so the readers that turn a bad value into their own refusal (a
    ``core.ml`` task's exit 2) keep doing so.

    Attributes:
        path: the file, as given.
        field: the JSON key path (``dflash_config.block_size``), or None for the whole file.
    """

    default_title = "Invalid file"

    def __init__(self, path: object, problem: str, *, field: str | None = None, hint: str | None = None):
        self.path = str(path)
        self.field = field
        self.problem = problem
        where = f"{self.path}: {field}" if field else self.path
        super().__init__(f"{where}: {problem}", hint=hint)


class StateDiskFull(SpecdeckError):
    """The state database's disk took no more writes: SQLite's ``SQLITE_FULL`` (``database or
    disk is full``), or a write it refused with an I/O error (a file size limit, ``ulimit
    -f``; a failing device). The write's transaction was rolled back: nothing half-stored.

    No fault of any item: a run going on on its host goes on, and stays live in the store, so
    ``attach`` (or ``status``, once its command ended) stores its log from the stored offset,
    and its end, once there is space. Raised by the store (:mod:`core.state.store`, translated
    once where every write goes through); the CLI exits 1 (``console/cli/exit_codes.py``).

    Attributes:
        path: The state database file.
        filesystem: Where it lives: its type, mount point and free space
            (:func:`core.state.statefile.filesystem_of`).
        cause: SQLite's own words (``database or disk is full``, ``disk I/O error``).
        full: True for ``SQLITE_FULL``; False for an I/O error (``why`` names what may cause it).
        mount: Where to free space: the filesystem's mount point.
    """

    default_title = "State disk full"

    def __init__(self, path: str, filesystem: str, cause: str, *, full: bool,
                 why: str | None = None, mount: str | None = None):
        self.path = path
        self.filesystem = filesystem
        self.cause = cause
        self.full = full
        self.mount = mount or "that filesystem"
        what = ("the state disk is full" if full else
                f"the state disk took no more writes ({why or 'a full disk or a failing device'})")
        super().__init__(
            f"{what}: state database {path}, on {filesystem} (SQLite: {cause})",
            hint=f"free space on {self.mount}; nothing stored is lost, and what "
                 "runs write on their hosts meanwhile is stored from their logs once there is "
                 "space (`specdeck attach PLAN`)")
