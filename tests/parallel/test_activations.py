"""Sequence chunking of a block's token-wise work under block checkpointing: the same loss and gradients as
the plain model, and no sequence-sized MLP intermediate is ever allocated; the recompute attends over the key
blocks its forward selected, and the selector runs once per block."""

from __future__ import annotations

import pytest
import torch

from lcft.errors import LcftError
from lcft.kernels import chunked_cross_entropy, register_selector
from lcft.kernels.selectors import BlockMeanSelector
from lcft.kernels.spec import SparseSpec
from lcft.model import AttentionConfig, Llama, LlamaConfig
from lcft.parallel.activations import DEFAULT_SEQ_CHUNK, apply_activation_checkpointing
from tests.probes import LargestTensor

SPARSE = AttentionConfig(backend="sparse", sparse=SparseSpec(block_size=16, top_k=2, local_blocks=1, sink_blocks=1),
                         impl="cpu")


def model(intermediate: int = 96, **kw) -> Llama:
    torch.manual_seed(0)
    m = Llama(LlamaConfig(vocab_size=16, hidden_size=64, intermediate_size=intermediate, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, **kw))
    with torch.no_grad():  # larger than the 0.02 init so attention patterns matter
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    return m


def loss_and_grads(m: Llama, ids: torch.Tensor, labels: torch.Tensor):
    m.zero_grad(set_to_none=True)
    loss, count = chunked_cross_entropy(m.hidden_states(ids), m.lm_head_weight, labels, chunk=37)
    (loss / count).backward()
    return (loss / count).detach(), {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize("attention", [AttentionConfig(), SPARSE], ids=["dense", "sparse"])
@pytest.mark.parametrize("seq_chunk,offload", [(16, False), (24, False), (24, True)])
def test_chunked_block_equals_plain_model(attention, seq_chunk, offload):
    """Oracle: the same model without checkpointing or chunking (80 tokens: a multiple of 16, not of 24)."""
    m = model(attention=attention)
    ids = torch.randint(0, 16, (2, 80))
    labels = torch.randint(0, 16, (2, 80))
    ref_loss, ref_grads = loss_and_grads(m, ids, labels)
    with torch.no_grad():
        ref_logits = m(ids)
    apply_activation_checkpointing(m, "block", offload=offload, seq_chunk=seq_chunk)
    assert m.seq_chunk == seq_chunk
    loss, grads = loss_and_grads(m, ids, labels)
    assert (loss - ref_loss).abs().item() <= 1e-6
    for name, g in grads.items():
        assert (g - ref_grads[name]).abs().max().item() <= 1e-6, name
    with torch.no_grad():  # without grad the chunks run plainly, still chunk by chunk (1-token rows: gemv)
        torch.testing.assert_close(m(ids), ref_logits, rtol=1e-5, atol=1e-5)  # logits ~3: fp32 rounding


def autocast_loss_and_grads(m: Llama, ids: torch.Tensor, labels: torch.Tensor, enabled: bool = True):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
        return loss_and_grads(m, ids, labels)


def grad_distance(a: dict, b: dict) -> float:
    return torch.sqrt(sum(((a[n] - b[n]) ** 2).sum() for n in a)).item()


def test_bf16_host_copies_keep_the_forward_and_round_only_the_recompute():
    """Under bf16 autocast (the block inputs fp32). Oracles: the plain model, and its gradients in fp32. The
    loss is the plain model's to the bit and an exact host copy changes no gradient (seq_chunk 0: the same
    matmuls); a bf16 copy moves the gradients, by less than bf16 autocast's own rounding moves them from fp32."""
    m = model()
    ids, labels = torch.randint(0, 16, (2, 80)), torch.randint(0, 16, (2, 80))
    fp32_loss, fp32_grads = autocast_loss_and_grads(m, ids, labels, enabled=False)
    ref_loss, ref = autocast_loss_and_grads(m, ids, labels)
    autocast_noise = grad_distance(ref, fp32_grads)
    apply_activation_checkpointing(m, "block", offload=True, seq_chunk=0)
    loss, grads = autocast_loss_and_grads(m, ids, labels)
    assert loss.item() == ref_loss.item() and grad_distance(grads, ref) == 0.0
    apply_activation_checkpointing(m, "block", offload=True, seq_chunk=0, offload_dtype=torch.bfloat16)
    assert m.offload_dtype == torch.bfloat16
    loss, grads = autocast_loss_and_grads(m, ids, labels)
    assert loss.item() == ref_loss.item()  # the forward ran on the input itself
    assert 0 < grad_distance(grads, ref) < autocast_noise, (grad_distance(grads, ref), autocast_noise)
    assert abs(loss.item() - fp32_loss.item()) < 0.05  # and autocast is close to fp32 at all (loss ~3)


@pytest.mark.parametrize("seq_chunk", [0, 16])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_offloaded_block_inputs_are_not_held_by_the_checkpoint(dtype, seq_chunk):
    """Between forward and backward the checkpoint holds only the host copies: in bf16 the fp32 inputs' own
    storage is freed (on CPU an exact copy is the input itself). Before, every input was the checkpoint's
    argument, held until backward (on a GPU: the input back on the device in forward, too)."""
    m = model()
    apply_activation_checkpointing(m, "block", offload=True, seq_chunk=seq_chunk, offload_dtype=dtype)
    seen = []
    hooks = [b.register_forward_pre_hook(lambda _, args: seen.append(args[0].untyped_storage()._weak_ref()))
             for b in m.layers]
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = m.hidden_states(torch.randint(0, 16, (1, 64)))  # (1, 64, H)
        freed = [torch.UntypedStorage._expired(ref) for ref in seen]
        h.float().square().sum().backward()
    finally:
        for hook in hooks:
            hook.remove()
        for ref in seen:
            torch.UntypedStorage._free_weak_ref(ref)
    assert freed == [dtype is not None] * m.config.num_hidden_layers, freed


def largest_tensor(m: Llama, ids: torch.Tensor) -> int:
    with LargestTensor() as mode:
        m.hidden_states(ids).square().sum().backward()
    return mode.numel


def test_chunking_keeps_mlp_intermediates_chunk_sized():
    """The SwiGLU's (B, L, 2I) gate/up product dominates a block's transients; with chunks it is never
    sequence-sized, in forward or in the backward recompute."""
    intermediate, n = 512, 256
    m = model(intermediate=intermediate, attention=SPARSE)  # the dense core's (L, L) scores would dominate
    # The CPU sparse kernel gives each worker thread its own (batch, KV head) rows, so its score scratch
    # grows with the rows per worker: pin two threads (one row each), or a test that left one thread set
    # would make the attention scratch, not the MLP, the largest tensor.
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _check_chunked_mlp(m, n, intermediate)
    finally:
        torch.set_num_threads(threads)


def _check_chunked_mlp(m: Llama, n: int, intermediate: int) -> None:
    ids = torch.randint(0, 16, (1, n))
    apply_activation_checkpointing(m, "block", seq_chunk=0)
    assert largest_tensor(m, ids) >= n * 2 * intermediate
    apply_activation_checkpointing(m, "block", seq_chunk=32)
    # a chunk's gate/up, an (L, hidden) activation or the fused (2I, hidden) weight, all 4x below (L, 2I)
    assert largest_tensor(m, ids) <= max(32 * 2 * intermediate, n * 64, 2 * intermediate * 64)


def test_seq_chunk_is_validated_and_only_applies_to_block_mode():
    m = model()
    apply_activation_checkpointing(m, "block")
    assert m.seq_chunk == DEFAULT_SEQ_CHUNK
    apply_activation_checkpointing(m, "none", seq_chunk=16)
    assert m.seq_chunk == 0
    for bad in (-1, 1.5, True):  # no option sets it: a bug, shown with its traceback
        with pytest.raises(ValueError, match="seq_chunk") as e:
            apply_activation_checkpointing(m, "block", seq_chunk=bad)
        assert not isinstance(e.value, LcftError)


class DriftingSelector:
    """Own block plus one earlier block that changes with every call (call c picks block i-1-c mod i): a
    selector whose recompute would not repeat its forward."""

    calls = 0

    def summarise(self, k: torch.Tensor, spec: SparseSpec) -> torch.Tensor:
        return k.new_zeros(k.shape[0], k.shape[1], k.shape[2] // spec.block_size, 1)  # (B, Hkv, nK, 1)

    def select(self, q: torch.Tensor, summary: torch.Tensor, spec: SparseSpec, q_block_offset: int
               ) -> torch.Tensor:
        c, DriftingSelector.calls = DriftingSelector.calls, DriftingSelector.calls + 1
        own = torch.arange(q_block_offset, q_block_offset + q.shape[2] // spec.block_size)[:, None]  # (nQ, 1)
        back = torch.where(own > 0, own - 1 - c % own.clamp(min=1), -1)  # (nQ, 1): an earlier block, or none
        rows = torch.cat([back, own], dim=1).to(torch.int32)  # (nQ, 2) ascending
        return rows.expand(summary.shape[0], summary.shape[1], -1, -1).contiguous()  # (B, Hkv, nQ, 2)


register_selector("drifting_test", DriftingSelector)


def test_recompute_attends_over_the_blocks_its_forward_selected():
    """Oracle: the plain model, whose backward uses the saved forward; a recompute that selected again would
    get other blocks from this selector and other gradients."""
    spec = SparseSpec(block_size=16, top_k=1, local_blocks=0, sink_blocks=0, selector="drifting_test")
    m = model(attention=AttentionConfig(backend="sparse", sparse=spec, impl="cpu"))
    ids, labels = torch.randint(0, 16, (2, 80)), torch.randint(0, 16, (2, 80))
    DriftingSelector.calls = 0
    ref_loss, ref_grads = loss_and_grads(m, ids, labels)
    apply_activation_checkpointing(m, "block", seq_chunk=32)
    DriftingSelector.calls = 0
    loss, grads = loss_and_grads(m, ids, labels)
    assert DriftingSelector.calls == 2  # one selection per block: none in the recompute
    assert (loss - ref_loss).abs().item() <= 1e-6
    for name, g in grads.items():
        assert (g - ref_grads[name]).abs().max().item() <= 1e-6, name


@pytest.mark.parametrize("offload", [False, True])
def test_block_checkpointing_selects_once_per_block(monkeypatch, offload):
    calls = []
    select = BlockMeanSelector.select
    monkeypatch.setattr(BlockMeanSelector, "select", lambda self, *a: calls.append(1) or select(self, *a))
    m = model(attention=SPARSE)
    apply_activation_checkpointing(m, "block", offload=offload)
    ids = torch.randint(0, 16, (1, 96))
    for step in (1, 2):
        m.hidden_states(ids).square().sum().backward()
        assert len(calls) == step * m.config.num_hidden_layers
