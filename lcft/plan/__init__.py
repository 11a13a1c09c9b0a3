"""Planning a training layout before it runs: per-rank memory from the model config (`lcft plan`)."""
