"""Message brokers for the outbox relay: a recording broker (the default) and RabbitMQ.

Both live outside the relay's process and outside its database transaction, so a
publish that returned is kept even when the relay rolls back or is killed with
SIGKILL a moment later:

* :class:`RecordingBroker` keeps its messages in a table of the lab's schema and
  writes it only over its own autocommit connection (never the relay's).  Fully
  deterministic; needs nothing but PostgreSQL.
* :class:`RabbitBroker` publishes to a real RabbitMQ queue with publisher confirms
  (``pika``); used when ``LABKIT_AMQP_URL`` is set.

A broker is rebuilt in a child process from :meth:`Broker.spec` (a plain dict), so
the relay process opens its own connection to the same broker.  Every broker has a
power switch (:meth:`Broker.set_up`) for the "broker down" lab: a real refusal by the
broker, seen by the relay as :class:`BrokerDown` from ``publish``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from psycopg import sql
from psycopg.types.json import Jsonb

from ..core.db import WORKER_GUARDS, open_connection, redact
from ..core.errors import LabkitError
from ..core.lab import Lab
from ..core.queries import query
from ._checked import one_row

if TYPE_CHECKING:
    from pika.adapters.blocking_connection import BlockingChannel

AMQP_ENV = "LABKIT_AMQP_URL"


class BrokerDown(RuntimeError):
    """The broker did not accept a message (it is down, or refused it)."""


class Broker:
    """What the relay and the consumer need from a broker."""

    kind = "broker"

    def publish(self, event_id: str, body: dict) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def depth(self) -> int:
        """Messages the broker holds that no consumer has taken yet."""
        raise NotImplementedError

    def take_all(self) -> list[tuple[str, dict]]:
        """Deliver every held message once, in arrival order: (event_id, body) pairs."""
        raise NotImplementedError

    def set_up(self, up: bool) -> None:
        """Switch the broker on or off (off: every publish raises BrokerDown)."""
        raise NotImplementedError

    def spec(self) -> dict:
        """A picklable description from which :func:`from_spec` rebuilds this broker."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def reset(self) -> Broker:
        """Start empty and switched on."""
        raise NotImplementedError

    def discard(self) -> None:
        """Remove what the broker created outside the lab's schema (a RabbitMQ queue)."""

    def close(self) -> None:
        pass

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- the recording broker --------------------------------------------------------------


class RecordingBroker(Broker):
    """Messages in the table ``broker_message``, written over the broker's own connection."""

    kind = "recording"
    SQL = "outbox_recording_broker.sql"

    def __init__(self, dsn: str, schema: str, *, role: str = "broker", wait_for_disk: bool = True):
        self.dsn, self.schema, self.wait_for_disk = dsn, schema, wait_for_disk
        self.conn = open_connection(dsn, schema=schema, role=role, guards=WORKER_GUARDS)
        if not wait_for_disk:
            # a publish commits without waiting for its WAL flush: kept through any client's
            # death, not through a crash of the server (unless a later commit that waited for
            # its flush, such as the relay's marks in the same log, came after it)
            self.conn.execute("SET synchronous_commit = off")

    @classmethod
    def for_lab(cls, lab: Lab) -> RecordingBroker:
        return cls(lab.db.dsn, lab.schema)

    def reset(self) -> RecordingBroker:
        # the lab's own tables only, never a namesake further along the search_path
        self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {s}.broker_message, {s}.broker_switch")
                          .format(s=sql.Identifier(self.schema)))
        for statement in query(self.SQL, "create").statements:
            self.conn.execute(statement)
        return self

    def publish(self, event_id: str, body: dict) -> None:
        cur = self.conn.execute(query(self.SQL, "publish").sql, {"event_id": event_id, "body": Jsonb(body)})
        if cur.rowcount != 1:
            raise BrokerDown(f"recording broker is down: {event_id} not accepted")

    def depth(self) -> int:
        return one_row(self.conn.execute(query(self.SQL, "depth").sql), f"{self.SQL}'s depth")[0]

    def take_all(self) -> list[tuple[str, dict]]:
        rows = self.conn.execute(query(self.SQL, "take_all").sql).fetchall()
        return [(e, b) for _, e, b in sorted(rows)]

    def set_up(self, up: bool) -> None:
        self.conn.execute(query(self.SQL, "switch").sql, {"up": bool(up)})

    def spec(self) -> dict:
        return {"kind": self.kind, "dsn": self.dsn, "schema": self.schema, "wait_for_disk": self.wait_for_disk}

    def describe(self) -> str:
        return "recording broker: table broker_message, written over its own autocommit connection"

    def close(self) -> None:
        if not self.conn.closed:
            self.conn.close()


# -- RabbitMQ ---------------------------------------------------------------------------


def queue_name(schema: str, dsn: str) -> str:
    """The lab's RabbitMQ queue: its schema, and which server it is on (so that two servers'
    labs of one name never share a queue), hashed from the DSN without its password, which
    must not leak even as a hash."""
    return f"labkit.{schema}.{hashlib.sha1(redact(dsn).encode()).hexdigest()[:8]}"


class RabbitBroker(Broker):
    """A RabbitMQ queue behind a direct exchange; publisher confirms on.

    ``set_up(False)`` deletes the exchange (the queue and its messages stay), so the
    relay's next publish is refused by RabbitMQ itself (404 NOT_FOUND); ``set_up(True)``
    declares it and its binding again.
    """

    kind = "rabbitmq"
    ROUTING_KEY = "outbox"

    def __init__(self, url: str, queue: str):
        try:
            import pika
        except ImportError:
            raise LabkitError("LABKIT_AMQP_URL is set, but the RabbitMQ client (pika) is not installed.",
                              "pip install 'labkit[rabbitmq]' (a checkout: pip install -e '.[rabbitmq]'), "
                              "or unset LABKIT_AMQP_URL to use the recording broker.") from None

        self.url, self.queue, self.exchange = url, queue, queue + ".x"
        self._ch: BlockingChannel | None = None
        try:
            params = pika.URLParameters(url)
        except Exception:  # a URL pika cannot read: its message may quote any part of it
            params = None
        if params is None or not params.host:
            raise LabkitError(f"{AMQP_ENV} is not a URL RabbitMQ can be reached at ({_redact_amqp(url)}).",
                              "write it as amqp://USER:PASSWORD@HOST:5672/VHOST, with any @ : / ? # "
                              "or % in the password percent-encoded (%40 %3A %2F %3F %23 %25).")
        try:
            self._conn = pika.BlockingConnection(params)
        except Exception as exc:  # pika raises several kinds
            why = hide_amqp_secrets(f"{type(exc).__name__}: {exc}", url, params)
            raise LabkitError(f"Cannot reach RabbitMQ at {_redact_amqp(url)} ({why}).",
                              f"start RabbitMQ, fix {AMQP_ENV}, or unset it to use the recording "
                              "broker.") from None

    def __repr__(self) -> str:
        return f"RabbitBroker({_redact_amqp(self.url)!r}, queue={self.queue!r})"

    @classmethod
    def for_lab(cls, lab: Lab, url: str) -> RabbitBroker:
        return cls(url, queue_name(lab.schema, lab.db.dsn))

    def _channel(self) -> BlockingChannel:
        if self._ch is None or not self._ch.is_open:
            self._ch = self._conn.channel()
            self._ch.confirm_delivery()
        return self._ch

    def reset(self) -> RabbitBroker:
        ch = self._channel()
        ch.queue_declare(self.queue, durable=False, auto_delete=False)
        ch.queue_purge(self.queue)
        self.set_up(True)
        return self

    def publish(self, event_id: str, body: dict) -> None:
        import pika

        try:
            self._channel().basic_publish(
                self.exchange, self.ROUTING_KEY, json.dumps(body).encode(),
                properties=pika.BasicProperties(message_id=event_id, content_type="application/json"),
                mandatory=True)
        except pika.exceptions.AMQPError as exc:
            self._ch = None
            raise BrokerDown(f"RabbitMQ refused {event_id}: {exc!r}") from None

    def depth(self) -> int:
        return self._channel().queue_declare(self.queue, passive=True).method.message_count

    def take_all(self) -> list[tuple[str, dict]]:
        ch = self._channel()
        out: list[tuple[str, dict]] = []
        while True:
            method, props, body = ch.basic_get(self.queue, auto_ack=True)
            if method is None:
                return out
            out.append((props.message_id, json.loads(body)))

    def set_up(self, up: bool) -> None:
        ch = self._channel()
        if up:
            ch.exchange_declare(self.exchange, "direct", durable=False)
            ch.queue_bind(self.queue, self.exchange, self.ROUTING_KEY)
        else:
            ch.exchange_delete(self.exchange)

    def spec(self) -> dict:
        return {"kind": self.kind, "url": self.url, "queue": self.queue}

    def describe(self) -> str:
        return f"RabbitMQ at {_redact_amqp(self.url)}, queue {self.queue}"

    def discard(self) -> None:
        """Remove the queue and its exchange from RabbitMQ."""
        ch = self._channel()
        ch.exchange_delete(self.exchange)
        ch.queue_delete(self.queue)

    def close(self) -> None:
        try:
            if self._conn.is_open:
                self._conn.close()
        except Exception:
            pass


def _redact_amqp(url: str) -> str:
    """An AMQP URL safe to print: whatever could be a password is replaced by ***.

    Done on the text, not on a URL parser's reading, so that it also holds for a password
    with an unescaped ``@``, ``/`` or ``:`` (a parser splits those into a short password and
    a host or path holding the rest) and for text that is no URL at all."""
    import re

    text = url.strip()
    m = re.match(r"^([a-z][a-z0-9+.-]*://)(.*)$", text, re.I | re.S)
    scheme, rest = (m.group(1), m.group(2)) if m else ("", text)
    at = rest.rfind("@")
    if at >= 0:
        userinfo, host = rest[:at], rest[at + 1:]
        user = userinfo.split(":", 1)[0]
        user = user if re.fullmatch(r"[\w.%+-]*", user) else "***"
        if ":" in userinfo:
            rest = f"{user}:***@{host}"
        elif "@" in userinfo:
            rest = f"***@{host}"
        else:
            rest = f"{user}@{host}"
    elif not m:
        return "***"                      # not a URL: nothing in it is safe to show
    else:
        # no '@': a 'host:port' whose port is not a number may be 'user:password' missing
        # its host
        authority, slash, path = rest.partition("/")
        if not authority.startswith("[") and ":" in authority and \
                not authority.split(":", 1)[1].isdigit():
            rest = authority.split(":", 1)[0] + ":***"      # and whatever followed it
    # a password in the query string (?password=...)
    rest = re.sub(r"([?&;]password=)[^&;#]*", r"\1***", rest, flags=re.I)
    return scheme + rest


def hide_amqp_secrets(text: str, url: str, params: Any = None) -> str:
    """``text`` with every piece of ``url`` that may be a password replaced by ***."""
    from urllib.parse import unquote

    found: set[str] = set()
    rest = url.split("://", 1)[-1]
    if "@" in rest:
        userinfo = rest[:rest.rfind("@")]
        secret = userinfo.split(":", 1)[1] if ":" in userinfo else userinfo
        found.update({secret, unquote(secret)})
        for sep in "@/:?#":
            found.update(secret.split(sep))
    password = getattr(getattr(params, "credentials", None), "password", None)
    if password:
        found.add(password)
    for piece in sorted((f for f in found if len(f) >= 3), key=len, reverse=True):
        text = text.replace(piece, "***")
    return text


# -- choosing one -------------------------------------------------------------------------


def for_lab(lab: Lab, kind: str | None = None) -> Broker:
    """The lab's broker, empty and switched on: RabbitMQ when ``LABKIT_AMQP_URL`` is set
    (or ``kind="rabbitmq"``), else the recording broker."""
    url = os.environ.get(AMQP_ENV, "").strip()
    kind = kind or ("rabbitmq" if url else "recording")
    if kind == "recording":
        return RecordingBroker.for_lab(lab).reset()
    if kind == "rabbitmq":
        if not url:
            raise LabkitError("The RabbitMQ broker was asked for, but LABKIT_AMQP_URL is not set.",
                              "set LABKIT_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/ or use the "
                              "recording broker.")
        return RabbitBroker.for_lab(lab, url).reset()
    raise LabkitError(f"No broker kind {kind!r}.", "use 'recording' or 'rabbitmq'.")


@contextmanager
def used_by(lab: Lab, broker: Broker | str | None, *, reset: bool = False) -> Iterator[Broker]:
    """The broker a lab function works with: the caller's Broker (emptied first when
    ``reset``), or else the lab's own -- of the kind ``broker`` names, or :func:`for_lab`'s
    choice when None -- discarded and closed at the end."""
    if isinstance(broker, Broker):
        yield broker.reset() if reset else broker
        return
    bk = for_lab(lab, broker)
    try:
        yield bk
    finally:
        try:
            bk.discard()
        finally:
            bk.close()


def from_spec(spec: dict[str, Any], *, role: str = "broker") -> Broker:
    """Rebuild a broker (in a relay process) from :meth:`Broker.spec`; nothing is reset."""
    if spec["kind"] == "recording":
        return RecordingBroker(spec["dsn"], spec["schema"], role=role,
                               wait_for_disk=spec.get("wait_for_disk", True))
    if spec["kind"] == "rabbitmq":
        return RabbitBroker(spec["url"], spec["queue"])
    raise LabkitError(f"No broker kind {spec['kind']!r}.", "use 'recording' or 'rabbitmq'.")
