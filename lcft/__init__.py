"""lcft: long-context fine-tuning of language models on genomes."""

__version__ = "0.1.0"
