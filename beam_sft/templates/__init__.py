"""The Beam chat template and response template, as shipped in this package.

`chat_template.jinja` renders messages; `response_template.json` is the declarative parser spec that
`tokenizer.parse_response` / `get_response_parser` read. Where the format page is silent, the choices are
written down in DECISIONS.md beside these files.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any


def chat_template() -> str:
    return resources.files(__name__).joinpath("chat_template.jinja").read_text(encoding="utf-8")


def response_template() -> dict[str, Any]:
    return json.loads(resources.files(__name__).joinpath("response_template.json").read_text(encoding="utf-8"))


def restore_response_template_order(save_dir: str | os.PathLike) -> None:
    """Rewrite `response_template` in a saved tokenizer_config.json in its declared key order.

    `save_pretrained` writes tokenizer_config.json with sorted keys, and the parser builds tool calls from
    the transform dict in key order, so a sorted template yields `{'function': ..., 'type': ...}` where
    the format page prints `{'type': 'function', 'function': {'name': ..., 'arguments': ...}}`. The dicts
    are equal; only the printed order differs, but the page's examples must print exactly.
    """
    path = Path(save_dir) / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    if "response_template" not in config:
        return
    saved = config["response_template"]
    if saved != response_template():
        # A user's own template: keep it, but still undo the sorting we can't know the order of.
        return
    config["response_template"] = response_template()
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
