"""Compile every Triton kernel for sm_80/86/89/90/100 without a GPU; table of shared memory, registers, spills.

Usage: python benchmarks/kernel_resources.py [--quick] [--table [--quick]] [--json out.json] [--bytes]
Each row is the tiles `tile_config` chooses (the compiled-ahead table where it has them) and, beside the
resources, the kernel's modelled roofline for one sparse fwd+bwd step at 128K tokens, 8 KV heads x group query
heads, budget 19 blocks: HBM bytes, FLOPs, their ratio and the ceiling time on the target's nominal bandwidth and
tensor-core rate. Exits non-zero when a configuration needs more shared memory than its target allows (sm_86/89:
warning only), or when a bf16/fp16 kernel on a target of the tile table (sm_80/90/100) spills or uses 255
registers (status SPILL), as does a kernel whose tiles the table chose (fp32 too), unless the table records that
no candidate avoids it. --table compiles every bf16/fp16 configuration of those targets (432 kernels) and the
fp32 kernels the table chose (--quick: a fixed sample, the test's). --bytes prints the modelled HBM bytes one
sparse fwd+bwd step moves, per-head (before) vs group-centric tiles.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # AOT compile needs real JIT functions, not the interpreter's

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lcft.kernels.triton_tile_table import CHOSEN, NO_CLEAN  # noqa: E402
from lcft.kernels.triton_tiles import (  # noqa: E402
    DTYPES,
    SMEM_LIMIT,
    compile_for,
    kernel_signature,
    sparse_kernel_sources,
    tile_config,
)

TARGETS = {(8, 0): "A100", (9, 0): "H100/H200", (10, 0): "B200", (8, 6): "sm_86 (warn)", (8, 9): "sm_89 (warn)"}
WARN_ONLY = {(8, 6), (8, 9)}
TABLE_TARGETS = ((9, 0), (10, 0), (8, 0))  # the tile table's: bf16/fp16 kernels there must not spill (H100/H200 first)
CLEAN_DTYPES = (torch.bfloat16, torch.float16)
REG_CAP = 255  # a kernel at the cap is register-limited to one small occupancy and likely to spill on change
DTYPE_LIST = (torch.bfloat16, torch.float16, torch.float32)
HEAD_DIMS, BLOCKS, GROUPS = (64, 96, 128), (64, 128), (1, 2, 4, 8)  # groups 3, 5-7 pad to the next of these
TOP_KS = (16, 32)  # selection kernel: CLI default top_k and a wide one


def _usage(kernel) -> tuple[int | None, int | None]:
    """(registers per thread, stack + local bytes per thread = spills) from cuobjdump, None if unavailable."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    cubin = kernel.asm.get("cubin")
    if not tool.exists() or cubin is None:
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    reg = re.search(r"REG:(\d+)", text)
    spill = [int(m) for m in re.findall(r"(?:STACK|LOCAL):(\d+)", text)]  # stack frame + local arrays
    return (int(reg.group(1)) if reg else None), (sum(spill) if spill else None)


def selection_source(head_dim: int, top_k: int) -> tuple:
    """The selection top-k kernel as select_blocks_triton launches it (fp32 summaries, default warps/stages)."""
    import triton

    from lcft.kernels import selection_triton as sel

    fn = sel._kernel()
    consts = {"TOPK": top_k, "KP": max(2, triton.next_power_of_2(top_k)), "D": head_dim,
              "BD": max(16, triton.next_power_of_2(head_dim)), "QT": sel._QT, "T": sel._T}
    sig, attrs = kernel_signature(fn, torch.float32, consts)
    return fn, sig, consts, attrs, {"num_warps": 4, "num_stages": 3}


QUICK = [  # the test's worst cases: largest tiles (fp32, head_dim 128, block 128), GQA 8 at head_dim 96, sm_89
    dict(arch=(8, 0), kind="sparse", dtype=torch.float32, head_dim=128, block=128, group=1, kernels=("fwd", "dkv")),
    dict(arch=(9, 0), kind="sparse", dtype=torch.bfloat16, head_dim=96, block=128, group=8, kernels=("dq", "dkv")),
    dict(arch=(10, 0), kind="sparse", dtype=torch.bfloat16, head_dim=128, block=128, group=1, kernels=("dkv",)),
    dict(arch=(8, 9), kind="sparse", dtype=torch.bfloat16, head_dim=128, block=128, group=1, kernels=("dq",)),
    dict(arch=(8, 0), kind="selection", dtype=torch.float32, head_dim=128, block=0, group=0, top_k=32),
]


TABLE_SAMPLE = [  # compiled-ahead choices that replaced spilling tiles, bf16, fp16, fp32 (--table --quick)
    dict(arch=(9, 0), kind="sparse", dtype=torch.bfloat16, head_dim=64, block=128, group=8, kernels=("fwd", "dq")),
    dict(arch=(8, 0), kind="sparse", dtype=torch.float16, head_dim=96, block=128, group=8, kernels=("dkv",)),
    dict(arch=(9, 0), kind="sparse", dtype=torch.float16, head_dim=96, block=64, group=2, kernels=("dkv",)),
    dict(arch=(10, 0), kind="sparse", dtype=torch.bfloat16, head_dim=64, block=64, group=4, kernels=("fwd", "dq")),
    dict(arch=(8, 0), kind="sparse", dtype=torch.float16, head_dim=64, block=64, group=1, kernels=("dkv",)),
    dict(arch=(9, 0), kind="sparse", dtype=torch.float32, head_dim=64, block=64, group=1, kernels=("fwd",)),
]


def grid(quick: bool, archs: list[tuple[int, int]] | None = None, table: bool = False) -> list[dict]:
    """Configurations to compile: the full CLI grid or the tile table's (optionally for some archs only), or the
    tests' subsets of either."""
    if quick:
        return [c for c in (TABLE_SAMPLE if table else QUICK) if archs is None or c["arch"] in archs]
    if table:
        archs = archs or list(TABLE_TARGETS)
        rows = [dict(arch=a, kind="sparse", dtype=t, head_dim=d, block=b, group=g) for a, t, d, b, g in
                itertools.product(archs, CLEAN_DTYPES, HEAD_DIMS, BLOCKS, GROUPS)]
        return rows + [dict(arch=(sm // 10, sm % 10), kind="sparse", dtype=torch.float32, head_dim=d, block=b,
                            group=g, kernels=tuple(kernels)) for (sm, dt, d, b, g), kernels in CHOSEN.items()
                       if dt == "fp32" and (sm // 10, sm % 10) in archs]
    archs = archs or list(TARGETS)
    rows = [dict(arch=a, kind="sparse", dtype=t, head_dim=d, block=b, group=g)
            for a, t, d, b, g in itertools.product(archs, DTYPE_LIST, HEAD_DIMS, BLOCKS, GROUPS)]
    rows += [dict(arch=a, kind="selection", dtype=torch.float32, head_dim=d, block=0, group=0, top_k=k)
             for a, d, k in itertools.product(archs, HEAD_DIMS, TOP_KS)]
    return rows


def measure(cfg: dict) -> list[dict]:
    """Compile one configuration's kernels for its target; one result row per kernel."""
    arch = cfg["arch"]
    if cfg["kind"] == "selection":
        sources = {"selection": selection_source(cfg["head_dim"], cfg["top_k"])}
    else:
        tiles = tile_config(arch, cfg["dtype"], cfg["head_dim"], cfg["block"], cfg["group"])
        sources = sparse_kernel_sources(tiles, cfg["dtype"])
        sources = {n: src for n, src in sources.items() if n in cfg.get("kernels", sources)}
    out = []
    for name, src in sources.items():
        t0 = time.perf_counter()
        k = compile_for(src, arch)
        reg, local = _usage(k)
        limit = SMEM_LIMIT[arch]
        roof = roofline(tiles, name, arch, cfg["dtype"]) if cfg["kind"] == "sparse" else {}
        params = tiles.kernel_params(name) if cfg["kind"] == "sparse" else None
        status = "ok" if k.metadata.shared <= limit else "warn" if arch in WARN_ONLY else "OVER"
        if status == "ok" and (local or (reg or 0) >= REG_CAP) and _must_be_clean(cfg, tiles, name):
            status = "SPILL"
        out.append({"arch": f"sm_{arch[0]}{arch[1]}", "kernel": name, "dtype": DTYPES[cfg["dtype"]],
                    "block": cfg["block"], "head_dim": cfg["head_dim"], "group": cfg["group"],
                    "top_k": cfg.get("top_k"), "shared": k.metadata.shared, "limit": limit, "regs": reg,
                    "spill_bytes": local, "warps": src[4]["num_warps"], "compile_s": time.perf_counter() - t0,
                    "status": status, "tiles": params, **roof})
    return out


def _must_be_clean(cfg: dict, tiles, kernel: str) -> bool:
    """A bf16/fp16 sparse kernel on a tile-table target, or one whose tiles the table chose (fp32 too), unless the
    table records that no candidate is clean."""
    if cfg["kind"] != "sparse" or cfg["arch"] not in TABLE_TARGETS:
        return False
    key = (cfg["arch"][0] * 10 + cfg["arch"][1], DTYPES[cfg["dtype"]], cfg["head_dim"], cfg["block"], tiles.gp)
    if kernel in NO_CLEAN.get(key, {}):
        return False
    return cfg["dtype"] in CLEAN_DTYPES or kernel in CHOSEN.get(key, {})


def modelled_bytes(seq_len: int, hq: int, hkv: int, head_dim: int, block: int, budget: int,
                   dtype: torch.dtype, group_centric: bool, capability: tuple[int, int] = (9, 0)) -> dict:
    """HBM bytes of one sparse fwd+bwd (no cache reuse): K/V tiles per program, plus q/o/do/dq/dk/dv once.

    Per-head kernels: one program per (head, query block) loads its budget of K/V blocks; dK/dV already walked
    the group's heads. Group-centric: one program per tile of `rows` rows from all heads of a group.
    """
    e = torch.finfo(dtype).bits // 8
    n_q, group = seq_len // block, hq // hkv
    kv_block = 2 * block * head_dim * e  # one K and one V block
    if group_centric:
        t = tile_config(capability, dtype, head_dim, block, group)
        programs = hkv * n_q * (block // t.m)  # each covers t.gp heads x t.m tokens (padded heads cost nothing)
        dkv_q_loads = 2 * hkv * n_q * budget * (block // t.kn) * group * block * head_dim * e
    else:
        programs = hq * n_q
        dkv_q_loads = 2 * hkv * n_q * budget * group * block * head_dim * e  # q and dO per chosen pair
    kv_fwd = programs * budget * kv_block
    dense_io = hq * seq_len * head_dim * e * 6 + hkv * seq_len * head_dim * e * 4  # q,o,do,dq(,o,do) + k,v,dk,dv
    return {"fwd_kv": kv_fwd, "dq_kv": kv_fwd, "dkv_q": dkv_q_loads, "io": dense_io,
            "total": 2 * kv_fwd + dkv_q_loads + dense_io}


# Nominal dense peaks per target (vendor data sheets, SXM parts): bf16/fp16 tensor-core TFLOP/s, fp32 (FMA units:
# the fp32 kernels use IEEE dots) TFLOP/s, HBM TB/s.
PEAKS = {(8, 0): (312, 19.5, 2.04), (9, 0): (989, 67, 4.8), (10, 0): (2250, 80, 8.0), (8, 6): (71, 35.6, 0.94),
         (8, 9): (165, 82.6, 1.0)}
ROOF = dict(seq_len=131072, hkv=8, budget=19)


def roofline(tiles, kernel: str, arch: tuple[int, int], dtype: torch.dtype, seq_len: int = ROOF["seq_len"],
             hkv: int = ROOF["hkv"], budget: int = ROOF["budget"]) -> dict:
    """Modelled HBM bytes and FLOPs of one kernel over a step (no cache reuse; the whole own block counted).

    A (query row, key) pair costs 4·D FLOPs in forward (QK^T, PV), 6·D in dQ (QK^T, dO·V^T, dS·K) and 8·D in
    dK/dV (K·Q^T, P^T·dO, V·dO^T, dS^T·Q). Bytes: forward and dQ programs load their rows' q (and dO, lse, delta)
    once and every chosen K/V block once per program; a dK/dV program loads its keys' K and V once and, per query
    block that chose its key block, the group's q, dO, lse and delta for the block's tokens.
    """
    e, group = torch.finfo(dtype).bits // 8, tiles.gp
    d, block, hq = tiles.d, tiles.block, hkv * group
    n_q = seq_len // block
    pairs = hq * seq_len * budget * block
    rows_io = hq * seq_len * d * e  # one (Hq, L, D) tensor
    kv_io = hkv * seq_len * d * e
    kv_blocks = 2 * block * d * e
    if kernel == "fwd":
        programs = hkv * n_q * (block // tiles.m)
        moved, flops = programs * budget * kv_blocks + 2 * rows_io + hq * seq_len * 4, 4 * d * pairs
    elif kernel == "dq":
        programs = hkv * n_q * (block // tiles.dq_m)
        moved, flops = programs * budget * kv_blocks + 3 * rows_io + hq * seq_len * 8, 6 * d * pairs
    else:
        chosen = hkv * n_q * budget  # (kv head, key block, query block) pairs, each walked by block/kn programs
        per_pair = group * block * (2 * d * e + 8)  # the group's q and dO rows, lse and delta
        moved, flops = chosen * (block // tiles.kn) * per_pair + 4 * kv_io, 8 * d * pairs
    tensor, fp32, bandwidth = PEAKS[arch]
    rate = (fp32 if dtype == torch.float32 else tensor) * 1e12
    t_mem, t_math = moved / (bandwidth * 1e12), flops / rate
    return {"gb": moved / 1e9, "gflop": flops / 1e9, "intensity": flops / moved,
            "bound": "memory" if t_mem > t_math else "compute", "ceiling_ms": 1e3 * max(t_mem, t_math)}


def _bytes_table() -> str:
    """Markdown: modelled GB per fwd+bwd step before/after for the presets' attention shapes."""
    lines = ["| shape | dtype | block | GB per-head | GB group-centric | ratio |", "|---|---|---|---|---|---|"]
    shapes = [("1b: 32 q / 8 kv heads, d64, 128K", 131072, 32, 8, 64), ("GENERator-3B-like: 32/8, d96, 128K",
              131072, 32, 8, 96), ("16 q / 16 kv, d128, 128K", 131072, 16, 16, 128)]
    for (label, seq, hq, hkv, d), dtype, block in itertools.product(shapes, (torch.bfloat16,), (64, 128)):
        before = modelled_bytes(seq, hq, hkv, d, block, 19, dtype, False)["total"] / 1e9
        after = modelled_bytes(seq, hq, hkv, d, block, 19, dtype, True)["total"] / 1e9
        lines.append(f"| {label} | {DTYPES[dtype]} | {block} | {before:.2f} | {after:.2f} | {before / after:.2f}x |")
    return "\n".join(lines)


HEADER = ("| arch | kernel | dtype | block | head_dim | group | tiles (tokens, keys, warps, stages) | shared B | "
          "limit B | regs | spill B | GB | GFLOP | FLOP/B | bound | ceiling ms | compile s | status |\n"
          + "|---" * 18 + "|")


def _row_text(r: dict) -> str:
    grp = r["group"] if r["kernel"] != "selection" else f"top_k {r['top_k']}"
    roof = (f"{r['gb']:.2f} | {r['gflop']:,.0f} | {r['intensity']:.0f} | {r['bound']} | {r['ceiling_ms']:.2f}"
            if "gb" in r else "- | - | - | - | -")
    tiles = "-" if r.get("tiles") is None else ", ".join(map(str, r["tiles"]))
    return (f"| {r['arch']} | {r['kernel']} | {r['dtype']} | {r['block']} | {r['head_dim']} | {grp} | {tiles} | "
            f"{r['shared']} | {r['limit']} | {r['regs']} | {r['spill_bytes']} | {roof} | {r['compile_s']:.1f} | "
            f"{r['status']} |")


def _counts_line(rows: list[dict], head: str) -> str:
    spill = sum(1 for r in rows if r["spill_bytes"])
    capped = sum(1 for r in rows if (r["regs"] or 0) >= REG_CAP)
    return f"{head}: {len(rows)} kernels, {spill} spill registers, {capped} use 255 registers"


def _measured(configs: list[dict], jobs: int):
    """measure(c) for each configuration, in order: in this process for one job (a spawned worker would import torch
    and lcft again, about as long as a --quick run's compiles), else in `jobs` spawned processes."""
    if jobs == 1:
        yield from map(measure, configs)
        return
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        yield from pool.imap(measure, configs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="worst-case subset (the test's)")
    ap.add_argument("--table", action="store_true", help="every bf16/fp16 configuration of the tile table's targets")
    ap.add_argument("--arch", action="append", type=int, help="only this target, e.g. 90 (repeatable)")
    ap.add_argument("--jobs", type=int, default=1, help="compile in this many processes")
    ap.add_argument("--json", type=Path, help="write every row here")
    ap.add_argument("--bytes", action="store_true", help="print the modelled bytes table and exit")
    args = ap.parse_args(argv)
    if args.bytes:
        print(_bytes_table())
        return 0
    t0 = time.perf_counter()
    archs = [(a // 10, a % 10) for a in args.arch] if args.arch else None
    print(HEADER, flush=True)
    rows = []
    for res in _measured(grid(args.quick, archs, args.table), args.jobs):
        for r in res:
            print(_row_text(r), flush=True)
        rows += res
    over = [r for r in rows if r["status"] in ("OVER", "SPILL")]
    print(_counts_line(rows, f"{len(rows)} kernels compiled in {time.perf_counter() - t0:.0f} s; "
                             f"{len(over)} over their limit or spilling where they must not"))
    for dtype in sorted({r["dtype"] for r in rows}):
        print(_counts_line([r for r in rows if r["dtype"] == dtype], dtype))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
