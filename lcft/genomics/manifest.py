"""The manifest of a prepared folder, built from the run's options and checkpoint state."""

from __future__ import annotations

import numpy as np

from lcft import __version__
from lcft.genomics.fasta import FastaFile
from lcft.genomics.shards import FORMAT_VERSION, SPLITS
from lcft.genomics.window_set import BASES_DTYPE


def build_manifest(fasta: FastaFile, options: dict, state: dict, writers: dict, ids_dtype: str) -> dict:
    """The manifest of a finished run (see docs/interfaces.md): options, per-split totals, chromosomes, records."""
    tok = options["tokenizer"]
    char = "file" not in tok
    splits = {}
    for split in SPLITS:
        chroms = [c for c in state["chroms"] if c["split"] == split]
        records = [r for r in state["records"] if r["split"] == split]
        windows = sum(c["windows"] for c in chroms)
        splits[split] = {
            "chroms": [c["chrom"] for c in chroms],
            "windows": windows,
            "skipped_n": sum(c["skipped_n"] for c in chroms),
            "tokens": windows * options["length"],
            "bases": sum(r["end"] - r["start"] for r in records),
            "oov": sum(r.get("oov", 0) for r in records),
            "oov_letters": state.get("oov_letters", {}).get(split, {}),
            "files": writers[split].files(),
        }
    per_base = {} if char else {
        "bases_file": {"file": "{split}.bases.bin", "dtype": np.dtype(BASES_DTYPE).name, "per": "token"},
        "basemask_file": {"file": "{split}.basemask.bin", "packing": "numpy.packbits of each window's bases "
                          "(lower case = 1), ceil((end - start)/8) bytes per window, in record order"},
    }
    return {
        "format_version": FORMAT_VERSION,
        "created_by": f"lcft {__version__}",
        "tokenizer": tok,
        "ids_dtype": ids_dtype,
        "source": {
            "path": str(fasta.path.resolve()),
            "size": options["fasta"]["size"],
            "sha256": options["fasta"]["sha256"],
            "compression": fasta.kind,
        },
        "length": options["length"],
        "stride": options["stride"],
        "max_n_frac": options["max_n_frac"],
        "softmask": {"file": "{split}.softmask.bin", "packing": "numpy.packbits, big bit order, L/8 bytes per window"},
        **per_base,
        "files": {} if char else {tok["file"]: {"bytes": tok["bytes"], "sha256": tok["file_sha256"]}},
        "options": options,
        "splits": splits,
        "chroms": state["chroms"],
        "records": state["records"],
    }
