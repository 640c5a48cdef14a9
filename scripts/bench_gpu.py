"""`python scripts/bench_gpu.py [options]` = `python -m benchmarks gpu [options]`: kept at this path because the
standing GPU request names it. The benchmark is benchmarks/gpu.py; this records its row in benchmarks/results.jsonl."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["gpu", *sys.argv[1:]]))
