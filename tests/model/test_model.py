"""The decoder itself: presets, positions (offset, any order, KV prefix), activation checkpointing and
offload, and the attention backends (sparse equals dense when every block is in the budget)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lcft.errors import LcftError
from lcft.kernels import chunked_cross_entropy
from lcft.kernels.spec import SparseSpec
from lcft.model import PRESETS, AttentionConfig, Llama, LlamaConfig, preset
from lcft.model.attention import DenseCore, SparseCore
from lcft.parallel.activations import apply_activation_checkpointing


def cfg(**kw) -> LlamaConfig:
    base = dict(vocab_size=16, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, rope_theta=10000.0)
    return LlamaConfig(**{**base, **kw})


def model(seed: int = 0, **kw) -> Llama:
    torch.manual_seed(seed)
    m = Llama(cfg(**kw))
    with torch.no_grad():  # larger than the 0.02 init so attention patterns (and positions) matter
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    return m


def test_presets_shapes_and_sizes():
    counts = {}
    for name in PRESETS:
        with torch.device("meta"):  # count without allocating 1B parameters
            counts[name] = Llama(preset(name)).num_parameters()
    tiny = preset("tiny")
    assert (tiny.hidden_size, tiny.num_hidden_layers, tiny.num_attention_heads, tiny.num_key_value_heads,
            tiny.intermediate_size, tiny.vocab_size) == (256, 4, 4, 4, 704, 16)
    assert 3.0e6 < counts["tiny"] < 3.4e6
    assert 22e6 < counts["small"] < 28e6
    assert 130e6 < counts["base"] < 170e6
    assert 0.9e9 < counts["1b"] < 1.1e9
    assert all(PRESETS[n].num_key_value_heads < PRESETS[n].num_attention_heads for n in ("small", "base", "1b"))
    preset("tiny").hidden_size = 1  # a copy: the registry is untouched
    assert PRESETS["tiny"].hidden_size == 256
    with pytest.raises(LcftError, match="unknown model preset"):
        preset("huge")


@pytest.mark.parametrize("kw", [{}, {"tie_word_embeddings": True}, {"num_hidden_layers": 5},
                                {"model_type": "qwen3", "qk_norm": True, "attention_bias": True, "o_proj_bias": True},
                                {"model_type": "mixtral", "num_local_experts": 3, "num_experts_per_tok": 2}])
def test_parameter_shapes_are_the_models_own(kw):
    """What a config implies, learned from a one-block template, against the model built whole: names, shapes,
    order."""
    from lcft.model.llama import parameter_shapes

    with torch.device("meta"):
        built = Llama(cfg(**kw))
    assert list(parameter_shapes(cfg(**kw)).items()) == [(n, tuple(p.shape)) for n, p in built.named_parameters()]


def test_shapes_tied_head_and_input_dtypes():
    m = model(tie_word_embeddings=True)
    ids = torch.randint(0, 16, (3, 40))
    logits, hidden = m(ids), m.hidden_states(ids)
    assert logits.shape == (3, 40, 16) and hidden.shape == (3, 40, 64)
    assert m.lm_head is None and m.lm_head_weight is m.embed_tokens.weight
    torch.testing.assert_close(logits, hidden @ m.embed_tokens.weight.T)
    torch.testing.assert_close(m(ids.to(torch.uint8)), logits)  # windows are read as uint8 arrays
    assert model().lm_head_weight is not model().embed_tokens.weight
    with pytest.raises(LcftError, match="not a multiple"):
        cfg(num_key_value_heads=3)


def test_position_ids_forms_are_equivalent():
    m = model().eval()
    ids = torch.randint(0, 16, (2, 48))
    ref = m(ids, position_ids=torch.arange(100, 148))
    torch.testing.assert_close(m(ids, position_offset=100), ref)
    torch.testing.assert_close(m(ids, position_ids=torch.arange(100, 148).expand(2, 48)), ref)
    # RoPE is relative: a uniform shift changes nothing but rounding; other spacings do change the output
    torch.testing.assert_close(m(ids), ref, rtol=1e-4, atol=1e-4)
    assert (m(ids, position_ids=torch.arange(48) * 3) - ref).abs().max() > 1e-2
    with pytest.raises(ValueError):
        m(ids, position_ids=torch.arange(48), position_offset=3)


class RecordingCore(nn.Module):
    """Dense causal attention that keeps its (rotated) keys and values, as a KV prefix for the next shard."""

    def forward(self, q, k, v):
        self.k, self.v = k, v
        return DenseCore()(q, k, v)


class PrefixCore(nn.Module):
    """Causal attention of the current tokens over a given KV prefix (all visible) plus themselves (causal):
    what a context-parallel rank computes for a later shard."""

    def __init__(self, k_prefix: torch.Tensor, v_prefix: torch.Tensor) -> None:
        super().__init__()
        self.k_prefix, self.v_prefix = k_prefix, v_prefix

    def forward(self, q, k, v):
        n, p = q.shape[2], self.k_prefix.shape[2]
        keys, values = torch.cat([self.k_prefix, k], 2), torch.cat([self.v_prefix, v], 2)  # (B, Hkv, P+L, D)
        mask = torch.ones(n, p + n, dtype=torch.bool).tril(p)  # (L, P+L): whole prefix + causal part
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)


class PositionMaskCore(nn.Module):
    """Causal attention by global position rather than token order (the oracle for any-order shards)."""

    def __init__(self, positions: torch.Tensor) -> None:
        super().__init__()
        self.positions = positions

    def forward(self, q, k, v):
        mask = self.positions[None, :] <= self.positions[:, None]  # (L, L) key position <= query position
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def set_cores(m: Llama, make) -> None:
    for i, block in enumerate(m.layers):
        block.attn.core = make(i)


def test_two_halves_with_offset_and_kv_prefix_match_one_full_run():
    m = model(tie_word_embeddings=True).eval()
    ids = torch.randint(0, 16, (2, 96))
    with torch.no_grad():
        full = m(ids)
        set_cores(m, lambda i: RecordingCore())
        first = m(ids[:, :40])
        prefix = [(b.attn.core.k, b.attn.core.v) for b in m.layers]
        set_cores(m, lambda i: PrefixCore(*prefix[i]))
        second = m(ids[:, 40:], position_offset=40)
        second_ids = m(ids[:, 40:], position_ids=torch.arange(40, 96))
        wrong = m(ids[:, 40:])  # the second half at positions 0.. : must not match
    torch.testing.assert_close(torch.cat([first, second], 1), full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(second_ids, second)
    assert (wrong - full[:, 40:]).abs().max() > 1e-2


def test_any_order_positions_zigzag_shard_order():
    """Tokens fed in zigzag chunk order (0, 3 | 1, 2) with their global positions give the full run's logits."""
    m = model().eval()
    ids = torch.randint(0, 16, (1, 64))
    order = torch.cat([torch.arange(0, 16), torch.arange(48, 64), torch.arange(16, 32), torch.arange(32, 48)])
    with torch.no_grad():
        full = m(ids)
        set_cores(m, lambda i: PositionMaskCore(order))
        shuffled = m(ids[:, order], position_ids=order)
    torch.testing.assert_close(shuffled, full[:, order], rtol=1e-5, atol=1e-5)


def loss_and_grads(m: Llama, ids: torch.Tensor, labels: torch.Tensor):
    m.zero_grad(set_to_none=True)
    loss, count = chunked_cross_entropy(m.hidden_states(ids), m.lm_head_weight, labels, chunk=37)
    (loss / count).backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize("mode,offload", [("block", False), ("block", True), ("none", True)])
def test_checkpointing_and_offload_change_no_number(mode, offload):
    m = model()
    ids = torch.randint(0, 16, (2, 80))
    labels = torch.randint(0, 16, (2, 80))
    ref_loss, ref_grads = loss_and_grads(m, ids, labels)
    apply_activation_checkpointing(m, mode, offload=offload)
    loss, grads = loss_and_grads(m, ids, labels)
    assert (m.checkpointing, m.offload) == (mode, offload)
    assert (loss - ref_loss).abs().item() <= 1e-6
    for name, g in grads.items():
        assert (g - ref_grads[name]).abs().max().item() <= 1e-6, name


def test_block_checkpointing_keeps_only_block_inputs():
    """Bytes autograd saves outside the checkpointed blocks shrink (the blocks' own saves are recomputed)."""
    m = model()
    ids = torch.randint(0, 16, (1, 256))

    def saved_bytes() -> int:
        total = [0]

        def pack(t):
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            m.hidden_states(ids).sum()
        return total[0]

    plain = saved_bytes()
    apply_activation_checkpointing(m, "block")
    assert saved_bytes() < plain / 3
    with pytest.raises(ValueError, match="checkpointing mode"):  # an internal contract: the config coerces it
        apply_activation_checkpointing(m, "layer")


def test_sparse_backend_equals_dense_when_every_block_fits_the_budget():
    dense = model().eval()
    spec = SparseSpec(block_size=16, top_k=2, local_blocks=1, sink_blocks=1)
    sparse = Llama(cfg(attention=AttentionConfig(backend="sparse", sparse=spec, impl="cpu"))).eval()
    sparse.load_state_dict(dense.state_dict())
    assert isinstance(sparse.layers[0].attn.core, SparseCore)
    ids = torch.randint(0, 16, (2, 64))  # 4 blocks <= budget 2 + 1 + 1 + 1
    with torch.no_grad():
        torch.testing.assert_close(sparse(ids), dense(ids), rtol=1e-5, atol=1e-5)
        long_ids = torch.randint(0, 16, (1, 160))  # 10 blocks > budget: some blocks are skipped
        assert (sparse(long_ids) - dense(long_ids)).abs().max() > 1e-4



def test_qk_norm_under_bf16_autocast_equals_dense_with_sparse_attention():
    """Qwen3's q/k norms under bf16 autocast over fp32 weights: the sparse core gets q, k and v in one dtype and,
    with every block in the budget, gives dense attention's loss and gradients (SDPA casts to bf16 itself)."""
    dense = model(qk_norm=True)
    spec = SparseSpec(block_size=16, top_k=2, local_blocks=1, sink_blocks=1)
    sparse = Llama(cfg(qk_norm=True, attention=AttentionConfig(backend="sparse", sparse=spec, impl="cpu")))
    sparse.load_state_dict(dense.state_dict())
    ids = torch.randint(0, 16, (2, 64))  # 4 blocks <= budget
    losses, grads = [], []
    for m in (dense, sparse):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, count = chunked_cross_entropy(m.hidden_states(ids), m.lm_head_weight, ids)
        (loss / count).backward()
        losses.append(loss / count)
        grads.append(m.layers[0].attn.q_proj.weight.grad)
    torch.testing.assert_close(losses[1], losses[0], rtol=2e-2, atol=0)
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=2e-2 * grads[0].abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_flash_attn_is_never_asked_to_run_on_the_cpu(monkeypatch, dtype):
    """Both attention cores ask one helper whether flash-attn may run: never for a CPU tensor (it has no CPU
    kernels), even where the package imports; a float32 tensor never either."""
    from lcft.model import layers

    monkeypatch.setattr(layers, "flash_attn_func", lambda: (lambda *a, **k: pytest.fail("flash-attn called")))
    assert layers.flash_attn_for(torch.zeros(1, 1, 4, 8, dtype=dtype)) is None
    q = torch.randn(1, 2, 8, 4, dtype=dtype)
    assert torch.equal(DenseCore()(q, q, q), F.scaled_dot_product_attention(q, q, q, is_causal=True))
