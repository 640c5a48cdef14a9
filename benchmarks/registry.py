"""The benchmarks `python -m benchmarks` knows, and where their rows and page live (one place, read by the
entry and by the report)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results.jsonl"
PAGE = REPO / "docs" / "performance.md"

# name -> (module, what it measures); the order is the order of `list` and of docs/performance.md
BENCHMARKS = {
    "data": ("data", "the data path and tiny-model training, side by side with TRL and the floors (the goal table)"),
    "convert": ("convert", "OpenAI -> Beam conversion against an orjson load+dump floor"),
    "dedup": ("dedup", "the dedup table (flat arrays) against the dict it replaced: bytes and time per record, two sizes"),
    "prepare": ("prepare", "`beam-sft prepare` on a 201k-token vocabulary at two sizes: rate, peak RSS, workers"),
    "gpu": ("gpu", "training throughput, MFU and peak memory on one GPU, padded vs packed"),
    "reasoning": ("reasoning", "reasoning policies (mask / drop / keep) trained and evaluated on the tiny model"),
    "marker-init": ("marker_init", "beamify's marker-row init (mean vs semantic) on the real SmolLM2 base"),
    "backfill": ("backfill", "`beam-sft backfill` with a real local teacher on real records"),
    "response-templates": ("response_templates", ("the current response template against the earlier one, on every "
                                                 "parse the tests make")),
    "faults": ("faults", ("SIGKILL (some inside a save), SIGTERM, a full disk and a dead rank (DDP, FSDP2 on 2 CPU "
                          "ranks) injected into tiny-model runs, each resumed with --resume_from_checkpoint last: "
                          "steps lost, repeated and missing, loss against the uninterrupted run")),
}
