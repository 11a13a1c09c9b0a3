"""Checkpoints of a run: reading and writing its stateful parts without running code from any file."""
