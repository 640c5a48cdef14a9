"""What decides a prepared dataset (settings, sources, tokenizer: its fingerprint), and its manifest."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from beam_sft.dataset.examples import TRUNCATION_POLICIES
from beam_sft.errors import FatalError, UsageError
from beam_sft.records.files import REJECTS  # noqa: F401  (the prepared dir's rejects file)
from beam_sft.storage import files_digest, short_hash
from beam_sft.template.tokenizer import DEFAULT_TOKENIZER_DIR, template_hash, vocab_hash
from beam_sft.validate.calls import TOOL_CALL_CHECKS_CHOICES
from beam_sft.validate.convert import INPUT_FORMATS
from beam_sft.validate.rules import MISSING_REASONING_CHOICES

logger = logging.getLogger(__name__)

# Part of every cache fingerprint and manifest: bump when what the data phase writes could change.
# 2: the manifest says which mixture source each eval row came from (eval_sources); 3: it records
# tool_call_checks, checked against the run's (a directory prepared before cannot say it: prepared again)
DATA_VERSION = "3"
MANIFEST = "beam_sft_manifest.json"
EVAL_DIR = "eval"


@dataclass(frozen=True)
class DataSettings:
    """What decides the prepared data, besides the sources and the tokenizer."""

    format: str = "auto"
    max_length: int | None = None
    truncation_policy: str = "turn"
    assistant_only_loss: bool = True
    split: str = "train"
    max_records: int | None = None
    eval_split_size: float = 0.0
    seed: int = 0
    missing_reasoning: str = "mask"  # beam_sft.validate.rules.MISSING_REASONING_CHOICES
    dedup: bool = True  # exact duplicates rejected (beam_sft.records.dedup); train -> eval too
    tool_call_checks: str = "reject"  # beam_sft.validate.calls.TOOL_CALL_CHECKS_CHOICES
    max_reject_share: float = 0.5  # beam_sft.dataset.drops: a run dropping more fails; not in the fingerprint

    def check(self) -> None:
        for what, value, choices in (("missing_reasoning", self.missing_reasoning, MISSING_REASONING_CHOICES),
                                     ("tool_call_checks", self.tool_call_checks, TOOL_CALL_CHECKS_CHOICES),
                                     ("format", self.format, INPUT_FORMATS),
                                     ("truncation policy", self.truncation_policy, TRUNCATION_POLICIES)):
            if value not in choices:
                raise UsageError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")
        if self.max_length is not None and self.max_length < 1:
            raise UsageError("max_length must be at least 1")
        if self.max_records is not None and self.max_records < 0:
            raise UsageError("max_records must be >= 0")
        if self.eval_split_size < 0:
            raise UsageError("eval_split_size must be >= 0")
        if not 0 <= self.max_reject_share <= 1:
            raise UsageError(f"--max_reject_share {self.max_reject_share}: a share of the input records, 0 to 1 "
                             "(1.0 accepts any share)")


@dataclass(frozen=True)
class PhaseOptions:
    """How a data phase runs, not what it makes (no part of the fingerprint)."""

    num_proc: int | None = None  # worker processes of a build (default: the usable cores, at most 32)
    progress: bool = False
    output_dir: str | os.PathLike | None = None  # data_phase.rank<N>.json; streaming: rejects.rank<N>.jsonl
    world_size: int = 1  # streaming: ranks, each reading its own shards
    shards_per_rank: int = 1
    shuffle_buffer: int | None = None  # streaming: a seeded buffer of N raw records
    streaming: bool = False  # training: stream the data (nothing cached) instead of preparing it
    main_process: bool = True  # training: the rank that copies the rejects and writes data_stats.json


# Local files up to this size are also identified by a hash of their bytes (cheap; catches an edit that keeps
# size and mtime, e.g. `cp -p` or a rewrite within the filesystem's timestamp granularity). Larger ones, and
# files past the per-run budget, by size + mtime_ns only: a 10^7-record input is GBs, not hashed every run.
HASH_FILE_BYTES = 1 << 20
HASH_BUDGET_BYTES = 64 << 20


def source_identity(sources) -> list[dict[str, Any]]:
    """What identifies the data without reading much of it (docs/prepare.md, The cache key)."""
    out = []
    budget = HASH_BUDGET_BYTES
    for src in sources:
        options = {k: v for k, v in (("config", src.config), ("revision", src.revision), ("data_dir", src.data_dir),
                                     ("data_files", src.data_files), ("columns", src.columns)) if v is not None}
        if src.kind == "hub" and not Path(src.name).is_dir():
            out.append({"hub": src.name, "split": src.split, **options, **hub_commit(src)})
            continue
        path = Path(src.name)
        files = []
        for file in sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]:
            st, name = file.stat(), file.relative_to(path) if path.is_dir() else file.name
            files.append([str(name), st.st_size, st.st_mtime_ns])
            if st.st_size <= HASH_FILE_BYTES and st.st_size <= budget:
                budget -= st.st_size
                files[-1].append(hashlib.blake2b(file.read_bytes(), digest_size=16).hexdigest())
        out.append({"path": str(path.resolve()), "split": src.split if src.kind in ("disk", "hub") else None,
                    **options, "files": files})
    return out


def hub_commit(src) -> dict[str, Any]:
    """The commit a hub dataset is read at, established as `datasets.load_dataset` will establish it (offline:
    the newest copy in its cache); else a fresh nonce: the data is prepared again, never guessed stale."""
    if src.revision and re.fullmatch(r"[0-9a-f]{40}", src.revision):
        return {"commit": src.revision}
    import datasets

    try:
        if datasets.config.HF_HUB_OFFLINE:
            from datasets.packaged_modules.cache.cache import _find_hash_in_cache

            kwargs = {k: v for k, v in (("data_files", src.data_files), ("data_dir", src.data_dir)) if v is not None}
            _, version, commit = _find_hash_in_cache(src.name, src.config, None, kwargs, None)
            return {"commit": commit, "cached_version": version}
        from huggingface_hub import HfApi

        return {"commit": HfApi().dataset_info(src.name, revision=src.revision, timeout=30).sha}
    except Exception as err:  # noqa: BLE001 - any failure means "not established": rebuild, said below
        why = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    logger.warning("%s: cannot establish which commit of the hub dataset would be read (%s); preparing it again "
                   "instead of reusing a cached copy that may be stale", src.name, why)
    return {"commit": None, "unresolved": secrets.token_hex(8)}


def tokenizer_files_hash(path: str | os.PathLike | None) -> str | None:
    """A hash of a local tokenizer directory's files, or None (a hub id): lets `beam-sft prepare` see that a
    prepared directory is up to date without loading the tokenizer."""
    directory = Path(DEFAULT_TOKENIZER_DIR if path is None else path)
    return files_digest(directory)[:16] if directory.is_dir() else None


def run_fields(tokenizer, settings: DataSettings) -> dict[str, Any]:
    """The manifest fields a prepared dataset must match to train with this tokenizer and these settings."""
    return {"tokenizer": vocab_hash(tokenizer), "chat_template": template_hash(tokenizer),
            "max_length": settings.max_length, "truncation_policy": settings.truncation_policy,
            "assistant_only_loss": settings.assistant_only_loss,
            "tool_call_checks": settings.tool_call_checks}


def fingerprint(identity: Any, tokenizer, settings: DataSettings, extra: Any = None) -> str:
    from beam_sft.render.encoder import RENDER_VERSION

    parts = {"data_version": DATA_VERSION, "render_version": RENDER_VERSION, "sources": identity,
             "settings": asdict(settings), **run_fields(tokenizer, settings), "extra": extra}
    if not settings.eval_split_size:
        parts["settings"].pop("seed")  # the seed only matters to the eval split
    parts["settings"].pop("max_reject_share")  # checked on every run, cached or not: the data is the same
    return short_hash(json.dumps(parts, sort_keys=True, default=str))


def default_cache_dir() -> str:
    if os.environ.get("BEAM_SFT_PREPARED_CACHE"):
        return os.environ["BEAM_SFT_PREPARED_CACHE"]
    from datasets import config

    return os.path.join(str(config.HF_DATASETS_CACHE), "beam_sft_prepared")


def read_manifest(path: str | os.PathLike) -> dict[str, Any] | None:
    """The manifest of a prepared directory, or None when `path` is not one."""
    file = Path(path) / MANIFEST
    if not file.is_file():
        return None
    try:
        return json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise FatalError(f"{file}: unreadable manifest: {err}") from err


def check_manifest(manifest: dict[str, Any], tokenizer, settings: DataSettings, where: str) -> None:
    """Fail with a message naming the first field where the prepared data and this run disagree."""
    for key, wanted in run_fields(tokenizer, settings).items():
        have = manifest.get(key)
        if have != wanted:
            what = {"tokenizer": "tokenizer vocabulary", "chat_template": "chat template"}.get(key, key)
            raise UsageError(f"{where} was prepared with a different {what}: manifest field {key!r} is {have!r}, "
                             f"this run has {wanted!r}; run `beam-sft prepare` again with this run's settings, "
                             "or match them")
