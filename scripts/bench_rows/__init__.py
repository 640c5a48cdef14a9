"""The rows of `scripts/bench.py`, one module each, and what they share (workload, timing, the goal table)."""
