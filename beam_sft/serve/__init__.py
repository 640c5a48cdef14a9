"""Serving a trained model: `beam-sft export`.

* `beam_sft.serve.servable` (a layer below, so every save can call it): what makes a saved model directory loadable by an OpenAI-compatible server as is (vLLM with
  `--reasoning-parser hf --tool-call-parser hf`, SGLang, `transformers serve`): the response template within
  vLLM's serving subset, both stop tokens as EOS in `generation_config.json` and `config.json`, files readable
  per the umask, both templates and the tokenizer. `make_servable` applies it after a save; `servable_problems`
  checks a directory without changing it.
* `export`: a checkpoint, or a base model + LoRA adapter, into such a directory (merged weights on request),
  checked on the way out (`beam_sft.serve.save.save_checked`, shared with beamify), and the serve commands for it.
"""
