"""Beam records: the message type, constants, schema types, and reading and writing record files."""
