"""``labkit classroom``: one shared PostgreSQL for a room of trainees.

``create`` makes one login role per trainee (``claimlab_trainee01``, ...) with only what the
labs need: CONNECT, CREATE (for their own lab schemas) and TEMPORARY on the database.  A lab
schema belongs to the trainee who made it, so another trainee can neither read, change nor
drop it, and a role that is not a superuser may end only its own sessions.  Each trainee's
DSN is printed and written to a file only its owner can read (0600); the presenter hands
them out (``LABKIT_DSN=...`` per trainee).

Before it makes a role, ``create`` checks that the server asks for a password from here: on a
server that trusts this host (``trust`` in pg_hba.conf), any trainee could log in as any role,
the administrator's included, so ``create`` refuses unless told the server is out of the
trainees' reach (``--unsafe-trusting-server``).  Each role is limited: a connection limit
that leaves room for the whole class, statement and idle-in-transaction timeouts, a default
``work_mem``, and (where the administrator may set it) ``temp_file_limit``.  The passwords
reach the server only as SCRAM verifiers, never in the text of a statement.

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
import shlex
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..core.checked import one_row
from ..core.db import hide, redact, scram_verifier, scrub
from ..core.errors import LabkitError
from ..core.lab import schema_name
from ..core.limits import number
from ..core.queries import query
from ..labs import puzzles

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
    row = one_row(conn.execute("SELECT rolsuper, rolcreaterole FROM pg_catalog.pg_roles "
                               "WHERE rolname = current_user"), "the current role's row of pg_roles")
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


def create(admin_dsn: str, trainees: int, *, out: Path | None = None,
           trust_ok: bool = False) -> list[Trainee]:
    """One login role per trainee; their DSNs, also written to ``out`` (mode 0600, a new file
    in a folder the caller owns).  Refused on a server that lets a role in without its
    password, unless ``trust_ok``."""
    number("trainees", trainees, low=1, high=MAX_TRAINEES, whole=True, example=8)
    if out is not None:
        check_private_target(out)
    with _admin(admin_dsn) as conn:
        existing = roles(conn)
        if existing:
            raise LabkitError(f"This server already has a classroom ({len(existing)} trainee roles, "
                              f"{existing[0]} ...).",
                              "run `labkit classroom drop --dsn ADMIN_DSN` first, or keep using it "
                              "(`labkit classroom status`).")
        trusted = who_gets_in_without_a_password(conn, admin_dsn)
        if trusted and not trust_ok:
            raise LabkitError(
                f"This server lets {', '.join(trusted)} log in from here with a wrong password: "
                "its pg_hba.conf trusts these connections, so any trainee could log in as any "
                "role, the administrator's included, read every trainee's labs and, as a "
                "superuser, run programs on the server.",
                "in pg_hba.conf change the method of the lines that match the trainees' "
                "connections from trust to scram-sha-256 (as a superuser, `SELECT line_number, "
                "type, database, user_name, address, auth_method FROM pg_hba_file_rules` lists "
                "them), run `SELECT pg_reload_conf()`, and run this again. Only for a server no "
                "trainee can reach: pass --unsafe-trusting-server.")
        limits = role_limits(conn, trainees)
        database = conn.info.dbname
        made: list[Trainee] = []
        with conn.transaction():          # all the roles, or none
            for i in range(1, trainees + 1):
                name = f"trainee{i:02d}"
                role = PREFIX + name
                password = secrets.token_urlsafe(12)
                conn.execute(sql.SQL(query(SQL, "create_role").sql).format(
                    role=sql.Identifier(role), verifier=sql.Literal(scram_verifier(password)),
                    connections=sql.Literal(limits.connections)))
                conn.execute(sql.SQL("COMMENT ON ROLE {} IS {}").format(sql.Identifier(role), sql.Literal(MARK)))
                conn.execute(sql.SQL(query(SQL, "grant").sql).format(
                    database=sql.Identifier(database), role=sql.Identifier(role)))
                for setting, value in limits.settings.items():
                    conn.execute(sql.SQL("ALTER ROLE {} SET {} = {}").format(
                        sql.Identifier(role), sql.Identifier(setting), sql.Literal(value)))
                made.append(Trainee(name, role, trainee_dsn(admin_dsn, role, password)))
        guard_search_path(conn)
        if out is not None:
            try:
                write_dsns(out, made)
            except (OSError, LabkitError) as exc:
                _drop_roles(conn, [t.role for t in made])
                raise LabkitError(f"Could not write the trainees' DSNs to {out} ({exc}); the roles "
                                  "just made were dropped again.",
                                  "pass --out with a new file in a folder you own.") from None
    return made


# What a trainee's DSN keeps of the administrator's: where the server is and how to reach it
# safely, never the administrator's own options (a startup `options`, a service file, a
# password file).
DSN_KEYS = ("host", "hostaddr", "port", "dbname", "sslmode", "sslrootcert", "sslcrl",
            "sslnegotiation", "gssencmode", "channel_binding", "target_session_attrs", "connect_timeout")


def trainee_dsn(admin_dsn: str, role: str, password: str) -> str:
    kept = {k: v for k, v in conninfo_to_dict(admin_dsn).items() if k in DSN_KEYS and v}
    return make_conninfo("", **kept, user=role, password=password)


SEARCH_PATH = "public"


def guard_search_path(conn: psycopg.Connection) -> bool:
    """Make ``public`` the database's search_path for sessions that set none, unless one is
    set already.  With the default, ``"$user", public``, a trainee who may create schemas
    could create one named after another role (the administrator's, another trainee's) and
    put functions and tables in it that that role's sessions then find first: their code,
    run with the other role's rights.  Returns whether it was set (the classroom's drop
    resets it)."""
    row = conn.execute(query(SQL, "database_search_path").sql).fetchone()
    if row is not None:
        return False
    try:
        conn.execute(sql.SQL("ALTER DATABASE {} SET search_path = {}").format(
            sql.Identifier(conn.info.dbname), sql.Literal(SEARCH_PATH)))
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True


@dataclass
class Limits:
    connections: int                 # each trainee's CONNECTION LIMIT
    settings: dict[str, str]         # ALTER ROLE ... SET: defaults, and temp_file_limit where it may be set
    needed: int                      # connections the busiest notebook opens
    skipped: list[str]               # settings this administrator may not set


# The busiest notebook (02, the convoy) runs 32 workers beside its own sessions.
CONNECTIONS_NEEDED = 36
TRAINEE_SETTINGS = {
    "statement_timeout": "5min",                      # no statement runs on for ever
    "idle_in_transaction_session_timeout": "5min",    # a forgotten open transaction ends
    "work_mem": "16MB",                               # the default; a trainee may still SET it
    "temp_file_limit": "1GB",                         # superuser-only: a trainee cannot raise it
}


def role_limits(conn: psycopg.Connection, trainees: int) -> Limits:
    """A connection limit per trainee that leaves room for the whole class (and for the
    administrator), and the role settings this administrator may give."""
    row = one_row(conn.execute(query(SQL, "connection_budget").sql), "the query 'connection_budget'")
    free = row[0]
    per = max(1, min(CONNECTIONS_NEEDED + 4, free // trainees))
    settings = dict(TRAINEE_SETTINGS)
    skipped = []
    may_set = row[1] or (conn.info.server_version >= 150000 and one_row(conn.execute(
        "SELECT pg_catalog.has_parameter_privilege('temp_file_limit', 'SET')"), "has_parameter_privilege()")[0])
    if not may_set:                   # temp_file_limit is set by a superuser (or one granted SET on it)
        settings.pop("temp_file_limit")
        skipped.append("temp_file_limit")
    return Limits(per, settings, CONNECTIONS_NEEDED, skipped)


def who_gets_in_without_a_password(conn: psycopg.Connection, admin_dsn: str) -> list[str]:
    """The roles that log in from here with a wrong password: a throw-away role made for the
    probe (as a trainee's would be), the administrator, and ``postgres``.  Empty on a server
    that asks for passwords."""
    probe = f"{PREFIX}probe_{secrets.token_hex(4)}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOINHERIT PASSWORD {}").format(
        sql.Identifier(probe), sql.Literal(scram_verifier(secrets.token_urlsafe(16)))))
    try:
        conn.execute(sql.SQL("COMMENT ON ROLE {} IS {}").format(sql.Identifier(probe), sql.Literal(MARK)))
        conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
            sql.Identifier(conn.info.dbname), sql.Identifier(probe)))
        who = []
        for user in dict.fromkeys([probe, conn.info.user, "postgres"]):
            if _logs_in_with_a_wrong_password(admin_dsn, user) is True:
                who.append("a trainee's role" if user == probe else repr(user))
        return who
    finally:
        conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM {}").format(
            sql.Identifier(conn.info.dbname), sql.Identifier(probe)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(probe)))


def _logs_in_with_a_wrong_password(dsn: str, user: str) -> bool | None:
    """True when ``user`` logs in with a wrong password, False when the server refuses the
    password, None when it refused for another reason (no such role, not from here)."""
    wrong = make_conninfo(dsn, user=user, password=secrets.token_urlsafe(12))
    try:
        psycopg.connect(wrong, connect_timeout=10).close()
    except psycopg.OperationalError as exc:
        refused = getattr(exc, "sqlstate", None) == "28P01" or "password authentication failed" in str(exc)
        return False if refused else None
    return True


def other_databases(conn: psycopg.Connection, role: str) -> list[str]:
    """The other databases of the server that ``role`` may connect to (PUBLIC keeps CONNECT
    on a database unless its owner revokes it)."""
    return [r[0] for r in conn.execute(query(SQL, "other_databases").sql,
                                       {"role": role, "here": conn.info.dbname}).fetchall()]


def write_dsns(path: Path, trainees: list[Trainee]) -> None:
    """The trainees' DSNs as JSON, in a new file only its owner may read or write."""
    write_private(path, json.dumps(as_json(trainees), indent=1), new=True)


def check_private_target(path: Path, *, new: bool = True) -> None:
    """Refuse a place for a file of passwords that another user could read or swap: a folder
    not ours or open for others to write, the workbook's own folder (a clone is shared and
    copied), or (``new``) a file already there."""
    from .nbtools import NOTEBOOKS

    path = Path(path).absolute()
    folder = path.parent
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        raise LabkitError(f"The folder {folder} does not exist.",
                          "create it (mode 0700), or pass --out with a file in a folder you own.") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise LabkitError(f"{folder} is not a folder of yours that only you may write: a file of "
                          "passwords there could be read or replaced by another user.",
                          "pass --out with a file in a folder you own and no one else may write "
                          "(mode 0700, e.g. a new folder in your home).")
    workbook = NOTEBOOKS.parent.resolve()
    inside = path.resolve() == workbook or workbook in path.resolve().parents
    hubs = workbook / ".hub"                             # the hub's own folder: git-ignored, root's
    if inside and hubs not in path.resolve().parents:
        raise LabkitError(f"{path} is inside the workbook's folder ({workbook}), which is cloned, "
                          "copied to every trainee and shown by git status.",
                          "pass --out with a file in a folder of yours outside the workbook.")
    if new and os.path.lexists(path):
        raise LabkitError(f"{path} already exists; labkit never writes passwords over a file.",
                          "remove it (or move it away), or pass --out with a new file name.")


def write_private(path: Path, text: str, *, new: bool = False) -> None:
    """``text`` in a file only its owner may read or write (passwords, DSNs), never written
    through a link or into a file another user made: it goes to a new file beside ``path``
    (O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600) that then takes ``path``'s name.  With ``new``,
    ``path`` must not exist yet."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    if new:
        fd = os.open(path, flags, 0o600)
        target = None
    else:
        target = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
        fd = os.open(target, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(target or path)
        raise
    if target is not None:
        os.replace(target, path)      # replaces a link planted at path, never writes through it


def as_json(trainees: list[Trainee]) -> dict:
    return {"trainees": [{"name": t.name, "dsn": t.dsn} for t in trainees]}


def status(admin_dsn: str) -> list[dict]:
    """One row per trainee: lab schemas, the one rebuilt last, sessions, idle in transaction,
    and the puzzles of the scheduler's seat they played (per puzzle: plays, fewest moves that
    broke it)."""
    with _admin(admin_dsn) as conn:
        names = roles(conn)
        rows = conn.execute(query(SQL, "progress").sql, {"roles": names}).fetchall()
        played = {r[0]: puzzles.progress(conn, r[0]) for r in rows}
    return [{"trainee": r[0].removeprefix(PREFIX), "role": r[0], "schemas": r[1],
             "last_notebook": notebook_of(r[2], r[3]), "sessions": r[4], "idle_in_transaction": r[5],
             "puzzles": played[r[0]]}
            for r in rows]


def printable(value):
    """A table cell as the presenter's terminal may show it: text with every character that is
    not printable (a newline that would start a forged row, an escape sequence that would clear
    the screen or retitle the window) shown as ``?``; other values as they are.  A trainee names
    their own schemas, so these cells are theirs to write."""
    if isinstance(value, str):
        return "".join(c if c.isprintable() else "?" for c in value)
    return value


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
    """End every trainee session, drop what the trainees own in this database, and the roles.
    Refused, naming them, when objects of someone else's depend on what a trainee owns (an
    administrator's view over a trainee's table): those are never dropped with the room."""
    with _admin(admin_dsn) as conn:
        names = roles(conn)
        if not names:
            return []
        outside = conn.execute(query(SQL, "dependants_outside").sql, {"roles": names}).fetchall()
        if outside:
            listed = "; ".join(f"{what} (owned by {owner}) depends on {on}" for what, owner, on in outside[:5])
            raise LabkitError(f"Objects outside the classroom depend on what trainees own: {listed}"
                              f"{' ...' if len(outside) > 5 else ''}. Dropping the room would drop them too.",
                              "drop or change those objects first (they are not the room's), then run "
                              "`labkit classroom drop` again.")
        _drop_roles(conn, names, rehearse=True)       # refused with the dependants named, no session ended
        conn.execute(query(SQL, "end_sessions").sql, {"roles": names, "every_one": True, "idle_s": 0.0}).fetchall()
        _drop_roles(conn, names)
        row = conn.execute(query(SQL, "database_search_path").sql).fetchone()
        if row is not None and row[0] == f"search_path={SEARCH_PATH}":
            try:
                conn.execute(sql.SQL("ALTER DATABASE {} RESET search_path").format(
                    sql.Identifier(conn.info.dbname)))
            except psycopg.errors.InsufficientPrivilege:
                pass
    return names


class _Rehearsed(Exception):
    pass


def _drop_roles(conn: psycopg.Connection, names: list[str], *, rehearse: bool = False) -> None:
    """DROP OWNED (RESTRICT: nothing beyond the room) and DROP ROLE, or with ``rehearse`` the
    same rolled back, to learn whether anything outside the room depends on the trainees'
    objects while their sessions still run (a lock they hold skips the rehearsal)."""
    idents = sql.SQL(", ").join(sql.Identifier(r) for r in names)
    try:
        with conn.transaction():
            if rehearse:
                conn.execute("SET LOCAL lock_timeout = '2s'")
            conn.execute(sql.SQL("DROP OWNED BY {}").format(idents))
            conn.execute(sql.SQL("DROP ROLE {}").format(idents))
            if rehearse:
                raise _Rehearsed
    except _Rehearsed:
        return
    except psycopg.errors.LockNotAvailable:
        if rehearse:
            return
        raise
    except psycopg.errors.DependentObjectsStillExist as exc:
        raise LabkitError(f"A trainee's role still owns objects, or objects of someone else depend on "
                          f"theirs ({(exc.diag.message_detail or str(exc)).strip()}).",
                          "drop or change the objects named (those outside the room are not its to "
                          "drop); if they are in another database, run `labkit classroom drop` with a "
                          "DSN for that database too; then run it again for this one.") from None


def asks_for_passwords(trainee: Trainee) -> bool | None:
    """Whether the server refuses the trainee's role with a wrong password (None: it could
    not be told).  A server whose pg_hba.conf says ``trust`` for where the trainees connect
    from lets anyone log in as any role: the roles then keep trainees apart only from each
    other's mistakes, not from each other."""
    got_in = _logs_in_with_a_wrong_password(trainee.dsn, trainee.role)
    return None if got_in is None else not got_in


def default_out(database: str) -> Path:
    """Where ``create`` writes the DSNs when not told: a new file in labkit's per-user state
    folder (made 0700), never the current folder."""
    import time

    from ..core.files import state_dir

    folder = state_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return folder / f"classroom-{re.sub(r'[^A-Za-z0-9_.-]', '_', database)}-{stamp}.json"


def describe_room(admin_dsn: str, made: list[Trainee]) -> list[str]:
    """What each trainee's role may use, read back from the server: its connection limit and
    settings, the other databases it may connect to, and whether passwords are asked."""
    lines = []
    with _admin(admin_dsn) as conn:
        limit, config = one_row(conn.execute("SELECT rolconnlimit, rolconfig FROM pg_catalog.pg_roles "
                                             "WHERE rolname = %s", (made[0].role,)),
                                f"the row of pg_roles for {made[0].role}")
        budget = one_row(conn.execute(query(SQL, "connection_budget").sql), "the query 'connection_budget'")[0]
        fixed = [c for c in config or [] if c.startswith("temp_file_limit=")]
        defaults = [c for c in config or [] if c not in fixed]
        lines.append(f"each trainee: at most {limit} connections (the room's share of the {budget} "
                     f"left for it){'; ' + ', '.join(fixed) + ', which a trainee cannot change' if fixed else ''}; "
                     f"defaults for their sessions, which a trainee may change for their own: "
                     f"{', '.join(defaults)}")
        path = conn.execute(query(SQL, "database_search_path").sql).fetchone()
        if path is not None and path[0] == f"search_path={SEARCH_PATH}":
            lines.append(f"this database's search_path is {SEARCH_PATH} for sessions that set none, so a "
                         "schema a trainee names after another role is never searched by that role's "
                         "sessions (`labkit classroom drop` resets it)")
        else:
            now = path[0] if path else 'the default, "$user", public'
            lines.append("WARNING: this database's search_path could not be set to public (it is "
                         f"{now}): a trainee may create a "
                         "schema named after another role whose sessions then run the trainee's "
                         "functions. As the database's owner: ALTER DATABASE ... SET search_path = public.")
        if one_row(conn.execute("SELECT pg_catalog.has_schema_privilege(%s, 'public', 'CREATE')",
                                (made[0].role,)), "has_schema_privilege()")[0]:
            lines.append("WARNING: trainees may create objects in the schema public, which every role "
                         "searches (PostgreSQL 14 and older grant it to PUBLIC): "
                         "REVOKE CREATE ON SCHEMA public FROM PUBLIC;")
        if limit < CONNECTIONS_NEEDED:
            lines.append(f"WARNING: notebook 02's sweep opens {CONNECTIONS_NEEDED} connections: with "
                         f"{limit} a trainee's larger runs there are refused. For all of it, raise "
                         f"max_connections to about {CONNECTIONS_NEEDED * len(made) + 20} (and restart).")
        if "temp_file_limit" not in " ".join(config or []):
            lines.append("temp_file_limit not set: only a superuser (or a role granted SET on it) may "
                         "set it for the trainees.")
        others = other_databases(conn, made[0].role)
        if others:
            lines.append(f"trainees may also connect to: {', '.join(others)} (PUBLIC has CONNECT there). "
                         "To close them: " + " ".join(f"REVOKE CONNECT, TEMPORARY ON DATABASE "
                                                      f"{sql.Identifier(d).as_string(conn)} FROM PUBLIC;"
                                                      for d in others))
    if asks_for_passwords(made[0]) is False:
        lines.append(TRUST_WARNING)
    return lines


TRUST_WARNING = ("WARNING: this server let a trainee's role in with a wrong password: its "
                 "pg_hba.conf trusts connections from here, so any trainee can log in as any "
                 "role. Use it only where no trainee can reach it; otherwise use scram-sha-256 "
                 "for the trainees' connections (pg_hba.conf) before the room logs in.")


# -- the command ------------------------------------------------------------------------------

def classroom_command(*, what: str, dsn: str | None, trainees: int | None = None,
                      out: Path | None = None, as_json_output: bool = False, every_one: bool = False,
                      idle_s: float = IDLE_S, unsafe_trusting_server: bool = False) -> int:
    dsn = dsn or os.environ.get("LABKIT_DSN", "")
    if what == "create":
        if trainees is None:
            raise LabkitError("labkit classroom create needs the number of trainees.",
                              "pass --trainees 8, for instance.")
        if out is None:
            out = default_out(str(conninfo_to_dict(dsn).get("dbname") or "db"))
        made = create(dsn, trainees, out=out, trust_ok=unsafe_trusting_server)
        if as_json_output:
            print(json.dumps(as_json(made), indent=1))
        else:
            width = max(len(t.name) for t in made)
            for t in made:
                print(f"{t.name:<{width}}  LABKIT_DSN={shlex.quote(t.dsn)}")
        print(f"{len(made)} trainee role(s); their DSNs (passwords included: hand each one to its "
              f"trainee only) are in {out} (mode 0600)", file=sys.stderr)
        for line in describe_room(dsn, made):
            print(line, file=sys.stderr)
        return 0
    if what == "status":
        rows = status(dsn)
        if as_json_output:
            print(json.dumps({"trainees": rows}, indent=1))
            return 0
        if not rows:
            print("no classroom on this server (`labkit classroom create` makes one)")
            return 0
        print(f"{'trainee':<10} {'schemas':>7}  {'last notebook':<30} {'sessions':>8} {'idle in tx':>10}  puzzles")
        for r in rows:
            r = {k: printable(v) for k, v in r.items()}
            print(f"{r['trainee']:<10} {r['schemas']:>7}  {r['last_notebook'] or '-':<30} "
                  f"{r['sessions']:>8} {r['idle_in_transaction']:>10}  {puzzles.progress_line(r['puzzles'])}")
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
