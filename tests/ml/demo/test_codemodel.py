"""``python -m core.ml.codemodel``: a tiny Qwen3 trained for 40 steps on stdlib sources, then reloaded.

One module-scoped build (40 AdamW steps on 30 files, vocab 1024: a step count, not a time
budget, so a loaded machine trains as far as a quiet one; 40 steps take the losses down by
about 1.2 nats) is shared by the tests; the
second invocation runs as a real ``python -m`` subprocess and must reuse the directory.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import pathlib
import subprocess
import sys
import sysconfig

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from core.ml.demo import codemodel
from core.ml.formats.runio import run_main  # noqa: E402

slow = pytest.mark.slow  # the tests that share the build (~15-30 s); ``ml`` comes from conftest

REPO = pathlib.Path(__file__).resolve().parents[3]
ARGS = ["--seconds", "3600", "--max-steps", "40", "--max-files", "30", "--vocab-size", "1024", "--seed", "3"]


def json_lines(text: str) -> list[dict]:
    rows = [json.loads(x) for x in text.splitlines() if x.strip()]
    assert all(isinstance(r, dict) and "event" in r for r in rows)  # stdout carries JSON lines only
    return rows


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Build once: (model dir, stdout events, codemodel.json)."""
    out = tmp_path_factory.mktemp("codemodel") / "model"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert run_main(codemodel.main, [str(out), *ARGS]) == 0
    meta = json.loads((out / "codemodel.json").read_text())
    return out, json_lines(buf.getvalue()), meta


@slow
def test_build_writes_a_complete_model_dir(built):
    out, events, meta = built
    for name in codemodel.MODEL_FILES:
        assert (out / name).is_file(), name
    assert not list(out.parent.glob(".model.tmp-*"))  # the temp dir was renamed into place
    progress = [e for e in events if e["event"] == "progress"]
    assert progress and progress[-1]["done"] == meta["training"]["steps"]
    assert {"task", "done", "total", "unit", "tokens_per_s", "eta_s", "loss"} <= set(progress[0])
    assert progress[0]["task"] == "codemodel" and progress[0]["unit"] == "steps"
    result = events[-1]
    assert result["event"] == "result" and result["reused"] is False and result["path"] == str(out.resolve())
    assert meta["corpus"]["train_files"] + meta["corpus"]["val_files"] == 30 and meta["corpus"]["val_files"] >= 1
    assert meta["tokenizer"]["vocab_size"] == 1024 and meta["model"]["num_hidden_layers"] >= 4
    assert meta["provenance"]["task"] == "codemodel" and meta["provenance"]["seed"] == 3
    assert len(meta["samples"]) == 2 and all(0 < s["distinct_ratio"] <= 1 for s in meta["samples"])


@slow
def test_loss_fell(built):
    _, _, meta = built
    tr = meta["training"]
    assert tr["steps"] >= 5
    assert tr["final_train_loss"] < tr["initial_train_loss"] - 0.5, tr
    assert tr["val_loss"] < tr["initial_val_loss"] - 0.3, tr


@slow
def test_reloads_with_auto_classes_and_load_target(built):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from core.ml.decoding.generate import greedy_generate
    from core.ml.models.target import load_target, load_tokenizer

    out, _, _ = built
    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.config.tie_word_embeddings is False
    assert model.generation_config.do_sample is False and model.generation_config.eos_token_id == 2
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2 and tok.pad_token_id == 0
    assert tok.convert_tokens_to_ids("<|MASK|>") == 3
    target = load_target(out)
    assert load_tokenizer(out) is not None
    ids = tok("def add(a, b):\n    return a + b\n")["input_ids"]
    with torch.no_grad():
        a = model(torch.tensor([ids])).logits
        b = target(torch.tensor([ids])).logits
    assert torch.isfinite(a).all() and torch.allclose(a, b, atol=1e-5)
    res = greedy_generate(target, ids, 8)
    assert len(res.tokens) == 8 or res.stopped


def _stdlib_samples() -> list[str]:
    """Some stdlib sources, including ones with non-ASCII text, plus awkward whitespace."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    texts = [(root / name).read_text(encoding="utf-8") for name in ("os.py", "textwrap.py", "json/decoder.py")]
    non_ascii = 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="strict") if path.stat().st_size < 200_000 else ""
        if any(ord(c) > 127 for c in text):
            texts.append(text)
            non_ascii += 1
            if non_ascii == 3:
                break
    texts.append("x\t=  1\r\n\r\n\n    \tif y:  # héllo ✓ 🐍\n\x0c\n\u00a0pass   ")
    return texts


@slow
def test_tokenizer_round_trips_stdlib_code(built):
    from transformers import AutoTokenizer

    out, _, _ = built
    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    for text in _stdlib_samples():
        ids = tok(text, add_special_tokens=True)["input_ids"]
        assert tok.decode(ids) == text
        assert tok.convert_tokens_to_ids("<|endoftext|>") not in ids  # no automatic specials


@slow
def test_chat_template(built):
    from transformers import AutoTokenizer

    out, _, _ = built
    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    msgs = [{"role": "user", "content": "Write a Python function fizzbuzz(n)"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nWrite a Python function fizzbuzz(n)<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert ids[0] == 1 and ids.count(2) == 1 and tok.decode(ids) == text


@slow
def test_second_invocation_is_a_no_op(built):
    out, _, meta = built
    weights = out / "model.safetensors"
    before = weights.stat().st_mtime_ns
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "core.ml.codemodel", str(out), *ARGS], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    events = json_lines(proc.stdout)
    assert [e["event"] for e in events] == ["result"] and events[0]["reused"] is True
    assert events[0]["steps"] == meta["training"]["steps"]
    assert "reusing" in proc.stderr
    assert weights.stat().st_mtime_ns == before


def test_refuses_to_replace_a_foreign_directory(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert run_main(codemodel.main, [str(tmp_path), *ARGS]) == 2
    assert "not a code model directory" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"


# ----------------------------------------------------------------------------- fast unit tests


def test_corpus_is_deterministic_and_holds_out_files():
    a = codemodel.collect_corpus(max_bytes=200_000, max_files=12)
    b = codemodel.collect_corpus(max_bytes=200_000, max_files=12)
    assert [r for r, _ in a.train] == [r for r, _ in b.train] and a.stats()["sha256"] == b.stats()["sha256"]
    assert a.val and not {r for r, _ in a.val} & {r for r, _ in a.train}
    assert all("test" not in r.split("/")[0] for r, _ in a.train + a.val)


def test_chat_examples_from_source():
    src = (
        "import os\n\n"
        "def greet(name, punct='!'):\n"
        "    \"\"\"Say hello to someone.\"\"\"\n"
        "    message = 'hello ' + name + punct\n"
        "    print(message)\n"
        "    return message\n\n"
        "def _private(x):\n    return x * 2 + 1 - 3 * x + 4 - x * x * x * x * x + 7 * 9 * 11 + 13 * 17 * 19\n\n"
        "class A:\n"
        "    def method(self, items):\n"
        "        total = 0\n"
        "        for item in items:\n"
        "            total += item * item\n"
        "        return total\n"
    )
    chats = codemodel.chat_examples([("m.py", src)], min_chars=40)
    names = [c[0]["content"] for c in chats]
    assert len(chats) == 2 and "greet(name, punct='!')" in names[0] and "method(self, items)" in names[1]
    assert chats[0][1]["content"].startswith("def greet(") and chats[1][1]["content"].startswith("def method(self")
    assert codemodel.chat_examples([("bad.py", "def (:")]) == []


def _drive(tuner, step_time, steps):
    """Feed ``tuner`` ``steps`` simulated steps; ``step_time(threads)`` gives each one's duration."""
    now = 0.0
    for _ in range(steps):
        dt = step_time(torch.get_num_threads())
        now += dt
        tuner.step_done(dt, now)


@pytest.fixture
def restore_threads():
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def test_thread_tuner_uses_two_threads_when_they_are_faster(restore_threads):
    tuner = codemodel.ThreadTuner(max_threads=2, probe_steps=3, hold_s=100.0)
    assert torch.get_num_threads() == 1  # starts safe
    _drive(tuner, lambda t: 0.06 if t == 2 else 0.1, 30)
    assert torch.get_num_threads() == 2 and tuner.steps_with[2] > tuner.steps_with[1]


def test_thread_tuner_gives_up_on_a_stalling_second_thread(restore_threads):
    tuner = codemodel.ThreadTuner(max_threads=2, probe_steps=3, hold_s=1.0, max_hold_s=4.0)
    _drive(tuner, lambda t: 4.0 if t == 2 else 0.1, 200)  # a busy machine: 2 threads stall
    assert torch.get_num_threads() == 1
    # one slow step per try, tries 1, 2, 4, 4, ... s apart: few slow steps in 200
    assert tuner.steps_with[2] <= 6 and tuner.steps_with[1] >= 194


def test_lr_schedule():
    assert codemodel.lr_at(0.0, 1.0) == pytest.approx(0.02)
    assert codemodel.lr_at(0.05, 1.0) == pytest.approx(1.0)
    assert codemodel.lr_at(1.0, 1.0) == pytest.approx(0.1)
    assert codemodel.lr_at(0.5, 1.0) > codemodel.lr_at(0.9, 1.0)


@pytest.mark.parametrize("flags, seconds, key", [
    (["--max-steps", "7"], None, None),  # steps alone: no wall-time limit, the same model on any machine
    (["--max-steps", "7", "--seconds", "5"], 5.0, 5.0),  # both: whichever comes first
    ([], codemodel.DEFAULT_SECONDS, codemodel.DEFAULT_SECONDS),  # neither: the minute
])
def test_max_steps_alone_sets_no_time_limit(tmp_path, monkeypatch, capsys, flags, seconds, key):
    seen = []

    def build(out_dir, settings, force, argv, threads):
        seen.append(settings)
        raise codemodel.UsageError("stopped before training")

    monkeypatch.setattr(codemodel, "build_code_model_dir", build)
    assert run_main(codemodel.main, [str(tmp_path / "m"), *flags]) == 2
    assert seen[0].seconds == seconds and seen[0].key()["seconds"] == key
    json.dumps(seen[0].key(), allow_nan=False)  # the reuse key stays plain JSON (no Infinity)


def test_train_without_a_time_budget_stops_at_max_steps(restore_threads, capsys):
    model = codemodel.build_code_model(vocab_size=300, seed=0)
    stream = torch.randint(4, 300, (4000,), generator=torch.Generator().manual_seed(0))
    log = codemodel.train(model, stream, torch.empty(0, dtype=torch.long), math.inf, max_steps=3, batch_size=2,
                          seq_len=16, threads=1)
    assert log.steps == 3
    progress = json_lines(capsys.readouterr().out)
    assert progress[-1]["done"] == 3 and progress[-1]["total"] == 3


@slow
def test_progress_records_are_the_loss_curve_and_read_as_the_cli_says(built):
    """What the demo's make-target prints: each progress record is a loss point at its step
    (the console's curves, ``specdeck metrics``), said as ``codemodel: N/40 steps, ...`` by
    the CLI and the log pane alike, with the loss after it."""
    from core.capsules.metrics_sources import parse_metrics
    from core.capsules.progress import describe, record_text

    _, events, _ = built
    progress = [e for e in events if e["event"] == "progress"]
    for e in progress:
        line = json.dumps(e)
        points = {name: (step, value) for step, name, value in parse_metrics(line.encode())}
        assert points["loss"] == (e["done"], e["loss"]) and "done" not in points
        assert describe(line).startswith(f"codemodel: {e['done']}/40 steps, ")
        assert record_text(line) == f"{describe(line)} · loss {e['loss']:.4g}"
