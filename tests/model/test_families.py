"""The five HF families against transformers itself: tiny random models that transformers builds and saves are
loaded by lcft and give the same logits and gradients (fp32); lcft's save loads back in transformers as the
same class; Mistral's sliding window; Mixtral's routing and router loss."""

from __future__ import annotations

import pytest
import torch

from lcft.checkpoint.hf_folder import from_pretrained, save_pretrained
from lcft.kernels import chunked_cross_entropy
from lcft.parallel.activations import apply_activation_checkpointing

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=40, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}

# name -> (transformers config class, model class, extra config fields). head_dim 24: not hidden / heads (16)
# and not a power of two; rope_scaling where the family's published models use it.
CASES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"head_dim": 24, "rope_scaling": LLAMA3, "attention_bias": True}),
    "llama_tied": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": True}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"head_dim": 24, "sliding_window": None}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"rope_scaling": YARN, "tie_word_embeddings": True}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24, "rope_scaling": YARN}),
    "qwen3_tied_bias": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 48, "attention_bias": True,
                                                             "tie_word_embeddings": True}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"head_dim": 24, "num_local_experts": 4,
                                                         "num_experts_per_tok": 2, "sliding_window": None}),
}
L = 48


def build_hf(case: str, tmp_path, seed: int = 0, **extra):
    """A random transformers model of the case, saved to tmp_path/case; weights larger than the default init
    (and non-zero biases and norms) so that every part of the network matters."""
    cfg_cls, model_cls, fields = CASES[case]
    fields = {**BASE, **fields, **extra}
    scaling = fields.pop("rope_scaling", None)
    fields["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "default", **(scaling or {})}
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**fields))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.15 * torch.randn_like(p))
    folder = tmp_path / case
    model.save_pretrained(folder)
    return load_hf(folder), folder


def load_hf(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                             dtype=torch.float32).eval()


def hf_grad(theirs, ours_name: str, model) -> torch.Tensor:
    """transformers' gradient of the parameter lcft calls ours_name (Mixtral keeps experts fused per layer)."""
    params = dict(theirs.named_parameters())
    if ".experts." not in ours_name:
        name = "lm_head.weight" if ours_name == "lm_head.weight" else "model." + ours_name.replace(
            ".attn.", ".self_attn.").replace("attn_norm", "input_layernorm").replace(
            "mlp_norm", "post_attention_layernorm")
        return params[name].grad
    layer, expert, proj = ours_name.split(".")[1], int(ours_name.split(".")[4]), ours_name.split(".")[5]
    inter = model.config.intermediate_size
    if proj == "down_proj":
        return params[f"model.layers.{layer}.mlp.experts.down_proj"].grad[expert]
    fused = params[f"model.layers.{layer}.mlp.experts.gate_up_proj"].grad[expert]  # (2I, H)
    return fused[:inter] if proj == "gate_proj" else fused[inter:]


def our_loss(model, ids: torch.Tensor) -> torch.Tensor:
    labels = torch.cat([ids[:, 1:], torch.full((ids.shape[0], 1), -100)], 1)
    loss_sum, count = chunked_cross_entropy(model.hidden_states(ids), model.lm_head_weight, labels, chunk=32)
    loss = loss_sum / count
    if model.aux_loss is not None:
        loss = loss + model.config.router_aux_loss_coef * model.aux_loss
    return loss


def assert_grads_equal(ours, theirs) -> None:
    for name, p in ours.named_parameters():
        g = hf_grad(theirs, name, ours)
        assert g is not None, name
        assert (p.grad - g).abs().max().item() < 1e-4 * max(1.0, g.abs().max().item()), name


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_gradients_equal_transformers(tmp_path, case):
    theirs, folder = build_hf(case, tmp_path)
    ours = from_pretrained(folder).eval()
    ids = torch.randint(0, BASE["vocab_size"], (2, L))
    with torch.no_grad():
        a, b = ours(ids), theirs(ids).logits
    assert a.std() > 0.1 and (a - b).abs().max().item() < 1e-4

    theirs.train()
    theirs(input_ids=ids, labels=ids).loss.backward()
    our_loss(ours.train(), ids).backward()
    assert_grads_equal(ours, theirs)

    # lcft's save loads back in transformers as the same class, with the same logits
    save_pretrained(ours, tmp_path / "ours")
    back = load_hf(tmp_path / "ours")
    assert type(back) is type(theirs)
    with torch.no_grad():
        assert (back(ids).logits - b).abs().max().item() < 1e-4


def test_mistral_sliding_window_shorter_than_the_sequence(tmp_path):
    """Window 100 over 1300 tokens: two query chunks of the masked path, each reaching back into the previous."""
    theirs, folder = build_hf("mistral", tmp_path, sliding_window=100, max_position_embeddings=2048)
    ours = from_pretrained(folder).eval()
    assert ours.config.sliding_window == 100
    ids = torch.randint(0, BASE["vocab_size"], (1, 1300))
    with torch.no_grad():
        a, b = ours(ids), theirs(ids).logits
        full = transformers.MistralForCausalLM.from_pretrained(folder, sliding_window=None,
                                                               attn_implementation="eager")(ids).logits
    assert (a - b).abs().max().item() < 1e-4
    assert (full - b)[:, 200:].abs().max().item() > 1e-2  # the window changes the numbers


def routed_experts(model, ids, hf: bool) -> list[torch.Tensor]:
    """Per layer, the (N, k) experts each token was sent to, sorted along k."""
    chosen: list[torch.Tensor] = []
    layers = model.model.layers if hf else model.layers
    for layer in layers:
        if hf:
            layer.mlp.gate.register_forward_hook(lambda m, i, o: chosen.append(o[2].sort(-1).values))
        else:
            layer.mlp.register_forward_hook(lambda m, i, o: chosen.append(
                m.route(i[0].reshape(-1, i[0].shape[-1]))[1].sort(-1).values))
    with torch.no_grad():
        model(ids)
    return chosen


def test_mixtral_routing_and_router_loss_equal_transformers(tmp_path):
    theirs, folder = build_hf("mixtral", tmp_path, output_router_logits=True, router_aux_loss_coef=0.02)
    ours = from_pretrained(folder)
    assert ours.config.output_router_logits and ours.config.router_aux_loss_coef == 0.02
    ids = torch.randint(0, BASE["vocab_size"], (2, L))
    for a, b in zip(routed_experts(ours, ids, hf=False), routed_experts(theirs, ids, hf=True), strict=True):
        assert torch.equal(a, b)
        assert len(a.unique()) > 1  # more than one expert in use

    ours, theirs = from_pretrained(folder), load_hf(folder).train()  # fresh, without hooks
    out = theirs(input_ids=ids, labels=ids)
    out.loss.backward()
    loss = our_loss(ours.train(), ids)
    assert abs(ours.aux_loss.item() - out.aux_loss.item()) < 1e-5 and ours.aux_loss.item() > 1.0
    assert abs(loss.item() - out.loss.item()) < 1e-5
    loss.backward()
    assert_grads_equal(ours, theirs)
    assert ours.layers[0].mlp.gate.weight.grad.abs().max() > 0


def test_mixtral_under_block_checkpointing_and_seq_chunk_is_the_same(tmp_path):
    """MoE blocks (router statistics included) give the same loss and gradients chunked and checkpointed."""
    _, folder = build_hf("mixtral", tmp_path, output_router_logits=True)
    ids = torch.randint(0, BASE["vocab_size"], (1, L))
    grads = []
    for mode, chunk in (("none", 0), ("block", 16)):
        model = from_pretrained(folder)
        apply_activation_checkpointing(model, mode, seq_chunk=chunk)
        our_loss(model, ids).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scaling", [{"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16},
                                     {"rope_type": "yarn", "factor": 4.0}], ids=["llama3", "yarn"])
def test_rope_scaling_as_the_command_line_gives_it_exports_loadable(tmp_path, scaling):
    """`--rope-scaling llama3:8:16` names no frequency factors: the export spells out the defaults lcft used,
    so transformers loads it and computes the same logits."""
    from lcft.model import Llama, LlamaConfig

    torch.manual_seed(0)
    ours = Llama(LlamaConfig(**{**BASE, "model_type": "qwen3", "qk_norm": True, "head_dim": 24},
                             rope_scaling=scaling)).eval()
    save_pretrained(ours, tmp_path / "m")
    ids = torch.randint(0, BASE["vocab_size"], (1, L))
    with torch.no_grad():
        assert (load_hf(tmp_path / "m")(ids).logits - ours(ids)).abs().max().item() < 1e-4


def test_the_model_types_a_config_takes_are_the_families_of_the_hf_table():
    """LlamaConfig's model_type choices (a Literal, for the one choice check) and the HF table's families name the
    same five: a family added to one only would load but not export, or the other way round."""
    import typing

    from lcft.model.config import ModelType
    from lcft.model.hf_families import BY_TYPE

    assert sorted(typing.get_args(ModelType)) == sorted(BY_TYPE)
