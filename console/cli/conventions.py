"""What makes ``specdeck`` behave like git, uv or gh, applied once at the entry.

* Global options (``--state``...) are accepted before or after the subcommand:
  :func:`hoist_globals` moves them in front before argparse sees the line, so no subparser
  needs to repeat them.
* ``--version`` prints the version with the code hash the venv action gives host wheels
  (``0.1.0+code.<hash>``: a hash of the files, never to be read as a git commit).
* Every command's ``--help`` has one line per argument and an example (:func:`polish`).
* Shell completion (bash, zsh, fish) by argcomplete: commands, options, plan files, the
  plan's item ids and host names (:func:`attach_completers`, ``specdeck completion SHELL``).
* A ``--state`` that does not exist is refused by every command that only reads state
  (:data:`STATE_USE`, :func:`check_state`): a typo never shows an empty campaign.
* The commands specdeck prints (``hint:``, ``reopen: specdeck ui ...``) run as printed,
  also when ``specdeck`` is not on PATH (:func:`runnable`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from core.errors import InvalidInput

EXAMPLES = {
    "validate": "specdeck validate plans/v5.yaml",
    "status": "specdeck status plans/v5.yaml --json | jq '.items[].status'",
    "run": "specdeck run plans/v5.yaml train-v5     # or --all; --again reruns a done item",
    "attach": "specdeck attach plans/v5.yaml train-v5",
    "mark": "specdeck mark plans/v5.yaml review done",
    "logs": "specdeck logs plans/v5.yaml train-v5 -f",
    "stop": "specdeck stop plans/v5.yaml train-v5 --grace 60",
    "export": "specdeck export plans/v5.yaml --todowrite > todos.json   # or --markdown\n"
              "  specdeck export drafters/v5 --out serve/v5 --format speculators --target models/Qwen3-8B",
    "import": "specdeck import todos.json -o plans/campaign.yaml",
    "ui": "specdeck ui plans/v5.yaml",
    "serve": "specdeck serve plans/v5.yaml --port 8000   # on a GPU host: then ssh -N -L 8000:127.0.0.1:8000 HOST",
    "demo": "specdeck demo --headless --quick",
    "kinds": "specdeck kinds",
    "compare": "specdeck compare plans/v5.yaml --step 3000",
    "diff": "specdeck diff plans/v5.yaml train-v4 train-v5     # two attempts: train-v5#1 train-v5#2",
    "metrics": "specdeck metrics plans/v5.yaml train-v5 --csv --names loss,tau > v5.csv",
    "completion": "specdeck completion bash > ~/.local/share/bash-completion/completions/specdeck",
    "notify": "specdeck notify --test     # the Apprise URL: $SPECDECK_NOTIFY or ~/.config/specdeck/notify",
    "card": "specdeck card plans/v5.yaml v5 --drafter drafters/v5 --out serve/v5 --license apache-2.0",
    "report": "specdeck report plans/v5.yaml --since 12h --markdown   # --send: as a notification",
}

ARG_HELP = {
    "plan": "the plan file (YAML)",
    "item": "an item id of the plan",
    "items": "item ids of the plan",
    "item_a": "an item id (ITEM#N: its Nth attempt)",
    "item_b": "an item id (ITEM#N: its Nth attempt)",
    "status": "the status to set",
    "todos": "a todowrite JSON file",
    "host": "a host name of the plan",
    "json": "machine-readable JSON on stdout",
    "csv": "CSV on stdout",
    "markdown": "a Markdown table (the default when piped)",
}
"""Help for arguments a command declared without one (by dest)."""

EXAMPLE_VALUES = {"plan": "plans/v5.yaml", "item": "train-v5", "items": "train-v5",
                  "host": "gpu"}


STATE_USE = {
    "run": "creates", "adopt": "creates", "mark": "creates", "ui": "creates", "demo": "creates",
    "serve": "creates",
    "status": "reads", "attach": "reads", "logs": "reads", "stop": "reads", "export": "reads",
    "compare": "reads", "diff": "reads", "metrics": "reads", "parity": "reads", "card": "reads",
    "report": "reads",
    "validate": None, "import": None, "kinds": None, "completion": None, "engines": None,
    "notify": None,
}
"""What each command does with the state database: ``creates`` (it records what it does,
so a new ``--state`` starts a campaign's state there), ``reads`` (a ``--state`` that does
not exist is a typo: refused, exit 2, nothing created) or None (it uses no state)."""


def check_state(args) -> None:
    """Refuse an explicit ``--state`` that does not exist for a command that only reads
    state (:data:`STATE_USE`): it would open a new empty database and show every item
    pending. ``$SPECDECK_STATE`` and a plan's ``state:`` are not checked here (set once, not
    typed per command)."""
    path = getattr(args, "state", None)
    if not path or STATE_USE.get(args.cmd) != "reads" or os.path.lexists(path):
        return
    makers = [c for c, use in STATE_USE.items() if use == "creates"]
    raise InvalidInput(f"state database {path}: does not exist (--state); {args.cmd} only "
                       "reads a campaign's state, it starts none",
                       hint=f"check the path (a new state database is started by "
                            f"{', '.join(makers[:-1])} or {makers[-1]})")


def command_name() -> str:
    """How to run this specdeck from a shell, as printed in hints: ``specdeck`` when that
    name on PATH is this very program, else the path of the running executable (the
    README's ``.venv/bin/specdeck``, or ``python -m console.cli`` run by this interpreter)."""
    import shlex
    import shutil

    exe = _running_executable()
    found = shutil.which("specdeck")
    if found and exe and _same_file(found, exe):
        return "specdeck"
    if exe:
        return shlex.quote(exe)
    return f"{shlex.quote(sys.executable)} -m console.cli"


def _running_executable() -> str | None:
    """The ``specdeck`` program this process runs: the entry point it was started as, else
    the one installed beside this interpreter; None when neither exists (run as ``-m``
    from a checkout)."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if Path(argv0).name == "specdeck" and os.path.isfile(argv0):
        return os.path.abspath(argv0)
    beside = Path(sys.executable).parent / "specdeck"
    return str(beside) if beside.is_file() else None


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


_SUGGESTED = re.compile(r"(?<=`)specdeck(?=[ `])")
"""A command specdeck suggests: quoted in backticks, ```specdeck logs PLAN ITEM```."""


def runnable(text: str) -> str:
    """``text`` with each ```specdeck COMMAND``` it suggests spelled as :func:`command_name`
    says, so a printed hint runs as printed. Hints are written once, as ```specdeck ...```
    in backticks, wherever they are made (core included); this is the one place that
    spells them for the shell at hand."""
    name = command_name()
    if name == "specdeck" or "specdeck " not in text:
        return text
    return _SUGGESTED.sub(lambda m: name, text)


class VersionAction(argparse.Action):
    """``--version``: ``specdeck 0.1.0+code.<hash>`` (the hash of the code, not a git commit:
    the one the venv action installs, core.selfwheel)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="print the version (with the code hash hosts' venvs carry) and exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from core.selfwheel import version

        print(f"specdeck {version()}")
        parser.exit()


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def hoist_globals(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """Move the top-level options found after the subcommand to the front of ``argv``.

    An option the subcommand defines itself stays where it is (it is the subcommand's), and
    nothing after ``--`` moves.
    """
    glob: dict[str, argparse.Action] = {}
    for a in parser._actions:
        if a.option_strings and not isinstance(a, argparse._HelpAction):
            for s in a.option_strings:
                glob[s] = a
    subs = _subparsers(parser)
    front: list[str] = []
    rest: list[str] = []
    cmd: argparse.ArgumentParser | None = None
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            rest += argv[i:]
            break
        name = word.split("=", 1)[0]
        act = glob.get(name)
        if act is not None and not (cmd and name in cmd._option_string_actions):
            takes = act.nargs != 0 and "=" not in word
            (front if cmd is not None else rest).extend(argv[i:i + 1 + takes])
            i += 1 + takes
            continue
        if cmd is None and word in subs:
            cmd = subs[word]
        rest.append(word)
        i += 1
    return front + rest


def polish(parser: argparse.ArgumentParser) -> None:
    """Give every command an example and every argument a one-line help."""
    for name, sp in _subparsers(parser).items():
        example = EXAMPLES.get(name) or " ".join(
            ["specdeck", name] + [EXAMPLE_VALUES.get(a.dest, a.dest.upper())
                                  for a in sp._actions if not a.option_strings])
        if not sp.epilog:
            sp.epilog = f"example:\n  {example}"
        glob = ", ".join(a.option_strings[-1] for a in parser._actions if a.option_strings
                         and not isinstance(a, (argparse._HelpAction, VersionAction)))
        if glob and "global options" not in sp.epilog:
            sp.epilog += f"\n\nglobal options, here too: {glob} (see `specdeck --help`)"
        sp.formatter_class = argparse.RawDescriptionHelpFormatter
        for a in sp._actions:
            if a.help is None:
                a.help = ARG_HELP.get(a.dest) or a.dest.replace("_", " ")
    if not parser.epilog:
        parser.epilog = ("example:\n  specdeck run plans/v5.yaml train-v5 --state ~/v5.db\n"
                         "`specdeck COMMAND --help` describes each command.")
        parser.formatter_class = argparse.RawDescriptionHelpFormatter


# -- completion --------------------------------------------------------------------------
def _plan_of(parsed_args):
    from core.plans.planfile import load_plan

    path = getattr(parsed_args, "plan", None)
    if not path:
        return None
    try:
        return load_plan(path)
    except Exception:  # completing must never fail loudly
        return None


def complete_items(prefix, parsed_args, **_):
    plan = _plan_of(parsed_args)
    return [it.id for it in plan.items if it.id.startswith(prefix.split("#")[0])] if plan else []


def complete_hosts(prefix, parsed_args, **_):
    plan = _plan_of(parsed_args)
    return [h for h in plan.hosts if h.startswith(prefix)] if plan else []


def attach_completers(parser: argparse.ArgumentParser) -> None:
    """Plan files, item ids and host names complete from the plan named on the line."""
    from argcomplete.completers import FilesCompleter

    plans = FilesCompleter(("yaml", "yml"))
    glob = [a for a in parser._actions if a.option_strings
            and not isinstance(a, (argparse._HelpAction, VersionAction))]
    for sp in _subparsers(parser).values():
        for a in glob:  # global options complete after the command too (they work there)
            if not any(s in sp._option_string_actions for s in a.option_strings):
                sp.add_argument(*a.option_strings, help=a.help, default=argparse.SUPPRESS)
        for a in sp._actions:
            if a.dest == "plan":
                a.completer = plans
            elif a.dest in ("item", "items", "item_a", "item_b") or a.dest.startswith("item"):
                a.completer = complete_items
            elif a.dest in ("host", "hosts", "nodes") or a.dest.endswith("_host"):
                a.completer = complete_hosts


def autocomplete(parser: argparse.ArgumentParser) -> None:
    """Answer a shell's completion request (argcomplete's protocol) and exit; else no-op."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    import argcomplete

    attach_completers(parser)
    argcomplete.autocomplete(parser)


def cmd_completion(args) -> int:
    import argcomplete

    sys.stdout.write(argcomplete.shellcode(["specdeck"], shell=args.shell))
    return 0


def register(add) -> None:
    sp = add("completion", cmd_completion,
             "print the shell completion script (commands, plan items, hosts)")
    sp.add_argument("shell", choices=["bash", "zsh", "fish"], help="the shell to complete in")


def quiet_broken_pipe() -> None:
    """stdout's reader went away (``| head -1``): end quietly, as git does (no warning when
    Python flushes stdout at exit)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
