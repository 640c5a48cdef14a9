"""Training: trainer class, tiny model, packing, MoE."""
