"""What the ML actions share: the host's python, prompt sets, artefact references.

Every ML action runs ``python -m core.ml.<task>`` detached in a run capsule with the host's
Python (``python:`` in the plan's host, else ``.venv/bin/python`` under its workdir when
present, else ``python3``), so the work survives specdeck and a dropped connection. The
task prints JSON lines (progress, metrics, checkpoints) that the log follower turns into
progress, metrics and artefacts, and writes its result files into the capsule, which
``finish`` reads back into the store.

Prompt sets: ``prompts: coding`` names a set shipped under ``plans/prompts/`` (or a
``prompts/`` folder beside the plan); ``prompts: my.jsonl`` is a file beside the plan,
uploaded to the host (content-addressed under ``.specdeck/prompts/``); ``prompts: host:PATH``
is a file already on the host; ``prompts: zlab:NAME`` (or ``zlab:NAME:PATH``, PATH local and
relative to the plan) is one of the z-lab reference's benchmark sets (``core.ml.measure.zlab``), built
here into a prompts file and uploaded like a file beside the plan.

Artefact references: ``item:<train item>@latest``, ``@best`` or ``@step:<N>`` (``@step_<N>``
too) name a checkpoint recorded by a train item's runs, in whichever trainer's layout it was
written (:mod:`core.ml.formats.layouts`): ``@best`` is the trainer's own best pointer (SpecForge's
``{run_id}-best``, speculators' ``checkpoint_best``) as the newest run that had one left it.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from core.errors import ActionFailed
from core.ml.measure import zlab
from core.ml.formats.runio import UsageError

SHIPPED_PROMPTS = Path(__file__).resolve().parent.parent.parent / "plans" / "prompts"
REF = re.compile(r"^item:([A-Za-z0-9][A-Za-z0-9_.-]*(?:\[[A-Za-z0-9][A-Za-z0-9_.-]*\])?)"
                 r"@(latest|best|step[_:](\d+))$")
"""``item:ID@latest|best|step:N``; ``ID`` may be an arm's item (``train[noise]``)."""
REF_FORMS = "item:<id>@latest, item:<id>@best or item:<id>@step:<N>"


async def host_python(host) -> str:
    if host.python:
        return host.path(host.python) if not host.python.startswith("/") else host.python
    venv = host.path(".venv/bin/python")
    if await host.stat(venv) is not None:
        return venv
    return "python3"


def py_module(python: str, module: str, *args) -> str:
    """``PYTHON -m MODULE ARGS`` with every word quoted (None and False args are dropped)."""
    words = [python, "-u", "-m", module]
    for a in args:
        if a is None or a is False:
            continue
        words.append(str(a))
    return shlex.join(words)


def local_prompt_file(plan_dir: Path, spec: str) -> Path | None:
    """The local file a prompts spec names (a shipped set or a file beside the plan)."""
    if spec.startswith("host:"):
        return None
    for base in (plan_dir / "prompts", SHIPPED_PROMPTS):
        p = base / f"{spec}.jsonl"
        if re.fullmatch(r"[A-Za-z0-9_.-]+", spec) and p.is_file():
            return p
    p = (plan_dir / spec)
    return p if p.is_file() else None


def local_prompt_data(plan_dir: Path, spec: str) -> tuple[str, bytes] | None:
    """The name and bytes of the prompts file a spec names here (None: a ``host:`` file or
    nothing of that name).

    Raises:
        UsageError: a ``zlab:`` set that cannot be built (the message says how to get it).
    """
    if zlab.is_spec(spec):
        return zlab.file_stem(spec), zlab.build(spec, plan_dir)
    local = local_prompt_file(plan_dir, spec)
    return (local.stem, local.read_bytes()) if local is not None else None


def validate_prompts(plan, spec: str, *, multi_turn: bool = True) -> str | None:
    """What is wrong with a prompts spec (None: nothing); ``multi_turn=False`` where the
    prompts are not generated turn by turn online (extract, offline eval)."""
    if zlab.is_spec(spec):
        try:
            s, _ = zlab.parse(spec)
            zlab.build(spec, plan.dir)
        except UsageError as exc:
            return str(exc)
        if s.multi_turn and not multi_turn:
            return (f"prompts {spec!r} is multi-turn: each turn follows the target's own answer to the "
                    "one before, which only an online eval generates (use mode: online)")
        return None
    if spec.startswith("host:"):
        return None if len(spec) > 5 else "host: needs a path"
    if local_prompt_file(plan.dir, spec) is None:
        sets = sorted(p.stem for p in SHIPPED_PROMPTS.glob("*.jsonl"))
        return (f"prompts {spec!r}: no file beside the plan and no shipped set of that name "
                f"(sets: {', '.join(sets)}; or write host:PATH for a file on the host)")
    return None


def prompt_ids(data: bytes) -> list[str]:
    ids = []
    for line in data.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if line:
            try:
                ids.append(str(json.loads(line)["id"]))
            except (ValueError, KeyError, TypeError):
                pass
    return ids


async def prompts_on_host(host, plan, spec: str, *, upload: bool) -> tuple[str, list[str]]:
    """The path on ``host`` of one of ``plan``'s prompt sets (uploading it when ``upload``)
    and its prompt ids."""
    if spec.startswith("host:"):
        path = host.path(spec[5:])
        data = await host.read_from(path, 0, 1 << 26)
        return path, prompt_ids(data)
    try:
        local = local_prompt_data(plan.dir, spec)
    except UsageError as exc:
        raise ActionFailed(str(exc)) from None
    if local is None:
        raise ActionFailed(f"prompts {spec!r} not found")
    stem, data = local
    digest = hashlib.sha256(data).hexdigest()[:12]
    path = host.path(f".specdeck/prompts/{stem}-{digest}.jsonl")
    if upload and await host.stat(path) is None:
        await host.write_file(path, data)
    return path, prompt_ids(data)


def record_launch(ctx, **found: str) -> None:
    """Record with the run, as its config, what ``prepare`` found or put on the host that
    ``command`` needs (the host's python, an uploaded prompts file): an action keeps no
    state between hooks, since the runner builds a fresh one for each call and a restart
    may come between any two (core/actions/base.py)."""
    ctx.record_config(found)


def launch_inputs(ctx) -> dict:
    """What :func:`record_launch` recorded for this run (raises ActionFailed when its
    ``prepare`` never ran)."""
    run = next((r for r in ctx.runs() if r.id == ctx.run_id), None)
    found = run.config if run is not None else None
    if not isinstance(found, dict):
        raise ActionFailed(f"item {ctx.item.id!r}: run {ctx.run_id} was never prepared "
                           "(nothing recorded of its host's python or inputs)",
                           hint="run the item again")
    return found


def resolve_ref(ctx, ref: str) -> str:
    """A path, or the checkpoint an ``item:<id>@latest|@best|@step:N`` reference names."""
    art = resolve_checkpoint(ctx, ref)
    return ref if art is None else art.path


def resolve_checkpoint(ctx, ref: str):
    """The checkpoint Artefact an ``item:`` reference names (its ``data`` says its layout and,
    for a SpecForge checkpoint, the drafter config strip needs), or None for a plain path.

    Raises:
        ActionFailed: nothing recorded under that name (the message lists what is).
    """
    m = REF.match(ref)
    if not m:
        return None
    item, which, step = m.group(1), m.group(2), m.group(3)
    arts = ctx.artefacts(item, "checkpoint")
    if not arts:
        raise ActionFailed(f"{ref}: item {item!r} has recorded no checkpoint yet",
                           hint=f"run {item} first (or wait for its first checkpoint)")
    if which == "latest":
        return max(arts, key=lambda a: (a.step or -1, a.id))
    if which == "best":
        best = next((r.result["best"] for r in reversed(ctx.runs(item))
                     if isinstance(r.result, dict) and isinstance(r.result.get("best"), dict)), None)
        art = next((a for a in arts if best and a.path == best.get("path")), None)
        if art is None:
            raise ActionFailed(f"{ref}: item {item!r} left no best pointer (SpecForge's "
                               "{run_id}-best, speculators' checkpoint_best; specdeck's trainer "
                               "keeps none)", hint=f"name item:{item}@latest or @step:<N>")
        return art
    for a in arts:
        if a.step == int(step):
            return a
    have = ", ".join(f"step:{a.step}" for a in arts)
    raise ActionFailed(f"{ref}: no checkpoint at step {step} (recorded: {have})")


def checkpoint_layout(art) -> dict:
    """What a checkpoint Artefact's ``data`` says of its layout (``{}``: specdeck's own)."""
    return art.data if art is not None and isinstance(art.data, dict) else {}


LISTING_S = 60.0
"""How long listing an output dir on a host may take (a stuck filesystem: no listing)."""


@dataclass(frozen=True)
class Listing:
    """An output dir on a host as one ``find`` saw it (:func:`host_entries`)."""

    entries: list
    """Its checkpoints (:class:`core.ml.formats.layouts.Entry`), oldest step first."""
    best: int | None
    """The step the run's best pointer names (None: none)."""
    files: frozenset[str]
    """The regular files among what was listed, relative to the dir (``run.yaml``,
    ``3/val_metrics.json``): only these are read (never a FIFO, a link or a dir)."""


async def host_entries(host, outdir: str, trainer: str | None) -> Listing:
    """The checkpoints in ``outdir`` on ``host`` with what their files show now
    (:func:`core.ml.formats.layouts.entries`; one ``find``, and specdeck's ``latest`` read when it is
    there). An output dir that cannot be listed lists nothing."""
    from core.ml.formats import layouts

    res = await host.run(layouts.find_command(outdir), timeout=LISTING_S)
    rows = layouts.parse_find(res.stdout)
    files = frozenset(r.path for r in rows if r.kind == "f")
    latest = None
    if trainer in (None, "specdeck") and layouts.SPECDECK_LATEST in files:
        latest = (await host.read_from(join(outdir, layouts.SPECDECK_LATEST), 0, 4096)
                  ).decode("utf-8", "replace")
    best = None
    for r in sorted(rows, key=lambda r: r.path):
        if best is None and r.kind == "l" and "/" not in r.path \
                and layouts.is_best_pointer(r.path, trainer):
            best = layouts.pointed_step(r.target, trainer)
    return Listing(layouts.entries(outdir, rows, trainer, latest=latest), best, files)


async def host_content_problem(host, entry) -> str | None:
    """Why the checkpoint ``entry`` on ``host`` cannot be read, from its files' bytes, as
    :func:`core.ml.formats.layouts.content_problem` says it of a local one: a speculators epoch dir's
    ``config.json`` that is no JSON object, a weights file whose safetensors header does not
    match the file's size (cut short, or lying). None: nothing seen before a load."""
    from core.errors import InvalidFile
    from core.ml.formats import layouts
    from core.ml.formats.safetensors_header import header_from, header_length

    if entry.problem or entry.checkpoint.layout != "speculators":
        return entry.problem
    path = entry.checkpoint.path
    files = {posixpath.basename(r.path): r for r in entry.state[1:]}
    if not isinstance(await read_json(host, join(path, layouts.SPECULATORS_CONFIG)), dict):
        return f"{join(path, layouts.SPECULATORS_CONFIG)}: not a JSON object"
    names = [layouts.SPECULATORS_WEIGHTS]
    if names[0] not in files:
        wmap = (await read_json(host, join(path, layouts.SPECULATORS_INDEX)) or {}).get("weight_map")
        if not isinstance(wmap, dict) or not wmap:
            return f"{join(path, layouts.SPECULATORS_INDEX)}: no weight_map of tensor name -> file name"
        names = sorted({str(v) for v in wmap.values()})
    for name in names:
        shown, row = join(path, name), files.get(name)
        if row is None or row.kind != "f":
            return f"{shown}: " + ("missing" if row is None else
                                   f"is {layouts.KINDS[row.kind]}, not a regular file")
        head = await host.read_from(shown, 0, 9)
        more = header_length(head, row.size)
        try:
            header_from(shown, row.size, head, await host.read_from(shown, 9, more) if more else b"")
        except InvalidFile as exc:
            return exc.message
    return None


TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def drafter_command(python: str, src: str, out: str, art=None, *, convert: bool = False,
                    key: str | None = None, prefix: str | None = None,
                    config: str | None = None, trust_pickle: bool = False) -> str | None:
    """The command that turns checkpoint ``src`` into a drafter dir ``out``, or None when
    ``src`` is one already and ``convert`` is not asked for.

    A torch checkpoint is stripped (``core.ml.strip``; SpecForge's gets the drafter config
    its train item recorded, since its checkpoint carries none). A speculators epoch dir is a
    drafter dir that eval loads as it is; ``convert`` (extract_weights) rewrites it in the
    z-lab layout (``core.ml.export --format zlab``, fp32: lossless whatever it was saved in).
    """
    layout = checkpoint_layout(art)
    config = config or layout.get("drafter_config")
    from core.ml.formats.layouts import LAYOUTS

    lay = LAYOUTS.get(layout.get("layout"))
    if (lay is not None and lay.drafter_dir) or not src.endswith(TORCH_SUFFIXES):
        if not convert:
            return None
        return py_module(python, "core.ml.export", src, "--out", out, "--format", "zlab",
                         "--dtype", "fp32")
    return py_module(python, "core.ml.strip", src, out,
                     *(["--key", key] if key else []), *(["--prefix", prefix] if prefix else []),
                     *(["--config", config] if config else []),
                     "--trust-pickle" if trust_pickle else None)


def pinned_steps(plan, item_id: str) -> set[int]:
    """The steps of train item ``item_id`` another item names (``item:<id>@step:N``,
    anywhere in its action's params): its retention never deletes them
    (:mod:`core.ml.formats.retention`; ``@best`` is the trainer's best pointer, which the
    watcher keeps, ``@latest`` the newest, which it keeps too)."""
    import dataclasses

    found: set[int] = set()

    def walk(v) -> None:
        if isinstance(v, str):
            m = REF.match(v)
            if m and m.group(1) == item_id and m.group(3) is not None:
                found.add(int(m.group(3)))
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            for f in dataclasses.fields(v):
                walk(getattr(v, f.name))

    for it in plan.items:
        if it.id != item_id and it.action is not None:
            walk(it.action.params)
    return found


def validate_ref(plan, item, ref: str) -> str | None:
    m = REF.match(ref)
    if ref.startswith("item:") and not m:
        return f"{ref!r}: write {REF_FORMS}"
    if m:
        ids = {it.id for it in plan.items}
        if m.group(1) not in ids:
            return f"{ref!r}: no item {m.group(1)!r} in this plan"
        if m.group(1) not in item.needs:
            return f"{ref!r}: add {m.group(1)!r} to this item's needs"
    return None


def reproduce_record(doc: dict | None) -> dict | None:
    """The record that reproduces a run, as a result.json's (or a train run's provenance.json)
    provenance holds it (core.ml.formats.reproduce); None when it holds none (an older run)."""
    if not isinstance(doc, dict):
        return None
    prov = doc.get("provenance") if isinstance(doc.get("provenance"), dict) else doc
    rec = prov.get("reproduce")
    return rec if isinstance(rec, dict) else None


async def read_json(host, path: str) -> dict | None:
    """The JSON object in ``path`` on ``host``; None when it is missing or no JSON object a
    reader may take (too deep, NaN: :func:`core.text.loads_untrusted`)."""
    from core.text import loads_untrusted

    raw = await host.read_from(path, 0, 1 << 28)
    if not raw:
        return None
    try:
        doc = loads_untrusted(raw, path, "JSON file")
    except ValueError:  # InvalidFile
        return None
    return doc if isinstance(doc, dict) else None


async def log_tail(host, capsule: str, n: int = 20) -> str:
    st = await host.stat(f"{capsule}/log")
    start = max(0, (st.size if st else 0) - 16384)
    text = (await host.read_from(f"{capsule}/log", start, 16384)).decode("utf-8", "replace")
    return "\n".join(text.splitlines()[-n:])


async def ml_failure(ctx, outcome, what: str) -> ActionFailed:
    """An error for a failed ML task: its last stderr lines say why."""
    tail = await log_tail(ctx.host, outcome.capsule, 6)
    how = f"signal {outcome.signal}" if outcome.signal else f"exit {outcome.exit_code}"
    if outcome.state == "lost":
        how = "the process vanished (host rebooted?)"
    if getattr(outcome, "preempted", None):
        how = f"{how}: {outcome.preempted}"
    lines = [ln for ln in tail.splitlines() if not ln.startswith("{")][-4:]
    return ActionFailed(f"{what} on {ctx.host.name} {outcome.state} ({how})"
                        + ("\n" + "\n".join("    " + ln for ln in lines) if lines else ""),
                        hint=f"`specdeck logs {ctx.plan.path or ctx.plan.name} {ctx.item.id}` shows the whole log")


def join(*parts: str) -> str:
    return posixpath.join(*parts)
