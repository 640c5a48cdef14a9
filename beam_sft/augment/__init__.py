"""Data transforms that teach a tool-calling model when to call a tool and which one (`beam-sft augment`).

Each transform is a pure callable over a validated Beam record (`beam_sft.augment.base`): `irrelevance` and
`ask-missing` add records (no declared tool fits; an argument the user never gave), `distractors` and
`mask-names` rewrite them (tools the request does not need; neutral names). `beam_sft.augment.pipeline` runs
them from their command-line specs, seeded per record, with their counts (docs/tool-calling.md).
"""
