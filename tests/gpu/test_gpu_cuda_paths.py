"""On a CUDA GPU: the CUDA-only branches of lcft (docs/cuda.md) against their CPU counterparts."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

import lcft.model as lm
from lcft.checkpoint.state import rng_state, set_rng_state
from lcft.model.attention import DenseCore
from lcft.parallel.activations import apply_activation_checkpointing
from lcft.train.memory import ALLOC_CONF_VARS, expandable_cuda_segments
from lcft.train.metrics import peak_memory_bytes

pytestmark = pytest.mark.gpu


def test_dense_core_bf16_gqa_on_cuda_equals_fp32_sdpa():
    """flash-attn (when installed) or SDPA with GQA in bf16 vs SDPA with repeated K/V heads in fp32 on CPU."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 2048, 64, generator=gen) for h in (8, 2, 2))
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), is_causal=True)
    got = DenseCore()(*(t.cuda().bfloat16() for t in (q, k, v))).float().cpu()
    assert (got - want).abs().max().item() < 2e-2


def test_offloaded_block_inputs_pinned_on_cuda_give_the_same_gradients():
    cfg = lm.LlamaConfig(vocab_size=16, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    ids = torch.randint(4, 8, (1, 512), device="cuda")
    grads = []
    for offload in (False, True):
        torch.manual_seed(0)
        model = lm.Llama(cfg).cuda()
        apply_activation_checkpointing(model, "none", offload=offload)  # offload: save_on_cpu(pin_memory=True)
        model(ids).float().pow(2).mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["exact", "bf16"])
def test_block_inputs_offloaded_from_cuda_leave_the_device(dtype):
    """Block checkpointing under bf16 autocast, the block inputs (fp32) offloaded or not: between forward and
    backward the device holds N x L x H x 4 B less with them offloaded, and the gradients are those of the run that
    kept them (an exact host copy: the same recompute; a bf16 one: its rounding)."""
    cfg = lm.LlamaConfig(vocab_size=16, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2)
    ids = torch.randint(4, 8, (1, 4096), device="cuda")
    held, grads = [], []
    for offload in (False, True):
        torch.manual_seed(0)
        model = lm.Llama(cfg).cuda()
        apply_activation_checkpointing(model, "block", offload=offload, offload_dtype=dtype if offload else None)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids)  # (1, L, V)
        held.append(torch.cuda.memory_allocated() - before)
        logits.float().pow(2).mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        del model, logits
    inputs = cfg.num_hidden_layers * ids.numel() * cfg.hidden_size * 4
    assert held[0] - held[1] >= 0.9 * inputs, (held, inputs)
    distance = ((grads[1] - grads[0]).norm() / grads[0].norm()).item()
    assert distance < (1e-3 if dtype is None else 5e-2), distance


def test_cuda_peak_memory_counts_an_allocation():
    torch.cuda.reset_peak_memory_stats()
    before = peak_memory_bytes(torch.device("cuda"))
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    assert peak_memory_bytes(torch.device("cuda")) >= before + x.numel()


def test_cuda_rng_state_round_trips():
    state = rng_state()
    a = torch.randn(4, device="cuda")
    set_rng_state(state)
    assert torch.equal(torch.randn(4, device="cuda"), a)


def test_expandable_segments_applied_for_long_windows():
    user_set = any("expandable_segments" in os.environ.get(k, "") for k in ALLOC_CONF_VARS)
    assert expandable_cuda_segments(1 << 20) is not user_set


def test_the_process_group_reduces_cpu_and_cuda_tensors(tmp_path):
    """The run's group on a CUDA node (NCCL with gloo beside it) takes the trainer's CPU counters and CUDA
    tensors alike, and its mesh is a CUDA mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from lcft.parallel.mesh import group_backend, mesh_device_type

    dist.init_process_group(group_backend(), init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        for t in (torch.ones(3, dtype=torch.float64), torch.ones(3, device="cuda")):
            dist.all_reduce(t)
            assert t.tolist() == [1.0, 1.0, 1.0]
        assert mesh_device_type() == "cuda"
        assert init_device_mesh(mesh_device_type(), (1, 1), mesh_dim_names=("dp", "cp")).device_type == "cuda"
    finally:
        dist.destroy_process_group()


def test_auto_precision_is_bf16_on_a_gpu_with_bf16_tensor_cores():
    from lcft.train.precision import choose_precision

    native = torch.cuda.get_device_capability() >= (8, 0)
    assert choose_precision("auto", cpu=False) == ("bf16" if native else "fp32", None)


_PRIMARY_CONTEXT = """
import ctypes, sys
import torch
from lcft.evaluate.runner import _rank_device, device_kind

def active():  # whether GPU 0's primary context exists (the driver API: what a context holds is the GPU's memory)
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, flags, on = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(on)) == 0
    return on.value

name = device_kind(_rank_device("auto", 0))
before = active()
torch.zeros(1, device="cuda")
print(name, before, active())
"""


def test_the_launchers_device_lookup_creates_no_cuda_context():
    """A launched rerun's launcher looks up its ranks' devices and the first one's kind before any rank starts
    (`finished_before_launch`) and then waits for the ranks: a CUDA context made there would hold memory on GPU 0
    for the whole launch. Checked in a fresh interpreter against the driver's own record of GPU 0's primary context,
    which the first tensor on the GPU does create (so the check can see one)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _PRIMARY_CONTEXT], capture_output=True, text=True, check=True)
    name, before, after = out.stdout.rsplit(maxsplit=2)
    assert name == torch.cuda.get_device_name(0) and (before, after) == ("0", "1"), out.stdout
