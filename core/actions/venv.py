"""``venv``: a Python environment on a host, made with uv, that can run ``core.ml``.

``run`` is a detached script (torch downloads take minutes and must survive a closed
laptop): it finds uv or installs it for the user (no sudo: a private venv under
``~/.specdeck/uv``, else astral's installer), creates the venv, installs torch from the
chosen build, the requested packages and — with ``install_self`` — a wheel of the running
specdeck built here and uploaded, then writes the resulting versions to ``versions.json``
in the run capsule. ``finish`` turns known failures (no python, no disk, nothing resolves,
no network) into a message that says what to do.
"""

from __future__ import annotations

import json
import posixpath
import shlex
import tempfile
from dataclasses import dataclass, field
from typing import Literal

from core.actions.base import Action, CheckResult, Launch
from core.errors import ActionFailed
from core.ml.formats import strictjson
from core.plans.params import problems
from core.versions import normalize, parse_requirement, satisfies

_PROBE = r"""
import json, sys
from importlib import metadata
out = {"python": "%d.%d.%d" % sys.version_info[:3]}
for name in json.loads(sys.argv[1]):
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""

_FAILURES = [
    (("No interpreter found", "No Python at", "no python", "Failed to find a Python"),
     "no suitable python {python} on {host}",
     "install python{python} on the host, or set params.python to a version it has"),
    (("No space left on device",), "no disk space on {host}",
     "free space under the host's workdir (or point the venv elsewhere), then run again"),
    (("No solution found", "not found in the package registry", "was not found in the",
      "Because there is no version of"),
     "a requested package does not resolve",
     "fix the name or version in params.packages (the log shows which)"),
    (("invalid peer certificate", "certificate verify failed", "UnknownIssuer"),
     "{host} reaches the package index but does not trust its TLS certificate (a proxy?)",
     "give the host its CA bundle in the plan: env: {{SSL_CERT_FILE: /etc/ssl/certs/"
     "ca-certificates.crt}} (uv reads SSL_CERT_FILE), then run again"),
    (("Failed to fetch", "dns error", "error sending request", "Could not connect",
      "Network is unreachable", "Connection refused", "Temporary failure in name resolution",
      "could not install uv"),
     "no network on {host}: uv cannot reach the package index",
     "give the host network access, or set params.find_links to a directory of wheels on it"),
]


def _requirement_problem(req: str) -> str | None:
    """Why ``req`` is not a requirement uv and the version check both read (None: it is)."""
    try:
        parse_requirement(req)
    except ValueError as e:
        return str(e)
    return None


@dataclass(frozen=True)
class VenvParams:
    path: str = ".venv"
    """Where the venv goes, relative to the host's workdir."""
    python: str = "3.11"
    """The Python version uv should use (found on the host or downloaded by uv)."""
    packages: list[str] = field(default_factory=tuple)
    """Extra requirements, e.g. ``["transformers>=5", "numpy<3"]``."""
    torch: Literal["cpu", "cuda", "none"] = "cpu"
    torch_version: str | None = None
    """e.g. ``2.13.0`` (a CPU build from the CPU index gets ``+cpu``)."""
    torch_index: str | None = "https://download.pytorch.org/whl/cpu"
    """The index the CPU build comes from (null: only find_links and the default index)."""
    find_links: list[str] = field(default_factory=tuple)
    """Local wheel directories on the host (offline hosts, pinned builds)."""
    install_self: bool = True
    """Install this specdeck (a wheel of the running code) so ``python -m core.ml.*`` runs."""

    def validate(self):
        return problems(
            *((("packages", i), _requirement_problem(p)) for i, p in enumerate(self.packages)),
            ("path", "path must stay inside the host's workdir"
             if self.path.startswith("/") is False and ".." in self.path.split("/") else None),
        )


def stale_specdeck(found: str, want: str) -> str:
    """Why a venv's specdeck is not this one, by the code each carries (a version of either
    form, ``+code.<hash>`` or the older ``+g<hash>``: core.selfwheel.code_of)."""
    from core.selfwheel import code_of

    return (f"specdeck {found} runs other code ({code_of(found) or 'no code hash'}; this "
            f"specdeck's is {code_of(want) or want}): it is reinstalled from this one")


class Venv(Action, kind="venv", params=VenvParams,
             summary="create a uv venv on a host with torch (cpu/cuda) + packages + this specdeck"):

    def _wanted(self, self_version: str | None = None) -> dict[str, list]:
        """Each package wanted and its version clauses; ``self_version``: the specdeck a
        run installed (its wheel's name), else this one's."""
        want = {}
        for p in self.params.packages:
            name, clauses = parse_requirement(p)
            want[name] = clauses
        if self.params.torch != "none":
            want["torch"] = [("==", self.params.torch_version)] if self.params.torch_version else []
        if self.params.install_self:
            from core.selfwheel import version

            want["specdeck"] = [("==", self_version or version())]
            for r in ("transformers", "safetensors"):
                want.setdefault(r, [])
        return want

    def _python(self, host) -> str:
        return posixpath.join(host.path(self.params.path), "bin", "python")

    async def probe(self, host) -> dict | None:
        """The venv's python version and installed versions of what we want (None: no venv)."""
        py = self._python(host)
        if await host.stat(py) is None:
            return None
        res = await host.run([py, "-c", _PROBE, strictjson.dumps(sorted(self._wanted()))])
        if not res.ok:
            return None
        try:
            return json.loads(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return None

    def _unsatisfied(self, found: dict, self_version: str | None = None) -> list[str]:
        bad = []
        for name, clauses in self._wanted(self_version).items():
            v = found.get(name)
            if v is None:
                bad.append(f"{name} missing")
            elif name == "specdeck" and not satisfies(v, clauses):
                bad.append(stale_specdeck(v, clauses[0][1]))
            elif not satisfies(v, clauses):
                bad.append(f"{name} {v} does not satisfy {clauses}")
        if not found.get("python", "").startswith(self.params.python):
            bad.append(f"python {found.get('python')} is not {self.params.python}")
        return bad

    async def check(self, ctx) -> CheckResult:
        found = await self.probe(ctx.host)
        if found is None:
            return CheckResult.ready(f"no venv at {self.params.path}")
        bad = self._unsatisfied(found)
        if not bad:
            return CheckResult.done(f"{self.params.path} has " + ", ".join(
                f"{k} {v}" for k, v in sorted(found.items()) if v))
        return CheckResult.ready("; ".join(bad))

    async def prepare(self, ctx) -> None:
        host = ctx.host
        need = {"cpu": 1.5e9, "cuda": 8e9, "none": 3e8}[self.params.torch]
        free = await host.disk_free(".")
        if free < need:
            raise ActionFailed(
                f"venv on {host.name}: {free / 1e9:.1f} GB free under {host.workdir}, "
                f"about {need / 1e9:.1f} GB needed for torch={self.params.torch}",
                hint="free space on the host or choose another workdir, then run again")
        if self.params.install_self:
            from core.selfwheel import build_wheel

            with tempfile.TemporaryDirectory() as d:
                whl = build_wheel(d)
                await host.write_file(self._wheel(ctx), whl.read_bytes())

    @staticmethod
    def _wheel(ctx) -> str:
        """Where ``prepare`` uploads this specdeck's wheel: in the run's capsule."""
        from core.capsules import jobs
        from core.selfwheel import wheel_name

        return f"{jobs.capsule_path(ctx.host, ctx.run_id)}/{wheel_name()}"

    def command(self, ctx) -> Launch:
        p = self.params
        host = ctx.host
        venv = shlex.quote(host.path(p.path))
        py = shlex.quote(self._python(host))
        links = " ".join(f"--find-links {shlex.quote(host.path(x))}" for x in p.find_links)
        lines = [
            "set -uo pipefail",
            'say() { echo "[venv] $*"; }',
            'fail() { echo "[venv] error: $1"; exit "${2:-1}"; }',
            'find_uv() { for c in "$(command -v uv 2>/dev/null)" "$HOME/.local/bin/uv" '
            '"$HOME/.cargo/bin/uv" "$HOME/.specdeck/uv/bin/uv"; do '
            '[ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }; done; return 1; }',
            'UV=$(find_uv) || {',
            '  say "uv not found: installing it for $(id -un) under ~/.specdeck/uv (no sudo)"',
            '  { python3 -m venv "$HOME/.specdeck/uv" && "$HOME/.specdeck/uv/bin/pip" install '
            '-q uv; } || { command -v curl >/dev/null && curl -LsSf https://astral.sh/uv/install.sh '
            '| env UV_NO_MODIFY_PATH=1 sh; }',
            '  UV=$(find_uv) || fail "could not install uv (no network, or no python3-venv)" 41',
            "}",
            'say "uv: $("$UV" --version)"',
            f'if [ ! -x {py} ]; then "$UV" venv --python {shlex.quote(p.python)} {venv} '
            f'|| fail "uv venv failed" 42; fi',
        ]
        pip = f'"$UV" pip install --python {py} {links}'.rstrip()
        if p.torch != "none":
            spec = "torch" + (f"=={p.torch_version}" if p.torch_version else "")
            if p.torch == "cpu":
                if p.torch_version and "+" not in p.torch_version and not p.find_links:
                    spec += "+cpu"
                idx = (f"--extra-index-url {shlex.quote(p.torch_index)} "
                       "--index-strategy unsafe-best-match") if p.torch_index else ""
                lines.append(f'say "installing {spec} (CPU build)"')
                lines.append(f"{pip} {idx} {shlex.quote(spec)} || fail 'torch install failed' 43")
            else:
                lines.append(f'say "installing {spec} (CUDA build from the default index)"')
                lines.append(f"{pip} {shlex.quote(spec)} || fail 'torch install failed' 43")
        if p.packages:
            lines.append(f"{pip} {' '.join(shlex.quote(x) for x in p.packages)} "
                         f"|| fail 'package install failed' 44")
        if p.install_self:
            from core.selfwheel import HOST_REQUIRES

            lines.append(f"{pip} --no-deps {shlex.quote(self._wheel(ctx))} || fail 'specdeck install failed' 45")
            lines.append(f"{pip} {' '.join(shlex.quote(r) for r in HOST_REQUIRES)} "
                         f"|| fail 'specdeck requirements failed' 44")
        names = strictjson.dumps(sorted(self._wanted()))
        lines.append(f"{py} -c {shlex.quote(_PROBE)} {shlex.quote(names)} > versions.json.tmp "
                     "&& mv versions.json.tmp versions.json && cat versions.json")
        cwd = None
        from core.capsules import jobs

        cwd = jobs.capsule_path(host, ctx.run_id)
        return Launch("\n".join(lines), cwd=cwd)

    async def finish(self, ctx, outcome) -> dict:
        host = ctx.host
        if outcome.state == "succeeded":
            installed = None  # the specdeck this run installed (its wheel's name)
            for name in await host.listdir(outcome.capsule):
                if name.startswith("specdeck-") and name.endswith(".whl"):
                    installed = name.split("-")[1]
            raw = await host.read_from(f"{outcome.capsule}/versions.json", 0, 1 << 16)
            found = json.loads(raw or b"{}")
            bad = self._unsatisfied(found, installed)
            if bad:
                raise ActionFailed(f"venv on {host.name}: installed, but " + "; ".join(bad),
                                   hint="check the versions asked for in params")
            return {"versions": found, "venv": host.path(self.params.path)}
        size = (await host.stat(f"{outcome.capsule}/log"))
        start = max(0, (size.size if size else 0) - 65536)
        tail = (await host.read_from(f"{outcome.capsule}/log", start, 65536)).decode(
            "utf-8", "replace")
        for needles, msg, hint in _FAILURES:
            if any(n.lower() in tail.lower() for n in needles):
                raise ActionFailed(f"venv on {host.name}: " + msg.format(
                    host=host.name, python=self.params.python), hint=hint.format())
        return await super().finish(ctx, outcome)


__all__ = ["Venv", "VenvParams", "normalize"]
