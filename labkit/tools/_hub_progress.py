"""What a trainee's own embedded server says about their progress, printed as one line of
JSON: run by ``labkit hub status`` as the trainee (``python -m labkit.tools._hub_progress``),
so that only their own socket is opened.  It never starts a server that is not running."""

from __future__ import annotations

import json

import psycopg

from labkit.core.checked import one_row
from labkit.core.queries import query
from labkit.core.server import EmbeddedServer
from labkit.labs import puzzles


def progress() -> dict:
    """``postgres`` running or stopped, and while it runs: the trainee's lab schemas, the one
    used last and its mark, their other sessions, those idle in a transaction, and the
    puzzles of the scheduler's seat they played."""
    server = EmbeddedServer()
    out: dict = {"postgres": "running" if server.status().running else "stopped"}
    if out["postgres"] == "running":
        with psycopg.connect(server.conninfo(), autocommit=True, connect_timeout=10) as conn:
            me = one_row(conn.execute("SELECT current_user"), "SELECT current_user")[0]
            r = one_row(conn.execute(query("classroom.sql", "progress").sql, {"roles": [me]}),
                        "classroom.sql's progress")
            out.update(schemas=r[1], last_schema=r[2], mark=r[3], sessions=r[4] - 1, idle_in_transaction=r[5],
                       puzzles=puzzles.progress(conn, me))
    return out


if __name__ == "__main__":
    print(json.dumps(progress()))
