"""The bundled Beam tokenizer: loading, saving, the installed templates, and the hashes caches key on
(docs/template.md#the-bundled-tokenizer; `beam_sft.model.beamify` does the same to other tokenizers)."""

from __future__ import annotations

import hashlib
import json
from json.decoder import WHITESPACE
from pathlib import Path
from typing import Any

from beam_sft.errors import FatalError
from beam_sft.records.messages import HARMONY_MARKERS as MARKERS
from beam_sft.records.messages import RETURN, STOP_MARKERS
from beam_sft.storage import short_hash, write_text_atomic
from beam_sft.template.bundled import bundled

EOS_TOKEN = RETURN
# Not EOS (docs/template.md#the-bundled-tokenizer); special: decode(skip_special_tokens=True) drops it.
PAD_TOKEN = "<|pad|>"
PLAIN_MARKERS: tuple[str, ...] = tuple(m for m in MARKERS if m != EOS_TOKEN)

PACKAGE_DIR = Path(__file__).resolve().parents[1]
TEMPLATES_DIR = PACKAGE_DIR / "template"
# data/tokenizer: the checkout's, or the copy an installed wheel carries (beam_sft/template/bundled.py).
DEFAULT_TOKENIZER_DIR = bundled("data/tokenizer")


def stop_token_ids(tokenizer) -> tuple[int, int]:
    """Ids of `<|return|>` and `<|call|>` (`STOP_MARKERS`); each must be a single token."""
    known = _precomputed(tokenizer, "stop_token_ids")
    if known is not None:
        return known[0], known[1]
    ids = []
    for marker in STOP_MARKERS:
        encoded = tokenizer.encode(marker, add_special_tokens=False)
        if len(encoded) != 1:
            raise FatalError(f"{marker} encodes to {len(encoded)} tokens with this tokenizer; Beam markers must be "
                             "single tokens (run beamify on it, or use --beamify)")
        ids.append(encoded[0])
    return ids[0], ids[1]


def _precomputed(tokenizer, name: str) -> Any:
    """What a snapshot-backed tokenizer (`render.warm.WarmTokenizer`) already knows, or None. Looked up on the
    type: a transformers tokenizer's `__getattr__` answers names of its own."""
    answer = getattr(type(tokenizer), "beam_precomputed", None)
    return answer(tokenizer, name) if answer is not None else None


def vocab_hash(tokenizer) -> str:
    """A hash of what turns text into ids: the backend tokenizer (vocabulary, merges, added tokens) and specials."""
    known = _precomputed(tokenizer, "vocab_hash")
    if known is not None:
        return known
    backend = getattr(tokenizer, "_tokenizer", None)
    special = json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str)
    tail = f"{special}|{tokenizer.truncation_side}|{getattr(tokenizer, 'split_special_tokens', False)}"
    if backend is None:
        return short_hash(f"{json.dumps(sorted(tokenizer.get_vocab().items()))}|{tail}")
    digest = _backend_digest(backend).copy()  # the same value as short_hash(f"{body}|{tail}")
    digest.update(f"|{tail}".encode())
    return digest.hexdigest()[:16]


def backend_state(tokenizer) -> tuple[str, str]:
    """(the backend serialised, its sha256): what the encoder's setup keys its caches by. The digest is
    remembered for `vocab_hash`: a run serialises the vocabulary once."""
    hook = getattr(type(tokenizer), "beam_backend_state", None)
    if hook is not None:
        return hook(tokenizer)
    backend = tokenizer._tokenizer
    text = backend.to_str()
    digest = hashlib.sha256(text.encode())
    _remember(backend, digest)
    return text, digest.hexdigest()


def _pipeline(backend) -> list:
    """Everything a caller can swap in place on a backend without changing its size."""
    steps = (backend.normalizer, backend.pre_tokenizer, backend.post_processor, backend.decoder)
    return [backend.get_vocab_size(with_added_tokens=True), backend.model.__class__.__name__,
            *(step.__getstate__() if step is not None else None for step in steps), backend.truncation, backend.padding]


def _backend_digest(backend):
    """sha256 of `backend.to_str()` (a second on 200k tokens), remembered while `_pipeline` is unchanged."""
    memo = _VOCAB_HASHES.get(id(backend))
    if memo is None or memo[0] is not backend or memo[1] != _pipeline(backend):
        return _remember(backend, hashlib.sha256(backend.to_str().encode()))
    return memo[2]


def _remember(backend, digest):
    _VOCAB_HASHES.clear()  # one tokenizer at a time is the rule; keeps no backend alive for long
    _VOCAB_HASHES[id(backend)] = (backend, _pipeline(backend), digest)
    return digest


_VOCAB_HASHES: dict[int, tuple[Any, list, Any]] = {}


def template_hash(tokenizer) -> str:
    """A hash of the tokenizer's chat template(s)."""
    known = _precomputed(tokenizer, "template_hash")
    return known if known is not None else short_hash(json.dumps(tokenizer.chat_template, sort_keys=True))


def read_templates(template_dir: str | Path | None = None) -> tuple[str, dict[str, Any]]:
    """Return (chat template source, response template dict) read from `template_dir` (default: the package's)."""
    directory = Path(template_dir) if template_dir is not None else TEMPLATES_DIR
    chat_path, response_path = directory / "chat_template.jinja", directory / "response_template.json"
    if missing := next((path for path in (chat_path, response_path) if not path.is_file()), None):
        raise FatalError(f"template file not found: {missing}")
    chat_template = chat_path.read_text(encoding="utf-8")
    try:
        response_template = json.loads(response_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise FatalError(f"{response_path}: not valid JSON: {err}") from err
    if not isinstance(response_template, dict):
        raise FatalError(f"{response_path}: must hold a JSON object, got {type(response_template).__name__}")
    return chat_template, response_template


def install_templates(tokenizer, template_dir: str | Path | None = None):
    """Set `tokenizer.chat_template` and `tokenizer.response_template` from the template files; returns it."""
    from transformers.utils.chat_parsing.response_templates import load_response_template

    chat_template, response_template = read_templates(template_dir)
    # Fail here, not at the first parse_response call, if the response template is malformed.
    load_response_template(response_template)
    tokenizer.chat_template = chat_template
    tokenizer.response_template = response_template
    return tokenizer


def save_tokenizer(tokenizer, save_dir: str | Path) -> list[Path]:
    """`save_pretrained`, then `response_template` back in its declared key order (save_pretrained sorts keys,
    and the parser builds tool calls in key order: `{'function': ..., 'type': ...}`, not the page's)."""
    save_dir = Path(save_dir)
    tokenizer.save_pretrained(str(save_dir))
    response_template = getattr(tokenizer, "response_template", None)
    config_path = save_dir / "tokenizer_config.json"
    if response_template is not None and config_path.is_file():
        config = json.loads(config_path.read_text(encoding="utf-8"))
        config["response_template"] = response_template
        write_text_atomic(config_path, json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return sorted(p for p in save_dir.iterdir() if p.is_file())


def load_tokenizer(path: str | Path | None = None, **kwargs):
    """Load a tokenizer as AutoTokenizer does (default: the bundled `data/tokenizer`)."""
    if path is None:
        path = DEFAULT_TOKENIZER_DIR
        if not (path / "tokenizer_config.json").is_file():
            raise FatalError(f"bundled tokenizer not found at {path}; run `python scripts/build_tokenizer.py` in the "
                             "repo, or pass a tokenizer path")
    named = plain_class(path)
    if named is not None:
        # The class AutoTokenizer would pick, without importing AutoTokenizer's model registry (and torch
        # with it): seconds of a data-only command's start-up.
        import transformers

        given = _added_tokens_kwargs(Path(path)) if "added_tokens_decoder" not in kwargs else {}
        tokenizer = getattr(transformers, named).from_pretrained(str(path), **kwargs, **given)
        if given:  # where transformers' own reading puts it: the same init_kwargs, key order included
            tokenizer.init_kwargs["added_tokens_decoder"] = tokenizer.init_kwargs.pop("added_tokens_decoder")
        return tokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), **kwargs)


# tokenizer_config.json classes that are plain tokenizers-backed tokenizers (this project's and beamify's output).
_PLAIN_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def plain_class(path: str | Path) -> str | None:
    """The class AutoTokenizer would pick for the directory `path` when one of `_PLAIN_CLASSES`, else None."""
    config = Path(path) / "tokenizer_config.json"
    # A model directory (config.json) may map its model type to another class: AutoTokenizer decides there.
    if not config.is_file() or (Path(path) / "config.json").exists():
        return None
    try:
        named = json.loads(config.read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None
    return named if named in _PLAIN_CLASSES else None


def _added_tokens_kwargs(directory: Path) -> dict[str, Any]:
    """`added_tokens_decoder` for `from_pretrained` from the head of tokenizer.json, or {}: without it (our
    tokenizer_config.json) transformers `json.load`s all of tokenizer.json for that list, most of a second on
    200k tokens. Only where its legacy branch reads nothing else (no special_tokens_map, added_tokens)."""
    tokenizer_file = directory / "tokenizer.json"
    if (directory / "special_tokens_map.json").exists() or (directory / "added_tokens.json").exists():
        return {}
    try:
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
        if "added_tokens_decoder" in config or not tokenizer_file.is_file():
            return {}
        entries = _head_value(tokenizer_file, "added_tokens")
    except (OSError, ValueError):
        return {}
    if not isinstance(entries, list):
        return {}
    from tokenizers import AddedToken

    # The key is evaluated first, so `id` is gone from the entry by the time AddedToken sees it.
    return {"added_tokens_decoder": {entry.pop("id"): AddedToken(**entry) for entry in map(dict, entries)}}


def _head_value(path: Path, key: str, chunk: int = 1 << 20) -> Any:
    """The value of top-level `key` in a JSON object file, decoding the members before it one by one (the
    file's other members, the vocabulary and merges, are never decoded). Raises ValueError when absent."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as handle:
        text = handle.read(chunk)
        pos = _skip_space(text, 0)
        if text[pos: pos + 1] != "{":
            raise ValueError(f"{path}: not a JSON object")
        pos += 1
        while True:
            try:
                name, after = decoder.raw_decode(text, _skip_space(text, pos))
                colon = _skip_space(text, after)
                if text[colon: colon + 1] != ":":
                    raise json.JSONDecodeError("expected ':'", text, colon)
                value, end = decoder.raw_decode(text, _skip_space(text, colon + 1))
                follow = _skip_space(text, end)
                if follow >= len(text):  # a number cut by the chunk's end decodes too: make sure it is whole
                    raise json.JSONDecodeError("cut", text, follow)
            except json.JSONDecodeError:
                more = handle.read(chunk)
                if not more:
                    raise
                text += more  # a member cut by the chunk's end: read on and decode it again
                continue
            if name == key:
                return value
            if text[follow] != ",":
                raise ValueError(f"{path}: no top-level {key!r}")
            pos = follow + 1


def _skip_space(text: str, pos: int) -> int:
    return WHITESPACE.match(text, pos).end()
