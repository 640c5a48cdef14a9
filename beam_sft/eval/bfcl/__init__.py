"""`beam-sft eval --bfcl`: tool calling on BFCL v4, scored by BFCL's own checker (docs/evaluation.md)."""
