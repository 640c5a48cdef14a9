"""Rendering records to token ids and assistant masks."""
