"""Every benchmark still runs: each one in smoke mode (tiny sizes) must produce well-formed
figures with a budget. Budgets are not asserted here (figures at smoke sizes mean nothing,
and CI machines vary); `python -m bench` checks them and writes bench/RESULTS.md."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest

from bench.__main__ import BENCHMARKS, ORDER, main
from bench.common import BenchResult, Figure, quantile, render_report


@pytest.mark.parametrize("name", ORDER)
def test_benchmark_smoke(name: str) -> None:
    module = importlib.import_module(f"bench.{name}")
    result = module.run(smoke=True)
    assert isinstance(result, BenchResult)
    assert result.name == name
    result.check()  # samples finite and non-empty, at least one budget
    for fig in result.figures:
        assert fig.minimum <= fig.median <= fig.maximum
        assert fig.q1 <= fig.q3
        assert fig.key.startswith(_prefix(name))
        if fig.budget is not None:
            assert fig.passed in (True, False)


def _prefix(name: str) -> str:
    return {"launch": "launcher."}.get(name, f"{name}.")


def test_every_benchmark_is_listed() -> None:
    here = Path(__file__).resolve().parent.parent / "bench"
    modules = {p.stem for p in here.glob("*.py")} & set(BENCHMARKS)
    assert set(ORDER) == set(BENCHMARKS) == modules


def test_figure_statistics_and_budget() -> None:
    fig = Figure("x.y", "a figure", "ms", [5.0, 1.0, 3.0, 2.0, 4.0], budget=3.0)
    assert (fig.median, fig.minimum, fig.maximum, fig.q1, fig.q3) == (3.0, 1.0, 5.0, 2.0, 4.0)
    assert fig.passed is True
    fig.budget = 2.9
    assert fig.passed is False
    higher = Figure("x.z", "rate", "events/s", [10.0, 30.0], budget=25.0, better="higher")
    assert higher.passed is False  # median 20
    p99 = Figure("x.p", "latency", "ms", [float(i) for i in range(1, 101)], budget=99.5,
                 per="press", stat="p99")
    assert math.isclose(p99.value, quantile(p99.samples, 0.99))
    assert p99.passed is True
    with pytest.raises(ValueError):
        Figure("x.bad", "bad", "ms", [float("nan")]).check()
    with pytest.raises(ValueError):
        Figure("x.empty", "empty", "ms", []).check()


def test_report_names_machine_budgets_and_failures() -> None:
    ok = Figure("a.ok", "fast thing", "ms", [1.0, 2.0, 3.0], budget=5.0)
    bad = Figure("a.bad", "slow thing", "ms", [9.0, 10.0, 11.0], budget=5.0)
    ctx = Figure("a.ctx", "baseline", "ms", [1.0])
    text = render_report([BenchResult("a", "A bench", [ok, bad, ctx], ["a note"])],
                         {"cpu": "Test CPU", "cores": "2"}, command="python -m bench",
                         smoke=False)
    assert "Test CPU" in text and "cores: 2" in text
    assert "| A bench | fast thing | 2.00 ms |" in text
    assert "**pass**" in text and "**FAIL**" in text and "(context)" in text
    assert "Budgets missed: A bench: slow thing." in text
    assert "a note" in text


def test_command_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    code = main(["--smoke", "parser", "--out", str(out)])
    assert code in (0, 1)  # 1 only if the smoke-size ratio misses the budget
    text = out.read_text()
    assert "# fleet-tui benchmarks" in text and "Smoke mode" in text
    assert "stream.py ÷ json.loads" in text
    assert "- python: CPython" in text and "- textual: " in text
    assert out.with_suffix(".json").exists()


def test_unknown_benchmark_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["nosuchbench"])
    assert exc.value.code == 2
    assert "unknown benchmark nosuchbench" in capsys.readouterr().err
