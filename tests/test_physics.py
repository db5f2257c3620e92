"""The physics of a queue run (labkit.tools.physics) and the benchmark's physics figure: the
counters read from a real server, the flush timed on a real disk, and what bounds a point."""

from __future__ import annotations

import pytest

from labkit.tools import bench, physics


def _commits(lab, n: int, synchronous_commit: str) -> tuple[physics.Counters, physics.Counters, int]:
    """``n`` one-row commits on a session of their own; the counters around them and the WAL
    bytes they wrote.  (A table of the lab's, not a temporary one: a transaction that wrote
    only to temporary tables has no WAL of its own to flush at commit.)"""
    lab.execute("CREATE TABLE IF NOT EXISTS t (n int)")
    with lab.db.connect() as watch, lab.connect() as conn:
        conn.execute(f"SET synchronous_commit = {synchronous_commit}")
        conn.execute("SELECT pg_stat_force_next_flush()")
        before = physics.settled_counters(watch)
        for i in range(n):
            conn.execute("INSERT INTO t VALUES (%s)", (i,))
        conn.execute("SELECT pg_stat_force_next_flush()")
        after = physics.settled_counters(watch)
        return before, after, physics.wal_bytes(watch, before, after)


def test_durable_commits_sync_the_wal_and_asynchronous_ones_leave_it_to_the_writer(lab):
    before, after, wal = _commits(lab, 60, "on")
    # every durable commit of one session waits for its own flush (nobody shares it)
    assert after.wal_syncs - before.wal_syncs >= 60
    assert after.wal_records - before.wal_records >= 60 and wal > 60 * 50
    before, after, wal = _commits(lab, 60, "off")
    assert after.wal_syncs - before.wal_syncs < 30         # the WAL writer syncs now and then
    assert wal > 60 * 50


def test_the_flush_is_timed_on_the_folders_disk(tmp_path):
    flush = physics.flush_time(tmp_path, seconds=0.1)
    assert flush.flushes >= 5 and flush.flush_ms > 0 and flush.method in ("fdatasync", "fsync")
    assert flush.durable_commits_per_s_one_session == pytest.approx(1000 / flush.flush_ms, rel=0.01)
    assert list(tmp_path.iterdir()) == []               # its file is removed


def _physics(**kw) -> physics.Physics:
    base = dict(jobs=1000, commits=1000, wal_bytes_per_job=300.0, wal_records_per_job=4.0,
                commits_per_job=1.0, wal_writes_per_job=1.0, wal_syncs_per_job=1.0,
                buffers_hit_per_job=20.0, buffers_read_per_job=0.0,
                top_wait_events=[{"what": "IO:WalSync", "share": 0.8}],
                wait_shares={"flush": 0.8, "cpu": 0.1, "client": 0.1, "lock": 0.0, "other": 0.0}, looks=100,
                client_cpu_us_per_job=20.0, server_cpu_us_per_job=100.0)
    return physics.Physics(**(base | kw))


def test_the_looks_are_sorted_by_kind_and_a_point_is_named_by_the_kind_seen_most():
    from collections import Counter

    seen = Counter({"LWLock:WALWrite": 30, "IO:WalSync": 20, "CPU": 25, "idle: waiting for the client": 15,
                    "Lock:transactionid": 5, "LWLock:BufferContent": 5})
    assert physics.shares(seen) == {"flush": 0.5, "cpu": 0.25, "client": 0.15, "lock": 0.1, "other": 0.0}
    assert physics.top(seen, 2) == [{"what": "LWLock:WALWrite", "share": 0.3}, {"what": "CPU", "share": 0.25}]
    got = physics.bound(jobs_per_s=1000, physics=_physics(), cpus=2)
    # 120 µs of CPU per job at 1,000 jobs/s on 2 CPUs: 6 % of the machine
    assert got == {"bound": "flush", "shares": _physics().wait_shares, "cpu_busy": 0.06,
                   "top_wait_event": "IO:WalSync"}
    idle = _physics(wait_shares={"flush": 0.1, "cpu": 0.2, "client": 0.6, "lock": 0.1, "other": 0.0})
    assert physics.bound(jobs_per_s=500, physics=idle, cpus=2)["bound"] == "round trips"
    # where the server's CPU cannot be read, the machine's share is not given
    assert physics.bound(jobs_per_s=500, physics=_physics(server_cpu_us_per_job=None), cpus=2)["cpu_busy"] is None


def test_the_benchmark_reports_the_physics_of_each_batch_and_the_ceiling(lab):
    s = bench.Settings.quick_settings(seconds=0.5, batches=(1, 10), clients=2)
    out = bench.run(lab, s, figures=("physics",))
    assert set(out["physics"]) == {"1", "10"}
    for batch, p in out["physics"].items():
        assert {"wal_bytes_per_job", "commits_per_job", "wal_syncs_per_job", "top_wait_events",
                "client_cpu_us_per_job", "server_cpu_us_per_job"} <= set(p)
        # the queue never ran dry: every call claimed a whole batch, one commit each
        assert p["commits_per_job"] == pytest.approx(1 / int(batch), rel=0.02)
        assert p["wal_bytes_per_job"] > 0 and p["wal_syncs_per_job"] > 0
        assert 0 < sum(w["share"] for w in p["top_wait_events"]) <= 1 and p["looks"] > 0
        assert sum(p["wait_shares"].values()) == pytest.approx(1, abs=0.01)
    c = out["ceiling"]
    assert c["flush_ms"] > 0 and c["durable_commits_per_s_one_session"] > 0
    assert set(c["bound"]) == {"1", "10"}
    assert all(b["bound"] in ("flush", "cpu", "lock", "round trips", "other") for b in c["bound"].values())
    # the job table's autovacuum is as it was before the figure
    assert lab.execute("SELECT reloptions FROM pg_class WHERE oid = 'job'::regclass")[0][0] is None
    # a bigger batch spreads the commit, and so the sync, over more jobs
    assert out["physics"]["10"]["wal_syncs_per_job"] < out["physics"]["1"]["wal_syncs_per_job"]
    table = bench.table(out)
    assert "physics, batch 1" in table and "durable commits/s, one session" in table


def test_the_published_figures_each_name_their_source_and_are_divided_by_their_own_cores():
    entries = bench.published()
    assert len(entries) >= 5 and len({e["id"] for e in entries}) == len(entries)
    for e in entries:
        assert e["source"] and e["system"] and e["figure"] > 0, e["id"]
        if e["cores"]:
            assert e["per_core"] == pytest.approx(e["figure"] / e["cores"], rel=0.01), e["id"]
        else:
            assert e["per_core"] is None, e["id"]          # no core count guessed
    mine = {"machine": {"cpus": 2}, "settings": {"peer_batch": 10},
            "ceiling": {"claim_jobs_per_s_durable": {"1": 6000.0, "10": 40000.0}},
            "durability": {"commits_durable": True}, "peer": {"labkit": {"jobs_per_s": 3000.0}}}
    theirs, ours = bench.per_core_table(mine)
    assert len(theirs) == len(entries) and list(ours["per core"]) == [3000, 20000, 1500]
    assert ours["what"].iloc[-1] == "labkit's drain, claim + finish, batch 10"
    ranked = theirs["per core"].dropna().tolist()
    assert ranked == sorted(ranked, reverse=True)


def test_pg_test_fsync_times_the_same_flush_as_the_benchmark(tmp_path):
    from labkit.core.server import bin_dir

    methods = physics.pg_test_fsync(bin_dir() / "pg_test_fsync", tmp_path, seconds=1)
    assert "fdatasync" in methods and "fsync" in methods
    assert all(ms > 0 for ms in methods.values())
    assert list(tmp_path.iterdir()) == []               # its file is removed


def test_sessions_committing_at_once_share_the_flush(lab):
    with lab.db.connect() as watch:
        got = physics.group_commit(lambda: lab.connect(), watch, sessions=(1, 4), seconds=0.3)
    one, four = got.points[0], got.points[1]
    assert (one["sessions"], four["sessions"]) == (1, 4)
    assert one["syncs_per_commit"] >= 0.9           # alone, every durable commit flushes for itself
    assert four["syncs_per_commit"] < one["syncs_per_commit"]
    assert got.commit_delay_measured == (len(got.points) == 3)   # the embedded server's role may set it
