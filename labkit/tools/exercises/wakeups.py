"""Notebook 12's exercise the server checks: a setting for one transaction, behind a
transaction pooler.

PgBouncer in transaction pooling lends a server connection to a client for one transaction,
then to the next client.  A plain ``SET`` is the server session's, so it outlives the
transaction and reaches whichever client comes next; ``SET LOCAL`` (or ``set_config(...,
true)``) ends with the transaction.  :func:`check_lock_timeout` plays what a pooler does with
one real server connection: client A's transaction, then client B's, on the same
connection, and reads from the server what each transaction's ``lock_timeout`` was and what
it did.
"""

from __future__ import annotations

import time

import psycopg

from ...core.checked import one_row
from ...core.db import Guards
from ...core.errors import LabkitError
from ...core.lab import Lab
from ...core.queries import query
from . import Check, bind, scratch

WANT = "2s"                 # the lock_timeout client A wants for its one transaction
# What to look at, by what went wrong first (never the statement itself).
HINTS = {
    "failed": "Read the server's error above: the SQL runs as client A's first statement, "
              "inside A's transaction, with no parameters.",
    "ended": "Send only the setting: A's update comes after it, in the same transaction, so "
             "the SQL must not COMMIT or ROLLBACK.",
    "inside": "Look at which parameter and value the SQL sets: A wants lock_timeout to be 2 s "
              "while its transaction runs.",
    "gave_up": "Look at what else the SQL sets: only lock_timeout should decide how long A's "
               "update waits for the row.",
    "stored": "A role's or a database's setting reaches every new session; A wants the value "
              "for one transaction only.",
    "leaked": "A plain SET belongs to the server session, which outlives the transaction. Look "
              "in the reference page of SET for a form whose value ends when the current "
              "transaction ends, commit or rollback alike.",
}
def _q(name: str) -> str:
    return query("wakeups.sql", name).sql


def _one(conn: psycopg.Connection, name: str) -> object:
    return one_row(conn.execute(_q(name)), f"the query {name!r} of wakeups.sql")[0]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def check_lock_timeout(lab: Lab, setting_sql: str) -> Check:
    """Run ``setting_sql`` (no parameters) as client A's first statement, inside A's
    transaction on a server connection, as a transaction pooler would: then A updates a row
    that another session holds locked (in a savepoint, so its transaction goes on) and
    commits.  Client B's transaction then runs on the same server connection.

    It passes when A's transaction is still open after the SQL, A's update gave up after
    about 2 s with a lock timeout, B's transaction starts with the connection's own lock_timeout,
    and no role or database setting was changed (that would reach every new session)."""
    if not isinstance(setting_sql, str) or not setting_sql.strip():
        raise LabkitError("The SQL to check is empty.",
                          "write the statement that sets lock_timeout for A's transaction only, "
                          "and run the cell again.")
    check = Check("a lock_timeout of 2 s for client A's transaction only")

    def wrong(why: str, text: str) -> None:
        """A finding that is wrong, and the hint for the first one."""
        check.add(False, text)
        check.hint = check.hint or HINTS[why]

    box = scratch(lab)
    held = pooled = None
    try:
        box.create_jobs(3)
        text = bind(box, setting_sql, {})
        held = box.connect(role="reaper", autocommit=False,
                           guards=Guards(statement_timeout="30s", idle_in_transaction="60s"))
        held.execute(_q("hold"))                               # job 1 stays locked throughout
        pooled = box.connect(role="pooled", guards=Guards(statement_timeout="10s"))
        pooled.execute("SET lock_timeout = 0")                 # the connection's own default
        default = _one(pooled, "lock_timeout")
        stored = pooled.execute(_q("stored_settings")).fetchall()

        pooled.execute("BEGIN")                                # client A's transaction
        try:
            pooled.execute(text)
        except psycopg.Error as exc:
            wrong("failed", f"the SQL failed: {_first_line(exc)}")
            return check
        in_tx = pooled.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        if not in_tx:
            wrong("ended", "the SQL ended client A's transaction: A's update would run in a "
                           "transaction of its own, without the setting")
            pooled.execute("BEGIN")
        where = "inside client A's transaction" if in_tx else "in the transaction begun after it"
        inside = _one(pooled, "lock_timeout")
        if inside == WANT:
            pooled.execute("SAVEPOINT attempt")
            t0 = time.monotonic()
            try:
                pooled.execute(_q("mark_done"))
                outcome, gave_up = "succeeded", False
            except psycopg.errors.LockNotAvailable:
                outcome, gave_up = "gave up with a lock timeout", True
            except psycopg.Error as exc:                       # another setting stopped it
                outcome, gave_up = f"ended with {_first_line(exc)}", False
            waited = time.monotonic() - t0
            pooled.execute("ROLLBACK TO SAVEPOINT attempt")
            on_time = 1.5 <= waited <= 10                      # about 2 s, on a busy machine too
            said = (f"{where} lock_timeout is {inside}: its update of a row another session "
                    f"holds {outcome}"
                    + (" after about 2 s" if on_time else f" after {waited:.1f} s"))
            if gave_up and on_time:
                check.add(True, said)
            else:
                wrong("gave_up", said)
        else:
            wrong("inside", f"{where} lock_timeout is {inside}, not {WANT}: its update of a "
                            f"locked row would wait "
                            + ("for ever" if inside in ("0", "0ms") else f"{inside}"))
        changed = pooled.execute(_q("stored_settings")).fetchall() != stored
        if changed:
            pooled.execute("ROLLBACK")                         # undone: no role keeps it
            wrong("stored", "the SQL changed a role's or a database's settings: every new "
                            "session would start with it, not only A's transaction (undone)")
        else:
            pooled.execute("COMMIT")                           # A is done; the pooler moves on

        pooled.execute("BEGIN")                                # client B, same server connection
        after = _one(pooled, "lock_timeout")
        pooled.execute("COMMIT")
        if after == default:
            check.add(True, f"client B's transaction, next on the same server connection, starts "
                            f"with lock_timeout {after}, the connection's default")
        else:
            wrong("leaked", f"client B's transaction, next on the same server connection, "
                            f"starts with lock_timeout {after}: A's setting leaked to another "
                            f"client")
        return check
    finally:
        for conn in (pooled, held):
            if conn is not None:
                conn.close()
        box.drop()
