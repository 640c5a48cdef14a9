"""Dataset converters, one module per input shape: OpenAI, ShareGPT, gpt-oss Harmony, Hermes/Qwen tags, glaive-v2,
xLAM → unvalidated Beam records.

Each converter is a pure function ``record -> unvalidated beam record`` that raises `RecordError` (with a
reason code and the offending message index) for a record it cannot convert. Converters never validate: the
one conversion entry, `beam_sft.validate.convert`, holds the registry (`FORMATS`), detects which converter a
record needs (`detect`), runs it and then the Beam rules; it is what `convert-dataset`, the data phase,
`inspect` and `eval` call.
"""
