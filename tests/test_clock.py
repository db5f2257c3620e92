"""core/clock.py: the lab's clock, one SQL definition that the drain and the retries share."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from labkit import LabkitError
from labkit.core.clock import T0, Clock
from labkit.labs import drain, retries

SQL = Path(__file__).resolve().parent.parent / "labkit" / "sql"
FROZEN = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)


def test_frozen_clock_moves_only_when_told(lab):
    clock = Clock.install(lab).freeze()
    assert clock.frozen and clock.now() == FROZEN and clock.rel(clock.now()) == "T+0 s"
    clock.advance(120)
    assert clock.now() == FROZEN + timedelta(seconds=120) and clock.elapsed() == 120
    assert clock.rel(FROZEN + timedelta(seconds=30)) == "T+30 s"
    with pytest.raises(LabkitError, match="cannot go back"):
        clock.advance(-1)


def test_the_real_clock_is_the_servers_and_installing_again_keeps_the_clock(lab):
    clock = Clock.install(lab).real()
    server_now = lab.execute("SELECT now()")[0][0]
    assert not clock.frozen and abs((clock.now() - server_now).total_seconds()) < 1
    assert clock.rel(server_now) == "T"
    clock.freeze(T0).advance(5)
    Clock.install(lab)                      # a second lab in the same schema: the clock stays
    assert clock.elapsed() == 5 and lab.execute("SELECT count(*) FROM lab_clock")[0][0] == 1


def test_lab_now_is_defined_once_and_both_labs_run_on_it(lab):
    defined = [p.name for p in SQL.glob("*.sql") if "FUNCTION lab_now()" in p.read_text()]
    assert defined == ["clock.sql"]
    assert drain.Clock is Clock and retries.Clock is Clock
    clock = drain.create_ledger(lab, 2)
    assert clock.now() == FROZEN
    clock = retries.install(lab, freeze_at="2026-03-02 10:00:00+00")
    assert clock.now() == FROZEN + timedelta(hours=1)
