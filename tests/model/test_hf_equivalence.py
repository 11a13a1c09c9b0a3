"""Our model against transformers.LlamaForCausalLM: logits equal both ways (our export -> theirs, theirs ->
ours), and RoPE frequencies equal to transformers' ROPE_INIT_FUNCTIONS for every scaling type."""

from __future__ import annotations

import pytest
import torch

from lcft.checkpoint.hf_folder import from_pretrained, save_pretrained
from lcft.model import Llama, LlamaConfig
from lcft.model.rope import rope_frequencies

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

L = 512
SCALINGS = {
    "none": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    # max_position_embeddings is 256 below, so 512 tokens make dynamic NTK rescale (as it does in HF).
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32},
}


def small_config(scaling: dict | None, tied: bool) -> LlamaConfig:
    # head_dim 32 so that yarn and llama3 have low, medium and high frequency bands
    return LlamaConfig(vocab_size=16, hidden_size=128, intermediate_size=200, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, rope_scaling=scaling,
                       max_position_embeddings=256, tie_word_embeddings=tied)


def hf_model(path):
    return transformers.LlamaForCausalLM.from_pretrained(path, attn_implementation="eager",
                                                         dtype=torch.float32).eval()


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("scaling", list(SCALINGS))
def test_logits_equal_transformers_both_ways(tmp_path, scaling, tied):
    torch.manual_seed(0)
    cfg = small_config(SCALINGS[scaling], tied)
    ours = Llama(cfg).eval()
    with torch.no_grad():  # larger weights than the 0.02 init, so attention is far from uniform
        for p in ours.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15)
    ids = torch.randint(0, 16, (2, L))

    save_pretrained(ours, tmp_path / "ours")
    theirs = hf_model(tmp_path / "ours")
    with torch.no_grad():
        a, b = ours(ids), theirs(ids).logits
    assert a.shape == (2, L, 16)
    assert (a - b).abs().max().item() < 1e-4
    assert a.std() > 0.1  # the comparison is not between two near-constant outputs

    # their folder -> ours
    theirs.save_pretrained(tmp_path / "theirs")
    back = from_pretrained(tmp_path / "theirs").eval()
    assert back.config.rope_scaling == cfg.rope_scaling and back.config.tie_word_embeddings == tied
    with torch.no_grad():
        c = back(ids)
    assert (c - b).abs().max().item() < 1e-4


@pytest.mark.parametrize("scaling", [s for s in SCALINGS if s != "none"])
def test_rope_frequencies_match_transformers(scaling):
    cfg = small_config(SCALINGS[scaling], tied=False)
    hf_cfg = transformers.LlamaConfig(
        vocab_size=16, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rope_parameters={"rope_theta": cfg.rope_theta, **SCALINGS[scaling]})
    fn = ROPE_INIT_FUNCTIONS[scaling]
    for seq_len in (None, 100, 1000, 1 << 20):
        want, want_scale = fn(hf_cfg, "cpu", seq_len=seq_len)
        got, got_scale = rope_frequencies(cfg, seq_len)
        torch.testing.assert_close(got, want.float(), rtol=1e-6, atol=0)
        assert got_scale == pytest.approx(want_scale, rel=1e-12)


def test_gradients_equal_transformers(tmp_path):
    """Backward too (our fused projections and RoPE's own backward): parameter gradients of the same
    next-token loss match transformers' for every weight."""
    from lcft.kernels import chunked_cross_entropy
    from lcft.model.hf_params import to_hf_name

    torch.manual_seed(1)
    ours = Llama(small_config(SCALINGS["yarn"], tied=False))
    save_pretrained(ours, tmp_path / "m")
    theirs = hf_model(tmp_path / "m").train()
    ids = torch.randint(0, 16, (2, 256))
    labels = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], 1)
    theirs(input_ids=ids, labels=ids).loss.backward()
    loss_sum, count = chunked_cross_entropy(ours.hidden_states(ids), ours.lm_head_weight, labels, chunk=100)
    (loss_sum / count).backward()
    hf_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        g_theirs = hf_params[to_hf_name(name)].grad
        torch.testing.assert_close(p.grad, g_theirs, rtol=1e-4, atol=1e-5 * g_theirs.abs().max().item())


@pytest.mark.parametrize("head", ["its_own", "the_embedding"])
def test_a_tied_config_beside_a_stored_head_loads_only_where_transformers_ties_it(tmp_path, head):
    """tie_word_embeddings true beside a stored lm_head.weight: transformers ties the two only where the stored head
    is the embedding (torch.save writes a tied model so), and otherwise loads that head untied, warning that the
    config is wrong. lcft never drops a different head: it refuses the folder in one line naming the weight."""
    import json

    from safetensors.torch import load_file, save_file

    from lcft.errors import LcftError

    torch.manual_seed(0)
    folder = save_pretrained(Llama(small_config(None, tied=False)), tmp_path / "m")
    weights = load_file(folder / "model.safetensors")
    if head == "the_embedding":
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    theirs = hf_model(folder)
    tied = theirs.lm_head.weight.data_ptr() == theirs.model.embed_tokens.weight.data_ptr()
    assert torch.equal(theirs.lm_head.weight, weights["lm_head.weight"]) and tied == (head == "the_embedding")
    if tied:
        ids = torch.randint(0, 16, (1, 64))
        with torch.no_grad():
            assert (from_pretrained(folder).eval()(ids) - theirs(ids).logits).abs().max().item() < 1e-4
    else:
        with pytest.raises(LcftError, match="model.safetensors: holds an lm_head.weight unlike "
                                            "model.embed_tokens.weight, but config.json has tie_word_embeddings true"):
            from_pretrained(folder)


def _tied_folder(folder, head: str | None, embed: torch.Tensor):
    """A tied bf16 model folder whose weights are sharded, the embedding `embed` beside tiny layers; `head`: its
    lm_head.weight (a copy of the embedding) stored in a shard of its own read 'first' or 'last', or None."""
    import json

    from safetensors.torch import save_file

    from lcft.model.hf import config_to_hf
    from lcft.model.hf_params import to_hf_name
    from lcft.model.llama import parameter_shapes

    cfg = LlamaConfig(vocab_size=embed.shape[0], hidden_size=embed.shape[1], intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                      tie_word_embeddings=True)
    folder.mkdir()
    tensors = {to_hf_name(n): torch.zeros(s, dtype=torch.bfloat16) for n, s in parameter_shapes(cfg).items()}
    tensors["model.embed_tokens.weight"] = embed
    groups = [tensors] if head is None else [{"lm_head.weight": embed.clone()}, tensors]
    if head == "last":
        groups.reverse()
    shards = {f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors": g for i, g in enumerate(groups)}
    for name, group in shards.items():
        save_file(group, folder / name, metadata={"format": "pt"})
    weight_map = {key: name for name, group in shards.items() for key in group}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(config_to_hf(cfg, torch.bfloat16)))
    return folder


@pytest.fixture(scope="module")
def tied_without_head(tmp_path_factory) -> tuple[torch.Tensor, int]:
    """A tied 65536 x 512 bf16 embedding (128 MiB in fp32), and the MiB reading its folder without a stored head
    grows a fresh process's peak by, read as training reads (fp32): what both orders below are held to."""
    from tests.probes import peak_growth

    embed = torch.randn(65536, 512).to(torch.bfloat16)
    lines, base = peak_growth(READ_FP32, _tied_folder(tmp_path_factory.mktemp("tied") / "without", None, embed))
    assert lines == []
    return embed, base


READ_FP32 = "tests.probes.read_fp32_model"


@pytest.mark.parametrize("order", ["first", "last"])
def test_a_stored_tied_head_is_checked_without_a_second_embedding_in_memory(tmp_path, tied_without_head, order):
    """A stored head beside a tied embedding: its check grows the peak by less than half the fp32 embedding over
    the same folder without it, whether its shard comes before or after the embedding's (it held the head to the
    end, then compared a whole fp32 copy of it)."""
    from tests.probes import peak_growth

    embed, base = tied_without_head
    lines, grown = peak_growth(READ_FP32, _tied_folder(tmp_path / "with", order, embed))
    assert lines == [] and grown - base < 64, (base, grown)  # MiB; it grew by 192 (head + its fp32 copy)


def test_the_tied_head_check_compares_every_row_and_takes_nan_for_nan(tmp_path, monkeypatch):
    """The check goes a block of rows at a time (here two rows): a head unlike the embedding in its last row only
    is refused; a head that is the embedding, NaN included (a diverged run saved by torch.save), loads as tied."""
    from safetensors.torch import save_file

    import lcft.model.hf_params as hf_params
    from lcft.errors import LcftError
    from tests.probes import read_fp32_model

    monkeypatch.setattr(hf_params, "_COMPARE_ELEMENTS", 2 * 128, raising=False)
    embed = torch.randn(16, 128).to(torch.bfloat16)
    embed[3, 5] = float("nan")
    folder = _tied_folder(tmp_path / "nan", "last", embed)
    assert torch.equal(read_fp32_model(folder).get_parameter("embed_tokens.weight").isnan(), embed.isnan())
    other = embed.clone()
    other[-1, -1] += 1
    folder = _tied_folder(tmp_path / "other", "first", embed)
    save_file({"lm_head.weight": other}, folder / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    with pytest.raises(LcftError, match="holds an lm_head.weight unlike model.embed_tokens.weight"):
        read_fp32_model(folder)
