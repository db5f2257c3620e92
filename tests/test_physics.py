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
                client_cpu_us_per_job=20.0, server_cpu_us_per_job=100.0)
    return physics.Physics(**(base | kw))


def test_a_point_is_bound_by_what_is_busy():
    # 1,000 syncs/s of 1 ms: the disk syncs the whole time
    assert physics.bound(jobs_per_s=1000, physics=_physics(), flush_ms=1.0, cpus=2)["bound"] == "flush"
    # group commit: a tenth of a sync per job, and 120 µs of CPU per job at 15,000 jobs/s on 2 CPUs
    shared = _physics(wal_syncs_per_job=0.1, top_wait_events=[{"what": "CPU", "share": 0.7}])
    got = physics.bound(jobs_per_s=15_000, physics=shared, flush_ms=0.1, cpus=2)
    assert got == {"bound": "cpu", "disk_busy": 0.15, "cpu_busy": 0.9, "top_wait_event": "CPU"}
    locked = _physics(wal_syncs_per_job=0.01, top_wait_events=[{"what": "Lock:transactionid", "share": 0.5}])
    assert physics.bound(jobs_per_s=500, physics=locked, flush_ms=0.1, cpus=2)["bound"] == "lock"
    idle = _physics(wal_syncs_per_job=0.01, top_wait_events=[{"what": "idle: waiting for the client", "share": 0.9}])
    assert physics.bound(jobs_per_s=500, physics=idle, flush_ms=0.1, cpus=2)["bound"] == "round trips"
    # where the server's CPU cannot be read, CPU is not judged
    assert physics.bound(jobs_per_s=15_000, physics=_physics(server_cpu_us_per_job=None, wal_syncs_per_job=0.0),
                         flush_ms=0.1, cpus=2)["cpu_busy"] is None


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
        assert 0 < sum(w["share"] for w in p["top_wait_events"]) <= 1
    c = out["ceiling"]
    assert c["flush_ms"] > 0 and c["durable_commits_per_s_one_session"] > 0
    assert set(c["bound"]) == {"1", "10"}
    assert all(b["bound"] in ("flush", "cpu", "lock", "round trips") for b in c["bound"].values())
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
    mine = {"machine": {"cpus": 2}, "ceiling": {"claim_jobs_per_s_durable": {"1": 6000.0, "10": 40000.0}}}
    table = bench.per_core_table(mine)
    ours = table[table["source"] == "this run"]
    assert list(ours["per core"].sort_values()) == [3000, 20000] and len(table) == len(entries) + 2
    ranked = table["per core"].dropna().tolist()
    assert ranked == sorted(ranked, reverse=True)


def test_sessions_committing_at_once_share_the_flush(lab):
    with lab.db.connect() as watch:
        got = physics.group_commit(lambda: lab.connect(), watch, sessions=(1, 4), seconds=0.3)
    one, four = got.points[0], got.points[1]
    assert (one["sessions"], four["sessions"]) == (1, 4)
    assert one["syncs_per_commit"] >= 0.9           # alone, every durable commit flushes for itself
    assert four["syncs_per_commit"] < one["syncs_per_commit"]
    assert got.commit_delay_measured == (len(got.points) == 3)   # the embedded server's role may set it


def test_pg_test_fsync_times_the_same_flush_as_the_benchmark(tmp_path):
    from labkit.core.server import bin_dir

    methods = physics.pg_test_fsync(bin_dir() / "pg_test_fsync", tmp_path, seconds=1)
    assert "fdatasync" in methods and "fsync" in methods
    assert all(ms > 0 for ms in methods.values())
    assert list(tmp_path.iterdir()) == []               # its file is removed
