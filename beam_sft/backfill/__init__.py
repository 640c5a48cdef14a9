"""`beam-sft backfill`: fill missing reasoning with a teacher model (see beam_sft.backfill.run)."""
