"""Dataset converters, one module per input shape (OpenAI, ShareGPT, gpt-oss Harmony, Hermes/Qwen tags, glaive-v2,
xLAM, TRL prompt/completion, Alpaca): pure functions raw record → unvalidated Beam record, raising `RecordError`
with a reason and message index. The registry, detection and validation: `beam_sft.validate.convert`.
See docs/formats.md."""
