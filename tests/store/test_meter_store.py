"""The gateway's records in the real SQLite store: tokens (only hashes kept) and the meter."""

from __future__ import annotations

from pathlib import Path

from fleet_tui.store.db import Store
from fleet_tui.store.meter import TOKEN_PREFIX, Meter, Usage


def test_a_token_is_kept_only_as_its_hash_and_stops_working_when_revoked(
        tmp_path: Path) -> None:
    with Store(tmp_path / "fleet.db") as store:
        meter = Meter(store)
        token = meter.mint("t1", None, "zai", now=100.0)
        assert token.startswith(TOKEN_PREFIX) and len(token) > 40
        meter.bind(token, 7)
        info = meter.check(token)
        assert info is not None and info.valid and info.attempt_id == 7
        assert info.task_id == "t1" and info.endpoint == "zai"
        assert meter.check(token + "x") is None and meter.check("sk-other") is None
        assert meter.revoke(attempt_ids=[7]) == 1
        revoked = meter.check(token)
        assert revoked is not None and not revoked.valid
        assert meter.revoke(attempt_ids=[7]) == 0
    raw = (tmp_path / "fleet.db").read_bytes()
    for name in ("fleet.db-wal",):
        if (tmp_path / name).exists():
            raw += (tmp_path / name).read_bytes()
    assert token.encode() not in raw


def test_the_meter_sums_per_task_and_counts_unpriced_requests(tmp_path: Path) -> None:
    with Store(tmp_path / "fleet.db") as store:
        meter = Meter(store)
        meter.record(Usage(10.0, "a", 1, "zai", "GLM-5.2", 200, 1000, 200, 300, 50, 0.002))
        meter.record(Usage(20.0, "a", 1, "zai", "GLM-5.2", 200, 10, 20, 0, 0, 0.001))
        meter.record(Usage(30.0, "b", 2, "other", "mystery", 200, 5, 5, 0, 0, None))
        totals = meter.by_task()
        assert totals["a"].requests == 2 and totals["a"].input_tokens == 1010
        assert abs(totals["a"].cost - 0.003) < 1e-12 and totals["a"].unpriced == 0
        assert totals["b"].unpriced == 1 and totals["b"].cost == 0.0
        assert abs(meter.spent(endpoint="zai") - 0.003) < 1e-12
        assert meter.spent(endpoint="zai", since=15.0) == 0.001
        assert [r.task_id for r in meter.rows(since=15.0)] == ["a", "b"]
        assert meter.rows(task_ids=[]) == []
