"""``labkit classroom``: one shared PostgreSQL for a room of trainees.

``create`` makes one login role per trainee (``claimlab_trainee01``, ...) with only what the
labs need: CONNECT, CREATE (for their own lab schemas) and TEMPORARY on the database.  A lab
schema belongs to the trainee who made it, so another trainee can neither read, change nor
drop it, and a role that is not a superuser may end only its own sessions.  Each trainee's
DSN is printed and written to a file only its owner can read (0600); the presenter hands
them out (``LABKIT_DSN=...`` per trainee).

``status`` shows each trainee's progress (lab schemas, the one rebuilt last, sessions open,
sessions idle inside a transaction); ``clean`` ends trainees' sessions idle in a transaction
for a minute or more (``--idle-seconds``; ``--all``: every trainee session); ``drop`` ends
every trainee session, drops what the roles own in this database, and the roles.  Every command names the classroom's roles by
their prefix *and* their comment (``labkit classroom``): nothing else is ever touched.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..core.db import hide, redact, scrub
from ..core.errors import LabkitError
from ..core.lab import schema_name
from ..core.limits import number
from ..core.queries import query

PREFIX = "claimlab_"
MARK = "labkit classroom"
MAX_TRAINEES = 200
SQL = "classroom.sql"


@dataclass
class Trainee:
    name: str        # trainee01
    role: str        # claimlab_trainee01
    dsn: str         # holds the password: for the trainee only


def _admin(dsn: str) -> psycopg.Connection:
    if not dsn:
        raise LabkitError("labkit classroom needs the server's administrator DSN.",
                          "pass --dsn postgresql://ADMIN@HOST:PORT/DATABASE (a role with CREATEROLE, "
                          "or a superuser), or set LABKIT_DSN to it.")
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.ProgrammingError as exc:
        raise LabkitError(f"The DSN {redact(dsn)!r} cannot be read ({scrub(str(exc))}).",
                          "write it as postgresql://ADMIN@HOST:PORT/DATABASE.") from None
    except psycopg.OperationalError as exc:
        raise LabkitError(f"Could not connect with {redact(dsn)!r}: "
                          f"{hide(str(exc).strip().splitlines()[0], dsn)}",
                          "check the host, port, database and the administrator's password.") from None
    row = conn.execute("SELECT rolsuper, rolcreaterole FROM pg_catalog.pg_roles "
                       "WHERE rolname = current_user").fetchone()
    if not (row[0] or row[1]):
        user = conn.info.user
        conn.close()
        raise LabkitError(f"The role {user!r} may not create roles, so it cannot make a classroom.",
                          "connect as a superuser or a role with CREATEROLE (ALTER ROLE ... CREATEROLE).")
    return conn


def roles(conn: psycopg.Connection) -> list[str]:
    """The classroom's roles on this server."""
    like = PREFIX.replace("_", r"\_") + "%"
    return [r[0] for r in conn.execute(query(SQL, "roles").sql, {"like": like, "mark": MARK}).fetchall()]


def create(admin_dsn: str, trainees: int, *, out: Path | None = None) -> list[Trainee]:
    """One login role per trainee; their DSNs, also written to ``out`` (mode 0600)."""
    number("trainees", trainees, low=1, high=MAX_TRAINEES, whole=True, example=8)
    with _admin(admin_dsn) as conn:
        existing = roles(conn)
        if existing:
            raise LabkitError(f"This server already has a classroom ({len(existing)} trainee roles, "
                              f"{existing[0]} ...).",
                              "run `labkit classroom drop --dsn ADMIN_DSN` first, or keep using it "
                              "(`labkit classroom status`).")
        database = conn.info.dbname
        made: list[Trainee] = []
        with conn.transaction():          # all the roles, or none
            for i in range(1, trainees + 1):
                name = f"trainee{i:02d}"
                role = PREFIX + name
                password = secrets.token_urlsafe(12)
                conn.execute(sql.SQL(query(SQL, "create_role").sql).format(
                    role=sql.Identifier(role), password=sql.Literal(password)))
                conn.execute(sql.SQL("COMMENT ON ROLE {} IS {}").format(sql.Identifier(role), sql.Literal(MARK)))
                conn.execute(sql.SQL(query(SQL, "grant").sql).format(
                    database=sql.Identifier(database), role=sql.Identifier(role)))
                made.append(Trainee(name, role, make_conninfo(admin_dsn, user=role, password=password)))
    if out is not None:
        write_dsns(out, made)
    return made


def write_dsns(path: Path, trainees: list[Trainee]) -> None:
    """The trainees' DSNs as JSON, in a file only its owner may read or write."""
    write_private(path, json.dumps(as_json(trainees), indent=1))


def write_private(path: Path, text: str) -> None:
    """``text`` in a file only its owner may read or write (passwords, DSNs)."""
    fd = os.open(Path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)              # an existing file keeps its mode on open: set it
    with os.fdopen(fd, "w") as f:
        f.write(text)


def as_json(trainees: list[Trainee]) -> dict:
    return {"trainees": [{"name": t.name, "dsn": t.dsn} for t in trainees]}


def status(admin_dsn: str) -> list[dict]:
    """One row per trainee: lab schemas, the one rebuilt last, sessions, idle in transaction."""
    with _admin(admin_dsn) as conn:
        names = roles(conn)
        rows = conn.execute(query(SQL, "progress").sql, {"roles": names}).fetchall()
    return [{"trainee": r[0].removeprefix(PREFIX), "role": r[0], "schemas": r[1],
             "last_notebook": notebook_of(r[2], r[3]), "sessions": r[4], "idle_in_transaction": r[5]}
            for r in rows]


def notebook_of(schema: str | None, mark: str | None) -> str | None:
    """``lab_02_the_convoy_<user>`` -> ``02_the_convoy``: the lab's name, without the user
    part that the schema's comment (``labkit:<user>``) names.  A long name was cut to fit and
    ends in a hash; it is matched against the labs the notebooks open."""
    if schema is None:
        return None
    user = (mark or "").removeprefix("labkit:")
    if user:
        for name in _lab_names():
            if schema_name(name, user) == schema:
                return name
    body = schema.removeprefix("lab_")
    return body[: -len(user) - 1] if user and body.endswith("_" + user) else body


@functools.lru_cache(maxsize=1)
def _lab_names() -> tuple[str, ...]:
    """The names the notebooks give their labs (``lk.setup("01_one_lock")``, ``lk.lab(...)``)."""
    from .nbtools import NOTEBOOKS
    names: set[str] = set()
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        names.update(re.findall(r'lk\.(?:setup|lab)\(\\?"([^"\\]+)', path.read_text(errors="replace")))
    return tuple(sorted(names))


IDLE_S = 60          # as `labkit clean`: a transaction idle this long is left over, not a demo


def clean(admin_dsn: str, *, every_one: bool = False, idle_s: float = IDLE_S) -> list[tuple]:
    """End the trainees' sessions idle in a transaction for ``idle_s`` seconds or more (all
    their sessions with ``every_one``)."""
    number("idle", idle_s, low=0, high=86_400, example=60)
    with _admin(admin_dsn) as conn:
        names = roles(conn)
        ended = conn.execute(query(SQL, "end_sessions").sql,
                             {"roles": names, "every_one": every_one, "idle_s": float(idle_s)}).fetchall()
    return [(pid, user, state) for pid, user, state, _ in ended]


def drop(admin_dsn: str) -> list[str]:
    """End every trainee session, drop what the trainees own in this database, and the roles."""
    with _admin(admin_dsn) as conn:
        names = roles(conn)
        if not names:
            return []
        conn.execute(query(SQL, "end_sessions").sql, {"roles": names, "every_one": True, "idle_s": 0.0}).fetchall()
        for role in names:
            try:
                with conn.transaction():
                    conn.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(role)))
                    conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
            except psycopg.errors.DependentObjectsStillReferenced as exc:
                raise LabkitError(f"The role {role} still owns objects in another database "
                                  f"({exc.diag.message_detail or exc}).",
                                  "run `labkit classroom drop` with a DSN for that database too, then "
                                  "again for this one.") from None
    return names


def asks_for_passwords(trainee: Trainee) -> bool | None:
    """Whether the server refuses the trainee's role with a wrong password (None: it could
    not be told).  A server whose pg_hba.conf says ``trust`` for where the trainees connect
    from lets anyone log in as any role: the roles then keep trainees apart only from each
    other's mistakes, not from each other."""
    wrong = make_conninfo(trainee.dsn, password=secrets.token_urlsafe(12))
    try:
        psycopg.connect(wrong, connect_timeout=10).close()
    except psycopg.OperationalError as exc:
        refused = getattr(exc, "sqlstate", None) == "28P01" or "password authentication failed" in str(exc)
        return True if refused else None
    return False


TRUST_WARNING = ("WARNING: this server let a trainee's role in with a wrong password: its "
                 "pg_hba.conf trusts connections from here, so any trainee can log in as any "
                 "other. Use scram-sha-256 for the trainees' roles (pg_hba.conf) before the "
                 "room logs in.")


# -- the command ------------------------------------------------------------------------------

def classroom_command(*, what: str, dsn: str | None, trainees: int | None = None,
                      out: Path | None = None, as_json_output: bool = False, every_one: bool = False,
                      idle_s: float = IDLE_S) -> int:
    dsn = dsn or os.environ.get("LABKIT_DSN", "")
    if what == "create":
        if trainees is None:
            raise LabkitError("labkit classroom create needs the number of trainees.",
                              "pass --trainees 8, for instance.")
        out = out or Path(f"classroom-{conninfo_to_dict(dsn).get('dbname') or 'db'}.json")
        made = create(dsn, trainees, out=out)
        if as_json_output:
            print(json.dumps(as_json(made), indent=1))
        else:
            width = max(len(t.name) for t in made)
            for t in made:
                print(f"{t.name:<{width}}  LABKIT_DSN='{t.dsn}'")
        print(f"{len(made)} trainee role(s); their DSNs (passwords included: hand each one to its "
              f"trainee only) are in {out} (mode 0600)", file=sys.stderr)
        if asks_for_passwords(made[0]) is False:
            print(TRUST_WARNING, file=sys.stderr)
        return 0
    if what == "status":
        rows = status(dsn)
        if as_json_output:
            print(json.dumps({"trainees": rows}, indent=1))
            return 0
        if not rows:
            print("no classroom on this server (`labkit classroom create` makes one)")
            return 0
        print(f"{'trainee':<10} {'schemas':>7}  {'last notebook':<30} {'sessions':>8} {'idle in tx':>10}")
        for r in rows:
            print(f"{r['trainee']:<10} {r['schemas']:>7}  {r['last_notebook'] or '-':<30} "
                  f"{r['sessions']:>8} {r['idle_in_transaction']:>10}")
        return 0
    if what == "clean":
        ended = clean(dsn, every_one=every_one, idle_s=idle_s)
        for pid, user, state in ended:
            print(f"ended pid {pid} ({user.removeprefix(PREFIX)}, {state})")
        print(f"{len(ended)} trainee session(s) ended")
        return 0
    if what == "drop":
        gone = drop(dsn)
        print(f"dropped {len(gone)} trainee role(s) and what they owned in this database")
        return 0
    raise LabkitError(f"Unknown classroom command {what!r}.", "use create, status, clean or drop.")
