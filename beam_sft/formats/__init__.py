"""Dataset converters, one module per input shape: raw record → unvalidated Beam record, or `RecordError` with
a reason and message index. Registry, detection, validation: `beam_sft.validate.convert`; docs/formats.md."""
