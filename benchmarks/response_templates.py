"""Prove that the serving form of the response template parses exactly like the earlier one.

The serving form (beam_sft/template/response_template.json today) differs from the earlier template in one
place: `thinking` lost `repeats: true, join: "\\n\\n"`, which vLLM's serving subset does not allow (issue 21).
This script parses a corpus with both and compares every result:

* every `parse_response` / streaming parse made while the given test files run (recorded in-process: each
  parser's prefix, tools and fed text), the check-template suite and the format page's examples included
  (parses inside a subprocess a test starts, e.g. the `beam-sft check-template` command, are not seen; the
  same suite runs in-process in tests/test_conformance.py and tests/test_serve.py);
* every assistant turn of the bundled samples and the real third-party samples, rendered by the chat
  template (prompt and continuation, as a generation would be parsed);
* the raw real Harmony transcripts, parsed whole.

# The default corpus (the parse-related test files, then the samples)
```bash
python -m benchmarks response-templates
```

# Only the rendered samples (fast)
```bash
python -m benchmarks response-templates --no-tests
```

Exit status 0 when every parse is equal, 1 otherwise (the differing inputs are printed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from copy import deepcopy
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_TESTS = (
    "tests/test_spec_examples.py",
    "tests/test_conformance.py",
    "tests/test_chat_template.py",
    "tests/test_tokenizer.py",
    "tests/test_formats_tools.py",
    "tests/test_evaluate.py",
    "tests/test_evaluate_metrics.py",
)
SAMPLE_GLOBS = ("data/samples/*", "tests/data/realdata/**/*.json", "tests/data/realdata/**/*.jsonl",
                "tests/data/realdata/**/*.traj")
HARMONY_TEXTS = "tests/data/realdata/harmony/**/*.txt"


def earlier_template(template: dict) -> dict:
    """The template as it was before the serving form: `thinking` repeated and joined with a blank line."""
    old = deepcopy(template)
    old["fields"]["thinking"].update({"repeats": True, "join": "\n\n"})
    return old


def _tools_json(tools) -> list | None:
    if not tools:
        return None
    from transformers.utils.chat_template_utils import get_json_schema

    return [get_json_schema(t) if callable(t) else t for t in tools]


@contextlib.contextmanager
def recording_parses(sink: list[dict]) -> Iterator[None]:
    """Record (prefix, tools, text) of every ResponseParser finalized while the block runs: `parse_response`
    and `tokenizer.parse_response` build one, and so do streaming parsers."""
    from transformers.utils.chat_parsing.response_parser import ResponseParser

    init, feed, finalize = ResponseParser.__init__, ResponseParser.feed, ResponseParser.finalize

    def rec_init(self, response_template, prefix=None, **kwargs):
        # keyword-only arguments pass through: transformers 5.25 added one beside `tools`
        init(self, response_template, prefix, **kwargs)
        self._rec = {"prefix": prefix, "tools": kwargs.get("tools"), "text": ""}

    def rec_feed(self, text):
        self._rec["text"] += text or ""
        return feed(self, text)

    def rec_finalize(self):
        try:
            sink.append({"prefix": self._rec["prefix"], "tools": _tools_json(self._rec["tools"]),
                         "text": self._rec["text"]})
        except Exception:  # noqa: BLE001 - tools that cannot be described are cast the same by both templates
            sink.append({"prefix": self._rec["prefix"], "tools": None, "text": self._rec["text"]})
        return finalize(self)

    ResponseParser.__init__, ResponseParser.feed, ResponseParser.finalize = rec_init, rec_feed, rec_finalize
    try:
        yield
    finally:
        ResponseParser.__init__, ResponseParser.feed, ResponseParser.finalize = init, feed, finalize


def rendered_turns(tokenizer, patterns=SAMPLE_GLOBS) -> Iterator[dict]:
    """(prefix, tools, text) of every assistant turn of every sample record that converts and renders (turns
    without reasoning kept, `missing_reasoning="keep"`: they render and parse like any other)."""
    from beam_sft.records.files import read_items
    from beam_sft.validate.convert import convert_item
    from beam_sft.validate.rules import Options

    files = sorted({str(p) for g in patterns for p in REPO.glob(g) if p.is_file() and p.name != "SOURCES.md"})
    keep = Options(missing_reasoning="keep")
    for item in read_items(files, "test"):
        record, _, _ = convert_item(item, "auto", keep)
        if record is None:
            continue
        tools, kwargs = record.get("tools") or None, record.get("chat_template_kwargs") or {}
        messages = record["messages"]
        for i, message in enumerate(messages):
            if message.get("role") != "assistant" or i == 0:
                continue
            try:
                prompt = tokenizer.apply_chat_template(messages[:i], tools=tools, tokenize=False,
                                                       add_generation_prompt=True, **kwargs)
                full = tokenizer.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False, **kwargs)
            except Exception:  # noqa: BLE001, S112 - a record the template refuses has no turn to parse
                continue
            if full.startswith(prompt):
                yield {"prefix": prompt, "tools": tools, "text": full[len(prompt):]}


def harmony_texts() -> Iterator[dict]:
    for path in sorted(REPO.glob(HARMONY_TEXTS)):
        yield {"prefix": "", "tools": None, "text": path.read_text(encoding="utf-8")}


def _parse(text: str, template: dict, prefix: str, tools) -> tuple[str, object]:
    from transformers.utils.chat_parsing import parse_response

    try:
        return "ok", parse_response(text, template, prefix=prefix, tools=tools)
    except Exception as err:  # noqa: BLE001 - both templates must fail alike too
        return "error", f"{type(err).__name__}: {err}"


def compare(corpus: list[dict], new: dict, old: dict) -> tuple[int, list[dict]]:
    """(distinct inputs, those whose parses differ). Equal means equal dicts in equal key order."""
    seen, differing = set(), []
    for case in corpus:
        key = json.dumps(case, sort_keys=True, ensure_ascii=False, default=str)
        if key in seen:
            continue
        seen.add(key)
        a = _parse(case["text"], new, case["prefix"] or "", case["tools"])
        b = _parse(case["text"], old, case["prefix"] or "", case["tools"])
        if a != b or (a[0] == "ok" and list(a[1]) != list(b[1])):
            differing.append({**case, "new": a, "old": b})
    return len(seen), differing


def run_tests(paths: list[str], sink: list[dict]) -> int:
    import pytest

    with recording_parses(sink):
        return int(pytest.main(["-q", "-p", "no:cacheprovider", *paths]))


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks response-templates", description=__doc__.split("\n\n")[0])
    parser.add_argument("tests", nargs="*", default=list(DEFAULT_TESTS), help="test files whose parses to record")
    parser.add_argument("--no-tests", action="store_true", help="skip the test files; samples only")
    parser.add_argument("--json", help="write the counts per corpus here")
    return parser


def main(argv: list[str] | None = None) -> int:
    from beam_sft.template import response_template
    from beam_sft.template.tokenizer import load_tokenizer

    args = make_parser().parse_args(argv)
    new = response_template()
    old = earlier_template(new)
    sources: dict[str, list[dict]] = {}
    if not args.no_tests:
        sources["test-suite parses"] = []
        if rc := run_tests(args.tests, sources["test-suite parses"]):
            print(f"the tests failed (exit {rc}); the comparison still covers what they parsed", file=sys.stderr)
    sources["rendered sample turns"] = list(rendered_turns(load_tokenizer()))
    sources["raw Harmony transcripts"] = list(harmony_texts())
    failed = False
    counts = {}
    for name, corpus in sources.items():
        distinct, differing = compare(corpus, new, old)
        counts[name] = {"parses": len(corpus), "distinct": distinct, "differ": len(differing)}
        print(f"{name}: {len(corpus)} parses, {distinct} distinct inputs, {len(differing)} differ")
        for case in differing[:10]:
            print(json.dumps(case, ensure_ascii=False, default=str)[:2000])
        failed |= bool(differing)
    if args.json:
        Path(args.json).write_text(json.dumps(counts, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
