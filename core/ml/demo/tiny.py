"""Tiny random targets, tokenizer and drafters, built from config in code (nothing downloaded).

Used by the tests, the demo and other integration tests to create real directories::

    python -m core.ml.tiny OUT_DIR [--arch qwen3|qwen3_5] [--seed 0] [--block-size 8]

writes ``OUT_DIR/target`` (loadable by ``AutoModelForCausalLM.from_pretrained``, with a
ByteLevel BPE tokenizer trained offline and a chat template), ``OUT_DIR/drafter`` (z-lab
layout; by default quickly fitted to the target so tau > 1, ``--fit-steps 0`` for a random one)
and ``OUT_DIR/prompts.jsonl`` (text prompts plus one ``input_ids`` prompt).

Weights are drawn with a larger std than transformers' default (0.02) so that the tiny
target's argmax has clear margins: lossless-decoding tests compare argmaxes of different but
mathematically equal computations (incremental vs batched), which must not flip on float noise.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from core.ml.formats import strictjson
from core.ml.models.drafter import DFlashDrafter, save_drafter
from core.ml.formats.drafter_config import DFlashConfig
from core.ml.formats.runio import emit, run_main

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "What is 12 times 7? Twelve times seven is eighty-four.",
    "Speculative decoding drafts tokens that the target model verifies in one pass.",
    "for i in range(10):\n    print(i * i)\n",
]
TOKENIZER_VOCAB = 300
TARGET_VOCAB = 320  # >= tokenizer vocab; the extra rows are never produced by the tokenizer
MASK_TOKEN = "<|MASK|>"


def tiny_tokenizer(vocab_size: int = TOKENIZER_VOCAB) -> Any:
    """A ByteLevel BPE tokenizer trained offline on a few sentences, with a chat template.

    Special ids: ``<|endoftext|>`` 0 (pad), ``<|im_start|>`` 1, ``<|im_end|>`` 2 (eos),
    ``<|MASK|>`` 3 (the drafter's mask token).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        bos_token=None, chat_template=CHAT_TEMPLATE,
    )


def tiny_target_config(arch: str = "qwen3", **overrides: Any) -> Any:
    """Config of a tiny target: 4 layers, H 64, 4/2 heads x 16, vocab 320.

    ``arch="qwen3_5"`` gives the hybrid layout of the campaign target (3 linear-attention
    layers with conv + recurrent state, then 1 full-attention layer).
    """
    common: dict[str, Any] = dict(
        vocab_size=TARGET_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
        rms_norm_eps=1e-6, tie_word_embeddings=False, eos_token_id=2, pad_token_id=0,
        initializer_range=0.5,
    )
    common.update(overrides)
    if arch == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(**common)
    if arch == "qwen3_5":
        from transformers.models.qwen3_5 import Qwen3_5TextConfig

        common.setdefault("layer_types", ["linear_attention"] * (common["num_hidden_layers"] - 1) + ["full_attention"])
        return Qwen3_5TextConfig(
            linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_conv_kernel_dim=4, **common,
        )
    raise ValueError(f"unknown tiny arch {arch!r} (qwen3, qwen3_5)")


def build_tiny_target(arch: str = "qwen3", seed: int = 0, **overrides: Any) -> Any:
    """A tiny random causal LM (float32, eval mode)."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_target_config(arch, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    return model.float().eval()


def tiny_drafter_config(
    target_config: Any,
    block_size: int = 8,
    num_layers: int = 2,
    target_layer_ids: Sequence[int] = (0, 2),
    mask_token_id: int = 3,
    sliding_window: int | None = None,
    **overrides: Any,
) -> DFlashConfig:
    """A drafter config matching ``target_config`` (same H and vocab).

    With ``sliding_window`` the first ``num_layers - 1`` layers are sliding (like the
    Qwen3.6-27B drafter: 4 sliding + 1 full).
    """
    layer_types = (
        ["sliding_attention"] * (num_layers - 1) + ["full_attention"] if sliding_window else ["full_attention"] * num_layers
    )
    fields: dict[str, Any] = dict(
        hidden_size=target_config.hidden_size, num_hidden_layers=num_layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=128, vocab_size=target_config.vocab_size,
        block_size=block_size, mask_token_id=mask_token_id, target_layer_ids=list(target_layer_ids),
        num_target_layers=target_config.num_hidden_layers, rope_theta=10_000.0, layer_types=layer_types,
        sliding_window=sliding_window, max_position_embeddings=2048,
    )
    fields.update(overrides)
    return DFlashConfig(**fields)


def build_tiny_drafter(config: DFlashConfig, seed: int = 0, std: float = 0.2) -> DFlashDrafter:
    """A drafter with every tensor random (norm weights too, so the checkpoint is not trivial)."""
    gen = torch.Generator().manual_seed(seed)
    model = DFlashDrafter(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))
    return model.float().eval()


def dflash2_from(drafter: DFlashDrafter, kernel_size: int = 3, group_size: int = 16, rank: int = 8, top_k: int = 4,
                 seed: int = 0, std: float = 0.2, codebook_std: float = 0.6, identity: bool = False) -> DFlashDrafter:
    """A DFlash-2 drafter (docs/drafter.md §7) with ``drafter``'s weights and new convolutions
    and candidate selector: random (std ``std``, the codebooks ``codebook_std``, large enough for
    the selector to overrule a fitted drafter's argmax now and then), or, with ``identity``, convolutions that pass
    their input through (base kernel 1 at lag 0, no dynamic part) and zero codebooks, so it
    drafts exactly as ``drafter`` does."""
    import dataclasses

    config = dataclasses.replace(drafter.config, conv_kernel_size=kernel_size, conv_group_size=group_size,
                                 selector_rank=rank, selector_top_k=top_k,
                                 extra={k: v for k, v in drafter.config.extra.items() if k != "architectures"})
    model = DFlashDrafter(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        fresh = {n: p for n, p in model.named_parameters()}
        old = dict(drafter.named_parameters())
        for name, p in fresh.items():
            if name in old:
                p.copy_(old[name])
            elif identity and name.endswith("base_kernel"):
                p.zero_()[:, 0] = 1.0
            elif identity:
                p.zero_()
            elif name.endswith("base_kernel"):  # near the identity, so the fitted drafter still drafts well
                p.copy_(std * torch.randn(p.shape, generator=gen))
                p[:, 0] += 1.0
            elif name.endswith("_codebook"):
                p.copy_(codebook_std * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))
    return model.float().eval()


def fit_tiny_drafter(drafter: DFlashDrafter, target: Any, steps: int = 200, num_seqs: int = 8, gen_tokens: int = 64,
                     anchors: int = 24, lr: float = 3e-3, seed: int = 0,
                     prompts: Sequence[Sequence[int]] = ()) -> DFlashDrafter:
    """Quickly fit a tiny drafter to a tiny target's greedy outputs, so demos show tau > 1.

    NOT the reference trainer (that is ``core.ml.train``): a few hundred AdamW steps of the
    multi-anchor forward with hard greedy labels and the decay weights of docs/training.md §3, enough to
    memorise the training prompts' continuations (``prompts`` first, then random ones up to
    ``num_seqs``). Returns the drafter in eval mode.
    """
    import torch.nn.functional as F

    from core.ml.models.drafter import block_token_ids, multi_anchor_forward
    from core.ml.models.features import target_features
    from core.ml.decoding.generate import greedy_generate

    gen = torch.Generator().manual_seed(seed)
    B, emb, head = drafter.block_size, target.get_input_embeddings(), target.get_output_embeddings()
    data = []
    for i in range(max(num_seqs, len(prompts))):
        prompt = list(prompts[i]) if i < len(prompts) else fit_prompt(gen)
        ids = torch.tensor([prompt + greedy_generate(target, prompt, gen_tokens).tokens])
        out, feats = target_features(target, ids, drafter.target_layer_ids)
        data.append((ids, feats, out.logits[0].argmax(-1), len(prompt)))
    k = torch.arange(1, B)
    weights = torch.exp(-(k - 1) / {16: 7.0, 10: 5.0, 8: 4.0}.get(B, 7.0))
    opt = torch.optim.AdamW(drafter.parameters(), lr=lr)
    drafter.train()
    for step in range(steps):
        ids, feats, labels, P = data[step % len(data)]
        S = ids.shape[1]
        a = torch.sort(torch.randperm(S - P - B, generator=gen)[:anchors] + P).values[None]
        with torch.no_grad():
            block_emb = emb(block_token_ids(ids, a, B, drafter.mask_token_id))
        logits = head(multi_anchor_forward(drafter, feats, block_emb, a)).view(-1, B, head.out_features)[:, 1:]
        y = labels[a[0][:, None] + k - 1]  # slot k predicts position a+k = target argmax at a+k-1
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none").view(-1, B - 1)
        loss = (ce * weights).sum() / (weights.sum() * ce.shape[0])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return drafter.eval()


def fit_prompt(gen: torch.Generator, length: int = 8) -> list[int]:
    """A random prompt of ordinary (non-special) token ids."""
    return (torch.randint(len(SPECIALS), TOKENIZER_VOCAB, (length,), generator=gen)).tolist()


def save_tiny_target(out_dir: str | Path, arch: str = "qwen3", seed: int = 0, tokenizer: bool = True,
                     model: Any | None = None) -> Path:
    """Write a tiny target directory (config, safetensors weights, tokenizer).

    ``arch="qwen3_5_vlm"`` writes the layout of the real Qwen3.5/3.6 checkpoints: a
    ``qwen3_5`` composite config (text + a tiny vision tower) with
    ``model.language_model.*`` weights, which ``AutoModelForCausalLM`` loads as
    ``Qwen3_5ForCausalLM``; its text weights equal ``build_tiny_target("qwen3_5", seed)``.
    """
    out = Path(out_dir)
    text_arch = "qwen3_5" if arch == "qwen3_5_vlm" else arch
    model = model if model is not None else build_tiny_target(text_arch, seed)
    if arch == "qwen3_5_vlm":
        model = _as_vlm(model)
    model.save_pretrained(out)
    if tokenizer:
        tiny_tokenizer().save_pretrained(out)
    return out


def _as_vlm(text_model: Any) -> Any:
    """Wrap a tiny Qwen3_5ForCausalLM into Qwen3_5ForConditionalGeneration (same text weights)."""
    from transformers.models.qwen3_5 import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = text_model.config.to_dict()
    for k in ("model_type", "transformers_version", "architectures"):
        text.pop(k, None)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=text["hidden_size"],
                  patch_size=4, temporal_patch_size=1, spatial_merge_size=1, num_position_embeddings=16)
    vlm = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision, eos_token_id=2))
    vlm.model.language_model.load_state_dict(text_model.model.state_dict())
    vlm.lm_head.load_state_dict(text_model.lm_head.state_dict())
    return vlm.eval()


def save_tiny_drafter(out_dir: str | Path, target_config: Any, seed: int = 0, **kw: Any) -> Path:
    """Write a tiny random drafter directory in the z-lab layout."""
    return save_drafter(build_tiny_drafter(tiny_drafter_config(target_config, **kw), seed), out_dir)


def tiny_prompt_rows(n_text: int = 3) -> list[dict[str, Any]]:
    """``n_text`` text prompts plus one ``input_ids`` prompt (the demo's prompts file rows)."""
    rows: list[dict[str, Any]] = [{"id": f"p{i}", "prompt": CORPUS[i % len(CORPUS)]} for i in range(n_text)]
    rows.append({"id": "ids0", "input_ids": [1, 40, 41, 42, 43, 44, 45, 2, 1]})
    return rows


def write_tiny_prompts(path: str | Path, n_text: int = 3) -> Path:
    """Write :func:`tiny_prompt_rows` as a JSONL prompts file."""
    rows = tiny_prompt_rows(n_text)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(strictjson.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def make_tiny_pair(root: str | Path, arch: str = "qwen3", seed: int = 0, block_size: int = 8, fit_steps: int = 0,
                   target_overrides: dict[str, Any] | None = None, **kw: Any) -> tuple[Path, Path]:
    """Create ``root/target`` and ``root/drafter``; returns both paths.

    With ``fit_steps > 0`` the drafter is first fitted to the target (:func:`fit_tiny_drafter`).
    ``target_overrides`` go to the target's config (e.g. a larger ``initializer_range``: logits
    far from ties, so two implementations' float noise never flips an argmax).
    """
    root = Path(root)
    target = build_tiny_target("qwen3_5" if arch == "qwen3_5_vlm" else arch, seed, **(target_overrides or {}))
    save_tiny_target(root / "target", arch, seed, model=target)
    drafter = build_tiny_drafter(tiny_drafter_config(target.config, block_size=block_size, **kw), seed + 1,
                                 std=0.05 if fit_steps else 0.2)
    if fit_steps:
        tok = tiny_tokenizer()
        demo = [tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True,
                                        tokenize=True, return_dict=True)["input_ids"] for r in tiny_prompt_rows()[:-1]]
        fit_tiny_drafter(drafter, target, fit_steps, seed=seed, prompts=demo + [tiny_prompt_rows()[-1]["input_ids"]])
    save_drafter(drafter, root / "drafter")
    return root / "target", root / "drafter"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m core.ml.tiny", description="write a tiny target, drafter and prompts")
    p.add_argument("out_dir")
    p.add_argument("--arch", default="qwen3", choices=["qwen3", "qwen3_5", "qwen3_5_vlm"],
                   help="qwen3_5_vlm: the real Qwen3.5/3.6 checkpoint layout (composite qwen3_5 config)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--fit-steps", type=int, default=200, help="fit the drafter to the target first (0: random drafter)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    target_dir, drafter_dir = make_tiny_pair(args.out_dir, args.arch, args.seed, args.block_size, args.fit_steps)
    prompts = write_tiny_prompts(Path(args.out_dir) / "prompts.jsonl")
    emit("result", task="tiny", target=str(target_dir.resolve()), drafter=str(drafter_dir.resolve()),
         prompts=str(prompts.resolve()), path=str(Path(args.out_dir).resolve()))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
