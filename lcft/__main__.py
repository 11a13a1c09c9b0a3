"""`python -m lcft` runs the CLI."""

from lcft.cli.app import main

main()
