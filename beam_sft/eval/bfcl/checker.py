"""BFCL v4's data and checker, imported without BFCL's model handlers (docs/evaluation.md#bfcl-v4)."""

from __future__ import annotations

import difflib
import functools
import os
import random
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from beam_sft.errors import UsageError

BFCL_SPEC = "bfcl-eval==2026.3.23"
# As docs/evaluation.md#bfcl-v4 gives it (a test compares the two): the extra with its packages, then bfcl-eval
# alone, since `--no-deps` on the extra would skip the packages BFCL's checker imports.
INSTALL_COMMAND = f"pip install -e '.[bfcl]' && pip install --no-deps '{BFCL_SPEC}'"
INSTALL_HINT = (f"BFCL's checker is not installed: run `make install` in the beam-sft checkout, or {INSTALL_COMMAND} "
                "(bfcl-eval's own pins clash with beam-sft's: docs/evaluation.md#bfcl-v4)")

# The single-turn AST and relevance categories (`--bfcl all`), in BFCL's order (others need its backends).
NON_LIVE_AST = ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple")
LIVE_AST = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
RELEVANCE = ("irrelevance", "live_irrelevance", "live_relevance")
CATEGORIES = (*NON_LIVE_AST, "irrelevance", *LIVE_AST, "live_irrelevance", "live_relevance")
NO_CALL = ("irrelevance", "live_irrelevance")  # right answer: no call (live_relevance: at least one)


def expects_no_call(category: str) -> bool:
    return category in NO_CALL


# The model names beam-sft gives BFCL's runners, by style: only "beam" sends names with dots as underscores.
MODEL_NAMES = {"beam": "beam-sft-fc", "prompt": "beam-sft-prompt", "json": "beam-sft-json"}


class _AnyModel(dict):
    """BFCL's MODEL_CONFIG_MAPPING for beam-sft's model names (`MODEL_NAMES`)."""

    def __missing__(self, key: str):
        return types.SimpleNamespace(underscore_to_dot=key == MODEL_NAMES["beam"], is_fc_model=True,
                                     display_name=key)


@functools.cache
def bfcl() -> types.SimpleNamespace:
    """BFCL's modules, imported once without its model handlers; UsageError with the install line when absent."""
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path.home() / ".cache" / "beam_sft" / "bfcl"))
    stand_in = types.ModuleType("bfcl_eval.constants.model_config")
    stand_in.MODEL_CONFIG_MAPPING = _AnyModel()
    previous = sys.modules.setdefault("bfcl_eval.constants.model_config", stand_in)
    if previous is not stand_in and not isinstance(getattr(previous, "MODEL_CONFIG_MAPPING", None), _AnyModel):
        raise UsageError("bfcl_eval's model handlers are already imported in this process; run `beam-sft eval --bfcl` "
                         "in a process of its own")
    try:
        from bfcl_eval import utils
        from bfcl_eval.constants import enums, type_mappings
        from bfcl_eval.eval_checker import eval_runner, eval_runner_helper
        from bfcl_eval.model_handler import utils as handler_utils
    except ImportError as err:
        sys.modules.pop("bfcl_eval.constants.model_config", None)
        raise UsageError(f"{INSTALL_HINT} ({err})") from err
    return types.SimpleNamespace(enums=enums, type_mappings=type_mappings, runner=eval_runner,
                                 helper=eval_runner_helper, handler_utils=handler_utils, utils=utils)


def parse_categories(spec: str) -> list[str]:
    """`--bfcl` as categories: a comma list, `all` for every category of CATEGORIES."""
    if not (names := [s.strip() for s in spec.split(",") if s.strip()]):
        raise UsageError("--bfcl needs at least one category (or all)")
    out: list[str] = []
    for name in names:
        for category in (CATEGORIES if name == "all" else (name,)):
            if category not in CATEGORIES:
                near = difflib.get_close_matches(category, CATEGORIES, n=1)
                raise UsageError(f"unknown BFCL category {category!r}"
                                 f"{f' (did you mean {near[0]!r}?)' if near else ''}; choose from all, "
                                 f"{', '.join(CATEGORIES)}")
            if category not in out:
                out.append(category)
    return out


def language(category: str) -> str:
    return "java" if category.endswith("java") else "javascript" if category.endswith("javascript") else "python"


@dataclass
class Entry:
    """One BFCL entry: functions as BFCL generates (language hints in) and checks (no hints) with them."""

    id: str
    category: str
    question: list[dict[str, Any]]
    functions: list[dict[str, Any]]
    check_functions: list[dict[str, Any]]
    answer: list[dict[str, Any]] | None


def subset(n: int, k: int | None, seed: int, category: str) -> list[int]:
    """Which `k` of `n` entries to run: the same ones every run for a seed and category, in BFCL's order."""
    if k is None or k >= n:
        return list(range(n))
    return sorted(random.Random(f"bfcl:{seed}:{category}").sample(range(n), k))


def load_entries(category: str, max_records: int | None = None, seed: int = 0) -> list[Entry]:
    """A category's entries through BFCL's own loaders (a few hundred to a thousand small entries a category)."""
    b = bfcl()
    hinted = b.utils.load_dataset_entry(category, include_prereq=False, include_language_specific_hint=True)
    plain = b.utils.load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)
    answers = None if category in RELEVANCE else b.utils.load_ground_truth_entry(category)
    by_id = {a["id"]: a["ground_truth"] for a in answers} if answers is not None else {}
    out = []
    for k in subset(len(hinted), max_records, seed, category):
        entry, check = hinted[k], plain[k]
        if answers is not None and entry["id"] not in by_id:
            raise UsageError(f"BFCL {category}: entry {entry['id']} has no possible answer (a broken bfcl-eval?)")
        question = entry["question"][0] if entry["question"] else []
        out.append(Entry(entry["id"], category, question, entry["function"], check["function"],
                         by_id.get(entry["id"])))
    return out


class _Decoded:
    """The handler BFCL's runners call `decode_ast` on: it hands back what beam-sft decoded, or raises."""

    def __init__(self, decoded: list[dict[str, Any]] | None, error: str):
        self.decoded, self.error = decoded, error

    def decode_ast(self, result, language=None, has_tool_call_tag=False):
        if self.decoded is None:
            raise ValueError(self.error or "no function call")
        return self.decoded


def check(entry: Entry, decoded: list[dict[str, Any]] | None, error: str = "", raw: Any = "",
          style: str = "beam") -> dict[str, Any]:
    """BFCL's verdict on one entry: `{"valid": bool}`, plus "error" and "error_type" when not valid."""
    b = bfcl()
    handler, model = _Decoded(decoded, error), MODEL_NAMES[style]
    if entry.category in RELEVANCE:
        verdict = b.runner._evaluate_single_relevance_entry(handler, entry.id, raw, {"function": entry.check_functions},
                                                            model, entry.category)
    else:
        lang = language(entry.category)
        verdict = b.runner._evaluate_single_ast_entry(
            handler, entry.id, raw, entry.answer, {"function": entry.check_functions}, model, entry.category,
            b.enums.Language(lang), b.enums.ReturnFormat(lang))
    out = {"valid": bool(verdict["valid"])}
    if not out["valid"]:
        out["error"] = [str(e) for e in verdict.get("error") or []]
        out["error_type"] = verdict.get("error_type", "")
    return out


def summary(scores: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """BFCL's summary columns over the categories that ran, by its arithmetic; None for a column with none."""
    h = bfcl().helper

    def acc(names: Sequence[str]) -> list[dict]:
        return [{"accuracy": scores[c]["accuracy"], "total_count": scores[c]["n"], "display_accuracy": 0}
                for c in names if c in scores and scores[c]["n"]]

    def mean(parts: list[dict], weighted: bool = False) -> float | None:
        if not parts:
            return None
        fn = h.calculate_weighted_accuracy if weighted else h.calculate_unweighted_accuracy
        return fn(parts)["accuracy"]

    simple = acc(NON_LIVE_AST[:3])
    non_live = ([{"accuracy": mean(simple), "total_count": sum(p["total_count"] for p in simple),
                  "display_accuracy": 0}] if simple else []) + acc(NON_LIVE_AST[3:])
    return {"non_live_ast": mean(non_live), "live_ast": mean(acc(LIVE_AST), weighted=True),
            "irrelevance": mean(acc(NO_CALL)), "relevance": mean(acc(("live_relevance",)))}
