"""`beam-sft train`: `scripts/train.py` from an install, the launch options to `accelerate launch`."""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap

from beam_sft.cli import run_guarded
from beam_sft.errors import UsageError

# accelerate launch's options beam-sft train passes on (each takes a value).
LAUNCH_OPTIONS = ("--num_processes", "--config_file", "--num_machines", "--machine_rank", "--main_process_ip",
                  "--main_process_port", "--mixed_precision", "--rdzv_backend", "--max_restarts", "--monitor_interval")
HELP = "Fine-tune on Beam data (the options of scripts/train.py; `beam-sft train --help` lists them)"


def register(subparsers) -> None:
    # Parsed by TRL's parser in `main`, not here: the subcommand only dispatches (as `trl sft` does).
    parser = subparsers.add_parser("train", help=HELP, add_help=False, prefix_chars="\0")
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    parser.set_defaults(func=lambda args: main(args.argv))


def split_launch_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(accelerate launch's options, the training options) from one command line."""
    launch, rest = [], []
    args = iter(argv)
    for arg in args:
        name, eq, value = arg.partition("=")
        if name not in LAUNCH_OPTIONS:
            rest.append(arg)
        elif eq or (value := next(args, None)) is not None:
            launch += [name, value]
        else:
            raise UsageError(f"{name} needs a value")
    return launch, rest


def resolve_launch_config(launch: list[str]) -> list[str]:
    """`--config_file NAME` -> the shipped configs/accelerate/NAME.yaml (a path stays a path)."""
    from beam_sft.template.bundled import resolve_config

    out = list(launch)
    for i in range(0, len(out), 2):
        if out[i] == "--config_file":
            try:
                out[i + 1] = str(resolve_config(out[i + 1], kind="accelerate"))
            except ValueError as err:
                raise UsageError(f"--config_file {err}") from None
    if "--config_file" not in out and launched_world_size(out) > 1 and _cpu_only_without_default_config():
        # accelerate would start several CPU processes through mpirun, which without an MPI hostfile runs ONE
        # process silently (see configs/accelerate/cpu_ddp.yaml): torchrun over gloo instead.
        out += ["--config_file", str(resolve_config("cpu_ddp", kind="accelerate"))]
        print("beam-sft train: no GPU and no accelerate config: launching with the shipped cpu_ddp config "
              "(torchrun, gloo)", file=sys.stderr)
    return out


def _cpu_only_without_default_config() -> bool:
    import torch
    from accelerate.commands.config import default_config_file

    return not torch.cuda.is_available() and not os.path.isfile(default_config_file)


def launched_world_size(launch: list[str]) -> int:
    """The number of processes a launch would start (for the dry run's arithmetic)."""
    values = dict(zip(launch[::2], launch[1::2], strict=True))
    if "--num_processes" in values:
        return int(values["--num_processes"])
    if "--config_file" in values:
        import yaml

        with open(values["--config_file"], encoding="utf-8") as f:
            return int((yaml.safe_load(f) or {}).get("num_processes", 1))
    return 1


def launch(launch_args: list[str], train_args: list[str], output_dir: str | None = None) -> int:
    """`accelerate launch [launch_args] -m beam_sft.cli.train [train_args]` in this process. The launcher
    turns any worker's exit into 1: the status the workers wrote (run_status.json) is used, to requeue."""
    import subprocess
    import time

    from accelerate.commands.launch import launch_command, launch_command_parser

    from beam_sft.train.faults import read_status

    args = launch_command_parser().parse_args([*launch_args, "-m", "beam_sft.cli.train", *train_args])
    started = time.time()
    failure = None
    try:
        launch_command(args)
    except subprocess.CalledProcessError as err:
        failure = err.returncode or 1
    except SystemExit as err:  # accelerate's exit when its launcher was signalled: sys.exit(128 + signal)
        failure = err.code if isinstance(err.code, int) else 1
    except Exception as err:  # noqa: BLE001 - torchrun's ChildFailedError, or SignalException when the launcher was signalled
        failure = err
    status = read_status(output_dir, since=started) if output_dir and failure is not None else None
    if status and status.get("exit_code"):
        return int(status["exit_code"])
    if isinstance(failure, BaseException):
        raise failure
    return failure or 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_guarded(lambda _: _run(argv), None)


HELP_WIDTH, HELP_INDENT = 110, 37
# The short `--help`'s (option, what it does) besides the data settings, in command-line order.
LAUNCH_HELP = (
    ("--num_processes N", "processes (GPUs) to train on: the run goes through `accelerate launch`"),
    ("--config_file NAME|YAML", ("an accelerate config: a shipped one (cpu_ddp, multi_gpu, fsdp2, deepspeed_zero3, "
                                 "multi_node) or a path")),
    ("--num_machines, --machine_rank, --main_process_ip, --main_process_port", "several nodes (docs/training.md)"),
    ("--mixed_precision, --rdzv_backend, --max_restarts, --monitor_interval", "passed on to accelerate launch"),
)
MODEL_HELP = (
    ("--model_name_or_path PATH", "the checkpoint to fine-tune (default: the embedded tiny random model)"),
    ("--beamify true", "a base without the Beam template and markers: install them while training"),
    ("--use_peft true", "train LoRA adapters (--lora_r, --lora_alpha, --lora_target_modules)"),
    ("--load_in_4bit true", "QLoRA: 4-bit base weights (CUDA and bitsandbytes)"),
)
TRAINING_HELP = (
    ("--output_dir DIR", "where the model, checkpoints, data_stats.json and rejects.jsonl go"),
    ("--num_train_epochs N", "passes over the data"),
    ("--max_steps N", "optimizer steps instead of epochs"),
    ("--learning_rate LR", "the peak learning rate"),
    ("--per_device_train_batch_size N", "rows per process and step"),
    ("--gradient_accumulation_steps N", "steps whose gradients add up before each update"),
    ("--max_length N", "the sequence budget in tokens (longer records: --truncation_policy)"),
    ("--packing true", "several records per row, up to max_length tokens"),
    ("--eval_strategy steps|epoch", "evaluate the eval split (--eval_split_size) on a schedule"),
    ("--eval_beam true", "after training, score the eval split as `beam-sft eval` does"),
    ("--save_strategy, --save_steps", "when checkpoints are written"),
    ("--resume_from_checkpoint last", "go on from output_dir's newest complete checkpoint"),
    ("--seed N", "the run's seed (data order, eval split, the embedded model)"),
    ("--report_to none|tensorboard|wandb", "where the metrics are logged"),
)


def short_help() -> str:
    """`beam-sft train --help`: beam-sft's own options and the common training knobs (all: `--help-all`)."""
    from dataclasses import fields

    from beam_sft.dataset.arguments import PREPARE_ONLY, DataArguments
    from beam_sft.train.sft import DESCRIPTION

    def block(title: str, rows) -> list[str]:
        out = [f"{title}:"]
        for name, text in rows:
            wrapped = textwrap.wrap(text, HELP_WIDTH - HELP_INDENT, break_on_hyphens=False) or [""]
            out += [f"  {name}"] if len(name) > HELP_INDENT - 3 else []
            out += [f"  {name if len(name) <= HELP_INDENT - 3 and i == 0 else '':<{HELP_INDENT - 2}}{line}"
                    for i, line in enumerate(wrapped)]
        return out

    data = [(f"--{f.name}", _first_sentence(f.metadata.get("help", ""))) for f in fields(DataArguments)
            if f.name not in PREPARE_ONLY]
    lines = ["usage: beam-sft train [--config YAML|NAME] [OPTIONS] [LAUNCH OPTIONS]", "", DESCRIPTION,
             "Options are TRL-style (--name value); a YAML --config sets any of them, the command line wins.", "",
             *block("config", [("--config YAML|NAME", ("a YAML file of options, or a shipped config's name "
                                                       "(quickstart, beam_full, beam_lora, ...)"))]), "",
             *block("data (also in beam-sft prepare; docs/data.md)", data), "",
             *block("model", MODEL_HELP), "",
             *block("training (TRL's SFTConfig; docs/training.md)", TRAINING_HELP), "",
             *block("launch (to accelerate launch)", LAUNCH_HELP), "",
             *block("checks", [("--dry_run true", ("check and count everything, print the plan (steps, tokens, "
                                                   "memory); train nothing"))]), "",
             "All options, TRL's and transformers' included: beam-sft train --help-all"]
    return "\n".join(lines)


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    end = re.search(r"(?<!e\.g)(?<!i\.e)\.\s", text)
    return text if end is None else text[:end.start() + 1]


def _run(argv: list[str]) -> int:
    from beam_sft.train.sft import main as train_main
    from beam_sft.train.sft import make_parser

    if "--help-all" in argv or "--help_all" in argv:
        make_parser(prog="beam-sft train").print_help()
        return 0
    if "-h" in argv or "--help" in argv:
        print(short_help())
        return 0
    launch_args, train_args = split_launch_args(argv)
    launch_args = resolve_launch_config(launch_args)
    script_args, training_args, model_args = make_parser(prog="beam-sft train").parse_args_and_config(train_args)
    if script_args.dry_run:
        from beam_sft.train.dry_run import dry_run

        world = launched_world_size(launch_args) if launch_args else int(os.environ.get("WORLD_SIZE", "1"))
        print(dry_run(script_args, training_args, model_args, world_size=world))
        return 0
    if launch_args:
        return launch(launch_args, train_args, training_args.output_dir)
    train_main(script_args, training_args, model_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
