"""``core.ml.eval --prompts zlab:NAME[:PATH]`` end to end on tiny models: the reference's
multi-turn mt-bench runs turn by turn, each later turn on the target's own earlier answers,
and result.json says which set, subset, seed and wrapping were used."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from core.ml.tasks import eval as eval_mod
from core.ml.measure.prompts import Prompt, encode  # noqa: E402
from core.ml.formats.runio import UsageError, run_main  # noqa: E402

N = 6
QUESTIONS = [["Write a poem about the sea.", "Now make it shorter."],
             ["What is 12 times 7?", "And 13 times 7?"],
             ["Name a prime.", "Name a bigger one."]]


@pytest.fixture(scope="module")
def pair(tiny, tmp_path_factory):
    return tiny.make_tiny_pair(tmp_path_factory.mktemp("pair"), "qwen3", seed=0, block_size=4)


def test_mt_bench_turn_two_follows_the_targets_own_answer(pair, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from core.ml.decoding.generate import greedy_generate

    target_dir, drafter_dir = pair
    data = tmp_path / "mt_bench" / "data" / "train-00000-of-00001.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text("".join(json.dumps({"prompt_id": i, "prompt": q}) + "\n" for i, q in enumerate(QUESTIONS)))
    out = tmp_path / "r.json"
    spec = f"zlab:mt-bench:{data.parent.parent}"
    argv = ["--target", str(target_dir), "--drafter", str(drafter_dir), "--prompts", spec, "--out", str(out),
            "--max-new-tokens", str(N), "--ignore-eos", "--limit", "2"]
    assert run_main(eval_mod.main, argv) == 0
    assert capsys.readouterr().err.count("3 rows, the reference's HuggingFaceH4/mt_bench_prompts train split has 80") == 1
    res = json.loads(out.read_text())
    rows = res["per_prompt"]
    assert [r["id"].split("#")[1] for r in rows] == ["1", "2", "1", "2"]
    s = res["prompts"]["set"]
    assert (s["name"], s["subset"], s["seed"], s["multi_turn"]) == ("zlab:mt-bench", 2, 42, True)
    assert res["prompts"]["count"] == 4 and res["prompts"]["file"] == spec

    tok = AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(target_dir, local_files_only=True)
    for first, second in (rows[0:2], rows[2:4]):
        q = QUESTIONS[int(first["id"].split("/")[1].split("#")[0])]
        answer = tok.decode(first["tokens"], skip_special_tokens=True)
        text = tok.apply_chat_template([{"role": "user", "content": q[0]}, {"role": "assistant", "content": answer},
                                        {"role": "user", "content": q[1]}], add_generation_prompt=True,
                                       enable_thinking=False, tokenize=False)
        want = tok.encode(text, add_special_tokens=False)
        assert second["prompt_len"] == len(want) > first["prompt_len"] + len(first["tokens"]) - 1
        assert second["tokens"] == greedy_generate(model, want, N).tokens  # generated from exactly those ids


def test_a_later_turn_without_the_earlier_answer_is_refused(pair):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(pair[0], local_files_only=True)
    t1 = Prompt("c#1", text="Hi.")
    t2 = Prompt("c#2", text="Again.", prev=t1)
    with pytest.raises(UsageError, match="only the online eval generates"):
        encode(t2, tok, 10**6)
    with pytest.raises(UsageError, match="needs the target's chat template"):
        encode(t2, tok, 10**6, chat_template=False)
    t1.answer = tok.encode("Hello there.", add_special_tokens=False)
    ids = encode(t2, tok, 10**6)
    assert tok.decode(ids).count("<|im_start|>") == 4 and "Hello there." in tok.decode(ids)


def test_a_set_that_is_not_here_exits_2_before_loading_and_says_how_to_get_it(pair, tmp_path, capsys):
    target_dir, drafter_dir = pair
    out = tmp_path / "r.json"
    argv = ["--target", str(target_dir), "--drafter", str(drafter_dir), "--prompts", "zlab:gsm8k", "--out", str(out)]
    assert run_main(eval_mod.main, argv) == 2
    err = capsys.readouterr().err
    assert "huggingface-cli download openai/gsm8k --repo-type dataset" in err and "loading" not in err
    assert not out.exists()


def test_extract_keeps_a_built_set_beside_its_cache_and_refuses_conversations(pair, tmp_path, capsys):
    from core.ml.tasks import extract as extract_mod
    from core.ml.measure.prompts import read_prompts

    target_dir, drafter_dir = pair
    data = tmp_path / "humaneval" / "test.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps({"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    return x\n"}) + "\n"
                            for i in range(4)))
    out = tmp_path / "feats"
    common = ["--target", str(target_dir), "--layers", "1,3", "--out", str(out), "--max-new-tokens", "4"]
    assert run_main(extract_mod.main, [*common, "--prompts", f"zlab:humaneval:{data}", "--limit", "2"]) == 0
    man = json.loads((out / "manifest.json").read_text())
    kept = read_prompts(man["prompts"]["file"])  # the offline eval and the watcher read this file
    assert man["prompts"]["file"] == str((out / "zlab-humaneval.jsonl").resolve())
    assert [p.id for p in kept[:2]] == sorted(man["entries"], key=[p.id for p in kept].index)
    mt = tmp_path / "mt.jsonl"
    mt.write_text(json.dumps({"prompt": QUESTIONS[0]}) + "\n")
    capsys.readouterr()
    assert run_main(extract_mod.main, [*common, "--prompts", f"zlab:mt-bench:{mt}"]) == 2
    err = capsys.readouterr().err
    assert "later turns of conversations" in err and "loading" not in err
    argv = ["--target", str(target_dir), "--drafter", str(drafter_dir), "--prompts", f"zlab:mt-bench:{mt}",
            "--out", str(tmp_path / "r.json"), "--mode", "offline", "--cache", str(out)]
    assert run_main(eval_mod.main, argv) == 2 and "only the online eval generates" in capsys.readouterr().err
