"""beam-sft's benchmarks: `python -m benchmarks NAME` runs one and records its row (benchmarks/__main__.py)."""
