"""Notebook 10's exercise the server checks: who holds the xmin horizon.

:func:`check_holders` takes the learner's query (one statement, no parameters, returning
session pids in its first column) and runs it while a scene of real sessions sits on the
server for a few seconds:

* a REPEATABLE READ report that ran one count and sits idle in its transaction (a
  snapshot: ``backend_xmin``), in the lab's database;
* a writer that began its transaction first, took a transaction id later, and sits idle
  in it (``backend_xid``), in another database of the server: a throw-away one the check
  creates for itself (named after its scratch schema, so that no other run drops it) and
  drops at the end; where the role may not create one, an existing one it may connect to
  (``postgres`` first); where it can do neither, in the lab's database, and the check's
  title says so;
* two innocent sessions of the lab's database: one idle, one idle in a READ COMMITTED
  transaction after one query (no snapshot and no id between statements).

It passes when exactly the report and the writer come back, the report first (its snapshot
is older than the writer's id, though the writer's transaction began first), and neither
the innocent sessions nor the query's own session. What the sessions hold is read from
``pg_stat_activity``; the learner's SQL is never parsed. Sessions that are not the
checker's (other people's on a shared server) are left out of the judgement, in the result
and in the order. The one thing the SQL's text decides is the hint: the notebook's starting
query, unchanged (:data:`STARTER`, compared without regard to spacing or case), is told what
it got wrong and asked for an attempt of the learner's own; the hint comes with the attempts
that differ from it.

Not in the scene: prepared transactions and replication slots hold the horizon too, but
have no session, so a query for pids cannot name them (``horizon.other_horizon_holders``
lists them); the server may not allow prepared transactions at all
(``max_prepared_transactions = 0`` by default), and a slot would outlive a failed check.
Every session of the scene is closed, and a throw-away database dropped, before the check
returns, on an error too.
"""

from __future__ import annotations

import time

import psycopg

from ...core.db import Guards, session_name
from ...core.errors import LabkitError
from ...core.lab import Lab
from ...core.queries import query as named_query  # ``query`` is the learner's SQL below
from ...labs.horizon import another_database, open_report
from . import Check, Solo, bind, unchanged
from . import scratch as _scratch

HOLDERS_HINT = ("A session holds the horizon while it has a snapshot or a transaction id, whatever "
                "its state and in whichever database it runs. Look at what pg_stat_activity's "
                "backend_ columns say each session holds, not at its state, and at how many "
                "transactions old each hold is; leave your own session out, and put the oldest "
                "hold first.")

# The notebook's starting query (its MY_HOLDERS cell): run unchanged, its verdict says what
# it got wrong and invites an attempt, without the hint.
STARTER = """
SELECT pid
  FROM pg_stat_activity
 WHERE state = 'idle in transaction'
   AND datname = current_database()
"""
STARTER_HINT = ("That is the query the notebook started you with, unchanged. The lines above "
                "say what it got wrong: change it and run the cell again.")


def is_starter(query: str) -> bool:
    """Whether ``query`` is :data:`STARTER` (see :func:`unchanged`)."""
    return unchanged(query, STARTER)


# Every session of the scene ends itself this long after its last statement, should the
# checker's process die before it closes them.
SCENE_GUARDS = Guards(lock_timeout="5s", statement_timeout="10s", idle_in_transaction="30s")
LASTS_S = 30


def _close(conns: list[psycopg.Connection], lab: Lab, timeout: float = 10.0) -> None:
    """Close every connection and wait until the server shows none of their sessions."""
    pids = [c.info.backend_pid for c in conns if not c.closed]
    for c in conns:
        try:
            c.close()
        except Exception:       # noqa: BLE001 - closing on a clean-up path
            pass
    deadline = time.monotonic() + timeout
    left = named_query("horizon.sql", "sessions_left").sql
    while pids and lab.execute(left, {"pids": pids}):
        if time.monotonic() > deadline:
            lab.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = ANY(%s)",
                        (pids,))
            return
        time.sleep(0.02)


def _writer_elsewhere(lab: Lab, dbname: str | None) -> psycopg.Connection | None:
    """The writer's session in ``dbname`` (None: there is none), or None when the server
    refuses the connection there (pg_hba.conf, a connection limit)."""
    if dbname is None:
        return None
    try:
        return lab.db.connect(dbname=dbname, role="writer", guards=SCENE_GUARDS,
                              application_name=session_name(lab.schema, "writer"))
    except (LabkitError, psycopg.Error):
        return None


def check_holders(lab: Lab, query: str) -> Check:
    """Run ``query`` (one statement, no parameters, returning pids in its first column)
    against the scene in this module's description; return the :class:`Check`."""
    text = bind(lab, query, {})                    # bad input is refused before any scene
    check = Check("who holds the horizon: a report and a writer hold it, two idle sessions "
                  "do not", hint=STARTER_HINT if is_starter(query) else HOLDERS_HINT)
    work = _scratch(lab)
    conns: list[psycopg.Connection] = []
    try:
        work.create_jobs(3)
        # a database of the check's own (its scratch schema's name): another run's throw-away
        # database may be dropped by its owner while the writer sits in it
        with another_database(work, create=True) as other:
            try:
                writer = _writer_elsewhere(work, other.name)
                if writer is not None:
                    other.conn = writer            # closed and waited for by another_database
                    where = "in another database"
                else:                              # no other database, or none that lets us in
                    writer = work.connect(role="writer", guards=SCENE_GUARDS)
                    conns.append(writer)
                    where = "in this database"
                    check.title += " (the writer in this database: no other could be reached)"
                begin, take_id = named_query("horizon.sql", "writer_no_table").statements
                writer.execute(begin)                                  # its transaction begins first
                idle = work.connect(role="idle", guards=SCENE_GUARDS)
                conns.append(idle)
                idle.execute("SELECT count(*) FROM job")
                innocent = work.connect(role="idle-rc", guards=SCENE_GUARDS)
                conns.append(innocent)
                for s in named_query("horizon.sql", "idle_reader").statements:
                    innocent.execute(s)
                report = open_report(work, lasts_s=LASTS_S)            # its snapshot: the oldest
                conns.append(report)
                work.execute(named_query("horizon.sql", "xact_id").sql)   # one transaction between
                writer.execute(take_id)                                # the writer's id: newer
                names = {report.info.backend_pid: "report", writer.info.backend_pid: "writer",
                         idle.info.backend_pid: "idle", innocent.info.backend_pid: "idle-rc"}
                with Solo(work, role="who") as conn:
                    names[conn.info.backend_pid] = "own"
                    try:
                        cur = conn.execute(text)
                        rows = cur.fetchall() if cur.description else None
                    except psycopg.Error as exc:
                        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                        check.add(False, f"the query failed: {type(exc).__name__}: {first}")
                        return check
                holds = {pid: (held, age) for pid, held, age in work.execute(
                    named_query("horizon.sql", "scene_holds").sql, {"pids": list(names)})}
            finally:
                _close(conns, work)
        _judge(check, rows, names, holds, where)
        return check
    finally:
        work.drop()


def _not_pids(rows: list[tuple]) -> list:
    """The first cells of the rows whose first column is not a pid (None for an empty row)."""
    return [r[0] if r else None for r in rows
            if not r or not isinstance(r[0], int) or isinstance(r[0], bool)]


def _holders_oldest_first(names: dict[int, str], holds: dict[int, tuple[bool, int | None]]) -> list[str]:
    """The scene as the server showed it: the report and the writer hold, oldest first;
    a scene that did not hold so raises the LabkitError that says what to do."""
    pid_of = {name: pid for pid, name in names.items()}
    expected = sorted((n for n in ("report", "writer") if holds.get(pid_of[n], (False,))[0]),
                      key=lambda n: -(holds[pid_of[n]][1] or 0))
    if expected != ["report", "writer"]:
        raise LabkitError(f"The checker's scene did not hold as it should (the server showed "
                          f"{', '.join(expected) or 'no holder'}).",
                          "run the cell again; if it persists, run `labkit doctor`.")
    return expected


def _who_came_back(got: list[str], where: str) -> list[tuple[bool, str]]:
    """The findings on which of the scene's sessions came back: each rule is (condition,
    what it says when right, what it says when wrong).  A wrong one says what the session
    was doing on the server, never how to write the query."""
    innocent = [n for n in ("idle-rc", "idle") if n in got]
    said = {"idle-rc": "the session idle in a READ COMMITTED transaction came back: it had run "
                       "one query and sat idle in its transaction, holding nothing between "
                       "statements",
            "idle": "the idle session came back: it sat outside any transaction, holding nothing"}
    rules = [
        ("report" in got,
         "the REPEATABLE READ report idle in its transaction came back (it held a snapshot)",
         "the REPEATABLE READ report did not come back: it sat idle in its transaction, "
         "holding the snapshot its count had taken"),
        ("writer" in got,
         f"the writer idle in a transaction {where} came back (it held a transaction id)",
         f"the writer idle in a transaction {where} did not come back: it had written, "
         "and sat idle between statements holding its transaction's id, with no snapshot"),
        (not innocent,
         "neither innocent session came back (one idle, one idle in a READ "
         "COMMITTED transaction: no snapshot, no id)",
         "; ".join(said[n] for n in innocent)),
        ("own" not in got,
         "the query's own session did not come back",
         "the query's own session came back: the snapshot it showed was your query's "
         "own, held only while the query ran"),
    ]
    return [(ok, right if ok else wrong) for ok, right, wrong in rules]


def _judge_order(check: Check, got: list[str], expected: list[str]) -> None:
    """The findings on the result's rows: one per session, and the holders oldest first
    (judged when both came back)."""
    if len(got) != len(set(got)):
        check.add(False, "a session came back more than once: one row per session")
    order = [n for n in dict.fromkeys(got) if n in ("report", "writer")]
    if len(order) == 2:
        check.add(order == expected,
                  "oldest first: the report's snapshot before the writer's transaction id "
                  "(the writer's transaction began first, but took its id later)"
                  if order == expected else
                  "the holders came back youngest hold first: the writer's transaction id "
                  "came before the report's snapshot, which is older (the writer's "
                  "transaction began first, but took its id after the report's snapshot)")


def _judge(check: Check, rows: list[tuple] | None, names: dict[int, str],
           holds: dict[int, tuple[bool, int | None]], where: str) -> None:
    """The findings, from the pids the query returned and what the scene's sessions held."""
    if rows is None:
        check.add(False, "the statement returned no rows at all: write a SELECT whose first "
                         "column is the pid")
        return
    bad = _not_pids(rows)
    if bad:
        check.add(False, f"the first column should hold pids (whole numbers); it held {bad[0]!r}")
        return
    got = [names[r[0]] for r in rows if r[0] in names]          # other people's are left out
    expected = _holders_oldest_first(names, holds)
    for ok, text in _who_came_back(got, where):
        check.add(ok, text)
    _judge_order(check, got, expected)
