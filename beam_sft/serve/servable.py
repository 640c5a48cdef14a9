"""A saved model directory that a server loads as is: `make_servable` applies what a server needs beyond
`save_pretrained` (docs/serving.md), `servable_problems` checks a directory."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from copy import deepcopy
from pathlib import Path
from typing import Any

from beam_sft.errors import FatalError
from beam_sft.records.messages import STOP_MARKERS  # defined once, with the other Harmony markers
from beam_sft.storage import write_json_atomic
from beam_sft.template.tokenizer import stop_token_ids

logger = logging.getLogger(__name__)

SERVING_FIELDS = ("thinking", "content", "tool_calls")
TEXT_FIELDS = ("thinking", "content")
EOS_FILES = ("generation_config.json", "config.json")


def serving_subset_errors(template: Any) -> list[str]:
    """Why `template` is outside the serving subset (empty when inside); it must also load with transformers."""
    from transformers.utils.chat_parsing.response_templates import load_response_template

    try:
        loaded = load_response_template(template)
    except (TypeError, ValueError) as err:
        return [f"does not load: {err}"]
    errors = []
    if extra := sorted(set(loaded.fields) - set(SERVING_FIELDS)):
        errors.append(f"fields {extra} are not served (allowed: {', '.join(SERVING_FIELDS)})")
    if extra := sorted(set(loaded.defaults) - {"role"}):
        errors.append(f"defaults {extra} are not served (only 'role' is)")
    for name in TEXT_FIELDS:
        field = loaded.fields.get(name)
        if field is None:
            continue
        errors += [f"field {name!r} uses {why}, which the server cannot stream"
                   for bad, why in ((field.content != "text", f"content {field.content!r} (must be 'text')"),
                                    (field.transform is not None, "a transform"),
                                    (field.join is not None, "join"),
                                    (field.repeats, "repeats")) if bad]
    return errors


def check_serving_subset(template: Any) -> str:
    """Raise FatalError unless `template` is servable; which check decided: "vllm" (importable: its start-up
    validator first) or "beam-sft" (ours always, stricter on `repeats`: docs/serving.md)."""
    try:
        from vllm.parser.response_template import validate_response_template_for_serving as vllm_check
    except Exception:  # noqa: BLE001 - vLLM absent, or present but not importable here: ours decides
        vllm_check = None
    if vllm_check is not None:
        try:
            vllm_check(deepcopy(template))
        except (TypeError, ValueError) as err:
            raise FatalError(f"response_template is not servable (vLLM's check): {err}") from err
    if errors := serving_subset_errors(template):
        raise FatalError("response_template is not servable: " + "; ".join(errors))
    return "beam-sft" if vllm_check is None else "vllm"


def to_serving_form(template: dict[str, Any]) -> dict[str, Any]:
    """A copy of `template` with `repeats`/`join` dropped from plain-text `thinking`/`content` fields (the one
    change of the serving form, docs/serving.md); the rest is left for `check_serving_subset` to report."""
    out = deepcopy(template)
    for name in TEXT_FIELDS:
        field = (out.get("fields") or {}).get(name)
        if isinstance(field, dict) and field.get("content", "text") == "text" and "transform" not in field:
            field.pop("repeats", None)
            field.pop("join", None)
    return out


def _as_list(value: Any) -> list[int]:
    return [] if value is None else [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise FatalError(f"{path}: not valid JSON: {err}") from err
    return data if isinstance(data, dict) else None


def write_eos(directory: Path, stops: list[int]) -> list[int]:
    """`eos_token_id` of generation_config.json (made if missing) and config.json := stops + their EOS ids."""
    configs = {name: _read_json(directory / name) for name in EOS_FILES}
    eos = list(stops)  # the stop ids first, then every other id already named as EOS, each once
    for config in configs.values():
        eos += [i for i in _as_list((config or {}).get("eos_token_id")) if i not in eos]
    generation = configs["generation_config.json"]
    if generation is None:
        model_config = configs["config.json"] or {}
        generation = {"_from_model_config": False, **{key: model_config[key] for key in ("bos_token_id", "pad_token_id")
                                                      if model_config.get(key) is not None}}
    for name, data in (("generation_config.json", generation), ("config.json", configs["config.json"])):
        if data is not None:
            data["eos_token_id"] = eos
            write_json_atomic(directory / name, data)
    return eos


def current_umask() -> int:
    """The process umask, read without changing it where /proc says it (os.umask has no read-only form)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(directory: Path) -> list[Path]:
    """Give files the mode a new file gets (0666 & ~umask), directories 0777 & ~umask; what changed."""
    mask = current_umask()
    changed = []
    for path in [p for p in [directory, *sorted(directory.rglob("*"))] if not p.is_symlink()]:
        want = (0o777 if path.is_dir() else 0o666) & ~mask
        if path.stat().st_mode & 0o777 != want:
            path.chmod(want)
            changed.append(path)
    return changed


def unreadable(directory: Path) -> list[str]:
    """Files under `directory` that the umask would leave readable but that are not (group/other bits)."""
    readable = 0o444 & ~current_umask()
    return [str(p.relative_to(directory)) for p in sorted(directory.rglob("*"))
            if p.is_file() and p.stat().st_mode & readable != readable]


def _marker_ids(directory: Path, tokenizer=None) -> list[int]:
    """Stop ids from `tokenizer`, else from tokenizer.json's added tokens (no tokenizer load needed)."""
    if tokenizer is not None:
        return list(stop_token_ids(tokenizer))
    data = _read_json(directory / "tokenizer.json") or {}
    found = {t.get("content"): t.get("id") for t in data.get("added_tokens") or [] if isinstance(t, dict)}
    if all(isinstance(found.get(m), int) for m in STOP_MARKERS):
        return [found[m] for m in STOP_MARKERS]
    from transformers import AutoTokenizer

    return list(stop_token_ids(AutoTokenizer.from_pretrained(str(directory))))


def saved_response_template(directory: Path) -> dict[str, Any] | None:
    template = (_read_json(directory / "tokenizer_config.json") or {}).get("response_template")
    return template if isinstance(template, dict) else None


def _has_chat_template(directory: Path) -> bool:
    return (directory / "chat_template.jinja").is_file() or \
        bool((_read_json(directory / "tokenizer_config.json") or {}).get("chat_template"))


def _servable_template(directory: Path, strict: bool) -> tuple[str | None, bool]:
    """The response template made servable where dropping repeats/join does; (checker or None, rewritten)."""
    config_path = directory / "tokenizer_config.json"
    config = _read_json(config_path)
    template = saved_response_template(directory)
    if template is None:
        if strict:
            raise FatalError(f"{config_path}: no response_template; save the tokenizer with "
                             "beam_sft.template.tokenizer.save_tokenizer")
        logger.warning("%s: no response_template: servers cannot parse reasoning or tool calls", directory)
        return None, False
    rewritten = False
    if serving_subset_errors(template) and not serving_subset_errors(serving := to_serving_form(template)):
        config["response_template"] = serving
        write_json_atomic(config_path, config)
        logger.info("%s: response_template: repeats/join dropped from thinking/content (vLLM's serving subset)",
                    directory)
        template, rewritten = serving, True
    try:
        return check_serving_subset(template), rewritten
    except FatalError as err:
        if strict:
            raise
        logger.warning("%s: %s; vLLM's --reasoning-parser/--tool-call-parser hf will refuse it", directory, err)
        return None, rewritten


def make_servable(directory: str | Path, tokenizer=None, *, strict: bool = False) -> dict[str, Any]:
    """Make a directory written by `save_pretrained` + `save_tokenizer` servable as is (docs/serving.md);
    returns what it did. A template still outside the subset, or no chat template: FatalError when `strict`
    (export), else logged (the end of a training run must not lose its save)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FatalError(f"{directory}: not a directory")
    checker, rewritten = _servable_template(directory, strict)
    if not _has_chat_template(directory):
        if strict:
            raise FatalError(f"{directory}: no chat template")
        logger.warning("%s: no chat template: a server cannot render Beam prompts", directory)
    eos = write_eos(directory, _marker_ids(directory, tokenizer)) if (directory / "config.json").is_file() else None
    fixed = apply_umask(directory)
    return {"template_check": checker, "template_rewritten": rewritten, "eos_token_id": eos,
            "modes_fixed": [str(p.relative_to(directory)) or "." for p in fixed]}


def servable_problems(directory: str | Path) -> list[str]:
    """What keeps `directory` from being served as is (empty when nothing does); changes nothing."""
    directory = Path(directory)
    problems = [f"{name} missing" for name in ("config.json", "tokenizer.json", "tokenizer_config.json")
                if not (directory / name).is_file()]
    template = saved_response_template(directory)
    if template is None:
        problems.append("tokenizer_config.json has no response_template")
    else:
        try:
            check_serving_subset(template)
        except FatalError as err:
            problems.append(str(err))
    if not _has_chat_template(directory):
        problems.append("no chat template (chat_template.jinja)")
    if not problems:
        stops = _marker_ids(directory)
        for name in EOS_FILES:
            eos = _as_list((_read_json(directory / name) or {}).get("eos_token_id"))
            if eos[: len(stops)] != stops:
                problems.append(f"{name}: eos_token_id {eos} does not start with <|return|>, <|call|> = {stops}")
    if files := unreadable(directory):
        problems.append(f"not readable per the umask: {', '.join(files)}")
    return problems
