"""``specdeck serve``'s input, refused before anything listens (exit 2, nothing on stdout, no
URL, no token), and which addresses count as this machine only. The served console itself:
tests/ui/test_serve.py (a real browser)."""

from __future__ import annotations

import socket

import pytest

from console.cli import main
from console.cli.ui import _public_url, is_loopback

PLAN = """\
name: web
hosts:
  here: {{local: true, workdir: {root}}}
items:
  - id: alpha-item
    content: First item
"""


@pytest.mark.parametrize("address, local", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("0.0.0.0", False), ("::", False), ("10.1.2.3", False),
    ("gpu-box", False), ("127.0.0.1.example.org", False)])
def test_what_counts_as_this_machine_only(address, local):
    assert is_loopback(address) is local


def test_the_url_a_browser_reaches():
    assert _public_url("127.0.0.1", 8000) == "http://127.0.0.1:8000"
    assert _public_url("::1", 8000) == "http://[::1]:8000"
    assert _public_url("0.0.0.0", 8001) == f"http://{socket.gethostname()}:8001"


def test_bad_input_is_refused_before_anything_listens(tmp_path, capsys):
    plan = tmp_path / "web.yaml"
    plan.write_text(PLAN.format(root=tmp_path))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cases = {
            ("--port", str(port)): f"--bind 127.0.0.1 --port {port}: Address already in use",
            ("--port", "70000"): "--port 70000: not a port (0-65535; 0: a free one)",
            ("--public-url", "gpu-box:8000"): "--public-url gpu-box:8000: not an http://",
            ("--bind", "10.1.2.3"): "--bind 10.1.2.3: not a loopback address; serving the "
                                    "console beyond this machine needs --allow-remote",
        }
        for args, words in cases.items():
            code, (out, err) = main(["serve", str(plan), *args]), capsys.readouterr()
            assert code == 2 and words in err, (args, err)
            assert out == "" and "token=" not in err  # no URL given out
    bad = tmp_path / "bad.yaml"
    bad.write_text(PLAN.format(root=tmp_path).replace("content: First item", "contnt: x"))
    code, (out, err) = main(["serve", str(bad), "--port", "0"]), capsys.readouterr()
    assert code == 2 and "bad.yaml:" in err and out == ""
