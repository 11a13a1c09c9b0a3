"""User-facing errors: the CLI prints their message on one line and exits non-zero, without a traceback."""


class LcftError(Exception):
    """A problem with the user's input or environment that they can fix; the message says how."""


def shown(value: object, limit: int = 80, quoted: bool = False) -> str:
    """A value read from a file, for a one-line message: a printable string as it is (unless `quoted`), anything
    else as its repr; cut to `limit` characters, since a crafted file can name anything, at any length."""
    if isinstance(value, str) and value.isprintable() and len(value) <= limit and not quoted:
        return value
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
