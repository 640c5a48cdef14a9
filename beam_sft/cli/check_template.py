"""`beam-sft check-template TOKENIZER`: check a tokenizer's templates against the Beam Harmony page.

Run the Beam Harmony conformance suite on a tokenizer: every example of the format page (rule names 'page: ...',
run verbatim and compared with the page's output) and the format rules (single-token markers, only <|return|>
special, exact assistant masks, prompt prefixes, encode/decode round trip, response parsing). Exit status 1 if
any rule fails.

    beam-sft check-template data/tokenizer
    beam-sft check-template ./my-beamified-tokenizer --diff      # show page-vs-template diffs
    beam-sft check-template data/tokenizer --only 'page:*'       # just the page examples
"""

from __future__ import annotations

import fnmatch
import sys

from beam_sft.cli import add_command, check_local, command_main


def register(subparsers) -> None:
    parser = add_command(
        subparsers, "check-template", run,
        "Check a tokenizer's chat/response templates against the Beam Harmony format page.",
        *__doc__.split("\n\n", 2)[1:])
    parser.add_argument("tokenizer", metavar="TOKENIZER", help="tokenizer directory or hub id")
    parser.add_argument("--diff", action="store_true", help="print a unified diff under each failed page example")
    parser.add_argument("--only", metavar="GLOB", action="append",
                        help="run only rules whose name matches (repeatable)")
    parser.add_argument("--spec", metavar="FILE", help="format page to take examples from (default: the bundled copy)")


def run(args) -> int:
    from transformers import AutoTokenizer

    from beam_sft.errors import FatalError, UsageError
    from beam_sft.template import conformance

    check_local(args.tokenizer, "TOKENIZER", "pass a tokenizer directory (the bundled one: data/tokenizer)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    except (OSError, ValueError) as err:
        raise FatalError(f"cannot load tokenizer {args.tokenizer!r}: {err}") from err
    try:
        page = conformance.load_spec(args.spec)
    except OSError as err:
        raise UsageError(f"cannot read spec page: {err}") from err
    results = conformance.run_suite(tokenizer, args.tokenizer, page=page)
    if args.only:
        results = [r for r in results if any(fnmatch.fnmatchcase(r.name, g) for g in args.only)]
        if not results:
            raise UsageError(f"no rule matches {' or '.join(args.only)}")
    for result in results:
        print(result.line())
        if args.diff and (diff := result.diff()):
            print("".join("    " + line for line in diff.splitlines(keepends=True)).rstrip("\n"))
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed} passed, {failed} failed", file=sys.stderr)
    return 1 if failed else 0


main = command_main(__name__, register, "check-template")
