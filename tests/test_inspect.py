"""beam_sft.report (masks, stats, pages), `beam-sft inspect`, and scripts/inspect_masks.ipynb.

The views must show exactly what trains: the token texts put back together are the rendered text, the
trained tokens are the encoder's mask, and the statistics agree with an independent count. The notebook
runs top to bottom (nbclient) on the bundled samples and on a real sample; the HTML page, screenshotted
by headless Chromium, shows the trained and untrained colours.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from beam_sft.cli import main as cli_main
from beam_sft.errors import Reason
from beam_sft.render.encoder import encode_record
from beam_sft.report.masks import _visible, ansi_view, inspect_record, load_records, plain_view
from beam_sft.report.pages import (
    HTML_MARKER,
    HTML_TRAINED,
    HTML_TRAINED_ALT,
    HTML_UNTRAINED,
    HTML_UNTRAINED_ALT,
    html_page,
)
from beam_sft.report.stats import dataset_stats, stats_table
from beam_sft.template.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "data" / "samples"
REALDATA = Path(__file__).resolve().parent / "data" / "realdata"
NOTEBOOK = REPO / "scripts" / "inspect_masks.ipynb"
REAL_SAMPLE = REALDATA / "openai" / "llamafactory_v1_reason_tool_use_demo_50.jsonl"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def openai_samples():
    return load_records(str(SAMPLES / "openai.jsonl"))


TOOL_RECORD = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in London and Paris?"},
        {
            "role": "assistant",
            "reasoning_content": "Both cities.",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "London"}}},
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            ],
        },
        {"role": "tool", "name": "get_weather", "content": "14 C"},
        {"role": "tool", "name": "get_weather", "content": "18 C"},
        {"role": "assistant", "reasoning_content": "Report.", "content": "London 14 C, Paris 18 C. Café ☕"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ],
}


# ---------- loading ----------


def test_load_records_loses_nothing():
    # The zh file ends with two records whose tool result has no call, and two records call against their tool's
    # schema: rejected, with a reason.
    path = str(REALDATA / "sharegpt" / "llamafactory_glaive_toolcall_zh_demo.json")
    loaded = load_records(path, missing_reasoning="keep")
    assert loaded.total == 62
    assert len(loaded.records) + len(loaded.rejects) == loaded.total
    assert [(r["index"], r["reason"]) for r in loaded.rejects] == [
        (5, Reason.ARGUMENTS_BREAK_SCHEMA.value), (21, Reason.ARGUMENTS_BREAK_SCHEMA.value),
        (60, Reason.TOOL_RESULT_WITHOUT_CALL.value), (61, Reason.TOOL_RESULT_WITHOUT_CALL.value)]
    assert loaded.index_of(60) is None and loaded.index_of(59) == 57
    # As training sees it (the default `mask`): this data has no reasoning, so nothing in it trains.
    masked = load_records(path)
    assert masked.total == 62 and not masked.records
    assert {r["reason"] for r in masked.rejects} == {Reason.TOOL_RESULT_WITHOUT_CALL.value,
                                                      Reason.ARGUMENTS_BREAK_SCHEMA.value,
                                                      Reason.NOTHING_TO_TRAIN.value}


def test_load_records_beam_format_validates_like_training(tmp_path):
    """`--dataset_format beam` no longer takes records as they are: what training rejects, inspect rejects (issue 18)."""
    path = tmp_path / "beam.jsonl"
    good = {"messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "reasoning_content": "r", "content": "yo"}]}
    path.write_text(json.dumps(good) + '\n{"messages": [{"role": "user", "content": "hi"}]}\n[1, 2]\n',
                    encoding="utf-8")
    loaded = load_records(str(path), format="beam")
    assert loaded.records == [good] and loaded.positions == [0]
    assert [(r["line"], r["position"], r["reason"]) for r in loaded.rejects] == \
        [(2, 1, "no_assistant_turn"), (3, 2, "not_an_object")]


# ---------- one record ----------


def test_view_is_the_encoding(tok, encoder):
    view = inspect_record(tok, TOOL_RECORD, encoder=encoder)
    encoded = encode_record(tok, TOOL_RECORD)
    assert [t.token_id for t in view.tokens] == encoded["input_ids"]
    assert [int(t.trained) for t in view.tokens] == encoded["assistant_masks"]
    # Token texts put back together are the rendered conversation, character for character.
    text, spans = encoder.render(TOOL_RECORD)
    assert "".join(t.text for t in view.tokens) == text
    # The trained text is exactly the generation spans' text.
    assert "".join(t.text for t in view.tokens if t.trained) == "".join(text[a:b] for a, b in spans)
    assert view.trained == sum(encoded["assistant_masks"]) and not view.truncated


def test_roles_and_markers(tok, encoder):
    view = inspect_record(tok, TOOL_RECORD, encoder=encoder)
    groups = view.group_counts
    assert [m.group for m in view.messages] == [
        "system",
        "developer",
        "user",
        "assistant:analysis",
        "assistant:call",
        "assistant:call",
        "tool",
        "tool",
        "assistant:analysis",
        "assistant:final",
    ]
    for group in ("system", "developer", "user", "tool"):
        assert groups[group][0] == 0, group
    for group in ("assistant:call", "assistant:final"):
        assert groups[group][0] == groups[group][1] > 0, group  # these messages train whole
    # The assistant's first header (<|start|>assistant) is prompt, the rest of its turn trains.
    analysis_trained, analysis_total = groups["assistant:analysis"]
    assert analysis_total - analysis_trained == 4
    assert sum(t for t, _ in groups.values()) == view.trained
    assert {t.text for t in view.tokens if t.marker} >= {
        "<|start|>",
        "<|call|>",
        "<|return|>",
        "<|constrain|>",
    }
    assert view.stop_tokens == 2 and view.stop_tokens_untrained == 0


def test_truncation_is_reported(tok, encoder):
    full = encode_record(tok, TOOL_RECORD)
    mask = full["assistant_masks"]
    inside = next(i for i in range(1, len(mask)) if mask[i - 1] and mask[i])
    view = inspect_record(tok, TOOL_RECORD, encoder=encoder, max_length=inside, policy="keep_start")
    assert view.truncated and view.cut_inside_assistant and view.length == len(mask)
    assert len(view.tokens) == inside
    before = mask.index(1)  # cut just before the first trained token: nothing trains, no turn is split
    view = inspect_record(tok, TOOL_RECORD, encoder=encoder, max_length=before, policy="keep_start")
    assert view.truncated and not view.cut_inside_assistant and view.trained == 0
    # the default is training's default, "turn": back to the end of the last whole assistant turn
    view = inspect_record(tok, TOOL_RECORD, encoder=encoder, max_length=inside)
    first_end = next(i for i in range(inside, len(mask)) if not mask[i])
    turn_ends = [e for e in range(1, inside + 1) if mask[e - 1] and (e == len(mask) or not mask[e])]
    assert view.truncated and not view.cut_inside_assistant
    assert len(view.tokens) == (turn_ends[-1] if turn_ends else 0) and first_end > inside
    view = inspect_record(tok, TOOL_RECORD, encoder=encoder, max_length=before)
    assert view.dropped and view.tokens == [] and "DROPPED" in plain_view(view)


def test_plain_view_brackets_exactly_the_trained_text(tok, encoder):
    view = inspect_record(tok, TOOL_RECORD, encoder=encoder)
    out = plain_view(view)
    body = [line.split("] ", 1)[1] for line in out.splitlines()[3:]]
    assert len(body) == len(view.messages)  # one line per rendered message
    trained = "".join(re.findall(r"\{\+(.*?)\+\}", "".join(body)))
    assert trained == "".join(_visible(t.text) for t in view.tokens if t.trained)
    assert "\x1b[" not in out
    assert body[-1].startswith("{+<|start|>assistant<|channel|>final<|message|>London")


def test_ansi_view_colours_every_token(tok, encoder):
    view = inspect_record(tok, TOOL_RECORD, encoder=encoder)
    out = ansi_view(view)
    body = "\n".join(out.splitlines()[3:])
    green = re.findall(r"\x1b\[30;(?:42|102)m(?:\x1b\[1;35m)?([^\x1b]*)\x1b\[0m", body)
    assert "".join(green) == "".join(_visible(t.text) for t in view.tokens if t.trained)
    assert ANSI.sub("", body).count("<|start|>") == len(view.messages)


def test_html_page_is_self_contained(tok, encoder):
    view = inspect_record(tok, TOOL_RECORD, encoder=encoder, label="tool record")
    page = html_page([view], title="t")
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page and "http://" not in page and "https://" not in page
    trained_spans = re.findall(r'<span class="tok t[01][^"]*" title="id \d+, trained"', page)
    assert len(trained_spans) == view.trained
    assert page.count('class="msg"') == len(view.messages)
    visible = html.unescape(re.sub(r"<style>.*?</style>|<[^>]+>", "", page, flags=re.DOTALL))
    assert "London 14 C, Paris 18 C. Caf\u00e9 \u2615<|return|>" in visible  # multi-byte characters intact


# ---------- dataset statistics ----------


def test_dataset_stats_agree_with_an_independent_count(tok, encoder, openai_samples):
    records = openai_samples.records
    max_length = 120
    stats = dataset_stats(
        tok, records, max_length=max_length, encoder=encoder, rejected=openai_samples.rejects, policy="keep_start"
    )
    encoded = [encode_record(tok, r) for r in records]
    assert stats.records == len(records) and stats.rejected == len(openai_samples.rejects)
    assert stats.lengths == [len(e["input_ids"]) for e in encoded]
    assert stats.tokens == sum(min(len(e["input_ids"]), max_length) for e in encoded)
    assert stats.trained == sum(sum(e["assistant_masks"][:max_length]) for e in encoded)
    assert stats.truncated == [i for i, e in enumerate(encoded) if len(e["input_ids"]) > max_length]
    assert stats.cut_inside_assistant == [
        i
        for i in stats.truncated
        if encoded[i]["assistant_masks"][max_length - 1] and encoded[i]["assistant_masks"][max_length]
    ]
    assert stats.empty_mask == [
        i for i, e in enumerate(encoded) if not any(e["assistant_masks"][:max_length])
    ]
    assert (
        stats.truncated and stats.cut_inside_assistant and stats.empty_mask
    )  # the sample exercises all three
    assert stats.stop_untrained == []
    assert sum(c for _, _, c in stats.histogram()) == len(records)
    assert sum(t for t, _ in stats.groups.values()) == stats.trained
    table = stats_table(stats)
    assert f"{len(stats.truncated)}: " in table and "length histogram" in table


@pytest.mark.parametrize("policy", ["turn", "drop", "keep_start"])
def test_dataset_stats_count_what_training_trains(tok, encoder, openai_samples, policy):
    """With --max_length, inspect cuts as training does (`build_example`, the data phase's per-record rule):
    the same records dropped, the same tokens kept, the same tokens trained."""
    from inmemory import build_example

    from beam_sft.dataset.examples import IGNORE_INDEX

    records, max_length = openai_samples.records, 120
    stats = dataset_stats(tok, records, max_length=max_length, encoder=encoder, policy=policy)
    examples = [build_example(tok, r, max_length=max_length, policy=policy) for r in records]
    kept = [e for e in examples if e["keep"]]
    assert stats.dropped == [i for i, e in enumerate(examples) if not e["keep"]]
    assert stats.truncated == [i for i, e in enumerate(examples) if e["truncated"]]
    assert stats.tokens == sum(len(e["input_ids"]) for e in kept)
    assert stats.trained == sum(sum(t != IGNORE_INDEX for t in e["labels"]) for e in kept)
    assert stats.records == len(records) and (stats.dropped or policy == "keep_start")
    assert ("dropped by the truncation policy" in stats_table(stats)) and f"policy {policy}" in stats_table(stats)


STOP_OUTSIDE_TEMPLATE = (
    "{%- for m in messages -%}{{- '<|start|>' ~ m['role'] ~ '<|message|>' -}}"
    "{%- if m['role'] == 'assistant' -%}{%- generation -%}{{- m['content'] -}}{%- endgeneration -%}"
    "{{- '<|return|>' -}}{%- else -%}{{- m['content'] ~ '<|end|>' -}}{%- endif -%}{%- endfor -%}"
)


def test_stop_tokens_outside_the_mask_are_flagged(tok):
    record = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    old = tok.chat_template
    tok.chat_template = STOP_OUTSIDE_TEMPLATE
    try:
        stats = dataset_stats(tok, [record, record])
        view = inspect_record(tok, record)
    finally:
        tok.chat_template = old
    assert stats.stop_untrained == [0, 1]
    assert view.stop_tokens_untrained == 1 and "stop token(s) not trained" in plain_view(view)


def test_records_the_template_rejects_are_counted(tok, encoder):
    bad = {
        "messages": [
            {"role": "user", "content": "x"},
            {
                "role": "assistant",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
        ]
    }
    stats = dataset_stats(tok, [TOOL_RECORD, bad, TOOL_RECORD], encoder=encoder)
    assert stats.records == 2 and stats.rejected == 1
    assert stats.rejected_reasons == {Reason.RENDER_FAILED.value: 1}


# ---------- the CLI ----------


def test_cli_plain_output_when_piped(capsys):
    assert cli_main(["inspect", str(SAMPLES / "openai.jsonl"), "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out and out.count("legend: {+trained+}") == 2
    assert "{+<|channel|>analysis<|message|>" in out


def test_cli_index_color_and_errors(capsys):
    assert cli_main(["inspect", str(SAMPLES / "sharegpt.json"), "--index", "1", "--color", "always"]) == 0
    captured = capsys.readouterr()
    assert "\x1b[30;42m" in captured.out and "record 1 " in captured.out
    assert cli_main(["inspect", str(SAMPLES / "sharegpt.json"), "--index", "99999"]) == 2
    assert "--index 99999" in capsys.readouterr().err
    assert cli_main(["inspect", str(SAMPLES / "openai.jsonl"), "--dataset_format", "nope"]) == 2


def test_cli_rejected_index_is_explained(capsys):
    loaded = load_records(str(SAMPLES / "openai.jsonl"))
    position = loaded.rejects[0]["position"]
    assert cli_main(["inspect", str(SAMPLES / "openai.jsonl"), "--index", str(position)]) == 0
    where = f"{SAMPLES / 'openai.jsonl'}:{loaded.rejects[0]['line']}"  # a JSONL record: its file and line
    assert f"record {position} ({where}): rejected [{loaded.rejects[0]['reason']}]" in capsys.readouterr().err


def test_cli_stats_and_html(tmp_path, capsys):
    out_html = tmp_path / "masks.html"
    argv = [
        "inspect",
        str(SAMPLES / "harmony.jsonl"),
        "--stats",
        "--max_length",
        "100",
        "--html",
        str(out_html),
    ]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert "trained tokens" in out and "truncated by max_length" in out and "length histogram" in out
    page = out_html.read_text(encoding="utf-8")
    assert "<h2>Dataset</h2>" in page and 'class="tok t0' in page
    assert not list(tmp_path.glob(".*beam-tmp*"))  # written atomically, nothing left behind


def test_cli_unexpected_errors_are_rejects_and_exit_3(tmp_path, capsys, monkeypatch):
    """A converter or encoder bug on one record: that record is an internal_error reject, the others are
    shown and counted, a warning names it, and the exit status is 3."""
    from beam_sft.render.encoder import MaskedEncoder
    from beam_sft.validate import convert as conversion

    real_convert = conversion.convert
    total = load_records(str(SAMPLES / "sharegpt.json")).total

    def flaky(rec, format="auto", options=None, counters=None):
        if isinstance(rec, dict) and "chat_template_kwargs" in rec:
            raise TypeError("unhashable type: 'list'")
        return real_convert(rec, format, options, counters)

    monkeypatch.setattr(conversion, "convert", flaky)
    loaded = load_records(str(SAMPLES / "sharegpt.json"))
    internal = [r for r in loaded.rejects if r["reason"] == "internal_error"]
    assert internal and internal[0]["message"] == "TypeError: unhashable type: 'list'"
    assert internal[0]["source"] == str(SAMPLES / "sharegpt.json") and internal[0]["index"] == internal[0]["position"]
    assert len(loaded.records) + len(loaded.rejects) == loaded.total == total
    capsys.readouterr()
    assert cli_main(["inspect", str(SAMPLES / "sharegpt.json"), "--stats"]) == 3
    err = capsys.readouterr().err
    assert f"warning: {len(internal)} record(s) hit an unexpected error" in err and "Traceback" not in err
    monkeypatch.setattr(conversion, "convert", real_convert)

    # the same for an encoder failure while computing --stats (and while showing the record)
    real_encode = MaskedEncoder.encode

    def bad_encode(self, records):
        if any(len(r["messages"]) == 3 for r in records):
            raise IndexError("encoder bug")
        return real_encode(self, records)

    monkeypatch.setattr(MaskedEncoder, "encode", bad_encode)
    beam = tmp_path / "beam.jsonl"
    turn = '{"role": "assistant", "reasoning_content": "r", "content": "yo"}'
    short = f'{{"messages": [{{"role": "user", "content": "hi"}}, {turn}]}}'
    three = f'{{"messages": [{{"role": "system", "content": "s"}}, {{"role": "user", "content": "hi"}}, {turn}]}}'
    beam.write_text(f"{short}\n{three}\n{short}\n", encoding="utf-8")
    stats = dataset_stats(load_tokenizer(), load_records(str(beam), format="beam").records)
    assert stats.records == 2 and stats.rejected_reasons == {"internal_error": 1} and stats.internal_errors == [1]
    assert cli_main(["inspect", str(beam), "--dataset_format", "beam", "--stats", "-n", "3"]) == 3
    captured = capsys.readouterr()
    assert "record 1: [internal_error] IndexError: encoder bug" in captured.err
    assert "warning: 1 record(s)" in captured.err and captured.out.count("legend:") == 2


# ---------- the notebook ----------


def test_notebook_is_committed_without_outputs():
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


def _run_notebook(tmp_path, dataset: Path, max_length: int, records: str):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    env = {
        "BEAM_INSPECT_DATASET": str(dataset),
        "BEAM_INSPECT_MAX_LENGTH": str(max_length),
        "BEAM_INSPECT_RECORDS": records,
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits the environment
    try:
        NotebookClient(
            nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO / "scripts")}}
        ).execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    return text, html, images


@pytest.mark.slow
def test_notebook_runs_on_the_bundled_samples(tmp_path):
    # The samples directory: every bundled file, each through the converters.
    loaded = load_records(str(SAMPLES))
    assert loaded.total > 100 and {Path(re.sub(r"(:\d+|\[\d+\])$", "", s)).name for s in loaded.sources} == {
        "openai.jsonl",
        "sharegpt.json",
        "harmony.jsonl",
    }
    text, html, images = _run_notebook(tmp_path, SAMPLES, 128, "0,1")
    assert (
        f"{loaded.total} records read, {len(loaded.records)} converted, {len(loaded.rejects)} rejected"
        in text
    )
    assert "trained fraction:" in text and "truncated by max_length: [" in text
    assert html.count('<div class="msg">') > 2 and 'class="tok t0' in html
    assert len(images) == 1  # the length histogram


@pytest.mark.slow
def test_notebook_runs_on_a_real_sample(tmp_path):
    # Record 2 has parallel tool calls; no truncation (MAX_LENGTH 0).
    text, html, images = _run_notebook(tmp_path, REAL_SAMPLE, 0, "0,2")
    assert "50 records read, 50 converted" in text and "truncated by max_length: none" in text
    assert html.count("assistant:call") >= 2 and len(images) == 1


# ---------- the HTML page in a real browser ----------

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _screenshot(html_path: Path, png_path: Path):
    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-color-profile=srgb",
            "--window-size=1200,1400",
            f"--screenshot={png_path}",
            html_path.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    import numpy as np
    from PIL import Image

    with Image.open(png_path) as image:
        return np.asarray(image.convert("RGB"), dtype=np.int16)


def _count(pixels, hex_colour: str, tolerance: int = 4) -> int:
    target = [int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]
    return int((abs(pixels - target) <= tolerance).all(axis=-1).sum())


@pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="headless Chromium (Debian package 'chromium') not installed"
)
def test_html_screenshot_shows_the_masks(tmp_path):
    page = tmp_path / "masks.html"
    assert cli_main(["inspect", str(SAMPLES / "openai.jsonl"), "-n", "3", "--html", str(page)]) == 0
    pixels = _screenshot(page, tmp_path / "masks.png")
    trained = _count(pixels, HTML_TRAINED) + _count(pixels, HTML_TRAINED_ALT)
    untrained = _count(pixels, HTML_UNTRAINED) + _count(pixels, HTML_UNTRAINED_ALT)
    marker = _count(pixels, HTML_MARKER, tolerance=40)

    # Control: the same records cut before anything trains. Only the legend's sample chip stays green.
    first = load_records(str(SAMPLES / "openai.jsonl"), limit=3).records
    cut = min(encode_record(load_tokenizer(), r)["assistant_masks"].index(1) for r in first)
    control = tmp_path / "control.html"
    argv = [
        "inspect",
        str(SAMPLES / "openai.jsonl"),
        "-n",
        "3",
        "--max_length",
        str(cut),
        # keep_start: the records cut at `cut`, shown untrained (the default policy, turn, drops them whole)
        "--truncation_policy",
        "keep_start",
        "--html",
        str(control),
    ]
    assert cli_main(argv) == 0
    control_pixels = _screenshot(control, tmp_path / "control.png")
    control_trained = _count(control_pixels, HTML_TRAINED) + _count(control_pixels, HTML_TRAINED_ALT)

    print(f"pixels: trained {trained}, untrained {untrained}, marker {marker}, control {control_trained}")
    assert untrained > 5000 and marker > 500
    assert trained > 5000 and trained > 5 * control_trained
    assert _count(control_pixels, HTML_UNTRAINED) > 5000


def test_cli_stats_read_through_the_data_phase_equal_the_in_memory_stats(tok):
    """`inspect --stats` reads via beam_sft.dataset.pipeline.convert_records (memory-mapped, batch by batch); its
    figures and the input positions it names equal those of the in-memory path over the same file."""
    import argparse

    from beam_sft.cli.inspect import _dataset_stats
    from beam_sft.render.encoder import MaskedEncoder

    path = str(SAMPLES / "openai.jsonl")
    args = argparse.Namespace(dataset=path, dataset_format="auto", dataset_train_split="train", max_length=300,
                              truncation_policy="turn", missing_reasoning="mask", tool_call_checks="reject")
    stats, internal = _dataset_stats(args, tok, MaskedEncoder(tok))
    loaded = load_records(path)
    want = dataset_stats(tok, loaded.records, max_length=300, rejected=loaded.rejects)
    assert (stats.records, stats.rejected, stats.tokens, stats.trained) == \
        (want.records, want.rejected, want.tokens, want.trained)
    assert stats.rejected_reasons == want.rejected_reasons and stats.lengths == want.lengths
    assert stats.truncated == [loaded.positions[i] for i in want.truncated] and stats.truncated
    assert stats.labels == [f"record {p}" for p in loaded.positions] and internal == []
