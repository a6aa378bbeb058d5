"""Entry points as a user runs them: extract, eval (online/offline), strip, compare, tiny.

Mostly in-process (``run_main(module.main, argv)``, same code path as ``python -m``) to keep
the suite fast; a few real ``python -m`` subprocesses check the module entry and exit codes.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from core.ml.tasks import eval as eval_mod
from core.ml.tasks import extract as extract_mod
from core.ml.tasks import strip as strip_mod
from core.ml.models.drafter import load_drafter  # noqa: E402
from core.ml.formats.runio import run_main  # noqa: E402

N, B = 24, 8
REPO = pathlib.Path(__file__).resolve().parents[3]


def lines(capsys):
    out = capsys.readouterr()
    parsed = [json.loads(x) for x in out.out.splitlines() if x.strip()]
    assert all(isinstance(x, dict) and "event" in x for x in parsed)  # stdout = JSON lines only
    return parsed, out.err


@pytest.fixture(scope="module")
def extracted(tiny_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("cache") / "feats"
    argv = ["--target", str(tiny_dirs["target"]), "--prompts", str(tiny_dirs["prompts"]), "--layers",
            str(tiny_dirs["drafter"]), "--out", str(out), "--max-new-tokens", str(N + B - 1), "--ignore-eos"]
    assert run_main(extract_mod.main, argv) == 0
    return out, argv


def test_extract_writes_manifest_and_resumes(extracted, capsys, tiny_dirs):
    out, argv = extracted
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["entries"]) == ["fit100", "fit101", "t0", "t1"]
    assert manifest["layer_ids"] == [0, 2] and manifest["format"] == "specdeck-features-v1"
    assert (out / "provenance.json").is_file() and manifest["provenance"]["task"] == "extract"
    from safetensors.torch import load_file

    e = manifest["entries"]["fit100"]
    t = load_file(str(out / e["file"]))
    assert t["features"].shape == (e["num_tokens"], 128) and e["num_generated"] == N + B - 1
    mtimes = {p: p.stat().st_mtime_ns for p in (out / "seq").iterdir()}
    capsys.readouterr()
    assert run_main(extract_mod.main, argv) == 0  # resume: everything is already there
    events, err = lines(capsys)
    assert "resuming: 4 prompts already extracted" in err
    assert events[-1]["event"] == "result" and not [e for e in events if e["event"] == "progress"]
    assert {p: p.stat().st_mtime_ns for p in (out / "seq").iterdir()} == mtimes
    other = [a if a != str(N + B - 1) else "5" for a in argv]
    assert run_main(extract_mod.main, other) == 2  # same --out, other settings: refused


@pytest.mark.parametrize("bad", [
    ["--target", "/nonexistent"], ["--layers", "1,x"], ["--layers", "0,9"], ["--prompts", "BADJSON"],
])
def test_extract_bad_input_exits_2(tiny_dirs, tmp_path, capsys, bad):
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "prompt": "x"}\nnot json\n')
    argv = {"--target": str(tiny_dirs["target"]), "--prompts": str(tiny_dirs["prompts"]), "--layers": "0,2",
            "--out": str(tmp_path / "o"), "--max-new-tokens": "4"}
    key, value = bad
    argv[key] = str(tmp_path / "bad.jsonl") if value == "BADJSON" else value
    assert run_main(extract_mod.main, [x for kv in argv.items() for x in kv]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("error: ") and "Traceback" not in err
    if value == "BADJSON":
        assert "bad.jsonl:2" in err


def test_eval_online_and_offline_agree(extracted, tiny_dirs, tmp_path, capsys):
    cache, _ = extracted
    common = ["--target", str(tiny_dirs["target"]), "--drafter", str(tiny_dirs["drafter"]), "--prompts",
              str(tiny_dirs["prompts"]), "--max-new-tokens", str(N), "--ignore-eos", "--tree-budget", "8"]
    assert run_main(eval_mod.main, common + ["--out", str(tmp_path / "on/result.json"), "--speedup"]) == 0
    events, _ = lines(capsys)
    assert [e["event"] for e in events].count("progress") == 4
    assert events[-1] == {"event": "result", "task": "eval", "path": str((tmp_path / "on/result.json").resolve())}
    assert {"method": "chain", "mode": "online"}.items() <= next(e for e in events if e["event"] == "metric").items()
    on = json.loads((tmp_path / "on/result.json").read_text())
    assert (tmp_path / "on/provenance.json").is_file()
    for key in ("definition", "tau", "tau_pooled", "per_position_acceptance", "histogram", "per_prompt", "ddtree",
                "speedup", "provenance"):
        assert key in on
    assert set(on["per_prompt"][0]) >= {"id", "tau", "rounds", "tokens"}
    assert on["provenance"]["argv"] and on["provenance"]["packages"]["torch"] and "seed" in on["provenance"]
    assert on["tau"] > 1.0 and on["ddtree"]["budget"] == 8
    assert on["tau_pooled"] == pytest.approx(1 + sum(on["per_position_acceptance"]))
    # chain and DDTree commit the same (greedy) tokens
    assert [p["tokens"] for p in on["per_prompt"]] == [p["tokens"] for p in on["ddtree"]["per_prompt"]]

    assert run_main(eval_mod.main, common + ["--out", str(tmp_path / "off/result.json"), "--mode", "offline",
                                             "--cache", str(cache)]) == 0
    off = json.loads((tmp_path / "off/result.json").read_text())
    assert off["mode"] == "offline" and "all_anchor" in off
    assert off["timing"]["target_forwards"] == off["timing"]["target_tokens"] == 0  # features come from the cache
    assert off["timing"]["drafter_forwards"] >= len(off["per_prompt"])
    assert on["timing"]["target_forwards"] == sum(len(p["rounds"]) + 1 for p in on["per_prompt"])
    for a, b in zip(on["per_prompt"], off["per_prompt"]):
        assert (a["id"], a["rounds"], a["tokens"]) == (b["id"], b["rounds"], b["tokens"])
    for a, b in zip(on["ddtree"]["per_prompt"], off["ddtree"]["per_prompt"]):
        assert a["rounds"] == b["rounds"]
    capsys.readouterr()
    from core.ml.measure.compare import main as compare_main

    assert run_main(compare_main, [str(tmp_path / "on/result.json"), str(tmp_path / "off/result.json")]) == 2
    assert "mode" in capsys.readouterr().err
    assert run_main(compare_main, [str(tmp_path / "on/result.json"), str(tmp_path / "off/result.json"),
                                   "--allow-mismatch"]) == 0


def test_offline_eval_reads_a_wider_cache_and_refuses_a_missing_tap(tiny_dirs, tmp_path, capsys):
    """A trainer's cache holds the drafter's taps plus the final layer, in another order:
    offline eval takes the drafter's columns (same rounds as a taps-only cache) and names the
    layers a narrower cache lacks."""
    from core.ml.models.drafter import load_drafter

    taps = list(load_drafter(tiny_dirs["drafter"]).target_layer_ids)
    n_layers = json.loads((tiny_dirs["target"] / "config.json").read_text())["num_hidden_layers"]
    wide = sorted({*taps, n_layers - 1}, reverse=True)  # reversed: columns must be picked
    assert wide != taps
    results = {}
    for name, layers in (("taps", taps), ("wide", wide)):
        cache = tmp_path / name
        assert run_main(extract_mod.main, [
            "--target", str(tiny_dirs["target"]), "--prompts", str(tiny_dirs["prompts"]), "--layers",
            ",".join(map(str, layers)), "--out", str(cache), "--max-new-tokens", str(N + B - 1),
            "--ignore-eos"]) == 0
        out = tmp_path / f"{name}.json"
        assert run_main(eval_mod.main, [
            "--target", str(tiny_dirs["target"]), "--drafter", str(tiny_dirs["drafter"]), "--prompts",
            str(tiny_dirs["prompts"]), "--max-new-tokens", str(N), "--ignore-eos", "--mode", "offline",
            "--cache", str(cache), "--out", str(out)]) == 0
        results[name] = json.loads(out.read_text())
    assert [p["rounds"] for p in results["wide"]["per_prompt"]] == \
        [p["rounds"] for p in results["taps"]["per_prompt"]]
    narrow = tmp_path / "narrow"
    assert run_main(extract_mod.main, [
        "--target", str(tiny_dirs["target"]), "--prompts", str(tiny_dirs["prompts"]), "--layers",
        str(taps[0]), "--out", str(narrow), "--max-new-tokens", str(N + B - 1), "--ignore-eos"]) == 0
    capsys.readouterr()
    assert run_main(eval_mod.main, [
        "--target", str(tiny_dirs["target"]), "--drafter", str(tiny_dirs["drafter"]), "--prompts",
        str(tiny_dirs["prompts"]), "--mode", "offline", "--cache", str(narrow),
        "--out", str(tmp_path / "n.json")]) == 2
    err = capsys.readouterr().err
    assert f"missing {taps[1:]}" in err and "--layers " + ",".join(map(str, taps)) in err


@pytest.mark.parametrize("case", ["no-cache", "zero-block", "no-drafter", "other-cache", "bad-budget"])
def test_eval_bad_input_exits_2(tiny_dirs, extracted, tmp_path, capsys, case):
    argv = ["--target", str(tiny_dirs["target"]), "--drafter", str(tiny_dirs["drafter"]),
            "--prompts", str(tiny_dirs["prompts"]), "--out", str(tmp_path / "r.json"), "--max-new-tokens", "4"]
    if case == "no-cache":
        argv += ["--mode", "offline"]
    elif case == "zero-block":
        argv += ["--block-size", "0"]
    elif case == "no-drafter":
        argv[3] = str(tmp_path)
    elif case == "other-cache":
        (tmp_path / "c").mkdir()
        m = json.loads((extracted[0] / "manifest.json").read_text())
        m["target"]["fingerprint"] = "0" * 16
        (tmp_path / "c/manifest.json").write_text(json.dumps(m))
        argv += ["--mode", "offline", "--cache", str(tmp_path / "c")]
    else:
        argv += ["--tree-budget", "-1"]
    assert run_main(eval_mod.main, argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("error: ") and not (tmp_path / "r.json").exists()


def test_a_block_larger_than_the_trained_one_runs_with_a_notice(tiny_dirs, tmp_path, capsys):
    """As the reference allows (docs/drafter.md §4): the log and result.json say so."""
    out = tmp_path / "r.json"
    argv = ["--target", str(tiny_dirs["target"]), "--drafter", str(tiny_dirs["drafter"]),
            "--prompts", str(tiny_dirs["prompts"]), "--out", str(out), "--max-new-tokens", "20", "--block-size", "12"]
    assert run_main(eval_mod.main, argv) == 0
    res = json.loads(out.read_text())
    assert res["block_size"] == 12 and "trained block size 8" in res["block_size_note"]
    assert "notice: block size 12 is larger" in capsys.readouterr().err
    assert all(1 <= r <= 12 for p in res["per_prompt"] for r in p["rounds"])
    assert all(sum(p["rounds"]) == len(p["tokens"]) - 1 for p in res["per_prompt"])


# ----------------------------------------------------------------------------- strip


def training_checkpoint(path, drafter, extra=None, prefix="module."):
    """A trainer-style checkpoint: weights + 2x-size optimizer state + scheduler + step + config."""
    state = {prefix + k: v.clone() for k, v in drafter.state_dict().items()}
    state[prefix + "embed_tokens.weight"] = torch.zeros(320, 64)  # frozen target tensors get dropped
    optim = {"state": {i: {"exp_avg": torch.randn_like(v), "exp_avg_sq": torch.rand_like(v), "step": torch.tensor(3.0)}
                       for i, v in enumerate(drafter.state_dict().values())}, "param_groups": [{"lr": 1e-4, "params": [0]}]}
    ckpt = {"model": state, "optimizer": optim, "scheduler": {"last_epoch": 3}, "step": 3,
            "config": drafter.config.to_dict(), **(extra or {})}
    torch.save(ckpt, path)
    return path


def test_strip_checkpoint_to_drafter(tmp_path, capsys, fitted_drafter):
    ckpt = training_checkpoint(tmp_path / "ckpt.pt", fitted_drafter)
    assert run_main(strip_mod.main, [str(ckpt), str(tmp_path / "out")]) == 0
    events, err = lines(capsys)
    info = next(e for e in events if e["event"] == "info")
    assert info["checkpoint_bytes"] > 2 * info["weights_bytes"] and info["out_bytes"] < info["checkpoint_bytes"]
    assert "dropped 1 non-drafter tensors" in err and events[-1]["event"] == "result"
    again = load_drafter(tmp_path / "out")
    for k, v in fitted_drafter.state_dict().items():
        assert torch.equal(v, again.state_dict()[k])
    assert (tmp_path / "out/provenance.json").is_file()


def test_strip_refuses_pickled_objects_unless_trusted(tmp_path, capsys, fitted_drafter):
    ckpt = training_checkpoint(tmp_path / "ckpt.pt", fitted_drafter, extra={"run_dir": pathlib.Path("/tmp/run")})
    assert run_main(strip_mod.main, [str(ckpt), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--trust-pickle" in err and "Traceback" not in err and not (tmp_path / "out/model.safetensors").exists()
    assert run_main(strip_mod.main, [str(ckpt), str(tmp_path / "out"), "--trust-pickle"]) == 0


@pytest.mark.parametrize("case", ["bad-key", "bad-prefix", "no-config", "missing"])
def test_strip_bad_input_exits_2(tmp_path, capsys, fitted_drafter, case):
    ckpt = training_checkpoint(tmp_path / "ckpt.pt", fitted_drafter)
    argv = [str(ckpt), str(tmp_path / "out")]
    if case == "bad-key":
        argv += ["--key", "ema"]
    elif case == "bad-prefix":
        argv += ["--prefix", "draft."]
    elif case == "no-config":
        c = torch.load(ckpt, weights_only=True)
        del c["config"]
        torch.save(c, ckpt)
    else:
        argv[0] = str(tmp_path / "nope.pt")
    assert run_main(strip_mod.main, argv) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("error: ")


# ----------------------------------------------------------------------------- python -m


def _run(*args, cwd=REPO):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_python_m_entry_points(tiny_dirs, tmp_path, fitted_drafter):
    ckpt = training_checkpoint(tmp_path / "ckpt.pt", fitted_drafter)
    r = _run("core.ml.strip", str(ckpt), str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["event"] == "result"
    r = _run("core.ml.extract", "--target", str(tmp_path / "missing"), "--prompts", str(tiny_dirs["prompts"]),
             "--layers", "0", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "no config.json" in r.stderr and "Traceback" not in r.stderr
    r = _run("core.ml.eval", "--help")
    assert r.returncode == 0 and "--tree-budget" in r.stdout


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5", "qwen3_5_vlm"])
def test_tiny_dirs_load_like_real_ones_and_evaluate(tiny, arch, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from core.ml.decoding.generate import greedy_generate

    target_dir, drafter_dir = tiny.make_tiny_pair(tmp_path, arch, seed=0, block_size=4)
    model = AutoModelForCausalLM.from_pretrained(target_dir, local_files_only=True)
    assert model.config.model_type.startswith(arch.removesuffix("_vlm"))
    tok = AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
    assert tok.convert_tokens_to_ids("<|MASK|>") == 3 and tok.eos_token_id == 2 and tok.chat_template
    assert load_drafter(drafter_dir).block_size == 4
    prompts = tiny.write_tiny_prompts(tmp_path / "prompts.jsonl", n_text=1)
    out = tmp_path / "r.json"
    argv = ["--target", str(target_dir), "--drafter", str(drafter_dir), "--prompts", str(prompts), "--out", str(out),
            "--max-new-tokens", "10", "--ignore-eos", "--tree-budget", "4"]
    assert run_main(eval_mod.main, argv) == 0
    res = json.loads(out.read_text())
    ids_prompt = next(p for p in res["per_prompt"] if p["id"] == "ids0")
    want = greedy_generate(model, tiny.tiny_prompt_rows()[-1]["input_ids"], 10).tokens
    assert ids_prompt["tokens"] == want and res["ddtree"]["per_prompt"][-1]["tokens"] == want
    assert res["target"]["model_type"].startswith(arch.removesuffix("_vlm"))
    for part in (res, res["ddtree"]):  # the noise-free cost: one target forward per round, plus prefill
        timing = part["timing"]
        for row, counts in zip(part["per_prompt"], timing["counts_per_prompt"]):
            assert counts["id"] == row["id"] and counts["target_forwards"] == len(row["rounds"]) + 1
            assert counts["drafter_forwards"] == len(row["rounds"])
        assert timing["target_forwards"] == sum(c["target_forwards"] for c in timing["counts_per_prompt"])
        assert timing["target_tokens"] > timing["target_forwards"]
    widths = []  # chain: B tokens per round, the last blocks shrunk to what is left (as the reference)
    for row in res["per_prompt"]:
        starts = [row["prompt_len"] + sum(row["rounds"][:i]) for i in range(len(row["rounds"]))]
        widths += [min(4, row["prompt_len"] + 10 - s) for s in starts]
    assert res["timing"]["verify_tokens_per_round"] == pytest.approx(sum(widths) / len(widths))
    assert max(widths) == 4
    assert res["ddtree"]["timing"]["verify_tokens_per_round"] == 5  # budget + 1 nodes, each fed once
    if arch == "qwen3_5_vlm":  # the campaign layout: composite config, text weights under language_model
        assert json.loads((target_dir / "config.json").read_text())["model_type"] == "qwen3_5"
        assert type(model).__name__ == "Qwen3_5ForCausalLM"


def test_target_without_tokenizer_generates_to_max_new_tokens_and_eval_records_the_attention_rule(
        tiny, tmp_path, capsys):
    """No tokenizer files: no invented EOS (transformers 5 would make one with id 0), so greedy
    decoding runs to --max-new-tokens although token 0 is what the target emits first. The
    sliding drafter's resolved per-layer rule is in result.json (and its provenance) and the log."""
    from core.ml.models.drafter import save_drafter
    from core.ml.decoding.generate import greedy_generate
    from core.ml.models.target import load_target, load_tokenizer, stop_token_ids

    target = tiny.build_tiny_target("qwen3", seed=0, eos_token_id=None, pad_token_id=None)
    prompt = tiny.fit_prompt(torch.Generator().manual_seed(5))
    with torch.no_grad():  # the target's first greedy token becomes 0: an invented EOS 0 would stop at once
        first = greedy_generate(target, prompt, 1).tokens[0]
        head = target.get_output_embeddings().weight
        head[0] = 2 * head[first]
    assert greedy_generate(target, prompt, 1).tokens == [0]
    target.save_pretrained(tmp_path / "target")
    assert not list((tmp_path / "target").glob("tokenizer*")) and load_tokenizer(tmp_path / "target") is None
    assert stop_token_ids(load_target(tmp_path / "target"), None) == []
    cfg = tiny.tiny_drafter_config(target.config, block_size=4, num_layers=3, sliding_window=5)
    save_drafter(tiny.build_tiny_drafter(cfg, seed=2), tmp_path / "drafter")
    (tmp_path / "p.jsonl").write_text(json.dumps({"id": "a", "input_ids": prompt}) + "\n")
    capsys.readouterr()
    assert run_main(eval_mod.main, ["--target", str(tmp_path / "target"), "--drafter", str(tmp_path / "drafter"),
                                    "--prompts", str(tmp_path / "p.jsonl"), "--max-new-tokens", "12",
                                    "--out", str(tmp_path / "r/result.json")]) == 0
    _, err = lines(capsys)
    result = json.loads((tmp_path / "r/result.json").read_text())
    row = result["per_prompt"][0]
    assert len(row["tokens"]) == 12 and row["tokens"][0] == 0 and not row["stopped"]
    att = result["drafter"]["attention"]
    assert att == result["provenance"]["drafter_attention"] and att["source"] == "layer_types"
    assert [(x["type"], x["causal"], x["window"]) for x in att["layers"]] == [
        ("sliding_attention", True, 5), ("sliding_attention", True, 5), ("full_attention", False, None)]
    assert ("drafter attention: layers 0-1 sliding_attention: causal, window 5 from each query; "
            "layer 2 full_attention: non-causal, full (causality from layer_types)") in err
