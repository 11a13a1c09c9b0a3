"""Command-line interface: thin typer wrappers that combine component configs and call library functions."""
