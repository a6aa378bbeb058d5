"""``specdeck serve``: the console in a real browser (Debian's headless Chromium driven by
selenium through chromium-driver), and the token every request must carry.

The server is the real ``python -m console.cli serve`` in a subprocess on a plan whose host is
a local workdir; each browser tab gets a real ``specdeck ui`` process from textual-serve.
textual-serve draws the terminal with xterm.js on a canvas, so the text is read from xterm's
own buffer (``buffer.active.getLine(i).translateToString()``, its public API): a script run
before the page's own catches the page's ``Terminal`` as textual-serve's code stores it.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.integration.sshd import descendants

pytestmark = pytest.mark.browser

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1200,800",
                  # the page asks fonts.googleapis.com for a font: fail that at once, offline
                  "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1")

PLAN = """\
name: web
hosts:
  here: {{local: true, workdir: {root}/here}}
items:
  - id: alpha-item
    content: First item
    action: {{kind: shell, host: here, params: {{command: "echo hi"}}}}
  - id: beta-item
    content: Second item
  - id: gamma-item
    content: Third item
"""

CATCH_TERMINAL = """
Object.defineProperty(Object.prototype, 'terminal', {configurable: true, set(value) {
  Object.defineProperty(this, 'terminal', {value, writable: true, configurable: true});
  window.__terminal = value;
}});
"""
"""Run before the page's scripts: textual-serve's code does ``this.terminal = new Terminal()``;
the setter keeps that object where the test can read its buffer."""

SCREEN = """
const t = window.__terminal;
if (!t) return null;
const rows = [];
for (let i = 0; i < t.rows; i++) {
  const line = t.buffer.active.getLine(i);
  rows.push(line ? line.translateToString(true) : '');
}
return rows;
"""


class Served:
    """A running ``specdeck serve`` and what it printed."""

    def __init__(self, proc: subprocess.Popen, url: str):
        self.proc, self.url = proc, url
        self.base = url.split("/?", 1)[0]
        self.token = url.split("token=", 1)[1]

    def stop(self) -> tuple[int, str, str]:
        """Ctrl-C, as the operator stops it: (exit status, rest of stdout, stderr)."""
        self.proc.send_signal(signal.SIGINT)
        out, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, out, err


def serve(tmp: Path, *args: str) -> Served:
    """Start ``specdeck serve`` on a fresh plan under ``tmp``; return once it answers HTTP."""
    (tmp / "here").mkdir(parents=True, exist_ok=True)
    plan = tmp / "web.yaml"
    plan.write_text(PLAN.format(root=tmp))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPECDECK_STATE": str(tmp / "state.db"),
           "HOME": str(tmp), "XDG_STATE_HOME": str(tmp / "xdg-state")}
    proc = subprocess.Popen([sys.executable, "-m", "console.cli", "serve", str(plan),
                             "--port", "0", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    url = proc.stdout.readline().strip() if ready else ""
    if not url.startswith("http"):
        proc.kill()
        pytest.fail(f"serve printed no URL: {url!r} {proc.communicate()[1]}")
    served = Served(proc, url)
    deadline = time.monotonic() + 60
    while True:  # listening: a request without the token is answered (403)
        try:
            status(f"http://127.0.0.1:{served.base.rsplit(':', 1)[1]}/")
            return served
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail(f"serve never answered: {proc.communicate()[1]}")
            time.sleep(0.1)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def status(url: str, headers: dict | None = None) -> tuple[int, dict]:
    """(HTTP status, response headers) of a GET, redirects not followed."""
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    pytest.importorskip("textual_serve", reason="needs textual-serve (pip install -e '.[test]')")
    s = serve(tmp_path_factory.mktemp("serve"))
    yield s
    if s.proc.poll() is None:  # a test failed before stopping it: it and the consoles it opened
        os.killpg(s.proc.pid, signal.SIGKILL)
        s.proc.wait()


def test_requests_without_the_token_are_refused(served):
    base, token = served.base, served.token
    assert status(f"{base}/")[0] == 403
    assert status(f"{base}/?token=wrong")[0] == 403
    assert status(f"{base}/?token={token[:-1]}")[0] == 403
    assert status(f"{base}/static/js/textual.js")[0] == 403
    assert status(f"{base}/ws?width=80&height=24")[0] == 403
    assert status(f"{base}/", {"Cookie": f"specdeck_serve_{base.rsplit(':', 1)[1]}=wrong"})[0] == 403
    # the token: the cookie, and on to the page without it in the URL
    code, headers = status(served.url)
    assert code == 303 and headers["Location"] == "/"
    cookie = headers["Set-Cookie"].split(";", 1)[0]
    assert cookie == f"specdeck_serve_{base.rsplit(':', 1)[1]}={token}"
    assert "HttpOnly" in headers["Set-Cookie"] and "SameSite=Lax" in headers["Set-Cookie"]
    code, headers = status(f"{base}/", {"Cookie": cookie})
    assert code == 200 and headers["Referrer-Policy"] == "no-referrer"
    assert status(f"{base}/static/js/textual.js", {"Cookie": cookie})[0] == 200
    # a page of another site opening the websocket, the cookie sent along: refused
    ws = {"Cookie": cookie, "Connection": "Upgrade", "Upgrade": "websocket",
          "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    assert status(f"{base}/ws", {**ws, "Origin": "http://evil.example"})[0] == 403


def _screen(driver) -> list[str]:
    return driver.execute_script(SCREEN) or []


def _wait_for(driver, ok, what: str, timeout: float = 30) -> list[str]:
    deadline, rows = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        rows = _screen(driver)
        if ok(rows):
            return rows
        time.sleep(0.2)
    pytest.fail(f"the browser never showed {what}:\n" + "\n".join(rows))


def _item_pane(rows: list[str]) -> str:
    """The first line inside the item pane (the selected item's id and status)."""
    for i, row in enumerate(rows[:-1]):
        if "─ 5 item" in row:
            return rows[i + 1].lstrip("│").split("│", 1)[0].strip()
    return ""


@pytest.fixture
def chromium(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver",
                                    reason="needs selenium (pip install -e '.[test]')")
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium "
                    "chromium-driver; scripts/bootstrap --test installs them)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CATCH_TERMINAL})
        yield driver
    finally:
        driver.quit()


def test_the_console_in_headless_chromium(served, chromium, tmp_path):
    from selenium.webdriver.common.by import By

    t0 = time.monotonic()
    chromium.get(served.url)
    assert chromium.current_url == f"{served.base}/"  # the token left the address bar
    # the plan's items listed and the item pane drawn, the cursor on the first item: the
    # browser paints the screen in pieces, so both are waited for (the list alone raced)
    rows = _wait_for(chromium, lambda r: all(i in "\n".join(r) for i in
                                             ("alpha-item", "beta-item", "gamma-item"))
                     and _item_pane(r).startswith("alpha-item"),
                     "the plan's items and the cursor on alpha-item")
    assert _item_pane(rows).startswith("alpha-item")
    shown = time.monotonic() - t0

    chromium.find_element(By.CSS_SELECTOR, ".xterm-helper-textarea").send_keys("j")
    rows = _wait_for(chromium, lambda r: _item_pane(r).startswith("beta-item"),
                     "the cursor on beta-item after j")
    assert "pending" in _item_pane(rows)
    moved = time.monotonic() - t0 - shown

    shot = tmp_path / "serve-console.png"
    assert chromium.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    if os.environ.get("SPECDECK_TEST_ARTEFACTS"):
        keep = Path(os.environ["SPECDECK_TEST_ARTEFACTS"])
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, keep / shot.name)

    # the console process the tab opened: the token is in neither its argv nor its environment
    consoles = [p for p in descendants(served.proc.pid)
                if b"console.cli\0ui\0" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert consoles, "no console process under the server"
    for pid in descendants(served.proc.pid):
        for part in ("cmdline", "environ"):
            try:
                assert served.token.encode() not in Path(f"/proc/{pid}/{part}").read_bytes()
            except FileNotFoundError:  # ended meanwhile
                pass

    # Ctrl-C with the tab still open: the server ends, and the console it opened quits
    t1 = time.monotonic()
    code, out, err = served.stop()
    print(f"served console: plan shown {shown:.1f} s after the page was asked for, j moved "
          f"the cursor {moved:.1f} s later, Ctrl-C ended serve in {time.monotonic() - t1:.1f} s")
    assert code == 0, err
    assert served.token not in out and served.token not in err  # the URL line was the one
    assert "ssh -N -L" in err and "stopped" in err
    deadline = time.monotonic() + 20
    while any(Path(f"/proc/{p}").exists() for p in consoles) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in consoles if Path(f"/proc/{p}").exists()], "a console outlived serve"


def test_any_other_address_needs_allow_remote_and_still_the_token(tmp_path, cli):
    (tmp_path / "here").mkdir()
    plan = tmp_path / "web.yaml"
    plan.write_text(PLAN.format(root=tmp_path))
    res = cli("serve", plan, "--bind", "0.0.0.0", "--port", "0")
    assert res.returncode == 2 and res.stdout == ""
    assert "--bind 0.0.0.0: not a loopback address" in res.stderr
    assert "--allow-remote" in res.stderr and "ssh -N -L" in res.stderr

    pytest.importorskip("textual_serve", reason="needs textual-serve (pip install -e '.[test]')")
    served = serve(tmp_path, "--bind", "0.0.0.0", "--allow-remote")
    try:
        assert served.base.startswith(f"http://{socket.gethostname()}:")
        port = served.base.rsplit(":", 1)[1]
        assert status(f"http://127.0.0.1:{port}/")[0] == 403
        assert status(f"http://127.0.0.1:{port}/?token={served.token}")[0] == 303
    finally:
        code, out, err = served.stop()
    assert code == 0, err
    assert "ssh -N -L" not in err
