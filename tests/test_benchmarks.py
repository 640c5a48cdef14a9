"""The one benchmarks entry (`python -m benchmarks`): every benchmark answers `--help` through it, a run's
row lands in the results file, and docs/performance.md is exactly what `report` makes of that file."""

from __future__ import annotations

import json

import pytest

from benchmarks import report
from benchmarks.__main__ import main
from benchmarks.registry import BENCHMARKS, PAGE, RESULTS


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_every_benchmark_explains_itself_through_the_entry(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--no-record", name, "--help"])
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_a_run_appends_its_row_and_the_report_shows_the_latest(tmp_path):
    results = tmp_path / "results.jsonl"
    assert main(["--results", str(results), "convert", "--records", "300"]) == 0
    assert main(["--results", str(results), "convert", "--records", "200"]) == 0
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["figures"]["records"] for r in rows] == [300, 200]
    assert rows[1]["args"] == ["--records", "200"] and rows[1]["exit"] == 0
    page = report.render(results)
    assert "`python -m benchmarks convert --records 200`" in page and "--records 300" not in page
    assert "| `records` | 200 |" in page
    assert "No row yet: `python -m benchmarks gpu`" in page


def test_performance_page_is_generated_from_the_results_file():
    assert PAGE.read_text(encoding="utf-8") == report.render(RESULTS), (
        "docs/performance.md is stale: run `python -m benchmarks report`")
