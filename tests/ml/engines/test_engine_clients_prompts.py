"""core.ml.engine_clients sends an engine the prompts core.ml.eval runs: the same token ids (text
prompts through the target's tokenizer and chat template), or with ``--send text`` the same
templated text; and it records the target, template and stop ids as eval does, so compare
matches the two results. The server is tests/unit/engine_servers.py's vLLM stand-in."""

from __future__ import annotations

import json

import pytest

from core.ml.tasks import engine_clients as ec
from core.ml.formats.runio import run_main
from tests.unit.engine_servers import Engine, Script, Served


@pytest.fixture(scope="module")
def target_and_prompts(tmp_path_factory):
    from core.ml.demo import tiny

    root = tmp_path_factory.mktemp("ec")
    return tiny.save_tiny_target(root / "target"), tiny.write_tiny_prompts(root / "prompts.jsonl")


@pytest.mark.parametrize("send", ["ids", "text"])
def test_prompts_are_sent_as_eval_encodes_them(target_and_prompts, tmp_path, send):
    from transformers import AutoModelForCausalLM

    from core.ml.tasks.eval import template_settings
    from core.ml.tasks.extract import target_fingerprint
    from core.ml.measure.prompts import encode, read_prompts, render
    from core.ml.models.target import load_tokenizer, stop_token_ids

    target, prompts_file = target_and_prompts
    tok = load_tokenizer(target)
    prompts = read_prompts(prompts_file)
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    ids = [encode(p, tok, vocab) for p in prompts]
    wire = [i if send == "ids" or p.input_ids else render(p, tok)[0] for p, i in zip(prompts, ids)]
    assert any(isinstance(w, str) for w in wire) == (send == "text")
    scripts = {(tuple(w) if isinstance(w, list) else w): Script((1, 2)) for w in wire}
    s = Served(Engine("vllm", 4, scripts))
    out = tmp_path / "result.json"
    try:
        code = run_main(ec.main, ["--engine", "vllm", "--url", s.url, "--prompts", str(prompts_file),
                                  "--out", str(out), "--target", str(target), "--send", send])
    finally:
        s.close()
    assert code == 0
    assert [r["prompt"] for r in s.engine.received] == wire
    res = json.loads(out.read_text())
    args = ec.build_parser().parse_args(["--engine", "vllm", "--url", "u", "--prompts", "p", "--out", "o"])
    assert res["template"] == template_settings(args, tok)
    assert res["target"]["fingerprint"] == target_fingerprint(target)
    stops = stop_token_ids(AutoModelForCausalLM.from_pretrained(str(target)), tok)
    assert res["stop_token_ids"] == stops and all(r["stop_token_ids"] == stops for r in s.engine.received)
    assert res["engine"]["prompt_encoding"] == ("token_ids" if send == "ids" else "text")
    assert [r["prompt_len"] for r in res["per_prompt"]] == [len(w) if isinstance(w, list) else None for w in wire]
