"""core.ml.engine_clients against real HTTP servers that speak vLLM's and SGLang's formats
(tests/unit/engine_servers.py): tau per prompt from the engines' counts, the pooled figure, the
result.json shape core.ml.compare reads, and no API key anywhere it would be kept."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from core.ml.tasks import engine_clients as ec
from core.ml.formats.runio import run_main
from tests.conftest import ROOT
from tests.unit.engine_servers import Engine, Script, Served

PROMPTS = {"a": [1, 2, 3], "b": [4, 5], "c": [6, 7, 8, 9]}
SCRIPTS = {  # block size 4: 0..3 draft tokens accepted per round
    (1, 2, 3): Script((3, 3, 1)),                       # 10 committed in 3 rounds
    (4, 5): Script((0, 2)),                              # 4 in 2
    (6, 7, 8, 9): Script((3, 2), cut=2, finish="stop"),  # a stop inside the last round: 5 in 2 (engine: 1 + 5/2)
}
TAU = {"a": 10 / 3, "b": 2.0, "c": 2.5}
ENGINE_TAU = {"a": 1 + 7 / 3, "b": 2.0, "c": 3.5}


def write_prompts(tmp: Path, prompts: dict[str, list[int]] = PROMPTS) -> Path:
    path = tmp / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": k, "input_ids": v}) + "\n" for k, v in prompts.items()))
    return path


@pytest.fixture(params=["vllm", "sglang"])
def served(request):
    s = Served(Engine(request.param, 4, SCRIPTS))
    yield s
    s.close()


def run(served: Served, tmp: Path, *extra: str, prompts: Path | None = None) -> tuple[int, Path]:
    out = tmp / "out" / "result.json"
    argv = ["--engine", served.engine.kind, "--url", served.url, "--prompts", str(prompts or write_prompts(tmp)),
            "--out", str(out), "--max-new-tokens", "32", *extra]
    return run_main(ec.main, argv), out


def test_tau_per_prompt_and_pooled_from_the_engines_counts(served, tmp_path, capsys):
    code, out = run(served, tmp_path)
    assert code == 0, capsys.readouterr().err
    res = json.loads(out.read_text())
    rows = {r["id"]: r for r in res["per_prompt"]}
    assert {k: r["tau"] for k, r in rows.items()} == pytest.approx(TAU)
    assert {k: r["engine"]["tau"] for k, r in rows.items()} == pytest.approx(ENGINE_TAU)
    assert [rows[k]["num_rounds"] for k in "abc"] == [3, 2, 2]
    assert res["tau"] == pytest.approx(sum(TAU.values()) / 3)
    assert res["tau_pooled"] == pytest.approx(19 / 7)
    assert res["engine"]["engine_tau_pooled"] == pytest.approx(1 + 14 / 7)
    assert res["per_position_counts"] == [6, 5, 3]
    assert res["per_position_acceptance"] == pytest.approx([6 / 7, 5 / 7, 3 / 7])
    assert res["histogram"] == {"1": 1, "2": 1, "3": 2, "4": 3}
    assert res["num_rounds"] == 7 and res["committed_tokens"] == 19 and res["block_size"] == 4
    assert all(r["rounds"] is None for r in res["per_prompt"]) and res["engine"]["rounds"].startswith("none")
    assert rows["c"]["stopped"] and not rows["a"]["stopped"]
    assert rows["a"]["tokens"] == [100 + i for i in range(11)]


def test_what_is_sent_and_recorded(served, tmp_path):
    assert run(served, tmp_path)[0] == 0
    res = json.loads((tmp_path / "out" / "result.json").read_text())
    sent = served.engine.received
    if served.engine.kind == "vllm":
        assert [r["prompt"] for r in sent] == list(PROMPTS.values())
        assert all(r["path"] == "/v1/completions" and r["temperature"] == 0 and r["max_tokens"] == 32 for r in sent)
    else:
        assert [r["input_ids"] for r in sent] == list(PROMPTS.values())
        assert all(r["sampling_params"]["max_new_tokens"] == 32 for r in sent)
    eng = res["engine"]
    assert eng["name"] == served.engine.kind and eng["url"] == served.url and eng["model"] == "tiny"
    assert eng["version"] == ("0.11.0" if served.engine.kind == "vllm" else "0.5.4")
    assert eng["version_endpoint"] == ("/version" if served.engine.kind == "vllm" else "/get_server_info")
    assert eng["prompt_encoding"] == "token_ids"
    assert res["provenance"]["engine"] == eng
    assert res["prompts"]["ids"] == list(PROMPTS) and res["max_new_tokens"] == 32


def test_vllm_counters_read_until_they_account_for_the_request(tmp_path):
    """vLLM records a request's counters after it answers: here only from the fourth read on."""
    s = Served(Engine("vllm", 4, SCRIPTS, lag_reads=3))
    try:
        code, out = run(s, tmp_path)
    finally:
        s.close()
    assert code == 0
    rows = {r["id"]: r for r in json.loads(out.read_text())["per_prompt"]}
    assert {k: r["tau"] for k, r in rows.items()} == pytest.approx(TAU)


def test_vllm_counters_labelled_with_another_model_name_still_count(tmp_path):
    """vLLM labels its counters with one served name; requests may carry another (--model)."""
    s = Served(Engine("vllm", 4, SCRIPTS))
    try:
        code, out = run(s, tmp_path, "--model", "alias")
    finally:
        s.close()
    rows = {r["id"]: r for r in json.loads(out.read_text())["per_prompt"]}
    assert code == 0 and {k: r["tau"] for k, r in rows.items()} == pytest.approx(TAU)
    assert {r["model"] for r in s.engine.received} == {"alias"}


def test_sglang_meta_info_of_older_releases(tmp_path):
    s = Served(Engine("sglang", 4, SCRIPTS, old_names=True))
    try:
        code, out = run(s, tmp_path)
    finally:
        s.close()
    res = json.loads(out.read_text())
    assert code == 0 and res["engine"]["engine_tau_pooled"] == pytest.approx(3.0)
    assert res["histogram"] == {"1": 1, "2": 1, "3": 2, "4": 3} and res["per_position_counts"] == [6, 5, 3]


def test_a_one_token_answer_has_no_round_and_no_tau(served, tmp_path):
    served.engine.scripts[(9,)] = Script(())
    code, out = run(served, tmp_path, prompts=write_prompts(tmp_path, {**PROMPTS, "one": [9]}))
    assert code == 0
    res = json.loads(out.read_text())
    one = res["per_prompt"][-1]
    assert one["id"] == "one" and one["tau"] is None and one["num_rounds"] == 0
    assert res["tau"] == pytest.approx(sum(TAU.values()) / 3) and res["num_prompts"] == 4


def test_later_turns_of_a_conversation_are_refused(served, tmp_path, capsys):
    prompts = tmp_path / "turns.jsonl"
    prompts.write_text(json.dumps({"id": "c", "turns": ["hi", "more"]}) + "\n")
    code, out = run(served, tmp_path, prompts=prompts)
    assert code == 2 and "engine_clients: prompts ['c#2'] are later turns" in capsys.readouterr().err
    assert not out.exists() and served.engine.received == []


def test_the_result_compares_with_an_eval_result(served, tmp_path):
    """core.ml.compare reads the client's result.json as it reads core.ml.eval's."""
    from core.ml.measure.compare import compare_results

    assert run(served, tmp_path)[0] == 0
    res = json.loads((tmp_path / "out" / "result.json").read_text())
    cmp = compare_results(res, res)
    assert cmp["ok"] and [r["id"] for r in cmp["per_prompt"]] == ["a", "b", "c"]
    assert [r["ours"] for r in cmp["per_prompt"]] == pytest.approx([TAU[k] for k in "abc"])
    # specdeck's side has the rounds the engine only counted: the figures meet
    rounds = {"a": [4, 4, 2], "b": [1, 3], "c": [4, 1]}
    own = {**res, "per_prompt": [{"id": k, "tau": sum(v) / len(v), "rounds": v} for k, v in rounds.items()]}
    cmp = compare_results(own, res)
    assert cmp["ok"] and cmp["overall"]["delta"] == pytest.approx(0) and cmp["overall"]["delta_pooled"] == pytest.approx(0)
    assert cmp["overall"]["baseline"]["tau_pooled"] == pytest.approx(19 / 7)
    assert cmp["overall"]["baseline"]["tau"] == pytest.approx(sum(TAU.values()) / 3)


def test_the_api_key_comes_from_the_environment_and_is_kept_nowhere(tmp_path, monkeypatch, capsys):
    key = "sk-test-4f8b2c1d9e"
    s = Served(Engine("vllm", 4, SCRIPTS, api_key=key))
    try:
        monkeypatch.setenv("MY_ENGINE_KEY", key)
        code, out = run(s, tmp_path, "--api-key-env", "MY_ENGINE_KEY")
        captured = capsys.readouterr()
        assert code == 0, captured.err
        assert any(h.get("Authorization") == f"Bearer {key}" for h in s.engine.headers)
        res = json.loads(out.read_text())
        assert key not in json.dumps(res["provenance"]["argv"])
        for text in (out.read_text(), (out.parent / "provenance.json").read_text(), captured.out, captured.err):
            assert key not in text
        monkeypatch.delenv("MY_ENGINE_KEY")
        (tmp_path / "nokey").mkdir()
        code, _ = run(s, tmp_path / "nokey", "--api-key-env", "MY_ENGINE_KEY")
        err = capsys.readouterr().err
    finally:
        s.close()
    assert code == 1 and "HTTP 401" in err and "--api-key-env" in err and s.url in err


@pytest.mark.parametrize("flag, value, says", [
    ("--url", "http://admin:hunter2@127.0.0.1:8000", "--url: the URL carries credentials"),
    ("--url", "http://127.0.0.1:8000/?token=hunter2", "no query or fragment"),
    ("--url", "ftp://127.0.0.1", "--url"),
    ("--api-key-env", "sk-hunter2", "--api-key-env takes the NAME"),
    ("--api-key", "hunter2", "--api-key: a key on the command line stays in shell history"),
    ("--max-new-tokens", "0", "--max-new-tokens 0"),
    ("--block-size", "1", "--block-size 1"),
    ("--timeout", "nan", "--timeout nan"),
    ("--prompts", "/nonexistent/p.jsonl", "--prompts /nonexistent/p.jsonl: file not found"),
])
def test_bad_input_exits_2_naming_the_flag_with_nothing_written(tmp_path, capsys, flag, value, says):
    out = tmp_path / "out" / "result.json"
    argv = {"--engine": "vllm", "--url": "http://127.0.0.1:9", "--prompts": str(write_prompts(tmp_path)),
            "--out": str(out), flag: value}
    assert run_main(ec.main, [x for kv in argv.items() for x in kv]) == 2
    err = capsys.readouterr().err
    assert says in err and "hunter2" not in err
    assert not out.parent.exists()


def test_a_block_size_the_server_contradicts_is_refused(served, tmp_path, capsys):
    code, out = run(served, tmp_path, "--block-size", "8")
    assert code == 2 and "--block-size 8: the server drafts with block size 4" in capsys.readouterr().err
    assert not out.exists()


def test_text_prompts_need_the_target_tokenizer(served, tmp_path, capsys):
    prompts = tmp_path / "text.jsonl"
    prompts.write_text(json.dumps({"id": "t", "prompt": "def f():"}) + "\n")
    code, out = run(served, tmp_path, prompts=prompts)
    assert code == 2 and "--target: prompts ['t'] are text" in capsys.readouterr().err and not out.exists()


def test_prometheus_text_parsing_keeps_labels_and_skips_comments():
    text = ('# HELP x_total c\n# TYPE x_total counter\nx_total{a="1",b="q\\"z"} 3.0\nx_created 1.7e+09\n'
            'vllm:y{position="2"} 4\n')
    samples = ec.parse_prometheus(text)
    assert samples["x_total"] == [({"a": "1", "b": 'q\\"z'}, 3.0)]
    assert samples["vllm:y"] == [({"position": "2"}, 4.0)] and "x_created" in samples


def test_the_device_check_script_parses():
    script = ROOT / "bench" / "device" / "engine_parity.sh"
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    head = script.read_text().split("\n\n")[0]
    assert "not been run" in head
