"""`PrepareConfig`: the options of `lcft prepare windows`, checked when built (the files when preparing)."""

from __future__ import annotations

from dataclasses import dataclass

from lcft.config import ConfigError, Size
from lcft.genomics.shards import is_window_length


@dataclass
class PrepareConfig:
    """Options of `lcft prepare windows`."""

    fasta: str | None = None
    """FASTA to read: plain, BGZF (bgzip) or plain gzip (decompressed once into $LCFT_CACHE, default $XDG_CACHE_HOME/lcft or ~/.cache/lcft)."""
    out: str | None = None
    """Output folder for {split}.bin, {split}.softmask.bin, manifest.json and prepare.toml (with a model tokenizer also {split}.bases.bin, {split}.basemask.bin and tokenizer.json)."""
    length: Size = 524288
    """Window length in tokens (65536, 512K, 1M). Must be a multiple of 8 (soft-mask bits are packed by byte); training also needs a multiple of 2 x cp x block size, which `lcft train` checks."""
    stride: Size | None = None
    """Distance between window starts in tokens (= bases for char; default: the window length, no overlap)."""
    train: tuple[str, ...] = ("chr1", "chr2")
    """Chromosomes (FASTA record names) for the train split, comma separated."""
    eval: tuple[str, ...] = ("chr22",)
    """Held-out chromosomes for the eval split, comma separated (may be empty)."""
    max_n_frac: float = 0.1
    """Skip windows whose fraction of N (and other non-ACGT) bases is above this."""
    overwrite: bool = False
    """Replace windows already in --out that were prepared with different options."""
    tokenizer: str = "char"
    """The model's tokenizer: char (one token per base, lcft's vocabulary), kmer:K (non-overlapping K-mers, built-in vocabulary; kmer:K:PATH takes ids from a vocab.txt or a folder holding one), or a path to a tokenizer.json, a model folder holding one (or a k-mer vocab.txt), or that vocab.txt (read offline), or a model's Hub id ORG/NAME[@REVISION]. --length and --stride count its tokens."""
    max_oov_frac: float = 0.01
    """Refuse a split when more than this fraction of its tokens are the tokenizer's unknown token (letters it has no token for); the error names the letters."""

    def __post_init__(self) -> None:
        _validate(self)  # a PrepareConfig that exists is valid (files are checked when preparing)



def _validate(cfg: PrepareConfig) -> tuple[int, int]:
    if not cfg.fasta:
        raise ConfigError("no FASTA given (--fasta)")
    if not cfg.out:
        raise ConfigError("no output folder given (--out)")
    length = cfg.length
    stride = cfg.length if cfg.stride is None else cfg.stride
    if not is_window_length(length):
        raise ConfigError(f"window length {length} must be a positive multiple of 8 (soft-mask bits are packed by byte)")
    if stride <= 0:
        raise ConfigError(f"stride {stride} must be positive")
    if not 0.0 <= cfg.max_n_frac <= 1.0:
        raise ConfigError(f"max_n_frac {cfg.max_n_frac} must be between 0 and 1")
    if not 0.0 <= cfg.max_oov_frac <= 1.0:
        raise ConfigError(f"max_oov_frac {cfg.max_oov_frac} must be between 0 and 1")
    if not cfg.train:
        raise ConfigError("no train chromosome given (--train)")
    for split, names in (("train", cfg.train), ("eval", cfg.eval)):
        dup = sorted({n for n in names if list(names).count(n) > 1})
        if dup:
            raise ConfigError(f"chromosome {', '.join(dup)} is listed twice in --{split}")
    both = [n for n in cfg.train if n in cfg.eval]
    if both:
        raise ConfigError(f"chromosome {', '.join(both)} is in both --train and --eval (held-out data must not be trained on)")
    return length, stride
