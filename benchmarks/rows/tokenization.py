"""Row: masked tokenization, ours vs TRL's per-example preparation vs the floors; then PrepareRun.build scaling."""

from __future__ import annotations

import json

from benchmarks.rows.measure import _cpu_seconds, _cpu_timed, _log, _timed


def _record_kwargs(record: dict) -> tuple[list, list | None, dict]:
    kwargs = {k: v for k, v in (record.get("chat_template_kwargs") or {}).items() if v is not None}
    return record["messages"], record.get("tools"), kwargs


def _paths(tokenizer, encoder, records: list[dict], batch_size: int) -> dict:
    """Each way of tokenizing `records` that the row times, as a no-argument callable (tiktoken's only where
    the encoder uses tiktoken)."""
    from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

    try:  # TRL 1.16's per-example tokenization helper, private: fall back to what it calls
        from trl.data_utils import _tokenize as trl_tokenize
    except ImportError:
        def trl_tokenize(processing_class, conversation, **kwargs):
            return processing_class.apply_chat_template(conversation, tokenize=True, return_dict=True, **kwargs)

    n = len(records)

    # Ours: a fresh encoder (empty piece and prefix caches), batches as the data pipeline hands them over.
    def ours():
        encoder.clear_caches()
        out = []
        for start in range(0, n, batch_size):
            out.extend(encoder.encode(records[start:start + batch_size]))
        return out

    # TRL: what SFTTrainer._prepare_dataset's tokenize_fn does per example with assistant_only_loss=True and
    # a template that already has generation blocks (chat_template=None).
    def trl():
        out = []
        for record in records:
            messages, tools, kwargs = _record_kwargs(record)
            processed = trl_tokenize(tokenizer, messages, return_assistant_tokens_mask=True,
                                     chat_template=None, tools=tools, **kwargs)
            out.append({"input_ids": processed["input_ids"], "assistant_masks": processed["assistant_masks"]})
        return out

    # Floor: the public API's text rendering, then one batched tokenizer call; no masks.
    def floor():
        texts = []
        for record in records:
            messages, tools, kwargs = _record_kwargs(record)
            texts.append(tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs))
        return tokenizer(texts, add_special_tokens=False)["input_ids"]

    # A tighter floor (extra): the compiled template rendered directly, the Rust tokenizer's encode_batch.
    backend = tokenizer._tokenizer
    special = dict(tokenizer.special_tokens_map)

    def floor_raw():
        texts = []
        for record in records:
            messages, tools, kwargs = _record_kwargs(record)
            rendered, _ = render_jinja_template(
                conversations=[_normalize_chat_messages(messages)], tools=tools,
                chat_template=tokenizer.get_chat_template(None, tools), **{**special, **kwargs})
            texts.append(rendered[0])
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]

    paths = {"ours": ours, "trl": trl, "floor": floor, "floor_raw": floor_raw, **_ceilings(encoder, records)}
    return paths


def _ceilings(encoder, records: list[dict]) -> dict:
    """The ceiling encodes the rendered text exactly, without masks: the tokenizer's own encode_batch, and
    tiktoken where its backend checks pass; and our renderer alone."""
    backend = encoder.tokenizer._tokenizer
    texts = [encoder.render(record)[0] for record in records]
    special = {content: token_id for token_id, content in
               ((i, t.content) for i, t in backend.get_added_tokens_decoder().items())}
    whole_text = encoder._tiktoken.encoding_with_special_tokens(special) if encoder._tiktoken else None

    def render_only():
        encoder.clear_caches()
        return [encoder.render(record) for record in records]

    def hf_ceiling():
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]

    def tiktoken_ceiling():
        return [whole_text.encode(text, allowed_special="all") for text in texts]

    out = {"render": render_only, "hf_encode": hf_ceiling}
    if whole_text is not None:
        out["tiktoken_encode"] = tiktoken_ceiling
    return out


_STEPS = (
    ("ours", "ours on {n} conversations"),
    ("trl", "TRL per-example apply_chat_template"),
    ("floor", "floor (render + batched tokenize, no masks)"),
    ("floor_raw", "raw floor (compiled template + encode_batch)"),
    ("render", "render only (our renderer)"),
    ("hf_encode", "encode ceiling, encode_batch of the rendered text"),
    ("tiktoken_encode", "encode ceiling, tiktoken of the rendered text"),
)


def _time_paths(paths: dict, n: int) -> tuple[dict, dict, dict]:
    """(outputs, wall seconds, CPU seconds) of each path, one after the other; the outputs only of the paths
    that are compared."""
    outputs, wall, cpu = {}, {}, {}
    for name, label in _STEPS:
        if name in paths:
            _log(f"masked tokenization: {label.format(n=n)}")
            (output, wall[name]), cpu[name] = _cpu_timed(paths[name])
            if name not in ("floor_raw", "render"):
                outputs[name] = output
            del output
    return outputs, wall, cpu


def _prepare_scaling(tokenizer, records: list[dict], num_procs: list[int]) -> dict:
    """`PrepareRun.build` (the data pipeline's pool: convert + tokenize + label + write) at each num_proc, records
    as Beam JSONL."""
    import tempfile
    from pathlib import Path

    from beam_sft.dataset.prepare import PrepareRun
    from beam_sft.dataset.settings import DataSettings

    n = len(records)
    scaling, cpu_rates = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench_prepare_") as work:
        src = Path(work) / "records.jsonl"
        src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
        for p in num_procs:
            _log(f"masked tokenization: build_prepared num_proc={p}")
            cpu_before = _cpu_seconds()
            run = PrepareRun([str(src)], tokenizer, DataSettings(format="beam", max_length=None, dedup=False),
                             Path(work) / f"p{p}", num_proc=p, fingerprint="bench")
            _, seconds = _timed(run.build)
            scaling[str(p)] = n / seconds
            # CPU seconds of this process and its (joined) workers: on a shared machine wall-clock scaling
            # measures the neighbours too, while conversations per CPU-second show the parallel overhead alone.
            cpu_rates[str(p)] = n / (_cpu_seconds() - cpu_before)
    base = scaling[str(num_procs[0])] / num_procs[0] if num_procs else None
    return {
        p: {"conv_per_s": v, "speedup": v / scaling[str(num_procs[0])] * num_procs[0],
            "efficiency": v / (base * int(p)), "conv_per_cpu_s": cpu_rates[p],
            "cpu_efficiency": cpu_rates[p] / cpu_rates[str(num_procs[0])]}
        for p, v in scaling.items()
    }


def bench_masked_tokenization(tokenizer, records: list[dict], num_procs: list[int], batch_size: int) -> dict:
    """Ours vs TRL's per-example preparation vs the floor, in this process; then `PrepareRun.build` scaling."""
    from beam_sft.render.encoder import MaskedEncoder

    n = len(records)
    # Its one-off setup (checks, probe, tiktoken tables: seconds on a 201k vocabulary) is timed apart.
    _log("masked tokenization: encoder setup")
    encoder, setup_s = _timed(MaskedEncoder, tokenizer)
    if not encoder.fast:
        raise RuntimeError(f"the fast path is off for this tokenizer: {encoder.fallback_reason}")
    # Per core: CPU seconds of this process (tokenizers runs one thread with TOKENIZERS_PARALLELISM=false),
    # so the neighbours on a shared machine do not count.
    out, wall, cpu = _time_paths(_paths(tokenizer, encoder, records, batch_size), n)
    ours_out, hf_ids = out["ours"], out["hf_encode"]
    tiktoken_mismatches = None
    if "tiktoken_encode" in out:
        tiktoken_mismatches = sum(a != b for a, b in zip(out["tiktoken_encode"], hf_ids, strict=True))
    mismatches = [i for i, (a, b) in enumerate(zip(ours_out, out["trl"], strict=True)) if a != b]
    floor_mismatches = sum(1 for a, b in zip(ours_out, out["floor"], strict=True) if a["input_ids"] != b)
    n_tokens = sum(len(o["input_ids"]) for o in ours_out)
    n_supervised = sum(sum(o["assistant_masks"]) for o in ours_out)
    hf_mismatches = sum(a["input_ids"] != b for a, b in zip(ours_out, hf_ids, strict=True))
    del out, ours_out, hf_ids
    return {
        "vocabulary": len(tokenizer),
        "encoder_setup_s": setup_s,
        "encoder_backend": "tiktoken" if encoder._tiktoken is not None else "tokenizers",
        "tiktoken_reason": encoder.tiktoken_reason,
        "tokens_per_cpu_s": {name: n_tokens / seconds for name, seconds in cpu.items()},
        "cpu_s": cpu,
        "ids_mismatches_vs_hf_encode": hf_mismatches,
        "ids_mismatches_tiktoken_vs_hf": tiktoken_mismatches,
        **{name: n / wall[name] for name in ("ours", "trl", "floor", "floor_raw")},
        "conversations": n,
        "tokens": n_tokens,
        "tokens_per_conversation": n_tokens / n,
        "supervised_fraction": n_supervised / n_tokens,
        "ours_tokens_per_s": n_tokens / wall["ours"],
        "mismatches_vs_trl": len(mismatches),
        "first_mismatch": mismatches[0] if mismatches else None,
        "ids_mismatches_vs_floor": floor_mismatches,
        "prepare_scaling": _prepare_scaling(tokenizer, records, num_procs),
    }
