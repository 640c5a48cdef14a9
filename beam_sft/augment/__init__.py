"""Data transforms that teach a tool-calling model when to call a tool and which one (`beam-sft augment`):
one module per transform, run by `beam_sft.augment.pipeline` (docs/tool-calling.md)."""
