"""Notebook 18's exercises the server checks: two fixes from the incident file, written by the
learner and played in the incident's own scene (:func:`labkit.labs.incidents.run` with the
learner's SQL in place of the file's fix).

* :func:`check_enqueue` -- the unique enqueue.  The partial unique index is there; two requests
  enqueue the report at the same moment, each in a transaction of its own (A's insert, B's
  insert while A's transaction is open, A commits, B commits); then, each on a fresh table, the
  same with A rolling back, a request after the first committed, a request while the report's
  job is RUNNING, and one after it was built twice before (two DONE jobs).  It passes when no request fails, one live job with the key is left each
  time, and a RUNNING job stays RUNNING.  A plain insert leaves one job, but B's request
  fails on the index (23505); a check-then-insert in one statement does the same, because B's
  check reads what had committed when its statement began.
* :func:`check_batch_done` -- the batch's "all done".  The last two jobs of a batch finish at
  once: A and B each mark their job DONE and run the learner's statement in the same open
  transaction, then A commits, then B; then three jobs finish one after another, not in the
  order of their ids, by workers whose names are drawn afresh.  It passes when no step fails
  and the callback fired exactly once each time, by the worker that finished the batch.  "Is any job of the batch left?" asked inside the transaction fires it never:
  each worker sees the other's job still running, its DONE not yet committed.

Each checker reads the outcome from the server (the rows left, the errors the steps got), never
from the SQL's text.  The hints say what went wrong and where to look, not the statement.
"""

from __future__ import annotations

import secrets

import psycopg

from ...core.errors import LabkitError
from ...core.lab import Lab
from ...core.queries import statements
from ...core.sessions import Sessions
from ...core.steps import Step
from ...labs import incidents
from . import Check, Solo, bind, scratch, unchanged

ENQUEUE_STARTER = "INSERT INTO job (unique_key) VALUES ('report:42')"
BATCH_STARTER = """INSERT INTO callback_log (batch_id, fired_by)
SELECT 1, %(worker)s
 WHERE NOT EXISTS (SELECT 1 FROM job WHERE batch_id = 1 AND status <> 'DONE')"""

TRY = "change the statement and run the cell again."


def _errors(steps: list[Step]) -> list[str]:
    """``session: SQLSTATE message`` for each of ``steps`` that failed."""
    return [f"{s.session}: {s.error.sqlstate} {s.error.message}" for s in steps if s.error]


def _run_errors(run: incidents.IncidentRun) -> list[str]:
    return _errors(run.transcript.steps if run.transcript is not None else [])


def _brief(exc: psycopg.Error) -> str:
    """``SQLSTATE`` and the first line of the server's message."""
    return f"{exc.sqlstate} {str(exc).splitlines()[0]}"


def _one_statement(text: str) -> None:
    found = len(statements(text))
    if found != 1:
        raise LabkitError(f"The exercise takes one statement, not {found}.",
                          "write a single statement (comments alone are none; no ';' between two).")


def _alone(scene: Lab, text: str) -> str | None:
    """Run ``text`` in a session of its own (its own transaction); the error it got, if any."""
    with Solo(scene, role="request") as conn:
        try:
            conn.execute(text)
        except psycopg.Error as exc:
            return _brief(exc)
    return None


def _fresh(scene: Lab) -> None:
    scene.reset()
    scene.execute(incidents.q("unique_enqueue_scene"))
    scene.execute(incidents.q("unique_enqueue_index"))


def _enqueue_rolled_back(scene: Lab, text: str) -> tuple[bool, str]:
    """Two requests at once again, and A's rolls back (a later step of its request failed)
    while B's statement runs: B's enqueue must stand, one live job."""
    what = "at once, and A's request rolls back"
    _fresh(scene)
    with Sessions(scene, "A", "B") as run:
        for name in ("A", "B"):
            run.step(name, "BEGIN")
            run.step(name, text, label="your statement")
        incidents.settled(run, "A")
        run.A("ROLLBACK")
        incidents.settled(run, "B")
        run.B("COMMIT")
        failed = _errors(run.steps)
    live, _ = scene.execute(incidents.q("unique_enqueue_live"))[0]
    if failed:
        return False, f"{what}: a request failed: {failed[0]}"
    return live == 1, f"{what}: live jobs with the key: {live}" + ("" if live == 1 else ", not 1")


def _enqueue_later(scene: Lab, text: str) -> list[tuple[bool, str]]:
    """The enqueue's later scenes, each on a fresh table with the index: two at once with A
    rolling back; a request after the first one committed; a request while the report's job
    is RUNNING; a request after it was built twice (two DONE jobs).  One finding per scene."""
    found = [_enqueue_rolled_back(scene, text)]
    for what, before in (("again, after the first request committed", None),
                         ("while the report's job is RUNNING", "RUNNING"),
                         ("after the report was built twice before (two DONE jobs)", "DONE")):
        _fresh(scene)
        errors = []
        if before is None:
            errors.append(_alone(scene, text))
        else:
            for _ in range(1 if before == "RUNNING" else 2):
                scene.execute(incidents.q("unique_enqueue_existing"), {"status": before})
        errors.append(_alone(scene, text))
        live, running = scene.execute(incidents.q("unique_enqueue_live"))[0]
        failed = [e for e in errors if e]
        if failed:
            found.append((False, f"{what}: the request failed: {failed[0]}"))
        elif before == "RUNNING" and running != 1:
            found.append((False, f"{what}: the running job is no longer RUNNING (queued again)"))
        else:
            found.append((live == 1, f"{what}: live jobs with the key: {live}"
                                     + ("" if live == 1 else ", not 1")))
    return found


def check_enqueue(lab: Lab, sql_text: str) -> Check:
    """Check ``sql_text``, the enqueue of the report with key ``'report:42'`` (no parameters),
    played by two requests at once over the partial unique index, then in the later scenes of
    :func:`_enqueue_later` (this module's text)."""
    text = bind(lab, sql_text, {})
    _one_statement(text)
    check = Check("the unique enqueue: two requests at once, then one after another")
    scene = scratch(lab)
    try:
        r = incidents.run(scene, "unique-enqueue", fixed=True, using={"unique_enqueue_upsert": text})
        later = _enqueue_later(scene, text)
    finally:
        scene.drop()
    errors = _run_errors(r)
    live = r.observed.live_jobs_with_the_key
    check.add(not errors, "two requests at once: neither failed" if not errors else
              "two requests at once: a request failed: " + "; ".join(errors))
    check.add(live == 1, f"two requests at once: live jobs with the key: {live}"
                         + ("" if live == 1 else ", not 1"))
    for ok, line in later:
        check.add(ok, line)
    bad = " ".join(line for ok, line in [(not errors, ""), *later] if not ok)
    if unchanged(sql_text, ENQUEUE_STARTER):
        check.hint = f"That is the insert as it stands: {TRY}"
    elif any("23505" in e for e in errors) or "23505" in bad:
        check.hint = ("A request met the index and failed: the index keeps the rule, so the insert "
                      "has to say what a live duplicate means for it, instead of checking first.")
    elif "no longer RUNNING" in bad:
        check.hint = "A duplicate must leave the job that is there as it is, whatever state it is in."
    elif errors or "failed" in bad:
        check.hint = "Read the error above: the statement itself failed, not the race."
    elif not check.passed:
        check.hint = "Count what each request inserted: one live job, and a new one once it is DONE."
    return check


IN_TURN = (3, 1, 2)      # the order the three jobs finish in, one after another


def _batch_in_turn(scene: Lab, text: str) -> tuple[int, bool, str | None]:
    """The batch's second scene: three jobs finished one after another, in the order
    :data:`IN_TURN` (not their ids' order), each by a worker of a name drawn afresh (so no
    statement can know it), in a transaction of its own (mark DONE, the statement, COMMIT);
    how often the callback fired, whether only by the last, and an error."""
    scene.reset()
    scene.execute(incidents.q("batch_scene_three"))
    names = [f"w{secrets.token_hex(3)}" for _ in IN_TURN]
    with Solo(scene, role="worker") as conn:
        for job, worker in zip(IN_TURN, names):
            try:
                with conn.transaction():
                    conn.execute(incidents.q("batch_finish"), {"job": job})
                    conn.execute(bind(scene, text, {"worker": worker}))
            except psycopg.Error as exc:
                return 0, False, f"job {job}'s worker: {_brief(exc)}"
    fired = [r[0] for r in scene.execute("SELECT fired_by FROM callback_log")]
    return len(fired), fired == [names[-1]], None


def check_batch_done(lab: Lab, sql_text: str) -> Check:
    """Check ``sql_text``, the statement each worker runs in its job's transaction after marking
    the job DONE, taking ``%(worker)s``, that must fire the batch's callback exactly once, by
    the worker that finished the batch (this module's text)."""
    bind(lab, sql_text, {"worker": "A"})
    _one_statement(sql_text)
    check = Check("the batch's callback: two jobs finishing at once, then three in turn")
    scene = scratch(lab)
    try:
        r = incidents.run(scene, "batch-callback", fixed=True, using={"batch_count_fixed": sql_text})
        in_turn, by_last, turn_error = _batch_in_turn(scene, sql_text)
    finally:
        scene.drop()
    errors = _run_errors(r)
    fired = r.observed.fired_by
    check.add(not errors, "at once: no step failed" if not errors else
              "at once: a step failed: " + "; ".join(errors))
    check.add(fired == ["B"], f"at once: the callback fired {len(fired)} time(s)"
                              + (f", by {', '.join(fired)}" if fired else "")
                              + ("" if fired == ["B"] else "; once, by B, who finished the batch"))
    if turn_error:
        check.add(False, f"in turn: a step failed: {turn_error}")
    else:
        order = ", ".join(map(str, IN_TURN))
        check.add(in_turn == 1 and by_last,
                  f"in turn (jobs {order}): the callback fired {in_turn} time(s)"
                  + ("" if not in_turn else ", by the last to finish" if by_last and in_turn == 1
                     else ", not only by the last to finish")
                  + ("" if in_turn == 1 and by_last else "; once, by the last"))
    if unchanged(sql_text, BATCH_STARTER):
        check.hint = f"That is the check as it stands: {TRY}"
    elif errors or turn_error:
        check.hint = "Read the error above: the statement itself failed, or two workers deadlocked."
    elif not fired:
        check.hint = ("Each worker looked before the other's DONE was committed, so each saw a job "
                      "still running. What could make the second worker wait for the first, and "
                      "then see what it did?")
    elif len(fired) > 1 or in_turn > 1:
        check.hint = "More than one worker decided the batch was done: what do they look at, and when?"
    elif not check.passed:
        check.hint = ("The callback fired before the batch was done: it must fire for the job that "
                      "leaves no other job unfinished.")
    return check
