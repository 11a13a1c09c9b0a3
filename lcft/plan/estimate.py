"""Per-rank memory of a training layout, from the model config and the layout alone (formulas: docs/plan.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lcft.kernels.sparse_blocks import chunk_size
from lcft.model.config import LlamaConfig
from lcft.parallel.activations import DEFAULT_SEQ_CHUNK
from lcft.parallel.config import Checkpointing, CpKv, Precision, Shard
from lcft.parallel.cp_stream import piece_count
from lcft.plan.config import PlanDevice
from lcft.plan.shape import Shape
from lcft.train.memory import LONG_WINDOW

GIB = 1 << 30
CUDA_RUNTIME = 1 * GIB
"""Assumed, not measurable without a GPU: the CUDA context with the kernels' module images (about 0.5 GiB on
recent drivers), cuBLAS and Triton workspaces, per GPU process."""
CUDA_NCCL = 512 << 20
"""Assumed: NCCL's communicator buffers of a rank of a multi-GPU run (4 MiB per channel and direction, up to 32
channels, ring and tree peers)."""
HOST_PROCESS = 4 * GIB
"""Assumed, not measurable without a GPU: the host memory of one CUDA training process beside what it offloads
(the interpreter, torch and the CUDA libraries it maps, the data windows, the checkpointer's staging)."""
CUDA_MARGIN = 0.10
"""Assumed safety margin on CUDA: the caching allocator's rounding and fragmentation (2 MiB / 20 MiB segments;
expandable segments from 64K tokens, lcft.train.memory), as a fraction of what a step allocates and frees again
(activations, K/V, transient)."""
CPU_RUNTIME = 128 << 20
"""Allocator, autograd and oneDNN working memory of a CPU training process beyond its tensors and beyond the
imports (measured at 512-2K tokens on the tiny preset; benchmarks/plan.py)."""
CPU_PROCESS_GROUP = 64 << 20
"""A CPU rank of a multi-process run: torch.distributed, gloo and the launcher's state (measured: DDP on 2
ranks against one process at 4K tokens, tiny preset)."""
CPU_THREAD_SHARE = 0.1
"""Below LONG_WINDOW tokens, what each compute thread of a CPU process beyond its first adds, as a share of the
block transient: glibc's per-thread malloc arena keeps what that thread's share of the block's matmuls and attention
workers freed (measured, second step, 2 threads against 1 on an idle machine: tiny at 2K +6 MiB, tiny at 16K -38
to +2 MiB, small at 16K +21 to +120 MiB, against transients of 70, 570 and 1,190 MiB; from LONG_WINDOW on, the
fixed mmap threshold returns those buffers)."""
CPU_LONG_TRANSIENT = 0.5
"""From LONG_WINDOW tokens on, the share of the formula's block transient and cp K/V a CPU step's peak holds: the
fixed mmap threshold (lcft.train.memory) hands each freed whole-length buffer back at once, so the recompute's,
the gradients' and the gathered K/V's buffers are not all resident together (measured 0.41-0.49, tiny preset at
64K tokens, one rank, fsdp and cp on 2 ranks; 0.5 keeps the plan above the measurement)."""
CPU_LONG_TRANSIENT_CP = 0.25
"""CPU_LONG_TRANSIENT under cp > 1: what the last block's backward holds of the transient and the gathered K/V
under cp is less than on one rank (measured, second step: tiny and small presets at 64K on cp 2, each 1.25 x
its peak with 0.5, 1.00 and 1.08 with 0.25; the cause within that backward is not isolated)."""
CPU_LONG_GROWTH = 1 / 6
"""CPU_LONG_TRANSIENT grows with the window as (tokens / LONG_WINDOW) ** this, capped at 1: tiny preset on one
rank, second step, needs 0.46 at 64K, 0.63 at 256K (0.5 x 4 ** (1/6) = 0.63), 0.67 at 512K (0.71 planned: 1.03 x
the measurement) and 0.68 at 1M (0.79: 1.08). Fitted to the 256K case; the growth slows beyond it, so the
formula errs on the safe side there."""
CPU_LONG_GROWTH_CP = 1 / 2
"""CPU_LONG_TRANSIENT_CP grows as (tokens / LONG_WINDOW) ** this, up to CPU_LONG_CAP_CP: tiny preset on cp 2,
second step, needs 0.25 at 64K and 0.52 at 256K (0.25 x 4 ** (1/2) = 0.5; with the one-rank growth, 0.31, the
plan was 0.80 of the measurement)."""
CPU_LONG_CAP_CP = 0.6
"""Where the share under cp stops growing: tiny on cp 2 needs 0.52 at 256K and 0.56 at 512K (the growth alone gave
0.71 there, 1.14 x the measurement). The share likely approaches a constant: every term of the transient but the
loss's and the seq_chunk's fixed-size buffers grows with the window, so what of it is live at the peak tends to a
fixed fraction. The cap is fitted to the 512K case; from 1M on cp 2 it is an extrapolation."""


def long_share(lay: Layout) -> float:
    """The share of the block transient and cp K/V a CPU step's peak holds from LONG_WINDOW tokens on."""
    base, growth, cap = ((CPU_LONG_TRANSIENT_CP, CPU_LONG_GROWTH_CP, CPU_LONG_CAP_CP) if lay.cp > 1
                         else (CPU_LONG_TRANSIENT, CPU_LONG_GROWTH, 1.0))
    return min(cap, base * (lay.seq_len / LONG_WINDOW) ** growth)


CPU_FSDP_HEAP_COPIES = 4
"""Below LONG_WINDOW tokens, the unsharded fp32 copies of the whole model an fsdp CPU rank's heap keeps after
they are freed block by block: the parameters all-gathered in forward and again in backward, the unsharded
gradients before their reduce-scatter, and gloo's staging copies (measured: small preset at 16K on 2 ranks,
354 MiB above the plan without them = 3.7 x 4 B x P)."""
CPU_LATER_STEP = 1
"""Below LONG_WINDOW tokens, what a later step's peak holds beyond the other terms, in fp32 copies of the (local)
parameters: fitted, cause not isolated (the heap as the first optimizer step leaves it; AdamW on CPU updates one
parameter at a time, so its own temporaries are one parameter's). The plan describes a later step: the first
one peaks in its backward, before AdamW's moments exist. Measured (benchmarks/plan.py, second step): small preset
at 16K on one rank 132 MiB = 1.4 x 4 B x P above the plan without this term, 244 MiB above its own first step."""
CPU_SPARSE_KERNEL = 96 << 20
"""Working memory of the chunked CPU attention kernel (the sparse backend, and every core under cp > 1) in
backward beyond q, k, v and their gradients: measured 64-163 MiB at 4K-16K keys, tiny preset's heads, sparse
selection; at least its chunk buffers (cpu_kernel_bytes), which outgrow it where every key block is read."""
GLIBC_MMAP_CEILING = 32 << 20
"""glibc's highest adaptive mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX, 64-bit). Below LONG_WINDOW, where the
trainer leaves the threshold adaptive, a freed buffer under this size stays in the heap; a larger one is mmapped
and goes back to the OS when freed."""


@dataclass(frozen=True)
class Layout:
    """How one run is spread over ranks, and the options that change its memory."""

    seq_len: int
    world: int = 1
    cp: int = 1
    micro_batch: int = 1
    shard: Shard = "none"
    offload_params: bool = False
    checkpointing: Checkpointing = "none"
    offload_activations: bool = False
    offload_bf16: bool = False  # the offloaded block inputs kept in bf16
    seq_chunk: int = DEFAULT_SEQ_CHUNK
    cp_kv: CpKv = "all"
    precision: Precision = "bf16"
    device: PlanDevice = "cuda"
    loss_chunk: int = 8192
    threads: int = 1  # compute threads per process (CPU)
    sharded_source: bool = False  # the weights come from a sharded (DCP) checkpoint

    @property
    def bf16_copies(self) -> bool:
        """Whether the block inputs are offloaded in bf16 (offload_bf16 means nothing without the offload)."""
        return self.offload_activations and self.offload_bf16

    @property
    def local_tokens(self) -> int:
        """Tokens of one sequence this rank holds: seq_len / cp."""
        return self.seq_len // self.cp


@dataclass(frozen=True)
class Estimate:
    """Bytes per rank on the device, by what holds them; `host` = what offloading moved to CPU memory, `load` =
    the host memory a CUDA rank holds while it reads its weights, before the first step (freed by then)."""

    parameters: int
    gradients: int
    optimizer: int
    weight_copies: int
    activations: int
    kv: int
    transient: int
    runtime: int
    host: int
    margin: int = 0
    load: int = 0

    @property
    def total(self) -> int:
        return (self.parameters + self.gradients + self.optimizer + self.weight_copies + self.activations
                + self.kv + self.transient + self.runtime + self.margin)

    def rows(self) -> list[tuple[str, int]]:
        """(label, bytes) in the order a report shows them."""
        names = ("parameters", "gradients", "optimizer", "weight_copies", "activations", "kv", "transient",
                 "runtime", "margin")
        return [(n, getattr(self, n)) for n in names]


def compute_bytes(precision: str) -> int:
    """Bytes of an activation in the compute dtype: 2 in bf16, 4 in fp32."""
    return 2 if precision == "bf16" else 4


def residual_bytes(lay: Layout) -> int:
    """Bytes per value of the residual stream (the embedding output, every block's input and the residual inside
    it, the final norm): fp32 under bf16 autocast over fp32 weights, as in transformers (one GPU, DDP, every CPU
    run: the norms' fp32 gains promote); bf16 only where FSDP2 computes with bf16 parameters (bf16 on CUDA under
    fsdp, which also casts each block's input)."""
    return 2 if lay.precision == "bf16" and lay.shard == "fsdp" and lay.device == "cuda" else 4


def casts_weights(lay: Layout) -> bool:
    """bf16 autocast over fp32 weights (not FSDP2's bf16 parameters): each matmul's weight is a cast copy."""
    return lay.precision == "bf16" and residual_bytes(lay) == 4


def offload_bytes(lay: Layout) -> int:
    """Bytes per value of a saved block input: the residual stream's, or bf16's when offloaded with offload_bf16."""
    return 2 if lay.bf16_copies else residual_bytes(lay)


def moves_to_host(lay: Layout) -> bool:
    """Whether an offload moves anything off the device: on a CPU run the host is the device, so what is offloaded
    stays in the same memory and counts there (an exact copy of a block input is the input itself; bf16 copies
    count at offload_bytes; fsdp's offloaded parameters are where they were)."""
    return lay.device == "cuda"


def state_bytes(shape: Shape, lay: Layout) -> tuple[int, int, int, int]:
    """(parameters, gradients, optimizer state, host bytes): fp32 master weights (4 B), fp32 gradients
    (4 B), AdamW's two fp32 moments (8 B) per parameter; fsdp divides each by the world (every rank of
    dp x cp holds a shard); DDP on several ranks keeps a second gradient copy in its buckets; offload_params
    (fsdp) keeps all three in host memory."""
    p = shape.params
    if lay.shard == "fsdp":
        per = -(-p // lay.world)  # ceil: the last shard is padded
        params, grads, optim = 4 * per, 4 * per, 8 * per
        if lay.offload_params and moves_to_host(lay):
            return 0, 0, 0, params + grads + optim
        return params, grads, optim, 0
    buckets = 4 * p if lay.world > 1 else 0
    return 4 * p, 4 * p + buckets, 8 * p, 0


def weight_copy_bytes(shape: Shape, lay: Layout) -> int:
    """Working copies of weights: the fused matrices each block builds and, under bf16 autocast over fp32 weights,
    its cast copies (Shape.copied_weights; saved for backward, so every block's under no checkpointing, one
    block's under block checkpointing) in the compute dtype; fsdp
    adds the all-gathered unsharded parameters of two blocks (the current one and the prefetched next) and
    of the root (embedding, head) in the compute dtype."""
    a = compute_bytes(lay.precision)
    held = 1 if lay.checkpointing == "block" else shape.layers
    out = held * shape.copied_weights(casts_weights(lay)) * a
    if lay.shard == "fsdp":
        out += (2 * shape.block_params + shape.root_params) * a
    return out


def kv_bytes(shape: Shape, lay: Layout) -> int:
    """K/V (and their gradients) from the other cp ranks that this rank holds for the layer being computed,
    per --cp-kv mode; under no checkpointing the gathered K/V of every layer are also saved for backward.
    all: the window's K/V; selected: the remote blocks the local query blocks pick (at most budget - local -
    own blocks per query block, at most the rest of the window); stream: (cp - 1) / pieces of one shard (the
    largest count up to DEFAULT_PIECES that divides the shard's blocks)."""
    if lay.cp == 1:
        return 0
    a, b, n = compute_bytes(lay.precision), lay.micro_batch, lay.local_tokens
    remote = lay.seq_len  # 'all': the kernel's K/V are the gathered window, the rank's own tokens included
    if lay.cp_kv == "selected" and shape.sparse:
        q_blocks = n // shape.block
        remote = min(lay.seq_len - n, q_blocks * (shape.budget - 2) * shape.block)
    elif lay.cp_kv == "stream":
        remote = (lay.cp - 1) * n // piece_count(n // shape.block)  # the stream's own count: it divides the blocks
    one_layer = 2 * 2 * remote * shape.kv_width * a * b  # K and V, and their gradients
    saved = 0
    if lay.checkpointing == "none" and lay.cp_kv != "stream":
        # the kernel's K/V input is saved for backward in every other layer ('all': the whole gathered window)
        kept = lay.seq_len if lay.cp_kv == "all" else remote
        saved = (shape.layers - 1) * 2 * kept * shape.kv_width * a * b
    return one_layer + saved


def selection_bytes(shape: Shape, lay: Layout) -> int:
    """One sparse layer's key-block ids, kept from its forward for the recompute under block checkpointing
    (lcft.kernels.selection_memo): int32 (B, Hkv, local blocks, budget)."""
    if not shape.sparse:
        return 0
    return 4 * lay.micro_batch * (shape.kv_width // shape.head_dim) * (lay.local_tokens // shape.block) * shape.budget


def activation_bytes(shape: Shape, lay: Layout) -> tuple[int, int]:
    """(activations held across the step, transient of the block being worked on), per rank.

    none: every block's saved values (saved_per_token x local tokens) plus the model's own (embedding output,
    final norm input and output: 3H per token). block: each block's input (H per token; 0 when offloading moves
    it off the device, at 2 B in bf16 host copies on a CPU run) and sparse selection plus the model's own, and
    while one block is recomputed its saved values; with seq_chunk only the attention core's q, k, v, out are
    whole-length, the rest chunk-sized, and an offloaded input is brought back whole for the recompute (on a CPU
    run an exact copy is read in place). The transient is the gradients of one block's saved values and of the
    hidden state (fp32), and the loss chunk's logits."""
    a, r, b, n = compute_bytes(lay.precision), residual_bytes(lay), lay.micro_batch, lay.local_tokens
    tokens = b * n
    own = 3 * shape.hidden * r * tokens + 4 * shape.head_dim * tokens  # + cos/sin (fp32)
    per_block = shape.saved_bytes(a, r)
    if lay.checkpointing == "none":
        held = shape.layers * per_block * tokens + own
        recompute = 0
    else:
        moved = lay.offload_activations and moves_to_host(lay)
        inputs = 0 if moved else shape.layers * shape.hidden * offload_bytes(lay) * tokens
        held = inputs + own + shape.layers * selection_bytes(shape, lay)
        if lay.seq_chunk and n > lay.seq_chunk:
            core = (2 * shape.q_width + 2 * shape.kv_width) * a * tokens
            recompute = core + 2 * per_block * b * lay.seq_chunk
        else:
            recompute = per_block * tokens
    loss = 3 * min(lay.loss_chunk, tokens) * shape.vocab * 4
    grads = (per_block if lay.checkpointing == "none" or not lay.seq_chunk or n <= lay.seq_chunk
             else (2 * shape.q_width + 2 * shape.kv_width) * a) * tokens
    transient = recompute + grads + 2 * shape.hidden * 4 * tokens + loss
    if lay.device == "cpu" and lay.checkpointing == "block" and lay.seq_len < LONG_WINDOW:
        # Below LONG_WINDOW the trainer leaves glibc's adaptive mmap threshold alone (lcft.train.memory): the
        # freed buffers of the recompute stay in the heap, so the process holds them a second time.
        transient += recompute
    if chunked_copy_back(lay):
        transient += shape.hidden * r * tokens  # the recomputed block's input, back whole from its host copy
    if lay.device == "cpu" and lay.checkpointing == "none" and lay.seq_len < LONG_WINDOW:
        transient += heap_kept_gradients(shape, lay)
    return held, transient


def heap_kept_gradients(shape: Shape, lay: Layout) -> int:
    """Without checkpointing on CPU below LONG_WINDOW: the gradients of one block's saved buffers (each of its
    buffer's size) that are under GLIBC_MMAP_CEILING. glibc's heap keeps them once freed, a later step's forward
    fills those free chunks with buffers of other sizes and grows the heap for the rest, so at its peak (the start
    of backward) the process holds them a second time beside the block transient. Measured, the heap's free chunks
    at a later step's peak (mallinfo2): tiny preset at 16K 553 MiB in fp32 and 330 in bf16, small 523, where the
    transient and this term count 464, 308 and 672 (small's buffers but its K/V are over the ceiling there)."""
    b, n = lay.micro_batch, lay.local_tokens
    buffers = shape.saved_buffers(compute_bytes(lay.precision), residual_bytes(lay))
    return sum(k * w * b * n for w, k in buffers if w * b * n < GLIBC_MMAP_CEILING)


def cpu_kernel_bytes(shape: Shape, lay: Layout) -> int:
    """Working memory of the chunked CPU attention kernel (lcft.kernels.sparse_cpu) where it runs (the sparse
    backend, every core under cp > 1): CPU_SPARSE_KERNEL, or its chunk buffers where they are more."""
    if not shape.sparse and lay.cp == 1:
        return 0
    return max(CPU_SPARSE_KERNEL, kernel_chunk_bytes(shape, lay))


def kernel_chunk_bytes(shape: Shape, lay: Layout) -> int:
    """The chunk buffers the chunked CPU kernel's backward holds at once. Per B·Hkv row, the previous chunk's
    gathered K and V and their two gradient products (C·slots·block·D each), its probabilities and two score
    gradients (C·G·block·slots·block each) are still referenced while the next chunk's gathered K/V, scores and
    probabilities are made: 6 + 5 buffers in the compute dtype. slots: the key blocks a query block reads, the
    selection budget, or under dense attention (cp > 1) every block of the window (tiny preset at 16K on cp 2:
    16 MiB each, 177 MiB where the kernel's allocations measured 153)."""
    group = shape.q_width // shape.kv_width
    slots = shape.budget if shape.sparse else lay.seq_len // shape.block
    rows = lay.micro_batch * shape.kv_width // shape.head_dim
    chunk = rows * chunk_size(group, shape.block, slots) * slots * shape.block * compute_bytes(lay.precision)
    return chunk * (6 * shape.head_dim + 5 * group * shape.block)


def chunked_copy_back(lay: Layout) -> bool:
    """Whether a chunked recompute starts from a whole-length copy of its block input the chunks do not count:
    the input offloaded off the device, or kept on the CPU in bf16 (an exact CPU copy is the input itself)."""
    chunked = lay.checkpointing == "block" and bool(lay.seq_chunk) and lay.local_tokens > lay.seq_chunk
    return chunked and lay.offload_activations and (moves_to_host(lay) or lay.bf16_copies)


def estimate(cfg: LlamaConfig, lay: Layout) -> Estimate:
    """Every per-rank figure of `lay` for the model `cfg`."""
    shape = Shape.of(cfg)
    params, grads, optim, host = state_bytes(shape, lay)
    held, transient = activation_bytes(shape, lay)
    if lay.device == "cpu" and lay.seq_len < LONG_WINDOW:
        # With glibc's adaptive mmap threshold (below LONG_WINDOW, lcft.train.memory) freed buffers stay in the
        # heap: the gradients, freed after every step and allocated again in the next backward; under fsdp every
        # block's unsharded fp32 buffers, freed block by block (CPU_FSDP_HEAP_COPIES).
        transient += CPU_FSDP_HEAP_COPIES * 4 * shape.params if lay.shard == "fsdp" else 4 * shape.params
        local = -(-shape.params // lay.world) if lay.shard == "fsdp" else shape.params
        transient += CPU_LATER_STEP * 4 * local
    if lay.offload_activations and moves_to_host(lay):
        host += lay.micro_batch * lay.local_tokens * shape.layers * shape.hidden * offload_bytes(lay)
    kv = kv_bytes(shape, lay)
    if lay.device == "cpu" and lay.seq_len < LONG_WINDOW:
        # Fitted (tiny preset at 16K on cp 2: 70 MiB above the plan without it, 64 MiB of K/V): likely glibc's heap
        # keeping the forward's gathered K/V while the recompute gathers them again; not isolated.
        kv *= 2
    if lay.device == "cpu":
        long = lay.seq_len >= LONG_WINDOW
        runtime = (CPU_RUNTIME + (CPU_PROCESS_GROUP if lay.world > 1 else 0)
                   + cpu_kernel_bytes(shape, lay)
                   + (0 if long else int(CPU_THREAD_SHARE * transient) * (lay.threads - 1)))
        if long:
            share = long_share(lay)
            transient, kv = int(share * transient), int(share * kv)
        margin = 0
    else:
        runtime = CUDA_RUNTIME + (CUDA_NCCL if lay.world > 1 else 0)
        margin = int(CUDA_MARGIN * (held + kv + transient))
    return Estimate(params, grads, optim, weight_copy_bytes(shape, lay), held, kv, transient, runtime, host,
                    margin, load_bytes(shape, lay))


def load_bytes(shape: Shape, lay: Layout) -> int:
    """Host bytes of a CUDA rank reading its weights: the whole model in fp32 (a fresh preset, or safetensors read
    whole) on the CPU before it moves to the GPU or is sharded; none when fsdp reads a sharded checkpoint."""
    if lay.device == "cpu" or (lay.shard == "fsdp" and lay.sharded_source):
        return 0
    return 4 * shape.params


def with_changes(lay: Layout, **changes: object) -> Layout:
    return dataclasses.replace(lay, **changes)
