"""Per-rank model state (parameters + gradients + AdamW moments) with `--shard fsdp` on 2 and 4 ranks against
`--shard none` (every rank holds what one process holds), and the peak memory of exporting a sharded checkpoint.

Each case starts fresh gloo processes that build the preset, wrap it as the trainer does (LossModel; FSDP2 per
block and at the root over all ranks), run one training step of a short window in fp32, and count the bytes of
the distinct tensors this rank holds: parameters and gradients after backward, AdamW state after the step.
Targets: fsdp 2 ranks <= 0.55x, 4 ranks <= 0.3x of --shard none.

`--export`: a sharded checkpoint of the preset written by 2 ranks, then `lcft.checkpoint.export_model` in a fresh process
with small output shards; its peak RSS above the interpreter's baseline against the model, the largest
tensor and one shard.

    python benchmarks/fsdp_memory.py [--preset small] [--worlds 2,4] [--seq 1024] [--export] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (a DTensor counts its local shard)."""
    from torch.distributed.tensor import DTensor

    seen: dict[int, int] = {}
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        st = local.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    """One rank of one case: one fp32 training step, then this rank's byte counts to out/rank{r}.json."""
    import torch.distributed as dist

    from lcft.model import Llama, preset
    from lcft.train.step import LossModel

    torch.set_num_threads(1)
    fsdp = world > 1
    if fsdp:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = Llama(preset(args.preset))
    lm = LossModel(model, 1e-4, 8192)
    if fsdp:
        from lcft.parallel import ParallelConfig, ParallelizeConfig, init_parallel
        from lcft.parallel.parallelize import parallelize

        parallelize(model, init_parallel(ParallelConfig(), fsdp=True), ParallelizeConfig(), root=lm)
    opt = torch.optim.AdamW(lm.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (1, args.seq))  # (1, L)
    loss_sum, count, _ = lm(ids, ids)
    (loss_sum / count).backward()
    params = [p for p in lm.parameters()]
    figures = {"params": _bytes(params), "grads": _bytes([p.grad for p in params if p.grad is not None])}
    opt.step()
    figures["optim"] = _bytes([v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)])
    figures["total"] = figures["params"] + figures["grads"] + figures["optim"]
    Path(out, f"rank{rank}.json").write_text(json.dumps(figures))
    if fsdp:
        dist.destroy_process_group()


def run_case(world: int, args: argparse.Namespace) -> dict:
    """Max over ranks of each figure."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_rank, args=(world, _free_port(), args, out), nprocs=world, start_method="spawn")
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
    return {k: max(r[k] for r in ranks) for k in ranks[0]}


def _write_sharded(rank: int, world: int, port: int, preset_name: str, ckpt: str) -> None:
    """One rank: the preset, sharded over `world` ranks, saved through DCP with config.json beside it."""
    import torch.distributed as dist

    from lcft.checkpoint.dcp import save_state
    from lcft.checkpoint.hf_folder import write_model_folder
    from lcft.checkpoint.model_files import SHARDED_META
    from lcft.model import Llama, preset
    from lcft.parallel import ParallelConfig, ParallelizeConfig, init_parallel
    from lcft.parallel.parallelize import parallelize
    from lcft.train.step import LossModel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = Llama(preset(preset_name))
    parallelize(model, init_parallel(ParallelConfig(), fsdp=True), ParallelizeConfig(), root=LossModel(model, 0.0, 8192))
    opt = torch.optim.AdamW(model.parameters())
    save_state(model, opt, ckpt)
    if rank == 0:
        write_model_folder(ckpt, model.config, {}, torch.float32, meta=SHARDED_META)
    dist.destroy_process_group()


EXPORT_CHILD = """
import json, resource, sys, torch
from lcft.checkpoint import export_model, load
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
export_model(load(sys.argv[1], materialize=False), sys.argv[2], max_shard_size=int(sys.argv[3]))
print(json.dumps({"base": base, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def export_case(args: argparse.Namespace) -> dict:
    """Write a 2-rank sharded checkpoint, export it in a fresh process; its RSS growth against the sizes."""
    import torch.multiprocessing as mp

    from lcft.model import Llama, preset

    with torch.device("meta"):
        model = Llama(preset(args.preset))
    sizes = [p.numel() * 4 for p in model.parameters()]
    shard = max(max(sizes), sum(sizes) // 8)  # about 8 output shards
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, out = Path(tmp, "ckpt"), Path(tmp, "hf")
        ckpt.mkdir()
        mp.start_processes(_write_sharded, args=(2, _free_port(), args.preset, str(ckpt)), nprocs=2, start_method="spawn")
        res = subprocess.run([sys.executable, "-c", EXPORT_CHILD, str(ckpt), str(out), str(shard)],
                             capture_output=True, text=True, check=True)
        figures = json.loads(res.stdout.strip().splitlines()[-1])
        n_files = len(list(out.glob("*.safetensors")))
    return {"model": sum(sizes), "largest": max(sizes), "shard": shard, "files": n_files,
            "rss_growth": figures["peak"] - figures["base"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--worlds", default="2,4", help="comma-separated fsdp world sizes")
    ap.add_argument("--seq", type=int, default=1024, help="tokens of the training step's window")
    ap.add_argument("--export", action="store_true", help="also measure export of a sharded checkpoint")
    ap.add_argument("--quick", action="store_true", help="the tiny preset on 2 ranks")
    args = ap.parse_args()
    if args.quick:
        args.preset, args.worlds = "tiny", "2"
    from lcft.train.precision import cpu_describe

    print(f"CPU: {cpu_describe()}; torch {torch.__version__}; preset {args.preset}; fp32; one step of {args.seq}")
    mib = 1024**2
    none = run_case(1, args)
    print(f"{'layout':<14}{'params MiB':>12}{'grads MiB':>11}{'AdamW MiB':>11}{'total MiB':>11}{'vs none':>9}")
    rows = [("shard none", none)] + [(f"fsdp {w} ranks", run_case(w, args)) for w in map(int, args.worlds.split(","))]
    for name, f in rows:
        print(f"{name:<14}{f['params'] / mib:>12.2f}{f['grads'] / mib:>11.2f}{f['optim'] / mib:>11.2f}"
              f"{f['total'] / mib:>11.2f}{f['total'] / none['total']:>8.3f}x")
    if args.export:
        e = export_case(args)
        print(f"export of a 2-rank sharded checkpoint: model {e['model'] / mib:.1f} MiB, largest tensor "
              f"{e['largest'] / mib:.1f} MiB, output shard limit {e['shard'] / mib:.1f} MiB ({e['files']} files); "
              f"peak RSS growth {e['rss_growth'] / mib:.1f} MiB = {e['rss_growth'] / e['model']:.2f}x the model")


if __name__ == "__main__":
    main()
