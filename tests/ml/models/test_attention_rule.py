"""Sliding-window drafter layers follow the serving engines' rule (issue 14 §1, docs/drafter.md §5).

vLLM (``qwen3_dflash._dflash_layer_causal``), SGLang and SpecForge treat a ``sliding_attention``
draft layer as causal with a window measured from each query's own absolute position: the query
at position q sees key positions p with ``q - W < p <= q``, context and block keys alike;
``full_attention`` layers see the context before the anchor and the whole block. Causality
precedence: top-level ``is_causal``, ``dflash_config.is_causal``, ``dflash_config.causal``
(each sets every layer), else ``layer_types``.

The rule is written again here, from scratch (:func:`engine_visible`), together with a plain
float64 drafter forward that attends over explicitly listed keys (:class:`ReferenceProposer`).
On a tiny Qwen3 target with a drafter whose sliding window (6) is smaller than prompt + output
(8 + 40), online chain, DDTree and offline tau (per anchor, trajectory, all-anchor) of
specdeck's drafter must equal this reference round for round. The two wrong rules the issue
names (sliding layers bidirectional inside the block; the window counted from the block start)
are run through the same reference and must give different drafts, so the comparison would
fail if specdeck implemented either.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from core.ml.measure import tau as T
from core.ml.decoding.ddtree import build_tree, topk_per_depth  # noqa: E402
from core.ml.models.drafter import DFlashDrafter  # noqa: E402
from core.ml.formats.drafter_config import DFlashConfig  # noqa: E402
from core.ml.tasks.extract import labels_and_features  # noqa: E402
from core.ml.formats.featstore import CachedSequence  # noqa: E402
from core.ml.decoding.generate import DFlashProposer, chain_generate, ddtree_generate, greedy_generate  # noqa: E402
from core.ml.decoding.offline import sequence_streaks  # noqa: E402
from core.ml.models.target import TargetRunner  # noqa: E402

B, W, N_NEW, BUDGET = 8, 6, 40, 6
PROMPT_SEEDS = (100, 101)


# ----------------------------------------------------------------------------- the rule, again


def engine_causal(cfg: dict, layer: int) -> bool:
    """vLLM's precedence, from the raw config.json dict."""
    dflash = cfg.get("dflash_config") or {}
    for value in (cfg.get("is_causal"), dflash.get("is_causal"), dflash.get("causal")):
        if value is not None:
            return bool(value)
    return cfg["layer_types"][layer] == "sliding_attention"


def engine_visible(cfg: dict, layer: int, q: int, p: int, anchor: int, variant: str = "engines") -> bool:
    """May the query at position q (block anchored at ``anchor``) see the key at position p?

    Keys are the context (p < anchor) and the query's own block (anchor <= p < anchor + B).
    ``variant`` = ``engines`` (the rule), or one of the two wrong rules the test must tell apart.
    """
    sliding = cfg["layer_types"][layer] == "sliding_attention"
    window = cfg.get("sliding_window")
    causal = engine_causal(cfg, layer)
    if variant == "bidirectional-block":  # sliding layers not causal, window still per query
        causal = False if sliding else causal
    if causal and p > q:
        return False
    if sliding:
        if variant == "window-from-block-start":
            return p >= anchor - window
        return p > q - window
    return True


# ----------------------------------------------------------------------------- plain reference forward


def _rms(x, w, eps):
    return w * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta):  # x [n, heads, d], rotate-half form
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.tensor(pos, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1)[:, None], torch.cat([ang.sin(), ang.sin()], -1)[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class ReferenceProposer:
    """Drafts with the drafter's weights in float64, attending over explicitly listed keys."""

    def __init__(self, drafter: DFlashDrafter, target, cfg: dict, variant: str = "engines") -> None:
        self.w = {k: v.detach().double().cpu() for k, v in drafter.state_dict().items()}
        self.cfg, self.variant = cfg, variant
        self.embed = target.get_input_embeddings().weight.detach().double().cpu()
        self.head = target.get_output_embeddings().weight.detach().double().cpu()
        self.reset()

    def reset(self) -> None:
        self.feats = None

    def propose(self, block, start, new_feats):
        new = new_feats[0].detach().double().cpu()
        self.feats = new if self.feats is None else torch.cat([self.feats, new])
        assert self.feats.shape[0] == start
        return self.block_logits(self.feats, list(block), start)

    def block_logits(self, feats, block: list[int], anchor: int):
        cfg, w = self.cfg, self.w
        eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
        nh, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        ctx = _rms(feats @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
        h = self.embed[block]
        q_pos = [anchor + k for k in range(len(block))]
        k_pos = list(range(anchor)) + q_pos
        for i in range(cfg["num_hidden_layers"]):
            p = f"layers.{i}."
            xn = _rms(h, w[p + "input_layernorm.weight"], eps)
            kv_in = torch.cat([ctx, xn])
            q = _rope(_rms((xn @ w[p + "self_attn.q_proj.weight"].T).view(len(block), nh, d),
                           w[p + "self_attn.q_norm.weight"], eps), q_pos, theta)
            k = _rope(_rms((kv_in @ w[p + "self_attn.k_proj.weight"].T).view(len(k_pos), nkv, d),
                           w[p + "self_attn.k_norm.weight"], eps), k_pos, theta)
            v = (kv_in @ w[p + "self_attn.v_proj.weight"].T).view(len(k_pos), nkv, d)
            out = torch.zeros(len(block), nh, d, dtype=torch.float64)
            for r, qp in enumerate(q_pos):
                keys = [j for j, kp in enumerate(k_pos) if engine_visible(cfg, i, qp, kp, anchor, self.variant)]
                for head in range(nh):
                    g = head // (nh // nkv)
                    s = (k[keys, g] @ q[r, head]) / math.sqrt(d)
                    out[r, head] = torch.softmax(s, 0) @ v[keys, g]
            h = h + out.reshape(len(block), nh * d) @ w[p + "self_attn.o_proj.weight"].T
            xn = _rms(h, w[p + "post_attention_layernorm.weight"], eps)
            gate, up = xn @ w[p + "mlp.gate_proj.weight"].T, xn @ w[p + "mlp.up_proj.weight"].T
            h = h + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        return (_rms(h, w["norm.weight"], eps)[1:] @ self.head.T).float()


class Recording:
    """Wraps a proposer and records each round's argmax drafts and the length of its block."""

    def __init__(self, inner) -> None:
        self.inner, self.drafts, self.blocks = inner, [], []

    def reset(self) -> None:
        self.inner.reset()

    def propose(self, block, start, new_feats):
        logits = self.inner.propose(block, start, new_feats)
        self.drafts.append(logits.argmax(-1).tolist())
        self.blocks.append(len(block))
        return logits


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def sliding_drafter(tiny, qwen3_target):
    """3 layers: 2 sliding (window 6 < prompt 8 + output 40) + 1 full, fitted for partial acceptance."""
    cfg = tiny.tiny_drafter_config(qwen3_target.config, block_size=B, num_layers=3, sliding_window=W)
    d = tiny.build_tiny_drafter(cfg, seed=1, std=0.05)
    prompts = [tiny.fit_prompt(torch.Generator().manual_seed(s)) for s in PROMPT_SEEDS]
    return tiny.fit_tiny_drafter(d, qwen3_target, steps=60, num_seqs=len(prompts), gen_tokens=48, seed=0,
                                 prompts=prompts)


def with_config(drafter: DFlashDrafter, **changes) -> DFlashDrafter:
    """The same weights under a config.json with ``changes`` (e.g. causality overrides)."""
    raw = drafter.config.to_dict()
    for key, value in changes.items():
        if key.startswith("dflash_config."):
            raw["dflash_config"][key.split(".", 1)[1]] = value
        else:
            raw[key] = value
    model = DFlashDrafter(DFlashConfig.from_dict(raw))
    model.load_state_dict(drafter.state_dict())
    return model.eval()


def cached(target, drafter, prompt, n_new) -> CachedSequence:
    gen = greedy_generate(target, prompt, n_new)
    ids = torch.tensor([prompt + gen.tokens])
    feats, labels = labels_and_features(target, ids, drafter.target_layer_ids)
    return CachedSequence("x", ids[0], feats, labels, len(prompt))


def reference_offline(ref: ReferenceProposer, seq: CachedSequence, budget: int):
    """Per anchor: (chain streak, DDTree streak) of the reference drafter."""
    labels = seq.labels.tolist()
    feats = seq.features.double()
    chain, tree = {}, {}
    for a in range(seq.prompt_len, seq.input_ids.shape[0]):
        block = [int(seq.input_ids[a])] + [ref.cfg["dflash_config"]["mask_token_id"]] * (B - 1)
        logits = ref.block_logits(feats[:a], block, a)
        chain[a] = T.streak(logits.argmax(-1).tolist(), labels[a:a + B - 1])
        tree[a] = build_tree(block[0], topk_per_depth(logits, budget), budget).deepest_match(labels[a:a + B - 1])
    return chain, tree


# ----------------------------------------------------------------------------- tests


def test_config_resolves_the_engines_precedence():
    base = {"layer_types": ["sliding_attention", "full_attention"]}
    cases = [({}, {}, [True, False], "layer_types"),
             ({"is_causal": False}, {"is_causal": True, "causal": True}, [False, False], "is_causal"),
             ({}, {"is_causal": True, "causal": False}, [True, True], "dflash_config.is_causal"),
             ({}, {"causal": False}, [False, False], "dflash_config.causal"),
             ({"is_causal": True}, {}, [True, True], "is_causal")]
    from core.ml.formats.drafter_config import resolve_causality

    for top, dflash, want, source in cases:
        cfg = {**base, **top, "dflash_config": dflash}
        assert resolve_causality(cfg["layer_types"], top.get("is_causal"), dflash) == (want, source)
        assert [engine_causal(cfg, i) for i in range(2)] == want  # the test's own copy agrees


def test_online_ddtree_and_offline_equal_the_engines_rule_round_for_round(qwen3_target, sliding_drafter, make_prompt):
    target, drafter = qwen3_target, sliding_drafter
    cfg = drafter.config.to_dict()
    assert cfg["layer_types"].count("sliding_attention") == 2 and cfg["sliding_window"] == W
    mask = drafter.mask_token_id
    for seed in PROMPT_SEEDS:
        prompt = make_prompt(seed)
        assert W < len(prompt) + N_NEW  # the window bites
        runner = TargetRunner(target, drafter.target_layer_ids)
        mine, ref = Recording(DFlashProposer(drafter, target)), Recording(ReferenceProposer(drafter, target, cfg))
        got = chain_generate(mine, runner, prompt, N_NEW, B, mask)
        want = chain_generate(ref, runner, prompt, N_NEW, B, mask)
        assert got.rounds == want.rounds and mine.drafts == ref.drafts and got.tokens == want.tokens
        assert max(got.rounds) > 1  # partial acceptance: rounds carry information

        mine_t, ref_t = Recording(DFlashProposer(drafter, target)), Recording(ReferenceProposer(drafter, target, cfg))
        got_t = ddtree_generate(mine_t, runner, prompt, N_NEW, B, mask, BUDGET)
        want_t = ddtree_generate(ref_t, runner, prompt, N_NEW, B, mask, BUDGET)
        assert got_t.rounds == want_t.rounds and mine_t.drafts == ref_t.drafts

        seq = cached(target, drafter, prompt, N_NEW + B)
        emb, head = target.get_input_embeddings(), target.get_output_embeddings()
        off = sequence_streaks(drafter, emb, head, seq, B, tree_budget=BUDGET, max_rows=3 * B)
        ref_chain, ref_tree = reference_offline(ReferenceProposer(drafter, target, cfg), seq, BUDGET)
        assert off.streaks == [ref_chain[a] for a in off.anchors]
        assert off.tree_streaks == [ref_tree[a] for a in off.anchors]
        P = seq.prompt_len
        assert off.trajectory(N_NEW)[1] == T.trajectory(ref_chain, P, P + N_NEW)[1] == got.rounds
        assert off.trajectory(N_NEW, tree=True)[1] == T.trajectory(ref_tree, P, P + N_NEW)[1]
        assert off.all_anchor_rounds() == [ref_chain[a] + 1 for a, f in zip(off.anchors, off.full) if f]


@pytest.mark.parametrize("variant", ["bidirectional-block", "window-from-block-start"])
def test_the_wrong_rules_give_other_drafts(qwen3_target, sliding_drafter, make_prompt, variant):
    """The comparison above fails for either wrong rule: their drafts differ from the engines'.

    On an unseen prompt (the drafter is less sure there than on its memorised prompts).
    """
    target, drafter = qwen3_target, sliding_drafter
    cfg = drafter.config.to_dict()
    prompt = make_prompt(7)
    seq = cached(target, drafter, prompt, N_NEW + B)
    feats, mask = seq.features.double(), drafter.mask_token_id
    right, wrong = ReferenceProposer(drafter, target, cfg), ReferenceProposer(drafter, target, cfg, variant)
    differ = 0
    for a in range(seq.prompt_len, seq.input_ids.shape[0], 3):
        block = [int(seq.input_ids[a])] + [mask] * (B - 1)
        differ += not torch.equal(right.block_logits(feats[:a], block, a).argmax(-1),
                                  wrong.block_logits(feats[:a], block, a).argmax(-1))
    assert differ > 0
    runner = TargetRunner(target, drafter.target_layer_ids)
    mine = Recording(DFlashProposer(drafter, target))
    bad = Recording(ReferenceProposer(drafter, target, cfg, variant))
    chain_generate(mine, runner, prompt, N_NEW, B, mask)
    chain_generate(bad, runner, prompt, N_NEW, B, mask)
    assert mine.drafts != bad.drafts


@pytest.mark.parametrize("changes", [{"is_causal": False, "dflash_config.causal": True},
                                     {"dflash_config.is_causal": True, "dflash_config.causal": False},
                                     {"dflash_config.causal": False}, {"is_causal": True}],
                         ids=["top-is_causal-false", "dflash-is_causal-true", "dflash-causal-false", "top-true"])
def test_causality_overrides_are_honoured(qwen3_target, sliding_drafter, make_prompt, changes):
    target = qwen3_target
    drafter = with_config(sliding_drafter, **changes)
    cfg = drafter.config.to_dict()
    for key, value in changes.items():  # the override is written back on save
        node = cfg["dflash_config"] if key.startswith("dflash_config.") else cfg
        assert node[key.split(".")[-1]] == value
    prompt = make_prompt(PROMPT_SEEDS[1])
    runner = TargetRunner(target, drafter.target_layer_ids)
    mine, ref = Recording(DFlashProposer(drafter, target)), Recording(ReferenceProposer(drafter, target, cfg))
    got = chain_generate(mine, runner, prompt, N_NEW, B, drafter.mask_token_id)
    want = chain_generate(ref, runner, prompt, N_NEW, B, drafter.mask_token_id)
    assert got.rounds == want.rounds and mine.drafts == ref.drafts
    seq = cached(target, drafter, prompt, N_NEW + B)
    off = sequence_streaks(drafter, target.get_input_embeddings(), target.get_output_embeddings(), seq, B)
    ref_chain, _ = reference_offline(ReferenceProposer(drafter, target, cfg), seq, 1)
    assert off.streaks == [ref_chain[a] for a in off.anchors]
