"""Every console command in one list: the command palette (ctrl+p) and help (``?``) read it.

Each entry names an App action (``SpecdeckApp.action_<name>``), so a command does the same
thing from a key, the palette or a test (``await app.run_action("stop_run")``).
"""

from __future__ import annotations

from typing import NamedTuple


class Command(NamedTuple):
    title: str
    help: str
    action: str
    keys: str
    """How to reach it from the keyboard (shown in help)."""
    where: str = "anywhere"


COMMANDS: tuple[Command, ...] = (
    Command("Inspect item", "show the selected item's detail (never runs anything)",
            "inspect", "enter", "plan"),
    Command("Run item", "run the selected item (asks first, naming kind, host, launcher, "
            "resources and command; a re-run says its attempt number)", "run_item", "r"),
    Command("Run item again", "run the selected item even though it is done or stopped (asks "
            "first, saying whether a train item starts fresh or resumes, from which checkpoint)",
            "run_again", "R"),
    Command("Run all", "run every item whose needs are done, in dependency order; the cursor "
            "and log follow each run as it starts (any key stops following)", "run_all", "A"),
    Command("Stop run", "stop the selected item's live run (asks first: SIGTERM, grace, SIGKILL)",
            "stop_run", "x"),
    Command("Adopt run", "make a run started outside specdeck (pid, slurm job, tmux session) "
            "the selected item's run: its log is followed, x stops it", "adopt", "a", "plan"),
    Command("Mark done", "tick a manual item done (an action item: asks first)",
            "mark('done')", "d", "plan"),
    Command("Skip item", "mark the selected item skipped (an action item: asks first; items "
            "that need its output wait, items only after it go ahead)", "mark('skipped')", "s",
            "plan"),
    Command("Undo mark", "mark the selected item pending again (undoes d, s, a failure or a "
            "stop)", "mark('pending')", "u", "plan"),
    Command("Filter items", "show only items matching words (id, content, status, host)",
            "filter", "/", "plan"),
    Command("Pin curves", "keep the selected item's latest run on the metrics chart",
            "pin", "p", "plan"),
    Command("Search log", "find text in the shown log; n / N: next / previous", "search_log",
            "/", "log"),
    Command("Toggle follow", "follow the end of the log, or stop following", "toggle_follow",
            "f", "log"),
    Command("Next metric", "show the next metric family on the chart (M: previous)",
            "next_metric", "m", "metrics"),
    Command("Smoothing", "cycle the EMA smoothing of the curves (off, 0.6, 0.9, 0.97)",
            "smoothing", "v", "metrics"),
    Command("Log scale", "toggle a logarithmic y axis", "log_y", "l", "metrics"),
    Command("Wall-clock axis", "x axis: training step, or hours since the run started",
            "wall_clock", "w", "metrics"),
    Command("Bookkeeping series", "show or hide bookkeeping series (elapsed_s, eta_s…) "
            "among the metric families", "bookkeeping", "b", "metrics"),
    Command("Tau at step", "show one training step's tau eval results in the tau table "
            "(enter: the latest evaluated step; all: every step)", "tau_at_step", "t",
            "metrics"),
    Command("Sort tau table", "sort the comparison by the next column (O reverses)", "sort_tau",
            "o", "tau"),
    Command("Mark drafter", "add the cursor row's drafter to the per-position chart",
            "mark_drafter", "space", "tau"),
    Command("Journal", "what happened (and what happened while the console was closed)",
            "journal", "e"),
    Command("Report", "the morning report: what happened since a console last saw the campaign, "
            "in order (runs, checkpoints, tau, alerts, preemptions, incidents) and its cost",
            "report", "c"),
    Command("Reload", "reload statuses, the selected item, curves and tau from the store",
            "reload", "ctrl+r"),
    Command("Zoom pane", "make the focused pane fill the screen, or restore it", "zoom", "z"),
    Command("Next pane", "focus (and on a small terminal, show) the next pane",
            "cycle_pane(1)", "tab"),
    Command("Previous pane", "focus the previous pane", "cycle_pane(-1)", "shift+tab"),
    Command("Focus plan", "move focus to the plan", "focus_pane('plan')", "1"),
    Command("Focus log", "move focus to the log", "focus_pane('log')", "2"),
    Command("Focus metrics", "move focus to the curves", "focus_pane('metrics')", "3"),
    Command("Focus tau", "move focus to the tau table", "focus_pane('tau')", "4"),
    Command("Focus detail", "move focus to the item detail", "focus_pane('detail')", "5"),
    Command("Focus GPUs", "each host's GPUs (utilisation and its recent history, memory, "
            "power, temperature, processes) and free disk; a host without nvidia-smi says so",
            "focus_pane('gpus')", "6"),
    Command("Help", "every key binding", "help", "?"),
    Command("Quit", "leave the console; runs on hosts keep going", "quit", "q / ctrl+q"),
)


def help_sections() -> list[tuple[str, list[tuple[str, str]]]]:
    """Help rows grouped by where the keys work."""
    order = ["anywhere", "plan", "log", "metrics", "tau"]
    names = {"anywhere": "Anywhere", "plan": "Plan pane (focused)",
             "log": "Log pane (focused)", "metrics": "Metrics pane (focused)",
             "tau": "Tau pane (focused)"}
    out = []
    for where in order:
        rows = [(c.keys, f"{c.title}: {c.help}") for c in COMMANDS if c.where == where]
        if where == "anywhere":
            rows += [("ctrl+p", "Command palette: every command"),
                     ("escape", "Close a filter, search or dialog; restore a zoomed pane"),
                     ("j / k", "Move down / up in any list (plan, log, tau, journal, help)"),
                     ("g / G", "First / last row"),
                     ("ctrl+d / ctrl+u", "Half a page down / up")]
        if where == "log":
            rows.append(("n / N", "Next / previous match"))
        if where == "tau":
            rows.append(("O", "Reverse the sort (clicking a header sorts by it)"))
        out.append((names[where], rows))
    return out
