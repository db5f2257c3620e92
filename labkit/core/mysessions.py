"""The session engine of :mod:`labkit.core.sessions`, on MySQL and MariaDB.

The same script, the same steps, the same transcript: each named session is a connection
of its own, a step is sent without waiting for it, and a step that has not finished is
recorded as waiting only when the *server* says it waits for a lock another session of the
run holds -- MariaDB's ``information_schema.INNODB_LOCK_WAITS``, MySQL 8's
``performance_schema.data_lock_waits`` -- never because some time went by.

What differs from PostgreSQL, and why:

* PyMySQL has no asynchronous API, so each session sends its statements from a thread of
  its own; the script still decides the order of everything.
* InnoDB refreshes those tables from a cache at most every 0.1 s, so a look taken in the
  first 0.15 s of a step could still show the *previous* step's wait.  The engine asks only
  once a step has run that long: a waiting step is noticed a little later, never wrongly.
* The server names the lock a step waits for (``RECORD X,GAP on PRIMARY: 5``): it is the
  step's ``wait_event``, which is how the appendix shows a gap lock.
* InnoDB does not list the locks a transaction holds without a waiter (MariaDB) or lists
  them per index record, gaps included (MySQL): the engine does not track "rows locked".
"""

from __future__ import annotations

import queue
import re
import threading
import time
import weakref
from collections.abc import Callable

from .errors import LabkitError
from .mysql import (
    DEADLOCK,
    LOCK_NOWAIT,
    LOCK_WAIT_TIMEOUT,
    SQL,
    STATEMENT_TIMEOUT,
    MyConn,
    MyLab,
    gone_error,
    is_gone,
    kill,
)
from .queries import query, statements
from .script import ScriptRun, close_all
from .steps import DEADLOCK as K_DEADLOCK
from .steps import LOCK_TIMEOUT as K_LOCK_TIMEOUT
from .steps import NOWAIT as K_NOWAIT
from .steps import STATEMENT_TIMEOUT as K_STATEMENT_TIMEOUT
from .steps import Blockers, Result, Step, StepError
from .transcript import Transcript

POLL_S = 0.005
CACHE_S = 0.15          # InnoDB's lock tables may lag this much behind (0.1 s, and a margin)

# MySQL's numeric column types (PyMySQL's FIELD_TYPE codes): right-aligned in results
_NUMERIC = {0, 1, 2, 3, 4, 5, 8, 9, 13, 246}


def classify(code: int, sql_text: str) -> str:
    """What kind of lock error MySQL error ``code`` is, for a step running ``sql_text``.
    MariaDB answers a NOWAIT that met a lock with the lock-wait-timeout error, 1205: only
    the statement tells the two apart."""
    if code == LOCK_NOWAIT:
        return K_NOWAIT
    if code == LOCK_WAIT_TIMEOUT:
        upper = " ".join(sql_text.upper().split())
        return K_NOWAIT if "NOWAIT" in upper or " WAIT 0" in upper else K_LOCK_TIMEOUT
    if code == DEADLOCK:
        return K_DEADLOCK
    if code in STATEMENT_TIMEOUT:
        return K_STATEMENT_TIMEOUT
    return "other"


class MySession:
    """One named connection taking part in a run, sending from a thread of its own."""

    def __init__(self, name: str, conn: MyConn) -> None:
        self.name = name
        self.conn = conn
        self.thread_id = conn.thread_id
        self.pid = conn.thread_id
        self.pending: Step | None = None
        self._inbox: queue.Queue = queue.Queue()
        self._done = threading.Event()
        self._gone: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name=f"mysession-{name}", daemon=True)
        self._thread.start()

    def send(self, step: Step) -> None:
        step.started = time.perf_counter()
        self._done.clear()
        self.pending = step
        self._inbox.put(step)

    def poll(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the pending step; True when it has finished."""
        if not self._done.wait(timeout):
            return False
        self.pending = None
        if self._gone is not None:
            exc, self._gone = self._gone, None
            raise gone_error(self.conn.server.where, exc)
        return True

    def stop(self) -> None:
        self._inbox.put(None)

    def _serve(self) -> None:
        import pymysql

        while True:
            step = self._inbox.get()
            if step is None:
                return
            try:
                for stmt in statements(step.sql):
                    cur = self.conn.raw.cursor()
                    try:
                        cur.execute(stmt)
                    except pymysql.err.MySQLError as exc:
                        if is_gone(exc):
                            self._gone = exc
                            break
                        code = exc.args[0] if exc.args else 0
                        msg = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
                        step.error = StepError(str(code), msg, classify(code, stmt), engine="mysql")
                        break
                    step.results.append(_result(cur, stmt))
            except BaseException as exc:  # noqa: BLE001 -- reported by the caller
                self._gone = exc
            finally:
                step.finished = time.perf_counter()
                self._done.set()


def _result(cur, stmt: str) -> Result:
    verb = (stmt.split() or ["OK"])[0].upper()
    if cur.description:
        cols = [d[0] for d in cur.description]
        rows = [tuple(r) for r in cur.fetchall()]
        text = [tuple(None if v is None else _text(v) for v in r) for r in rows]
        numeric = [d[1] in _NUMERIC for d in cur.description]
        return Result(cols, rows, text, numeric, f"{verb} {len(rows)}")
    if verb in ("INSERT", "UPDATE", "DELETE", "REPLACE"):
        return Result([], [], [], [], f"{verb} {cur.rowcount}")
    if verb == "START":
        verb = "BEGIN"
    return Result([], [], [], [], verb)


def _text(v) -> str:
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    return str(v)


class MySessions(ScriptRun):
    """Drive named sessions on a MySQL-compatible lab through one ordered script; the same
    methods as :class:`labkit.core.sessions.Sessions` (``step``, ``send``, ``settle``,
    ``wait``, ``script``, ``blockers``, ``transcript``), and ``run.A("SQL")`` for a step.

    ``isolation`` sets every session's transaction isolation level (InnoDB's default is
    REPEATABLE READ); ``lock_wait_timeout_s`` is InnoDB's lock-wait guard (5 s)."""

    track_locks = False

    def __init__(self, lab: MyLab, *names: str, isolation: str | None = None,
                 lock_wait_timeout_s: int = 5, statement_timeout_s: float = 15) -> None:
        self._check_names(names)
        if isolation is not None and isolation.upper() not in (
                "READ UNCOMMITTED", "READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"):
            raise LabkitError(f"{isolation!r} is not an isolation level.",
                              "use 'READ COMMITTED' or 'REPEATABLE READ' (InnoDB's default).")
        self.lab = lab
        self.names = list(names)
        self.isolation = isolation.upper() if isolation else None
        self.steps: list[Step] = []
        self.sessions: dict[str, MySession] = {}
        self._closed = False
        self._deadline_s = statement_timeout_s + 5
        self.monitor = lab.server.connect(role="monitor", lock_wait_timeout_s=None)
        self._blockers_sql = query(SQL, "blockers_mariadb" if lab.server.flavour == "MariaDB"
                                   else "blockers_mysql").sql
        try:
            for name in names:
                conn = lab.connect(role=name, lock_wait_timeout_s=lock_wait_timeout_s,
                                   statement_timeout_s=statement_timeout_s)
                if self.isolation:
                    conn.execute(f"SET SESSION TRANSACTION ISOLATION LEVEL {self.isolation}")
                self.sessions[name] = MySession(name, conn)
        except BaseException:
            self.close()
            raise
        self._threads = {s.thread_id: s.name for s in self.sessions.values()}
        self._finalizer = weakref.finalize(self, close_all,
                                           [s.conn for s in self.sessions.values()] + [self.monitor])

    def close(self) -> None:
        """Stop what is running, roll back what is open, close every connection."""
        if self._closed:
            return
        self._closed = True
        for s in self.sessions.values():
            if s.pending is not None:
                kill(self.lab.server, s.thread_id, query_only=True)
                try:
                    s.poll(5)
                except Exception:
                    pass
            s.stop()
            try:
                s.conn.rollback()
            except Exception:
                pass
            s.conn.close()
        self.monitor.close()

    def settle(self, session: str, *, until_done: bool = False,
               watchdog: Callable[[float], None] | None = None,
               since: float | None = None) -> Blockers | None:
        """Wait for ``session``'s step: None once it has finished, or (unless ``until_done``)
        what it waits for, as soon as the server says it waits for another session.  The
        lock tables may show the waits of up to 0.1 s ago, so they are read only once they
        are fresh after ``since`` (a ``time.perf_counter()``; by default the step's start)."""
        self._check_name(session)
        s = self.sessions[session]
        start = time.monotonic()
        while s.pending is not None:
            if s.poll(0.05 if until_done else POLL_S):
                return None
            fresh = time.perf_counter() - (s.pending.started if since is None else since) >= CACHE_S
            if not until_done and fresh:
                blockers = self.blockers(session)
                if blockers is not None:
                    return None if s.poll(0) else blockers
            elapsed = time.monotonic() - start
            if watchdog is not None:
                watchdog(elapsed)
            elif elapsed > self._deadline_s:
                step = s.pending
                kill(self.lab.server, s.thread_id, query_only=True)
                s.poll(5)
                raise LabkitError(f"Step {step.index} ({step.label!r}) of session {s.name} did not "
                                  f"finish within {self._deadline_s:.0f} s and was cancelled.",
                                  "check the script: a session waits for a lock that is never released.")
        return None

    def cancel(self, session: str) -> None:
        """Stop ``session``'s running statement (KILL QUERY)."""
        kill(self.lab.server, self.sessions[session].thread_id, query_only=True)

    def blockers(self, session: str) -> Blockers | None:
        """The sessions of this run that ``session``'s step waits for, and the lock it asked
        for, as InnoDB says; None when it waits for none of them."""
        self._check_name(session)
        try:
            rows = self.monitor.execute(self._blockers_sql,
                                        {"thread": self.sessions[session].thread_id}).fetchall()
        except Exception as exc:
            if is_gone(exc):
                raise gone_error(self.lab.server.where, exc) from None
            raise
        names = sorted({self._threads[r[0]] for r in rows if r[0] in self._threads})
        if not names:
            return None
        lock_type, mode, index, data = rows[0][1:]
        # a DATETIME in an index entry prints as raw bytes (0x99B8...): shown as …
        data = re.sub(r"0x[0-9A-Fa-f]+", "…", str(data)) if data is not None else ""
        event = f"{lock_type} {mode} on {index} ({data})" if lock_type else None
        return Blockers(names, event)

    def _collect(self, s: MySession) -> None:
        if s.pending is not None and s.pending.done:
            s.poll(0)                  # finished on its thread, and no one has looked since

    def _look_again(self, session: str) -> Blockers | None:
        """After another session's step: has this waiting step finished, or does it still
        wait?  An unchanged answer is taken only from lock tables fresher than that step."""
        return self.settle(session, since=time.perf_counter())

    def transcript(self, **kw) -> Transcript:
        """The run as a transcript; a waiting step's note names the lock it asked for."""
        kw.setdefault("lock_detail", True)
        return Transcript.from_run(self, **kw)
