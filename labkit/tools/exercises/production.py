"""Notebook 11's exercise the server checks: the worker's fenced heartbeat.

The learner writes one statement taking ``%(id)s``, ``%(claim_version)s`` and ``%(lease)s``
(the lease as interval text, ``'30 seconds'``; ``%(lease_s)s``, the same in seconds, and
``%(worker)s``, the worker's name, may be used too) that extends the lease of a claim while it
is still the worker's own. :func:`check_heartbeat` builds five jobs on the production job
table (``production.sql``) in a scratch schema (``production_check.sql``'s
``heartbeat_scene``) and runs the statement once for each, as worker 1, carrying the claim
version worker 1 was handed for that job:

1. its own claim, still RUNNING at version 1: the heartbeat must match 1 row and move
   ``lease_until`` to now + the lease, and change nothing else;
2. a job worker 2 claimed again (version 2) after worker 1's lease ran out: worker 1 is a
   zombie, and its heartbeat must match 0 rows and change nothing;
3. a job worker 1 itself claimed again (version 2) after its first claim's lease ran out; the
   heartbeat comes from the first run, still going: 0 rows, untouched (a heartbeat fenced by
   the worker's name keeps the stale run going beside the new one);
4. a job the reaper handed back to PENDING and nobody has claimed since, so its version is
   still 1: 0 rows, untouched (a heartbeat fenced by the version alone keeps a worker
   believing it holds a job the next claim will run again);
5. a job worker 1 completed (DONE, version 1), reached by a heartbeat that comes after the
   completion: 0 rows, untouched.

Each finding is read from the table (every column of every job, after each heartbeat) and
from the rows the statement reported, never from the SQL's text. The statement is sent with
the extended query protocol, so the server itself refuses more than one statement.
"""

from __future__ import annotations

from ...core.checked import column_names
from ...core.errors import LabkitError
from ...core.lab import Lab
from ...core.queries import query
from ...labs.production import fresh_table
from . import Check, Solo, bind, scratch

OWNER = 1            # worker 1's own claim
ZOMBIE = 2           # claimed again by worker 2: worker 1 carries an older version
AGAIN = 3            # claimed again by worker 1 itself: the same name, a newer version
REAPED = 4           # handed back to PENDING, not claimed since: the same version
FINISHED = 5         # DONE
JOBS = (OWNER, ZOMBIE, AGAIN, REAPED, FINISHED)
VERSION = 1          # the claim version worker 1 was handed for every job
WORKER = "worker 1"

LEASE_LOW_S, LEASE_HIGH_S = 10, 3600

HINT = ("Compare each WRONG job with job 1: what about that row is no longer as it was when "
        "worker 1 claimed it? The heartbeat's WHERE must tell every such row from job 1, using "
        "only what the claim handed worker 1.")

_COLUMNS = ("status", "claimed_by", "claim_version", "attempts", "lease_until", "last_error",
            "finished_at", "run_at", "priority")

# What each job is, and what goes wrong when worker 1's heartbeat reaches it.
_SCENE = {
    ZOMBIE: ("worker 2 claimed it again (version 2) after worker 1's lease ran out",
             "the zombie kept worker 2's claim alive and runs on as if the job were its own"),
    AGAIN: ("worker 1 claimed it again itself (version 2) after its first lease ran out; "
            "this heartbeat is from the first run, still going",
            "the stale run goes on beside the new one, two handlers of one job"),
    REAPED: ("the reaper handed it back to PENDING, nobody has claimed it since (still "
             "version 1)",
             "worker 1 runs on as if it held the job, and the next claim runs it again"),
    FINISHED: ("worker 1 completed it (DONE, version 1); this heartbeat comes after",
               "a finished job was given a lease"),
}


def _lease_seconds(lab: Lab, lease: object) -> float:
    import psycopg

    if not isinstance(lease, str) or not lease.strip():
        raise LabkitError(f"The lease {lease!r} is not an interval written as text.",
                          "pass one the server understands, for example lease='30 seconds'.")
    try:
        seconds = lab.execute("SELECT extract(epoch FROM %s::interval)::float8", (lease,))[0][0]
    except psycopg.Error:
        seconds = None
    if seconds is None or not LEASE_LOW_S <= seconds <= LEASE_HIGH_S:
        raise LabkitError(f"The lease {lease!r} is not an interval from {LEASE_LOW_S} seconds to "
                          f"{LEASE_HIGH_S // 3600} hour.",
                          "pass one in that range, for example lease='30 seconds'.")
    return seconds


def _rows(lab: Lab) -> dict[int, dict]:
    cur = lab.admin.execute(query("production_check.sql", "heartbeat_rows").sql)
    names = column_names(cur, "the query 'heartbeat_rows' of production_check.sql")
    return {r[0]: dict(zip(names, r)) for r in cur.fetchall()}


def _changed(before: dict | None, after: dict | None, keep: tuple[str, ...] = ()) -> list[str]:
    if before is None or after is None:
        return ["the row itself (" + ("added" if before is None else "deleted") + ")"]
    return [c for c in _COLUMNS if c not in keep and before[c] != after[c]]


def _matched(n: int) -> str:
    return f"{n} row{'' if n == 1 else 's'}"


def _elsewhere(others: dict[int, list[str]]) -> str:
    return "; ".join(f"job {k}'s {', '.join(cols)}" for k, cols in sorted(others.items()))


def _refusal(exc: Exception) -> str:
    import psycopg

    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, psycopg.errors.SyntaxError) and "multiple commands" in first:
        return ("the SQL is more than one statement, and the server refused it: a heartbeat is "
                f"one UPDATE ({first})")
    return f"{type(exc).__name__}: {first}"


def check_heartbeat(lab: Lab, sql: str, *, lease: str = "30 seconds") -> Check:
    """Run ``sql`` (the heartbeat: one statement taking ``%(id)s``, ``%(claim_version)s`` and
    ``%(lease)s``; ``%(lease_s)s``, the lease in seconds, and ``%(worker)s``, 'worker 1', may be
    used too) as worker 1, once for each of five jobs: its own claim, a job claimed again by
    worker 2, a job claimed again by worker 1 itself, a job the reaper handed back, a finished
    job.  It passes when the owner's heartbeat matches 1 row and moves only its lease, to now +
    ``lease``, and each of the four others matches 0 rows and changes nothing."""
    import psycopg

    lease_s = _lease_seconds(lab, lease)
    params = {"id": OWNER, "claim_version": VERSION, "lease": lease, "lease_s": lease_s,
              "worker": WORKER}
    bind(lab, sql, params)                       # bad SQL or parameters: refused before any scene
    check = Check(f"worker 1's heartbeats, with a lease of {lease}", hint=HINT)
    lab2 = scratch(lab)
    try:
        fresh_table(lab2)
        lab2.execute(query("production_check.sql", "heartbeat_scene").sql)
        now = _rows(lab2)
        seen: dict[int, tuple[int, list[str], dict[int, list[str]], dict | None]] = {}
        with Solo(lab2, role="heartbeat") as conn:
            for job in JOBS:
                text = bind(lab2, sql, {**params, "id": job})
                try:
                    # binary results: the extended protocol, one statement at most
                    n = conn.cursor(binary=True).execute(text).rowcount
                except psycopg.Error as exc:
                    check.add(False, f"the heartbeat for job {job} failed: {_refusal(exc)}")
                    return check
                after = _rows(lab2)
                changes = {k: c for k in sorted(set(now) | set(after))
                           if (c := _changed(now.get(k), after.get(k)))}
                seen[job] = (max(n, 0), changes.pop(job, []), changes, after.get(job))
                now = after
        _owner(check, seen[OWNER], lease_s)
        for job in JOBS[1:]:
            n, own, others, _ = seen[job]
            what, harm = _SCENE[job]
            said = f"job {job}: {what}. Worker 1's heartbeat"
            if own:
                check.add(False, f"{said} {'reported 0 rows, yet it' if n == 0 else f'matched {_matched(n)} and'}"
                          f" changed {', '.join(own)}: {harm}")
            elif others:
                check.add(False, f"{said} changed {_elsewhere(others)} instead: the worker reads "
                          "that as its claim still alive, and runs on")
            elif n:
                check.add(False, f"{said} matched {_matched(n)}: the worker reads that as its claim "
                          "still alive, and runs on")
            else:
                check.add(True, f"{said} matched 0 rows and changed nothing")
        return check
    finally:
        lab2.drop()


def _owner(check: Check, seen: tuple[int, list[str], dict[int, list[str]], dict | None],
           lease_s: float) -> None:
    n, own, others, after = seen
    left = None if after is None else after["lease_left_s"]
    moved = left is not None and lease_s - 3 <= left <= lease_s + 1
    changed = [c for c in own if c != "lease_until"]
    what = f"job {OWNER}: worker 1's own claim (RUNNING, version {VERSION}, 5 s of lease left)."
    if others:
        check.add(False, f"{what} Its heartbeat also changed {_elsewhere(others)}: a heartbeat is "
                  "about one job, the one whose id it carries")
    elif n != 1:
        check.add(False, f"{what} Its heartbeat matched {_matched(n)}, not 1"
                  + (": the worker would think it lost its own job" if n == 0 else
                     ": a heartbeat is about one job, the one whose id it carries"))
    elif changed:
        check.add(False, f"{what} Its heartbeat changed {', '.join(changed)}"
                  + (" as well as the lease" if "lease_until" in own else "")
                  + ": a heartbeat extends the lease and touches nothing else")
    elif not moved:
        check.add(False, f"{what} Its heartbeat matched 1 row, but the lease now ends "
                  + ("nowhere (NULL)" if left is None else f"{left:.0f} s from now")
                  + f"; a heartbeat sets it to now + the lease ({lease_s:g} s)")
    else:
        check.add(True, f"{what} Its heartbeat matched 1 row and moved the lease to now + {lease_s:g} s")
