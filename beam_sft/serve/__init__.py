"""Serving a trained model: `beam-sft export` (`beam_sft.model.export`), saved through `beam_sft.serve.save`;
`beam_sft.serve.servable` (a layer below: every save calls it) says what is servable. See docs/serving.md."""
