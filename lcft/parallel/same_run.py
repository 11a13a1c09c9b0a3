"""The nodes of a run run the same run: once the process group forms, every rank's fingerprint (lcft's version and
source, torch's, the run's options but those a node gives its own value, what its inputs hold) is compared, and
where one differs every rank stops with the same one line naming the node and the fields."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lcft import __version__
from lcft.config_toml import PATH_FIELDS
from lcft.errors import LcftError, shown

PER_NODE = frozenset({"node_rank", "rdzv_endpoint", "max_restarts", "stop_grace", "progress"})
"""The options each node of a run may give a value of its own: its number; node 0's address as this node reaches it
(a host name on one node, an address on another); what its own elastic agent does (the restarts it allows, the
grace it gives a stop: the agent reads them, the workers do not); whether rank 0 shows a live view. Every other
option defines the run and must be the same on every node; those naming files and folders (PATH_FIELDS) are
compared by what they hold, not by path (a node may read its own copy, at another path): `fingerprint`'s inputs."""

SOFTWARE = ("lcft", "lcft source", "torch")
"""The fingerprint's fields that say which software a rank runs."""

MAX_FIELDS_SHOWN = 8  # differing fields named per node: the line stays a line
MAX_DETAIL_BYTES = 1 << 20  # a rank's fields as JSON: a few KB (an eval's list of checkpoints: more); bounds the gather


@functools.cache
def source_digest() -> str:
    """sha256 of this lcft's Python source (each module's path and bytes): two clones at other commits share
    lcft.__version__. Some 170 files, about 10 ms, once per process."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def fingerprint(options: dict[str, Any], inputs: dict[str, str]) -> dict[str, str]:
    """A rank's fingerprint: the software; `inputs`, what the path options hold (content_identity of each), under
    their option names; and `options` (a config's to_dict, or the options as the run takes them) but PER_NODE and
    PATH_FIELDS. The inputs come before the options: a node that cannot read a checkpoint is named by it first,
    before the options a run takes from that checkpoint (`differences` shows the first MAX_FIELDS_SHOWN)."""
    import torch

    fields = {"lcft": __version__, "lcft source": source_digest(), "torch": str(torch.__version__), **inputs}
    for name, value in options.items():
        if name not in PER_NODE and name not in PATH_FIELDS:
            fields[name] = value if isinstance(value, str) else \
                json.dumps(_as_compared(value), sort_keys=True) if isinstance(value, list | dict) else str(value)
    return fields


def _as_compared(value: Any) -> Any:
    """A list or object option in one form for what Python holds equal, as JSON then writes it alike (its keys
    sorted there): a whole float as its int, so a JSON value given as 8 on one node and 8.0 on another is one."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _as_compared(v) for k, v in value.items()}
    return [_as_compared(v) for v in value] if isinstance(value, list | tuple) else value


def content_identity(read: Callable[[], Any]) -> str:
    """sha256 (16 hex digits) of what `read()` returns as JSON: a data folder's window digests, a checkpoint's
    checksums; 'unreadable' when it raises a user error (named again, whole, where the job reads it)."""
    try:
        value = read()
    except (LcftError, OSError):
        return "unreadable"
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def checkpoint_identity(given: str | None) -> str:
    """What names the checkpoint `given` (--init, --resume, an eval's --checkpoint) on every node, whatever path
    each reads it at: the sha256 of its checksums file (CHECKSUMS; a run: its latest checkpoint's), which lists the
    sha256 of every file; a folder without it (an HF model folder) by the names and sizes of the files a read opens
    (hashing them would read every weight at each start); a Hub id, or --resume auto (where it found no checkpoint:
    a train's fingerprint gives the one it chose, lcft.train.run_dir.same_run), as given."""
    from lcft.checkpoint.layout import CHECKSUMS, locate_checkpoint
    from lcft.checkpoint.model_files import model_files
    from lcft.files import present
    from lcft.hashing import file_hash
    from lcft.hub import hub_id

    if given is None or given == "auto" or hub_id(given) is not None:
        return str(given)

    def read() -> Any:
        folder = locate_checkpoint(given, weights=False)
        if present(folder / CHECKSUMS):
            return file_hash(folder / CHECKSUMS).hexdigest()
        return sorted((f.relative_to(folder).as_posix(), f.stat().st_size) for f in model_files(folder))
    return content_identity(read)


def check_same_run(fields: dict[str, str]) -> None:
    """Every rank, once the process group formed, before any other collective of the run: gather the sha256 of
    each rank's `fields` (one small collective); where they differ, gather the fields themselves and raise, on every
    rank, the same LcftError naming each node that differs from the lowest node and how (`differences`)."""
    import torch
    import torch.distributed as dist

    from lcft.liveness import NODE_RANK_ENV, scalar_device

    device = scalar_device()
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).digest()
    mine = torch.frombuffer(bytearray(digest), dtype=torch.int64).to(device)  # (4,)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    if all(torch.equal(d, everyone[0]) for d in everyone):
        return
    node = os.environ.get(NODE_RANK_ENV)
    details = _gather_json({"node": int(node) if node and node.isdecimal() else None, "fields": fields}, device)
    raise LcftError(differences(details))


def _gather_json(mine: dict[str, Any], device: str) -> list[Any]:
    """Every rank's `mine`, as JSON bytes in a tensor (nothing unpickled): their lengths first, then the bytes."""
    import torch
    import torch.distributed as dist

    data = json.dumps(mine).encode()
    world = dist.get_world_size()
    lengths = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([len(data)], dtype=torch.int64, device=device))
    most = max(int(n.item()) for n in lengths)
    if not 0 < most <= MAX_DETAIL_BYTES:  # every rank sees the same lengths: all stop here alike
        raise ValueError(f"a rank's fingerprint takes {most} bytes, over {MAX_DETAIL_BYTES}")
    padded = torch.zeros(most, dtype=torch.uint8)
    padded[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    gathered = [torch.empty(most, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(gathered, padded.to(device))
    return [json.loads(bytes(g[:int(n.item())].cpu().tolist())) for g, n in zip(gathered, lengths, strict=True)]


def differences(ranks: list[Any]) -> str:
    """The line naming, for each node (else rank) whose fields differ from the lowest node's, the fields and both
    values (its own, then the lowest node's), and what to do: `ranks[r]` is rank r's {"node": N or None, "fields":
    {...}}.
    A rank of another lcft may send other fields: a field one side lacks shows as 'none'."""
    # the reference: the first rank of the lowest node (whichever node the rendezvous gave rank 0), else rank 0
    base = min(range(len(ranks)), key=lambda r: (n if (n := _node(ranks[r])) is not None else 1 << 62, r))
    first, ref_node = _fields(ranks[base]), _node(ranks[base])
    told: set[str] = set()
    lines, kinds = [], set()
    for rank, sent in enumerate(ranks):
        node, fields = _node(sent), _fields(sent)
        who = f"node {node}" if node is not None and node != ref_node else f"rank {rank}"
        ref = f"node {ref_node}" if who.startswith("node") else f"rank {base}"
        differ = [k for k in [*first, *(k for k in fields if k not in first)] if fields.get(k) != first.get(k)]
        if not differ or who in told:
            continue
        told.add(who)
        kinds |= {_kind(k) for k in differ}
        shown_ = [f"{shown(k, 40)} {_value(fields.get(k))} vs {_value(first.get(k))}" for k in differ[:MAX_FIELDS_SHOWN]]
        more = f"; and {len(differ) - MAX_FIELDS_SHOWN} more" if len(differ) > MAX_FIELDS_SHOWN else ""
        lines.append(f"{who} runs another run than {ref}: {'; '.join(shown_)}{more}")
    hints = [hint for kind, hint in _HINTS if kind in kinds]
    return f"{'; '.join(lines)} (give every node {' and '.join(hints)})"


_HINTS = (("software", "the same lcft and torch installed"), ("options", "the same options"),
          ("inputs", "the same data and checkpoints, at whatever path"))


def _kind(field: str) -> str:
    return "software" if field in SOFTWARE else "inputs" if field in PATH_FIELDS else "options"


def _node(sent: Any) -> int | None:
    node = sent.get("node") if isinstance(sent, dict) else None
    return node if isinstance(node, int) and not isinstance(node, bool) else None


def _fields(sent: Any) -> dict[str, Any]:
    fields = sent.get("fields") if isinstance(sent, dict) else None
    return fields if isinstance(fields, dict) else {}


def _value(value: Any) -> str:
    return "none" if value is None else shown(value, 60)
