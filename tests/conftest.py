"""Hermetic test settings (no hub access, quiet tokenizers) and the fixtures most test files share."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


@pytest.fixture(scope="module")
def tok():
    """The bundled tokenizer (data/tokenizer), with both templates; one per test module."""
    from beam_sft.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def encoder(tok):
    """The fast masked encoder of `beam_sft.render` over the bundled tokenizer."""
    from beam_sft.render import MaskedEncoder

    return MaskedEncoder(tok)
