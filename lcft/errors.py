"""User-facing errors: the CLI prints their message on one line and exits non-zero, without a traceback; how a
value read from a file, or what a library's exception says about one, is shown in one; and the name a mistyped one
was likely meant to be."""

import difflib
import reprlib
import shlex
from collections.abc import Iterable

RESUME = "run the same command again to resume"  # what a user does after a stop of a command that resumes


class LcftError(Exception):
    """A problem with the user's input or environment that they can fix; the message says how."""

    exit_code: int = 1
    """The command's exit code on this error (a few carry their own: a lost rank, a stop signal)."""


class _Bounded(reprlib.Repr):
    """reprlib's repr with every limit small (three levels, four items a container, cut strings and numbers):
    plain data shown as Python writes it, anything else only by its type name (its own repr could be anything)."""

    PLAIN = (bool, float, complex, type(None), bytes, bytearray)

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxtuple = self.maxlist = self.maxarray = self.maxdict = self.maxset = self.maxfrozenset = 4
        self.maxdeque = 4
        self.maxstring = self.maxlong = self.maxother = limit

    def repr_int(self, x: int, level: int) -> str:
        return repr(x) if x.bit_length() <= 128 else f"<int of {x.bit_length()} bits>"

    def repr_instance(self, x: object, level: int) -> str:
        if type(x) in self.PLAIN:
            return repr(x[:self.maxstring] if isinstance(x, bytes | bytearray) else x)
        return f"<{type(x).__name__}>"


def shown(value: object, limit: int = 80, quoted: bool = False) -> str:
    """A value read from a file, for a one-line message: a printable string as it is (unless `quoted`), anything
    else as a bounded repr (_Bounded: a crafted file can nest, share and repeat anything at any length); cut to
    `limit` characters."""
    if isinstance(value, str) and value.isprintable() and len(value) <= limit and not quoted:
        return value
    try:
        text = _Bounded(limit).repr(value)
    except Exception:  # a value whose parts refuse even a bounded repr: named by its type
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def reason(e: BaseException, limit: int = 300) -> str:
    """What a library's exception says, for a one-line message: its lines joined by spaces, any character that is
    not printable escaped (a crafted file's record name or key can hold newlines and terminal escapes, which a
    library quotes as they are), cut to `limit` characters; its type's name when it says nothing."""
    text = printable(" ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def is_oom(e: BaseException) -> bool:
    """Whether `e` is running out of memory: Python's MemoryError, or torch's (a RuntimeError: CUDA's
    OutOfMemoryError, 'CUDA out of memory', or the CPU allocator's 'can't allocate memory')."""
    msg = str(e).lower()
    return isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and (
        type(e).__name__ == "OutOfMemoryError" or "out of memory" in msg or "can't allocate memory" in msg))


def printable(text: str, keep: str = "") -> str:
    """`text` with every character that is not printable (a terminal escape, a bell, a newline unless `keep`
    holds it) written as its Python escape, so text from a handed file cannot drive the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


def shell_word(path: object) -> str:
    """A path as one word of a command a message suggests, to paste into a shell as it is: quoted where the shell
    would split or expand it (a space, a quote, '$'), and a relative one starting with '-' as './-...', which no
    command reads as an option."""
    text = str(path)
    return shlex.quote("./" + text if text.startswith("-") else text)


def closest(given: str, names: Iterable[str]) -> str | None:
    """The name a mistyped `given` was likely meant to be: one equal but for '-' and '_' ('seq-len' -> 'seq_len'),
    else the closest spelling (difflib: 'precison' -> 'precision', 'bf61' -> 'bf16'); None when none is close."""
    names = sorted(names)
    flat = given.replace("-", "").replace("_", "")
    same = [n for n in names if n.replace("_", "") == flat]
    close = same or difflib.get_close_matches(given, names, n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(meant: str | None) -> str:
    """' (did you mean X?)' to end a message with, or '' without a guess."""
    return f" (did you mean {meant!r}?)" if meant else ""
