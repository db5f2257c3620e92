"""Leases need fences: a zombie worker, with and without a fencing token.

A worker whose lease ran out may still be alive, waiting on a slow send. Another
worker re-claims the row (the claim bumps ``claim_version``) and finishes it. Then
the zombie's send returns and it writes its stale outcome:

* without a fence (``WHERE id = %(id)s``) the write lands and clobbers the status;
* with a fence (``... AND claim_version = %(claim_version)s``) it matches zero rows,
  and the zombie learns it lost the lease.

Both runs are scripted steps in one process on the lab's frozen clock, so the trace
reproduces exactly.  ``zombie_push`` scripts the zombie's own push: ``"lost"`` (it never
reaches the device) or ``"delivered"`` (it reached the device; only the answer was lost, so
the request timed out) -- the case the fence cannot help with: the device then has the push
twice, and only a receiver that checks a key (the delivery id) shows it once. :func:`check_fenced_write` runs a reader's completion write as the
zombie and as the live worker and says whether the stale write got through.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field

import psycopg

from . import drain as dr
from ..core.errors import LabkitError
from ..core.limits import number
from ..core.procs import entry_point
from ..core.trace import Trace
from ..core.lab import Lab
from ..core.db import connect

ROW = ("SELECT status, attempts, claim_version, next_attempt_at, last_error "
       "FROM delivery WHERE id = 1")
PUSHES_TO_DEVICE = "SELECT count(*) FROM device_push WHERE delivery_id = 1"


def _row(lab: Lab, clock: dr.Clock) -> dict:
    status, attempts, version, due, error = lab.execute(ROW)[0]
    return {"status": status, "attempts": attempts, "claim_version": version,
            "next_attempt_at": clock.rel(due), "last_error": error or "-"}


def zombie_trace(lab: Lab, *, fence: bool, lease_s: float = dr.LEASE_S, overrun_s: float = 1,
                 timeout_s: float = 5, zombie_push: str = "lost") -> Trace:
    """Worker 1 claims, its send hangs past the lease; worker 2 re-claims and delivers;
    worker 1's request then times out and it writes "retry later" — fenced or not.
    ``zombie_push="delivered"``: worker 1's push did reach the device before its request
    timed out."""
    dr.check_params(lease_s=lease_s, overrun_s=overrun_s, timeout_s=timeout_s)
    if zombie_push not in ("lost", "delivered"):
        raise LabkitError(f"zombie_push={zombie_push!r}: the zombie's push is either lost or delivered.",
                          "pass zombie_push='lost' (scripted never to arrive) or 'delivered'.")
    if overrun_s <= 0:
        raise LabkitError("overrun_s must be > 0: the zombie exists only once its lease ran out.",
                          "pass overrun_s=1 (one second past the lease).")
    if timeout_s <= overrun_s:
        raise LabkitError(f"The zombie's request must time out after its lease ran out "
                          f"(timeout_s={timeout_s} <= overrun_s={overrun_s}).",
                          "pass timeout_s larger than overrun_s (defaults: 5 and 1).")
    clock = dr.create_ledger(lab, 1, no_collapse_every=1)   # no collapse id: duplicates show
    tr = Trace(f"Zombie worker, {'WITH' if fence else 'WITHOUT'} a fence "
               f"({'WHERE id AND claim_version' if fence else 'WHERE id'})"
               + ("; its push was delivered, only the answer was lost" if zombie_push == "delivered" else ""))
    w1 = dr.make_drain(lab, "worker 1", batch=1, lease_s=lease_s, fence=fence)
    w2 = dr.make_drain(lab, "worker 2", batch=1, lease_s=lease_s, fence=fence)
    try:
        (mine,) = w1.claim()
        tr.add("worker 1", "claim delivery 1",
               f"the claim hands out claim_version {mine.claim_version} and a {lease_s:.0f} s lease",
               _row(lab, clock))
        if zombie_push == "delivered":
            w1.sender.send(mine)        # it reaches the device; the answer never comes back
            tr.add("worker 1", "send the push to APNs … it reaches the device, the answer does not",
                   "the request hangs (a slow network, a stalled connection): the worker waits, "
                   "not knowing the push was delivered",
                   {"pushes_to_device": lab.execute(PUSHES_TO_DEVICE)[0][0]})
        else:
            tr.add("worker 1", "send the push to APNs … no answer",
                   "the request hangs (a slow network, a stalled connection): the worker waits; "
                   "scripted: this push never reaches the device", {})
        clock.advance(lease_s + overrun_s)
        tr.add("clock", f"+{lease_s + overrun_s:.0f} s: the lease has run out",
               "worker 1 is still waiting for APNs: alive, but no longer the owner — a zombie",
               {"at": f"T+{clock.elapsed():.0f} s", "due_now": lab.execute(dr.DUE_COUNT)[0][0]})
        (theirs,) = w2.claim()
        tr.add("worker 2", "re-claim delivery 1",
               f"the row was due again; claim_version is now {theirs.claim_version}",
               _row(lab, clock))
        live_out = w2.sender.send(theirs)
        live_rows = w2.complete(theirs, live_out)
        tr.add("worker 2", f"push delivered; write '{live_out.outcome}' (matched {live_rows} row)",
               "the device has the notification and the ledger says so: the correct state",
               {**_row(lab, clock), "pushes_to_device": lab.execute(PUSHES_TO_DEVICE)[0][0]})
        correct = "sent"                # worker 2's push was delivered and recorded

        clock.advance(timeout_s - overrun_s)
        zombie_rows = w1.complete(mine, dr.Outcome("retry", "timeout: no answer from APNs"))
        final = lab.execute(ROW)[0][0]
        if zombie_rows:
            tr.add("worker 1", f"request times out; write 'retry later' with WHERE id = 1 "
                               f"(matched {zombie_rows} row)",
                   "the stale outcome overwrites the correct one: the delivered push is "
                   "scheduled to go out again", _row(lab, clock), kind="error")
        else:
            tr.add("worker 1", f"request times out; write 'retry later' with claim_version = "
                               f"{mine.claim_version} (matched 0 rows)",
                   f"the row's claim_version is {theirs.claim_version}, so the fenced write "
                   "changes nothing: worker 1 is told it lost the lease and drops its result",
                   _row(lab, clock), kind="check")

        # Move on by one backoff: when the zombie's "retry later" would fall due.
        wait = float(lab.execute("SELECT extract(epoch FROM drain_backoff(attempts)) "
                                 "FROM delivery WHERE id = 1")[0][0])
        clock.advance(wait)
        res = w2.tick()
        pushes = lab.execute(PUSHES_TO_DEVICE)[0][0]
        pushes_list = dr.read_pushes(lab)
        shown = len(dr.Device().show(pushes_list))
        keyed = len(dr.Device(dedup_on="delivery_id").show(pushes_list))
        if res.claimed:
            why = "the clobbered row is due again, so the device gets the same push again"
        elif pushes > 1:
            why = ("nothing is due: the ledger stays right (sent), but the device got the push twice — "
                   "the zombie's, delivered before its request timed out, and worker 2's")
        else:
            why = "nothing is due: the delivery stays sent, pushed once"
        tr.add("worker 2", f"clock +{wait:.0f} s; the next tick claims {len(res.claimed)} row(s)", why,
               {"at": f"T+{clock.elapsed():.0f} s", "status": lab.execute(ROW)[0][0],
                "pushes_to_device": pushes})
        tr.add("device", "show the pushes (drain.Device; the pushes carry no collapse id)",
               "a plain phone shows every push it got; a receiver that keeps the delivery ids it has "
               "seen (the idempotency key sent with the push) shows it once",
               {"banners_shown": shown, "banners_with_delivery_id_key": keyed}, kind="check")
    finally:
        dr.close_drain(w1)
        dr.close_drain(w2)
    tr.summary = {"fence": fence, "zombie_push": zombie_push, "zombie_write_rows": zombie_rows,
                  "final_status": final, "correct_status": correct, "clobbered": final != correct,
                  "reclaimed_after_zombie": len(res.claimed), "pushes_to_device": pushes,
                  "banners_shown": shown, "banners_with_delivery_id_key": keyed}
    return tr


# -- the exercise checker -----------------------------------------------------------------------


@dataclass
class FenceCheck:
    passed: bool
    scenarios: list[dict] = field(default_factory=list)
    problem: str = ""

    def report(self) -> str:
        lines = [("PASS" if self.passed else "FAIL") + ": the completion write "
                 + ("is fenced" if self.passed else "is not fenced correctly")]
        for s in self.scenarios:
            lines.append(f"  {s['scenario']}: zombie's write matched {s['zombie_rows']} row(s), "
                         f"live worker's matched {s['live_rows']}; final status {s['final_status']} "
                         f"({'ok' if s['ok'] else 'WRONG'})")
        if self.problem:
            lines.append(f"  {self.problem}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


def _params(row: dr.Claimed, outcome: dr.Outcome) -> dict:
    return {"id": row.id, "claim_version": row.claim_version, "outcome": outcome.outcome,
            "error": outcome.error, "max_attempts": dr.MAX_ATTEMPTS}


def _write(conn: psycopg.Connection, query: str, row: dr.Claimed, outcome: dr.Outcome) -> int:
    return conn.execute(query, _params(row, outcome)).rowcount


def check_fenced_write(lab: Lab, query: str, *, lease_s: float = dr.LEASE_S) -> FenceCheck:
    """Run ``query`` (a completion write taking ``%(id)s``, ``%(claim_version)s``,
    ``%(outcome)s``, ``%(error)s``, ``%(max_attempts)s``) as a zombie and as the live
    worker, in a scratch schema next to ``lab``'s, in two orders:

    * the zombie writes *after* the live worker recorded 'sent';
    * the zombie writes *while* the live worker is still sending (so the status is
      still 'pending': a status check alone cannot tell the two workers apart).

    Fenced correctly means: the zombie's write matches 0 rows both times, the live
    worker's write matches 1 row, and the delivery ends 'sent'."""
    if not isinstance(query, str) or not query.strip():
        raise LabkitError("The completion write to check is empty.",
                          "pass the SQL text of your UPDATE (see drain_complete.sql).")
    scratch = Lab.open(lab.db, f"{lab.name}_fence_check")
    scenarios, problem = [], ""
    try:
        for zombie_first in (False, True):
            clock = dr.create_ledger(scratch, 1, no_collapse_every=1)
            zombie = dr.make_drain(scratch, "zombie", batch=1, lease_s=lease_s)
            live = dr.make_drain(scratch, "live", batch=1, lease_s=lease_s)
            try:
                (old,) = zombie.claim()
                clock.advance(lease_s + 1)
                (new,) = live.claim()
                late = dr.Outcome("retry", "timeout: no answer from APNs")
                if zombie_first:
                    z = _write(zombie.conn, query, old, late)
                    n = _write(live.conn, query, new, live.sender.send(new))
                else:
                    n = _write(live.conn, query, new, live.sender.send(new))
                    z = _write(zombie.conn, query, old, late)
            except psycopg.Error as exc:
                problem = f"the SQL failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
                break
            finally:
                dr.close_drain(zombie)
                dr.close_drain(live)
            final = scratch.execute("SELECT status FROM delivery WHERE id = 1")[0][0]
            scenarios.append({
                "scenario": ("zombie writes while the live worker is still sending" if zombie_first
                             else "zombie writes after the live worker finished"),
                "zombie_rows": z, "live_rows": n, "final_status": final,
                "ok": z == 0 and n == 1 and final == "sent"})
    finally:
        scratch.drop()
    passed = bool(scenarios) and not problem and all(s["ok"] for s in scenarios)
    if not passed and not problem:
        if any(s["live_rows"] == 0 for s in scenarios):
            problem = "the live worker's own write matched nothing: the fence must let the current claim through."
        elif any(s["zombie_rows"] for s in scenarios):
            problem = ("the zombie's write still lands: carry the claim version it was issued "
                       "(AND claim_version = %(claim_version)s).")
    return FenceCheck(passed, scenarios, problem)


# -- command line: labkit trace zombie ------------------------------------------------------------


@entry_point("labkit trace zombie")
def main(argv: list[str] | None = None) -> int:
    """``labkit trace zombie --fence|--no-fence [--json]``"""
    p = argparse.ArgumentParser(prog="labkit trace zombie",
                                description="Trace a zombie worker's stale write, with or without a fence.")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--fence", dest="fence", action="store_true", help="writes carry claim_version")
    g.add_argument("--no-fence", dest="fence", action="store_false", help="writes match by id only")
    p.add_argument("--lease", type=float, default=dr.LEASE_S, help="lease in seconds (default 120)")
    p.add_argument("--zombie-push", choices=["lost", "delivered"], default="lost",
                   help="the zombie's own push: scripted never to arrive (default), or delivered "
                        "although its request timed out")
    p.add_argument("--json", action="store_true", help="print the summary and steps as JSON")
    args = p.parse_args(argv)
    try:
        dr.check_params(lease_s=args.lease)      # before anything is created
        # a schema of this run's own: two runs at once never touch each other's tables
        with Lab.open(connect(quiet=args.json), f"trace_zombie_{os.getpid()}") as lab:
            tr = zombie_trace(lab, fence=args.fence, lease_s=args.lease, zombie_push=args.zombie_push)
    except LabkitError as exc:
        print(f"labkit: {exc}", file=sys.stderr)
        return 2
    print(tr.report(args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
