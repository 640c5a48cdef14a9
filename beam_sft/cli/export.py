"""`beam-sft export CHECKPOINT -o DIR`: a checkpoint, or a base model + LoRA adapter, into a directory that
vLLM, SGLang or `transformers serve` loads as is; prints the commands that serve it.

    beam-sft export outputs/quickstart/model -o outputs/quickstart/served
    beam-sft export outputs/run/checkpoint-200 -o outputs/run/served --dtype bfloat16
    beam-sft export outputs/beam-lora -o outputs/beam-merged --merge          # a LoRA-only output: its base + it
    beam-sft export my-org/base -o merged --adapter outputs/beam-lora --merge

DIR is renamed into place only when every check passes (what it gets and what is checked: docs/serving.md).
"""

from __future__ import annotations

import sys

from beam_sft.cli import add_command, check_local, command_main


def register(subparsers) -> None:
    from beam_sft.serve.save import DTYPES

    parser = add_command(
        subparsers, "export", run,
        "Write a checkpoint (or base + LoRA, merged) as a servable model directory; print serve commands.",
        *__doc__.split("\n\n", 1))
    parser.add_argument("checkpoint", metavar="CHECKPOINT",
                        help="a saved model directory (scripts/train.py output, a checkpoint-N directory), a "
                             "LoRA-only output (applied to the base its adapter_config.json names), or the base "
                             "model for --adapter (a directory or a cached hub id)")
    parser.add_argument("-o", "--output", required=True, metavar="DIR",
                        help="the servable directory to write (replaced if it exists)")
    parser.add_argument("--adapter", metavar="PATH", default=None, help="a LoRA adapter (peft) to merge into CHECKPOINT")
    parser.add_argument("--merge", action="store_true",
                        help="merge the adapter into the weights (required with an adapter)")
    parser.add_argument("--dtype", choices=DTYPES, default="auto",
                        help="dtype to load and save the weights in (default: auto, as saved)")
    parser.add_argument("--name", default="beam", help="model name in the printed serve commands (default: beam)")


def run(args) -> int:
    from beam_sft.model.export import export, serve_commands

    check_local(args.checkpoint, "CHECKPOINT", "pass the directory scripts/train.py saved (its --output_dir, or a "
                "checkpoint-N directory in it)")
    print(f"exporting {args.checkpoint} -> {args.output} ...", file=sys.stderr)
    report = export(args.checkpoint, args.output, adapter=args.adapter, merge=args.merge, dtype=args.dtype)
    merged = f" + {report['adapter']} merged" if report["adapter"] else ""
    print(f"wrote {report['output']} ({report['base']}{merged}); eos_token_id {report['eos_token_id']}; "
          f"response_template servable ({report['template_check']}'s check); check-template: all rules pass",
          file=sys.stderr)
    print(serve_commands(report["output"], report["model_type"], name=args.name))
    return 0


main = command_main(__name__, register, "export")
