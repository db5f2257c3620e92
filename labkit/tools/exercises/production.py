"""Notebook 11's exercise the server checks: the worker's fenced heartbeat.

The learner writes one statement taking ``%(id)s``, ``%(claim_version)s`` and ``%(lease)s``
(the lease as interval text, ``'30 seconds'``; ``%(lease_s)s``, the same in seconds, may be
used instead) that extends the lease of a claim while it is still the worker's own.
:func:`check_heartbeat` builds four jobs on the production job table (``production.sql``) in
a scratch schema (``production_check.sql``'s ``heartbeat_scene``) and runs the statement once
for each, as worker 1, carrying the claim version worker 1 was handed for that job:

1. its own claim, still RUNNING at version 1: the heartbeat must match 1 row and move
   ``lease_until`` to now + the lease, and change nothing else;
2. a job worker 2 claimed again (version 2) after worker 1's lease ran out: worker 1 is a
   zombie, and its heartbeat must match 0 rows and change nothing;
3. a job the reaper handed back to PENDING and nobody has claimed since, so its version is
   still 1: 0 rows, untouched (a heartbeat fenced by the version alone keeps a worker
   believing it holds a job the next claim will run again);
4. a job worker 1 completed (DONE, version 1), reached by a heartbeat that comes after the
   completion: 0 rows, untouched.

Each finding is read from the table after the statement ran (the rows it matched, and every
column of every job), never from the SQL's text.
"""

from __future__ import annotations

from ...core.errors import LabkitError
from ...core.lab import Lab
from ...core.queries import query
from ...labs.production import fresh_table
from . import Check, Solo, bind, scratch

OWNER = 1            # worker 1's own claim
ZOMBIE = 2           # claimed again by worker 2: worker 1 carries an older version
REAPED = 3           # handed back to PENDING, not claimed since: the same version
FINISHED = 4         # DONE
VERSION = 1          # the claim version worker 1 was handed for every job

LEASE_LOW_S, LEASE_HIGH_S = 10, 3600

HINT = ("The claim handed the worker a claim_version: the heartbeat may move the lease only while "
        "the row still carries that version and is still RUNNING, and it sets lease_until from "
        "the server's clock (now() plus the lease), nothing else. A worker whose heartbeat "
        "matches 0 rows has lost the job: it stops its handler.")

_COLUMNS = ("status", "claimed_by", "claim_version", "attempts", "lease_until", "last_error",
            "finished_at", "run_at", "priority")


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
    names = [c.name for c in cur.description]
    return {r[0]: dict(zip(names, r)) for r in cur.fetchall()}


def _changed(before: dict, after: dict, keep: tuple[str, ...] = ()) -> list[str]:
    return [c for c in _COLUMNS if c not in keep and before[c] != after[c]]


def _matched(n: int) -> str:
    return f"{n} row{'' if n == 1 else 's'}"


def check_heartbeat(lab: Lab, sql: str, *, lease: str = "30 seconds") -> Check:
    """Run ``sql`` (the heartbeat: one statement taking ``%(id)s``, ``%(claim_version)s`` and
    ``%(lease)s``, or ``%(lease_s)s`` for the lease in seconds) as worker 1, once for each of
    four jobs: its own claim, a job claimed again by worker 2, a job the reaper handed back,
    a finished job.  It passes when the owner's heartbeat matches 1 row and moves only its
    lease, to now + ``lease``, and the three others match 0 rows and change nothing."""
    lease_s = _lease_seconds(lab, lease)
    params = {"id": OWNER, "claim_version": VERSION, "lease": lease, "lease_s": lease_s}
    bind(lab, sql, params)                       # bad SQL or parameters: refused before any scene
    check = Check(f"worker 1's heartbeats, with a lease of {lease}", hint=HINT)
    lab2 = scratch(lab)
    try:
        fresh_table(lab2)
        lab2.execute(query("production_check.sql", "heartbeat_scene").sql)
        before = _rows(lab2)
        matched: dict[int, int] = {}
        with Solo(lab2, role="heartbeat") as conn:
            for job in (OWNER, ZOMBIE, REAPED, FINISHED):
                text = bind(lab2, sql, {**params, "id": job})
                try:
                    matched[job] = conn.execute(text).rowcount
                except Exception as exc:  # noqa: BLE001 - the learner's SQL may fail in any way
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                    check.add(False, f"the heartbeat for job {job} failed: {type(exc).__name__}: {first}")
                    return check
        after = _rows(lab2)
        _owner(check, before[OWNER], after[OWNER], matched[OWNER], lease_s)
        for job, what, harm in (
                (ZOMBIE, "worker 2 claimed it again (version 2) after worker 1's lease ran out",
                 "the zombie kept worker 2's claim alive and runs on as if the job were its own"),
                (REAPED, "the reaper handed it back to PENDING, nobody has claimed it since "
                         "(still version 1)",
                 "worker 1 runs on as if it held the job, and the next claim runs it again"),
                (FINISHED, "worker 1 completed it (DONE, version 1); this heartbeat comes after",
                 "a finished job was given a lease")):
            changed, n = _changed(before[job], after[job]), matched[job]
            said = f"job {job}: {what}. Worker 1's heartbeat matched {_matched(n)}"
            if changed:
                check.add(False, f"{said} and changed {', '.join(changed)}: {harm}")
            elif n:
                check.add(False, f"{said}, on {'another job' if n == 1 else 'other jobs'}: the worker "
                          "reads any row as its claim still alive, and runs on")
            else:
                check.add(True, f"{said} and changed nothing")
        return check
    finally:
        lab2.drop()


def _owner(check: Check, before: dict, after: dict, n: int, lease_s: float) -> None:
    left = after["lease_left_s"]
    moved = left is not None and lease_s - 3 <= left <= lease_s + 1
    changed = _changed(before, after, keep=("lease_until",))
    what = f"job {OWNER}: worker 1's own claim (RUNNING, version {VERSION}, 5 s of lease left)."
    if n != 1:
        check.add(False, f"{what} Its heartbeat matched {_matched(n)}, not 1"
                  + (": the worker would think it lost its own job" if n == 0 else
                     ": a heartbeat is about one job, the one whose id it carries"))
    elif not moved:
        check.add(False, f"{what} Its heartbeat matched 1 row, but the lease now ends "
                  + ("nowhere (NULL)" if left is None else f"{left:.0f} s from now")
                  + f"; a heartbeat sets it to now + the lease ({lease_s:g} s)")
    elif changed:
        check.add(False, f"{what} Its heartbeat moved the lease but also changed {', '.join(changed)}: "
                  "a heartbeat extends the lease and touches nothing else")
    else:
        check.add(True, f"{what} Its heartbeat matched 1 row and moved the lease to now + {lease_s:g} s")
