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
