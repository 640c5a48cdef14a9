"""Tool schemas several tests share: the two tools tests/data/tool_prompts/qwen*_rendered*.txt were rendered
with (SOURCES.md there), also the tools of the converter tests."""

from __future__ import annotations

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}, "days": {"type": "integer"}},
                                                "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Local time.",
                                         "parameters": {"type": "object", "properties": {
                                             "city": {"type": "string"}}, "required": ["city"]}}}
