"""The Beam chat template and response template, as shipped in this package.

`chat_template.jinja` renders messages; `response_template.json` is the declarative parser spec that
`tokenizer.parse_response` reads. Where the format page is silent, the choices are in DECISIONS.md beside them.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any


def chat_template() -> str:
    return resources.files(__name__).joinpath("chat_template.jinja").read_text(encoding="utf-8")


def response_template() -> dict[str, Any]:
    return json.loads(resources.files(__name__).joinpath("response_template.json").read_text(encoding="utf-8"))
