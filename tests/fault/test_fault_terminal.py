"""Class 6: terminal safety. Whatever a host prints, a file is named or a todo list says,
no escape sequence or C0/C1 control character reaches the terminal (CLI stderr and stdout,
status tables, imported plans); the stored log keeps the bytes as written."""

from __future__ import annotations

import re

from core.text import sanitize
from tests.fault.conftest import cli, local_plan, rows

HOSTILE = "a\x1b]0;owned\x07b\x1b[2J\x1b[31mc\x9b31md\x85e\x90dcs\x9cf\x07g\x08h\x00i"
BAD = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def test_sanitize_strips_c0_c1_and_sequences():
    out = sanitize(HOSTILE)
    assert not BAD.search(out), repr(out)
    assert "owned" not in out and "dcs" not in out
    assert out.startswith("ab") and "i" in out
    assert sanitize("tab\tkept") == "tab\tkept"
    assert "\n" not in sanitize("one\ntwo", newlines=False) and "\n" in sanitize("one\ntwo")


def test_log_lines_progress_and_status_are_clean(tmp_path):
    (tmp_path / "hostile.txt").write_text(HOSTILE + "\n", encoding="utf-8")
    plan = local_plan(tmp_path, f"""  - id: noisy
    content: "content with \\e[2J an escape and \\x9b C1"
    action: {{kind: shell, host: here, params: {{command: "cat {tmp_path / 'hostile.txt'}; exit 3"}}}}
""")
    db = tmp_path / "s.db"
    res = cli("--state", db, "run", plan, "noisy")
    assert res.returncode == 1
    assert "noisy │ ab" in res.stderr
    assert not BAD.search(res.stderr.replace("\n", "")), repr(res.stderr)
    st = cli("--state", db, "status", plan)
    assert "content with" in st.stdout and not BAD.search(st.stdout.replace("\n", ""))
    exp = cli("--state", db, "export", plan, "--todowrite")
    assert not BAD.search(exp.stdout.replace("\n", "")) and "\\u009b" in exp.stdout
    # the store keeps the bytes the host wrote (logs to a pipe are exact)
    assert cli("--state", db, "logs", plan, "noisy").stdout == HOSTILE + "\n"
    assert rows(db, "SELECT log_lines FROM runs") == [(1,)]


def test_relayed_file_names_are_clean_in_progress(tmp_path):
    src = tmp_path / "a"
    (src / "d").mkdir(parents=True)
    (src / "d" / "x\x1b[31mred\x9bname.bin").write_bytes(b"z" * 1000)
    plan = local_plan(tmp_path, """  - id: copy
    content: relay a directory with a hostile file name
    action: {kind: relay, params: {src: "a:d", dst: "b:d"}}
""", extra_hosts=f"  a: {{local: true, workdir: {src}}}\n  b: {{local: true, workdir: "
                  f"{tmp_path / 'b'}}}\n")
    res = cli("--state", tmp_path / "s.db", "run", plan, "copy")
    assert res.returncode == 0, res.stderr
    assert not BAD.search(res.stderr.replace("\n", "")), repr(res.stderr)


def test_imported_todo_text_is_clean(tmp_path):
    src = tmp_path / "t.json"
    src.write_text('[{"content": "ok \\u001b]0;title\\u0007 \\u009b2J done"}]')
    res = cli("import", src, "-o", tmp_path / "p.yaml")
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "p.yaml").read_text()
    assert not BAD.search(text.replace("\n", "")) and "title" not in text
    assert "ok" in text and "done" in text
    st = cli("status", tmp_path / "p.yaml")
    assert st.returncode == 0 and not BAD.search(st.stdout.replace("\n", ""))
