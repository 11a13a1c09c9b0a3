"""Calls into the `tokenizers` library: its errors and Rust panics as one line (`guarded`), and whether a
tokenizer.json encodes DNA to the ids prepare gives with lcft's reading of it (`encoding_difference` over
`dna_probes`)."""

from __future__ import annotations

import os
import string
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from typing import Any

import numpy as np

from lcft.errors import LcftError, reason
from lcft.genomics import tokenizer as char_vocab
from lcft.genomics.seq_tokenizer import UPPER, SeqTokenizer, is_char
from lcft.genomics.tokenizer_hash import is_letters

_FD2 = threading.RLock()  # one call at a time moves descriptor 2 (a second would save the first's file as stderr)


def _is_panic(e: BaseException) -> bool:
    """Whether `e` is a Rust panic raised through `tokenizers`."""
    return type(e).__name__ == "PanicException"  # pyo3's, derived from BaseException; its module is not importable


@contextmanager
def _panic_report_held() -> Iterator[None]:
    """Descriptor 2 into a temporary file while a `tokenizers` call runs, written back to stderr after it unless
    the call panicked: Rust's panic hook writes its report (location, backtrace under RUST_BACKTRACE) to descriptor 2
    itself, where `guarded` shows the panic's message in one line. Anything else written meanwhile (another
    thread's output, a warning) is shown, only later; what is written just before the process dies (a crash
    report, Rust's failed allocation) is lost, so only short calls are held (`guarded`)."""
    with _FD2:
        try:
            held = tempfile.TemporaryFile()  # noqa: SIM115 (closed below, after descriptor 2 is back)
        except OSError:  # nowhere to hold the report: the call writes to stderr as it is
            held = None
        saved, panicked = None, False
        try:
            if held is not None:
                with suppress(OSError):  # no stderr to keep clean
                    saved = os.dup(2)
            if saved is not None:
                if sys.stderr is not None:  # what Python holds for stderr goes out first, in order
                    sys.stderr.flush()
                os.dup2(held.fileno(), 2)  # inside the try: an interrupt just after it still puts stderr back
            yield
        except BaseException as e:
            panicked = _is_panic(e)
            raise
        finally:
            if saved is not None:
                os.dup2(saved, 2)
                os.close(saved)
                if not panicked:  # back to descriptor 2, where it was written
                    held.seek(0)
                    with open(2, "wb", closefd=False) as err:
                        err.write(held.read())
            if held is not None:
                held.close()


def guarded(call: Callable[[], Any], source: str, text: str = "this sequence", *, hold: bool = True,
            refusal: str | None = None) -> Any:
    """Run a `tokenizers` call; its errors (a bare Exception with the library's message, such as an unknown token
    its vocabulary lacks) and its Rust panics become one line (`refusal`, else that the library failed on `text`,
    then the library's message). With `hold` (a short call where a file meets the library first) a panic's report
    is kept off stderr (`_panic_report_held`); a long one (encoding bases a tokenizer already passed) writes to
    stderr as it goes: another thread's progress bar, a crash report."""
    try:
        with _panic_report_held() if hold else nullcontext():
            return call()
    except BaseException as e:
        if not _is_panic(e) and type(e) is not Exception:
            raise
        line = refusal or f"tokenizer {source}: the tokenizers library failed on {text}"
        raise LcftError(f"{line} ({reason(e, 200)})") from None


def dna_probes(data: dict[str, Any]) -> list[str]:
    """DNA an export is checked on: bases of both cases around N runs, every letter of both cases amid bases, and
    each letter added token, in both cases, alone and amid bases and other letters."""
    found = [t["content"] for t in data.get("added_tokens") or [] if is_letters(t.get("content"))]
    return (["ACGTTGCAacgtNNNNnnACGTRYacgtKMnACGTTA", string.ascii_uppercase + string.ascii_lowercase + "ACGT"]
            + [f"AC{c}GT{c.lower()}{c}{c}A" for c in string.ascii_uppercase]
            + [p for c in found for p in (c, c.lower(), c.upper(), f"AC{c}GT{c.lower()}NN{c.upper()}RY{c}A")])


def encoding_difference(tok: SeqTokenizer, text: str, probes: list[str], source: str = "export") -> str | None:
    """How tokenizer.json `text` (named `source` where the library fails on it) encodes one of `probes` to other ids
    than prepare does with `tok` (a probe prepare refuses, a letter it has no token for, is passed over); None
    when it gives the same ids for all."""
    from tokenizers import Tokenizer  # lazy: only model tokenizers need the library

    tk = guarded(lambda: Tokenizer.from_str(text), source, "its file")
    for probe in probes:
        raw = np.frombuffer(probe.encode(), np.uint8)
        try:
            want = (char_vocab.encode(UPPER[raw]) if is_char(tok) else  # char: prepare's byte table
                    tok.encode_chunk(UPPER[raw], tok.pieces(raw, 0))[0]).tolist()
        except LcftError:
            continue
        got = guarded(lambda p=probe: tk.encode(p, add_special_tokens=False).ids, source, repr(probe))
        if got != want:
            return f"{probe!r} would encode to {got[:8]} where prepare gives {want[:8]}"
    return None
