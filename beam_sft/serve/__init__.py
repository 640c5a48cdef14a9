"""Serving a trained model: `beam-sft export` (`beam_sft.model.export`), saved through `beam_sft.serve.save`.

`beam_sft.serve.servable` (a layer below, so every save can call it) says what makes a directory servable as is.
See docs/serving.md.
"""
