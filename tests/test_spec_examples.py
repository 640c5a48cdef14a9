"""Every example of the format page, run verbatim against data/tokenizer, prints exactly what the page shows.

The page's examples are the python blocks inside its <Accordion>s; each is compared with the text block
that follows it. They run through the same runner as `beam-sft check-template` (beam_sft.template.conformance).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from beam_sft.template import conformance
from beam_sft.template.tokenizer import DEFAULT_TOKENIZER_DIR, TEMPLATES_DIR

REPO = Path(__file__).resolve().parents[1]
SPEC_COPY = REPO / "tests" / "data" / "spec" / "beam-harmony-format.md"
SHARED_SPEC = REPO.parent / "shared" / "spec" / "beam-harmony-format.md"
PAGE = conformance.load_spec(SPEC_COPY)

pytestmark = pytest.mark.skipif(
    not (TEMPLATES_DIR / "chat_template.jinja").is_file(), reason="beam_sft/template/ not written yet"
)


@pytest.fixture(scope="module")
def results() -> dict[str, conformance.RuleResult]:
    # Examples of one accordion share a namespace, in page order, so they run together once.
    return {r.name: r for r in conformance.run_page_examples(str(DEFAULT_TOKENIZER_DIR), PAGE)}


@pytest.mark.parametrize(
    "example", PAGE.examples, ids=[ex.name.removeprefix("page: ") for ex in PAGE.examples]
)
def test_page_example(example, results):
    result = results[example.name]
    assert result.actual == example.expected + "\n", f"{result.reason}\n{result.diff()}"


def test_spec_copies_are_identical():
    # The repo's copy and the package's copy of the page must not drift apart (nor from the shared one).
    assert conformance.SPEC_PATH.read_bytes() == SPEC_COPY.read_bytes()


@pytest.mark.skipif(not SHARED_SPEC.is_file(), reason="no ../shared/spec next to the repo")
def test_spec_copy_matches_shared_page():
    assert SPEC_COPY.read_bytes() == SHARED_SPEC.read_bytes()
