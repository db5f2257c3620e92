"""A few named sessions (up to MAX_SESSIONS), one ordered script.

Each session is its own connection.  A step is sent with libpq's asynchronous
API (no threads); the engine then waits on the socket and, while the step has
not finished, asks the server from a separate monitor connection whether the
session is waiting for a lock held by another session of the run
(``pg_blocking_pids``), which is how PostgreSQL's isolation tester tells a
blocked step from a slow one.  A blocked step is recorded as waiting and the
script moves on; it completes when its blocker commits or rolls back, and the
engine notices that after the next step, again by asking the server.

No ``sleep()`` decides anything: the order of events is the script's.

A tool that plays its own script (the isolation-spec runner) uses the same pieces one by
one: :meth:`Sessions.send` sends a step without waiting, :meth:`Sessions.settle` waits
until it finishes or the server says it is blocked, and :meth:`Sessions.blockers` is that
one question to the server.
"""

from __future__ import annotations

import selectors
import time
import weakref
from collections.abc import Callable

import psycopg
from psycopg import pq, sql
from psycopg.adapt import Transformer

from .errors import LabkitError
from .lab import Lab
from .queries import query
from .script import MAX_SESSIONS as MAX_SESSIONS  # the limit lives with the script; named here too
from .script import ScriptRun, close_all
from .steps import Blockers, Result, Step, StepError, classify

# Guards: a mistyped script ends with an error, never a hung kernel.
DEFAULT_LOCK_TIMEOUT = "5s"
DEFAULT_STATEMENT_TIMEOUT = "15s"
POLL_S = 0.002
WAIT_EVENT_TRIES = 100         # x 5 ms: how long a blocked step may take to report its wait event

class Session:
    """One named connection taking part in a run."""

    def __init__(self, name: str, conn: psycopg.Connection) -> None:
        self.name = name
        self.conn = conn
        self.pgconn: pq.abc.PGconn = conn.pgconn
        self.pid = conn.info.backend_pid
        self.pending: Step | None = None
        self._tx = Transformer.from_context(conn)
        self._notices: list[str] = []
        conn.add_notice_handler(lambda d: self._notices.append(d.message_primary or ""))

    def send(self, step: Step) -> None:
        step.started = time.perf_counter()
        self.pgconn.send_query(step.sql.encode())
        self.pending = step

    def poll(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the pending step; True when it has finished."""
        step = self.pending
        assert step is not None
        if self.pgconn.is_busy():
            sel = selectors.DefaultSelector()
            sel.register(self.pgconn.socket, selectors.EVENT_READ)
            try:
                sel.select(timeout)
            finally:
                sel.close()
            self.pgconn.consume_input()
            if self.pgconn.is_busy():
                return False
        self._collect(step)
        step.finished = time.perf_counter()
        self.pending = None
        return True

    def _collect(self, step: Step) -> None:
        while True:
            res = self.pgconn.get_result()
            if res is None:
                break
            if res.status == pq.ExecStatus.TUPLES_OK:
                cols = [(res.fname(i) or b"").decode() for i in range(res.nfields)]
                text_rows = [tuple(_decoded(res.get_value(r, c)) for c in range(res.nfields))
                             for r in range(res.ntuples)]
                self._tx.set_pgresult(res)
                typed = self._tx.load_rows(0, res.ntuples, tuple) if res.ntuples else []
                numeric = [res.ftype(c) in _NUMERIC_OIDS for c in range(res.nfields)]
                step.results.append(Result(cols, list(typed), text_rows, numeric,
                                           (res.command_status or b"").decode()))
            elif res.status == pq.ExecStatus.COMMAND_OK:
                step.results.append(Result([], [], [], [], (res.command_status or b"").decode()))
            elif res.status in (pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.NONFATAL_ERROR):
                state = (res.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
                msg = (res.error_field(pq.DiagnosticField.MESSAGE_PRIMARY) or b"").decode()
                step.error = StepError(state, msg, classify(state, msg))
            elif res.status == pq.ExecStatus.EMPTY_QUERY:
                pass
            else:  # COPY and friends are not part of the labs
                step.error = StepError("", f"unsupported result status {pq.ExecStatus(res.status).name}",
                                       "other")
        step.notices.extend(self._notices)
        self._notices.clear()


def _decoded(value: bytes | None) -> str | None:
    """A field of a result in text format, as text (None for NULL)."""
    return None if value is None else value.decode()


# int2, int4, int8, oid, float4, float8, numeric, xid
_NUMERIC_OIDS = {21, 23, 20, 26, 700, 701, 1700, 28}


class Sessions(ScriptRun):
    """Drive named sessions through one ordered script.

    ``watch`` maps a table to the column that names its rows; after every step the
    engine records which of those rows each session holds locked (read from the
    rows' ``xmax`` and the sessions' transaction ids on the server).
    """

    def __init__(self, lab: Lab, *names: str, watch: dict[str, str] | None = None,
                 lock_timeout: str = DEFAULT_LOCK_TIMEOUT,
                 statement_timeout: str = DEFAULT_STATEMENT_TIMEOUT,
                 setup: str | None = None, track_locks: bool = True) -> None:
        self._check_names(names)
        self.lab = lab
        self.names = list(names)
        self.watch = dict(watch or {})
        self.track_locks = track_locks and bool(self.watch)
        self.lock_timeout = lock_timeout
        self.statement_timeout = statement_timeout
        self.steps: list[Step] = []
        self.sessions: dict[str, Session] = {}
        self._closed = False
        self.monitor = lab.connect(role="monitor")
        try:
            for table, key in self.watch.items():
                found = self.monitor.execute(query("engine.sql", "column_exists").sql,
                                             {"table": table, "column": key}).fetchone()
                if not found:
                    raise LabkitError(f"watch={{{table!r}: {key!r}}} names a table or column that does not "
                                      "exist in the lab.",
                                      "create the table first, or fix the table or column name in watch=.")
            for name in names:
                conn = lab.connect(role=name)
                conn.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(lock_timeout)))
                conn.execute(sql.SQL("SET statement_timeout = {}").format(sql.Literal(statement_timeout)))
                if setup:
                    conn.execute(setup)
                self.sessions[name] = Session(name, conn)
        except BaseException:
            self.close()
            raise
        self._pids = {s.pid: s.name for s in self.sessions.values()}
        self._deadline_s = _seconds(statement_timeout) + 5
        self._finalizer = weakref.finalize(self, close_all,
                                           [s.conn for s in self.sessions.values()] + [self.monitor])

    def close(self) -> None:
        """Roll back whatever is open and close every connection (locks go with them)."""
        if self._closed:
            return
        self._closed = True
        for s in self.sessions.values():
            try:
                if s.pending is not None:
                    # Cancel the waiting statement and collect its (error) result, so the
                    # connection is free for the ROLLBACK below.
                    s.conn.cancel()
                    s.poll(5)
                    s.pending = None
                # ROLLBACK returns only once the server has released the session's locks,
                # so nothing is still locked when close() returns.
                if s.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    s.conn.execute("ROLLBACK")
            except Exception:
                pass
            finally:
                try:
                    s.conn.close()
                except Exception:
                    pass
        try:
            self.monitor.close()
        except Exception:
            pass

    def settle(self, session: str, *, until_done: bool = False,
               watchdog: Callable[[float], None] | None = None) -> Blockers | None:
        """Wait for the step ``session`` is running.  Returns None once it has finished (at
        once when none is running), or, unless ``until_done``, what it waits for as soon as
        the server says it is blocked by another session of this run (:meth:`blockers`).

        Between two looks, ``watchdog(seconds since this call)`` may cancel the step or
        raise.  Without one, a step still running after the run's ``statement_timeout``
        plus 5 s is cancelled and a LabkitError raised."""
        self._check_name(session)
        s = self.sessions[session]
        start = time.monotonic()
        while s.pending is not None:
            if s.poll(0.05 if until_done else POLL_S):
                return None
            if not until_done:
                blockers = self.blockers(session)
                if blockers is not None:
                    # Asking took a moment: the result may have come meanwhile.
                    return None if s.poll(0) else blockers
            elapsed = time.monotonic() - start
            if watchdog is not None:
                watchdog(elapsed)
            elif elapsed > self._deadline_s:
                self._give_up(s)
        return None

    def cancel(self, session: str) -> None:
        """Cancel ``session``'s running statement (libpq's cancel request)."""
        self._check_name(session)
        self.sessions[session].conn.cancel()

    def blockers(self, session: str) -> Blockers | None:
        """The sessions of this run that ``session``'s running step waits for, as the server
        says (None when it waits for none of them).  It is PostgreSQL's isolation tester's
        test: a heavyweight lock held or queued for by another session
        (``pg_blocking_pids``), or a SERIALIZABLE READ ONLY DEFERRABLE transaction waiting
        for a safe snapshot (``pg_safe_snapshot_blocking_pids``)."""
        self._check_name(session)
        pid = self.sessions[session].pid
        # A waiter joins the lock's queue (which pg_blocking_pids reads) a moment before it
        # reports its wait event (which pg_stat_activity shows): ask again, briefly, so that
        # a step seen blocked is never reported without what it waits on.
        for _ in range(WAIT_EVENT_TRIES):
            row = self.monitor.execute(query("engine.sql", "blockers").sql, {"pid": pid}).fetchone()
            if row is None:
                return None
            pids, etype, event = row
            names = [self._pids[p] for p in (pids or []) if p in self._pids]
            if not names:
                return None
            if etype:
                return Blockers(names, f"{etype}:{event}")
            time.sleep(0.005)
        return Blockers(names, None)

    def statement_ms(self, session: str) -> float | None:
        """How long ``session``'s last statement ran by the server's clock, in ms (None while
        it still runs): ``pg_stat_activity``'s ``state_change - query_start``, read from the
        monitor connection.  Unlike the step's ``elapsed_ms``, it leaves out the time the
        client took to send the statement and to read the answer, which on a busy machine
        includes waiting for a CPU.  Ask before the session runs another statement."""
        self._check_name(session)
        row = self.monitor.execute(query("engine.sql", "statement_ms").sql,
                                   {"pid": self.sessions[session].pid}).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def _give_up(self, s: Session) -> None:
        step = s.pending
        if step is None:            # it finished just now: nothing to give up on
            return
        s.conn.cancel()
        s.poll(5)
        raise LabkitError(
            f"Step {step.index} ({step.label!r}) of session {s.name} did not finish within "
            f"{self._deadline_s:.0f} s and was cancelled.",
            "check the script: a session waits for a lock that is never released, or raise "
            "statement_timeout for long steps.",
        )

    def _record_locks(self, step: Step) -> None:
        if not self.track_locks:
            return
        step.locks_after = self.locked_rows()

    def locked_rows(self) -> dict[str, list]:
        """Rows of the watched tables each session holds locked right now."""
        xids: dict[int, str] = dict(self.monitor.execute(query("engine.sql", "transaction_ids").sql,
                                                         {"pids": list(self._pids)}).fetchall())
        held: dict[str, list] = {name: [] for name in self.names}
        if not xids:
            return held
        by_xid = {x: self._pids[p] for p, x in xids.items()}
        for table, key in self.watch.items():
            try:
                rows = self._watched(table, key, by_xid)
            except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as exc:
                raise LabkitError(f"watch={{{table!r}: {key!r}}} names something that does not exist "
                                  f"in the lab ({str(exc).splitlines()[0]}).",
                                  "create the table first, or fix the table or column name in watch=.") from None
            for k, x in rows:
                held[by_xid[x]].append(k)
        return held

    def _watched(self, table: str, key: str, by_xid: dict) -> list[tuple]:
        # A row's xmax is the id of the transaction that locked (or updated) it; a
        # session's open transaction id is its backend_xid.
        return self.monitor.execute(
            sql.SQL("SELECT {key}, xmax::text FROM {table} WHERE xmax::text = ANY(%s) ORDER BY 1").format(
                key=sql.Identifier(key), table=sql.Identifier(table)),
            (list(by_xid),),
        ).fetchall()

def _seconds(setting: str) -> float:
    s = setting.strip().lower()
    for unit, mult in (("ms", 0.001), ("s", 1), ("min", 60)):
        if s.endswith(unit):
            return float(s[: -len(unit)]) * mult
    return float(s) / 1000  # PostgreSQL's default unit for timeouts is ms
