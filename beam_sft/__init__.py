"""beam-sft: convert chat datasets to Beam Harmony, render them with exact assistant masks, train with TRL."""

from beam_sft.errors import BeamSFTError, Reason, RecordError

__version__ = "0.1.0"

__all__ = ["BeamSFTError", "Reason", "RecordError", "__version__"]
