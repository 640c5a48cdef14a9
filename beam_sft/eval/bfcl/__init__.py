"""`beam-sft eval --bfcl`: tool calling measured on BFCL v4, scored by BFCL's own checker (`checker.py`), with
entries prompted and decoded in three styles (`prompts.py`) and any `beam-sft eval` backend (`run.py`).
See docs/evaluation.md#bfcl-v4.
"""
