"""Target weights without loading them: stored dtype, bytes, memory-mapped embedding + head,
and the memory preflight (core.ml.formats.weights)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from core.ml.formats import weights as w
from core.ml.formats.runio import UsageError  # noqa: E402


@pytest.fixture(scope="module")
def bf16_dirs(tiny, tmp_path_factory):
    """A tiny Qwen3 target saved in bf16 (untied head), and a tied one, and the VLM layout."""
    root = tmp_path_factory.mktemp("weights")
    out = {}
    model = tiny.build_tiny_target("qwen3", seed=3).to(torch.bfloat16)
    model.save_pretrained(root / "untied")
    out["untied"] = (root / "untied", model)
    tied = tiny.build_tiny_target("qwen3", seed=4, tie_word_embeddings=True)
    tied.save_pretrained(root / "tied")
    out["tied"] = (root / "tied", tied)
    vlm = tiny.save_tiny_target(root / "vlm", "qwen3_5_vlm", seed=0, tokenizer=False)
    out["vlm"] = (vlm, tiny.build_tiny_target("qwen3_5", seed=0))
    return out


def test_stored_dtype_and_bytes_come_from_the_headers(bf16_dirs):
    path, model = bf16_dirs["untied"]
    assert w.checkpoint_dtype(path) == torch.bfloat16
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert w.weight_bytes(path) == params
    assert w.weight_bytes(path, dtype=torch.float32) == 2 * params
    assert w.checkpoint_dtype(bf16_dirs["tied"][0]) == torch.float32


@pytest.mark.parametrize("case", ["untied", "tied", "vlm"])
def test_embed_and_head_by_name_equal_the_full_model(bf16_dirs, case):
    path, model = bf16_dirs[case]
    names = w.embed_head_names(path, norm=True)
    if case == "vlm":
        assert names == {"embed": "model.language_model.embed_tokens.weight", "head": "lm_head.weight",
                         "norm": "model.language_model.norm.weight"}
    if case == "tied":
        assert names["head"] == names["embed"]
    part = w.load_embed_head(path, norm=True)
    ids = torch.tensor([[5, 9, 300]])
    torch.testing.assert_close(part.get_input_embeddings()(ids), model.get_input_embeddings()(ids).to(part.dtype))
    torch.testing.assert_close(part.get_output_embeddings().weight, model.get_output_embeddings().weight.to(part.dtype))
    torch.testing.assert_close(part.norm_weight, model.model.norm.weight.to(part.dtype))
    assert part.dtype == w.checkpoint_dtype(path)
    assert part.config.get_text_config().vocab_size == model.config.vocab_size
    if case == "tied":
        assert part.get_output_embeddings().weight is part.get_input_embeddings().weight
    cast = w.load_embed_head(path, dtype=torch.float32)
    assert cast.get_output_embeddings().weight.dtype == torch.float32


def test_mmap_tensors_are_views_of_one_file_mapping(bf16_dirs):
    path, model = bf16_dirs["untied"]
    names = ["lm_head.weight", "model.embed_tokens.weight"]
    got = w.load_mmap(path, names)
    index = w.tensor_index(path)
    for name, ref in (("lm_head.weight", model.lm_head.weight), ("model.embed_tokens.weight", model.model.embed_tokens.weight)):
        assert got[name].dtype == torch.bfloat16 and tuple(got[name].shape) == index[name].shape
        torch.testing.assert_close(got[name], ref)
    # no copies: both tensors sit in one mapping of the file, as far apart as in the file
    gap = got[names[0]].data_ptr() - got[names[1]].data_ptr()
    assert gap == index[names[0]].begin - index[names[1]].begin


@pytest.mark.parametrize("text,want", [("40G", 40 * 10**9), ("512MB", 512 * 10**6), ("1.5GiB", int(1.5 * 1024**3)),
                                       ("1000", 1000)])
def test_parse_bytes(text, want):
    assert w.parse_bytes(text) == want


@pytest.mark.parametrize("bad", ["lots", "-1G", "12Q", ""])
def test_parse_bytes_refuses(bad):
    with pytest.raises(ValueError, match="not a size"):
        w.parse_bytes(bad)


def test_preflight_refuses_with_needed_available_and_advice():
    with pytest.raises(UsageError) as exc:
        w.preflight(2 * 10**9, "eval --mode online", "1G", "Use --mode offline.")
    msg = str(exc.value)
    assert "2.00 GB" in msg and "1.00 GB --max-memory" in msg and "refused before loading" in msg and "offline" in msg
    ok = w.preflight(10**6, "x", "1G")
    assert ok["needed_bytes"] == 10**6 and ok["available_bytes"] == 10**9
    assert w.available_memory() is None or w.available_memory() > 0
