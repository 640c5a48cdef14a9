"""`beam-sft eval --bfcl`: tool calling measured on the Berkeley Function Calling Leaderboard (BFCL v4), scored by
BFCL's own checker (the registry package `bfcl-eval`, installed without its pins: `checker.py` says how).

* `checker.py`: BFCL's data, subsets and entry-level scoring, imported without any of its model handlers;
* `prompts.py`: a BFCL entry as a prompt, the Beam way (its functions are the developer tools) or the way BFCL
  itself prompts a model that has no tool format of its own (`prompt` style: BFCL's system prompt, BFCL's decoder),
  or asking for a JSON call list in `<tool_call>` tags (`json` style);
* `run.py`: generate with any `beam-sft eval` backend, decode, score, the per-entry outputs file and its re-scoring.
"""
