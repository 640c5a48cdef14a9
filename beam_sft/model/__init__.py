"""Model preparation: a base model made ready for Beam training (`beam-sft beamify`), and the one checked save
that beamify and `beam-sft export` share."""
