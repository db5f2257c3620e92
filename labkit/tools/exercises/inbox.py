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
   finishes.

It then reads the labels printed per order and the inbox's rows: every effect must have
happened exactly once, every event must be recorded, and no delivery may fail.  A
check-then-insert (the inbox read with ``SELECT ... WHERE event_id = ...`` before the
record is written) passes steps 1 and 2 and lets both copies of step 3 through: B's read
sees only what had committed when its statement began, and A had not committed yet.
"""

from __future__ import annotations

from ...core.errors import LabkitError
from ...core.lab import Lab
from ...core.queries import query
from ...core.sessions import Sessions
from ...core.steps import Step
from ...labs.relay import create_outbox, event_id, place_orders
from . import Check, bind, scratch

EVENTS = 4                     # evt-0001 .. evt-0004, one order each
LATER_COPY = 1                 # the event delivered again after its first delivery committed
AT_ONCE = 4                    # the event whose two copies arrive at the same moment

HINT = ("Let the primary key decide, in the statement that records: INSERT INTO inbox (event_id) "
        "VALUES (%(event_id)s) ON CONFLICT (event_id) DO NOTHING RETURNING event_id. A copy whose "
        "twin is not yet committed waits for it, then inserts nothing and returns no row. A check "
        "that reads the inbox first sees only what had committed when it began.")


def _labels(lab: Lab) -> dict[int, int]:
    return dict(lab.execute(query("inbox_check.sql", "labels").sql))


def _recorded(lab: Lab) -> list[str]:
    return [r[0] for r in lab.execute(query("inbox_check.sql", "recorded").sql)]


class _Consumers:
    """Two consumer instances over one scratch lab, each delivery its own transaction."""

    def __init__(self, run: Sessions, texts: dict[str, str], effects: dict[str, str]) -> None:
        self.run, self.texts, self.effects = run, texts, effects
        self.failed: list[str] = []

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
            self.run.step(session, "ROLLBACK")
            return None
        applied = bool(step.rows)
        if applied:
            self.run.step(session, self.effects[event], label=f"effect of {event}")
        self.run.step(session, "COMMIT")
        return applied

    def deliver(self, session: str, event: str) -> bool | None:
        return self.finish(session, event, self.record(session, event))


def _said(applied: bool | None) -> str:
    return {True: "a row", False: "no row", None: "an error"}[applied]


def check_record(lab: Lab, sql_text: str) -> Check:
    """Check ``sql_text``, an inbox consumer's record step: one statement taking
    ``%(event_id)s`` that returns a row only when this event was not seen before.  The
    checker applies the effect only when a row comes back, in the same transaction, over
    the deliveries described in this module's docstring, in a scratch schema of its own.
    It passes when no delivery fails, each first delivery comes back as new, the later copy
    and exactly one of the two simultaneous copies come back empty, each order's label was
    printed once and the inbox holds every event id."""
    if not isinstance(sql_text, str):
        raise LabkitError(f"check_record takes the SQL as a string, not {type(sql_text).__name__}.",
                          'write the statement in a string: check_record(lab, """INSERT ...""").')
    ids = [event_id(i) for i in range(1, EVENTS + 1)]
    bind(lab, sql_text, {"event_id": ids[0]})              # empty SQL, unknown parameters: refused now
    check = Check("an inbox consumer's record step: 4 events, a later copy, two copies at once",
                  hint=HINT)
    scene = scratch(lab)
    try:
        create_outbox(scene)
        place_orders(scene, EVENTS)
        texts = {e: bind(scene, sql_text, {"event_id": e}) for e in ids}
        effect = query("inbox.sql", "effect").text
        effects = {e: bind(scene, effect, {"order_id": n}) for n, e in enumerate(ids, 1)}
        copy, twin = ids[LATER_COPY - 1], ids[AT_ONCE - 1]
        with Sessions(scene, "A", "B", lock_timeout="3s", statement_timeout="5s") as run:
            c = _Consumers(run, texts, effects)
            firsts = {ids[0]: c.deliver("A", ids[0])}
            if firsts[ids[0]] is None:
                check.add(False, f"the record step failed on the first delivery: {c.failed[0]}")
                return check
            firsts[ids[1]] = c.deliver("A", ids[1])
            firsts[ids[2]] = c.deliver("B", ids[2])
            later = c.deliver("B", copy)
            a_step = c.record("A", twin)
            b_step = c.record("B", twin)
            b_waited_for_a = not b_step.done
            a = c.finish("A", twin, a_step)
            b = c.finish("B", twin, b_step)
            b_waited = b_step.waited or b_waited_for_a
        labels, recorded = _labels(scene), _recorded(scene)
    finally:
        scene.drop()

    check.add(not c.failed, "no delivery failed" if not c.failed else
              "a copy must come back empty, not fail (a failed delivery is delivered again, and "
              "fails again): " + "; ".join(c.failed[:2]))
    new = [e for e, applied in firsts.items() if applied]
    check.add(len(new) == len(firsts), f"the first delivery of {', '.join(firsts)} came back as new"
              if len(new) == len(firsts) else
              "a first delivery came back without a row, so its effect was never applied ("
              + ", ".join(f"{e}: {_said(v)}" for e, v in firsts.items() if not v) + ")")
    check.add(later is False, f"the later copy of {copy} came back empty: skipped" if later is False
              else f"the later copy of {copy} came back with {_said(later)}"
              + (": its label was printed again" if later else ""))
    once = [a, b].count(True) == 1 and None not in (a, b)
    waited = " (after waiting for A's COMMIT)" if b_waited else ""
    check.add(once, f"the two copies of {twin} at the same moment: A's came back as new; B's waited "
              "for A's transaction, then came back empty" if once and b_waited else
              f"the two copies of {twin} at the same moment: one came back as new, the other empty"
              if once else f"the two copies of {twin} at the same moment: A's came back with "
              f"{_said(a)}, B's{waited} with {_said(b)}"
              + (", so both were applied" if a and b else ", so neither was applied" if a is b is False else ""))
    counts = [labels.get(n, 0) for n in range(1, EVENTS + 1)]
    wrong = {ids[n - 1]: k for n, k in enumerate(counts, 1) if k != 1}
    check.add(not wrong, f"every effect happened exactly once (labels printed per order: "
              f"{', '.join(map(str, counts))})" if not wrong else
              f"labels printed per order: {', '.join(map(str, counts))} ("
              + "; ".join(f"{e} {'twice' if k == 2 else 'never' if k == 0 else f'{k} times'}"
                          for e, k in wrong.items()) + ")")
    check.add(recorded == ids, f"the inbox holds all {EVENTS} event ids" if recorded == ids else
              f"the inbox holds {len(recorded)} of the {EVENTS} event ids"
              + (": nothing was recorded, so no later copy can be recognised" if not recorded else ""))
    return check
