"""gpu_check.py's timed training step: one step of a preset at a length, its tokens/s, MFU and peak memory."""

from __future__ import annotations

import json
import time

from gpu_check_table import GIB

# Dense bf16 tensor-core peak, FLOP/s, by device-name fragment, the first that matches (MFU denominator): NVIDIA's
# data sheets halve their with-sparsity figures (H200 NVL 1,671 -> 835; H100 PCIe 1,513 -> 756; SXM 1,979 -> 989).
# H100 NVL: 1,671 -> 835, matched before the plain H100 (SXM) it would otherwise take.
PEAK_BF16 = {"H200 NVL": 835e12, "H100 NVL": 835e12, "H100 PCIe": 756e12, "H200": 989e12, "H100": 989e12, "A100": 312e12,
             "B200": 2250e12, "L40S": 362e12, "4090": 165e12}


def peak_bf16(device_name: str) -> float | None:
    """The dense bf16 peak, FLOP/s, of the first PEAK_BF16 fragment in `device_name`; None for a GPU not listed."""
    return next((v for fragment, v in PEAK_BF16.items() if fragment in device_name), None)


def bench_train(length: int, checkpointing: str = "block", offload: bool = False, warmup: bool = True,
                device: str = "cuda", preset: str = "1b", offload_bf16: bool = False) -> dict:
    """A `preset` step (sparse attention, chunked CE, bf16 autocast, AdamW): time, tokens/s, MFU, peak memory.
    With warmup, the second step is timed; without it the first (the optimizer state's allocation included).
    offload_bf16: the offloaded block inputs in bf16 (`--offload-bf16`)."""
    import torch
    from attention_gpu import FLOPS_PER_PAIR, sparse_pairs

    import lcft.model as lm
    from lcft.kernels import SparseSpec, chunked_cross_entropy
    from lcft.parallel.activations import apply_activation_checkpointing
    from lcft.train.memory import expandable_cuda_segments, return_freed_buffers_to_os
    from lcft.train.metrics import peak_memory_bytes

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cfg = lm.preset(preset)
    cfg.vocab_size = 16
    cfg.attention = lm.AttentionConfig(backend="sparse", sparse=SparseSpec(block_size=128, top_k=16))
    torch.manual_seed(0)
    model = lm.Llama(cfg).to(device)
    return_freed_buffers_to_os(length)  # the allocators as `lcft train` sets them for this window
    expandable_cuda_segments(length)
    apply_activation_checkpointing(model, checkpointing, offload=offload,
                                   offload_dtype=torch.bfloat16 if offload_bf16 else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    ids = torch.randint(4, 8, (1, length), device=device)
    labels = torch.cat([ids[:, 1:], torch.full((1, 1), -100, device=device)], 1)

    def step() -> tuple[float, float]:
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss_sum, count = chunked_cross_entropy(model.hidden_states(ids), model.lm_head_weight, labels)
        loss = loss_sum / count
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - t0, loss.item()

    if warmup:
        step()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    seconds, loss = step()
    n_params = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n)
    heads, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    attn = FLOPS_PER_PAIR * cfg.num_hidden_layers * heads * d * sparse_pairs(length, 128, cfg.attention.sparse.budget)
    peak = peak_bf16(torch.cuda.get_device_name() if cuda else "cpu")
    row = {"length": length, "preset": preset, "step_s": seconds, "tokens_per_s": length / seconds, "loss": loss,
           "offload": ("bf16" if model.offload_dtype == torch.bfloat16 else "exact") if model.offload else "none",
           "finite": loss == loss and abs(loss) != float("inf"),
           "mfu": (6 * n_params * length + attn) / seconds / peak if peak else None,
           "peak_gib": peak_memory_bytes(torch.device(device)) / GIB}
    print(json.dumps(row), flush=True)
    return row
