"""tests/gpu: compiled Triton kernels on a real GPU (`pytest -m gpu`; skipped without CUDA, see tests/conftest.py)."""
