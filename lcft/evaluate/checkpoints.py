"""Describing checkpoints for eval: what the report records of each, and the checks before any evaluation runs
(weight hashes and readability: lcft.checkpoint.weights)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lcft.checkpoint.layout import check_tokenizer, resolve_checkpoint
from lcft.checkpoint.reader import load
from lcft.config import format_size
from lcft.errors import LcftError
from lcft.shapes import check_length


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
        read = load(path, model=False)
        config, lcft = read.config, read.meta
        train_config: dict[str, Any] = {}
        if (path / "config.toml").is_file():
            try:
                train_config = tomllib.loads((path / "config.toml").read_text())
            except (OSError, tomllib.TOMLDecodeError):
                train_config = {}  # informational only: a damaged run config does not stop the evaluation
        return cls(label, given, path, max_context, config, lcft, train_config)

    def check_tokenizer(self, data_tokenizer: dict[str, Any]) -> None:
        """The checkpoint must read the data's vocabulary (lcft.checkpoint.layout.check_tokenizer)."""
        check_tokenizer(self.path, data_tokenizer)

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
