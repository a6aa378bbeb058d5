"""The CLI's conventions (issue 21): global options after the subcommand, --version, quiet
broken pipes, completion scripts, colour rules, help lines and examples, --again, hints,
diff of every key and of two attempts, export ids/needs and Markdown, the demo's state."""

from __future__ import annotations

import argparse
import json
import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from console.cli import build_parser
from console.cli.conventions import command_name, hoist_globals
from core.state.store import Store
from tests.conftest import ROOT, run_cli


def _local_plan(tmp_path: Path, items: list[dict], extra_hosts: dict | None = None,
                name: str = "c") -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(json.dumps({"name": name, "hosts": {
        "here": {"local": True, "workdir": str(tmp_path / "w")}, **(extra_hosts or {})},
        "items": items}))
    return p


def _shell(iid: str, command: str, **kw) -> dict:
    return {"id": iid, "content": f"item {iid}", **kw,
            "action": {"kind": "shell", "host": "here", "params": {"command": command}}}


# -- global options ----------------------------------------------------------------------
def test_state_before_or_after_the_subcommand(tmp_path):
    plan = _local_plan(tmp_path, [_shell("a", "echo hi")])
    state = tmp_path / "s.db"
    assert run_cli("run", plan, "a", "--state", state).returncode == 0
    for argv in (("--state", state, "status", plan, "--json"),
                 ("status", plan, "--json", "--state", state),
                 ("status", "--state", state, plan, "--json"),
                 ("status", plan, f"--state={state}", "--json")):
        res = run_cli(*argv)
        assert res.returncode == 0, (argv, res.stderr)
        assert json.loads(res.stdout)["items"][0]["status"] == "done", argv
    # without --state the default location is used: nothing there
    res = run_cli("status", plan, "--json")
    assert json.loads(res.stdout)["items"][0]["status"] == "pending"


def test_hoisting_leaves_subcommand_options_and_words_after_dashdash():
    p = argparse.ArgumentParser(prog="x")
    p.add_argument("--state")
    p.add_argument("-v", action="store_true")
    sub = p.add_subparsers(dest="cmd")
    s = sub.add_parser("own")
    s.add_argument("--state")  # the subcommand's own option of the same name stays
    sub.add_parser("plain").add_argument("rest", nargs="*")
    assert hoist_globals(p, ["plain", "a", "--state", "s", "-v"]) == [
        "--state", "s", "-v", "plain", "a"]
    assert hoist_globals(p, ["own", "--state", "s"]) == ["own", "--state", "s"]
    assert hoist_globals(p, ["plain", "--", "--state", "s"]) == ["plain", "--", "--state", "s"]
    assert hoist_globals(p, ["--state", "plain", "plain"]) == ["--state", "plain", "plain"]


def test_version_carries_the_code_hash():
    from core.selfwheel import code_hash, version

    for argv in (("--version",), ("kinds", "--version")):
        res = run_cli(*argv)
        assert res.returncode == 0
        assert res.stdout.strip() == f"specdeck {version()}"
        # named as what it is, a hash of the code ("+g<hash>" read as a git commit)
        assert res.stdout.strip().endswith(f"+code.{code_hash()}") and "+g" not in res.stdout


def test_a_venv_of_the_older_version_form_is_read_and_told_stale(tmp_path):
    """A host's venv holding a specdeck of the older ``+g<hash>`` form (made before the hash
    was named): the venv check reads its code hash and says it is other code, naming both;
    the wheel this specdeck builds carries the new form in its name and its metadata."""
    import asyncio
    import zipfile

    from core.actions.venv import Venv, VenvParams
    from core.hosts.local import LocalHost
    from core.plans.params import parse_params
    from core.selfwheel import build_wheel, code_hash, code_of, version
    from core.versions import satisfies

    venv = tmp_path / "w" / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    old = "0.1.0+g1a2b3c4d5e"
    dist = site / f"specdeck-{old}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: specdeck\nVersion: {old}\n")
    action = Venv(parse_params(VenvParams, {"torch": "none",
                                            "python": "%d.%d" % sys.version_info[:2]}))

    async def probe():
        host = LocalHost("here", workdir=str(tmp_path / "w"))
        await host.connect()
        return await action.probe(host)

    found = asyncio.run(probe())
    assert found["specdeck"] == old
    (told,) = [b for b in action._unsatisfied(found) if b.startswith("specdeck")]
    assert told == (f"specdeck {old} runs other code (1a2b3c4d5e; this specdeck's is "
                    f"{code_hash()}): it is reinstalled from this one")
    assert code_of(old) == "1a2b3c4d5e" and code_of(version()) == code_hash()
    assert code_of("2.13.0+cpu") is None and code_of("0.1.0") is None
    # == with a local part compares it as PEP 440 normalizes it (pip may print +code.123)
    assert satisfies("0.1.0+code.0123", [("==", "0.1.0+code.123")])
    assert not satisfies(version(), [("==", f"0.1.0+g{code_hash()}")])
    whl = build_wheel(tmp_path)
    assert whl.name == f"specdeck-{version()}-py3-none-any.whl"
    with zipfile.ZipFile(whl) as z:
        assert f"Version: {version()}" in z.read(f"specdeck-{version()}.dist-info/METADATA").decode()


# -- pipes, colour, help -----------------------------------------------------------------
def test_output_piped_to_head_closes_quietly(tmp_path):
    plan = _local_plan(tmp_path, [_shell("t", "true")])
    state = tmp_path / "s.db"
    store = Store(state)
    store.claim_run("r1", "t", "shell", "here", owner="x")
    store.add_metrics("r1", [(s, f"m{k}", s * 0.5) for s in range(4000) for k in range(5)])
    store.close()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for cmd in (f"metrics {plan} t --csv --state {state}", "--help",
                f"metrics {plan} t --jsonl --state {state}"):
        res = subprocess.run(f"{sys.executable} -m console.cli {cmd} | head -1", shell=True, env=env,
                             capture_output=True, text=True, timeout=60)
        assert res.stdout.count("\n") == 1, cmd
        assert "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr, res.stderr
        assert res.stderr == "", (cmd, res.stderr)


def _run_on_tty(argv: list[str], env: dict) -> str:
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "console.cli", *argv], stdout=slave,
                            stderr=subprocess.DEVNULL, env=env)
    os.close(slave)
    out = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        out += data
    proc.wait(30)
    os.close(master)
    return out.decode("utf-8", "replace")


def test_colour_on_a_tty_only_and_never_with_no_color(tmp_path):
    plan = _local_plan(tmp_path, [_shell("a", "echo hi")])
    state = tmp_path / "s.db"
    assert run_cli("run", plan, "a", "--state", state).returncode == 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    env.pop("NO_COLOR", None)
    env.pop("TERM", None)
    argv = ["status", str(plan), "--state", str(state), "--no-reconcile"]
    assert "\x1b[" in _run_on_tty(argv, env)
    assert "\x1b[" not in _run_on_tty(argv, {**env, "NO_COLOR": "1"})
    piped = run_cli(*argv)
    assert "\x1b[" not in piped.stdout and "done" in piped.stdout


def test_long_titles_wrap_inside_the_status_table_on_a_terminal(tmp_path):
    long = "Train the v5 drafter with " + "hard cross-entropy and position decay " * 4
    plan = _local_plan(tmp_path, [{"id": "v5", "content": long}])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80", "NO_COLOR": "1"}
    out = _run_on_tty(["status", str(plan)], env)
    lines = out.replace("\r", "").rstrip("\n").split("\n")
    assert max(len(x.rstrip()) for x in lines) <= 80
    assert "position decay" in out and len(lines) > 4 and "…" not in out  # wrapped, not cut
    # piped: one row per item, the title whole on it
    res = run_cli("status", plan, env={"COLUMNS": "80"})
    assert res.returncode == 0
    (row,) = [ln for ln in res.stdout.splitlines() if " v5 " in ln]
    assert long.strip() in row


def test_status_at_80_columns_never_splits_an_id(tmp_path):
    """The demo's plan on an 80-column terminal: every item id is whole on its row (what the
    next command types; "strip-baseli" / "ne" would read as another item), the table fits,
    and the columns left out for it are named with what shows them."""
    from core.demo import write_workspace

    plan = write_workspace(tmp_path / "demo", True)
    ids = [it["id"] for it in yaml.safe_load(plan.read_text())["items"]]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80", "NO_COLOR": "1"}
    out = _run_on_tty(["status", str(plan), "--no-reconcile"], env).replace("\r", "")
    lines = out.rstrip("\n").split("\n")
    assert max(len(x.rstrip()) for x in lines) <= 80, out
    for item in ids:
        (row,) = [ln for ln in lines if f" {item} " in f"{ln} "]
        assert row.split()[:3] == ["○", "pending", item], row
    assert "strip-baseline" in out and "extract_weights@train" in out  # action kept whole
    assert "(left out at 80 columns: priority, what; a wider terminal, --json or a pipe" in \
        " ".join(lines), out
    wide = _run_on_tty(["status", str(plan), "--no-reconcile"], {**env, "COLUMNS": "200"})
    assert "left out" not in wide and "Strip the baseline checkpoint" in wide


def test_every_command_has_argument_help_and_an_example():
    parser = build_parser()
    (subs,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert {"metrics", "completion", "diff", "compare", "run"} <= set(subs.choices)
    for name, sp in subs.choices.items():
        text = sp.format_help()
        assert "example:\n  specdeck " in text, name
        for a in sp._actions:
            assert a.help and "\n" not in a.help, (name, a.dest)


# -- completion --------------------------------------------------------------------------
@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts(shell, tmp_path):
    res = run_cli("completion", shell)
    assert res.returncode == 0 and "specdeck" in res.stdout and "_ARGCOMPLETE" in res.stdout
    script = tmp_path / f"c.{shell}"
    script.write_text(res.stdout)
    exe = shutil.which(shell)
    if exe:  # a syntax check where the shell is installed
        flag = ["--no-execute"] if shell == "fish" else ["-n"]
        chk = subprocess.run([exe, *flag, str(script)], capture_output=True, text=True)
        assert chk.returncode == 0, chk.stderr


def _complete(line: str, tmp_path: Path) -> list[str]:
    out = tmp_path / "compl.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "_ARGCOMPLETE": "1",
           "_ARGCOMPLETE_SHELL": "bash", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "_ARGCOMPLETE_STDOUT_FILENAME": str(out), "_ARGCOMPLETE_IFS": "\n"}
    subprocess.run([sys.executable, "-m", "console.cli"], env=env, capture_output=True, timeout=60,
                   cwd=tmp_path)
    return sorted(x.strip() for x in out.read_text().split("\n") if x.strip())


def test_completion_offers_commands_items_and_hosts(tmp_path):
    plan = _local_plan(tmp_path, [_shell("train-v4", "true"), _shell("train-v5", "true"),
                                  _shell("eval", "true")])
    assert "metrics" in _complete("specdeck me", tmp_path)
    assert _complete(f"specdeck run {plan} train", tmp_path) == ["train-v4", "train-v5"]
    assert _complete(f"specdeck logs {plan} e", tmp_path) == ["eval"]
    from console.cli.conventions import complete_hosts

    ns = argparse.Namespace(plan=str(plan))
    assert complete_hosts("h", ns) == ["here"]


# -- run --again, hints, hosts reported --------------------------------------------------
def test_run_again_reruns_a_done_item_and_hints_name_the_plan(tmp_path):
    marker = tmp_path / "count"
    plan = _local_plan(tmp_path, [_shell("a", f"echo x >> {marker}")],
                       extra_hosts={"far": {"ssh": "never-contacted.invalid",
                                            "workdir": "/tmp/x"}})
    state = tmp_path / "s.db"
    assert run_cli("run", plan, "a", "--state", state).returncode == 0
    res = run_cli("run", plan, "a", "--state", state)
    assert f"`{command_name()} run {plan} a --again`" in res.stderr  # runnable as printed
    assert "PLAN" not in res.stderr
    assert "far" not in res.stderr  # a host nobody contacted is not reported on exit
    res = run_cli("run", plan, "a", "--again", "--state", state)
    assert res.returncode == 0, res.stderr
    assert marker.read_text() == "x\nx\n"
    doc = json.loads(run_cli("status", plan, "--json", "--state", state).stdout)
    assert doc["items"][0]["run"]["state"] == "succeeded"
    res = run_cli("run", plan, "--all", "--again", "--state", state)
    assert res.returncode == 2 and "name them" in res.stderr


def test_a_misspelled_item_id_gets_the_close_one_and_nothing_changes(tmp_path):
    """Every command that takes an item id resolves it in one place (Plan.item): a typo
    names the id it is close to (ties: each), exit 2, and nothing is run or marked."""
    plan = _local_plan(tmp_path, [_shell("train-v4", "true"), _shell("train-v5", "true"),
                                  _shell("eval-v5", "true")])
    state = tmp_path / "s.db"
    assert run_cli("run", plan, "train-v4", "--state", state).returncode == 0
    before = run_cli("status", plan, "--json", "--state", state).stdout
    for argv in (("run", plan, "trian-v5"), ("logs", plan, "trian-v5"),
                 ("stop", plan, "trian-v5", "--yes"), ("mark", plan, "trian-v5", "done"),
                 ("metrics", plan, "trian-v5"), ("diff", plan, "trian-v5", "train-v4")):
        res = run_cli(*argv, "--state", state)
        assert res.returncode == 2, (argv, res.stderr)
        assert "no item 'trian-v5' in plan 'c'; did you mean 'train-v5'?" in res.stderr, res.stderr
    res = run_cli("run", plan, "train-v6", "--state", state)
    assert res.returncode == 2 and "did you mean 'train-v4' or 'train-v5'?" in res.stderr
    res = run_cli("mark", plan, "cleanup", "done", "--state", state)
    assert res.returncode == 2 and "no item 'cleanup'" in res.stderr
    assert "did you mean" not in res.stderr  # nothing close: no guess
    assert run_cli("status", plan, "--json", "--state", state).stdout == before


def test_ssh_hints_use_dash_p():
    from core.hosts.ssh import ssh_command

    assert ssh_command("bob@gpu.example:2222") == "ssh -p 2222 bob@gpu.example"
    assert ssh_command("gpu") == "ssh gpu"
    assert ssh_command("[::1]:2200") == "ssh -p 2200 ::1"


# -- diff --------------------------------------------------------------------------------
def _config_run(store: Store, item: str, rid: str, config: dict) -> None:
    store.claim_run(rid, item, "train", "here", owner="x")
    store.update_run(rid, config=config)
    store.end_run(rid, "succeeded", exit_code=0)


def test_diff_shows_data_keys_and_two_attempts(tmp_path):
    plan = _local_plan(tmp_path, [{"id": "v4", "content": "v4"}, {"id": "v5", "content": "v5"}])
    state = tmp_path / "s.db"
    base = {"train": {"lr": 1e-4, "max_steps": 100}, "out_dir": "/w/out1",
            "data": {"features": "/w/features/a", "max_len": 512}, "loss": {"gamma": 7}}
    store = Store(state)
    _config_run(store, "v4", "v4-1", base)
    _config_run(store, "v5", "v5-1", {**base, "data": {"features": "/w/features/b",
                                                       "max_len": 512}, "loss": {"gamma": 4}})
    _config_run(store, "v5", "v5-2", {**base, "data": {"features": "/w/features/b",
                                                       "max_len": 1024, "noise": 0.1},
                                      "loss": {"gamma": 4}, "out_dir": "/w/out2"})
    store.close()
    res = run_cli("diff", plan, "v4", "v5#1", "--json", "--state", state)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {
        "data.features": {"v4#1": "/w/features/a", "v5#1": "/w/features/b"},
        "loss.gamma": {"v4#1": 7, "v5#1": 4}}
    res = run_cli("diff", plan, "v5#1", "v5#2", "--json", "--state", state)
    assert json.loads(res.stdout) == {
        "data.max_len": {"v5#1": 512, "v5#2": 1024},
        "data.noise": {"v5#1": None, "v5#2": 0.1}}  # out_dir: where a run wrote, no setting
    text = run_cli("diff", plan, "v5#1", "v5", "--state", state, env={"COLUMNS": "100"}).stdout
    assert "data.noise" in text and "(absent)" in text and "v5#2" in text
    assert "as they do for any two runs: out_dir" in text
    res = run_cli("diff", plan, "v5#7", "v4", "--state", state)
    assert res.returncode == 2 and "no attempt #7" in res.stderr and "#1, #2" in res.stderr


def test_diff_of_a_command_trainer_uses_its_argv_and_config_file(tmp_path):
    cfg = tmp_path / "w" / "cfg.yaml"
    cfg.parent.mkdir()
    cfg.write_text("data:\n  path: /d/one\nlr: 0.001\n")
    plan = tmp_path / "t.yaml"
    plan.write_text(json.dumps({"name": "t", "hosts": {"here": {
        "local": True, "workdir": str(tmp_path / "w")}}, "items": [
        {"id": "train", "content": "own trainer", "action": {
            "kind": "train", "host": "here", "params": {
                "command": f"{sys.executable} -c pass --config cfg.yaml --bf16"}}}]}))
    state = tmp_path / "s.db"
    assert run_cli("run", plan, "train", "--state", state).returncode == 0
    cfg.write_text("data:\n  path: /d/two\nlr: 0.001\n")
    assert run_cli("run", plan, "train", "--again", "--state", state).returncode == 0
    res = run_cli("diff", plan, "train#1", "train#2", "--json", "--state", state)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"config.data.path": {"train#1": "/d/one",
                                                           "train#2": "/d/two"}}
    store = Store(state)
    rec = store.latest_run("train").config
    assert rec["argv"]["config"] == "cfg.yaml" and rec["argv"]["bf16"] is True
    assert rec["config_file"] == str(cfg)


# -- export / import ---------------------------------------------------------------------
def test_export_keeps_ids_and_needs_round_trip_and_markdown(tmp_path):
    plan = _local_plan(tmp_path, [
        {"id": "venv", "content": "Set up the venv", "priority": "high"},
        {"id": "relay", "content": "Relay the checkpoint", "needs": ["venv"]},
        {"id": "eval", "content": "Evaluate", "needs": ["relay", "venv"]}])
    state = tmp_path / "s.db"
    assert run_cli("mark", plan, "venv", "done", "--state", state).returncode == 0
    todos = json.loads(run_cli("export", plan, "--todowrite", "--state", state).stdout)
    assert [(t["id"], t.get("needs")) for t in todos] == [
        ("venv", None), ("relay", ["venv"]), ("eval", ["relay", "venv"])]
    src = tmp_path / "todos.json"
    src.write_text(json.dumps(todos))
    out = tmp_path / "again.yaml"
    assert run_cli("import", src, "-o", out).returncode == 0
    back = json.loads(run_cli("export", out, "--todowrite").stdout)
    assert back == todos  # statuses come from the imported YAML, ids and needs kept
    md = run_cli("export", plan, "--markdown", "--state", state).stdout
    assert md.splitlines()[2:] == [
        "- [x] Set up the venv (`venv`; high)",
        "- [ ] Relay the checkpoint (`relay`; medium; needs `venv`)",
        "- [ ] Evaluate (`eval`; medium; needs `relay`, `venv`)"]


def test_imported_ids_are_cut_at_a_word_boundary(tmp_path):
    src = tmp_path / "t.json"
    src.write_text(json.dumps([{"content": "Copy checkpoint from the kpro6 training host "
                                           "to CT129 through the laptop"}]))
    out = tmp_path / "p.yaml"
    assert run_cli("import", src, "-o", out).returncode == 0
    doc = json.loads(run_cli("status", out, "--json").stdout)
    iid = doc["items"][0]["id"]
    assert iid == "copy-checkpoint-from-the-kpro6-training"
    assert len(iid) <= 40


# -- the demo's state --------------------------------------------------------------------
def test_demo_plan_records_its_state_for_every_command(tmp_path, monkeypatch):
    from core.demo import write_workspace
    from core.plans.planfile import load_plan

    plan_path = write_workspace(tmp_path / "demo", quick=True)
    plan = load_plan(plan_path)
    assert plan.state == str(tmp_path / "demo" / "state.db")
    res = run_cli("mark", plan_path, "review", "skipped")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "demo" / "state.db").exists()  # no flag, no env: the plan's state
    doc = json.loads(run_cli("status", plan_path, "--json", "--no-reconcile").stdout)
    assert {i["id"]: i["status"] for i in doc["items"]}["review"] == "skipped"
    res = run_cli("validate", plan_path)
    assert res.returncode == 0


def test_bad_plan_state_field_is_named(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("name: p\nstate: 3\nhosts: {}\nitems: []\n")
    res = run_cli("validate", p)
    assert res.returncode == 2 and "p.yaml:2" in res.stderr and "state" in res.stderr


def test_metrics_command_table_and_bad_run(tmp_path):
    plan = _local_plan(tmp_path, [_shell("t", "true")])
    state = tmp_path / "s.db"
    store = Store(state)
    store.claim_run("r1", "t", "shell", "here", owner="x")
    store.end_run("r1", "succeeded", exit_code=0)
    store.claim_run("r2", "t", "shell", "here", owner="x")
    store.add_metrics("r1", [(1, "loss", 2.0), (2, "loss", 1.0)])
    store.add_metrics("r2", [(5, "tau", 3.5)])
    store.close()
    res = run_cli("metrics", plan, "t", "--run", "1", "--state", state, env={"COLUMNS": "100"})
    assert res.returncode == 0 and "loss" in res.stdout and "1..2" in res.stdout
    csv_out = run_cli("metrics", plan, "t", "--csv", "--state", state).stdout
    assert csv_out.splitlines()[0] == "step,name,value,time"
    assert csv_out.splitlines()[1].startswith("5,tau,3.5,")
    res = run_cli("metrics", plan, "t", "--run", "9", "--state", state)
    assert res.returncode == 2 and "no run '9'" in res.stderr and "1 (r1)" in res.stderr


def test_ui_takes_state_after_the_plan_and_the_demo_says_how_to_reopen(tmp_path, monkeypatch,
                                                                        capsys):
    import argparse as ap

    from console.cli import main, ui

    plan = _local_plan(tmp_path, [_shell("a", "true")])
    seen = []

    def opener(p, *, state=None, autorun=False):
        seen.append((p.name, state, autorun))
        return 0

    monkeypatch.setattr(ui, "open_console", opener)
    assert main(["ui", str(plan), "--state", str(tmp_path / "x.db")]) == 0
    assert seen == [("c", str(tmp_path / "x.db"), False)]
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    args = ap.Namespace(dir=str(tmp_path / "demo"), quick=True, headless=False, state=None)
    assert ui.cmd_demo(args) == 0
    err = capsys.readouterr().err
    demo = tmp_path / "demo" / "demo.yaml"
    assert f"reopen the demo: `{command_name()} ui {demo}`" in err
    assert seen[-1] == ("demo", str(tmp_path / "demo" / "state.db"), True)


def test_bash_completion_end_to_end(tmp_path):
    """The generated script, sourced in a real bash, completes through the real CLI."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash not installed")
    shim = tmp_path / "bin" / "specdeck"
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m console.cli \"$@\"\n")
    shim.chmod(0o755)
    (tmp_path / "c.bash").write_text(run_cli("completion", "bash").stdout)
    plan = _local_plan(tmp_path, [_shell("train-v5", "true"), _shell("eval", "true")])
    script = r'''
source c.bash
complete_line() {
  COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}; read -ra COMP_WORDS <<<"$1"
  [[ "$1" == *" " ]] && COMP_WORDS+=("")
  COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
  _python_argcomplete specdeck "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
  echo "${COMPREPLY[*]}"
}
complete_line "specdeck met"
complete_line "specdeck logs PLANFILE tr"
complete_line "specdeck status --st"
'''.replace("PLANFILE", str(plan))
    env = {**os.environ, "PATH": f"{shim.parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT)}
    res = subprocess.run([bash, "-c", script], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert [x.strip() for x in res.stdout.splitlines()] == ["metrics", "train-v5", "--state"], \
        res.stderr


def test_run_again_runs_even_where_check_says_done(tmp_path):
    flag, count = tmp_path / "w" / "made", tmp_path / "count"
    plan = _local_plan(tmp_path, [{"id": "mk", "content": "make it", "action": {
        "kind": "shell", "host": "here", "params": {
            "command": f"touch {flag}; echo x >> {count}", "creates": str(flag)}}}])
    state = tmp_path / "s.db"
    assert run_cli("run", plan, "mk", "--state", state).returncode == 0
    assert run_cli("mark", plan, "mk", "pending", "--state", state).returncode == 0
    assert run_cli("run", plan, "mk", "--state", state).returncode == 0  # check: done
    assert count.read_text() == "x\n"
    assert run_cli("run", plan, "mk", "--again", "--state", state).returncode == 0
    assert count.read_text() == "x\nx\n"
