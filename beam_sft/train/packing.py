"""Exact padding-free packing, proven on the model that trains (`ensure_exact_packing`), or no packing.
See docs/training.md#gpt-oss-shaped-models-exact-packing-moe-lora-router-loss."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from itertools import accumulate

from beam_sft.errors import UsageError

logger = logging.getLogger(__name__)

# Floors of the probe's tolerance (mean |Δ NLL| per token), raised to 4x the model's measured noise. A leak on
# a tiny random fp32 model moves it by ~1e-2 (issue 15), exact packing by rounding only (~1e-7).
ABS_TOL = {"float32": 1e-5, "float64": 1e-9}
LOW_PRECISION_TOL = 2e-3  # bf16 / fp16 kernels on different shapes round differently
CONTROL_SHARE = 0.1  # packed-vs-alone must also stay below this share of the control's leak


@dataclass
class PackingReport:
    """What the probe saw and which path was taken ("native", "explicit_masks", "explicit_masks_unprobed")."""

    model_type: str
    attn_implementation: str
    path: str
    lengths: list[int]
    leak_before: float | None  # mean |NLL packed - NLL alone| per token of the records after the first, as it came
    leak_after: float | None  # the same with the explicit masks (None when they were not needed)
    control: float | None  # the same for the leaky control row (positions not restarting)
    tolerance: float | None
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        if self.leak_before is None:
            return f"packing ({self.model_type}, attn {self.attn_implementation}): {'; '.join(self.notes)} -> {self.path}"
        after = "" if self.leak_after is None else f", after explicit masks {self.leak_after:.3g}"
        return (f"packing probe ({self.model_type}, attn {self.attn_implementation}, records {self.lengths}): "
                f"leak {self.leak_before:.3g}{after}, control {self.control:.3g}, tolerance {self.tolerance:.3g} "
                f"-> {self.path}")


def find_decoder(model):
    """The module that builds the attention masks: the decoder stack (`embed_tokens` + `layers`)."""
    for module in model.modules():
        if hasattr(module, "embed_tokens") and hasattr(module, "layers") and hasattr(module, "config"):
            return module
    return None


def _decoder_config(model):
    decoder = find_decoder(model)
    return decoder.config if decoder is not None else model.config


def _layer_types(config) -> list[str]:
    types = getattr(config, "layer_types", None)
    return list(types) if types else ["sliding_attention" if getattr(config, "sliding_window", None)
                                      else "full_attention"]


def packed_masks(config, position_ids, dtype, device):
    """The 4D attention mask transformers would build for this packed row if the model passed `position_ids`
    (a {layer type: mask} mapping when the layers' types differ)."""
    import torch
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    builders = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}
    types = sorted(set(_layer_types(config)))
    if unknown := [t for t in types if t not in builders]:
        raise UsageError(f"cannot build packed attention masks for layer types {unknown}")
    # Only shape, dtype and device of the embeddings are read by the mask builders.
    shape_only = torch.empty(position_ids.shape[0], position_ids.shape[1], 0, dtype=dtype, device=device)
    masks = {t: builders[t](config=config, inputs_embeds=shape_only, attention_mask=None, cache=None,
                            position_ids=position_ids) for t in types}
    return masks[types[0]] if len(types) == 1 else masks


def install_packed_mask_hook(model):
    """Make `model` build block-diagonal (window-correct) masks from restarting `position_ids` of packed rows
    without mask or cache (training; generation and padded batches pass through); returns the handle."""
    if (decoder := find_decoder(model)) is None:
        raise UsageError(f"{type(model).__name__}: no decoder stack found to give packed attention masks to")
    if getattr(decoder, "_beam_packed_mask_hook", None) is not None:
        return decoder._beam_packed_mask_hook
    config = decoder.config

    def hook(module, args, kwargs):
        position_ids = kwargs.get("position_ids")
        given = ("attention_mask", "cache", "past_key_values")
        if position_ids is None or kwargs.get("use_cache") or any(kwargs.get(name) is not None for name in given):
            return None
        if not (position_ids[..., 1:] - position_ids[..., :-1] != 1).any():  # one record; last: it reads the tensor
            return None
        embeds = kwargs.get("inputs_embeds")
        dtype, device = ((embeds.dtype, embeds.device) if embeds is not None
                         else (module.embed_tokens.weight.dtype, position_ids.device))
        kwargs["attention_mask"] = packed_masks(config, position_ids, dtype, device)
        return args, kwargs

    handle = decoder.register_forward_pre_hook(hook, with_kwargs=True)
    decoder._beam_packed_mask_hook = handle
    return handle


def _token_nll(model, batch):
    """Per-position NLL of the next token of the row (the quantity training sees), float32."""
    import torch

    out = model(**batch, use_cache=False)
    logp = torch.log_softmax(out.logits[0, :-1].float(), dim=-1)
    target = batch["input_ids"][0, 1:]
    return -logp.gather(-1, target[:, None])[:, 0]


def _per_record(nll, lengths):
    """Split a packed row's next-token NLLs per record (the last position of a record predicts the next one)."""
    return [nll[start : start + n - 1] for start, n in zip([0, *accumulate(lengths)], lengths, strict=False)]


def probe(model, lengths: list[int] | None = None, seed: int = 0) -> tuple[float, float, float, list[int]]:
    """(leak: packed vs alone, control: positions not restarting, tolerance, lengths): mean |Δ NLL| per
    token over the records after the first (docs/training.md: the probe and its tolerance)."""
    import torch
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    if not lengths:  # longer than the window (a mask that forgets the window shows), capped to stay cheap
        config = _decoder_config(model)
        sliding = "sliding_attention" in _layer_types(config)
        window = getattr(config, "sliding_window", None) if sliding else None
        base = min(int(window) + 9, 320) if window else 40
        lengths = [base, base // 2 + 3, base + 5]
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    vocab = min(int(model.config.get_text_config().vocab_size), 50_000)
    seqs = [torch.randint(0, vocab, (n,), generator=generator).to(device) for n in lengths]
    # The row exactly as SFTTrainer's padding-free collator builds it (position_ids, cu_seq_lens, ...).
    collator = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    packed = collator([{"input_ids": torch.cat(seqs).tolist(), "seq_lengths": lengths}])
    packed = {k: v.to(device) for k, v in packed.items() if k != "labels" and isinstance(v, torch.Tensor)}
    packed["max_length_q"] = packed["max_length_k"] = max(lengths)
    control = {"input_ids": packed["input_ids"], "position_ids": torch.arange(sum(lengths), device=device)[None]}

    def alone(s, pad=0):
        ids = torch.cat([s, s.new_zeros(pad)])[None]
        mask = torch.cat([torch.ones_like(s), s.new_zeros(pad)])[None]
        batch = {"input_ids": ids, "position_ids": torch.arange(len(s) + pad, device=device)[None]}
        if pad:
            batch["attention_mask"] = mask
        return _token_nll(model, batch)[: len(s) - 1]

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            single = [alone(s) for s in seqs[1:]]
            padded = [alone(s, pad=7) for s in seqs[1:]]
            packed_nll = _per_record(_token_nll(model, packed), lengths)[1:]
            control_nll = _per_record(_token_nll(model, control), lengths)[1:]
    finally:
        model.train(was_training)

    def mean_gap(rows):
        return float(torch.cat([(r - a).abs() for r, a in zip(rows, single, strict=True)]).mean())

    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    tolerance = max(ABS_TOL.get(dtype, LOW_PRECISION_TOL), 4 * mean_gap(padded))
    return mean_gap(packed_nll), mean_gap(control_nll), tolerance, lengths


def _exact(leak: float, control: float, tolerance: float) -> bool:
    return leak <= tolerance and leak <= CONTROL_SHARE * control


def packing_is_padding_free(args) -> bool:
    """Whether SFTTrainer will concatenate records into one row for these SFTConfig settings."""
    return bool(args.padding_free or (args.packing and args.packing_strategy in {"bfd", "bfd_split"}))


def ensure_exact_packing(model, args, mode: str = "auto") -> PackingReport | None:
    """Probe `model` for cross-record attention under the padding-free packing `args` asks for, fix or refuse
    (`mode`: the packing_check option). None when packing is off. Call it before training, on every rank."""
    if args.packing and args.packing_strategy == "wrapped":
        raise UsageError("packing_strategy 'wrapped' cuts and concatenates records with no isolation between them "
                         "(each token attends to the previous record's text); use packing_strategy 'bfd'")
    if not packing_is_padding_free(args):
        return None
    if mode not in ("auto", "refuse", "skip"):
        raise UsageError(f"packing_check must be auto, refuse or skip, not {mode!r}")
    config = _decoder_config(model)
    model_type = getattr(config, "model_type", type(model).__name__)
    attn = str(getattr(config, "_attn_implementation", None))
    if mode == "skip":
        logger.warning("packing: isolation probe skipped (packing_check=skip): packed records may attend to each other")
        return None

    if any(hasattr(p, "ds_id") or p.is_meta for p in model.parameters()):
        # ZeRO-3 (`ds_id`) or meta: no forward outside the engine. The explicit masks are what transformers
        # builds natively where it honours position_ids: safe unverified (tests prove them per architecture).
        if mode == "refuse":
            raise UsageError(f"packing_check refuse: the {model_type!r} model's parameters are partitioned or on the "
                             "meta device, so packing isolation cannot be probed before training; use packing_check "
                             "auto or packing: false")
        install_packed_mask_hook(model)
        report = PackingReport(model_type, attn, "explicit_masks_unprobed", [], None, None, None, None,
                               ["parameters partitioned (ZeRO-3) or on meta: probe impossible"])
        logger.warning("%s", report.line())
        return report

    leak, control, tolerance, lengths = probe(model)
    report = PackingReport(model_type, attn, "native", lengths, leak, None, control, tolerance)
    if control <= tolerance:
        report.notes.append("the control did not leak either: records too short to tell; trusting the probe")
    if _exact(leak, control, tolerance):
        logger.info("%s", report.line())
        return report

    refusal = (f"padding-free packing is not exact for model type {model_type!r} with attn_implementation {attn!r}: "
               f"packed records attend to each other (mean |Δ NLL| per token {leak:.3g} > {tolerance:.3g})")
    if mode == "refuse":
        raise UsageError(refusal + "; set packing: false, or packing_check: auto to give it explicit masks")
    handle = install_packed_mask_hook(model)
    try:
        leak_after, control, tolerance, lengths = probe(model, lengths)
        failure = None if _exact(leak_after, control, tolerance) else \
            f"even with explicit block-diagonal masks (|Δ| {leak_after:.3g})"
    except Exception as err:  # noqa: BLE001  (a model that rejects the masks is refused below, with the cause)
        failure = f"and explicit masks fail on it ({type(err).__name__}: {err})"
    if failure is not None:
        handle.remove()
        find_decoder(model)._beam_packed_mask_hook = None
        raise UsageError(f"{refusal}, {failure}; set packing: false")
    report.leak_after, report.control, report.path = leak_after, control, "explicit_masks"
    logger.warning("%s", report.line())
    logger.warning("packing: %s/%s does not isolate packed records by itself; explicit per-record attention masks "
                   "are used (%s layers), at the memory cost of a materialised mask per row", model_type, attn,
                   "/".join(sorted(set(_layer_types(config)))))
    return report
