"""The rows of `benchmarks/data.py`, one module each, and what they share (workload, timing, the goal table)."""
