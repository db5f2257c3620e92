"""Notebook 15's exercise the server checks: the record step of an inbox consumer.

The learner writes one statement taking ``%(event_id)s`` that returns a row only when the
event was not seen before.  :func:`check_record` plays two consumer instances, ``A`` and
``B``, around it, each delivery in a transaction of its own: ``BEGIN``; the learner's
statement; the effect (one more shipping label for the event's order, ``inbox.sql``'s
``effect``) only if a row came back; ``COMMIT``.  The deliveries, in a scripted order:

1. the first three events once each (A, A, B);
2. a later copy of the first event (B), after its first delivery committed;
3. two copies of the fourth event at the same moment: A runs the statement and keeps its
   transaction open, B runs it meanwhile, then A applies the effect and commits, then B
   finishes;
4. two copies of the fifth event at the same moment, A's delivery failing: A runs the
   statement and keeps its transaction open, B runs it meanwhile, then A rolls back (its
   consumer died, or its effect failed), then B finishes.  B's copy must come back as new:
   once A's record is gone, B's is the only delivery left to apply the event.

It then reads the labels printed per order and the inbox's rows: every effect must have
happened exactly once, every event must be recorded, and no delivery may fail.  A
check-then-insert (the inbox read with ``SELECT ... WHERE event_id = ...`` before the
record is written) passes steps 1 and 2 and fails step 3: B's read sees only what had
committed when its statement began, and A had not committed yet, so B's insert goes ahead,
waits for A's and then fails on the primary key (or, where the check only decides what to
return, both copies come back as new).  A statement that takes the id for a
copy without waiting for the transaction that holds it (a try-lock, say) passes steps 1 to 3
and fails step 4: B's copy comes back empty and is acknowledged, A's record rolls back, and
the event ends recorded and applied by nobody.

The hint names what went wrong, most telling finding first, and what to look at; it never
gives the statement.  The notebook's starting point, run unchanged
(:data:`STARTER`, compared without regard to comments, spacing or case), gets its verdict
lines and an invitation to change it, not the hint.  The SQL must be one statement, and must take the event's id as
``%(event_id)s``: anything else is refused before the checker runs it, with the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from ...core.errors import LabkitError
from ...core.lab import Lab
from ...core.queries import query
from ...core.sessions import Sessions
from ...core.steps import Step
from ...labs.relay import create_outbox, event_id, place_orders
from . import Check, Solo, bind, scratch, unchanged

EVENTS = 5                     # evt-0001 .. evt-0005, one order each
LATER_COPY = 1                 # the event delivered again after its first delivery committed
AT_ONCE = 4                    # the event whose two copies arrive at the same moment
ROLLED_BACK = 5                # the same again, and A's delivery of it rolls back

UNIQUE_VIOLATION = "23505"

# The hints, one per way of failing, checked in this order (the first that applies is shown).
HINT_FIRST_FAILED = ("The statement failed on the very first delivery: read the error above, and "
                     "try the statement alone in a session on one event id.")
HINT_NEVER_A_ROW = ("The checker applies the effect only when your statement returns a row: have "
                    "it return the event id when, and only when, it recorded it.")
HINT_NOTHING_RECORDED = ("A later copy can be recognised only by a row in the inbox: the statement "
                         "must record the event id there.")
HINT_RACE_FAILED = ("B's check read a snapshot taken when its statement began, before A committed, so "
                    "it let B's insert go ahead; that insert waited for A's and then hit the primary "
                    "key. A check cannot see an uncommitted twin: let the insert's own outcome "
                    "decide, so that finding the key taken leaves it with no row instead of an "
                    "error.")
HINT_KEY_FAILED = ("A copy reached the inbox's primary key and failed there. A copy is a normal "
                   "event: look at what an INSERT can be told to do when its key is already taken.")
HINT_RACE_BOTH = ("B's check read a snapshot taken when its statement began, before A committed, so "
                  "it said new. A check cannot see an uncommitted twin: let the insert's own "
                  "outcome decide, a row back only when this statement inserted one.")
HINT_COPY_ROW = ("A copy came back with a row: return a row only when this statement inserted the "
                 "id, not when it was already there.")
HINT_ROLLBACK_LOST = ("B took its copy for a copy while A's record of the event was not committed "
                      "yet. A's transaction then rolled back, so nobody recorded the event or "
                      "applied it, and B's delivery was acknowledged all the same. A record that "
                      "is not committed may still go away: B can only know it is a copy once it "
                      "knows how A's transaction ended.")
HINT_OTHER = ("Every effect once: the statement must record the id and return a row exactly when "
              "this delivery recorded it.")


# The notebook's starting point (its MY_RECORD cell): run unchanged, it gets the verdict and an
# invitation to change it, without the hint.
STARTER = """
INSERT INTO inbox (event_id)
SELECT %(event_id)s
 WHERE NOT EXISTS (SELECT 1 FROM inbox WHERE event_id = %(event_id)s)
RETURNING event_id
"""
STARTER_HINT = ("That is the statement the notebook started you with, unchanged. The lines above "
                "say which delivery went wrong: change it and run the cell again.")


def is_starter(sql_text: str) -> bool:
    """Whether ``sql_text`` is :data:`STARTER` (see :func:`unchanged`)."""
    return unchanged(sql_text, STARTER)


def _labels(lab: Lab) -> dict[int, int]:
    return dict(lab.execute(query("inbox_check.sql", "labels").sql))


def _recorded(lab: Lab) -> list[str]:
    return [r[0] for r in lab.execute(query("inbox_check.sql", "recorded").sql)]


class _Consumers:
    """Two consumer instances over one scratch lab, each delivery its own transaction."""

    def __init__(self, run: Sessions, texts: dict[str, str], effects: dict[str, str]) -> None:
        self.run, self.texts, self.effects = run, texts, effects
        self.failed: list[str] = []
        self.sqlstates: list[str] = []

    def record(self, session: str, event: str) -> Step:
        """BEGIN, then the learner's statement (it may wait: the script goes on)."""
        self.run.step(session, "BEGIN")
        return self.run.step(session, self.texts[event], label=f"record {event}")

    def finish(self, session: str, event: str, step: Step) -> bool | None:
        """The effect if a row came back, then COMMIT (ROLLBACK after an error).  Returns
        True (applied), False (taken for a copy) or None (the statement failed)."""
        if not step.done:
            self.run.wait(session)
        if step.error:
            self.failed.append(f"{event} in session {session}: {step.error.short()}")
            self.sqlstates.append(step.error.sqlstate)
            self.run.step(session, "ROLLBACK")
            return None
        applied = bool(step.rows)
        if applied:
            self.run.step(session, self.effects[event], label=f"effect of {event}")
        self.run.step(session, "COMMIT")
        return applied

    def deliver(self, session: str, event: str) -> bool | None:
        return self.finish(session, event, self.record(session, event))

    def abort(self, session: str, step: Step) -> None:
        """ROLLBACK after the statement, whatever it returned: the delivery died."""
        if not step.done:
            self.run.wait(session)
        self.run.step(session, "ROLLBACK")


def _said(applied: bool | None) -> str:
    return {True: "a row", False: "no row", None: "an error"}[applied]


def _one_statement(scene: Lab, sql_text: str, event: str) -> None:
    """Refuse SQL that holds more than one statement, with the fix.  The server is the judge:
    sent with a parameter, a text goes through the extended query protocol, which takes one
    statement only; EXPLAIN plans it without running it."""
    with Solo(scene, role="check") as conn:
        try:
            conn.execute("EXPLAIN " + sql_text, {"event_id": event})
        except psycopg.Error as exc:
            if "multiple commands" in str(exc):
                raise LabkitError("The record step must be one statement; this SQL holds more than "
                                  "one.",
                                  "write it as a single statement (a WITH query can hold several "
                                  "steps), with no semicolon between parts.") from None


@dataclass(frozen=True)
class _Deliveries:
    """What the record step gave on each scripted delivery: True (a row, so the effect was
    applied), False (no row: taken for a copy) or None (it failed)."""

    ids: list[str]                       # the events, evt-0001 first
    firsts: dict[str, bool | None]       # each event's first delivery but the last two's
    later: bool | None                   # the later copy of the first event
    a: bool | None                       # A's copy of the twin
    b: bool | None                       # B's copy of the twin
    b_waited: bool                       # did B's copy wait (for A's transaction)?
    after_rollback: bool | None          # B's copy of the event whose A copy rolled back
    after_rollback_waited: bool          # did that copy wait (for A's transaction)?
    failed: list[str]                    # each failed delivery, with its error
    sqlstates: list[str]                 # each failed delivery's SQLSTATE

    @property
    def copy(self) -> str:
        """The event delivered again after its first delivery committed."""
        return self.ids[LATER_COPY - 1]

    @property
    def twin(self) -> str:
        """The event whose two copies arrive at the same moment."""
        return self.ids[AT_ONCE - 1]

    @property
    def orphan(self) -> str:
        """The event whose two copies arrive at the same moment, A's delivery rolling back."""
        return self.ids[ROLLED_BACK - 1]


def _refuse_unusable(lab: Lab, sql_text: str, ids: list[str]) -> None:
    """Refuse, with the fix, SQL that is not a string, is empty, takes unknown parameters,
    or never reads the event's id."""
    if not isinstance(sql_text, str):
        raise LabkitError(f"check_record takes the SQL as a string, not {type(sql_text).__name__}.",
                          'write the statement in a string: check_record(lab, """INSERT ...""").')
    if bind(lab, sql_text, {"event_id": ids[0]}) == bind(lab, sql_text, {"event_id": ids[1]}):
        raise LabkitError("The statement does not use %(event_id)s, so it does the same for every "
                          "event.",
                          "write %(event_id)s wherever the statement needs the event's id: the "
                          "checker fills in each delivery's id there.")


def _bound(scene: Lab, sql_text: str, ids: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Each event's record step and effect, its parameters written in."""
    texts = {e: bind(scene, sql_text, {"event_id": e}) for e in ids}
    effect = query("inbox.sql", "effect").text
    effects = {e: bind(scene, effect, {"order_id": n}) for n, e in enumerate(ids, 1)}
    return texts, effects


def _deliver_the_rest(c: _Consumers, ids: list[str], first: bool) -> _Deliveries:
    """After the first event's delivery: the next two first deliveries, the later copy, the
    twin's two copies at the same moment (A records, B records, A finishes, B finishes), then
    the fifth event's two copies the same way, but A rolls back instead of finishing."""
    firsts: dict[str, bool | None] = {ids[0]: first}
    firsts[ids[1]] = c.deliver("A", ids[1])
    firsts[ids[2]] = c.deliver("B", ids[2])
    copy, twin = ids[LATER_COPY - 1], ids[AT_ONCE - 1]
    later = c.deliver("B", copy)
    a_step = c.record("A", twin)
    b_step = c.record("B", twin)
    b_waited_for_a = not b_step.done
    a = c.finish("A", twin, a_step)
    b = c.finish("B", twin, b_step)
    b_waited = b_step.waited or b_waited_for_a
    orphan = ids[ROLLED_BACK - 1]
    a_step = c.record("A", orphan)
    b_step = c.record("B", orphan)
    b_waited_for_a = not b_step.done
    c.abort("A", a_step)
    after_rollback = c.finish("B", orphan, b_step)
    return _Deliveries(ids, firsts, later, a, b, b_waited, after_rollback,
                       b_step.waited or b_waited_for_a, c.failed, c.sqlstates)


def _none_failed(d: _Deliveries) -> tuple[bool, str]:
    """No delivery may fail: a copy comes back empty."""
    return (not d.failed, "no delivery failed" if not d.failed else
            "a copy must come back empty, not fail (a consumer reports a failed delivery as an "
            "error and does not acknowledge it): " + "; ".join(d.failed[:2]))


def _firsts_new(d: _Deliveries) -> tuple[bool, str]:
    """Each first delivery comes back as new."""
    firsts = d.firsts
    new = [e for e, applied in firsts.items() if applied]
    return (len(new) == len(firsts), f"the first delivery of {', '.join(firsts)} came back as new"
            if len(new) == len(firsts) else
            "a first delivery came back without a row, so its effect was never applied ("
            + ", ".join(f"{e}: {_said(v)}" for e, v in firsts.items() if not v) + ")")


def _later_copy_skipped(d: _Deliveries) -> tuple[bool, str]:
    """The later copy comes back empty."""
    later, copy = d.later, d.copy
    return (later is False, f"the later copy of {copy} came back empty: skipped" if later is False
            else f"the later copy of {copy} came back with {_said(later)}"
            + (": its label was printed again" if later else ""))


def _twins_once(d: _Deliveries) -> tuple[bool, str]:
    """Of the two copies at the same moment, exactly one comes back as new, and neither fails."""
    a, b, twin = d.a, d.b, d.twin
    once = [a, b].count(True) == 1 and None not in (a, b)
    waited = " (after waiting for A's COMMIT)" if d.b_waited else ""
    return (once, f"the two copies of {twin} at the same moment: A's came back as new; B's waited "
            "for A's transaction, then came back empty" if once and d.b_waited else
            f"the two copies of {twin} at the same moment: one came back as new, the other empty"
            if once else f"the two copies of {twin} at the same moment: A's came back with "
            f"{_said(a)}, B's{waited} with {_said(b)}"
            + (", so both were applied" if a and b else ", so neither was applied" if a is b is False else ""))


def _rolled_back_twin_new(d: _Deliveries, labels: dict[int, int], recorded: list[str]) -> tuple[bool, str]:
    """B's copy of the event whose A copy rolled back comes back as new, and the event ends
    recorded and applied."""
    after, orphan = d.after_rollback, d.orphan
    head = (f"the two copies of {orphan} at the same moment, A's rolled back after your "
            "statement: B's")
    if after is True:
        waited = " waited for A's transaction, then" if d.after_rollback_waited else ""
        return True, f"{head}{waited} came back as new, and applied the event"
    if after is None:
        return False, f"{head} came back with an error"
    label = labels.get(ROLLED_BACK, 0)
    kept = orphan in recorded
    return False, (f"{head} came back empty" + ("" if d.after_rollback_waited else
                                                 " without waiting for A")
                   + (", and B's delivery was acknowledged: the event ended recorded by nobody "
                      "and applied by nobody (its label never printed)"
                      if not kept and not label else
                      f" (label printed {label} time(s), "
                      f"{'recorded' if kept else 'not recorded'})"))


def _labels_once(labels: dict[int, int], ids: list[str]) -> tuple[bool, str]:
    """Each order's label was printed exactly once."""
    counts = [labels.get(n, 0) for n in range(1, EVENTS + 1)]
    wrong = {ids[n - 1]: k for n, k in enumerate(counts, 1) if k != 1}
    return (not wrong, f"every effect happened exactly once (labels printed per order: "
            f"{', '.join(map(str, counts))})" if not wrong else
            f"labels printed per order: {', '.join(map(str, counts))} ("
            + "; ".join(f"{e} {'twice' if k == 2 else 'never' if k == 0 else f'{k} times'}"
                        for e, k in wrong.items()) + ")")


def _all_recorded(recorded: list[str], ids: list[str]) -> tuple[bool, str]:
    """The inbox holds every event id."""
    return (recorded == ids, f"the inbox holds all {EVENTS} event ids" if recorded == ids else
            f"the inbox holds {len(recorded)} of the {EVENTS} event ids"
            + (": nothing was recorded, so no later copy can be recognised" if not recorded else ""))


def _hint(d: _Deliveries, recorded: list[str]) -> str:
    """The hint for the most telling way the step failed (the first rule that applies)."""
    key_failed = UNIQUE_VIOLATION in d.sqlstates
    a, b, later = d.a, d.b, d.later
    for applies, hint in ((not any(d.firsts.values()), HINT_NEVER_A_ROW),
                          (not recorded, HINT_NOTHING_RECORDED),
                          (key_failed and later is False, HINT_RACE_FAILED),
                          (key_failed, HINT_KEY_FAILED),
                          (a is True and b is True and later is False, HINT_RACE_BOTH),
                          (later is True or (a is True and b is True), HINT_COPY_ROW),
                          (d.after_rollback is False, HINT_ROLLBACK_LOST)):
        if applies:
            return hint
    return HINT_OTHER


def check_record(lab: Lab, sql_text: str) -> Check:
    """Check ``sql_text``, an inbox consumer's record step: one statement taking
    ``%(event_id)s`` that returns a row only when this event was not seen before.  The
    checker applies the effect only when a row comes back, in the same transaction, over
    the deliveries described in this module's docstring, in a scratch schema of its own.
    It passes when no delivery fails, each first delivery comes back as new, the later copy
    and exactly one of the two simultaneous copies come back empty, B's copy of the event
    whose A copy rolled back comes back as new, each order's label was printed once and the
    inbox holds every event id.  The untouched starting point gets :data:`STARTER_HINT`."""
    ids = [event_id(i) for i in range(1, EVENTS + 1)]
    # empty SQL, unknown parameters: refused now; so is SQL that never reads the event's id
    _refuse_unusable(lab, sql_text, ids)
    check = Check("an inbox consumer's record step: 5 events, a later copy, two pairs at once")
    scene = scratch(lab)
    try:
        create_outbox(scene)
        _one_statement(scene, sql_text, ids[0])
        place_orders(scene, EVENTS)
        texts, effects = _bound(scene, sql_text, ids)
        with Sessions(scene, "A", "B", lock_timeout="3s", statement_timeout="5s") as run:
            c = _Consumers(run, texts, effects)
            first = c.deliver("A", ids[0])
            if first is None:
                check.add(False, f"the record step failed on the first delivery: {c.failed[0]}")
                check.hint = HINT_FIRST_FAILED
                return check
            d = _deliver_the_rest(c, ids, first)
        labels, recorded = _labels(scene), _recorded(scene)
    finally:
        scene.drop()

    for ok, text in (_none_failed(d), _firsts_new(d), _later_copy_skipped(d), _twins_once(d),
                     _rolled_back_twin_new(d, labels, recorded),
                     _labels_once(labels, ids), _all_recorded(recorded, ids)):
        check.add(ok, text)
    check.hint = STARTER_HINT if is_starter(sql_text) else _hint(d, recorded)
    return check
