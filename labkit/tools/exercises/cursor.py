"""Notebook 13's exercises the server checks: a relay's read that keeps its place with a
cursor and loses nothing (:func:`check_safe_read`), and a claim that two relays run without
reordering an order's events (:func:`check_aggregate_claim`).

:func:`check_safe_read` plays three producers in a scripted order on the outbox of
:mod:`labkit.labs.cursor` (with its ``xid`` column), in four acts.  P1 inserts first and
commits late, P2 commits in between.  P3's transaction writes first (its order row) but gets
its outbox id after P2's second, and commits while P2 is still open.  Then P1 writes an order
row, P2 and P3 each commit an order, and P1 writes its outbox row last and commits: three
committed rows whose id order and xid order differ, for one read with a batch of 2.  Last,
one transaction of P1 places three orders, more rows than a batch, and P2 commits one more:
a cursor on the xid alone passes the rows of P1's transaction that its batch left out.
Between the steps the relay runs the learner's read nine times, the checker moving the
cursor (``%(last_xid)s``, ``%(last_id)s``) to the last row each read returned.  What each
read returned is compared with what the database held committed at that moment.

:func:`check_aggregate_claim` runs the learner's claim in two relays at once over the
outbox of :mod:`labkit.labs.ordering` (a version per order), the second relay publishing
first, round after round, and reads the broker's order back from what it recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.errors import LabkitError
from ...core.lab import Lab
from ...core.limits import number
from ...core.queries import query as named_query
from ...core.sessions import Sessions
from ...core.steps import Step
from ...labs import cursor as cg
from ...labs import fencing
from ...labs import ordering as od
from ...labs import relay as rl
from . import Check, bind, scratch

POLLS = 9
BATCH = 2
ONE_TRANSACTION = 3      # act 4: the rows one transaction of P1 writes, more than a batch
SAFE_READ = """\
SELECT id, event_id
  FROM outbox
 WHERE xid < pg_snapshot_xmin(pg_current_snapshot())
   AND (xid, id) > (%(last_xid)s::xid8, %(last_id)s)
 ORDER BY xid, id
 LIMIT %(batch)s
"""
SAFE_READ_HINT = ("Which rows can still commit behind your cursor? For each row a finding names, "
                  "compare when its transaction first wrote, when it committed, and where the "
                  "cursor stood then; and remember that the cursor moves to the last row a read "
                  "returns.")



def _outbox_ids(check: Check, rows: list, what: str) -> list[int] | None:
    """The outbox ids in the first column of ``rows``; None, with a finding naming ``what``,
    when that column is not ids."""
    try:
        return [int(r[0]) for r in rows]
    except (TypeError, ValueError, IndexError):
        check.add(False, f"{what} returned {rows[:3]}: its first column should be the outbox id")
        return None

def _params(last_xid: str, last_id: int) -> dict:
    return {"last_xid": last_xid, "last_id": last_id, "batch": BATCH}


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids)) or "none"


def check_safe_read(lab: Lab, query: str, *, wait_s: float = 10.0) -> Check:
    """Run ``query`` -- the relay's read, one statement taking ``%(last_xid)s`` (text, cast it
    with ``::xid8``), ``%(last_id)s`` and, if it likes, ``%(batch)s`` (2), returning outbox
    ids in its first column -- nine times between scripted producers' steps, moving the
    cursor to (xid, id) of the last row each read returned.  It passes when every committed
    event was returned, none twice, and none before it had committed.  ``wait_s``: how long
    to wait for other sessions' older transactions, which would hold any safe read back."""
    number("wait_s", wait_s, high=cg.MAX_WAIT_S, unit=" s", example=10)
    bind(lab, query, _params("0", 0))                      # empty SQL or unknown parameters
    check = Check(f"a relay reads {POLLS} times while three producers commit out of order",
                  hint=SAFE_READ_HINT)
    box = scratch(lab)
    try:
        rl.create_outbox(box)
        for stmt in named_query("cursor.sql", "tables").statements:
            box.execute(stmt)
        return _run_safe_read(box, query, check, wait_s)
    finally:
        box.drop()


def _placed(step: Step) -> int:
    """The outbox id a producer's step returned; a step that failed raises, saying so."""
    if step.error or not step.rows:
        raise LabkitError(f"A producer's step failed in the checker's scene ({step.outcome()}).",
                          "run the check again; if it fails again, the scene's tables are broken.")
    return int(step.rows[-1][0])


def _act_four(box: Lab, run: Sessions) -> tuple[list[int], int]:
    """Act 4: one transaction of P1 places ``ONE_TRANSACTION`` orders, more rows than a read's
    batch, and commits; then P2 commits one order.  Returns the outbox ids of P1's rows and
    of P2's."""
    run.P1("BEGIN")
    rows = [_placed(run.P1(cg.place_text(box, k))) for k in range(8, 8 + ONE_TRANSACTION)]
    run.P1("COMMIT")
    return rows, _placed(run.P2(cg.place_text(box, 8 + ONE_TRANSACTION)))


def _run_safe_read(box: Lab, query: str, check: Check, wait_s: float) -> Check:
    """The producers' four acts with the relay's reads between them, then the findings (no
    more once a read failed: its finding says why)."""
    cursor = ("0", 0)
    polls: list[list[int]] = []
    early: list[str] = []
    story: dict[int, str] = {}
    with Sessions(box, "P1", "P2", "P3", "relay") as run:
        def poll() -> bool:
            nonlocal cursor
            cg.settle_other_writers(box, run, wait_s)
            st = run.relay(bind(box, query, _params(*cursor)), label=f"read {len(polls) + 1}")
            if st.error:
                check.add(False, f"read {len(polls) + 1} failed: {st.error.short()}")
                return False
            got = _outbox_ids(check, st.rows, f"read {len(polls) + 1}")
            if got is None:
                return False
            committed = {int(i): x for i, x in box.execute("SELECT id, xid::text FROM outbox")}
            early.extend(f"{i} (read {len(polls) + 1})" for i in got if i not in committed)
            polls.append(got)
            if got and got[-1] in committed:
                cursor = (committed[got[-1]], got[-1])
            return True

        run.P1("BEGIN")
        p1 = _placed(run.P1(cg.place_text(box, 1)))
        story[p1] = "P1's: inserted first, committed after read 1"
        p2 = _placed(run.P2(cg.place_text(box, 2)))
        story[p2] = "P2's: committed at once"
        ok = poll()
        run.P1("COMMIT")
        ok = ok and poll()
        order3, event3 = cg.place_parts(box, 3)
        run.P3("BEGIN")
        run.P3(order3)                                     # P3's first write: its xid
        run.P2("BEGIN")
        p4 = _placed(run.P2(cg.place_text(box, 4)))        # a newer xid, an older id
        p3 = _placed(run.P3(event3))
        run.P3("COMMIT")
        story[p3] = "P3's: its transaction began writing before P2's second, committed before read 3"
        story[p4] = "P2's second: a lower id than P3's row, a newer xid, committed after read 3"
        ok = ok and poll()
        run.P2("COMMIT")
        ok = ok and poll()
        order5, event5 = cg.place_parts(box, 5)
        run.P1("BEGIN")
        run.P1(order5)                                     # P1's first write: the oldest xid of the act
        p5 = _placed(run.P2(cg.place_text(box, 6)))
        p6 = _placed(run.P3(cg.place_text(box, 7)))
        p7 = _placed(run.P1(event5))                       # the oldest xid, the highest id
        run.P1("COMMIT")
        story[p5] = story[p6] = "committed at once, a newer xid than row 7's"
        story[p7] = ("P1's second: its transaction wrote before rows 5 and 6, its outbox row came "
                     "last, all three committed before read 5")
        ok = ok and poll() and poll()
        act_four = (*_act_four(box, run), len(polls) + 1)   # and the first read after it
        while ok and len(polls) < POLLS:
            ok = poll()
    if ok:
        _judge_safe_read(check, box, polls, early, story, act_four)
    return check


def _judge_safe_read(check: Check, box: Lab, polls: list[list[int]], early: list[str],
                     story: dict[int, str], act_four: tuple[list[int], int, int]) -> None:
    """The findings on what the reads returned, against every row committed by the end: none
    of the first three acts lost, none of act 4 lost (``act_four``: the rows of P1's one
    transaction, P2's row, the first read after them), none twice, none before it had
    committed."""
    every = [int(i) for (i,) in box.execute("SELECT id FROM outbox ORDER BY id")]
    returned = [i for got in polls for i in got]
    shown = "; ".join(_ids(got) for got in polls)
    if not returned:
        check.add(False, f"the reads returned no row at all ({shown}), while {len(every)} were committed")
        return
    lost = [i for i in every if i not in returned and i not in [*act_four[0], act_four[1]]]
    check.add(not lost, f"every committed event of acts 1 to 3 was returned (the reads, in turn: {shown})"
              if not lost else
              f"the reads returned, in turn: {shown}. " + "; ".join(
                  f"{'Row' if k == 0 else 'row'} {i} ({story.get(i, 'a producer')}) was never returned"
                  for k, i in enumerate(lost)))
    _judge_one_transaction(check, returned, *act_four)
    twice = sorted({i for i in returned if returned.count(i) > 1})
    check.add(not twice, "no event was returned twice" if not twice else
              f"row(s) {_ids(twice)} returned more than once: the cursor did not move past them")
    check.add(not early, "every row a read returned had committed before that read" if not early
              else f"returned rows that were not committed outbox rows at that moment: {', '.join(early)}")


def _judge_one_transaction(check: Check, returned: list[int], rows: list[int], p2: int,
                           read: int) -> None:
    """The finding on act 4: every row of P1's one transaction, ``rows`` (more than a batch),
    and P2's row ``p2`` after it, both committed before read ``read``, was returned."""
    missed = [i for i in [*rows, p2] if i not in returned]
    check.add(not missed, f"act 4: the rows of P1's one transaction, {_ids(rows)} (more rows than a "
              f"batch), and P2's row {p2} after them were all returned" if not missed else
              f"act 4: one transaction of P1 wrote rows {_ids(rows)} (more rows than a batch) and "
              f"committed, then P2 committed row {p2}, all before read {read}; "
              f"{'row' if len(missed) == 1 else 'rows'} {_ids(missed)} "
              f"{'was' if len(missed) == 1 else 'were'} never returned")


# -- two relays, one claim ----------------------------------------------------------------------

ROUNDS = 12
AGGREGATE_CLAIM_HINT = ("While relay A holds an order's event, what must relay B's claim see in "
                        "order not to take a later event of that order? B cannot see A's claim "
                        "until A commits, but it can see every row of the outbox as it was "
                        "committed.")
# order-1 ... order-3, versions interleaved as a busy shop writes them
SCENE = ["order-1", "order-1", "order-2", "order-1", "order-3", "order-2", "order-3", "order-1",
         "order-2", "order-3"]


def check_aggregate_claim(lab: Lab, query: str, *, batch: int = 2) -> Check:
    """Run ``query`` -- the relay's claim, one statement taking ``%(batch)s`` and returning
    outbox ids in its first column, locking what it returns -- in two relays at once over ten
    events of three orders (versions 1, 2, 3... per order), round after round: relay A claims,
    relay B claims, B publishes and marks its batch and commits, then A does.  It passes when
    every event reaches the broker exactly once, no order has events held by both relays at
    once, and each order's events reach the broker in version order."""
    number("batch", batch, low=1, high=len(SCENE), whole=True, example=2)
    bind(lab, query, {"batch": batch})
    check = Check(f"two relays claim {len(SCENE)} events of {len(set(SCENE))} orders, "
                  "the second one publishing first", hint=AGGREGATE_CLAIM_HINT)
    box = scratch(lab)
    try:
        od.create_ordered_outbox(box)
        for agg in SCENE:
            box.execute(named_query(od.SQL, "produce").sql, {"aggregate": agg})
        return _run_aggregate_claim(box, query, batch, check)
    finally:
        box.drop()


@dataclass
class _Rounds:
    """What the two relays' rounds gave, as they went."""

    broker: list[int] = field(default_factory=list)     # the ids published, in the broker's order
    shared: list[str] = field(default_factory=list)     # orders with events held by both relays at once
    by_both: set[int] = field(default_factory=set)      # events both relays claimed in one round
    stalled: bool = False                               # a round where both claims came back empty


def _claim(run: Sessions, relay: str, text: str, version: dict, check: Check) -> list[int] | None:
    """BEGIN, then the relay's claim: the outbox ids it returned, or None once it failed
    (its finding says why)."""
    run.step(relay, "BEGIN")
    st = run.step(relay, text, label="claim")
    if st.error or st.waited:
        why = st.error.short() if st.error else "it waited for the other relay's lock"
        check.add(False, f"relay {relay}'s claim failed: {why}")
        return None
    ids = _outbox_ids(check, st.rows, f"relay {relay}'s claim")
    if ids is None:
        return None
    if any(i not in version for i in ids):
        check.add(False, f"relay {relay}'s claim returned ids that are not outbox rows")
        return None
    return ids


def _mark_and_commit(run: Sessions, box: Lab, relay: str, ids: list[int], check: Check) -> bool:
    """The relay marks what it claimed (if anything) and commits; False once its mark failed
    (its finding says why)."""
    if ids:
        st = run.step(relay, fencing.bind(box, rl.MARK, ids=ids), label="mark")
        if st.error or st.waited:
            why = (st.error.short() if st.error else
                   "it waited for the other relay's lock on rows both relays had claimed")
            check.add(False, f"relay {relay}'s mark failed: {why}")
            return False
    run.step(relay, "COMMIT")
    return True


def _play_round(run: Sessions, box: Lab, text: str, version: dict, check: Check,
                rounds: _Rounds) -> dict[str, list[int]] | None:
    """One round: A claims, B claims, then B publishes, marks and commits, then A.  Returns
    what each relay claimed, or None once a step failed (its finding says why)."""
    claimed = {}
    for relay in ("A", "B"):
        ids = _claim(run, relay, text, version, check)
        if ids is None:
            return None
        claimed[relay] = ids
    rounds.by_both |= set(claimed["A"]) & set(claimed["B"])
    both = {version[i][0] for i in claimed["A"]} & {version[i][0] for i in claimed["B"]}
    rounds.shared += sorted(both - set(rounds.shared))
    for relay in ("B", "A"):                       # the second claimer publishes first
        rounds.broker += claimed[relay]
        if not _mark_and_commit(run, box, relay, claimed[relay], check):
            return None
    return claimed


def _play_rounds(box: Lab, text: str, version: dict, check: Check) -> _Rounds | None:
    """Up to ROUNDS rounds, until both claims come back empty; None once a step failed."""
    rounds = _Rounds()
    with Sessions(box, "A", "B", lock_timeout="3s") as run:
        for _ in range(ROUNDS):
            claimed = _play_round(run, box, text, version, check, rounds)
            if claimed is None:
                return None
            if not claimed["A"] and not claimed["B"]:
                rounds.stalled = True
                break
    return rounds


def _never_published(left: list[int], version: dict, stalled: bool) -> str:
    """What the finding says of the events left unpublished."""
    oldest: dict[str, int] = {}                         # per order, its oldest event left
    for i in left:
        agg, v = version[i]
        oldest[agg] = min(oldest.get(agg, v), v)
    free = all(j not in left for j, (agg, v) in version.items() if agg in oldest and v < oldest[agg])
    why = ("" if not stalled else
           ": both claims came back empty while no relay held anything" +
           (", though in each order the oldest of them had no older event left unpublished"
            if free else ""))
    return f"{len(left)} of {len(version)} events never reached the broker{why}"


def _delivery_mistakes(left: list[int], version: dict, rounds: _Rounds) -> list[str]:
    """What went wrong with the broker's messages: events never published, events published
    more than once."""
    broker = rounds.broker
    twice = sorted({i for i in broker if broker.count(i) > 1})
    wrong = []
    if left:
        wrong.append(_never_published(left, version, rounds.stalled))
    if twice:
        how = (f"both relays claimed {_ids(sorted(rounds.by_both))} in the same round: nothing kept the "
               "second claim from returning rows the first one held" if rounds.by_both
               else "a claim returned events already published")
        wrong.append(f"{len(twice)} of {len(version)} events reached the broker more than once: {how}")
    return wrong


def _judge_aggregate_claim(check: Check, box: Lab, version: dict, rounds: _Rounds) -> None:
    """The findings: every event published once, no order held by both relays at once, each
    order's events in version order."""
    left = [i for (i,) in box.execute("SELECT id FROM outbox WHERE published_at IS NULL")]
    broker, shared = rounds.broker, rounds.shared
    once = sorted(set(broker)) == sorted(version) and len(broker) == len(version)
    wrong = _delivery_mistakes(left, version, rounds)
    check.add(once, f"every event reached the broker exactly once ({len(broker)} messages)" if once else
              "; ".join(wrong) or "the broker got other messages than the outbox's events")
    check.add(not shared, "no order had events held by both relays at once" if not shared else
              f"order(s) {', '.join(shared)} had events held by both relays at once")
    inv = od.count_inversions([version[i] for i in broker])
    check.add(inv.per_aggregate_inversions == 0,
              "each order reached the broker in version order" if inv.per_aggregate_inversions == 0
              else "; ".join(f"{s.aggregate}: v{s.published_first} reached the broker before "
                             f"v{s.then}" for s in inv.inversions[:3]))


def _run_aggregate_claim(box: Lab, query: str, batch: int, check: Check) -> Check:
    """The two relays' rounds, then the findings (no more once a step failed: its finding
    says why)."""
    text = bind(box, query, {"batch": batch})
    version = {i: (a, v) for i, a, v in box.execute("SELECT id, aggregate, version FROM outbox")}
    rounds = _play_rounds(box, text, version, check)
    if rounds is not None:
        _judge_aggregate_claim(check, box, version, rounds)
    return check
