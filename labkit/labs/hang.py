"""A broker that stops answering: the relay's transaction must end anyway.

The relay publishes inside its transaction (claim, publish, mark, COMMIT: see
:mod:`labkit.labs.relay`).  A broker that *refuses* is easy: the publish raises, the relay
rolls back.  A broker that *stops answering* is not: the publish waits, and the relay's
transaction waits with it, its row locks held, for as long as the broker is silent.  The
server sees a session "idle in transaction" and cannot tell a silent broker from a slow relay.

:func:`broker_hang_trace` runs two relays, each in its own OS process, on one outbox and one
broker, and makes the broker hang for ``hang_s`` seconds right after both have claimed (their
batches are disjoint: SKIP LOCKED).

* The **unbounded** relay waits for its publish as long as the broker is silent: its
  transaction lasts the whole hang, its rows locked all that time.
* The **bounded** relay has two bounds of its own: a *publish timeout* (no publish may wait
  longer) and a *deadline* for the whole tick (a publish may only wait what is left of it);
  past either it gives the tick up: ROLLBACK.  It then asks the broker whether it answers,
  holding no transaction, and claims again only once it does.  Its transaction also carries a
  server-side *backstop* (``SET LOCAL``; twice the deadline) that ends the session if the relay
  itself cannot end the transaction: ``transaction_timeout`` on PostgreSQL 17 and later, which
  bounds the transaction as a whole; before 17, ``statement_timeout`` and
  ``idle_in_transaction_session_timeout``, which bound each statement and each idle gap but
  not their sum.

A timed-out publish is not a failed one: the broker may have stored the message and only its
answer is missing.  The hang here is exactly that: each relay's first message reaches the
broker; its confirm does not come back.  So the bounded relay, claiming the same rows again
after its rollback, publishes that message a second time: one duplicate, which the consumer
drops by event_id (the inbox).  Nothing is lost: a row is marked published only after every
publish of its batch was confirmed.

The hang, by broker:

* the recording broker (the default): **scripted**.  Its publish stores the message, then
  its confirm waits on an advisory lock that the lab holds for ``hang_s``
  (``labkit/sql/hang.sql``); the publish timeout is that wait's ``statement_timeout``.
* RabbitMQ (``LABKIT_AMQP_URL``): a **network hang**.  The relays reach RabbitMQ through a TCP
  proxy, a thread in the lab's process, that keeps forwarding what the relays send but holds
  what RabbitMQ sends back: the message is routed and confirmed, the confirm stays in the
  proxy.  pika's ``BlockingConnection`` has no timeout for a publisher-confirm wait (its
  ``socket_timeout`` and ``stack_timeout`` bound opening a connection only;
  ``blocked_connection_timeout`` only a broker's ``Connection.Blocked``; heartbeats notice a
  silent peer after the heartbeat plus 5 s at best), so the bounded relay bounds the wait with
  a timer of its own (SIGALRM), then drops the connection without the closing handshake and
  opens a new one (with ``stack_timeout``) once the broker answers.

:func:`backstop_trace` shows the backstop on its own: a relay that cannot end its transaction
itself (silent, or busy with short statements), and which setting makes the server end it.

``labkit trace broker-hang`` prints the result (:func:`broker_hang_command`).
"""

from __future__ import annotations

import re
import selectors
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import psycopg

from ..core.errors import LabkitError
from ..core.lab import Lab, advisory_key
from ..core.limits import number
from ..core.procs import Context, Worker
from ..core.queries import query
from ..core.results import Result
from . import broker as brokers
from . import relay
from ._checked import one_row
from .broker import Broker, BrokerDown, RabbitBroker, RecordingBroker

MAX_HANG_S = 30          # under RabbitMQ's default heartbeat (60 s) and the workers' guards
MAX_TIMEOUT_S = 10
MAX_ORDERS = 1000
HANG_MARGIN_S = 0.5      # the hang outlasts the deadline by this much at least
HANG_LOCK = "recording broker hangs"   # the purpose of the lab's advisory-lock key (Lab.advisory_key)
RETRY_PAUSE_S = 0.05     # between two failed "do you answer?" probes (each waits its own timeout)
SAMPLE_S = 0.05          # how often the lab reads pg_stat_activity
KINDS = ("unbounded", "bounded")
ROLES = {"unbounded": "hang-relay-u", "bounded": "hang-relay-b"}


def _sql(name: str) -> str:
    return query("hang.sql", name).sql


class PublishTimedOut(RuntimeError):
    """A publish waited for the broker's answer as long as it was allowed to.  The message
    may have reached the broker: only its answer is missing."""

    def __init__(self, event_id: str | None, waited_s: float, by: str):
        self.event_id, self.waited_s, self.by = event_id, waited_s, by
        what = f"publish of {event_id}" if event_id else "probe"
        super().__init__(f"{what}: no answer from the broker within {waited_s:g} s ({by})")


class DeadlinePassed(RuntimeError):
    """The tick's deadline passed before its batch was published and marked."""


# -- publishing with a timeout, per broker ------------------------------------------------------


@contextmanager
def _alarm(seconds: float, event_id: str | None, by: str) -> Iterator[None]:
    """Raise PublishTimedOut in this (the main) thread after ``seconds``: a timer of the
    relay's own, for a wait its broker client cannot bound.  The signal interrupts the wait
    wherever it is (Python runs the handler, and its exception ends the blocked call)."""
    def fire(signum, frame):
        raise PublishTimedOut(event_id, seconds, by)

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, old if old is not None else signal.SIG_DFL)


class _RecordingPublisher:
    """The recording broker, with a confirm: publish stores the message (its own autocommit
    connection: durable at once), then waits for the broker's answer, which the scripted hang
    holds back.  The timeout is that wait's statement_timeout, on the broker's session."""

    def __init__(self, spec: dict, role: str):
        self.broker = RecordingBroker(spec["dsn"], spec["schema"], role=role)
        self.params = {"key": advisory_key(spec["schema"], HANG_LOCK)}

    def _confirm(self, timeout_s: float | None, event_id: str | None, by: str) -> None:
        conn = self.broker.conn
        try:
            with conn.transaction():
                ms = f"{max(1, round(timeout_s * 1000))}ms" if timeout_s is not None else f"{2 * MAX_HANG_S}s"
                conn.execute(_sql("confirm_within"), {"ms": ms})
                conn.execute(_sql("confirm"), self.params)
        except psycopg.errors.QueryCanceled:
            raise PublishTimedOut(event_id, timeout_s or 0.0, by) from None

    def publish(self, event_id: str, body: dict, timeout_s: float | None, by: str) -> None:
        self.broker.publish(event_id, body)                 # stored: delivered from here on
        self._confirm(timeout_s, event_id, by)

    def probe(self, timeout_s: float) -> None:
        self._confirm(timeout_s, None, "probe")

    def close(self) -> None:
        self.broker.close()


class _RabbitPublisher:
    """RabbitMQ with publisher confirms (:class:`RabbitBroker`: ``confirm_delivery``, so a
    publish returns only once RabbitMQ has confirmed it, and raises on a nack or an
    unroutable message).  With a timeout, the confirm wait is bounded by the relay's own
    timer; a connection whose confirm timed out is dropped, and a new one opened by
    :meth:`probe` once the broker answers."""

    def __init__(self, spec: dict, role: str, bounded_s: float | None):
        self.url, self.queue = spec["url"], spec["queue"]
        if bounded_s is not None:      # opening a connection: pika's own timeouts bound it
            sep = "&" if "?" in self.url else "?"
            self.url += f"{sep}socket_timeout={bounded_s:g}&stack_timeout={bounded_s:g}"
        self.broker: RabbitBroker | None = RabbitBroker(self.url, self.queue)
        self.broker.depth()            # opens the channel (confirms on) while RabbitMQ answers

    def publish(self, event_id: str, body: dict, timeout_s: float | None, by: str) -> None:
        if self.broker is None:
            raise BrokerDown("no connection to RabbitMQ")
        if timeout_s is None:
            self.broker.publish(event_id, body)
            return
        try:
            with _alarm(timeout_s, event_id, by):
                self.broker.publish(event_id, body)
        except PublishTimedOut:
            self._drop()
            raise

    def probe(self, timeout_s: float) -> None:
        """A new connection and channel, and the queue's depth, within ``timeout_s``: the
        broker answers again."""
        self._drop()
        try:
            with _alarm(timeout_s + 0.5, None, "probe"):        # pika's stack_timeout comes first
                self.broker = RabbitBroker(self.url, self.queue)
                self.broker.depth()
        except Exception:          # no connection, no answer in time, or a refusal: not yet
            self._drop()
            raise PublishTimedOut(None, timeout_s, "probe") from None

    def _drop(self) -> None:
        """Forget the connection without the closing handshake (it would wait on the same
        silent broker): abort its socket, let pika notice, move on."""
        bk, self.broker = self.broker, None
        if bk is None:
            return
        conn = getattr(bk, "_conn", None)
        transport = getattr(getattr(conn, "_impl", None), "_transport", None)
        with suppress(Exception):
            if transport is not None:
                transport.abort()
            if conn is not None:
                with _alarm(0.2, None, "drop"):
                    conn.process_data_events(0)

    def close(self) -> None:
        if self.broker is not None:
            with suppress(Exception), _alarm(1.0, None, "close"):
                self.broker.close()


def _publisher(spec: dict, role: str, timeout_s: float | None):
    if spec["kind"] == "recording":
        return _RecordingPublisher(spec, role)
    return _RabbitPublisher(spec, role, timeout_s)


# -- the relay, in a process of its own ---------------------------------------------------------


def _settings_in_force(conn: psycopg.Connection) -> list:
    """The backstop settings in force in the relay's session (hang.sql's backstop_in_force)."""
    return list(one_row(conn.execute(_sql("backstop_in_force")), "hang.sql's backstop_in_force"))


def _broker_answers_probe(ctx: Context, pub, publish_timeout_s: float) -> bool:
    """Ask the broker once whether it answers and report it; False (after a pause) if not."""
    asked = time.monotonic()
    try:
        pub.probe(publish_timeout_s)
    except (PublishTimedOut, BrokerDown):
        ctx.emit("probe", ok=False, waited_s=time.monotonic() - asked)
        time.sleep(RETRY_PAUSE_S)
        return False
    ctx.emit("probe", ok=True, waited_s=time.monotonic() - asked)
    return True


def _set_backstop(ctx: Context, conn: psycopg.Connection, backstop_ms: str, whole: bool,
                  first_claim: bool) -> None:
    """SET LOCAL the server-side backstop in the open transaction; report it before the first claim."""
    conn.execute(_sql("backstop"), {"ms": backstop_ms})
    if whole:
        conn.execute(_sql("backstop_whole"), {"ms": backstop_ms})
    if first_claim:
        ctx.emit("backstop", settings=_settings_in_force(conn))


def _claim_batch(ctx: Context, conn: psycopg.Connection, kind: str, batch: int) -> list:
    """Claim up to ``batch`` outbox rows and report them; an empty outbox is an error."""
    rows = conn.execute(relay.CLAIM, {"batch": batch}).fetchall()
    if not rows:
        raise LabkitError(f"The {kind} relay found nothing to claim.",
                          "place the orders before letting the relays go.")
    ctx.emit("claimed", ids=[r[0] for r in rows], events=[r[1] for r in rows])
    return rows


def _publish_bound(ev: str, started: float, deadline_s: float,
                   publish_timeout_s: float) -> tuple[float, str]:
    """How long a bounded relay may wait for this publish, and which bound that is."""
    left = deadline_s - (time.monotonic() - started)
    if left <= 0:
        raise DeadlinePassed(f"the deadline of {deadline_s:g} s passed before {ev}")
    return ((publish_timeout_s, "publish timeout") if publish_timeout_s <= left
            else (left, "deadline"))


def _publish_claimed(ctx: Context, pub, rows: list, bounded: bool, started: float,
                     deadline_s: float, publish_timeout_s: float) -> None:
    """Publish each claimed row in turn (bounded: within the publish timeout and the deadline)."""
    for _, ev, body in rows:
        timeout: float | None = None
        by: str | None = None
        if bounded:
            timeout, by = _publish_bound(ev, started, deadline_s, publish_timeout_s)
        pub.publish(ev, body, timeout, by)
        ctx.emit("published", event_id=ev)


def _rollback_if_open(conn: psycopg.Connection) -> None:
    """ROLLBACK the connection's open transaction, if any, ignoring a failure to do so."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        with suppress(psycopg.Error):
            conn.execute("ROLLBACK")


def hang_relay_process(ctx: Context, *, dsn: str, schema: str, broker: dict, kind: str,
                       batch: int, publish_timeout_s: float, deadline_s: float) -> dict:
    """One relay (run by a Worker) that ticks until it has committed one batch.  ``kind``:
    "unbounded" (a publish waits as long as the broker is silent) or "bounded" (publish
    timeout, tick deadline, ROLLBACK past either; a server-side backstop on the
    transaction; after a rollback, no new claim until the broker answers a probe).

    It pauses at "ready" once connected and at "claimed" after its first claim, so that the
    lab can start the hang between the claim and the first publish.  It reports every
    transaction it ends ("transaction": outcome, seconds from BEGIN to the end of COMMIT or
    ROLLBACK)."""
    bounded = kind == "bounded"
    role = ROLES[kind]
    conn = relay.relay_connection(dsn, schema, role)
    pub = _publisher(broker, "hang-broker-" + kind[0], publish_timeout_s if bounded else None)
    ctx.emit("connected", pid=conn.info.backend_pid)
    ctx.pause("ready")
    backstop_ms = f"{round(2 * deadline_s * 1000)}ms"
    whole = conn.info.server_version >= 170000
    if bounded:     # the session's own bounds, before any transaction sets the backstop
        ctx.emit("session_settings", settings=_settings_in_force(conn))
    healthy, first_claim, committed = True, True, 0
    try:
        while not committed:
            if not healthy:
                if not _broker_answers_probe(ctx, pub, publish_timeout_s):
                    continue
                healthy = True
            started = time.monotonic()
            outcome, why = "committed", None
            conn.execute("BEGIN")
            try:
                if bounded:
                    _set_backstop(ctx, conn, backstop_ms, whole, first_claim)
                rows = _claim_batch(ctx, conn, kind, batch)
                if first_claim:
                    first_claim = False
                    ctx.pause("claimed")
                _publish_claimed(ctx, pub, rows, bounded, started, deadline_s, publish_timeout_s)
                if bounded and time.monotonic() - started > deadline_s:
                    raise DeadlinePassed(f"the deadline of {deadline_s:g} s passed before the mark")
                conn.execute(relay.MARK, {"ids": [r[0] for r in rows]})
                conn.execute("COMMIT")
                committed = len(rows)
                if bounded:     # after a COMMIT (a ROLLBACK would undo even a plain SET)
                    ctx.emit("after_commit", settings=_settings_in_force(conn))
            except (PublishTimedOut, DeadlinePassed, BrokerDown) as exc:
                conn.execute("ROLLBACK")
                outcome, why, healthy = "rolled back", str(exc), False
                if isinstance(exc, PublishTimedOut):
                    ctx.emit("publish_timeout", event_id=exc.event_id, waited_s=exc.waited_s, by=exc.by)
            except BaseException:
                _rollback_if_open(conn)
                raise
            ctx.emit("transaction", outcome=outcome, seconds=time.monotonic() - started, why=why)
        return {"committed": committed}
    finally:
        pub.close()
        conn.close()


# -- a network hang: a TCP proxy in the lab ------------------------------------------------------


class HangProxy:
    """A TCP proxy between the relays and RabbitMQ, run by a thread of the lab's process.

    ``hang(True)``: it keeps forwarding what the relays send, and holds what RabbitMQ sends
    back.  For a relay the broker has stopped answering: its frames arrive (RabbitMQ routes
    the message and confirms it), the confirm does not.  ``hang(False)`` sends what it held,
    in order.  A side that closes closes its peer."""

    def __init__(self, host: str, port: int):
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._peer: dict[socket.socket, socket.socket] = {}
        self._held: dict[socket.socket, bytearray] = {}     # relay side -> bytes held for it
        self._eof: set[socket.socket] = set()                # relay sides whose upstream closed while held
        self._upstream: set[socket.socket] = set()
        self._holding = False
        self._stop = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.listener, selectors.EVENT_READ)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._run, name="labkit-hang-proxy", daemon=True)
        self._thread.start()

    def url(self, amqp_url: str) -> str:
        """``amqp_url`` pointed at the proxy instead of RabbitMQ."""
        scheme, _, rest = amqp_url.partition("://")
        at = rest.rfind("@")
        userinfo, hostpart = (rest[:at + 1], rest[at + 1:]) if at >= 0 else ("", rest)
        host = re.match(r"(\[[^\]]*\]|[^/:?#]*)(:\d*)?(.*)$", hostpart, re.S)
        if host is None:            # every group may be empty: any text matches
            raise LabkitError("Cannot find the host in the AMQP URL.",
                              "write it as amqp://USER:PASSWORD@HOST:5672/VHOST.")
        tail = host.group(3)
        return f"{scheme}://{userinfo}127.0.0.1:{self.port}{tail}"

    def hang(self, on: bool) -> None:
        self._holding = bool(on)
        self._wake_w.send(b"x")

    def close(self) -> None:
        self._stop = True
        with suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(5)
        for s in list(self._peer) + [self.listener, self._wake_r, self._wake_w]:
            with suppress(OSError):
                s.close()
        self._peer.clear()
        self._sel.close()

    def __enter__(self) -> HangProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            for key, _ in self._sel.select(timeout=0.2):
                s = key.fileobj
                if s is self.listener:
                    with suppress(OSError):
                        self._accept()
                elif s is self._wake_r:
                    s.recv(4096)
                elif s in self._peer:
                    try:
                        self._forward(s)
                    except OSError:
                        self._close_pair(s)
            if not self._holding:
                self._flush()

    def _accept(self) -> None:
        client, _ = self.listener.accept()
        try:
            up = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            client.close()
            return
        up.settimeout(None)
        self._peer[client], self._peer[up] = up, client
        self._upstream.add(up)
        self._held[client] = bytearray()
        for s in (client, up):
            self._sel.register(s, selectors.EVENT_READ)

    def _forward(self, s: socket.socket) -> None:
        data = s.recv(65536)
        peer = self._peer[s]
        if s in self._upstream:                      # RabbitMQ -> relay
            if self._holding or self._held.get(peer):
                if data:
                    self._held[peer] += data
                else:
                    self._eof.add(peer)
                    self._sel.unregister(s)
                return
            if data:
                peer.sendall(data)
            else:
                self._close_pair(s)
        elif data:                                   # relay -> RabbitMQ: always through
            peer.sendall(data)
        else:
            self._close_pair(s)

    def _flush(self) -> None:
        for client in [c for c, buf in self._held.items() if buf or c in self._eof]:
            try:
                if self._held[client]:
                    client.sendall(bytes(self._held[client]))
                    self._held[client].clear()
                if client in self._eof:
                    self._close_pair(client)
            except OSError:
                self._close_pair(client)

    def _close_pair(self, s: socket.socket) -> None:
        for x in (s, self._peer.get(s)):
            if x is None:
                continue
            with suppress(KeyError, ValueError):
                self._sel.unregister(x)
            with suppress(OSError):
                x.close()
            self._peer.pop(x, None)
            self._held.pop(x, None)
            self._eof.discard(x)
            self._upstream.discard(x)


# -- the lab ---------------------------------------------------------------------------------------


def check_params(*, hang_s: Any = 3.0, publish_timeout_s: Any = 0.5, deadline_s: Any = 1.0,
                 orders: Any = 10, broker: Any = None) -> None:
    """The bounds of :func:`broker_hang_trace`'s parameters; a LabkitError names the fix."""
    number("hang_s", hang_s, above=True, high=MAX_HANG_S, unit=" s", example=3)
    number("publish_timeout_s", publish_timeout_s, above=True, high=MAX_TIMEOUT_S, unit=" s", example=0.5)
    number("deadline_s", deadline_s, above=True, high=MAX_TIMEOUT_S, unit=" s", example=1)
    number("orders", orders, low=1, high=MAX_ORDERS, whole=True, example=10)
    if hang_s < deadline_s + HANG_MARGIN_S:
        raise LabkitError(f"hang_s={hang_s:g} does not outlast deadline_s={deadline_s:g}: the bounded "
                          "relay would still be waiting when the broker answers again, and both relays "
                          "would look alike.",
                          f"use hang_s of at least deadline_s + {HANG_MARGIN_S:g} s "
                          f"(hang_s={max(3, deadline_s * 3):g}, say).")
    if broker is not None and not isinstance(broker, Broker) and broker not in ("recording", "rabbitmq"):
        raise LabkitError(f"No broker kind {broker!r}.", "use 'recording', 'rabbitmq', or None "
                          "(RabbitMQ when LABKIT_AMQP_URL is set).")


class _Hang:
    """The broker's hang, for one kind of broker: ``start()`` and ``end()``."""

    def __init__(self, lab: Lab, bk: Broker):
        self.kind = bk.kind
        self.proxy: HangProxy | None = None
        self.conn: psycopg.Connection | None = None
        self.params = {"key": lab.advisory_key(HANG_LOCK)}
        self.on = False
        if isinstance(bk, RabbitBroker):        # bk.kind == "rabbitmq"
            import pika

            params = pika.URLParameters(bk.url)
            self.proxy = HangProxy(params.host, params.port)
            self.spec = {"kind": "rabbitmq", "url": self.proxy.url(bk.url), "queue": bk.queue}
            self.how = ("network: the relays reach RabbitMQ through a TCP proxy in the lab, which "
                        "forwards what they send and holds what RabbitMQ answers")
        else:
            self.conn = lab.connect(role="hang-lock")
            self.spec = bk.spec()
            self.how = ("scripted: the recording broker stores each message, then its confirm waits "
                        "on an advisory lock the lab holds")

    def start(self) -> None:
        self.on = True
        if self.proxy:
            self.proxy.hang(True)
        else:
            self._lock_conn().execute(_sql("hang"), self.params)

    def end(self) -> None:
        if not self.on:
            return
        self.on = False
        if self.proxy:
            self.proxy.hang(False)
        else:
            self._lock_conn().execute(_sql("answer"), self.params)

    def _lock_conn(self) -> psycopg.Connection:
        """The connection that holds the recording broker's hang lock."""
        if self.conn is None:
            raise LabkitError("This hang has no lock connection: it is RabbitMQ's, through the proxy.",
                              "report this: a hang without a proxy opens its lock connection.")
        return self.conn

    def close(self) -> None:
        try:
            if self.proxy:
                self.proxy.close()
        finally:
            if self.conn is not None:
                self.conn.close()            # a lock still held goes with the session


@dataclass(frozen=True)
class HangStep(Result):
    """One thing that happened during the hang, for the timeline.

    t_s: seconds from the moment the broker stopped answering.
    who: ``broker``, ``unbounded relay`` or ``bounded relay``.
    what: what it did, in words.
    """

    t_s: float
    who: str
    what: str


@dataclass(frozen=True)
class BackstopSettings(Result):
    """The bounds the server applied to the bounded relay's session at one moment, as
    current_setting() reads them (``"0"``: off; None: not read, or no such setting on this
    server, as transaction_timeout before PostgreSQL 17).

    statement_timeout: the longest one statement may run (text, e.g. ``"2s"``).
    idle_in_transaction_session_timeout: the longest the session may sit idle inside a transaction.
    transaction_timeout: the longest a whole transaction may last (PostgreSQL 17 and later).
    """

    statement_timeout: str | None
    idle_in_transaction_session_timeout: str | None
    transaction_timeout: str | None


@dataclass(frozen=True)
class ServerBackstop(Result):
    """The server-side backstop the bounded relay sets on each transaction (SET LOCAL).

    settings: the settings that make it: ``["transaction_timeout"]`` on PostgreSQL 17 and
        later, else ``["statement_timeout", "idle_in_transaction_session_timeout"]``.
    seconds: the backstop, in seconds (twice the deadline).
    bounds: what it bounds, in words.
    in_force: the settings read inside the relay's first transaction.
    session: the settings its session had before its first transaction.
    after_commit: the settings read right after its COMMIT (the session's own again).
    """

    settings: list[str]
    seconds: float
    bounds: str
    in_force: BackstopSettings
    session: BackstopSettings
    after_commit: BackstopSettings


@dataclass(frozen=True)
class BrokerHang(Result):
    """Two relays, one without bounds and one with, while the broker stops answering
    (:func:`broker_hang_trace`).  Times are in seconds; each relay's ``transactions`` are
    ``(outcome, seconds)`` pairs, outcome ``committed`` or ``rolled back``, seconds from
    BEGIN to the end of its COMMIT or ROLLBACK.

    broker: the broker's kind (``recording`` or ``rabbitmq``).
    hang: how the hang was made, in words (``scripted: ...`` or ``network: ...``).
    hang_s: how long the broker stopped answering.
    publish_timeout_s: the bounded relay's publish timeout.
    deadline_s: the bounded relay's deadline for a whole tick.
    orders_per_relay: outbox rows each relay claimed (its batch).
    longest_transaction_s_unbounded: the unbounded relay's longest transaction, by its own clock.
    longest_transaction_s_bounded: the bounded relay's longest transaction, by its own clock.
    server_saw_longest_s_unbounded: the unbounded relay's longest transaction as the server saw
        it (pg_stat_activity.xact_start, sampled every 50 ms).
    server_saw_longest_s_bounded: the same for the bounded relay.
    locks_held_while_hung_unbounded: outbox rows the unbounded relay held locked at the hang's end.
    locks_held_while_hung_bounded: outbox rows the bounded relay held locked at the hang's end.
    backend_state_while_hung_unbounded: pg_stat_activity.state of the unbounded relay's session at
        the hang's end (``idle in transaction``; None if not seen).
    transactions_unbounded: each transaction of the unbounded relay, in order.
    transactions_bounded: each transaction of the bounded relay, in order.
    gave_up_by: what ended the bounded relay's first tick: ``publish timeout`` or ``deadline``
        (None: nothing did).
    probes_failed: "do you answer?" probes of the bounded relay that the silent broker left
        unanswered.
    broker_messages: messages the broker holds at the end.
    duplicates_after_recovery_unbounded: extra copies the consumer received of the unbounded
        relay's events.
    duplicates_after_recovery_bounded: the same for the bounded relay's events.
    duplicated_events: event ids the consumer received more than once.
    lost: events marked published that the consumer never received.
    unpublished_at_end: outbox rows still unpublished at the end.
    consumer_applied: labels the consumer printed (each event applied once, by event_id).
    orders_applied_twice: orders the consumer applied more than once.
    server_backstop: the bounded relay's server-side backstop (:class:`ServerBackstop`).
    timeline: what happened, in order (:class:`HangStep`).
    """

    broker: str
    hang: str
    hang_s: float
    publish_timeout_s: float
    deadline_s: float
    orders_per_relay: int
    longest_transaction_s_unbounded: float
    longest_transaction_s_bounded: float
    server_saw_longest_s_unbounded: float
    server_saw_longest_s_bounded: float
    locks_held_while_hung_unbounded: int
    locks_held_while_hung_bounded: int
    backend_state_while_hung_unbounded: str | None
    transactions_unbounded: list[tuple[str, float]]
    transactions_bounded: list[tuple[str, float]]
    gave_up_by: str | None
    probes_failed: int
    broker_messages: int
    duplicates_after_recovery_unbounded: int
    duplicates_after_recovery_bounded: int
    duplicated_events: list[str]
    lost: int
    unpublished_at_end: int
    consumer_applied: int
    orders_applied_twice: int
    server_backstop: ServerBackstop
    timeline: list[HangStep]


def broker_hang_trace(lab: Lab, *, hang_s: float = 3.0, publish_timeout_s: float = 0.5,
                      deadline_s: float = 1.0, broker: Broker | str | None = None,
                      orders: int = 10) -> BrokerHang:
    """Two relay processes claim ``orders`` rows each (disjoint: SKIP LOCKED); the broker
    hangs for ``hang_s`` right after both claims; one relay has no bounds, the other a
    publish timeout, a tick deadline and a server-side backstop.  ``broker``: a Broker, a
    kind ("recording", "rabbitmq"), or None (RabbitMQ when LABKIT_AMQP_URL is set).

    Returns a :class:`BrokerHang`: each relay's transactions, as it timed them and as the
    server saw them, the rows each held locked while the broker was silent, the duplicates and
    losses the consumer saw, the bounded relay's server-side backstop, and the timeline."""
    check_params(hang_s=hang_s, publish_timeout_s=publish_timeout_s, deadline_s=deadline_s,
                 orders=orders, broker=broker)
    with brokers.used_by(lab, broker) as bk:
        return _run(lab, bk, hang_s, publish_timeout_s, deadline_s, orders)


def _run(lab: Lab, bk: Broker, hang_s: float, publish_timeout_s: float, deadline_s: float,
         orders: int) -> BrokerHang:
    hang = _Hang(lab, bk)
    workers: dict[str, Worker] = {}
    watch: psycopg.Connection | None = None
    try:
        for kind in KINDS:      # both start now: their start-up overlaps, each pauses when connected
            workers[kind] = Worker(hang_relay_process, name=f"{kind} relay", dsn=lab.db.dsn,
                                   schema=lab.schema, broker=hang.spec, kind=kind, batch=orders,
                                   publish_timeout_s=publish_timeout_s, deadline_s=deadline_s).start()
        bk.reset()
        relay.create_outbox(lab)
        relay.place_orders(lab, 2 * orders)
        watch = lab.connect(role="hang-watch")
        pids = {k: w.wait_for("connected", timeout=60)["pid"] for k, w in workers.items()}
        claims = {}
        for kind in KINDS:      # the unbounded relay claims first, the bounded one the next rows
            w = workers[kind]
            w.wait_for("paused", tag="ready", timeout=60)
            w.resume()
            claims[kind] = w.wait_for("claimed", timeout=60)["events"]
            w.wait_for("paused", tag="claimed", timeout=60)
        hang.start()
        t0 = time.monotonic()
        timeline = [HangStep(t_s=0.0, who="broker", what=f"stops answering for {hang_s:g} s")]
        for w in workers.values():
            w.resume()
        seen: dict[int, dict] = {pid: {"longest": 0.0} for pid in pids.values()}

        def sample() -> dict[int, tuple]:
            rows = watch.execute(_sql("relay_transactions"), {"pids": list(pids.values())}).fetchall()
            for pid, _state, open_s, _locked in rows:
                if open_s is not None:
                    seen[pid]["longest"] = max(seen[pid]["longest"], open_s)
            for w in workers.values():
                w.poll()
            return {pid: (state, locked) for pid, state, _, locked in rows}

        while time.monotonic() - t0 < hang_s - SAMPLE_S:
            sample()
            time.sleep(SAMPLE_S)
        at_end = sample()                        # the hang's last moment
        time.sleep(max(0.0, t0 + hang_s - time.monotonic()))
        hang.end()
        timeline.append(HangStep(t_s=round(time.monotonic() - t0, 3), who="broker", what="answers again"))
        deadline = time.monotonic() + 60
        while any(w.alive for w in workers.values()) and time.monotonic() < deadline:
            sample()
            time.sleep(SAMPLE_S)
        for w in workers.values():
            w.join(10)                           # raises the relay's own failure, if any
        depth = bk.depth()
        delivered = relay.consume(lab, bk)
        return _result(lab, watch, workers, pids, seen, at_end, claims, delivered, depth, t0, timeline,
                       hang, hang_s, publish_timeout_s, deadline_s, orders)
    finally:
        for w in workers.values():           # first, so that no relay moves on when the hang ends
            w.kill()
        try:
            hang.end()
        except psycopg.Error:
            pass
        finally:
            hang.close()
            if watch is not None:
                watch.close()


def _transactions(ev: dict) -> dict:
    """Each relay's transactions, in order: (outcome, seconds)."""
    return {k: [(e["outcome"], round(e["seconds"], 3)) for e in ev[k] if e["kind"] == "transaction"]
            for k in KINDS}


def _delivery_counts(delivered: list) -> dict[str, int]:
    """How many times the consumer received each event_id."""
    counts: dict[str, int] = {}
    for e in delivered:
        counts[e] = counts.get(e, 0) + 1
    return counts


def _duplicates(claims: dict, counts: dict[str, int]) -> dict[str, int]:
    """Per relay: extra deliveries of the events it claimed."""
    return {k: sum(counts.get(e, 0) - 1 for e in claims[k] if counts.get(e, 0) > 1) for k in KINDS}


def _first_settings(events: list, kind: str) -> list:
    """The settings of the first event of this kind ([None] * 3 if there is none)."""
    return next((e["settings"] for e in events if e["kind"] == kind), [None] * 3)


def _step_text(e: dict) -> str | None:
    """A relay event as a line of the timeline (None: not shown)."""
    if e["kind"] == "transaction":
        return f"{e['outcome'].upper()} after {e['seconds']:.2f} s"
    if e["kind"] == "publish_timeout":
        return (f"publish of {e['event_id']}: no answer within "
                f"{e['waited_s']:g} s ({e['by']}) -> ROLLBACK")
    if e["kind"] == "probe":
        return "the broker answers a probe: claim again" if e["ok"] else None
    return None


def _add_relay_steps(timeline: list, ev: dict, t0: float) -> None:
    """Add each relay's steps since ``t0`` to the timeline, then sort it by time."""
    for kind in KINDS:
        for e in ev[kind]:
            what = _step_text(e)
            if what and e["t"] >= t0:
                timeline.append(HangStep(t_s=round(e["t"] - t0, 3), who=f"{kind} relay", what=what))
    timeline.sort(key=lambda x: x.t_s)


def _server_backstop(settings: list, session: list, after: list, deadline_s: float) -> ServerBackstop:
    """The bounded relay's server-side backstop: which settings, their bound, and what was in force."""
    whole = settings[2] not in (None, "0")
    return ServerBackstop(
        settings=["transaction_timeout"] if whole else
                 ["statement_timeout", "idle_in_transaction_session_timeout"],
        seconds=2 * deadline_s,
        bounds="the whole transaction" if whole else "each statement and each idle gap, not their sum",
        in_force=BackstopSettings(*settings),
        session=BackstopSettings(*session),
        after_commit=BackstopSettings(*after),
    )


def _result(lab, watch, workers, pids, seen, at_end, claims, delivered, depth, t0, timeline, hang,
            hang_s, publish_timeout_s, deadline_s, orders) -> BrokerHang:
    ev = {k: w.events for k, w in workers.items()}
    tx = _transactions(ev)
    counts = _delivery_counts(delivered)
    dup = _duplicates(claims, counts)
    lost = [r[0] for r in watch.execute(query("outbox_lab.sql", "lost_events").sql).fetchall()]
    unpublished = watch.execute("SELECT count(*) FROM outbox WHERE published_at IS NULL").fetchone()[0]
    applied, twice = watch.execute(query("outbox_lab.sql", "labels_printed").sql).fetchone()
    timeouts = [e for e in ev["bounded"] if e["kind"] == "publish_timeout"]
    probes = [e for e in ev["bounded"] if e["kind"] == "probe"]
    settings, session, after = (_first_settings(ev["bounded"], kind)
                                for kind in ("backstop", "session_settings", "after_commit"))
    _add_relay_steps(timeline, ev, t0)
    unbounded, bounded = (at_end.get(pids[k], (None, 0)) for k in KINDS)
    return BrokerHang(
        broker=hang.kind,
        hang=hang.how,
        hang_s=hang_s, publish_timeout_s=publish_timeout_s, deadline_s=deadline_s,
        orders_per_relay=orders,
        longest_transaction_s_unbounded=max(s for _, s in tx["unbounded"]),
        longest_transaction_s_bounded=max(s for _, s in tx["bounded"]),
        server_saw_longest_s_unbounded=round(seen[pids["unbounded"]]["longest"], 3),
        server_saw_longest_s_bounded=round(seen[pids["bounded"]]["longest"], 3),
        locks_held_while_hung_unbounded=unbounded[1],
        locks_held_while_hung_bounded=bounded[1],
        backend_state_while_hung_unbounded=unbounded[0],
        transactions_unbounded=tx["unbounded"],
        transactions_bounded=tx["bounded"],
        gave_up_by=timeouts[0]["by"] if timeouts else None,
        probes_failed=sum(1 for p in probes if not p["ok"]),
        broker_messages=depth,
        duplicates_after_recovery_unbounded=dup["unbounded"],
        duplicates_after_recovery_bounded=dup["bounded"],
        duplicated_events=sorted(e for e, n in counts.items() if n > 1),
        lost=len(lost),
        unpublished_at_end=unpublished,
        consumer_applied=int(applied),
        orders_applied_twice=twice,
        server_backstop=_server_backstop(settings, session, after, deadline_s),
        timeline=timeline,
    )


# -- the server-side backstop, on its own --------------------------------------------------------


BACKSTOP_CASES = (
    ("silent", False),       # stuck where its own timer cannot reach it: idle in transaction
    ("busy", False),         # short statements back to back, with the pre-17 pair only
    ("busy", True),          # the same, with transaction_timeout (PostgreSQL 17 and later)
)


@dataclass(frozen=True)
class BackstopCase(Result):
    """One case of :func:`backstop_trace`: a relay that cannot end its transaction itself, and
    whether the server ended it.  Every field after ``ran`` is None when it did not run.

    relay: how the relay behaves: ``silent`` (idle in transaction) or ``busy`` (short
        statements back to back).
    backstop: the settings set in its transaction (SET LOCAL), all at the backstop's value.
    ran: False when this server has no such setting (transaction_timeout before PostgreSQL 17).
    claimed: outbox rows its transaction claimed.
    rows_locked: outbox rows its transaction held locked while it ran.
    ended_by_server: True if the server ended its session.
    transaction_s: seconds from its BEGIN to the session's end, or to its own ROLLBACK.
    sqlstate: the SQLSTATE its connection reported (``25P03``, ``25P04``; None: none, or a
        closed connection read without the server's message).
    error: the first line of the error its connection reported (None: none, or no message).
    claimable_after: rows another relay's SKIP LOCKED claim got at the end, before any
        ROLLBACK of the relay's own.
    """

    relay: str
    backstop: list[str]
    ran: bool
    claimed: int | None = None
    rows_locked: int | None = None
    ended_by_server: bool | None = None
    transaction_s: float | None = None
    sqlstate: str | None = None
    error: str | None = None
    claimable_after: int | None = None


@dataclass(frozen=True)
class BackstopTrace(Result):
    """The server-side backstop on its own (:func:`backstop_trace`).

    server_version_num: the server's version number (``170004``: 17.4).
    backstop_s: the backstop's value, in seconds.
    busy_s: how long the busy relay keeps its transaction going, in seconds.
    step_s: each of the busy relay's statements, in seconds.
    rows: outbox rows each relay claims.
    cases: the three cases, in :data:`BACKSTOP_CASES`' order (:class:`BackstopCase`).
    """

    server_version_num: int
    backstop_s: float
    busy_s: float
    step_s: float
    rows: int
    cases: list[BackstopCase]


def backstop_trace(lab: Lab, *, backstop_s: float = 0.5, busy_s: float = 1.5, step_s: float = 0.1,
                   rows: int = 5) -> BackstopTrace:
    """The bounded relay's server-side backstop on its own: what the server ends when the relay
    cannot end its transaction itself.  Each case is one session that opens a transaction, sets
    the backstop (``backstop_s``, SET LOCAL: hang.sql's ``backstop``, and ``backstop_whole``
    where the case says so), claims ``rows`` outbox rows, and then:

    * ``silent``: sends nothing more -- a relay stuck where its own timer cannot interrupt it
      (a call that ignores signals, a stopped process): its session is idle in transaction.
    * ``busy``: runs ``SELECT pg_sleep(step_s)`` back to back for ``busy_s`` -- a relay that
      keeps talking to the server while its tick never ends: no statement and no idle gap
      reaches the backstop, only their sum does.  If the server lets it run, it rolls back
      itself at ``busy_s``.

    The ``busy`` case with ``transaction_timeout`` runs on PostgreSQL 17 and later only.
    Returns a :class:`BackstopTrace`, one :class:`BackstopCase` per case."""
    number("backstop_s", backstop_s, above=True, high=MAX_TIMEOUT_S, unit=" s", example=0.5)
    number("busy_s", busy_s, above=True, high=MAX_HANG_S, unit=" s", example=1.5)
    number("step_s", step_s, above=True, high=MAX_TIMEOUT_S, unit=" s", example=0.1)
    number("rows", rows, low=1, high=MAX_ORDERS, whole=True, example=5)
    if busy_s < 2 * backstop_s or step_s * 2 > backstop_s:
        raise LabkitError(f"busy_s={busy_s:g}, step_s={step_s:g} and backstop_s={backstop_s:g} do not "
                          "tell the backstops apart: the busy relay must outlast the backstop, and each "
                          "of its statements must be shorter than it.",
                          "use busy_s of at least twice backstop_s and step_s of at most half of it "
                          "(backstop_s=0.5, busy_s=1.5, step_s=0.1, say).")
    relay.create_outbox(lab)
    relay.place_orders(lab, rows)
    ms = f"{round(backstop_s * 1000)}ms"
    with lab.connect(role="hang-watch") as watch:
        version = watch.info.server_version
        cases = []
        for behaviour, whole in BACKSTOP_CASES:
            names = ["statement_timeout", "idle_in_transaction_session_timeout"] + (
                ["transaction_timeout"] if whole else [])
            ran = not whole or version >= 170000
            measured = _backstop_case(lab, watch, behaviour, whole, ms, busy_s, step_s, rows) if ran else {}
            cases.append(BackstopCase(relay=behaviour, backstop=names, ran=ran, **measured))
    return BackstopTrace(server_version_num=version, backstop_s=backstop_s, busy_s=busy_s,
                         step_s=step_s, rows=rows, cases=cases)


def _claimable(watch: psycopg.Connection, rows: int) -> int:
    """How many rows another relay's claim gets now (it rolls back at once)."""
    with watch.transaction(force_rollback=True):
        return len(watch.execute(relay.CLAIM, {"batch": rows}).fetchall())


def _backstop_case(lab: Lab, watch: psycopg.Connection, behaviour: str, whole: bool, ms: str,
                   busy_s: float, step_s: float, rows: int) -> dict[str, Any]:
    """One case run: the measured fields of :class:`BackstopCase`."""
    with lab.connect(role=f"hang-backstop-{behaviour[0]}") as conn:
        pid = conn.info.backend_pid
        started = time.monotonic()
        conn.execute("BEGIN")
        conn.execute(_sql("backstop"), {"ms": ms})
        if whole:
            conn.execute(_sql("backstop_whole"), {"ms": ms})
        claimed = len(conn.execute(relay.CLAIM, {"batch": rows}).fetchall())
        locked = one_row(watch.execute(_sql("relay_transactions"), {"pids": [pid]}),
                         "hang.sql's relay_transactions")[3]
        ended_s, exc = None, None
        if behaviour == "silent":
            while time.monotonic() - started < busy_s:
                if not watch.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchall():
                    ended_s = time.monotonic() - started
                    break
                time.sleep(0.02)
            try:                                    # the relay comes back and finds out
                conn.execute("SELECT 1")
            except psycopg.Error as e:
                exc = e
        else:
            while time.monotonic() - started < busy_s:
                try:
                    conn.execute("SELECT pg_sleep(%s)", (step_s,))
                except psycopg.Error as e:
                    ended_s, exc = time.monotonic() - started, e
                    break
        claimable = _claimable(watch, rows)
        own_s = None
        if ended_s is None and not conn.broken:
            conn.execute("ROLLBACK")
            own_s = time.monotonic() - started
    took = ended_s if ended_s is not None else own_s
    if took is None:
        raise LabkitError(f"The {behaviour} relay's session ended after the {busy_s:g} s watch and "
                          "before its own ROLLBACK: how long its transaction lasted is not known.",
                          "run it again; on a loaded machine, pass a longer busy_s.")
    msg = str(exc).strip().splitlines()[0] if exc is not None and str(exc).strip() else None
    return {"claimed": claimed, "rows_locked": locked, "ended_by_server": ended_s is not None,
            "transaction_s": round(took, 3),
            "sqlstate": getattr(exc, "sqlstate", None), "error": msg, "claimable_after": claimable}


# -- command line --------------------------------------------------------------------------------


def report(r: BrokerHang) -> str:
    """The result as a few lines of text."""
    dup = ", ".join(r.duplicated_events) or "none"
    lines = [
        f"Broker hang of {r.hang_s:g} s ({r.broker} broker, {r.hang.split(':')[0]} hang)",
        f"  {'':22}{'longest transaction':>22}{'server saw':>12}{'rows locked at hang end':>26}{'duplicates':>12}",
    ]
    rows = {"unbounded": (r.longest_transaction_s_unbounded, r.server_saw_longest_s_unbounded,
                          r.locks_held_while_hung_unbounded, r.duplicates_after_recovery_unbounded),
            "bounded": (r.longest_transaction_s_bounded, r.server_saw_longest_s_bounded,
                        r.locks_held_while_hung_bounded, r.duplicates_after_recovery_bounded)}
    for kind in KINDS:
        longest, saw, locked, dups = rows[kind]
        lines.append(f"  {kind + ' relay':22}{longest:>20.2f} s{saw:>10.2f} s{locked:>26}{dups:>12}")
    b = r.server_backstop
    lines += [
        f"  bounded relay: publish timeout {r.publish_timeout_s:g} s, deadline {r.deadline_s:g} s; "
        f"gave up by: {r.gave_up_by or 'nothing'}",
        f"  server backstop: {' + '.join(b.settings)} = {b.seconds:g} s",
        f"  duplicated events: {dup}; lost: {r.lost}; labels printed {r.consumer_applied}, "
        f"orders applied twice {r.orders_applied_twice}",
    ]
    return "\n".join(lines)


def broker_hang_command(*, open_lab: Callable[[], Lab], hang_s: float = 3.0, publish_timeout_s: float = 0.5,
                        deadline_s: float = 1.0, broker: str | None = None, orders: int = 10,
                        json: bool = False) -> int:
    """``labkit trace broker-hang [--hang-s 3] [--publish-timeout-s 0.5] [--deadline-s 1]
    [--broker recording|rabbitmq] [--orders 10] [--json]``: :func:`broker_hang_trace`, as text
    or JSON."""
    check_params(hang_s=hang_s, publish_timeout_s=publish_timeout_s, deadline_s=deadline_s,
                 orders=orders, broker=broker)
    with open_lab() as lab:
        r = broker_hang_trace(lab, hang_s=hang_s, publish_timeout_s=publish_timeout_s,
                              deadline_s=deadline_s, broker=broker, orders=orders)
    print(r.to_json() if json else report(r))
    return 0
