"""Notebook 19's exercises the server checks, each on the lab's own throw-away servers
(:class:`labkit.core.replica.ReplicaPair`), with the learner's SQL in the place of the lab's.

* :func:`check_restart_claim` -- a claim that a restart cannot hand to a second worker.  Worker
  w1 claims with the learner's statement; the server restarts (an immediate shutdown); w2
  claims with it on a new session.  It passes when w1 got a job, w2 did not get w1's job, and
  once w1's lease has run out (scripted: the checker sets ``lease_until`` in the past, it does
  not wait) w3 gets it, while w2 is still connected (so whatever w2 holds, it still holds).
  The advisory claim fails: its lock went with w1's session.
* :func:`check_fenced_write` -- a fenced completion that survives a failover.  An asynchronous
  failover (the standby cut off, arranged) hands job 1's version 2 to B on the old primary and
  again to C on the new one; then zombie A (version 1, epoch 1), zombie B (version 2, epoch 1)
  and C (version 2, epoch 2) each run the learner's statement on the new primary.  It passes
  when A's and B's change nothing and C's completes the job.  The version alone lets B through.

Each checker reads what happened from the server (the rows the statements returned or changed),
never from the SQL's text.
"""

from __future__ import annotations

import time

import psycopg

from ...core.errors import LabkitError
from ...core.queries import statements
from ...core.replica import Node, ReplicaPair
from ...labs import failover
from . import Check, fill_in, unchanged


def _starter(name: str) -> str:
    """A starting point as the notebook shows it: the query without its comment lines."""
    text = failover.query(failover.SQL, name).text
    return "\n".join(line for line in text.splitlines() if not line.startswith("--")).strip()


RESTART_STARTER = _starter("restart_claim_starter")
FENCE_STARTER = _starter("fence_starter")
TRY = "change the statement and run the cell again."


def _statement(conn: psycopg.Connection, text: object, params: dict) -> str:
    """The learner's one statement, its parameters written in (an error names the allowed)."""
    if not isinstance(text, str) or not text.strip():
        raise LabkitError("The SQL to check is empty.", "write your statement in the string and run the cell again.")
    found = len(statements(text))
    if found != 1:
        raise LabkitError(f"The exercise takes one statement, not {found}.",
                          "write a single statement (comments alone are none; no ';' between two).")
    return fill_in(lambda q, p: psycopg.ClientCursor(conn).mogrify(q, p), text, params,
                   (psycopg.ProgrammingError, KeyError, TypeError, ValueError))


def _run(node: Node, text: str, params: dict, who: str) -> tuple[list[tuple], int, str | None]:
    """``text`` in a new session named after ``who``: (rows it returned, rows it changed, error)."""
    with node.connect(name=f"labkit:pair:{who}") as conn:
        bound = _statement(conn, text, params)
        try:
            cur = conn.execute(bound)
            rows = cur.fetchall() if cur.description else []
            return rows, max(cur.rowcount, 0), None
        except psycopg.Error as exc:
            return [], 0, f"{exc.sqlstate} {str(exc).splitlines()[0]}"


def _claim_in(conn: psycopg.Connection, text: str, worker: str) -> tuple[list[tuple], str | None]:
    """The learner's claim as ``worker`` on an open session: (rows it returned, error)."""
    bound = _statement(conn, text, {"worker": worker})
    try:
        cur = conn.execute(bound)
        return (cur.fetchall() if cur.description else []), None
    except psycopg.Error as exc:
        return [], f"{exc.sqlstate} {str(exc).splitlines()[0]}"


def _claimed(rows: list[tuple]) -> int | None:
    return rows[0][0] if rows and rows[0] else None


def check_restart_claim(sql_text: str) -> Check:
    """Check ``sql_text``, a claim taking ``%(worker)s`` and returning the job's id first, across
    a restart (this module's text)."""
    check = Check("the claim across a restart: w1 claims, the server restarts, w2 and w3 claim")
    with ReplicaPair(standby=False) as pair:
        node = pair.primary
        assert node is not None
        failover.make_scene(node, 3)
        w1_conn = node.connect(name="labkit:pair:w1")
        try:
            rows, error = _claim_in(w1_conn, sql_text, "w1")
            got = _claimed(rows)
            node.restart()
        finally:
            w1_conn.close()
        if not check.add(got is not None, f"w1 claimed job {got}" if got is not None else
                         f"w1 claimed nothing{': ' + error if error else ''}"):
            check.hint = ("The statement must return the claimed job's id as its first column: "
                          f"{TRY}")
            return check
        # w2 keeps its session while w3 claims: whatever w2 holds, it still holds then.
        with node.connect(name="labkit:pair:w2") as w2:
            rows, error = _claim_in(w2, sql_text, "w2")
            second = _claimed(rows)
            check.add(error is None and second != got,
                      f"after the restart w2 claimed {'job ' + str(second) if second else 'nothing'}"
                      + (f" ({error})" if error else "")
                      + (": w1's job again, while w1 still runs it" if second == got else ""))
            with node.connect(name="labkit:pair:script") as conn:
                conn.execute(failover.q("lease_runs_out"), {"id": got})
            rows, _, error = _run(node, sql_text, {"worker": "w3"}, "w3")
        third = _claimed(rows)
        check.add(third == got, f"once w1's lease ran out (w2 still connected), w3 claimed "
                  f"{'job ' + str(third) if third else 'nothing'}"
                  + ("" if third == got else f", not job {got}") + (f" ({error})" if error else ""))
    if check.passed:
        return check
    if unchanged(sql_text, RESTART_STARTER):
        check.hint = f"That is the advisory claim as it stands: {TRY}"
    elif second == got:
        check.hint = ("What held w1's job lived in w1's session, and the restart ended the session. "
                      "Hold the job in something the server commits.")
    else:
        check.hint = ("A job whose lease ran out must be claimable again: a claim takes PENDING "
                      "jobs and RUNNING ones whose lease_until is past.")
    return check


def _zombies(pair: ReplicaPair) -> dict[str, tuple[int, int]]:
    """An asynchronous failover that hands job 1's version 2 out twice: {who: (version, epoch)}."""
    primary, standby = pair.primary, pair.standby
    assert primary is not None and standby is not None
    failover.make_scene(primary, 1)
    with primary.connect(name="labkit:pair:A") as conn:
        tokens = {"A": failover.row_of(conn, "lease_claim", {"worker": "A", "lease": failover.SHORT_LEASE, "ids": [1]})}
    pair.wait_caught_up()
    time.sleep(0.2)                            # A's lease runs out
    pair.cut_standby()
    with primary.connect(name="labkit:pair:B") as conn:
        tokens["B"] = failover.row_of(conn, "lease_claim", {"worker": "B", "lease": failover.LEASE, "ids": [1]})
    primary.crash()
    pair.promote()
    with standby.connect(name="labkit:pair:reaper") as conn:
        conn.execute(failover.q("lease_runs_out"), {"id": 1})   # scripted: B's lease runs out there too
        tokens["C"] = failover.row_of(conn, "lease_claim", {"worker": "C", "lease": failover.LEASE, "ids": [1]})
    return {who: (row[1], row[2]) for who, row in tokens.items()}


def check_fenced_write(sql_text: str) -> Check:
    """Check ``sql_text``, the fenced completion taking ``%(id)s``, ``%(version)s`` and
    ``%(epoch)s``, after an asynchronous failover (this module's text)."""
    check = Check("the fenced completion after a failover: zombies A and B, then C, write")
    with ReplicaPair(replication="async") as pair:
        tokens = _zombies(pair)
        standby = pair.standby
        assert standby is not None
        outcome = {}
        for who in ("A", "B", "C"):
            version, epoch = tokens[who]
            _, changed, error = _run(standby, sql_text, {"id": 1, "version": version, "epoch": epoch}, who)
            outcome[who] = (changed, error)
        status = standby.one("SELECT status FROM job WHERE id = 1")
    for who in ("A", "B"):
        changed, error = outcome[who]
        version, epoch = tokens[who]
        check.add(changed == 0 and error is None,
                  f"zombie {who} (version {version}, epoch {epoch}): "
                  + (error if error else "refused" if changed == 0 else f"{changed} row changed"))
    changed, error = outcome["C"]
    check.add(changed == 1 and status == "DONE",
              f"C (version {tokens['C'][0]}, epoch {tokens['C'][1]}): "
              + (error if error else f"{changed} row changed, the job is {status}"))
    if check.passed:
        return check
    if unchanged(sql_text, FENCE_STARTER):
        check.hint = f"That is notebook 08's fence as it stands: {TRY}"
    elif outcome["B"][0]:
        check.hint = ("B and C hold the same version: one number cannot tell them apart. What do "
                      "their tokens differ in?")
    elif any(e for _, e in outcome.values()):
        check.hint = "Read the error above: the statement itself failed."
    else:
        check.hint = "The holder of the job's current token must still complete it."
    return check
