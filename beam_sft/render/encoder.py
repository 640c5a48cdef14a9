"""Beam records -> `input_ids` + `assistant_masks`, fast, and identical to `apply_chat_template`
(docs/encoder.md#how-it-works)."""

from __future__ import annotations

import json
import os
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate, chain, pairwise
from typing import Any

from beam_sft.errors import Reason, RecordError, internal_error
from beam_sft.render import direct as direct_render
from beam_sft.render import jinja, tiktoken_backend
from beam_sft.template.tokenizer import backend_state

# Part of the prepared data's fingerprint (beam_sft.dataset.settings): bump when the output of the encoder could change.
RENDER_VERSION = "1"

# Probe texts for the split-exactness check: spaces before and after markers, line breaks, tabs,
# non-ASCII letters, emoji (multi-byte, split into several byte tokens), SentencePiece's "▁", digits.
_PROBE_TEXTS = (
    "hello world", " leading space", "  two leading spaces", "trailing space ", "\n\nnew lines\n", "\ttab\tseparated",
    "café naïve 日本語 🙂 Привет", "▁already ▁marked", "x", " ", "\n", "12345 67,890.5",
    'def f(x):\n    return {"a": [1, 2]}\n', "<|not a marker|> <| start |>",
    # For an encoder other than the tokenizer's own (tiktoken): case, marks, digits of other scripts,
    # case-insensitive contractions, Unicode spaces, control characters, runs that stress BPE's merge order.
    "ǅungla Ǆ ǆ e\u0301 cafe\u0301s ٣٤٥ ۱۲ ſtraße IT'S it'LL ſ'ſ I'M",
    "\u00a0nbsp\u2028line\u2029para\u0085nel\r\n\r\n  \n \x00\x01\x1f\x7f",
    "ｆｕｌｌ ｗｉｄｔｈ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚 😀🏽 👩‍💻",
    "    indented\n\t\ttabs\n------ ====== ..... ////// aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
)


class _Fallback(Exception):
    """Raised inside the fast path when the cut at markers cannot be trusted."""


def record_inputs(record: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> tuple[list, Any, dict]:
    """(messages, tools, chat_template_kwargs) of a record (or a bare list: the messages) for
    `apply_chat_template`. None kwargs are dropped: datasets fills keys a row's struct lacks with None."""
    if isinstance(record, Mapping):
        messages, tools, kwargs = record.get("messages"), record.get("tools"), record.get("chat_template_kwargs")
    else:
        messages, tools, kwargs = record, None, None
    if not isinstance(messages, (list, tuple)) or not messages:
        raise RecordError(Reason.EMPTY_CONVERSATION, "the record has no messages to render")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as err:
            raise RecordError(Reason.BAD_TOOL_SCHEMA, f"tools is a string that is not JSON: {err}") from None
    if tools is not None and not isinstance(tools, (list, tuple)):
        raise RecordError(Reason.BAD_TOOL_SCHEMA, f"tools must be a list, got {type(tools).__name__}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise RecordError(Reason.RENDER_FAILED, f"chat_template_kwargs must be a mapping, got {type(kwargs).__name__}")
    kwargs = {key: value for key, value in (kwargs or {}).items() if value is not None}
    return list(messages), (list(tools) if tools is not None else None), kwargs


def _render_error(err: Exception) -> RecordError:
    text = str(err)
    found = re.search(r"messages\[(\d+)\]", text)
    return RecordError(Reason.RENDER_FAILED, f"the chat template failed: {text}",
                       message_index=int(found.group(1)) if found else None)


def reference_encode(tokenizer, record, max_length: int | None = None) -> dict[str, list[int]]:
    """The reference: `apply_chat_template` on one record. Also the fallback path."""
    messages, tools, kwargs = record_inputs(record)
    try:
        out = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True, truncation=max_length is not None,
                                            max_length=max_length, **kwargs)
    except Exception as err:  # jinja2 TemplateError, TypeError from odd content, ...
        if isinstance(err, RecordError):
            raise
        raise _render_error(err) from err
    return {"input_ids": list(out["input_ids"]), "assistant_masks": list(out["assistant_masks"])}


def encode_each(encoder: MaskedEncoder, records: Sequence) -> list[dict[str, list[int]] | RecordError]:
    """Encode a batch; if it fails, record by record, so a rejected record (its `RecordError` or an
    `internal_error`) costs only itself. `BEAM_SFT_DEBUG=1` lets an unexpected exception propagate."""
    try:
        return encoder.encode(records)
    except Exception as batch_err:
        if os.environ.get("BEAM_SFT_DEBUG") and not isinstance(batch_err, RecordError):
            raise
    out: list[dict[str, list[int]] | RecordError] = []
    for record in records:
        try:
            out.append(encoder.encode([record])[0])
        except RecordError as err:
            out.append(err)
        except Exception as exc:  # noqa: BLE001 - the template or encoder tripping on one record: a reject
            out.append(internal_error(exc))
    return out


class MaskedEncoder:
    """Encodes Beam records in batches. `fast`: the split-at-markers path is used (`fallback_reason`: why
    not); `cache_size` bounds the distinct text pieces whose ids are kept."""

    def __init__(self, tokenizer, *, cache_size: int = 100_000, force_fallback: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.cache_size = cache_size
        self._cache: dict[str, tuple[int, ...]] = {}  # pieces after a marker
        self._first_cache: dict[str, tuple[int, ...]] = {}  # pieces at the very start of a text
        self._serialized: str | None = None  # the backend as it was at setup; a private copy is made from it
        self._private_backend = None
        self._tiktoken = None
        self._backend_sha256: str | None = None
        self.tiktoken_reason: str | None = "the fast path is off"
        if force_fallback:
            self.fallback_reason: str | None = force_fallback
        elif not self._setup_warm():
            self.fallback_reason = self._setup_fast_path()

    def clear_caches(self) -> None:
        """Forget cached pieces and rendered system/developer prefixes (benchmarks time a cold start)."""
        self._cache.clear()
        self._first_cache.clear()
        for renderer in _DIRECT_RENDERERS.values():
            if renderer is not None:
                renderer.clear()

    @property
    def fast(self) -> bool:
        return self.fallback_reason is None

    def _setup_fast_path(self) -> str | None:
        tokenizer = self.tokenizer
        original = getattr(tokenizer, "_tokenizer", None)
        if original is None or not hasattr(original, "encode_batch"):
            return "not a fast (Rust-backed) tokenizer"
        if getattr(tokenizer, "split_special_tokens", False):
            return "split_special_tokens=True: special tokens are tokenized as text"
        self._serialized, self._backend_sha256 = backend_state(tokenizer)
        contents: dict[str, int] = {}
        for token_id, token in original.get_added_tokens_decoder().items():
            if token.lstrip or token.rstrip or token.single_word:
                return f"added token {token.content!r} strips spaces or matches single words"
            if token.normalized and original.normalizer is not None:
                return f"added token {token.content!r} is matched after normalization"
            if token.content:
                contents[token.content] = token_id
        self._set_markers(contents)
        if self._backend_sha256 not in _TIKTOKEN_PIECES:
            _TIKTOKEN_PIECES[self._backend_sha256] = tiktoken_backend.build_cached(self._serialized)
        self._tiktoken, self.tiktoken_reason = _TIKTOKEN_PIECES[self._backend_sha256]
        # The shared backend is what `_serialized` describes right now; it serves the probe unless transformers
        # left a truncation or padding setting on it (then the private copy does).
        clean = original.truncation is None and original.padding is None and not original.encode_special_tokens
        probe_backend = original if clean else self._backend
        problem = self._probe(probe_backend)
        if problem and self._tiktoken is not None:
            # The tokenizers backend alone, which is what the probe compares against.
            self._tiktoken, self.tiktoken_reason = None, f"the probe found a difference: {problem}"
            problem = self._probe(probe_backend)
        if problem:
            self._serialized = self._private_backend = self._backend_sha256 = None
        return problem

    def _set_markers(self, contents: dict[str, int]) -> None:
        self._marker_ids = contents
        self._marker_lists = {content: [token_id] for content, token_id in contents.items()}
        self._context_marker = min(contents, key=len) if contents else ""
        self._split = _splitter(contents)

    def _setup_warm(self) -> bool:
        """The fast path as a `render.warm` snapshot left it (no serialising, hashing, probing), or False."""
        state_of = getattr(type(self.tokenizer), "beam_encoder_state", None)
        state = state_of(self.tokenizer) if state_of is not None else None
        if state is None:
            return False
        self._set_markers(dict(state["marker_ids"]))
        self._tiktoken, self.tiktoken_reason = state["tiktoken"], state["tiktoken_reason"]
        self._backend_sha256 = state["backend_sha256"]
        self.fallback_reason = None
        return True

    def warm_state(self) -> dict[str, Any] | None:
        """What `_setup_warm` needs, plus the serialised backend it stands for; None off the fast path."""
        if not self.fast or self._serialized is None:
            return None
        return {"marker_ids": self._marker_ids, "tiktoken": self._tiktoken, "tiktoken_reason": self.tiktoken_reason,
                "backend_sha256": self._backend_sha256, "backend": self._serialized}

    @property
    def _backend(self):
        """A private copy of the backend, made on first use (a leftover truncation/padding setting on the
        shared one must not cut our pieces); with tiktoken only rare pieces need it: most never pay."""
        if self._private_backend is None and self._backend_sha256 is not None:
            from tokenizers import Tokenizer

            if self._serialized is None:  # a warm start: the backend as the snapshot describes it, first needed now
                self._serialized, digest = backend_state(self.tokenizer)
                if digest != self._backend_sha256:
                    raise RuntimeError("the tokenizer's backend is not the one its warm-start snapshot describes; "
                                       "run again with BEAM_SFT_NO_WARM_START=1 and report it")
            backend = Tokenizer.from_str(self._serialized)
            backend.no_truncation()
            backend.no_padding()
            backend.encode_special_tokens = False
            self._private_backend = backend
        return self._private_backend

    def _probe(self, backend) -> str | None:
        """Compare whole-text (by `backend`) and piece-wise tokenization (ids and offsets) on probe strings."""
        markers = list(self._marker_ids) or [""]
        n = len(_PROBE_TEXTS)
        texts = []
        for shift in range(n):
            joined = "".join(_PROBE_TEXTS[(k + shift) % n] + markers[(k + shift) % len(markers)] for k in range(n))
            texts += [joined, markers[shift % len(markers)] + joined]
        texts.extend(_PROBE_TEXTS)
        whole = backend.encode_batch(texts, add_special_tokens=False)
        for text, encoding in zip(texts, whole, strict=True):
            try:
                ids, offsets = self._pieces_with_offsets(text, backend)
            except _Fallback as err:
                return str(err)
            if ids != encoding.ids:
                return f"tokenizing between markers changes token ids (probe {text[:40]!r}...)"
            if offsets != [tuple(o) for o in encoding.offsets]:
                return f"tokenizing between markers changes token offsets (probe {text[:40]!r}...)"
        return None

    def _pieces_with_offsets(self, text: str, backend=None) -> tuple[list[int], list[tuple[int, int]]]:
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        pos = 0
        for j, part in enumerate(self._split(text)):
            if not part:
                continue
            if j % 2:
                ids.append(self._marker_ids[part])
                offsets.append((pos, pos + len(part)))
            else:
                ids.extend(self._encode_pieces([part], after_marker=j > 0, backend=backend)[0])
                offsets.extend(self._piece_offsets(part, pos, backend))
            pos += len(part)
        return ids, offsets

    def _piece_offsets(self, part: str, pos: int, backend=None) -> list[tuple[int, int]]:
        """Token offsets of a text piece at `pos` as inside the whole text: encoded after a marker (its token
        dropped again), since ByteLevel's trim_offsets keeps the space of the first token only."""
        backend = backend or self._backend
        marker = self._context_marker if pos else ""  # "" too when the tokenizer has no added token
        encoding = backend.encode(marker + part, add_special_tokens=False)
        shift = pos - len(marker)
        return [(shift + s, shift + e) for s, e in encoding.offsets[1 if marker else 0 :]]

    def render(self, record, _lookups: dict | None = None) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and its generation spans, as the reference sees them. `_lookups`: the template
        and special tokens for one batch (transformers rebuilds both per access: a tenth of the time)."""
        messages, tools, kwargs = record_inputs(record)
        lookups = {} if _lookups is None else _lookups
        try:
            template = lookups.get(tools is None)
            if template is None:
                template = lookups[tools is None] = self.tokenizer.get_chat_template(None, tools)
            special = lookups.get("special")
            if special is None:
                special = lookups["special"] = self.tokenizer.special_tokens_map
            template_kwargs = {**special, **kwargs} if kwargs else special  # read, never written
            if all(isinstance(tool, Mapping) for tool in tools or ()):
                # The fastest renderer this template has first; it returns None for what it declines.
                if template not in _DIRECT_RENDERERS:
                    _DIRECT_RENDERERS[template] = direct_render.for_template(template)
                direct = _DIRECT_RENDERERS[template]
                result = direct(messages, tools, template_kwargs) if direct is not None else None
                if result is not None:
                    return result
                return jinja.render(template, messages, tools, template_kwargs)
            return jinja.tracked_render(template, messages, tools, template_kwargs)
        except RecordError:
            raise
        except Exception as err:
            raise _render_error(err) from err

    def encode(self, records: Iterable, max_length: int | None = None) -> list[dict[str, list[int]]]:
        """Encode many records to {"input_ids", "assistant_masks"}; a record the template rejects raises
        `RecordError` (`render_failed`, `message_index` when named, `line`: its position in `records`)."""
        records = list(records)
        lookups: dict = {}
        rendered = []
        for index, record in enumerate(records):
            try:
                rendered.append(self.render(record, lookups) if self.fast
                                else reference_encode(self.tokenizer, record, max_length))
            except RecordError as err:
                raise err.with_provenance(err.source, index) from err.__cause__
        if not self.fast:
            return rendered
        results = self._encode_rendered(rendered)
        for index in range(len(rendered)):
            if results[index] is None:  # spans the fast path does not handle: the reference, for this one
                results[index] = reference_encode(self.tokenizer, records[index])
        if max_length is not None:
            results = [self._truncate(r, max_length) for r in results]
        return results

    def _truncate(self, result: dict[str, list[int]], max_length: int) -> dict[str, list[int]]:
        if len(result["input_ids"]) <= max_length:
            return result
        left = self.tokenizer.truncation_side == "left"
        cut = slice(len(result["input_ids"]) - max_length, None) if left else slice(0, max_length)
        return {key: value[cut] for key, value in result.items()}

    def _encode_pieces(self, pieces: list[str], after_marker: bool, backend=None) -> list[list[int]]:
        """Token ids of text pieces as in the whole text: a piece after a marker is tokenized after a marker
        (its id dropped), for tokenizers that treat the start differently (docs/encoder.md#how-it-works)."""
        if self._tiktoken is not None:
            # No normalizer but NFC (per piece anyway) and no prefix space (tiktoken_backend checks): a piece
            # tokenizes the same at the start and after a marker.
            out = self._tiktoken.encode(pieces)
            rest = [k for k, ids in enumerate(out) if ids is None]
            if rest:
                backend = backend or self._backend
                encoded = backend.encode_batch([pieces[k] for k in rest], add_special_tokens=False)
                for k, encoding in zip(rest, encoded, strict=True):
                    out[k] = encoding.ids
            return out
        backend = backend or self._backend
        if not after_marker:
            return [e.ids for e in backend.encode_batch(pieces, add_special_tokens=False)]
        marker = self._context_marker
        marker_id = self._marker_ids[marker]
        encoded = [e.ids for e in backend.encode_batch([marker + p for p in pieces], add_special_tokens=False)]
        if not all(ids and ids[0] == marker_id for ids in encoded):
            raise _Fallback(f"{marker!r} did not tokenize as one leading token")
        return [ids[1:] for ids in encoded]

    def _encode_rendered(self, rendered: list[tuple[str, list[tuple[int, int]]]]) -> list[dict | None]:
        split = self._split
        cache = self._cache
        first_cache = self._first_cache
        plans = []
        missing: dict[str, None] = {}
        missing_first: dict[str, None] = {}
        for text, _ in rendered:
            parts = split(text)
            plans.append(parts)
            if parts[0] and parts[0] not in first_cache:
                missing_first[parts[0]] = None
            for part in parts[2::2]:
                if part and part not in cache:
                    missing[part] = None
        try:
            # Tuples: the cyclic GC stops traversing a tuple of ints after its first look, but walks every
            # cached list on each full collection (measured: ~15% of encoding time at 80k cached pieces).
            for target, wanted, after_marker in ((cache, missing, True), (first_cache, missing_first, False)):
                if wanted:
                    pieces = list(wanted)
                    target.update(zip(pieces, map(tuple, self._encode_pieces(pieces, after_marker)), strict=True))
        except _Fallback:
            return [None] * len(rendered)
        marker_lists = self._marker_lists
        results: list[dict | None] = []
        for (_, spans), parts in zip(rendered, plans, strict=True):
            if not _sorted_disjoint(spans):
                results.append(None)
                continue
            lists: list = [None] * len(parts)
            lists[0] = first_cache[parts[0]] if parts[0] else _EMPTY
            lists[1::2] = [marker_lists[m] for m in parts[1::2]]
            lists[2::2] = [cache[p] if p else _EMPTY for p in parts[2::2]]
            aligned = _aligned_result(parts, lists, spans)
            if aligned is not None:
                results.append(aligned)
                continue
            ids = list(chain.from_iterable(lists))
            mask: list[int] = []
            n_spans = len(spans)
            k = 0
            pos = 0
            for j, part in enumerate(parts):
                if not part:
                    continue
                end = pos + len(part)
                piece_ids = lists[j]
                while k < n_spans and spans[k][1] <= pos:
                    k += 1
                if k == n_spans or spans[k][0] >= end:
                    mask.extend([0] * len(piece_ids))
                elif spans[k][0] < pos and end < spans[k][1]:
                    mask.extend([1] * len(piece_ids))
                else:
                    # The piece touches a span boundary: apply the reference's per-token overlap rule.
                    offsets = [(pos, end)] if j % 2 else self._piece_offsets(part, pos)
                    mask.extend(_overlap_mask(offsets, spans, k))
                pos = end
            results.append({"input_ids": ids, "assistant_masks": mask})
        # Bounded by clearing: cheaper per piece than an LRU's bookkeeping, and the pieces worth keeping
        # (headers, system prompts, tool declarations) come back within a batch or two.
        for kept in (cache, first_cache):
            if len(kept) > self.cache_size:
                kept.clear()
        return results

    def __getstate__(self):
        # Workers of datasets.map get no cache (it refills) nor private backend (remade from _serialized).
        state = {**self.__dict__, "_cache": {}, "_first_cache": {}, "_private_backend": None}
        state.pop("_split", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        if self.fast:
            self._split = _splitter(self._marker_ids)


def _trie_regex(strings: Iterable[str]) -> str:
    """A regex matching any of `strings` (the longest where several match), nested by common prefix
    (docs/encoder.md); a terminal node's group is optional and greedy, so longer continuations go first."""
    trie: dict = {}
    for string in strings:
        node = trie
        for char in string:
            node = node.setdefault(char, {})
        node[""] = {}

    def emit(node: dict) -> str:
        branches = [re.escape(char) + emit(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return emit(trie)


def _splitter(contents: Mapping[str, int]):
    """`split(text)` -> [text, marker, text, marker, ..., text], cutting at every added token's content."""
    if not contents:
        return lambda text: [text]
    return re.compile(f"({_trie_regex(contents)})").split


# backend's hash -> (tiktoken piece encoder or None, why not); built in seconds, so also cached on disk.
_TIKTOKEN_PIECES: dict[str, tuple[Any, str | None]] = {}
# template source -> the direct renderer of the bundled Beam template, when it is that template.
_DIRECT_RENDERERS: dict[str, direct_render.BeamTemplateRenderer | None] = {}
_EMPTY: list[int] = []


def _aligned_result(parts: list[str], lists: list[list[int]], spans: list[tuple[int, int]]) -> dict | None:
    """Ids and mask of one split text whose spans start and end on markers (the overlap rule then trains the
    parts from each span's first marker through its last: one slice each), else None."""
    ids = list(chain.from_iterable(lists))
    mask = [0] * len(ids)
    if not spans:
        return {"input_ids": ids, "assistant_masks": mask}
    char_bounds = [0, *accumulate(map(len, parts))]
    token_bounds = [0, *accumulate(map(len, lists))]
    n_parts = len(parts)
    for start, end in spans:
        first = bisect_left(char_bounds, start)
        while first < n_parts and not parts[first]:
            first += 1
        stop = bisect_right(char_bounds, end) - 1
        while stop > 0 and not parts[stop - 1]:
            stop -= 1
        if (
            first >= n_parts
            or char_bounds[first] != start
            or char_bounds[stop] != end
            or not first % 2
            or not (stop - 1) % 2
            or stop <= first
        ):
            return None
        a, b = token_bounds[first], token_bounds[stop]
        mask[a:b] = [1] * (b - a)
    return {"input_ids": ids, "assistant_masks": mask}


def _sorted_disjoint(spans: list[tuple[int, int]]) -> bool:
    return all(a <= b for a, b in pairwise([0, *chain.from_iterable(spans)]))


def _overlap_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]], k: int) -> list[int]:
    """transformers' rule: a token is trained when it overlaps a span (spans sorted and disjoint)."""
    mask = []
    n_spans = len(spans)
    for start, end in offsets:
        while k < n_spans and start >= spans[k][1]:
            k += 1
        mask.append(1 if k < n_spans and end > spans[k][0] else 0)
    return mask


_ENCODERS: dict[int, tuple[Any, str, MaskedEncoder]] = {}


def get_encoder(tokenizer) -> MaskedEncoder:
    """One encoder per tokenizer (rebuilt when its vocabulary or chat template changes)."""
    template = json.dumps(tokenizer.chat_template, sort_keys=True)
    key = f"{len(tokenizer)}|{hash(template)}|{tokenizer.truncation_side}"
    entry = _ENCODERS.get(id(tokenizer))
    if entry is not None and entry[0] is tokenizer and entry[1] == key:
        return entry[2]
    encoder = MaskedEncoder(tokenizer)
    _ENCODERS[id(tokenizer)] = (tokenizer, key, encoder)
    return encoder


def encode_record(tokenizer, record, max_length: int | None = None) -> dict[str, list[int]]:
    """One Beam record -> {"input_ids", "assistant_masks"} as `apply_chat_template(..., truncation=True,
    max_length=max_length)` gives them; `RecordError` when the template rejects the record."""
    return get_encoder(tokenizer).encode([record], max_length)[0]
