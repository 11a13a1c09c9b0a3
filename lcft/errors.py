"""User-facing errors: the CLI prints their message on one line and exits non-zero, without a traceback."""


class LcftError(Exception):
    """A problem with the user's input or environment that they can fix; the message says how."""
