"""The Beam chat template (`chat_template.jinja`) and response template (`response_template.json`, the
parser spec of `tokenizer.parse_response`), as shipped; DECISIONS.md beside them: what the page leaves."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any


def chat_template() -> str:
    return resources.files(__name__).joinpath("chat_template.jinja").read_text(encoding="utf-8")


def response_template() -> dict[str, Any]:
    return json.loads(resources.files(__name__).joinpath("response_template.json").read_text(encoding="utf-8"))
