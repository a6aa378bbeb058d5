"""Console commands: ``ui`` opens the Textual console on a plan, ``serve`` serves that console
to a browser (textual-serve, behind a token: :mod:`console.web`), ``demo`` runs the embedded
demo campaign (in the console on a terminal, else headless, printing the tau table).

Textual loads only when the console opens, aiohttp and textual-serve only when ``serve``
runs: importing this module loads none of them.
"""

from __future__ import annotations

import argparse
import shlex
import socket
import sys
import time

from console.cli import exit_codes
from console.cli.output import Printer, err, load_plan
from core.errors import InvalidInput, SpecdeckError


def open_console(plan, *, state: str | None = None, autorun: bool = False) -> int:
    """Open the Textual console on ``plan`` until the user quits (``autorun``: run every
    runnable item once it is up)."""
    from console.app import run_console  # Textual loads only when the console opens

    return run_console(plan, state=state, autorun=autorun)


def cmd_ui(args) -> int:
    return open_console(load_plan(args.plan), state=args.state)


def cmd_serve(args) -> int:
    """Serve the console on ``args.plan`` to browsers until Ctrl-C: the URL (with its
    token) on stdout, once; how to reach it on stderr."""
    from pathlib import Path

    plan = load_plan(args.plan)  # a bad plan: exit 2 here, before anything listens
    bind, local = args.bind, is_loopback(args.bind)
    if not local and not args.allow_remote:
        raise InvalidInput(f"--bind {bind}: not a loopback address; serving the console "
                           "beyond this machine needs --allow-remote",
                           hint="or keep --bind 127.0.0.1 and reach it over an SSH tunnel "
                                f"(ssh -N -L {args.port}:127.0.0.1:{args.port} "
                                f"{socket.gethostname()})")
    if not 0 <= args.port <= 65535:
        raise InvalidInput(f"--port {args.port}: not a port (0-65535; 0: a free one)")
    if args.public_url and not args.public_url.startswith(("http://", "https://")):
        raise InvalidInput(f"--public-url {args.public_url}: not an http:// or https:// URL")
    port = _free_port(bind, args.port)
    try:
        from console.web import ConsoleServer, new_token
    except ImportError as e:  # a venv installed before serve came
        raise SpecdeckError(f"serve needs textual-serve: {e}",
                            hint="pip install 'textual-serve>=1.1.3,<1.2' (or pip install -e . "
                                 "again)") from None
    command = [sys.executable, "-m", "console.cli", "ui", str(Path(args.plan).resolve())]
    if args.state:
        command += ["--state", str(Path(args.state).resolve())]
    server = ConsoleServer(" ".join(map(shlex.quote, command)), host=bind, port=port,
                           public_url=(args.public_url or _public_url(bind, port)).rstrip("/"),
                           title=f"specdeck: {plan.name}", token=new_token())
    print(server.url, flush=True)  # the one place the token is printed
    err(f"specdeck serve: the console on plan '{plan.name}' at the URL above (its token is "
        "the key: anyone with the URL drives the console); each browser tab opens its own "
        "console; Ctrl-C stops serving (runs keep going on their hosts)")
    if local:
        err(f"  from another machine: ssh -N -L {port}:127.0.0.1:{port} {socket.gethostname()}"
            ", then open the URL there")
    server.serve()
    err("specdeck serve: stopped (the consoles it opened have quit; runs keep going)")
    return 0


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP address or ``localhost``) is reachable from this machine
    only; any other name counts as reachable from elsewhere."""
    import ipaddress

    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def _free_port(bind: str, port: int) -> int:
    """``port`` if ``bind`` can listen there (0: a free one, chosen now), else exit 2 saying
    why (a port in use, an address this machine does not have)."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind.strip("[]"), port))
        except OSError as e:
            raise InvalidInput(f"--bind {bind} --port {port}: {e.strerror or e}",
                               hint="pass another --port (--port 0: a free one) or --bind "
                                    "an address of this machine") from None
        return s.getsockname()[1]


def _public_url(bind: str, port: int) -> str:
    """Where a browser reaches a server bound to ``bind``: the address itself, this
    machine's name for a wildcard (0.0.0.0, ::)."""
    host = socket.gethostname() if bind in ("0.0.0.0", "::", "[::]", "") else bind
    return f"http://[{host.strip('[]')}]:{port}" if ":" in host else f"http://{host}:{port}"


def cmd_demo(args) -> int:
    from console.cli.plans import cmd_status
    from core.demo import ablation_text, open_workspace, results_text, run_campaign
    from core.session import run_in_session

    quick = bool(args.quick)
    ablation = bool(getattr(args, "ablation", False))  # (a Namespace built by hand may lack it)
    root, plan_path, state = open_workspace(args.dir, quick, args.state, ablation=ablation)
    plan = load_plan(plan_path)
    err(f"demo workspace: {root}\nplan: {plan_path}\nstate: {state}")
    if not args.headless and sys.stdout.isatty():
        code = open_console(plan, state=state, autorun=True)
        err(f"reopen the demo: `specdeck ui {plan_path}` (state: {state})")
        return code
    t0 = time.monotonic()
    summary, rows, over = run_in_session(plan, run_campaign, state=state,
                                         emit=Printer(quiet=True))
    dt = time.monotonic() - t0
    cmd_status(argparse.Namespace(plan=str(plan_path), state=state, json=False,
                                  no_reconcile=True))
    sys.stdout.write(ablation_text(plan, rows) if ablation else results_text(rows, over))
    err(f"\ndemo wall time: {dt:.0f} s ({'quick' if quick else 'full'})")
    err(f"next: `specdeck ui {plan_path}` or `specdeck compare {plan_path}` "
        f"(the plan records its state: {state})")
    return exit_codes.for_run(summary, named=False)


def register(add) -> None:
    sp = add("ui", cmd_ui, "open the console on a plan")
    sp.add_argument("plan")
    sp = add("serve", cmd_serve, "serve the console on a plan to a browser (a URL with a token)")
    sp.add_argument("plan")
    sp.add_argument("--bind", default="127.0.0.1", metavar="ADDR",
                    help="the address to listen on (default 127.0.0.1: this machine only; "
                         "reach it over an SSH tunnel); any other needs --allow-remote")
    sp.add_argument("--port", type=int, default=8000, help="default 8000; 0: a free one")
    sp.add_argument("--allow-remote", action="store_true",
                    help="let --bind be an address other machines reach (every request "
                         "must still carry the URL's token)")
    sp.add_argument("--public-url", metavar="URL",
                    help="the URL browsers reach this server at (default http://ADDR:PORT), "
                         "e.g. behind a proxy")
    sp = add("demo", cmd_demo, "run the embedded demo campaign locally")
    sp.add_argument("--dir", default=None, help="workspace (default: ./specdeck-demo)")
    sp.add_argument("--headless", action="store_true", help="print progress, no console")
    sp.add_argument("--quick", action="store_true", help="a shorter campaign (CI)")
    sp.add_argument("--ablation", action="store_true",
                    help="run plans/ablation.yaml instead: each of v5's fixes alone against v4 "
                         "(3 arms), on the same hosts and models; ends with compare --arms")
