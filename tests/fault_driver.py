"""A training run for the fault tests (tests/test_faults.py, benchmarks/faults.py): scripts/train.py's job with
hooks that let a test place a real signal where it wants one.

    python tests/fault_driver.py HOOKS.json -- TRAIN_OPTIONS...

HOOKS.json (every key optional):
  losses       a file: one JSON line per logged step {"step", "loss", "grad_norm", "rank"}
  pids         a directory: each rank writes rank<N>.pid at train begin
  pause_step   at this step's end, write `ready` and sleep `pause_s` seconds (the test signals the run then)
  pause_rank   only this rank pauses (default: every rank)
  save_pause   pause inside the save of checkpoint-<save_pause>, after the weights and optimizer are written
               and before the trainer state (the moment a kill leaves a half checkpoint)
Exits with the status `beam-sft train` would (0, 65, 74, 75, 1, 2).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _hooks(spec: dict):
    from transformers import TrainerCallback

    rank = int(os.environ.get("RANK", "0"))

    def pause() -> None:
        Path(spec["ready"]).write_text(str(os.getpid()))
        time.sleep(float(spec.get("pause_s", 30)))

    class Hooks(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            if spec.get("pids"):
                Path(spec["pids"]).mkdir(parents=True, exist_ok=True)
                Path(spec["pids"], f"rank{rank}.pid").write_text(str(os.getpid()))

        def on_log(self, args, state, control, logs=None, **kwargs):
            if spec.get("losses") and logs and "loss" in logs:
                with open(spec["losses"], "a", encoding="utf-8") as out:
                    out.write(json.dumps({"step": state.global_step, "loss": logs["loss"],
                                          "grad_norm": logs.get("grad_norm"), "rank": rank}) + "\n")

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == spec.get("pause_step") and spec.get("pause_rank", rank) == rank:
                pause()

    if spec.get("save_pause") is not None:
        from transformers import Trainer

        original = Trainer._save_rng_state

        def _save_rng_state(self, output_dir):
            original(self, output_dir)
            if self.state.global_step == spec["save_pause"] and rank == 0:
                pause()

        Trainer._save_rng_state = _save_rng_state
    return Hooks()


def main() -> int:
    from beam_sft.cli import run_guarded
    from beam_sft.train.sft import main as train_main
    from beam_sft.train.sft import make_parser

    split = sys.argv.index("--")
    spec = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    argv = sys.argv[split + 1:]
    hooks = _hooks(spec)
    return run_guarded(lambda _: train_main(*make_parser().parse_args_and_config(argv), callbacks=[hooks]) and 0,
                       None)


if __name__ == "__main__":
    sys.exit(main())
