"""`beam-sft beamify BASE -o DIR`: make a base model a Beam base model, ready to fine-tune and to serve.

    beam-sft beamify outputs/base/smollm2 -o outputs/base/smollm2-beam
    beam-sft beamify Qwen/Qwen2.5-0.5B-Instruct -o qwen-beam --dtype bfloat16    # a cached hub id
    beam-sft beamify outputs/base/smollm2 -o /tmp/mean-init --init mean           # the old init, to compare

DIR is written only when it passes every check-template rule and is servable as is (what beamify changes:
docs/cli.md; the initialisation measured: docs/real-model.md).
"""

from __future__ import annotations

import json
import sys

from beam_sft.cli import add_command, check_local, command_main


def register(subparsers) -> None:
    from beam_sft.model.marker_init import DEFAULT_INIT, INIT_CHOICES
    from beam_sft.serve.save import DTYPES

    parser = add_command(
        subparsers, "beamify", run,
        "Make a base model a Beam base: markers, templates, embeddings grown and initialised, eos list.",
        *__doc__.split("\n\n", 1))
    parser.add_argument("base", metavar="BASE", help="a base model directory or a cached hub id")
    parser.add_argument("-o", "--output", required=True, metavar="DIR", help="the Beam base model directory to write")
    parser.add_argument("--init", choices=INIT_CHOICES, default=DEFAULT_INIT,
                        help="how the new rows start (default: %(default)s; mean: all equal, for comparison)")
    parser.add_argument("--dtype", choices=DTYPES, default="auto", help="dtype to load and save in (default: auto)")
    parser.add_argument("--json", action="store_true", help="print what was done as JSON on stdout")


def run(args) -> int:
    from beam_sft.model.beamify import beamify_directory, describe

    check_local(args.base, "BASE", "pass a base model directory (scripts/build_base_model.py builds one) or a cached hub id")
    print(f"beamifying {args.base} -> {args.output} ...", file=sys.stderr)
    report = beamify_directory(args.base, args.output, init=args.init, dtype=args.dtype)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(describe(report)))
    return 0


main = command_main(__name__, register, "beamify")
