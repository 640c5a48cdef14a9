"""`beamify`: any fast tokenizer (and its model) made a Beam tokenizer in place; `beam-sft beamify BASE -o
DIR` writes it the checked way. See docs/template.md#using-your-own-base-model-beamify."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from beam_sft.errors import UsageError
from beam_sft.template.tokenizer import EOS_TOKEN, MARKERS, PAD_TOKEN, PLAIN_MARKERS, install_templates


def beamify_directory(base: str, output: str | Path, *, init: str = "semantic", dtype: str = "auto") -> dict[str, Any]:
    """Write the beamified `base` to `output`; returns what was done (rows, eos, pad, check counts)."""
    from beam_sft.model.export import load_pretrained
    from beam_sft.model.marker_init import INIT_CHOICES
    from beam_sft.serve.save import save_checked
    from beam_sft.template import conformance

    if init not in INIT_CHOICES:
        raise UsageError(f"--init must be one of {', '.join(INIT_CHOICES)}, not {init!r}")
    output = Path(output)
    if output.resolve() == Path(base).resolve():
        raise UsageError("the output directory must differ from the base model's")
    model, tokenizer = load_pretrained(base, dtype)
    if getattr(model.config, "beam_sft", None) or getattr(tokenizer, "response_template", None) is not None:
        raise UsageError(f"{base} is already a Beam model (it has a response template or beam_sft config)")
    old_len, base_eos = len(tokenizer), tokenizer.eos_token
    beamify(tokenizer, model, init=init)
    servable = save_checked(model, tokenizer, output, "would not be a usable Beam base")
    # save_checked ran every check-template rule on the written files and raised if one failed: count them
    checks = len(conformance.FORMAT_RULES) + len(conformance.SNIPPETS) + len(conformance.load_spec().examples)
    info = model.config.beam_sft or {}
    return {"output": str(output), "base": base, "old_vocab": old_len, "new_vocab": len(tokenizer),
            "init": init, "rows": info.get("rows", {}), "new_token_ids": info.get("new_token_ids", []),
            "tied": model.get_output_embeddings() is None
            or model.get_output_embeddings().weight is model.get_input_embeddings().weight,
            "base_eos": base_eos, "eos_token_id": servable["eos_token_id"], "pad_token": tokenizer.pad_token,
            "checks_passed": checks}


def describe(report: dict[str, Any]) -> list[str]:
    """What a person reads after `beam-sft beamify`: one line per fact."""
    rows = report["rows"]
    lines = [(f"{report['base']} -> {report['output']}: vocabulary {report['old_vocab']:,} -> {report['new_vocab']:,} "
              f"({len(rows)} rows added, init {report['init']}, embeddings "
              f"{'tied' if report['tied'] else 'untied: input and output rows both set'})")]
    for token, parts in rows.items():
        lines.append(f"  {token:<14} = " + " + ".join(
            f"{'1/' + str(len(parts)) + ' ' if len(parts) > 1 else ''}{'mean of the old rows' if p == 'mean' else repr(p)}"
            for p in parts))
    lines.append(f"eos_token_id {report['eos_token_id']} (<|return|>, <|call|>; the base's {report['base_eos']!r} "
                 "is not a stop: docs/real-model.md); pad " + repr(report["pad_token"]))
    lines.append(f"check-template: {report['checks_passed']}/{report['checks_passed']} rules pass")
    return lines


def _segment_prefix_space_off(state: dict[str, Any]) -> None:
    """Stop a SentencePiece-style backend from prepending "▁" to every segment between markers (added tokens
    split the text into segments, each normalised on its own)."""

    def walk(node: Any, key: str) -> Any:
        if not isinstance(node, dict):
            return node
        if node.get("type") == "Sequence":
            children = [walk(child, key) for child in node.get(key, [])]
            node[key] = [c for c in children if c is not None]
            return node
        if node.get("type") == "Metaspace" and node.get("prepend_scheme") == "always":
            node["prepend_scheme"] = "first"
        if node.get("type") == "Prepend" and node.get("prepend") == "▁":
            return None
        return node

    had_prepend = "Prepend" in json.dumps(state.get("normalizer"))
    state["normalizer"] = walk(state.get("normalizer"), "normalizers")
    state["pre_tokenizer"] = walk(state.get("pre_tokenizer"), "pretokenizers")
    state["decoder"] = walk(state.get("decoder"), "decoders")
    if had_prepend and "Prepend" not in json.dumps(state.get("normalizer")) and state.get("pre_tokenizer") is None:
        # The normaliser's prepend moves to a Metaspace pre-tokenizer that prepends at the input start only.
        state["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}


def _install_tokens(tokenizer, fix_prefix_space: bool) -> None:
    """The markers (EOS among them), and a pad token where there is none or it is a marker."""
    from tokenizers import AddedToken, Tokenizer

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TypeError(f"beamify needs a fast (tokenizers-backed) tokenizer, got {type(tokenizer).__name__}; "
                        "load it with AutoTokenizer.from_pretrained(..., use_fast=True)")
    # normalized=False: markers must match the raw text, whatever the normalizer does to ordinary text.
    backend.add_tokens([AddedToken(m, special=False, normalized=False) for m in PLAIN_MARKERS])
    backend.add_special_tokens([AddedToken(EOS_TOKEN, special=True, normalized=False)])
    # A marker that was special already (gpt-oss has all seven) loses its `special` flag but stays in the
    # backend's set of specials (decode would drop it): reloading the serialised form rebuilds the set.
    state = json.loads(backend.to_str())
    for entry in state.get("added_tokens", []):
        if entry["content"] in MARKERS:
            entry["special"], entry["normalized"] = entry["content"] == EOS_TOKEN, False
    if fix_prefix_space:
        _segment_prefix_space_off(state)
    tokenizer._tokenizer = Tokenizer.from_str(json.dumps(state))
    # transformers keeps its own list of extra special tokens; a plain marker must not be in it.
    extra = list(getattr(tokenizer, "extra_special_tokens", None) or [])
    if any(str(t) in PLAIN_MARKERS for t in extra):
        tokenizer.extra_special_tokens = [t for t in extra if str(t) not in PLAIN_MARKERS]
    tokenizer.eos_token = EOS_TOKEN
    if tokenizer.pad_token is None or tokenizer.pad_token in MARKERS:
        tokenizer.add_special_tokens({"pad_token": AddedToken(PAD_TOKEN, special=True, normalized=False)})


def beamify(tokenizer, model=None, *, template_dir: str | Path | None = None, fix_prefix_space: bool = True,
            init: str = "semantic"):
    """Make `tokenizer` (and `model`, if given) Beam Harmony capable, in place; returns `tokenizer`; again: a
    no-op. What it adds and sets (rows: `marker_init`; eos: `BEAMIFY_EOS_DECISION`; the new ids in
    `model.config.beam_sft`, for LoRA): docs/template.md#using-your-own-base-model-beamify."""
    from beam_sft.model.marker_init import INIT_CHOICES, initialise_rows
    from beam_sft.template.tokenizer import stop_token_ids

    if init not in INIT_CHOICES:
        raise ValueError(f"beamify init {init!r}: choose one of {', '.join(INIT_CHOICES)}")
    old_len, base_eos = len(tokenizer), tokenizer.eos_token
    _install_tokens(tokenizer, fix_prefix_space)
    install_templates(tokenizer, template_dir)
    for marker in MARKERS:
        ids = tokenizer.encode(marker, add_special_tokens=False)
        assert len(ids) == 1, f"marker {marker!r} encodes to {len(ids)} tokens after beamify: {ids}"
    if model is None:
        return tokenizer
    new_len = len(tokenizer)
    if new_len > model.get_input_embeddings().weight.shape[0]:
        # mean_resizing=False: transformers' mean resizing samples around the mean; marker_init sets each row.
        model.resize_token_embeddings(new_len, mean_resizing=False)
    # Ids from the old tokenizer length on are the new tokens (a padded matrix may already have rows there).
    rows = initialise_rows(model, tokenizer, old_len, new_len, init, base_eos) if new_len > old_len else []
    eos_id, call_id = stop_token_ids(tokenizer)  # <|return|>, <|call|>
    pad_id = tokenizer.pad_token_id
    model.config.eos_token_id = eos_id
    model.config.pad_token_id = pad_id
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        generation_config.eos_token_id = [eos_id, call_id]
        generation_config.pad_token_id = pad_id
    if rows:
        model.config.beam_sft = {"new_token_ids": [r.id for r in rows], "init": init,
                                 "rows": {r.token: r.parts for r in rows}, "base_eos": base_eos}
    return tokenizer


# Why a beamified base stops only at <|return|> / <|call|>: docs/real-model.md#stop-tokens-of-a-beamified-base.
BEAMIFY_EOS_DECISION = "[<|return|>, <|call|>] only"


def new_token_ids(model) -> list[int]:
    """The ids `beamify` added to `model` (recorded in its config, so also after save and load); [] if none."""
    info = getattr(getattr(model, "config", None), "beam_sft", None)
    ids = info.get("new_token_ids") if isinstance(info, dict) else None
    return [int(i) for i in ids] if isinstance(ids, list) else []
