"""gpu_check.py's results as one markdown table, each row read against its target (README, On a GPU node)."""

from __future__ import annotations

from lcft.config import format_size

K = 1024
GIB = 2**30
TARGET_SPARSE_VS_FLASH = 0.5  # at the longest quick length, 128K
TARGET_MFU = 0.35  # 1b preset at 128K
SPARSE_ROW = "sparse attention f+b (Triton, bf16, block selection included)"  # timed end to end, as dense is


def _yes(ok: bool | None) -> str:
    return "" if ok is None else "yes" if ok else "NO"


def _attention_rows(res: dict) -> list[str]:
    out, longest = [], max((r["length"] for r in res["attention"]), default=0)
    for r in res["attention"]:
        if "error" in r:
            out.append(f"| {SPARSE_ROW} | {format_size(r['length'])} | {r['error']} | | | NO |")
            continue
        ratio = r["sparse_tflops"] / r["dense_tflops"] if r["dense_ms"] == r["dense_ms"] else None
        vs = (f"{r['dense']}: {r['dense_tflops']:.0f} TFLOP/s, {r['dense_ms']:.1f} ms; sparse = {100 * ratio:.0f}%"
              if ratio is not None else "dense not timed")
        target = r["length"] == min(longest, 128 * K) and not res.get("rehearsal")
        met = ratio is not None and ratio >= TARGET_SPARSE_VS_FLASH and r["finite"] if target else None
        out.append(f"| {SPARSE_ROW} | {format_size(r['length'])} | {r['sparse_tflops']:.0f} TFLOP/s, "
                   f"{r['sparse_ms']:.1f} ms | {vs} | {'>= 50% of flash' if target else ''} | {_yes(met)} |")
    return out


def _train_rows(res: dict) -> list[str]:
    out = []
    for r in res["train"]:
        if "error" in r:
            out.append(f"| {r.get('preset', '1b')} train step | {format_size(r['length'])} | {r['error']} | | | NO |")
            continue
        mfu = f"MFU {100 * r['mfu']:.0f}%" if r.get("mfu") is not None else "MFU n/a (unknown GPU peak)"
        target = r["length"] == 128 * K
        met = r.get("mfu") is not None and r["mfu"] >= TARGET_MFU and r["finite"] if target else None
        out.append(f"| {r.get('preset', '1b')} train step (sparse, block checkpointing, bf16) | {format_size(r['length'])} | "
                   f"{r['tokens_per_s']:,.0f} tokens/s, {mfu}, peak {r['peak_gib']:.1f} GiB | {r['step_s']:.2f} s/step "
                   f"| {'>= 35% MFU' if target else ''} | {_yes(met)} |")
    return out


def _plan_row(res: dict) -> list[str]:
    from lcft.plan.estimate import HOST_PROCESS

    r = res.get("plan")
    if not r:
        return []
    head = f"| {r.get('preset', '1b')}, `lcft plan` for one GPU: {r['flags']} | {format_size(r['length'])} | "
    plan = "" if "plan_gib" not in r else f"plan {r['plan_gib']:.1f} GiB" + (
        f" (+ {r['host_gib']:.1f} GiB host + {HOST_PROCESS / GIB:.0f} for the process)" if r.get("host_gib") else "")
    # the GPU memory the plan was laid out for, in the unit it was given (141GB: decimal, as NVIDIA sizes an H200)
    size = f" {r['gpu_memory']}" if r.get("gpu_memory") else ""
    target = "" if res.get("rehearsal") else f"fits one{size} GPU"
    missed = "" if res.get("rehearsal") else "NO"
    if "no_layout" in r:  # lcft plan's own answer; no step ran
        return [head + f"{r['no_layout']} | {plan} | {target} | {missed} |"]
    if "error" in r:  # what stopped it, as it was (out of memory says "does not fit"; a timeout, a crash do not)
        return [head + f"{r['error']} | {plan} | {target} | {missed} |"]
    host = f", host peak {r['host_peak_gib']:.1f} GiB" if r.get("host_peak_gib") else ""
    met = None if res.get("rehearsal") else r["fits"] and r["finite"]
    return [head + f"fits: peak {r['peak_gib']:.1f} GiB of {r['gpu_gib']:.1f} GiB{host}, {r['step_s']:.1f} s/step | "
            f"{plan} | {target} | {_yes(met)} |"]


def markdown(res: dict) -> str:
    """The results as one markdown table (the JSON holds the same numbers)."""
    tests = res["tests"]
    out = [f"# gpu-check on {res['device']} (torch {res.get('torch', '?')})", "",
           "| check | size | result | against | target | met |", "|---|---|---|---|---|---|"]
    out += _attention_rows(res) + _train_rows(res) + _plan_row(res)
    if tests:
        out.append(f"| pytest -m gpu tests/gpu | {len(tests['cases'])} tests | {tests['summary']} | "
                   f"{tests['seconds']:.0f} s | all pass | {'' if res.get('rehearsal') else _yes(tests['ok'])} |")
        out += [f"| {c['name']} | | {c['outcome']} | | | |" for c in tests["cases"]]
    return "\n".join(out) + "\n"
