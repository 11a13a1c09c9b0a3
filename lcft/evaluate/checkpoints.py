"""Checkpoints for eval: what the report records of each, the checks before any evaluation runs (weight hashes and
readability: lcft.checkpoint.weights), and loading each model; a run folder's latest checkpoint that the run prunes
meanwhile is resolved again (lcft.checkpoint.layout.read_checkpoint)."""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lcft.checkpoint.hf_folder import read_config
from lcft.checkpoint.layout import (
    EVAL_STEP,
    RUN_CONFIG,
    Identity,
    check_tokenizer,
    read_checkpoint,
    refuse_out_inside,
    unchanged,
)
from lcft.checkpoint.reader import load  # safetensors or a sharded (DCP) checkpoint
from lcft.checkpoint.weights import check_weights_readable, weights_sha256
from lcft.config import ConfigError, format_size
from lcft.config_toml import load_toml
from lcft.errors import LcftError
from lcft.evaluate.config import EvalConfig
from lcft.evaluate.inputs import check_checkpoints
from lcft.model.config import AttentionConfig
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
    identity: Identity = None
    """The folder as first read: every later read of it is checked against it (a run pruning it meanwhile)."""
    checks: Checks | None = None
    """What it was checked against (prepare_checkpoints): a run's newer latest read in its place is checked so too."""

    @classmethod
    def read(cls, given: str, label: str, max_context: int, path: Path, checks: Checks | None = None
             ) -> CheckpointInfo:
        """The entry `given` (label, --max-context) of the checkpoint folder `path` it was resolved to."""
        read = load(path, model=False)
        with unchanged(path, read.identity):
            run_config = _run_config(path)
        return cls(label, given, path, max_context, read.config, read.meta, run_config, identity=read.identity,
                   checks=checks)

    def reads_as(self, other: CheckpointInfo) -> None:
        """This entry now records the checkpoint `other` records (a run's newer latest, read in place of the one
        this entry was first resolved to), its own options checked against it."""
        own = self.given, self.label, self.max_context
        vars(self).clear()
        vars(self).update(vars(other))  # its fields and what it cached (the attention read from its folder)
        self.given, self.label, self.max_context = own
        if self.checks is not None:
            self.check_max_context(self.checks.window, self.block_size())

    def check_tokenizer(self, data_tokenizer: dict[str, Any]) -> None:
        """The checkpoint must read the data's vocabulary (lcft.checkpoint.layout.check_tokenizer)."""
        check_tokenizer(self.path, data_tokenizer, EVAL_STEP)

    @functools.cached_property
    def attention(self) -> AttentionConfig:
        """The attention lcft.json records, as the model reads it (checked there; dense for a folder transformers
        wrote)."""
        return read_config(self.path).attention

    def block_size(self) -> int:
        return self.attention.sparse.block_size

    def check_max_context(self, window: int, block: int) -> None:
        """--max-context within the window; a sparse model's pieces (its windows without one) of whole blocks,
        as its kernels read them (dense attention takes any length; under cp > 1 lcft.evaluate.parallel checks
        the pieces split over the ranks)."""
        c = self.max_context
        sparse = self.attention.backend == "sparse"
        if not c:
            if sparse:
                check_length(window, block=block, what="the data's window length", source=str(self.path))
            return
        if c > window:
            raise LcftError(
                f"--max-context {format_size(c)} is larger than the window ({format_size(window)} tokens)")
        if sparse:
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


def _run_config(path: Path) -> dict[str, Any]:
    """The checkpoint's config.toml, which the report records (informational: {} when it is absent or unreadable,
    a damaged run config does not stop the evaluation), read with the bounded TOML reader; its values as JSON
    takes them (a TOML date or time, a nan or inf, as its text): the report is written after every checkpoint
    was evaluated."""
    if not (path / RUN_CONFIG).is_file():
        return {}
    try:
        return _as_json(load_toml(path / RUN_CONFIG))
    except ConfigError:
        return {}


def _as_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_json(v) for v in value]
    if isinstance(value, bool | int | str) or (isinstance(value, float) and math.isfinite(value)):
        return value
    return str(value)


@dataclass
class Checks:
    """What every checkpoint is checked against before any evaluation runs: the report's folder, the split's
    window length and tokenizer; the weights' hashes, once per folder as read (one saved again under its name
    is another)."""

    out: str
    window: int
    tokenizer: dict[str, Any]
    hashes: dict[tuple[Path, Identity], str] = field(default_factory=dict)

    def prepared(self, given: str, label: str, max_context: int, path: Path) -> CheckpointInfo:
        """The entry `given` of the checkpoint folder `path`, read and checked as one folder (a run pruning it
        meanwhile: CheckpointChanged)."""
        info = CheckpointInfo.read(given, label, max_context, path, self)
        refuse_out_inside(self.out, path, "the report")
        with unchanged(path, info.identity):
            self._check(info)
        return info

    def _check(self, info: CheckpointInfo) -> None:
        """The checks of one checkpoint against the data, and its weights' hash (once per folder)."""
        window = self.window
        info.check_tokenizer(self.tokenizer)
        info.check_max_context(window, info.block_size())
        declared = info.config.get("max_position_embeddings")
        if isinstance(declared, int) and (info.max_context or window) > declared:
            print(f"warning: {info.label}: {info.max_context or window}-token contexts are longer than the model's "
                  f"max_position_embeddings {declared}", file=sys.stderr)
        if (info.path, info.identity) not in self.hashes:
            self.hashes[info.path, info.identity] = weights_sha256(info.path)
            check_weights_readable(info.path)
        info.sha256 = self.hashes[info.path, info.identity]


def prepare_checkpoints(cfg: EvalConfig, window: int, tokenizer: dict[str, Any]) -> list[CheckpointInfo]:
    """Resolve and check every checkpoint before any work, so bad input fails fast and writes nothing. A run
    folder's latest checkpoint that the run prunes or saves again meanwhile is resolved again and checked once
    more (lcft.checkpoint.layout.read_checkpoint)."""
    n = len(cfg.checkpoints)
    contexts = [cfg.context_of(i) for i in range(n)]
    labels = list(cfg.labels) or default_labels(list(cfg.checkpoints), contexts)
    check_checkpoints(cfg)  # each found, and --out allowed, before any hashing
    checks = Checks(str(cfg.out), window, tokenizer)
    return [read_checkpoint(given, functools.partial(checks.prepared, given, label, context))
            for given, label, context in zip(cfg.checkpoints, labels, contexts, strict=True)]


def load_model(info: CheckpointInfo, device: torch.device) -> torch.nn.Module:
    """The checkpoint's model in eval mode on `device`, in fp32 whatever the file stores (a bf16 export or a
    published bf16 model), as training holds it: --precision says how it computes. A folder that cannot be read
    is a one-line LcftError from `load`, as for train --init and export; so is one removed or replaced since
    `prepare_checkpoints` hashed it (the report records that hash), unless the entry names a run folder: then
    the run's latest is checked and read in its place (once), and `info` records that one."""
    def first() -> torch.nn.Module:
        return load(info.path, dtype=torch.float32, since=info.identity).model

    checks = info.checks
    if checks is None:  # an entry prepare_checkpoints did not make is read as it is
        return first().to(device).eval()

    def again(path: Path) -> torch.nn.Module:
        info.reads_as(checks.prepared(info.given, info.label, info.max_context, path))
        return load(path, dtype=torch.float32, since=info.identity).model

    return read_checkpoint(info.given, again, first).to(device).eval()
