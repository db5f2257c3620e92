"""A handler that fails is not a worker that crashes: retries, backoff and the dead letter.

A crashed worker writes nothing; its lease runs out and the job is claimed again. A
handler that *raises* leaves a worker that is alive and knows what went wrong, so the
worker records it: it catches the exception and, in a new short transaction fenced by the
claim's ``claim_version`` (``fail`` in ``labkit/sql/retries.sql``), keeps the error in
``last_error`` and decides the job's future:

* a transient error (a timeout, a lost connection, a serialization failure) with attempts
  left: ``PENDING`` again, ``run_at = now + backoff(attempts)``;
* a permanent error (the payload fails validation), or the last attempt failed: ``DEAD``,
  the dead letter, its last error kept for the human who looks at it.

Transient or permanent is a property of the exception (:func:`classify`):
:class:`TransientError` and :class:`PermanentError` say it outright, ``TimeoutError`` and
``ConnectionError`` are transient, ``ValueError`` (:class:`ValidationError` is one) is
permanent. An exception nobody classified counts as **transient**: calling an outage
permanent sends good jobs to the dead letter, where they wait for a human; calling a bad
payload transient only costs ``max_attempts - 1`` extra attempts, and the dead letter still
gets it in the end.

Why a *new* transaction: the handler runs in a transaction of its own (its writes commit
together with ``complete``, or not at all); when it raises, that transaction rolls back,
taking with it anything written in it. The failure must be recorded after that rollback, or
it would be rolled back too. The worker computes the backoff itself (so it could add
jitter); the row decides whether there is an attempt left (``attempts < max_attempts``).

The clock. production.sql's claim reads ``now()``; a lab cannot move that. Here everything
runs on the lab's clock instead: the ``lab_clock`` table and ``lab_now()`` function
(``core/clock.py`` and ``sql/clock.sql``, the same clock as the drain's, moved by
:class:`labkit.core.clock.Clock`), and retries.sql's ``claim`` is production.sql's claim
with ``lab_now()`` in place of ``now()`` -- that is the only difference (a test holds it to
that). The success write is production.sql's ``complete``, unchanged (its ``finished_at``
is the server's real time; nothing here prints it). Backoff is exponential,
``min(cap_s, base_s * 2 ** (attempt - 1))``; ``jitter="full"`` draws the delay uniformly
from ``[0, that)`` with a seeded generator, so even a jittered run reproduces exactly.

:func:`job_life` drives a few scripted jobs through all their attempts;
:func:`retry_waits` shows that a retry is not claimed before its ``run_at``;
:func:`retry_herd` shows why backoff needs jitter.
"""

from __future__ import annotations

import json as jsonlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from ..core.clock import T0, Clock
from ..core.errors import LabkitError
from ..core.lab import Lab
from ..core.limits import number
from ..core.queries import query
from ..core.results import Result, not_json
from ..core.text import table as text_table
from ..core.trace import Trace
from .production import fresh_table

if TYPE_CHECKING:
    import pandas as pd

MAX_ATTEMPTS = 4
BASE_S = 2.0
CAP_S = 6.0
LEASE_S = 30.0
JITTERS = ("none", "full")
MAX_JOBS = 20
MAX_ATTEMPTS_CAP = 20
MAX_DELAY_S = 86_400.0
MAX_HERD = 500


def _sql(name: str) -> str:
    return query("retries.sql", name).sql


# -- what a handler raises, and what it means --------------------------------------------------


class TransientError(Exception):
    """The handler says: try again later (an outage, a rate limit, a lock that timed out)."""


class PermanentError(Exception):
    """The handler says: this job will never succeed as it is (no retry)."""


class ValidationError(ValueError):
    """A payload that fails validation -- what a schema library raises (a ValueError)."""


TRANSIENT: tuple[type[BaseException], ...] = (
    TransientError, TimeoutError, ConnectionError,
    psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected,
    psycopg.errors.LockNotAvailable, psycopg.OperationalError)
PERMANENT: tuple[type[BaseException], ...] = (PermanentError, ValueError)
UNKNOWN_IS = "transient"      # see the module's docstring: retried, but only max_attempts times


def classify(exc: BaseException) -> str:
    """``"transient"`` or ``"permanent"``: what a handler's exception means for its job.

    The explicit classes win (a :class:`PermanentError` is permanent even if it is also a
    TimeoutError); then the known ones; anything else is :data:`UNKNOWN_IS` (transient)."""
    if isinstance(exc, PermanentError):
        return "permanent"
    if isinstance(exc, TransientError):
        return "transient"
    if isinstance(exc, PERMANENT):
        return "permanent"
    if isinstance(exc, TRANSIENT):
        return "transient"
    return UNKNOWN_IS


def classified(exc: BaseException) -> bool:
    """Whether anyone classified ``exc`` (else :func:`classify` falls back to :data:`UNKNOWN_IS`)."""
    return isinstance(exc, TRANSIENT + PERMANENT)


def error_text(exc: BaseException) -> str:
    """What ``last_error`` keeps: the exception's class and message."""
    msg = str(exc)
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


# The outcomes a script may ask a handler for, and what the handler then raises.
OUTCOMES: dict[str, Callable[[], BaseException] | None] = {
    "ok": None,
    "timeout": lambda: TimeoutError("no answer in 5 s"),
    "invalid": lambda: ValidationError("amount must be > 0, got -5"),
    "bug": lambda: KeyError("customer_id"),               # nobody classified it: transient
    "throttled": lambda: TransientError("429 Too Many Requests"),
    "rejected": lambda: PermanentError("card declined: account closed"),
}

DEFAULT_SCRIPT: dict[int, list[str]] = {
    1: ["timeout", "timeout", "ok"],     # a flaky upstream: two timeouts, then it answers
    2: ["invalid"],                      # a bad payload: permanent at once
    3: ["timeout"],                      # the upstream is down: timeouts until the dead letter
    4: ["bug", "ok"],                    # an exception nobody classified: retried, then fine
}


def outcome_of(script: list[str], attempt: int) -> str:
    """The scripted outcome of ``attempt`` (1-based); past the list, its last entry repeats."""
    return script[min(attempt, len(script)) - 1]


def describe(script: list[str]) -> str:
    """A script in words: ``["timeout", "timeout", "ok"]`` is "timeout ×2, then ok"."""
    groups: list[list[Any]] = []
    for o in script:
        if groups and groups[-1][0] == o:
            groups[-1][1] += 1
        else:
            groups.append([o, 1])
    words = [o if n == 1 else f"{o} ×{n}" for o, n in groups]
    last = script[-1]
    make = OUTCOMES[last]                   # None for "ok", the only outcome that raises nothing
    if make is not None and classify(make()) == "transient":
        words[-1] = f"{last} every time"
    return ", then ".join(words)


# -- backoff -------------------------------------------------------------------------------------


def backoff(attempt: int, *, base_s: float = BASE_S, cap_s: float = CAP_S, jitter: str = "none",
            rng: random.Random | None = None) -> float:
    """Seconds to wait after failed attempt ``attempt``: ``min(cap_s, base_s * 2 ** (attempt - 1))``;
    with ``jitter="full"``, a uniform draw from ``[0, that)`` made with ``rng`` (seeded by the
    caller, so the run reproduces), rounded to the millisecond."""
    exp = min(cap_s, base_s * 2 ** (attempt - 1))
    if jitter == "none":
        return exp
    if rng is None:
        raise LabkitError("Full jitter needs a random generator to draw from.",
                          "pass rng=random.Random(seed) so that the run reproduces.")
    return round(rng.uniform(0, exp), 3)


@dataclass(frozen=True)
class BackoffStep(Result):
    """The wait after one failed attempt (:func:`backoff_schedule`).

    attempt: the failed attempt, 1-based.
    exponential_s: ``base_s * 2 ** (attempt - 1)``, uncapped, in seconds.
    capped_s: that, capped at ``cap_s``: what the lab waits without jitter, in seconds.
    full_jitter_s: one seeded draw from ``[0, capped_s)``, in seconds.
    """

    attempt: int
    exponential_s: float
    capped_s: float
    full_jitter_s: float


def backoff_schedule(*, attempts: int = 8, base_s: float = BASE_S, cap_s: float = CAP_S,
                     seed: int = 0) -> list[BackoffStep]:
    """One :class:`BackoffStep` per failed attempt: ``attempt``, ``exponential_s`` (uncapped),
    ``capped_s`` (what the lab waits) and ``full_jitter_s`` (one seeded draw from
    ``[0, capped_s)``)."""
    check_params(max_attempts=1, base_s=base_s, cap_s=cap_s, seed=seed)
    number("attempts", attempts, low=1, high=MAX_ATTEMPTS_CAP, whole=True, example=8)
    rng = random.Random(seed)
    return [BackoffStep(attempt=a, exponential_s=base_s * 2 ** (a - 1),
                        capped_s=backoff(a, base_s=base_s, cap_s=cap_s),
                        full_jitter_s=backoff(a, base_s=base_s, cap_s=cap_s, jitter="full", rng=rng))
            for a in range(1, attempts + 1)]


def check_params(*, max_attempts: int = MAX_ATTEMPTS, base_s: float = BASE_S, cap_s: float = CAP_S,
                 jitter: str = "none", seed: int = 0, lease_s: float = LEASE_S) -> None:
    """Every parameter of the retry policy, checked before anything is created."""
    num = (int, float)
    if isinstance(max_attempts, num) and not isinstance(max_attempts, bool) and max_attempts < 1:
        raise LabkitError(f"max_attempts={max_attempts} allows no attempt at all: every job would be "
                          "dead before it ran.",
                          "pass max_attempts >= 1 (4 here; 1 means no retry, the first failure is final).")
    number("max_attempts", max_attempts, low=1, high=MAX_ATTEMPTS_CAP, whole=True, example=MAX_ATTEMPTS)
    if isinstance(base_s, num) and not isinstance(base_s, bool) and base_s <= 0:
        raise LabkitError(f"base_s={base_s}: a backoff of {'0' if base_s == 0 else 'less than 0'} s "
                          "makes every retry due at once, a hot loop against the service that is failing.",
                          "pass base_s > 0 (2 s in the lab; a second or more in production).")
    number("base_s", base_s, above=True, high=MAX_DELAY_S, unit=" s", example=BASE_S)
    number("cap_s", cap_s, above=True, high=MAX_DELAY_S, unit=" s", example=CAP_S)
    if cap_s < base_s:
        raise LabkitError(f"cap_s={cap_s} is below base_s={base_s}: even the first retry would wait "
                          "less than the base.",
                          f"pass cap_s >= base_s (base_s={BASE_S:g}, cap_s={CAP_S:g} in the lab; "
                          "a cap of minutes in production).")
    if jitter not in JITTERS:
        raise LabkitError(f"jitter={jitter!r} is not a jitter this lab knows.",
                          "pass jitter='none' (exact exponential delays) or 'full' (a seeded "
                          "uniform draw from [0, delay)).")
    number("seed", seed, high=2**32 - 1, whole=True, example=0)
    if isinstance(lease_s, num) and not isinstance(lease_s, bool) and lease_s <= 0:
        raise LabkitError(f"A lease of {lease_s} s has run out before the handler starts.",
                          f"pass lease_s > 0 ({LEASE_S:g} s here): longer than a handler takes.")
    number("lease_s", lease_s, above=True, high=MAX_DELAY_S, unit=" s", example=LEASE_S)


def check_script(script: Any) -> dict[int, list[str]]:
    """``script`` as job number -> outcomes, checked: numbers 1..n (n <= 20, the ids the jobs
    get), each a non-empty list of outcomes from :data:`OUTCOMES`."""
    fix = ("pass e.g. script={1: ['timeout', 'timeout', 'ok'], 2: ['invalid']}: job number -> "
           f"its attempts' outcomes, from {', '.join(OUTCOMES)} (the last one repeats).")
    if not isinstance(script, dict) or not script:
        raise LabkitError(f"script={script!r} is not a dict of jobs.", fix)
    if len(script) > MAX_JOBS:
        raise LabkitError(f"script has {len(script)} jobs; this lab runs {MAX_JOBS} at most.", fix)
    out: dict[int, list[str]] = {}
    if set(script) != set(range(1, len(script) + 1)) or any(isinstance(k, bool) for k in script):
        raise LabkitError(f"script's keys {sorted(script, key=str)!r} are not the job numbers 1 to "
                          f"{len(script)} (the ids the jobs get, in order).", fix)
    for n in range(1, len(script) + 1):
        steps = script[n]
        if isinstance(steps, str) or not isinstance(steps, (list, tuple)) or not steps:
            raise LabkitError(f"script[{n}]={steps!r} is not a non-empty list of outcomes.", fix)
        bad = [s for s in steps if s not in OUTCOMES]
        if bad:
            raise LabkitError(f"script[{n}] has unknown outcome(s) {bad!r}.", fix)
        out[n] = list(steps)
    return out


# -- the worker ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """What the claim's RETURNING gives the worker."""
    id: int
    kind: str
    payload: dict
    attempts: int
    max_attempts: int
    claim_version: int


@dataclass(frozen=True)
class Failed:
    """What the fenced failure write gave back: the row's new status, attempts and how long
    until it is due (``wait_s``, None for DEAD); ``delay_s`` the backoff the worker asked for
    (None: no retry asked). ``matched`` False: 0 rows, the claim was stale."""
    id: int
    matched: bool
    status: str | None = None
    attempts: int | None = None
    wait_s: float | None = None
    delay_s: float | None = None


@dataclass(frozen=True)
class Attempt:
    """One attempt, as the worker saw it."""
    job: Job
    error: str | None            # None: the handler returned
    error_is: str | None         # transient, permanent (None when it succeeded)
    unclassified: bool           # nobody classified the exception: it counted as UNKNOWN_IS
    status: str                  # the row's status after the attempt's write; LOST if fenced off
    wait_s: float | None         # PENDING: seconds until run_at
    delay_s: float | None        # the backoff the worker asked for (None: no retry asked)


class LostClaim(Exception):
    """The complete matched 0 rows: the claim is stale; the handler's writes roll back."""


Handler = Callable[[psycopg.Connection, Job], None]


class RetryWorker:
    """One worker: claim (lab clock), run the handler in a transaction with the complete,
    and when it raises, record the failure in a new transaction, fenced."""

    def __init__(self, conn: psycopg.Connection, name: str = "worker 1", *,
                 base_s: float = BASE_S, cap_s: float = CAP_S, jitter: str = "none", seed: int = 0,
                 lease_s: float = LEASE_S):
        check_params(base_s=base_s, cap_s=cap_s, jitter=jitter, seed=seed, lease_s=lease_s)
        self.conn, self.name = conn, name
        self.base_s, self.cap_s, self.jitter, self.lease_s = base_s, cap_s, jitter, lease_s
        self.rng = random.Random(seed)

    def claim(self) -> Job | None:
        """One due job (its lease taken, its fence bumped), or None when nothing is due."""
        row = self.conn.execute(_sql("claim"), {"worker": self.name, "lease_s": self.lease_s}).fetchone()
        return Job(*row) if row else None

    def complete(self, job: Job) -> bool:
        """production.sql's complete, fenced: False when it matched 0 rows."""
        return self.conn.execute(query("production.sql", "complete").sql,
                                 {"id": job.id, "claim_version": job.claim_version}).fetchone() is not None

    def delay_for(self, job: Job) -> float:
        return backoff(job.attempts, base_s=self.base_s, cap_s=self.cap_s, jitter=self.jitter, rng=self.rng)

    def fail(self, job: Job, exc: BaseException) -> Failed:
        """Record the handler's exception in a short transaction of its own, fenced by the
        claim's version: ``matched=False`` when the write matched 0 rows (a stale claim).
        The backoff is drawn only when the claim says an attempt is left; the row decides."""
        transient = classify(exc) == "transient"
        delay = self.delay_for(job) if transient and job.attempts < job.max_attempts else None
        with self.conn.transaction():
            row = self.conn.execute(_sql("fail"), {
                "id": job.id, "claim_version": job.claim_version, "transient": transient,
                "delay_s": delay or 0.0, "error": error_text(exc)}).fetchone()
        if row is None:
            return Failed(job.id, False, delay_s=delay)
        _, status, attempts, _, wait_s = row
        return Failed(job.id, True, status, attempts,
                      round(wait_s, 3) if status == "PENDING" else None, delay)

    def run(self, job: Job, handler: Handler) -> Attempt:
        """Run ``handler(conn, job)`` in a transaction that also completes the job; if it
        raises, that transaction is rolled back and the failure recorded in a new one."""
        try:
            with self.conn.transaction():
                handler(self.conn, job)
                if not self.complete(job):
                    raise LostClaim(f"job {job.id}: claim_version {job.claim_version} is stale")
            return Attempt(job, None, None, False, "DONE", None, None)
        except LostClaim:
            return Attempt(job, None, None, False, "LOST", None, None)
        except Exception as exc:       # the handler failed; the worker does not
            f = self.fail(job, exc)
            status = f.status if f.matched else "LOST"
            if status is None:
                raise LabkitError(f"job {job.id}: the failure write matched its row but gave back no status.",
                                  "report this: retries.sql's fail returns the row's status.") from exc
            return Attempt(job, error_text(exc), classify(exc), not classified(exc),
                           status, f.wait_s, f.delay_s)


def scripted_handler(script: dict[int, list[str]]) -> Handler:
    """A handler that writes its effect (``job_effect``) and then does what ``script`` says
    for this job and attempt: returns ("ok") or raises (see :data:`OUTCOMES`)."""
    def handler(conn: psycopg.Connection, job: Job) -> None:
        conn.execute(_sql("effect"), {"id": job.id, "attempt": job.attempts})
        make = OUTCOMES[outcome_of(script[job.id], job.attempts)]
        if make is not None:
            raise make()
    return handler


# -- setting up, and driving the clock -------------------------------------------------------------


def install(lab: Lab, *, freeze_at: str = T0) -> Clock:
    """(Re)create the production job table (production.sql's ``table``), the handler's
    ``job_effect`` table and the lab's clock, frozen at ``freeze_at``."""
    Clock.install(lab)
    for s in query("retries.sql", "drop").statements:
        lab.execute(s)
    fresh_table(lab)
    for s in query("retries.sql", "effects").statements:
        lab.execute(s)
    return Clock(lab).freeze(freeze_at)


def enqueue(lab: Lab, n: int, *, max_attempts: int = MAX_ATTEMPTS) -> list[int]:
    """``n`` jobs due now on the lab's clock; their ids."""
    return [lab.execute(_sql("enqueue"), {"kind": "work", "max_attempts": max_attempts})[0][0]
            for _ in range(n)]


def _at(seconds: float) -> str:
    return f"T+{round(seconds, 3):g} s"


def _wait(seconds: float) -> str:
    return f"+{round(seconds, 3):g} s"


def _drive(lab: Lab, clock: Clock, worker: RetryWorker, handler: Handler, *, limit: int,
           on_attempt: Callable[[float, Attempt], None],
           on_clock: Callable[[float, float], None] | None = None) -> None:
    """Until no job is pending: take every job due at this instant (claimed one by one),
    run them in id order -- whatever order the claims came back in, so the story is the
    same on every run -- then move the clock to the next run_at."""
    for _ in range(limit):
        due = []
        while (job := worker.claim()) is not None:
            due.append(job)
        if due:
            now = clock.elapsed()
            for job in sorted(due, key=lambda j: j.id):
                on_attempt(now, worker.run(job, handler))
            continue
        before = clock.elapsed()
        if not lab.execute(_sql("advance_to_next_due")):
            return
        if on_clock:
            on_clock(before, clock.elapsed())
    raise LabkitError(f"The jobs were still pending after {limit} rounds.",
                      "report this: every script ends in ok or in the dead letter.")


# -- the story: three (or so) jobs through all their attempts --------------------------------------


@dataclass(frozen=True)
class LifeAttempt(Result):
    """One attempt in :func:`job_life`'s story, as the worker took it.

    job: the job's id.
    script: the job's scripted outcomes, in words (``timeout ×2, then ok``).
    attempt: the attempt's number, 1-based (the row's ``attempts`` after the claim).
    claimed_at: when it was claimed, on the lab's clock (``T+6 s``).
    error: what the handler raised, class and message (None: it returned).
    error_is: ``transient``, ``permanent`` or ``transient (unclassified)`` (None: it returned).
    status: the row's status after the attempt's write: PENDING, DONE, DEAD, or LOST when
        the write was fenced off.
    next: what comes next: the wait until the retry (``+4 s``), or the status.
    wait_s: seconds until the retry's ``run_at`` (None unless PENDING).
    """

    job: int
    script: str
    attempt: int
    claimed_at: str
    error: str | None
    error_is: str | None
    status: str
    next: str
    wait_s: float | None


@dataclass(frozen=True)
class LifeJob(Result):
    """One row of the job table at the end of :func:`job_life`'s story.

    job: the job's id.
    script: its scripted outcomes, in words.
    status: DONE or DEAD.
    attempts: the attempts it was claimed for.
    max_attempts: the attempts it was allowed.
    claim_version: the fence's value at the end (one more per claim).
    last_error: the last error kept (None: it never failed).
    effects: the handler's effects that committed (0 or 1: a failed attempt's roll back).
    """

    job: int
    script: str
    status: str
    attempts: int
    max_attempts: int
    claim_version: int
    last_error: str | None
    effects: int


@dataclass(frozen=True)
class LifeParams(Result):
    """The retry policy :func:`job_life` ran with.

    max_attempts: attempts before the dead letter.
    base_s: the first backoff, in seconds, doubled each attempt.
    cap_s: the longest backoff, in seconds.
    jitter: ``none`` or ``full``.
    seed: the seed of the jitter's draws.
    """

    max_attempts: int
    base_s: float
    cap_s: float
    jitter: str
    seed: int


@dataclass(frozen=True)
class JobOutcome(Result):
    """How one job ended (:meth:`Life.summary`).

    status: DONE or DEAD.
    attempts: the attempts it was claimed for.
    """

    status: str
    attempts: int


@dataclass(frozen=True)
class LifeSummary(Result):
    """:func:`job_life`'s story in a few numbers (:meth:`Life.summary`).

    attempts: the attempts there were in all.
    jobs: per job id, how it ended.
    dead: the ids of the jobs in the dead letter.
    done: the ids of the jobs that succeeded.
    """

    attempts: int
    jobs: dict[int, JobOutcome]
    dead: list[int]
    done: list[int]


@dataclass(frozen=True)
class Life(Result):
    """:func:`job_life`'s result (``labkit trace retries --json`` prints ``params``,
    ``summary()``, ``attempts`` and ``jobs``).

    attempts: every attempt, in the order the worker took them.
    jobs: the job table at the end, in id order.
    params: the retry policy the story ran with.
    trace: the same story as a trace; not in the JSON.
    """

    attempts: list[LifeAttempt]
    jobs: list[LifeJob]
    params: LifeParams
    trace: Trace = not_json()

    ATTEMPT_COLUMNS = ("job", "script", "attempt", "claimed_at", "error", "error_is", "next")
    # max_attempts is the same for every job: the table's first line says it
    JOB_COLUMNS = ("job", "script", "status", "attempts", "last_error", "effects")

    def attempts_df(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([a.as_dict() for a in self.attempts],
                            columns=list(self.ATTEMPT_COLUMNS)).set_index(["job", "attempt"])

    def jobs_df(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([j.as_dict() for j in self.jobs], columns=list(self.JOB_COLUMNS)).set_index("job")

    def to_text(self) -> str:
        p = self.params
        head = (f"max_attempts={p.max_attempts}, backoff min({p.cap_s:g}, "
                f"{p.base_s:g} * 2^(attempt-1)) s, jitter={p.jitter}"
                + (f" (seed {p.seed})" if p.jitter != "none" else ""))
        return "\n".join([head, "", "every attempt", _table(self.attempts, self.ATTEMPT_COLUMNS),
                          "", "the job table at the end", _table(self.jobs, self.JOB_COLUMNS)])

    def __str__(self) -> str:
        return self.to_text()

    def summary(self) -> LifeSummary:
        """Per job: status and attempts; and how many attempts there were in all."""
        return LifeSummary(attempts=len(self.attempts),
                           jobs={j.job: JobOutcome(status=j.status, attempts=j.attempts) for j in self.jobs},
                           dead=[j.job for j in self.jobs if j.status == "DEAD"],
                           done=[j.job for j in self.jobs if j.status == "DONE"])


def _table(rows: list[LifeAttempt] | list[LifeJob], columns: tuple[str, ...]) -> str:
    cells = [[getattr(r, c) for c in columns] for r in rows]
    return text_table(columns, [[str(v) if v is not None else "-" for v in row] for row in cells])


def _next(a: Attempt) -> str:
    if a.status == "PENDING":
        return _wait(a.wait_s or 0)
    return a.status


def _error_is(a: Attempt) -> str | None:
    return f"{a.error_is} (unclassified)" if a.unclassified else a.error_is


def _why(a: Attempt) -> str:
    j = a.job
    if a.error is None:
        return "the handler returned: its effect and the complete commit together" \
            if a.status == "DONE" else "the complete matched 0 rows: the claim was stale"
    if a.status == "LOST":
        return "the failure write matched 0 rows: the claim was stale"
    if a.error_is == "permanent":
        return "permanent: no retry, straight to the dead letter"
    if a.status == "DEAD":
        return f"transient, but attempt {j.attempts} of {j.max_attempts} was the last: dead letter"
    what = "unclassified, so transient" if a.unclassified else "transient"
    return f"{what}, attempt {j.attempts} of {j.max_attempts}: retry after {_wait(a.delay_s or 0)}"


def job_life(lab: Lab, *, script: dict[int, list[str]] | None = None, max_attempts: int = MAX_ATTEMPTS,
             base_s: float = BASE_S, cap_s: float = CAP_S, jitter: str = "none", seed: int = 0,
             lease_s: float = LEASE_S) -> Life:
    """Scripted jobs through every attempt on the lab's frozen clock, one worker, the clock
    moved straight to the next ``run_at`` whenever nothing is due.

    The default ``script`` (:data:`DEFAULT_SCRIPT`): job 1 times out twice, then succeeds;
    job 2's payload is invalid (permanent: dead after 1 attempt); job 3 times out every time
    (dead after ``max_attempts``); job 4 raises a KeyError nobody classified (transient),
    then succeeds. A script's last outcome repeats. Returns a :class:`Life`; its text is the
    same on every run (with ``jitter="full"`` too: the draws are seeded by ``seed``)."""
    check_params(max_attempts=max_attempts, base_s=base_s, cap_s=cap_s, jitter=jitter, seed=seed,
                 lease_s=lease_s)
    script = check_script(DEFAULT_SCRIPT if script is None else script)
    clock = install(lab)
    ids = enqueue(lab, len(script), max_attempts=max_attempts)
    if ids != list(script):
        raise LabkitError(f"The jobs got ids {ids}, not 1 to {len(script)}.",
                          "report this: install() makes the job table afresh, so ids start at 1.")
    by_id = script
    words = {i: describe(s) for i, s in by_id.items()}
    title = (f"A failing handler: retries with backoff, then the dead letter "
             f"(max_attempts={max_attempts}, base {base_s:g} s, cap {cap_s:g} s, jitter {jitter})")
    tr = Trace(title)
    tr.add("queue", f"enqueue {len(ids)} jobs, all due at T", "; ".join(
        f"job {i}: {words[i]}" for i in ids), {"pending": len(ids)})
    rows: list[LifeAttempt] = []

    def on_attempt(now: float, a: Attempt) -> None:
        j = a.job
        rows.append(LifeAttempt(job=j.id, script=words[j.id], attempt=j.attempts, claimed_at=_at(now),
                                error=a.error, error_is=_error_is(a), status=a.status, next=_next(a),
                                wait_s=a.wait_s))
        action = (f"job {j.id} attempt {j.attempts}: "
                  + ("handler returned" if a.error is None else f"handler raised {a.error}"))
        state = {"status": a.status, "attempts": j.attempts, "claim_version": j.claim_version}
        if a.status == "PENDING":
            state["run_at"] = _at(now + (a.wait_s or 0))
        tr.add("worker 1", action, _why(a), state, kind="step" if a.error is None else "error")

    def on_clock(before: float, after: float) -> None:
        tr.add("clock", f"{_wait(after - before)} → {_at(after)}",
               "nothing was due: on to the earliest run_at of a pending job")

    conn = lab.connect(role="retry-w1")
    try:
        worker = RetryWorker(conn, "worker 1", base_s=base_s, cap_s=cap_s, jitter=jitter, seed=seed,
                             lease_s=lease_s)
        _drive(lab, clock, worker, scripted_handler(by_id),
               limit=2 * len(ids) * max_attempts + 2, on_attempt=on_attempt, on_clock=on_clock)
    finally:
        conn.close()
    jobs = [LifeJob(job=r[0], script=words[r[0]], status=r[2], attempts=r[3], max_attempts=r[4],
                    claim_version=r[5], last_error=r[6], effects=r[7])
            for r in lab.execute(_sql("jobs"))]
    life = Life(attempts=rows, jobs=jobs, trace=tr,
                params=LifeParams(max_attempts=max_attempts, base_s=base_s, cap_s=cap_s, jitter=jitter,
                                  seed=seed))
    summary = life.summary()
    tr.summary = {"attempts": len(rows), "done": summary.done, "dead": summary.dead,
                  "clock_at_end": _at(clock.elapsed())}
    return life


# -- a retry is not claimed before its run_at --------------------------------------------------


def retry_waits(lab: Lab, *, base_s: float = BASE_S, early_s: float = 0.5) -> Trace:
    """One job times out at T; its retry is due at T + ``base_s``. The clock moves on by
    ``base_s - early_s``: the claim returns nothing (the row is PENDING, due in ``early_s``);
    then by ``early_s`` more: the claim returns it (attempt 2). Summary keys: ``backoff_s``,
    ``first_advance_s``, ``claimed_early`` (None), ``due_in_s_then``, ``claimed_at_run_at``
    (the job id), ``attempt_then``."""
    check_params(base_s=base_s, cap_s=base_s)
    number("early_s", early_s, above=True, high=MAX_DELAY_S, unit=" s", example=0.5)
    if early_s >= base_s:
        raise LabkitError(f"early_s={early_s} is not less than the backoff base_s={base_s}: the "
                          "first move would already reach run_at.",
                          "pass 0 < early_s < base_s (0.5 s with base_s=2).")
    clock = install(lab)
    (jid,) = enqueue(lab, 1)
    tr = Trace(f"A retry waits for its run_at (backoff {base_s:g} s)")
    conn = lab.connect(role="retry-w1")
    try:
        w = RetryWorker(conn, "worker 1", base_s=base_s, cap_s=base_s)
        job = w.claim()
        if job is None:
            raise LabkitError(f"The claim did not return job {jid}, due now and the only one.",
                              "report this: nothing else uses the lab's job table during this story.")
        a = w.run(job, scripted_handler({jid: ["timeout", "ok"]}))
        tr.add("worker 1", f"job {jid}, attempt 1 at T, raised {a.error}", _why(a),
               {"status": a.status, "run_at": _at(a.wait_s or 0)}, kind="error")
        first = base_s - early_s
        clock.advance(first)
        early = w.claim()
        status, attempts, _, due_in, _ = lab.execute(_sql("row"), {"id": jid})[0]
        tr.add("worker 1", f"clock {_wait(first)} → {_at(clock.elapsed())}: claim",
               "nothing: the only pending job is not due yet" if early is None
               else "claimed before its run_at: the claim does not check run_at",
               {"claimed": None if early is None else early.id, "status": status, "attempts": attempts,
                "due_in": _wait(due_in)}, kind="check" if early is None else "error")
        clock.advance(early_s)
        late = w.claim()
        tr.add("worker 1", f"clock {_wait(early_s)} → {_at(clock.elapsed())}: claim",
               "run_at has come: claimed, attempt 2",
               {"claimed": None if late is None else late.id,
                "attempts": None if late is None else late.attempts})
        if late is not None:
            w.run(late, scripted_handler({jid: ["timeout", "ok"]}))
    finally:
        conn.close()
    tr.summary = {"backoff_s": a.wait_s, "first_advance_s": first,
                  "claimed_early": None if early is None else early.id, "due_in_s_then": round(due_in, 3),
                  "claimed_at_run_at": None if late is None else late.id,
                  "attempt_then": None if late is None else late.attempts}
    return tr


# -- why backoff needs jitter ------------------------------------------------------------------


@dataclass(frozen=True)
class HerdWave(Result):
    """One wave of :func:`retry_herd`: every claim of one attempt number, under one jitter.
    Times are seconds after T on the lab's clock.

    jitter: ``none`` (exact exponential backoff) or ``full``.
    attempt: the attempt's number, 1-based (1: the outage itself).
    claims: the claims of that attempt.
    first_at: the first of them, in seconds after T.
    last_at: the last of them, in seconds after T.
    spread_s: ``last_at - first_at``, in seconds.
    busiest_second: the most claims in one second of the lab's clock.
    """

    jitter: str
    attempt: int
    claims: int
    first_at: float
    last_at: float
    spread_s: float
    busiest_second: int


def retry_herd(lab: Lab, *, jobs: int = 50, failures: int = 3, base_s: float = BASE_S,
               cap_s: float = 60.0, seed: int = 0) -> list[HerdWave]:
    """An outage: ``jobs`` jobs all due at T, each timing out ``failures`` times, then
    succeeding -- once with exact exponential backoff, once with full jitter (seeded).
    One :class:`HerdWave` per (jitter, attempt): ``claims``, ``first_at``/``last_at`` (seconds
    after T), ``spread_s`` and ``busiest_second`` (the most claims in one second of the lab's clock).
    Without jitter every wave arrives in the same instant, however long the backoff grows;
    with it, every wave after the first is spread over its backoff window."""
    number("jobs", jobs, low=1, high=MAX_HERD, whole=True, example=50)
    number("failures", failures, low=1, high=MAX_ATTEMPTS_CAP - 1, whole=True, example=3)
    check_params(max_attempts=failures + 1, base_s=base_s, cap_s=cap_s, seed=seed)
    out: list[HerdWave] = []
    for jitter in JITTERS:
        clock = install(lab)
        ids = enqueue(lab, jobs, max_attempts=failures + 1)
        handler = scripted_handler({i: ["timeout"] * failures + ["ok"] for i in ids})
        seen: dict[int, list[float]] = {}
        conn = lab.connect(role="retry-herd")
        try:
            w = RetryWorker(conn, "worker 1", base_s=base_s, cap_s=cap_s, jitter=jitter, seed=seed)
            # _drive calls on_attempt before it returns, in this iteration: the lambda
            # always sees this jitter's ``seen``, never a later one
            _drive(lab, clock, w, handler, limit=2 * jobs * (failures + 1) + 2,
                   on_attempt=lambda now, a: seen.setdefault(a.job.attempts, []).append(now))  # noqa: B023
        finally:
            conn.close()
        for attempt in sorted(seen):
            times = seen[attempt]
            per_second: dict[int, int] = {}
            for t in times:
                per_second[int(t)] = per_second.get(int(t), 0) + 1
            out.append(HerdWave(jitter=jitter, attempt=attempt, claims=len(times),
                                first_at=round(min(times), 3), last_at=round(max(times), 3),
                                spread_s=round(max(times) - min(times), 3),
                                busiest_second=max(per_second.values())))
    return out


# -- command line ----------------------------------------------------------------------------------


def life_command(*, open_lab: Callable[[], Lab], max_attempts: int = MAX_ATTEMPTS, base_s: float = BASE_S,
                 cap_s: float = CAP_S, jitter: str = "none", seed: int = 0, json: bool = False) -> int:
    """``labkit trace retries [--max-attempts 4] [--base 2] [--cap 6] [--jitter none|full]
    [--seed 0] [--json]``: the default script's life, as tables or JSON (``attempts``,
    ``jobs``, ``summary``, ``params``)."""
    check_params(max_attempts=max_attempts, base_s=base_s, cap_s=cap_s, jitter=jitter, seed=seed)
    with open_lab() as lab:
        life = job_life(lab, max_attempts=max_attempts, base_s=base_s, cap_s=cap_s, jitter=jitter, seed=seed)
    if json:
        print(jsonlib.dumps({"params": life.params.as_dict(), "summary": life.summary().as_dict(),
                             **life.as_dict(only=["attempts", "jobs"])}, indent=2, default=str))
    else:
        print(life.to_text())
    return 0

