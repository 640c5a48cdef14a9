"""A chat template rendered by transformers' own Jinja machinery, with the spans of its generation blocks
(`tracked_render`, or the faster `SentinelRenderer` where the template allows it: docs/encoder.md)."""

from __future__ import annotations

import re


def render(template: str, messages, tools, template_kwargs) -> tuple[str, list[tuple[int, int]]]:
    """The rendered text and the character spans of its generation blocks, as transformers sees them."""
    sentinel = sentinel_renderer(template)
    result = sentinel(messages, tools, template_kwargs) if sentinel is not None else None
    return result if result is not None else tracked_render(template, messages, tools, template_kwargs)


def sentinel_renderer(template: str) -> SentinelRenderer | None:
    """The (cached) sentinel renderer of a template, or None where its generation blocks don't allow one."""
    if template not in _RENDERERS:
        _RENDERERS[template] = SentinelRenderer.build(template)
    return _RENDERERS[template]


def tracked_render(template: str, messages, tools, template_kwargs) -> tuple[str, list[tuple[int, int]]]:
    """transformers' own rendering with generation tracking (what apply_chat_template does)."""
    from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

    rendered, spans = render_jinja_template(conversations=[_normalize_chat_messages(messages)], tools=tools,
                                            chat_template=template, return_assistant_tokens_mask=True,
                                            add_generation_prompt=False, **template_kwargs)
    return rendered[0], spans[0]


# Unicode noncharacters (for a program's internal use): where generation blocks open and close in the text.
_OPEN, _CLOSE = "\ufdd0", "\ufdd1"
# template source -> its renderer (None: render the tracked way); per process, compiled on first use.
_RENDERERS: dict[str, SentinelRenderer | None] = {}
_SENTINELS = re.compile(f"[{_OPEN}{_CLOSE}]")


class SentinelRenderer:
    """Renders with transformers' own compiled template, faster, with the same text and spans: generation
    blocks wrapped in noncharacters, the sandbox's attribute check memoised (docs/encoder.md#how-it-works)."""

    def __init__(self, template, counter: list[int], alias, normalize, plain) -> None:
        self.template = template
        self.counter = counter
        self._alias, self._normalize, self._plain = alias, normalize, plain

    @classmethod
    def build(cls, source: str) -> SentinelRenderer | None:
        try:
            import jinja2
            from transformers.utils import chat_template_utils as ctu

            compile_fresh = ctu._cached_compile_jinja_template  # not the lru-cached one: we patch it
            helpers = (ctu._alias_reasoning_fields, ctu._normalize_chat_messages, ctu._plain_template_data)
        except (ImportError, AttributeError):  # pragma: no cover - another transformers layout
            return None
        template = compile_fresh(source)
        env = template.environment
        trackers = [ext for ext in env.extensions.values() if hasattr(ext, "_generation_support")]
        if len(trackers) != 1 or not _generation_blocks_at_top_level(env.parse(source)):
            return None
        counter = [0]

        @jinja2.pass_eval_context
        def generation(eval_ctx, caller):
            counter[0] += 1
            return _OPEN + caller() + _CLOSE

        trackers[0]._generation_support = generation
        check = env.is_safe_attribute
        verdicts: dict[tuple[type, str], bool] = {}

        def is_safe_attribute(obj, attr, value):
            key = (type(obj), attr)
            verdict = verdicts.get(key)
            if verdict is None:
                verdict = verdicts[key] = check(obj, attr, value)
            return verdict

        env.is_safe_attribute = is_safe_attribute
        return cls(template, counter, *helpers)

    def __call__(self, messages, tools, template_kwargs) -> tuple[str, list[tuple[int, int]]] | None:
        plain = self._plain
        chat = self._alias(plain(self._normalize(messages)))
        self.counter[0] = 0
        text = self.template.render(messages=chat, tools=plain(tools), documents=None, add_generation_prompt=False,
                                    **plain(template_kwargs))
        blocks = self.counter[0]
        if text.count(_OPEN) != blocks or text.count(_CLOSE) != blocks:
            return None  # the record itself contains a noncharacter
        if not blocks:
            return text, []
        spans = []
        start = -1
        for removed, found in enumerate(_SENTINELS.finditer(text)):
            position = found.start() - removed
            if found.group() == _OPEN:
                if start >= 0:
                    return None  # nested blocks: let transformers say what it makes of them
                start = position
            else:
                spans.append((start, position))
                start = -1
        return text.replace(_OPEN, "").replace(_CLOSE, ""), spans


def _generation_blocks_at_top_level(tree) -> bool:
    from jinja2 import nodes

    def is_generation(node) -> bool:
        return (isinstance(node, nodes.CallBlock) and isinstance(node.call, nodes.Call)
                and isinstance(node.call.node, nodes.ExtensionAttribute)
                and node.call.node.name == "_generation_support")

    def opens_scope(node) -> bool:
        return isinstance(node, (nodes.Macro, nodes.CallBlock, nodes.FilterBlock, nodes.AssignBlock)) or (
            isinstance(node, nodes.For) and node.recursive)

    def walk(node, top_level: bool) -> bool:
        return all(top_level and walk(child, False) if is_generation(child)
                   else walk(child, top_level and not opens_scope(child)) for child in node.iter_child_nodes())

    return walk(tree, True)
