"""The Llama-style decoder (single-process; parallelism is applied from outside by lcft.parallel)."""
