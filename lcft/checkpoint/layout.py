"""Run and checkpoint folder layout: which folder a path means, a run's checkpoints, and a checkpoint's
metadata and tokenizer compatibility with prepared data.

Layout: `<run>/config.toml` (resolved), `<run>/metrics.jsonl`, `<run>/checkpoints/step-00000080/` = the model in
HF layout (`config.json`, `model.safetensors`, `lcft.json`), the resolved `config.toml`, and `trainer_state/`.
A checkpoint folder exists under its final name only once complete (written as `.tmp-step-N`, then renamed);
its `checksums.json` (size and sha256 of every other file, written last) lets a reader verify it. Checkpoints a
resumed run superseded (steps after the one it resumed from) are moved to `<run>/superseded/`.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from lcft.errors import LcftError, shown
from lcft.files import MAX_MODEL_JSON_BYTES, expect_folder, present, read_json, resolved
from lcft.hashing import file_hash
from lcft.hub import hub_id, local_path, read_as_path
from lcft.liveness import launched
from lcft.vocab import NAME as CHAR_NAME
from lcft.vocab import spec_problem

CHECKPOINTS = "checkpoints"
STEP_DIR = re.compile(r"step-(\d{8,})")  # step_name's output; temp folders of interrupted saves do not match
TMP_PREFIX = ".tmp-"
STATE_DIR = "trainer_state"
STATE_FILE = "state.json"  # in STATE_DIR: the step, counters and RNG states (lcft.checkpoint.state)
RUN_CONFIG = "config.toml"
CHECKSUMS = "checksums.json"
SUPERSEDED = "superseded"
MODEL_CONFIG = "config.json"  # a model folder's HF config
MODEL_META = "lcft.json"  # lcft's own part of a model folder: attention settings, tokenizer spec, "weights", "export"
MODEL_META_VERSION = 1  # lcft.json's "format_version": a folder of another is refused, one without it read as this
EXPORT_WORK = ".export.tmp"  # in an export's --out while `lcft export` builds the model folder (lcft.checkpoint.export)


def step_name(step: int) -> str:
    """step 80 -> 'step-00000080'."""
    return f"step-{step:08d}"


def checkpoints_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / CHECKPOINTS


def list_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, folder) of a run's complete checkpoints, oldest first."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.fullmatch(p.name))]
    return sorted(found)


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The run's checkpoint with the highest step, or None."""
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def verify_checkpoint(ckpt: str | os.PathLike) -> bool:
    """Check every file `checksums.json` lists (size, then sha256); raise a one-line LcftError naming the first
    missing or corrupt file. False when the folder has no checksums.json (an HF folder, or one written by
    hand): nothing to verify against; one there that is no regular file (a folder, a FIFO) is no such folder, and
    is refused (`present`), not taken unverified."""
    ckpt = Path(ckpt)
    listed = ckpt / CHECKSUMS
    if not present(listed):
        return False
    files = read_json(listed).get("files")
    if not isinstance(files, dict):
        raise LcftError(f"{listed}: no 'files' object (corrupt checkpoint)")
    for name, meta in sorted(files.items()):
        parts = Path(name).parts
        if not parts or Path(name).is_absolute() or ".." in parts or not isinstance(meta, dict):
            raise LcftError(f"{listed}: entry {name!r} is not a file of the checkpoint with its size and sha256 "
                            "(corrupt checkpoint)")
        f = ckpt / name
        if not f.is_file():
            raise LcftError(f"checkpoint {ckpt} is incomplete: {f} is missing")
        if f.stat().st_size != meta.get("bytes"):
            raise LcftError(f"checkpoint {ckpt} is corrupt: {f} has {f.stat().st_size} bytes, "
                            f"{CHECKSUMS} says {meta.get('bytes')}")
        if file_hash(f).hexdigest() != meta.get("sha256"):
            raise LcftError(f"checkpoint {ckpt} is corrupt: the sha256 of {f} differs from {CHECKSUMS}")
    return True


Identity = tuple[int, int, int] | None


def folder_identity(path: Path) -> Identity:
    """(device, inode, change time) of the folder `path`; None when it is gone. A checkpoint that a run prunes
    (renamed away, then removed) or saves again (a new folder renamed over its name) is another folder, or none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


class CheckpointChanged(LcftError):
    """A checkpoint folder was removed or replaced while it was being read."""


@contextlib.contextmanager
def unchanged(path: Path, since: Identity = None) -> Iterator[Identity]:
    """Read the folder `path` inside the block, which gets its identity (`since`, taken when the reader first
    looked at it, else now). When the folder was removed or replaced before the block ends, whatever the block
    raised, or read (files of two checkpoints), gives way to one line saying so: a training run writing into a
    run folder prunes its older checkpoints (--keep-last) while others read them."""
    since = since or folder_identity(path)
    try:
        yield since
    except Exception:
        if since is None or folder_identity(path) != since:
            raise _changed(path) from None
        raise
    if since is None or folder_identity(path) != since:
        raise _changed(path)


def _changed(path: Path) -> CheckpointChanged:
    run = f" (a training run writing into {path.parent.parent} prunes its older checkpoints under --keep-last)" \
        if path.parent.name == CHECKPOINTS else ""
    return CheckpointChanged(f"{path} was removed or replaced while it was being read{run}; give a checkpoint "
                             "that stays, or run again")


def previous_checkpoint(ckpt: Path) -> Path | None:
    """The run's newest checkpoint before `ckpt` (None when it is the first, or not in a run folder)."""
    m = STEP_DIR.fullmatch(ckpt.name)
    if not m or ckpt.parent.name != CHECKPOINTS:
        return None
    earlier = [p for s, p in list_checkpoints(ckpt.parent.parent) if s < int(m.group(1))]
    return earlier[-1] if earlier else None


def _checked(ckpt: Path) -> Path:
    """`ckpt` once verified; a corrupt one is an error naming its file and the previous checkpoint."""
    try:
        with unchanged(ckpt):
            if not verify_checkpoint(ckpt):
                _refuse_unfinished(ckpt)
    except CheckpointChanged:
        raise
    except LcftError as e:
        prev = previous_checkpoint(ckpt)
        hint = f"; the previous checkpoint is {prev}" if prev else ""
        raise LcftError(f"{e}{hint}") from None
    return ckpt


def _refuse_unfinished(ckpt: Path) -> None:
    """A folder of a run's checkpoints/ without checksums.json that is a save or prune under way or cut short
    (lcft names a checkpoint step-N only once its checksums are written), or a step-N of a run whose other
    checkpoints have checksums (one that is no file among them: verify_checkpoint refuses it): its files may be
    half written. A run where none has checksums (written by hand or before checksums) is taken as it is."""
    if ckpt.parent.name != CHECKPOINTS:
        return
    if ckpt.name.startswith(TMP_PREFIX):
        raise LcftError(f"{ckpt} is not a finished checkpoint: a save or prune under way, or one that was stopped "
                        "(a checkpoint is named step-N once it is complete); give the run folder or a step-N")
    run = list_checkpoints(ckpt.parent.parent)
    if STEP_DIR.fullmatch(ckpt.name) and any(os.path.lexists(p / CHECKSUMS) for _, p in run):
        raise LcftError(f"checkpoint {ckpt} is incomplete: no {CHECKSUMS}")


def newest_good_checkpoint(run_dir: str | os.PathLike, say: Callable[[str], None] | None = None) -> Path | None:
    """The run's newest checkpoint that verifies; each newer corrupt one is reported through `say`. One without
    checksums.json counts as incomplete when others of the run have one (this lcft writes it into every
    checkpoint); a run where none has one (written by hand or before checksums) is taken as it is."""
    for _, ckpt in reversed(list_checkpoints(run_dir)):
        try:
            if not verify_checkpoint(ckpt):
                _refuse_unfinished(ckpt)
            return ckpt
        except LcftError as e:
            if say is not None:
                say(f"skipping {ckpt.name}: {e}")
    return None


def resolve_checkpoint(path: str | os.PathLike, weights: bool = True) -> Path:
    """A model folder (a checkpoint, or any HF folder with config.json) -> itself; a run folder -> its latest
    checkpoint; a Hub id ORG/NAME[@REVISION] -> its snapshot in the Hub cache (lcft.hub). A checkpoint with
    checksums is verified (an error names the corrupt file). weights=False: a Hub id's config, lcft.json and
    tokenizer files only (lcft.hub.local_path)."""
    return _checked(locate_checkpoint(path, weights))


def locate_checkpoint(path: str | os.PathLike, weights: bool = True) -> Path:
    """The folder resolve_checkpoint takes `path` to, not verified (no file hashed)."""
    p = local_path(path, weights, also=(MODEL_META,))  # an lcft export on the Hub: its attention and tokenizer
    if not p.exists():
        raise LcftError(f"checkpoint not found: {p} (give a checkpoint, a run or an HF model folder)"
                        f"{read_as_path(path)}")
    if not p.is_dir():
        raise LcftError(f"checkpoint must be a folder (a run, a checkpoint, or an HF model folder): {p}")
    if present(p / MODEL_CONFIG, "model config"):  # a link to nothing or a folder there: said, not 'no config.json'
        return p
    if checkpoints_dir(p).is_dir():
        latest = latest_checkpoint(p)
        if latest is None:
            raise LcftError(f"run folder {p} has no complete checkpoint under {checkpoints_dir(p)} yet")
        return latest
    if (p / EXPORT_WORK).exists():  # an export killed while moving its files in: config.json goes back last
        raise LcftError(f"{p} holds no complete model: an `lcft export` into it was stopped midway; run the same "
                        "export again")
    if p.name == CHECKPOINTS and (latest := latest_checkpoint(p.parent)) is not None:  # the run's, one level down
        raise LcftError(f"{p} holds a run's checkpoints: give the run folder {p.parent} (its latest) or one "
                        f"checkpoint, such as {latest}")
    raise LcftError(f"{p} is not a run folder, a checkpoint folder or an HF model folder (no {MODEL_CONFIG})")


def locate_local(given: str | os.PathLike) -> Path | None:
    """The folder `given` names, found but not verified (locate_checkpoint), or None for a Hub id (looked up when
    it is read): what a check before the work tells without the network or a hash."""
    return None if hub_id(given) is not None else locate_checkpoint(given)


def names_run(given: str | os.PathLike) -> bool:
    """Whether `given` is a run folder, which resolve_checkpoint takes as its latest checkpoint (not a model folder,
    a checkpoint, or a Hub id)."""
    p = Path(given)
    return p.is_dir() and not (p / MODEL_CONFIG).is_file() and checkpoints_dir(p).is_dir()


T = TypeVar("T")


def read_checkpoint(given: str | os.PathLike, read: Callable[[Path], T], first: Callable[[], T] | None = None,
                    weights: bool = True) -> T:
    """`read(path)` of the checkpoint `given` means (resolve_checkpoint), or `first()`: the caller's read of the
    checkpoint it resolved `given` to before. A run folder means its latest checkpoint, which the run may prune
    (--keep-last) or save again while it is read: when the read says so (CheckpointChanged), the run's latest is
    resolved again and read once more, and a second change is the one-line error (a run saving faster than its
    checkpoint reads would be chased forever). A checkpoint named itself is read once: its change is the error;
    so is any change in a launch of several processes. weights=False: `read` reads no weights (a Hub id's are not
    downloaded)."""
    try:
        return first() if first is not None else read(resolve_checkpoint(given, weights))
    except CheckpointChanged:
        if not names_run(given) or launched():  # each process of a launch resolves on its own: they could
            raise  # land on different checkpoints, one rank's weights trained or evaluated beside another's
    return read(resolve_checkpoint(given, weights))


def refuse_out_inside(out: str | os.PathLike, checkpoint: Path, what: str) -> None:
    """--out must not be the checkpoint read, or inside it: `what` written there would replace the checkpoint's
    files (its checksums no longer holding), or go when a run prunes it (--keep-last)."""
    if resolved(out).is_relative_to(resolved(checkpoint)):
        raise LcftError(f"--out {out} is the checkpoint {checkpoint}, or inside it: write {what} to another folder")


# What lcft reads back from a folder, by what it holds (the first match wins: a checkpoint also has config.json)
FOLDER_KINDS = {
    "checkpoint": "a checkpoint (it has trainer_state/ or checksums.json)",
    "run": "a training run's folder (it has checkpoints/ or config.toml)",
    "model": "a model folder (it has config.json)",
    "windows": "a prepared windows folder (it has manifest.json)",
}


def folder_kind(path: Path) -> str | None:
    """Which of FOLDER_KINDS `path` is, or None (no folder, or none of them)."""
    if (path / STATE_DIR).is_dir() or (path / CHECKSUMS).is_file():
        return "checkpoint"
    if checkpoints_dir(path).is_dir() or (path / RUN_CONFIG).is_file():
        return "run"
    if (path / MODEL_CONFIG).is_file():
        return "model"
    from lcft.genomics.shards import MANIFEST  # (lazy: the checkpoint component needs no genomics to load)

    return "windows" if (path / MANIFEST).is_file() else None


def check_output_folder(out: str | os.PathLike, writes: str, allowed: tuple[str, ...] = (),
                        **inputs: str | os.PathLike) -> None:
    """`out` may take what a command `writes` ('the windows', 'the run', ...): a new folder or one of the
    `allowed` kinds (a file there or above it refused: `expect_folder`), neither one of the command's `inputs`
    (option name -> path) nor the folder of an input file.
    Anything else mixes outputs into a folder lcft reads back as another thing (a model folder with a run in it
    resolves to the model, not the run's latest checkpoint; a windows folder with a run in it is still --data).
    Writes nothing."""
    out = Path(out)
    expect_folder(out, "--out")
    for option, given in inputs.items():
        folder = Path(given).parent if Path(given).is_file() else Path(given)
        if resolved(out) == resolved(folder):
            verb = "is" if folder == Path(given) else "holds"
            raise LcftError(f"--out {out} {verb} --{option} {given}; choose another --out for {writes}")
    kind = folder_kind(out)
    if kind is not None and kind not in allowed:
        raise LcftError(f"--out {out} is {FOLDER_KINDS[kind]}; choose another --out for {writes}")


def resolve_resume(resume: str, run_dir: str | os.PathLike, say: Callable[[str], None] | None = None) -> Path:
    """'auto' -> the newest checkpoint of run_dir that verifies (corrupt newer ones are reported through `say`
    and passed over); a run folder -> its latest; a checkpoint folder -> itself (both verified: a corrupt one
    is an error naming the file). The result holds trainer state (an HF folder without it cannot be resumed,
    only used as --init)."""
    if resume == "auto":
        if latest_checkpoint(run_dir) is None:
            raise LcftError(f"--resume auto: no checkpoint in {checkpoints_dir(run_dir)} "
                            "(drop --resume to start a new run)")
        ckpt = newest_good_checkpoint(run_dir, say)
        if ckpt is None:
            raise LcftError(f"--resume auto: every checkpoint in {checkpoints_dir(run_dir)} is corrupt; move that "
                            "folder aside to start the run again there (without --resume), or choose another --out")
        if say is not None and ckpt != latest_checkpoint(run_dir):
            say(f"resuming from {ckpt.name}, the newest checkpoint that verifies")
        return ckpt
    p = Path(resume)
    if (p / STATE_DIR).is_dir():
        return _checked(p)
    if p.is_dir() and (ckpt := latest_checkpoint(p)) is not None:
        return _checked(ckpt)
    raise LcftError(f"--resume {resume}: not a checkpoint folder (no {STATE_DIR}/) nor a run with checkpoints")


def config_file(directory: Path) -> Path:
    """`directory`'s config.json; a one-line error when it has none."""
    if not (directory / MODEL_CONFIG).is_file():
        raise LcftError(f"{directory}: no {MODEL_CONFIG}; not a model checkpoint folder")
    return directory / MODEL_CONFIG


def read_model_config(ckpt: Path) -> dict[str, Any]:
    """config.json of a model folder, as recorded (a small file: MAX_MODEL_JSON_BYTES)."""
    return read_json(config_file(ckpt), limit=MAX_MODEL_JSON_BYTES)


def read_meta_file(ckpt: Path) -> dict[str, Any]:
    """lcft.json of a model folder as written, a small file (MAX_MODEL_JSON_BYTES): its attention block, tokenizer
    spec (a list of tokens only for lcft's char vocabulary: 9) and "weights" are a few KB, an export's record of
    its files ~150 bytes a file. One of another format_version (a newer lcft's) is refused: its fields may mean
    something else."""
    meta = read_json(ckpt / MODEL_META, limit=MAX_MODEL_JSON_BYTES)
    if meta.get("format_version", MODEL_META_VERSION) != MODEL_META_VERSION:
        raise LcftError(f"{ckpt / MODEL_META}: format_version {shown(meta['format_version'])}, this lcft reads "
                        f"{MODEL_META_VERSION}")
    return meta


def read_model_meta(ckpt: Path) -> dict[str, Any]:
    """lcft.json of a model folder (attention settings, tokenizer spec); {} for a folder transformers wrote (none
    there; one that is no regular file is refused: `present`)."""
    if not present(ckpt / MODEL_META):
        return {}
    meta = read_meta_file(ckpt)
    if meta.get("tokenizer") is not None and (why := spec_problem(meta["tokenizer"])):
        raise LcftError(f"{ckpt / MODEL_META}: corrupt tokenizer record ({why})")
    return meta


TRAIN_STEP = "prepare the data with the model's tokenizer (--tokenizer) or start from a model of the data's"
"""What to do about a tokenizer mismatch where a model is trained or planned from the data."""
EVAL_STEP = "prepare the held-out data with the checkpoint's tokenizer (lcft prepare windows --tokenizer {tokenizer})"
"""What to do about it where a checkpoint is evaluated: its weights are fixed, the data is not. `{tokenizer}` is
`char` for lcft's own vocabulary (a checkpoint of it carries no tokenizer file that --tokenizer could read), else
the checkpoint folder."""


def check_tokenizer(ckpt: Path, data_tokenizer: dict[str, Any], next_step: str = TRAIN_STEP) -> None:
    """A model folder must read the data's vocabulary (a mismatch names `next_step`, `{ckpt}` and `{tokenizer}` filled
    in): the tokenizer it records (ours do, in lcft.json; a
    published model by its own tokenizer.json, when the data was cut with a model tokenizer) gives the same ids
    (same content hash, lcft.genomics.hf_tokenizer.same_tokenizer), and config.json's vocab_size holds the
    data's ids (both checked: a spec alone would let a shrunk embedding through). A larger vocab_size beside a
    matching tokenizer is a padded embedding, as published models round theirs up (to a multiple of 64, say):
    its extra rows are never a label but stay in the softmax, as in transformers. Without a tokenizer to compare
    (char data, a folder transformers wrote) the size is the only evidence and must be equal."""
    from lcft.genomics.hf_tokenizer import describe, folder_tokenizer_spec, same_tokenizer, spec_difference

    spec = read_model_meta(ckpt).get("tokenizer")
    if spec is None and "sha256" in data_tokenizer:
        spec = folder_tokenizer_spec(ckpt)
        if spec is None:  # the vocabulary size alone would let another vocabulary of the same size through
            raise LcftError(f"{ckpt} holds no tokenizer (tokenizer.json, vocab.txt or lcft.json's record), so its ids "
                            f"cannot be checked against the data's ({describe(data_tokenizer)}); copy the model's "
                            "tokenizer files into it")
    if spec is not None and not same_tokenizer(spec, data_tokenizer):
        raise LcftError(f"checkpoint {ckpt} was trained with a different tokenizer than the data "
                        f"({describe(spec)} vs {describe(data_tokenizer)}: {spec_difference(spec, data_tokenizer)}); "
                        + next_step.format(ckpt=ckpt, tokenizer="char" if spec.get("name") == CHAR_NAME else ckpt))
    vocab, want = read_model_config(ckpt).get("vocab_size"), data_tokenizer.get("vocab_size")
    padded = spec is not None and isinstance(vocab, int) and isinstance(want, int) and vocab > want
    if vocab != want and not padded:
        why = "the data's vocabulary is larger than the model's embedding" if (vocab or 0) < (want or 0) else \
            "a model of another vocabulary cannot read these windows"
        raise LcftError(f"{ckpt}: vocab_size {vocab} differs from the data tokenizer's {want} ({why})")
