"""Notebook 18's exercises: the file's own fixes pass; the typical wrong answers fail for their
reason, read from the server (a request that failed, a callback fired never or twice)."""

from __future__ import annotations

import pytest

from labkit.core.errors import LabkitError
from labkit.core.queries import query
from labkit.tools.exercises import incidents as ex

pytestmark = pytest.mark.server


def test_the_file_s_enqueue_passes_and_so_does_on_conflict_without_a_target(lab):
    assert ex.check_enqueue(lab, query("incidents.sql", "unique_enqueue_upsert").text).passed
    assert ex.check_enqueue(lab, "INSERT INTO job (unique_key) VALUES ('report:42') "
                                 "ON CONFLICT DO NOTHING").passed


def test_a_plain_insert_and_a_check_then_insert_fail_on_the_index(lab):
    plain = ex.check_enqueue(lab, ex.ENQUEUE_STARTER)
    assert not plain.passed and "23505" in str(plain) and "as it stands" in plain.hint
    checked = ex.check_enqueue(lab, """INSERT INTO job (unique_key)
        SELECT 'report:42' WHERE NOT EXISTS
          (SELECT 1 FROM job WHERE unique_key = 'report:42' AND status IN ('PENDING', 'RUNNING'))""")
    assert not checked.passed and "B: 23505" in str(checked)
    assert "instead of checking first" in checked.hint and "ON CONFLICT" not in checked.hint


def test_a_try_lock_and_an_upsert_that_requeues_pass_the_race_and_fail_the_later_scenes(lab):
    # a transaction-level try-lock keeps the second of two simultaneous requests out, but a
    # request after the first committed meets the index and fails
    try_lock = ex.check_enqueue(lab, "INSERT INTO job (unique_key) SELECT 'report:42' "
                                     "WHERE pg_try_advisory_xact_lock(42)")
    assert not try_lock.passed and "again, after the first request committed: the request failed: 23505" \
        in str(try_lock).replace("\n         ", " ")
    # DO UPDATE instead of DO NOTHING puts a running report back in the queue
    requeue = ex.check_enqueue(lab, "INSERT INTO job (unique_key) VALUES ('report:42') ON CONFLICT "
                                    "(unique_key) WHERE status IN ('PENDING', 'RUNNING') "
                                    "DO UPDATE SET status = 'PENDING'")
    assert not requeue.passed and "no longer RUNNING" in str(requeue)
    assert "leave the job that is there as it is" in requeue.hint
    # a try-lock that skips while another request holds the key: nothing is left when that
    # request rolls back
    skip = ex.check_enqueue(lab, "INSERT INTO job (unique_key) SELECT 'report:42' "
                                 "WHERE pg_try_advisory_xact_lock(hashtext('report:42')) "
                                 "ON CONFLICT (unique_key) WHERE status IN ('PENDING', 'RUNNING') DO NOTHING")
    assert not skip.passed and "at once, and A's request rolls back: live jobs with the key: 0" in str(skip)
    # bringing a finished report back instead of inserting: two in the history make two live
    revive = ex.check_enqueue(lab, """WITH back AS (
            UPDATE job SET status = 'PENDING' WHERE unique_key = 'report:42' AND status = 'DONE'
            RETURNING id)
        INSERT INTO job (unique_key) SELECT 'report:42' WHERE NOT EXISTS (SELECT 1 FROM back)
        ON CONFLICT (unique_key) WHERE status IN ('PENDING', 'RUNNING') DO NOTHING""")
    assert not revive.passed and "two DONE jobs" in str(revive)


def test_on_conflict_naming_a_column_without_the_index_predicate_is_an_error_the_check_shows(lab):
    got = ex.check_enqueue(lab, "INSERT INTO job (unique_key) VALUES ('report:42') "
                                "ON CONFLICT (unique_key) DO NOTHING")
    assert not got.passed and "42P10" in str(got) and "statement itself failed" in got.hint


def test_the_file_s_batch_counter_passes(lab):
    got = ex.check_batch_done(lab, query("incidents.sql", "batch_count_fixed").text)
    assert got.passed, str(got)
    assert "at once: the callback fired 1 time(s), by B" in str(got)
    assert "in turn (jobs 3, 1, 2): the callback fired 1 time(s), by the last to finish" in str(got)
    # the same statement with the worker's name formatted into text (a literal % written %%)
    assert ex.check_batch_done(lab, query("incidents.sql", "batch_count_fixed").text.replace(
        "SELECT 1, %(worker)s", "SELECT 1, format('%%s', %(worker)s)")).passed


def test_looking_inside_the_transaction_fires_never(lab):
    starter = ex.check_batch_done(lab, ex.BATCH_STARTER)
    assert not starter.passed and "at once: the callback fired 0 time(s); once, by B" in str(starter)
    reworded = ex.check_batch_done(lab, """INSERT INTO callback_log (batch_id, fired_by)
        SELECT 1, %(worker)s WHERE (SELECT count(*) FROM job WHERE batch_id = 1 AND status = 'DONE') = 2""")
    assert not reworded.passed and "before the other's DONE was committed" in reworded.hint


def test_firing_one_early_or_by_name_fails_the_three_in_turn(lab):
    counter = query("incidents.sql", "batch_count_fixed").text
    early = ex.check_batch_done(lab, counter.replace("WHERE remaining = 0", "WHERE remaining = 1"))
    assert not early.passed and "fired 1 time(s), by A" in str(early)
    assert "before the batch was done" in early.hint
    by_name = ex.check_batch_done(lab, "INSERT INTO callback_log (batch_id, fired_by) "
                                       "SELECT 1, %(worker)s WHERE %(worker)s = 'B'")
    assert not by_name.passed and "in turn (jobs 3, 1, 2): the callback fired 0 time(s)" in str(by_name)
    # "the job with the highest id is the last": right when jobs finish in id order only
    highest = ex.check_batch_done(lab, """INSERT INTO callback_log (batch_id, fired_by)
        SELECT 1, %(worker)s WHERE (SELECT status FROM job WHERE batch_id = 1
                                     ORDER BY id DESC LIMIT 1) = 'DONE'""")
    assert not highest.passed and "not only by the last to finish" in " ".join(str(highest).split())


def test_a_statement_that_deadlocks_the_two_workers_is_a_verdict_not_a_crash(lab):
    got = ex.check_batch_done(lab, """INSERT INTO callback_log (batch_id, fired_by)
        SELECT 1, %(worker)s WHERE NOT EXISTS
          (SELECT 1 FROM job WHERE batch_id = 1 AND status <> 'DONE' FOR UPDATE)""")
    assert not got.passed and "40P01" in str(got) and "deadlocked" in got.hint


def test_bad_input_is_refused_with_its_fix(lab):
    with pytest.raises(LabkitError, match="empty"):
        ex.check_enqueue(lab, "  ")
    with pytest.raises(LabkitError, match="one statement, not 2"):
        ex.check_batch_done(lab, "SELECT 1; SELECT 2")
    with pytest.raises(LabkitError, match="one statement, not 0"):
        ex.check_enqueue(lab, "-- nothing yet")
    with pytest.raises(LabkitError, match=r"%\(worker\)s"):
        ex.check_batch_done(lab, "SELECT %(job)s")
