"""gpu_check.sh's install helpers (standard library only): what `pip check` says lcft still misses; is the index there."""

from __future__ import annotations

import re
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

PROBE_TIMEOUT_S = 5  # an index that does not answer in this long is taken as absent (an offline node)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def missing(report: Iterable[str], requirements: Path) -> tuple[list[str], list[str]]:
    """(what lcft and the pinned packages of `requirements` still miss, notes) from `pip check`'s lines. Left out:
    torch, which gpu_check.sh holds to setup.cfg's floor by major.minor itself (a node's pre-release torch such as
    2.11.0a0+git... is below pip's >=2.11 but of a minor lcft is tested with), and matplotlib, which only draws
    lcft eval's plot: a note."""
    ours = {"lcft"} | {_norm(ln.split("==")[0]) for ln in requirements.read_text().splitlines() if "==" in ln}
    lacking, notes = [], []
    for line in report:
        if not line.split() or _norm(line.split()[0]) not in ours:
            continue
        if re.search(r" (has requirement|requires) torch\b", line):
            continue
        if re.search(r" requires matplotlib\b", line):
            notes.append(f"note: {line.strip()} (only the plot of lcft eval needs it)")
        else:
            lacking.append(line.rstrip("\n"))
    return lacking, notes


def reachable(url: str) -> bool:
    """Whether the package index at `url` answers within PROBE_TIMEOUT_S (any HTTP status counts as an answer)."""
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


def main(argv: list[str]) -> int:
    """`missing REQUIREMENTS` (pip check's report on stdin; what is missing on stdout, notes on stderr) or
    `reachable URL` (exit 0 when the index answers)."""
    if argv[:1] == ["missing"] and len(argv) == 2:
        lacking, notes = missing(sys.stdin, Path(argv[1]))
        for note in notes:
            print(f"gpu-check: {note}", file=sys.stderr)
        print("\n".join(lacking), end="\n" if lacking else "")
        return 0
    if argv[:1] == ["reachable"] and len(argv) == 2:
        return 0 if reachable(argv[1]) else 1
    print("usage: gpu_check_deps.py missing REQUIREMENTS | reachable URL", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
