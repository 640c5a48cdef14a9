"""`beam-sft augment`: one module per transform, run by `beam_sft.augment.pipeline` (docs/tool-calling.md)."""
