"""Reading training samples from prepared windows: lcft's positioned reads (`WindowSet.ids` / `softmask`: os.preadv
into a fresh array, every id checked) against the memory map they replaced, side by side in one process.

A generated soft-masked genome cut into --windows windows of 512K tokens (char tokenizer); --reads random windows
(seeded, repeats allowed) read as a training sample took them before its ids stayed narrow (benchmarks/sample_read.py): its token ids as
int64 and its soft-mask bit per token, for whole windows (--seq-len 512K) and for one aligned 64K piece of each (--seq-len 64K). The map side is
the reader as it was: a np.memmap slice, the window's ids checked once, its whole soft mask unpacked then cut.
Both sides run under the allocator setting `lcft train` applies to such windows (lcft.train.memory), with numpy's
huge-page advice off: a sample's 4 MiB of int64 ids then costs both sides the same page faults (with it, how many
huge pages each side's buffers get depends on where the kernel places them, a 2x swing in faults). Cached: the
files in the page cache (a warm-up pass first); not cached: dropped from it (posix_fadvise) before every pass.
Cases alternate pass by pass, each first in every other pair; the median of --repeat passes, per read. Peak RSS
of each case in a fresh process (VmHWM, which counts the file pages a map touched; torch, which lcft.train.memory
imports, is in both). Target: the positioned reads no slower (ratio <= 1.05).

    python benchmarks/window_read.py            # 256 windows (128 MiB of ids), 200 reads
    python benchmarks/window_read.py --quick    # 64 windows, 50 reads
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from lcft.genomics import open_windows, prepare_windows
from lcft.genomics.shards import bin_name, softmask_name
from lcft.train.memory import return_freed_buffers_to_os

L, PIECE = 512 * 1024, 64 * 1024


class MappedWindows:
    """The reader before positioned reads: the split's files memory-mapped, a window's ids checked on first use."""

    def __init__(self, folder: Path) -> None:
        ws = open_windows(folder, "train")  # the manifest, sizes and names, as lcft reads them
        n, self.vocab = len(ws), ws.vocab_size
        self._ids = np.memmap(folder / bin_name("train"), dtype=np.uint8, mode="r", shape=(n * L,))
        self._soft = np.memmap(folder / softmask_name("train"), dtype=np.uint8, mode="r", shape=(n * L // 8,))
        self._checked = np.zeros(n, dtype=bool)

    def ids(self, i: int, start: int, stop: int) -> np.ndarray:
        ids = self._ids[i * L : (i + 1) * L]
        if not self._checked[i]:
            assert int(ids.max()) < self.vocab
            self._checked[i] = True
        return ids[start:stop]

    def softmask(self, i: int, start: int, stop: int) -> np.ndarray:
        return np.unpackbits(self._soft[i * L // 8 : (i + 1) * L // 8]).view(bool)[start:stop]


def prepared(windows: int) -> Path:
    """`windows` windows of 512K bases (random A/C/G/T, soft-masked in runs of 50-5000), kept between runs."""
    out = Path(tempfile.gettempdir()) / f"lcft-bench-window-read-{windows}"
    if (out / "manifest.json").is_file():
        return out
    rng = np.random.default_rng(0)
    n = windows * L
    seq = np.frombuffer(b"ACGT", dtype=np.uint8)[rng.integers(0, 4, n, dtype=np.uint8)]
    runs = rng.integers(50, 5000, n // 1000 + 2)
    seq |= np.repeat(np.resize(np.array([0, 0x20], dtype=np.uint8), runs.size), runs)[:n]  # 0x20: lower case
    out.mkdir(parents=True, exist_ok=True)
    fasta = out / "genome.fa"
    fasta.write_bytes(b">chr1\n" + np.concatenate([seq.reshape(-1, 64), np.full((n // 64, 1), 10, np.uint8)], 1).tobytes())
    prepare_windows(fasta=str(fasta), out=str(out), length=L, train=("chr1",), eval=())
    fasta.unlink()
    return out


def evict(folder: Path) -> None:
    """Drop the split's files from the page cache, so the next pass reads them from disk."""
    for name in (bin_name("train"), softmask_name("train")):
        fd = os.open(folder / name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def one_pass(folder: Path, case: str, order: list[int], seq: int) -> tuple[float, float]:
    """(wall, CPU) seconds to read `order`'s samples of `seq` tokens (the piece at 64K into each window) with
    the reader `case` opened for this pass."""
    reader = MappedWindows(folder) if case == "memmap" else open_windows(folder, "train")
    off = 0 if seq == L else PIECE
    t, c = time.perf_counter(), time.process_time()
    for i in order:
        ids = reader.ids(i, off, off + seq).astype(np.int64)  # (seq,) as TrainSamples.example made them
        soft = reader.softmask(i, off, off + seq)  # (seq,)
        assert ids.shape == soft.shape == (seq,)
    return time.perf_counter() - t, time.process_time() - c


def child(folder: Path, case: str, order: list[int], seq: int) -> None:
    """One pass of `case` in this fresh process; prints its peak RSS (KiB) as JSON."""
    one_pass(folder, case, order, seq)
    hwm = [int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")]
    print(json.dumps({"rss_kib": hwm[0]}))


def child_peak_rss(script: str, *args: object) -> float:
    """MiB: VmHWM of a fresh process running `script` with `args` (its --child pass), from the JSON line it prints
    last."""
    r = subprocess.run([sys.executable, script, *map(str, args)], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])["rss_kib"] / 1024


def peak_rss(folder: Path, case: str, reads: int, windows: int, seq: int) -> float:
    """MiB: VmHWM of a fresh process that imports lcft and runs one pass of `case`."""
    return child_peak_rss(__file__, "--child", case, "--reads", reads, "--windows", windows, "--seq", seq)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="64 windows and 50 reads")
    ap.add_argument("--windows", type=int, default=None, help="windows of 512K tokens in the split (default 256)")
    ap.add_argument("--reads", type=int, default=None, help="random windows read per pass (default 200)")
    ap.add_argument("--repeat", type=int, default=9, help="passes of each case (alternating); the median is kept")
    ap.add_argument("--child", choices=("memmap", "pread"), help=argparse.SUPPRESS)
    ap.add_argument("--seq", type=int, default=L, help=argparse.SUPPRESS)
    args = ap.parse_args()
    windows = args.windows or (64 if args.quick else 256)
    reads = args.reads or (50 if args.quick else 200)
    folder = prepared(windows)
    return_freed_buffers_to_os(L)  # as the trainer at this window length: freed buffers of 1 MiB and more go back
    np._core.multiarray._set_madvise_hugepage(False)  # (numpy's switch for it; see the docstring)
    order = [int(i) for i in np.random.default_rng(1).integers(0, windows, reads)]
    if args.child:
        child(folder, args.child, order, args.seq)
        return 0
    print(f"{windows} windows of 512K tokens ({windows * L / 2**20:.0f} MiB of ids), {reads} random reads a pass, "
          f"median of {args.repeat}; CPU capability {cpu_capability()}; times per read")
    print(f"{'':28}{'memmap ms':>10}{'pread ms':>10}{'pread/memmap':>14}{'  CPU ratio':>12}{'  peak RSS memmap / pread':>26}")
    for seq in (L, PIECE):
        for cached in (True, False):
            times: dict[str, list[tuple[float, float]]] = {"memmap": [], "pread": []}
            if cached:
                one_pass(folder, "pread", list(range(windows)), L)  # warm-up: every window in the page cache
            for k in range(args.repeat):
                for case in sorted(times, reverse=k % 2 == 1):  # memmap first, then pread first: no side always second
                    if not cached:
                        evict(folder)
                    times[case].append(one_pass(folder, case, order, seq))
            (mw, mc), (pw, pc) = ((statistics.median(t[0] for t in times[c]), statistics.median(t[1] for t in times[c]))
                                  for c in ("memmap", "pread"))
            rss = "" if not cached else "{:.0f} / {:.0f} MiB".format(
                *(peak_rss(folder, c, reads, windows, seq) for c in ("memmap", "pread")))
            name = f"{'512K' if seq == L else '64K of 512K'}, {'cached' if cached else 'not cached'}"
            print(f"{name:28}{mw / reads * 1e3:10.3f}{pw / reads * 1e3:10.3f}{pw / mw:14.2f}{pc / mc:12.2f}{rss:>26}")
    return 0


def cpu_capability() -> str:
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


if __name__ == "__main__":
    sys.exit(main())
