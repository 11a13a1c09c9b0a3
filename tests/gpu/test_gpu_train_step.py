"""On a CUDA GPU: one training step with sparse attention (Triton) equals the CPU implementation's on the batch."""

from __future__ import annotations

import pytest
import torch

import lcft.model as lm
from lcft.kernels import SparseSpec, chunked_cross_entropy
from lcft.parallel.activations import apply_activation_checkpointing

pytestmark = pytest.mark.gpu


def _step(device: str, impl: str) -> tuple[float, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    spec = SparseSpec(block_size=64, top_k=4, local_blocks=1, sink_blocks=1)
    cfg = lm.LlamaConfig(vocab_size=16, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, rope_theta=1e6,
                         attention=lm.AttentionConfig(backend="sparse", impl=impl, sparse=spec))
    model = lm.Llama(cfg).to(device)
    apply_activation_checkpointing(model, "block")
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 8, (1, 4096), generator=gen).to(device)
    labels = torch.cat([ids[:, 1:], torch.full((1, 1), -100, device=device)], 1)
    loss_sum, count = chunked_cross_entropy(model.hidden_states(ids), model.lm_head_weight, labels)
    loss = loss_sum / count
    loss.backward()
    return loss.item(), {n: p.grad.cpu() for n, p in model.named_parameters()}


def test_sparse_train_step_on_gpu_equals_cpu():
    loss_gpu, grads_gpu = _step("cuda", "triton")
    loss_cpu, grads_cpu = _step("cpu", "cpu")
    assert abs(loss_gpu - loss_cpu) <= 1e-4 * abs(loss_cpu)
    for name, g in grads_cpu.items():
        err = ((grads_gpu[name] - g).abs().max() / g.abs().max().clamp(min=1e-8)).item()
        assert err <= 1e-3, f"{name}: relative grad error {err:.2e}"
