"""Genome data: FASTA reading, tokenization, fixed-length windows, shards and dataset readers."""
