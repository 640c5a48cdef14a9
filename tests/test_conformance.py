"""The check-template suite: spec parsing, the CLI, and that each rule both passes and fails when it should."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizer_factories import FACTORIES

from beam_sft.cli import check_template
from beam_sft.model.beamify import beamify
from beam_sft.template import conformance
from beam_sft.template.tokenizer import DEFAULT_TOKENIZER_DIR, TEMPLATES_DIR, load_tokenizer, save_tokenizer

REPO = Path(__file__).resolve().parents[1]
HAVE_TEMPLATES = (TEMPLATES_DIR / "chat_template.jinja").is_file() and (
    TEMPLATES_DIR / "response_template.json"
).is_file()
needs_templates = pytest.mark.skipif(not HAVE_TEMPLATES, reason="beam_sft/template/ not written yet")

# A deliberately small template that follows the format rules (but renders no tools, so the page examples
# fail). Each broken variant below changes one thing; the tests show that exactly the matching rule flips.
MINI_TEMPLATE = """
{%- set ns = namespace(prev="") -%}
<|start|>system<|message|>Reasoning effort: 512<|end|>
{%- for m in messages -%}
{%- if m.role == "user" -%}<|start|>user<|message|>{{ m.content }}<|end|>
{%- elif m.role == "assistant" -%}
{%- if ns.prev != "assistant" -%}<|start|>assistant{%- endif -%}
{%- generation -%}
<|channel|>analysis<|message|>{{ m.reasoning_content }}<|end|>
{%- if m.tool_calls -%}
{%- for tc in m.tool_calls -%}<|start|>assistant to={{ tc.function.name }}<|channel|>analysis <|constrain|>xml<|message|>
{%- for k, v in tc.function.arguments.items() -%}<rfl:parameter name="{{ k }}">\n{{ v }}\n</rfl:parameter>
{%- if not loop.last %}\n{% endif -%}{%- endfor -%}
{%- if loop.last -%}<|call|>{%- else -%}<|end|>{%- endif -%}
{%- endfor -%}
{%- else -%}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|return|>
{%- endif -%}
{%- endgeneration -%}
{%- elif m.role == "tool" -%}<|start|>{{ m.name | default("tool") }} to=assistant<|channel|>analysis<|message|>{{ m.content }}<|end|>
{%- endif -%}
{%- set ns.prev = m.role -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}
"""

BROKEN_TEMPLATES = {
    # template change -> the rule that must fail
    "drops <|return|>": (("<|return|>", "<|end|>"), "mask-spans"),
    "masks the assistant header": (
        (
            '{%- if ns.prev != "assistant" -%}<|start|>assistant{%- endif -%}\n{%- generation -%}',
            '{%- generation -%}{%- if ns.prev != "assistant" -%}<|start|>assistant{%- endif -%}',
        ),
        "mask-spans",
    ),
    "leaves <|call|> out of the mask": (
        (
            "{%- if loop.last -%}<|call|>{%- else -%}<|end|>{%- endif -%}\n{%- endfor -%}\n{%- else -%}",
            (
                "{%- if loop.last -%}{% endgeneration %}<|call|>{% generation %}{%- else -%}<|end|>{%- endif -%}\n"
                "{%- endfor -%}\n{%- else -%}"
            ),
        ),
        "mask-stop-tokens",
    ),
    "generation prompt with a newline": (
        (
            "{%- if add_generation_prompt -%}<|start|>assistant",
            '{%- if add_generation_prompt -%}<|start|>assistant{{ "\\n" }}',
        ),
        "prefix-answer",
    ),
    "no generation block": (("{%- generation -%}", ""), "templates-installed"),
    "drops the reasoning": (("{{ m.reasoning_content }}", ""), "parse-rendered"),
}


@pytest.fixture(scope="module")
def spec_page():
    return conformance.load_spec()


@pytest.fixture
def mini_tok():
    tokenizer = load_tokenizer()
    tokenizer.chat_template = MINI_TEMPLATE
    return tokenizer


def _results(tokenizer) -> dict[str, conformance.RuleResult]:
    return {r.name: r for r in conformance.run_format_rules(tokenizer)}


# ------------------------------------------------------------------------------------------ spec parsing


def test_bundled_spec_is_the_repo_copy():
    assert (
        conformance.SPEC_PATH.read_bytes()
        == (REPO / "tests" / "data" / "spec" / "beam-harmony-format.md").read_bytes()
    )


def test_parse_spec_finds_every_accordion_example(spec_page):
    names = [ex.name for ex in spec_page.examples]
    assert names == [
        "page: Example: render a prompt",
        "page: Example: set the reasoning effort (1/2)",
        "page: Example: set the reasoning effort (2/2)",
        "page: Example: declare tools",
        "page: Example: built-in search and browse",
        "page: Example: the bash tool",
        "page: Example: send reasoning back (1/3)",
        "page: Example: send reasoning back (2/3)",
        "page: Example: send reasoning back (3/3)",
        "page: Example: render a tool loop",
        "page: Example: parallel calls",
        "page: Example: build a training mask",
        "page: Example: parse an answer",
        "page: Example: parse a tool call (1/2)",
        "page: Example: parse a tool call (2/2)",
        "page: Example: parse a stream",
    ]
    assert 'os.environ["BEAM_MODEL_ID"]' in spec_page.setup and "def render(" in spec_page.setup
    effort = spec_page.examples[2]
    assert effort.code == 'render(hello, reasoning_effort="none")'
    assert effort.expected.startswith("TemplateError: reasoning_effort must be an int")
    # Dedented by the fence's indentation, nothing more: the TypeScript's nested indentation survives.
    tools = spec_page.examples[3].expected.splitlines()
    assert tools[0] == "<|start|>developer<|message|># Tools" and "    max_price: number," in tools


def test_parse_spec_rules():
    page = conformance.parse_spec(
        '```python\nimport os\nX = os.environ["BEAM_MODEL_ID"]\n```\n'
        "```python\nundefined_name()\n```\n"  # outside accordions: not an example
        '<Accordion title="A">\n  text\n\n  ```python\n  print(1)\n\n  print(2)\n  ```\n\n'
        "  ```text\n  1\n\n  2\n  ```\n</Accordion>\n"
    )
    assert [(e.name, e.code, e.expected) for e in page.examples] == [
        ("page: A", "print(1)\n\nprint(2)", "1\n\n2")
    ]
    with pytest.raises(AssertionError, match="not followed by a text block"):
        conformance.parse_spec(
            '```python\nos.environ["BEAM_MODEL_ID"]\n```\n<Accordion title="B">\n```python\nx\n```\n</Accordion>'
        )
    with pytest.raises(AssertionError, match="no setup block"):
        conformance.parse_spec('<Accordion title="C">\n```python\nx\n```\n```text\ny\n```\n</Accordion>')


def test_page_example_runner_compares_exactly_and_reports_errors(spec_page, tmp_path):
    tokenizer = load_tokenizer()
    tokenizer.chat_template = MINI_TEMPLATE
    save_tokenizer(tokenizer, tmp_path)
    results = {r.name: r for r in conformance.run_page_examples(str(tmp_path), spec_page)}
    assert len(results) == len(spec_page.examples)
    # The mini template has no tools and no reasoning_effort, so these differ; the error text is reported.
    tools = results["page: Example: declare tools"]
    assert not tools.ok and "ValueError: substring not found" in tools.actual
    assert tools.diff().startswith("--- page\n+++ template\n")
    assert not results["page: Example: set the reasoning effort (2/2)"].ok
    # The mask example only needs what the mini template does render.
    assert results["page: Example: build a training mask"].ok


# ------------------------------------------------------------------------------------------- the rules


def test_expected_assistant_spans():
    text = (
        "<|start|>user<|message|>q<|end|><|start|>assistant<|channel|>analysis<|message|>r<|end|>"
        "<|start|>assistant to=f<|channel|>analysis <|constrain|>xml<|message|>a<|call|>"
        "<|start|>f to=assistant<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>y<|return|>"
    )
    spans = conformance.expected_assistant_spans(text)
    assert [text[s:e] for s, e in spans] == [
        "<|channel|>analysis<|message|>r<|end|><|start|>assistant to=f<|channel|>analysis <|constrain|>xml<|message|>a<|call|>",
        "<|channel|>final<|message|>y<|return|>",
    ]
    with pytest.raises(conformance.RuleFailure, match="never ends"):
        conformance.expected_assistant_spans("<|start|>assistant<|channel|>final<|message|>y<|end|>")


def test_mini_template_passes_every_format_rule(mini_tok):
    failed = [r.line() for r in _results(mini_tok).values() if not r.ok]
    assert failed == []


@pytest.mark.parametrize("case", sorted(BROKEN_TEMPLATES))
def test_broken_template_fails_its_rule(case, mini_tok):
    (old, new), rule_name = BROKEN_TEMPLATES[case]
    assert old in MINI_TEMPLATE, f"test setup: {old!r} not in the mini template"
    mini_tok.chat_template = MINI_TEMPLATE.replace(old, new)
    result = _results(mini_tok)[rule_name]
    assert not result.ok, f"{rule_name} should fail for a template that {case}"
    assert result.reason


def test_special_marker_fails_only_return_special(mini_tok):
    from tokenizers import AddedToken

    mini_tok.backend_tokenizer.add_special_tokens([AddedToken("<|end|>", special=True, normalized=False)])
    results = _results(mini_tok)
    assert not results["only-return-special"].ok and "<|end|>" in results["only-return-special"].reason
    mini_tok.eos_token = "<|end|>"
    assert not _results(mini_tok)["eos-is-return"].ok


def test_missing_pad_and_response_template_fail(mini_tok):
    mini_tok.pad_token = "<|return|>"
    mini_tok.response_template = None
    results = _results(mini_tok)
    assert not results["pad-token"].ok
    assert (
        not results["templates-installed"].ok
        and "no response_template" in results["templates-installed"].reason
    )
    assert not results["parse-rendered"].ok and results["parse-rendered"].reason.startswith(
        "raised AttributeError"
    )


def test_prefix_space_tokenizer_fails_round_trip():
    tokenizer = beamify(FACTORIES["sentencepiece_like"](), fix_prefix_space=False)
    results = _results(tokenizer)
    assert not results["round-trip"].ok and "became" in results["round-trip"].reason
    assert not results["parse-decoded-ids"].ok
    assert results["mask-spans"].ok, "masks come from offsets, so they stay right even with the extra spaces"


def test_snippet_rules(mini_tok, spec_page):
    results = {r.name: r for r in conformance.run_snippet_rules(mini_tok, spec_page)}
    assert sorted(results) == sorted(f"snippet: {h}" for h in conformance.SNIPPETS)
    # The mini template writes neither the default system message nor instructions nor tools.
    for heading in ("System message", "Instructions", "Tools"):
        assert not results[f"snippet: {heading}"].ok, heading
    assert "does not start with the page's snippet" in results["snippet: System message"].reason
    # It does write messages and tool calls the page's way (one parameter per call).
    assert results["snippet: Messages"].ok and results["snippet: Tool calls"].ok
    no_tools_section = conformance.SpecPage(setup="", snippets={})
    missing = conformance.run_snippet_rules(mini_tok, no_tools_section)
    assert all(not r.ok and "has no text block under the heading" in r.reason for r in missing)


@needs_templates
def test_snippet_rules_pass_on_the_bundled_tokenizer(spec_page):
    failed = [r.line() for r in conformance.run_snippet_rules(load_tokenizer(), spec_page) if not r.ok]
    assert failed == []


# --------------------------------------------------------------------------------------------- the CLI


@needs_templates
def test_check_template_passes_on_the_bundled_tokenizer(capsys):
    assert check_template.main([str(DEFAULT_TOKENIZER_DIR)]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert len(lines) == len(conformance.FORMAT_RULES) + len(conformance.SNIPPETS) + len(
        conformance.load_spec().examples
    )
    assert all(line.startswith("PASS ") for line in lines), "\n".join(lines)
    assert f"{len(lines)} passed, 0 failed" in out.err


@needs_templates
@pytest.mark.parametrize("family", sorted(FACTORIES))
def test_check_template_passes_on_beamified_families(family, tmp_path, capsys):
    tokenizer = beamify(FACTORIES[family]())
    save_tokenizer(tokenizer, tmp_path)
    code = check_template.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out


@needs_templates
def test_check_template_fails_on_a_template_that_drops_return(tmp_path, capsys):
    tokenizer = load_tokenizer()
    assert "<|return|>" in tokenizer.chat_template
    tokenizer.chat_template = tokenizer.chat_template.replace("<|return|>", "<|end|>")
    save_tokenizer(tokenizer, tmp_path)
    assert check_template.main([str(tmp_path), "--diff"]) == 1
    out = capsys.readouterr().out
    fail_lines = [line for line in out.splitlines() if line.startswith("FAIL ")]
    assert any(line.startswith("FAIL mask-spans: ") and "never ends" in line for line in fail_lines), out
    assert any(line.startswith("FAIL page: Example: build a training mask: ") for line in fail_lines), out
    assert "-<|channel|>analysis<|message|>Simple arithmetic." in out, (
        "--diff prints the page-vs-template diff"
    )
    assert "PASS markers-single-token" in out


def test_check_template_only_and_bad_tokenizer(tmp_path, capsys):
    assert check_template.main([str(DEFAULT_TOKENIZER_DIR), "--only", "markers-*"]) == 0
    assert capsys.readouterr().out.splitlines() == ["PASS markers-single-token: 7 markers"]
    assert check_template.main([str(tmp_path / "missing")]) == 2  # a mistyped path is a usage error, named
    assert f"error: TOKENIZER '{tmp_path / 'missing'}': no such directory" in capsys.readouterr().err


@needs_templates
@pytest.mark.skipif(
    any(importlib.util.find_spec(f"beam_sft.cli.{m}") is None for m in ("convert", "inspect")),
    reason="the beam-sft dispatcher imports every subcommand; convert/inspect are not written yet",
)
def test_beam_sft_check_template_command():
    proc = subprocess.run(
        [sys.executable, "-m", "beam_sft", "check-template", str(DEFAULT_TOKENIZER_DIR), "--only", "page:*"],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASS page: ") == len(conformance.load_spec().examples)
