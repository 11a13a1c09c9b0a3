"""Tile sizes of the Triton sparse-attention kernels per (GPU arch, dtype, head_dim, block, group), and their limits.

A heuristic gives every shape its tiles; for bf16/fp16 on sm_80/90/100 at head_dim 64/96/128 (and fp32 on sm_90 and
sm_100), the choices in `triton_tile_table` replace the heuristic's per kernel where it spilled registers (found by
compiling candidates ahead of time: benchmarks/kernel_tile_search.py). Every configuration the CLI can produce
is compiled for sm_80/86/89/90/100 by benchmarks/kernel_resources.py, which checks the shared memory of each
against `SMEM_LIMIT`.
`check_sparse_kernels_fit` repeats that check for the GPU at hand before a run starts, so a configuration that
does not fit is a one-line LcftError naming the option to change instead of an OutOfResources mid-run.
`on_device` makes a launch run on its tensors' GPU.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from lcft.errors import LcftError
from lcft.kernels.triton_tile_table import CHOSEN

if TYPE_CHECKING:
    from lcft.model.config import LlamaConfig


def on_device(t: torch.Tensor) -> contextlib.AbstractContextManager:
    """`t`'s GPU as the current device: Triton launches on the current device and its stream, not the tensors'
    (`lcft eval --device cuda:1` would run GPU 0's kernels on GPU 1's memory). Nothing under the interpreter."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


# Largest dynamic shared memory one block may opt into, in bytes (CUDA programming guide, compute capabilities).
SMEM_LIMIT = {(8, 0): 166_912, (8, 6): 101_376, (8, 7): 166_912, (8, 9): 101_376, (9, 0): 232_448,
              (10, 0): 232_448, (12, 0): 101_376}
DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class TileConfig:
    """Constexprs and launch options of the forward, dQ and dK/dV kernels for one configuration."""

    block: int  # tokens per selection block
    m: int  # query tokens per tile (the tile holds gp heads x m tokens = rows)
    gp: int  # query heads per KV group, padded to a power of two
    block_n: int  # keys per inner step of forward / dQ
    kn: int  # keys per dK/dV program
    dkv_m: int  # query tokens per dK/dV inner tile
    d: int
    bd: int  # head_dim padded to a power of two (96 -> 128; the pad lanes are masked)
    prec: str  # tl.dot input precision: fp32 stays exact (ieee), no TF32 rounding
    num_warps: int
    num_stages: int
    dkv_warps: int
    dkv_stages: int
    dq_m: int = 0  # dQ's own tokens / keys / warps / stages (0: the forward's)
    dq_block_n: int = 0
    dq_warps: int = 0
    dq_stages: int = 0

    def __post_init__(self) -> None:
        for name, fwd in (("dq_m", self.m), ("dq_block_n", self.block_n), ("dq_warps", self.num_warps),
                          ("dq_stages", self.num_stages)):
            if not getattr(self, name):
                object.__setattr__(self, name, fwd)

    @property
    def rows(self) -> int:
        """Query rows (heads x tokens) of one forward / dQ program."""
        return self.gp * self.m

    def fwd_consts(self) -> dict:
        return {"BLOCK": self.block, "M": self.m, "GP": self.gp, "BLOCK_N": self.block_n, "D": self.d,
                "BD": self.bd, "PREC": self.prec, "num_warps": self.num_warps, "num_stages": self.num_stages}

    def dq_consts(self) -> dict:
        return {**self.fwd_consts(), "M": self.dq_m, "BLOCK_N": self.dq_block_n, "num_warps": self.dq_warps,
                "num_stages": self.dq_stages}

    def with_kernel(self, kernel: str, tokens: int, keys: int, warps: int, stages: int) -> TileConfig:
        """These tiles with one kernel's (query tokens, keys per step or program, warps, stages) changed."""
        names = {"fwd": ("m", "block_n", "num_warps", "num_stages"),
                 "dq": ("dq_m", "dq_block_n", "dq_warps", "dq_stages"),
                 "dkv": ("dkv_m", "kn", "dkv_warps", "dkv_stages")}[kernel]
        return replace(self, **dict(zip(names, (tokens, keys, warps, stages), strict=True)))

    def kernel_params(self, kernel: str) -> tuple[int, int, int, int]:
        """(query tokens, keys, warps, stages) of one kernel: the values `with_kernel` takes."""
        return {"fwd": (self.m, self.block_n, self.num_warps, self.num_stages),
                "dq": (self.dq_m, self.dq_block_n, self.dq_warps, self.dq_stages),
                "dkv": (self.dkv_m, self.kn, self.dkv_warps, self.dkv_stages)}[kernel]

    def dkv_consts(self) -> dict:
        return {"BLOCK": self.block, "KN": self.kn, "M": self.dkv_m, "GP": self.gp, "D": self.d, "BD": self.bd,
                "PREC": self.prec, "num_warps": self.dkv_warps, "num_stages": self.dkv_stages}


def tile_config(capability: tuple[int, int], dtype: torch.dtype, head_dim: int, block_size: int,
                group: int) -> TileConfig:
    """The tiles for a GPU of this compute capability (major, minor): the heuristic's, with the compiled-ahead
    choices of `triton_tile_table` where it has them; LcftError for shapes no tile can take."""
    tiles = heuristic_tiles(capability, dtype, head_dim, block_size, group)
    sm = capability[0] * 10 + capability[1]
    for kernel, params in CHOSEN.get((sm, DTYPES[dtype], head_dim, block_size, tiles.gp), {}).items():
        tiles = tiles.with_kernel(kernel, *params)
    return tiles


def heuristic_tiles(capability: tuple[int, int], dtype: torch.dtype, head_dim: int, block_size: int,
                    group: int) -> TileConfig:
    """Tiles from the sizes alone (what `tile_config` starts from)."""
    if dtype not in DTYPES:
        raise ValueError(f"the Triton sparse kernels take fp32, bf16 or fp16 tensors, not {dtype}")
    if block_size < 16 or block_size & (block_size - 1):
        raise LcftError(f"the Triton sparse kernels need a power-of-two block size >= 16, got {block_size}; "
                        "change --block-size")
    if head_dim > 256:
        raise LcftError(f"the Triton sparse kernels take head_dim <= 256, got {head_dim}")
    wide = dtype == torch.float32  # 4-byte elements: half the rows of a 2-byte tile in the same memory
    small_smem = SMEM_LIMIT.get(tuple(capability), 101_376) < 160_000  # consumer parts (sm_86/89/120)
    bd = max(16, _pow2(head_dim))
    gp = _pow2(group)
    # Rows per forward/dQ program: more rows = fewer K/V re-reads (a group's heads share them), bounded by the
    # fp32 accumulator (rows x bd) that must stay in registers: 256 x 64 or 128 x 128 for 2-byte inputs.
    rows = 64 if wide or bd > 128 else 256 if bd <= 64 else 128
    m = max(1, min(block_size, rows // gp))
    block_n = min(block_size, 32 if wide and bd >= 128 else 64)
    # dK/dV: a program's keys; fewer than the block re-read the block's queries once per program.
    kn = min(block_size, 32 if wide and bd >= 128 else 64 if wide else 128)
    dkv_m = max(1, min(block_size, (32 if wide else 64) // gp))
    stages = 1 if small_smem and wide else 2
    return TileConfig(block=block_size, m=m, gp=gp, block_n=block_n, kn=kn, dkv_m=dkv_m, d=head_dim, bd=bd,
                      prec="ieee" if wide else "tf32", num_warps=8 if gp * m * bd >= 128 * 64 else 4,
                      num_stages=stages, dkv_warps=8 if kn * bd >= 64 * 128 else 4, dkv_stages=stages)


_INTS = ("n_heads", "group", "lq", "lk", "n_slots", "n_kb", "q_block_offset", "n_q", "n_k", "local_blocks",
         "sink_blocks")
_ALIGNED = ("lq", "lk")  # multiples of the block size at every launch: Triton's divisibility-16 hint applies
_FP32_PTRS = ("LSE", "DELTA", "PK", "PV", "QS", "KS")
_I32_PTRS = ("IDX", "SEG_ROW", "SEG_START", "SEG_END", "SEG_OUT", "COL", "OUT")


def kernel_signature(fn: Any, dtype: torch.dtype, constexprs: dict) -> tuple[dict, dict]:
    """Triton signature and alignment attributes of a kernel as the launcher calls it."""
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in _INTS:
            sig[name] = "i32"
        elif name == "scale":
            sig[name] = "fp32"
        else:
            sig[name] = "*fp32" if name in _FP32_PTRS else "*i32" if name in _I32_PTRS else f"*{DTYPES[dtype]}"
        if sig[name].startswith("*") or name in _ALIGNED:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def sparse_kernel_sources(tiles: TileConfig, dtype: torch.dtype) -> dict:
    """{name: (jit fn, signature, constexprs, attrs, options)} of the forward, dQ and dK/dV launches."""
    from lcft.kernels.sparse_triton_kernels import dkv_kernel, dq_kernel, fwd_kernel

    out = {}
    for name, fn, consts in (("fwd", fwd_kernel, tiles.fwd_consts()), ("dq", dq_kernel, tiles.dq_consts()),
                             ("dkv", dkv_kernel, tiles.dkv_consts())):
        options = {"num_warps": consts.pop("num_warps"), "num_stages": consts.pop("num_stages")}
        sig, attrs = kernel_signature(fn, dtype, consts)
        out[name] = (fn, sig, consts, attrs, options)
    return out


def compile_for(source: tuple, capability: tuple[int, int]) -> Any:
    """Compile one kernel source for a CUDA target without needing that GPU (ptxas ships with triton)."""
    import triton
    from triton.backends.compiler import GPUTarget

    fn, sig, consts, attrs, options = source
    arch = capability[0] * 10 + capability[1]
    return triton.compile(triton.compiler.ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", arch, 32),
                          options=options)


def check_sparse_kernels_fit(device: torch.device, dtype: torch.dtype, head_dim: int, block_size: int,
                             group: int) -> None:
    """Before a run: compile the sparse kernels for this GPU and raise LcftError if one needs too much memory."""
    if device.type != "cuda":
        return
    try:
        import triton  # noqa: F401
    except ImportError:
        raise LcftError("sparse attention on CUDA runs Triton kernels: pip install triton") from None
    cap = torch.cuda.get_device_capability(device)
    limit = torch.cuda.get_device_properties(device).shared_memory_per_block_optin
    tiles = tile_config(cap, dtype, head_dim, block_size, group)
    for name, src in sparse_kernel_sources(tiles, dtype).items():
        shared = compile_for(src, cap).metadata.shared
        if shared > limit:
            raise LcftError(f"the Triton sparse attention {name} kernel needs {shared} B of shared memory at "
                            f"{DTYPES[dtype]}, head_dim {head_dim}, block {block_size} on sm_{cap[0]}{cap[1]} "
                            f"(limit {limit} B); use a smaller --block-size or --precision bf16")


def check_model_kernels_fit(config: LlamaConfig, device: torch.device, precision: str) -> None:
    """`check_sparse_kernels_fit` for a model config (an lcft LlamaConfig) about to run on `device`.

    A no-op off CUDA, for dense attention and for the PyTorch impls; call it before the first step.
    """
    attn = getattr(config, "attention", None)
    if device.type != "cuda" or attn is None or attn.backend != "sparse" or attn.impl not in ("auto", "triton"):
        return
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    check_sparse_kernels_fit(device, dtype, config.head_dim, attn.sparse.block_size,
                             config.num_attention_heads // config.num_key_value_heads)
