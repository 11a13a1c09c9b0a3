"""`python -m lcft` and the `lcft` command: load the command line and run it; Ctrl-C while it loads ends quietly."""

import sys


def main() -> None:
    """The CLI (lcft.cli.app.main). Its imports take a second or more: a Ctrl-C in them, or anywhere outside a
    command, exits 130 with one word as it does inside one (lcft.cli.common.user_errors), not a traceback."""
    try:
        from lcft.cli.app import main as run

        run()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
