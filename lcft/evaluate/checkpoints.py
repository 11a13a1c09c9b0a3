"""Finding and describing checkpoints for eval: run folder -> latest checkpoint, metadata, weight hashes, checks."""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lcft.config import format_size
from lcft.errors import LcftError
from lcft.shapes import check_length

WEIGHT_SUFFIX = ".safetensors"


def _is_model_dir(p: Path) -> bool:
    """An HF-format model folder: it has a config.json (the weights are checked when it is loaded)."""
    return (p / "config.json").is_file()


def resolve_checkpoint(path: str | Path) -> Path:
    """A run folder -> its latest checkpoint; a checkpoint folder or any HF Llama folder -> itself."""
    p = Path(path)
    if not p.exists():
        raise LcftError(f"checkpoint not found: {p}")
    if not p.is_dir():
        raise LcftError(f"checkpoint must be a folder (a run, a checkpoint, or an HF model folder): {p}")
    if _is_model_dir(p):
        return p
    if (p / "checkpoints").is_dir():
        from lcft.train.checkpoint import latest_checkpoint

        latest = latest_checkpoint(p)
        if latest is None:
            raise LcftError(f"run folder {p} has no complete checkpoint under {p / 'checkpoints'} yet")
        return latest
    raise LcftError(f"{p} is not a run folder, a checkpoint folder or an HF model folder (no config.json)")


def _read_json(p: Path) -> dict[str, Any]:
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LcftError(f"unreadable checkpoint file {p}: {e}") from None
    if not isinstance(data, dict):
        raise LcftError(f"unreadable checkpoint file {p}: not a JSON object")
    return data


def weights_sha256(ckpt: Path) -> str:
    """sha256 over the checkpoint's weight files in name order (one file: the plain sha256 of that file)."""
    files = sorted(f for f in ckpt.iterdir() if f.is_file() and f.name.endswith(WEIGHT_SUFFIX))
    if not files:
        raise LcftError(f"unreadable checkpoint {ckpt}: no *{WEIGHT_SUFFIX} weights file")
    if len(files) == 1:
        return _sha256_file(files[0])
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + _sha256_file(f).encode())
    return h.hexdigest()


def check_weights_readable(ckpt: Path) -> None:
    """Open the header of every weights file (cheap: no tensor is read), so a truncated or foreign file is
    reported before any evaluation runs rather than after the checkpoints listed before it."""
    from safetensors import safe_open

    for f in sorted(ckpt.glob(f"*{WEIGHT_SUFFIX}")):
        try:
            with safe_open(str(f), framework="pt") as sf:
                sf.keys()
        except Exception as e:  # SafetensorError is not exported under a stable name
            raise LcftError(f"unreadable checkpoint {ckpt}: {f.name}: {e}") from None


def _sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with p.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class CheckpointInfo:
    """One checkpoint to evaluate, as the report records it."""

    label: str
    given: str
    path: Path
    max_context: int
    config: dict[str, Any]
    lcft: dict[str, Any] = field(default_factory=dict)
    train_config: dict[str, Any] = field(default_factory=dict)
    sha256: str = ""

    @classmethod
    def read(cls, given: str, label: str, max_context: int) -> CheckpointInfo:
        path = resolve_checkpoint(given)
        config = _read_json(path / "config.json")
        lcft = _read_json(path / "lcft.json") if (path / "lcft.json").is_file() else {}
        train_config: dict[str, Any] = {}
        if (path / "config.toml").is_file():
            try:
                train_config = tomllib.loads((path / "config.toml").read_text())
            except (OSError, tomllib.TOMLDecodeError):
                train_config = {}  # informational only: a damaged run config does not stop the evaluation
        return cls(label, given, path, max_context, config, lcft, train_config)

    def check_tokenizer(self, data_tokenizer: dict[str, Any]) -> None:
        """The checkpoint must use the data's vocabulary: equal tokenizer spec where the checkpoint records
        one (ours do, in lcft.json), else an equal vocab_size in config.json (a transformers-written folder)."""
        ours = self.lcft.get("tokenizer")
        if ours is not None:
            if ours != data_tokenizer:
                raise LcftError(
                    f"checkpoint {self.path} was trained with a different tokenizer than the data "
                    f"({_describe(ours)} vs {_describe(data_tokenizer)})")
            return
        vocab = self.config.get("vocab_size")
        want = data_tokenizer.get("vocab_size")
        if vocab != want:
            raise LcftError(
                f"checkpoint {self.path} has vocab_size {vocab}, the data's tokenizer has {want}: "
                "this model was not trained on this vocabulary")

    def block_size(self, default: int) -> int:
        """Attention block size recorded in lcft.json (the model's default for a transformers-written folder)."""
        attn = self.lcft.get("attention") or {}
        return int(attn.get("block_size", default))

    def check_max_context(self, window: int, block: int) -> None:
        c = self.max_context
        if not c:
            return
        if c > window:
            raise LcftError(
                f"--max-context {format_size(c)} is larger than the window ({format_size(window)} tokens)")
        check_length(c, block=block, what="--max-context", source=str(self.path))

    def describe(self) -> dict[str, Any]:
        """The report's record of this checkpoint (without figures)."""
        return {
            "label": self.label,
            "checkpoint": self.given,
            "resolved": str(self.path),
            "max_context": self.max_context,
            "weights_sha256": self.sha256,
            "config": self.config,
            "lcft": self.lcft,
            "train_config": self.train_config,
        }


def _describe(spec: dict[str, Any]) -> str:
    return f"{spec.get('name', '?')} with {spec.get('vocab_size', '?')} tokens"


def default_labels(given: list[str], contexts: list[int]) -> list[str]:
    """Folder names, suffixed with @<context> where a context limit is set and with #n where still equal."""
    labels = []
    for g, c in zip(given, contexts, strict=True):
        p = Path(g)
        name = p.resolve().name if p.name in ("", ".", "..") else p.name
        labels.append(f"{name}@{format_size(c)}" if c else name)
    seen: dict[str, int] = {}
    out = []
    for lb in labels:
        seen[lb] = seen.get(lb, 0) + 1
        out.append(lb if labels.count(lb) == 1 else f"{lb}#{seen[lb]}")
    return out
