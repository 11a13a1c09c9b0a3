"""Choose spill-free tiles for the Triton sparse kernels by compiling candidates ahead of time (no GPU needed).

Usage: python benchmarks/kernel_tile_search.py [--jobs N] [--arch 90] [--dtype bf16] [--block 64] [--kernel fwd]
       [--write | --summary]
For each (arch, dtype, head_dim, block, group) of bf16/fp16 on sm_80/90/100 and each kernel (fwd, dq, dkv), the
candidates are compiled in order of preference (the heuristic's tiles first, then more warps, then fewer keys
per step, fewer query tokens, one stage) until one uses fewer than 255 registers and spills nothing. Results
go to benchmarks/kernel_tiles.jsonl (one line per kernel, resumable); --write turns them into
lcft/kernels/triton_tile_table.py, --summary counts them before/after. fp32 (exact FMA dots, slow to compile) is
searched only when asked for (--dtype fp32). A choice must be clean under every triton lcft supports (3.6, with
torch 2.11, and 3.9): --recheck compiles the recorded choices with the running triton (run it with each venv's
python) and replaces one that is not clean there by the first candidate that is, with a "rejected" note; each
result keeps its usage per triton version under "checked".
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import sys
import time
from pathlib import Path

import kernel_resources as kr  # first: drops TRITON_INTERPRET, puts the repo on sys.path)

from lcft.kernels.triton_tiles import DTYPES, SMEM_LIMIT, compile_for, heuristic_tiles, sparse_kernel_sources

RESULTS = Path(__file__).with_name("kernel_tiles.jsonl")
TABLE = Path(__file__).resolve().parents[1] / "lcft" / "kernels" / "triton_tile_table.py"
DTYPE_NAMES, DEFAULT_DTYPES = ("bf16", "fp16", "fp32"), ("bf16", "fp16")
HEAD_DIMS = (64, 128, 96)  # the presets' head_dim first
KERNELS = ("fwd", "dq", "dkv")
BY_NAME = {v: k for k, v in DTYPES.items()}


def candidates(tiles, kernel: str) -> list[tuple[int, int, int, int]]:
    """(query tokens, keys, warps, stages) to try, best first: the heuristic's, then less register pressure."""
    tok, keys, warps, stages = tiles.kernel_params(kernel)
    out = []
    for dt, dk, w, s in [(1, 1, warps, stages), (1, 1, 8, stages), (1, 2, 8, stages), (2, 1, 8, stages),
                         (1, 1, 8, 1), (2, 2, 8, stages), (1, 2, 4, stages), (2, 1, 4, stages), (2, 2, 4, stages),
                         (4, 2, 8, stages), (2, 2, 8, 1), (4, 4, 4, 1),
                         # last resorts, tried only where none above is clean under both tritons
                         (4, 2, 4, stages), (4, 2, 8, 1), (4, 2, 4, 1), (8, 2, 8, stages), (2, 4, 8, stages)]:
        c = (tok // dt, keys // dk, w, s)
        if c not in out and c[0] >= 1 and c[0] * tiles.gp >= 16 and c[1] >= 16:
            out.append(c)
    return out


def usage(arch, dtype, tiles, kernel: str) -> dict:
    t0 = time.perf_counter()
    k = compile_for(sparse_kernel_sources(tiles, dtype)[kernel], arch)
    regs, spill = kr._usage(k)
    return {"regs": regs, "spill": spill, "shared": k.metadata.shared, "s": round(time.perf_counter() - t0, 1)}


def clean(u: dict, arch) -> bool:
    return u["spill"] == 0 and u["regs"] is not None and u["regs"] < kr.REG_CAP and u["shared"] <= SMEM_LIMIT[arch]


def search(task: dict) -> dict:
    """Compile one kernel's candidates until one is clean; the heuristic's usage, the choice and its usage."""
    arch, dtype, kernel = tuple(task["arch"]), BY_NAME[task["dtype"]], task["kernel"]
    base = heuristic_tiles(arch, dtype, task["head_dim"], task["block"], task["group"])
    tried = []
    order = candidates(base, kernel)
    if task.get("hint") and tuple(task["hint"]) in order[1:]:  # fp16: bf16's choice next (2-byte elements)
        order.insert(1, order.pop(order.index(tuple(task["hint"]))))
    for c in order:
        u = usage(arch, dtype, base.with_kernel(kernel, *c), kernel)
        tried.append({"params": c, **u})
        if clean(u, arch):
            break
    fits = [t for t in tried if t["shared"] <= SMEM_LIMIT[arch]]
    best = min(fits or tried, key=lambda t: (not clean(t, arch), t["spill"] or 0, t["regs"] or 0))
    return {**task, "gp": base.gp, "heuristic": tried[0], "chosen": best, "clean": clean(best, arch),
            "tried": len(tried)}


def recheck(row: dict) -> dict:
    """A result's choice compiled with the running triton (its usage under "checked"); where it is not clean
    there, the first clean candidate replaces it and the rejected choice is noted. Run again with the other
    triton: a replacement is kept only when it is clean under both."""
    import triton

    arch, dtype, kernel, ver = tuple(row["arch"]), BY_NAME[row["dtype"]], row["kernel"], triton.__version__
    base = heuristic_tiles(arch, dtype, row["head_dim"], row["block"], row["group"])
    params = tuple(row["chosen"]["params"])
    u = usage(arch, dtype, base.with_kernel(kernel, *params), kernel)
    checked = {**row.get("checked", {}), ver: u}
    if clean(u, arch):  # clean only when clean under every triton it was compiled with
        return {**row, "checked": checked, "clean": all(clean(x, arch) for x in checked.values())}
    note = f"{params}: {u['regs']} registers, {u['spill']} B/thread spilled with triton {ver}"
    rejected = "; ".join(filter(None, [row.get("rejected"), note]))
    # A candidate one triton rejected is never taken again, so alternating runs end.
    out = [*row.get("rejected_params", []), list(params)]
    for c in candidates(base, kernel):
        if list(c) not in out and clean(cu := usage(arch, dtype, base.with_kernel(kernel, *c), kernel), arch):
            return {**row, "chosen": {"params": list(c), **cu}, "checked": {ver: cu}, "clean": True,
                    "rejected": rejected, "rejected_params": out}
    return {**row, "checked": checked, "clean": False, "rejected": rejected, "rejected_params": out}


def tasks(archs, dtypes) -> list[dict]:
    """Every kernel to search, most used first: the CLI's default block size (64), sm_90, head_dim 64."""
    return [dict(arch=a, dtype=t, head_dim=d, block=b, group=g, kernel=k) for t, b, a, d, g, k in
            itertools.product(dtypes, kr.BLOCKS, archs, HEAD_DIMS, kr.GROUPS, KERNELS)]


def _key(r: dict) -> tuple:
    return tuple(r["arch"]), r["dtype"], r["head_dim"], r["block"], r["group"], r["kernel"]


def load() -> list[dict]:
    return [json.loads(line) for line in RESULTS.read_text().splitlines()] if RESULTS.exists() else []


def write_table(rows: list[dict]) -> None:
    """lcft/kernels/triton_tile_table.py from the search results: the choices that differ from the heuristic."""
    chosen: dict[tuple, dict] = {}
    no_clean: dict[tuple, dict] = {}
    for r in sorted(rows, key=_key):
        key = (r["arch"][0] * 10 + r["arch"][1], r["dtype"], r["head_dim"], r["block"], r["gp"])
        if r["chosen"]["params"] != r["heuristic"]["params"]:
            chosen.setdefault(key, {})[r["kernel"]] = tuple(r["chosen"]["params"])
        if not r["clean"]:
            c = r["chosen"]
            per = "; ".join(f"triton {v}: {u['regs']} registers, {u['spill']} B/thread spilled"
                            for v, u in sorted(r.get("checked", {}).items()))
            no_clean.setdefault(key, {})[r["kernel"]] = r.get("no_clean") or (
                f"no candidate is clean under both tritons; kept {tuple(c['params'])}: {per}" if per else
                f"{r['tried']} candidates; least: {c['regs']} registers, {c['spill']} B/thread spilled")
    lines = TABLE.read_text().split("CHOSEN")[0].splitlines()
    head = "\n".join(line for line in lines if not line.startswith("#")).rstrip("\n")
    out = [head, "", "# (sm, dtype, head_dim, block, padded group): {kernel: (query tokens, keys, warps, stages)} "
           "where they differ", "# from the heuristic's (lcft.kernels.triton_tiles.heuristic_tiles), which "
           "spilled registers there.", "CHOSEN: dict[tuple[int, str, int, int, int], dict[str, tuple[int, int, "
           "int, int]]] = {"]
    out += [f"    {k!r}: {v!r}," for k, v in chosen.items()]
    out += ["}", "", "# (sm, dtype, head_dim, block, padded group): {kernel: why no candidate compiles without "
            "spills}.", "NO_CLEAN: dict[tuple[int, str, int, int, int], dict[str, str]] = {"]
    out += [f"    {k!r}: {v!r}," for k, v in no_clean.items()]
    TABLE.write_text("\n".join(out + ["}", ""]))


def _counts(rs: list[dict], side: str) -> tuple[int, int]:
    """(spilling, at the register cap) among these results' heuristic or chosen tiles."""
    return (sum(1 for r in rs if r[side]["spill"]), sum(1 for r in rs if (r[side]["regs"] or 0) >= kr.REG_CAP))


def _clean_usage(u: dict) -> bool:
    return u["spill"] == 0 and u["regs"] is not None and u["regs"] < kr.REG_CAP


def summary(rows: list[dict]) -> str:
    """Markdown: per dtype and target, kernels spilling / at 255 registers with the heuristic's tiles and the
    table's choices."""
    lines = ["| dtype | target | kernels | spill before | 255 regs before | worst spill B | spill after | "
             "255 regs after | changed | no clean candidate | choices clean per triton |", "|---" * 11 + "|"]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dtype"], r["arch"][0] * 10 + r["arch"][1]), []).append(r)
    for (dtype, sm), rs in sorted(groups.items(), key=lambda kv: (DTYPE_NAMES.index(kv[0][0]), kv[0][1])):
        (sb, cb), (sa, ca) = _counts(rs, "heuristic"), _counts(rs, "chosen")
        worst = max(r["heuristic"]["spill"] or 0 for r in rs)
        changed = sum(r["chosen"]["params"] != r["heuristic"]["params"] for r in rs)
        versions = sorted({v for r in rs for v in r.get("checked", {})})
        per = ", ".join(f"{v}: {sum(1 for r in rs if v in r.get('checked', {}) and _clean_usage(r['checked'][v]))}"
                        f"/{len(rs)}" for v in versions)
        lines.append(f"| {dtype} | sm_{sm} | {len(rs)} | {sb} | {cb} | {worst} | {sa} | {ca} | {changed} | "
                     f"{sum(not r['clean'] for r in rs)} | {per or '-'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--arch", action="append", type=int, help="only this target, e.g. 90 (repeatable)")
    ap.add_argument("--dtype", action="append", choices=DTYPE_NAMES)
    ap.add_argument("--block", action="append", type=int, help="only this block size (repeatable)")
    ap.add_argument("--kernel", action="append", choices=KERNELS, help="only this kernel (repeatable)")
    ap.add_argument("--write", action="store_true", help="write lcft/kernels/triton_tile_table.py and exit")
    ap.add_argument("--summary", action="store_true", help="print the before/after counts of the results and exit")
    ap.add_argument("--recheck", action="store_true",
                    help="compile the recorded choices with this python's triton; replace those not clean there")
    args = ap.parse_args(argv)
    if args.write or args.summary:
        write_table(load()) if args.write else print(summary(load()))
        return 0
    archs = [(a // 10, a % 10) for a in args.arch] if args.arch else list(kr.TABLE_TARGETS)
    if args.recheck:
        return _recheck_all(args, archs)
    rows = load()
    done = {_key(r) for r in rows}
    hints = {_key(r)[:1] + _key(r)[2:]: r["chosen"]["params"] for r in rows if r["dtype"] == "bf16" and r["clean"]}
    todo = [t for t in tasks(archs, args.dtype or DEFAULT_DTYPES) if _key(t) not in done
            and (not args.block or t["block"] in args.block) and (not args.kernel or t["kernel"] in args.kernel)]
    for t in todo:
        if t["dtype"] == "fp16":
            t["hint"] = hints.get(_key(t)[:1] + _key(t)[2:])
    print(f"{len(todo)} kernels to search ({len(done)} done)", flush=True)
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool, RESULTS.open("a") as f:
        for r in pool.imap_unordered(search, todo):
            f.write(json.dumps(r) + "\n")
            f.flush()
            h, c = r["heuristic"], r["chosen"]
            print(f"{_key(r)}: {h['regs']} regs {h['spill']} B -> {tuple(c['params'])} {c['regs']} regs "
                  f"{c['spill']} B{'' if r['clean'] else ' (NOT CLEAN)'}", flush=True)
    return 0


def _recheck_all(args, archs) -> int:
    """--recheck over the selected results not yet checked with this triton; the results file is rewritten
    after each one (resumable). 1 when a choice has no clean candidate under this triton."""
    import triton

    rows, ver = load(), triton.__version__
    index = {_key(r): i for i, r in enumerate(rows)}
    todo = [r for r in rows if (ver not in r.get("checked", {}) or not r["clean"]) and tuple(r["arch"]) in archs
            and r["dtype"] in (args.dtype or DEFAULT_DTYPES) and (not args.block or r["block"] in args.block)
            and (not args.kernel or r["kernel"] in args.kernel)]
    print(f"{len(todo)} choices to compile with triton {ver}", flush=True)
    bad = 0
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for r in pool.imap_unordered(recheck, todo):
            old = rows[index[_key(r)]]["chosen"]["params"]
            rows[index[_key(r)]] = r
            tmp = RESULTS.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(x) + "\n" for x in rows))
            tmp.replace(RESULTS)
            bad += not r["clean"]
            if r["chosen"]["params"] != old or not r["clean"]:
                c = r["chosen"]
                print(f"{_key(r)}: {tuple(old)} -> {tuple(c['params'])} {c['regs']} regs {c['spill']} B"
                      f"{'' if r['clean'] else ' (NOT CLEAN)'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
