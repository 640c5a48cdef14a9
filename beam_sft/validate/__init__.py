"""Beam rules on converted records; the one per-record conversion entry."""
