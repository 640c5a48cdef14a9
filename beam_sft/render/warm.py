"""Warm start: `beam-sft prepare`'s tokenizer and encoder set up from a snapshot an earlier process stored
(docs/prepare.md, the "Warm start" paragraph: the key, the snapshot and what takes the normal path)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from beam_sft.errors import FatalError
from beam_sft.render import tiktoken_backend
from beam_sft.storage import atomic_output, cache_dir, files_digest, package_version, short_hash
from beam_sft.template.tokenizer import (
    DEFAULT_TOKENIZER_DIR,
    PACKAGE_DIR,
    backend_state,
    load_tokenizer,
    plain_class,
    stop_token_ids,
    template_hash,
    vocab_hash,
)

ENV_OFF = "BEAM_SFT_NO_WARM_START"
# Bump when the snapshot's layout changes (the sources below are part of the key anyway).
FORMAT = 2
KEEP = 8  # snapshots kept in the cache directory, newest first
_SOURCES = ("template/tokenizer.py", "render/encoder.py", "render/tiktoken_backend.py", "render/warm.py",
            "records/messages.py")


def load_for_encoding(path: str | Path | None = None):
    """The tokenizer `beam-sft prepare` encodes with: a snapshot's `WarmTokenizer`, else `load_tokenizer`."""
    directory = _eligible(path)
    if directory is None:
        return load_tokenizer(path)
    # What a snapshot depends on: the tokenizer's files, the code that set it up, the library versions.
    versions = "".join(f"|{lib}={package_version(lib)}" for lib in ("transformers", "tokenizers", "tiktoken"))
    sources = (b"\0" + (PACKAGE_DIR / source).read_bytes() for source in _SOURCES)
    key = short_hash(f"{FORMAT}|{files_digest(directory)}|{sys.version_info[:2]}{versions}", *sources, length=32)
    where = cache_dir() / f"warm-{key}"
    snapshot = _read(where, key)
    if snapshot is not None:
        return WarmTokenizer(path if path is not None else directory, where, snapshot)
    tokenizer = load_tokenizer(path)
    store(tokenizer, where, key)
    return tokenizer


def _eligible(path: str | Path | None) -> Path | None:
    """The tokenizer directory when a warm start may stand in for `load_tokenizer(path)`, else None."""
    if os.environ.get(ENV_OFF, "") not in ("", "0"):
        return None
    directory = Path(path) if path is not None else DEFAULT_TOKENIZER_DIR
    if not (directory / "tokenizer.json").is_file() or plain_class(directory) is None:
        return None
    return directory


def _read(where: Path, key: str) -> dict[str, Any] | None:
    try:
        snapshot = json.loads((where / "snapshot.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(snapshot, dict) or snapshot.get("key") != key or snapshot.get("format") != FORMAT:
        return None
    with contextlib.suppress(OSError):
        os.utime(where)  # in use: `_prune` goes by age
    return snapshot


def store(tokenizer, where: Path, key: str) -> bool:
    """Set up `tokenizer`'s encoder and keep what a warm start needs at `where`. False when there is nothing to
    keep (the fast path is off, a stop marker is not one token, a value JSON does not carry exactly)."""
    from beam_sft.render.encoder import get_encoder

    state = get_encoder(tokenizer).warm_state()
    if state is None:
        return False
    try:
        facts = {"len": len(tokenizer), "chat_template": tokenizer.chat_template,
                 "special_tokens_map": tokenizer.special_tokens_map, "truncation_side": tokenizer.truncation_side,
                 "split_special_tokens": bool(getattr(tokenizer, "split_special_tokens", False)),
                 "vocab_hash": vocab_hash(tokenizer), "template_hash": template_hash(tokenizer),
                 "stop_token_ids": list(stop_token_ids(tokenizer))}
    except FatalError:
        return False
    tiktoken_key = tiktoken_backend.cache_key(state["backend"]) if state["tiktoken"] is not None else None
    snapshot = {"format": FORMAT, "key": key, "tokenizer": facts,
                "encoder": {"marker_ids": state["marker_ids"], "tiktoken_reason": state["tiktoken_reason"],
                            "tiktoken_key": tiktoken_key, "backend_sha256": state["backend_sha256"]}}
    text = json.dumps(snapshot, ensure_ascii=False)
    if json.loads(text) != snapshot:  # tuples, AddedTokens, int keys...: not something to answer from
        return False
    try:
        with atomic_output(where, directory=True) as tmp:
            (tmp / "backend.json").write_text(state["backend"], encoding="utf-8")
            (tmp / "snapshot.json").write_text(text, encoding="utf-8")
    except OSError:
        return False  # a read-only cache: set up again next time
    _prune(where.parent)
    return True


def _prune(directory: Path) -> None:
    """Keep the `KEEP` newest snapshots: every change of tokenizer, code or library version makes a new one."""
    try:
        found = sorted(directory.glob("warm-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return
    for old in found[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)


def _itself(tokenizer):
    return tokenizer


class WarmTokenizer:
    """Stands in for `load_tokenizer(path)`: answers the data phase from a snapshot, loads the real tokenizer
    on first use of anything else. Pickles small (spawned workers get the snapshot, not the vocabulary)."""

    def __init__(self, path: str | Path, where: Path, snapshot: dict[str, Any]) -> None:
        self.__dict__.update(_path=path, _where=where, _snapshot=snapshot, _real=None)

    @property
    def loaded(self) -> bool:
        """Whether the real tokenizer has been loaded (then every answer is its own)."""
        return self.__dict__["_real"] is not None

    def real(self):
        """The real tokenizer, loaded on first use."""
        if self.__dict__["_real"] is None:
            self.__dict__["_real"] = load_tokenizer(self.__dict__["_path"])
        return self.__dict__["_real"]

    def __getattr__(self, name: str):
        # Only names not defined here get this far; dunders are left alone, so copy and pickle probes that run
        # before __init__ (no _snapshot yet) do not load anything.
        if name.startswith("__") or "_snapshot" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.real(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.real(), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self.real(), name)

    def __len__(self) -> int:
        return self._fact("len") if not self.loaded else len(self.real())

    def __call__(self, *args, **kwargs):
        return self.real()(*args, **kwargs)

    def __reduce__(self):
        if self.loaded:
            return _itself, (self.real(),)
        return WarmTokenizer, (self.__dict__["_path"], self.__dict__["_where"], self.__dict__["_snapshot"])

    def __repr__(self) -> str:
        state = "loaded" if self.loaded else f"from {self.__dict__['_where']}"
        return f"WarmTokenizer({str(self.__dict__['_path'])!r}, {state})"

    def _fact(self, name: str) -> Any:
        if self.loaded:
            return getattr(self.real(), name)
        value = self.__dict__["_snapshot"]["tokenizer"][name]
        return dict(value) if isinstance(value, dict) else value

    chat_template = property(lambda self: self._fact("chat_template"))
    special_tokens_map = property(lambda self: self._fact("special_tokens_map"))
    truncation_side = property(lambda self: self._fact("truncation_side"))
    split_special_tokens = property(lambda self: self._fact("split_special_tokens"))

    @property
    def name_or_path(self) -> str:
        return str(self.__dict__["_path"]) if not self.loaded else self.real().name_or_path

    def get_chat_template(self, chat_template: str | None = None, tools: list | None = None) -> str:
        template = self._fact("chat_template")
        if chat_template is None and isinstance(template, str) and not self.loaded:
            return template
        return self.real().get_chat_template(chat_template, tools)

    # -- what beam_sft.template.tokenizer and beam_sft.render.encoder ask, looked up on the type ------------

    def beam_precomputed(self, name: str) -> Any:
        """`vocab_hash`, `template_hash` or `stop_token_ids` as the snapshot has them; None once loaded."""
        if self.loaded or name not in ("vocab_hash", "template_hash", "stop_token_ids"):
            return None
        return self.__dict__["_snapshot"]["tokenizer"][name]

    def beam_encoder_state(self) -> dict[str, Any] | None:
        """The encoder's fast-path setup (`MaskedEncoder._setup_warm`), or None (then it sets up as usual)."""
        if self.loaded:
            return None
        encoder = self.__dict__["_snapshot"]["encoder"]
        pieces = None
        if encoder["tiktoken_key"] is not None:
            cached = tiktoken_backend.read_cached(encoder["tiktoken_key"])
            if cached is None or cached[0] is None:
                return None  # the ranks pruned or damaged under us: the normal setup, on the real tokenizer
            pieces = cached[0]
        return {**encoder, "tiktoken": pieces}

    def beam_backend_state(self) -> tuple[str, str]:
        """(serialised backend, its sha256), as `beam_sft.template.tokenizer.backend_state` gives them."""
        if not self.loaded:
            want = self.__dict__["_snapshot"]["encoder"]["backend_sha256"]
            with contextlib.suppress(OSError):
                text = (self.__dict__["_where"] / "backend.json").read_text(encoding="utf-8")
                if short_hash(text, length=64) == want:
                    return text, want
        return backend_state(self.real())
