"""The decoding loop of the server: one thread per model drives one :class:`~setdlm.decoding.session.Session`
(continuous batching, docs/serve.md).

Requests wait in a bounded queue: a request is taken while the batch has a free row or fewer than
``max_queue`` requests wait beyond the free rows (else :class:`QueueFull`, answered 429); ``max_queue=0``
means no waiting at all, only free rows. Between two steps the loop
admits waiting requests while the batch has room (``max_batch`` rows), drops cancelled ones (a client that
went away) and those past their deadline, then runs one step and hands every row's event to its
request's asyncio queue. Finished rows leave the batch in the step that finished them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from ..decoding.session import Row, RowStep, Session
from .options import ServeOptions


class QueueFull(Exception):
    pass


@dataclass(eq=False)  # jobs are compared by identity (the queue finds and removes them)
class Job:
    """One choice of a request in flight (a request's choices share one ``queue``): the batcher puts its
    :data:`Event` on it, a :class:`Stepped` (every step when ``stream``, else only the last) or a
    :class:`Failed`. ``traces``: the row's steps so far (its logprobs are read from them)."""

    row: Row
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Event]
    deadline: float  # time.monotonic() after which the request is dropped
    stream: bool = False  # the client reads every step (SSE), not only the finished row
    choice: int = 0  # the choice's index in the answer
    admitted: float | None = None  # when it joined the batch (its prefill started)
    id: int | None = None  # the session's row id
    cancelled: bool = False
    finished: bool = False  # its last event (done or error) was read
    traces: list = field(default_factory=list)  # the row's StepTrace of every step so far

    def put(self, event: Event) -> None:
        """Hand ``event`` to the request's queue, from any thread."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the client's event loop is gone
            pass

    def fail(self, status: int, message: str) -> None:
        """End the job with the error ``(status, message)`` (:class:`Failed`)."""
        self.put(Failed(self, status, message))


@dataclass(frozen=True)
class Stepped:
    """A step of ``job``'s row: its :class:`~setdlm.decoding.session.RowStep` (``step.done`` set on the last)."""

    job: Job
    step: RowStep


@dataclass(frozen=True)
class Failed:
    """``job`` ended with an error, answered with ``status`` (the batcher's: 500, a decode that failed; 504, a
    request past its deadline; 503, a server shutting down) and ``message``."""

    job: Job
    status: int
    message: str


@dataclass(frozen=True)
class Gone:
    """The client went away (put by the request's own watcher): nothing more is read."""


Event = Stepped | Failed | Gone  # what a request's queue holds; its readers match on the class


class Batcher:
    """Runs ``model``'s decoding loop in a background thread, ``options.max_batch`` rows at most and
    ``options.max_queue`` requests waiting; ``submit`` and ``cancel`` are thread-safe."""

    def __init__(self, model, options: ServeOptions):
        self.session = Session(model)
        self.max_batch, self.max_queue = options.max_batch, options.max_queue
        self._cv = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._cancelled: list[Job] = []
        self._jobs: dict[int, Job] = {}  # session row id → job
        self._calls: list = []  # (fn, loop, future) to run between two steps (:meth:`call`)
        self._stop = False
        self._thread: threading.Thread | None = None
        self.row_steps = 0  # rows advanced, summed over steps: row_steps / session.forwards = mean batch
        self.peak = 0  # most rows in the batch at once
        self.cancelled = 0  # requests cancelled (their client went away)

    @property
    def width(self) -> int:
        return self.session.width

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="setdlm-decoding", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def submit(self, job: Job) -> None:
        self.submit_all([job])

    def submit_all(self, jobs: list[Job]) -> None:
        """Queue the choices of one request, all or none (:class:`QueueFull`)."""
        with self._cv:
            free = max(self.max_batch - len(self._jobs), 0)  # rows the loop will fill at its next turn
            if len(self._waiting) + len(jobs) > self.max_queue + free:
                raise QueueFull(f"the batch is full and {self.max_queue} requests wait already" if self.max_queue
                                else "the batch is full (and --max-queue 0: no request waits)")
            self._waiting.extend(jobs)
            self._cv.notify_all()

    def call(self, fn, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        """Run ``fn()`` in the decoding thread between two steps (a forward that must not overlap the session's,
        such as scoring a prompt); its result, or its exception, resolves the returned future on ``loop``."""
        future = loop.create_future()
        with self._cv:
            self._calls.append((fn, loop, future))
            self._cv.notify_all()
        return future

    def _run_calls(self) -> None:
        with self._cv:
            calls, self._calls = self._calls, []
        for fn, loop, future in calls:
            try:
                result, error = fn(), None
            except Exception as e:  # handed to the request that asked
                result, error = None, e
            try:
                loop.call_soon_threadsafe(_resolve, future, result, error)
            except RuntimeError:  # the client's event loop is gone
                pass

    def cancel(self, job: Job) -> None:
        """Free the job's row (or its place in the queue) before the next step; a second call does nothing."""
        with self._cv:
            if job.cancelled:
                return
            job.cancelled = True
            self.cancelled += 1
            if job in self._waiting:
                self._waiting.remove(job)
            else:
                self._cancelled.append(job)
            self._cv.notify_all()

    def abort(self, status: int, message: str) -> None:
        """End every request in flight or waiting with the error ``(status, message)`` (a stream gets it as its
        last event) and free its row: what the server does when its shutdown grace period runs out."""
        with self._cv:
            jobs = [*self._waiting, *list(self._jobs.values())]
        for job in jobs:
            if not job.cancelled:
                job.fail(status, message)
                self.cancel(job)

    def stats(self) -> dict:
        with self._cv:
            return {"running": len(self._jobs), "waiting": len(self._waiting), "max_batch": self.max_batch,
                    "max_queue": self.max_queue, "forwards": self.session.forwards, "row_steps": self.row_steps,
                    "peak": self.peak, "cancelled": self.cancelled}

    def wait(self, condition, timeout: float | None = None) -> bool:
        """Block until ``condition(self.stats())`` holds; it is checked again whenever a request is submitted
        or cancelled and after every turn of the loop (a step, an admission). Returns whether it held
        (False after ``timeout`` seconds): for a caller that must know how far the loop got, such as a drain
        or a test, without polling."""
        with self._cv:
            return self._cv.wait_for(lambda: condition(self.stats()), timeout)

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.notify_all()  # the last turn is over: wake the callers of wait
                while not (self._stop or self._waiting or self._cancelled or self._jobs or self._calls):
                    self._cv.wait()
                if self._stop:
                    break
            self._run_calls()
            with self._cv:
                cancelled, self._cancelled = self._cancelled, []
                now = time.monotonic()
                for job in [j for j in self._waiting if now > j.deadline]:
                    self._waiting.remove(job)
                    job.fail(504, "the request timed out waiting in the queue")
                room = self.max_batch - len(self._jobs) + sum(j.id in self._jobs for j in cancelled)
                admit = [self._waiting.popleft() for _ in range(min(max(room, 0), len(self._waiting)))]
            for job in cancelled:
                if job.id is not None and self._jobs.pop(job.id, None) is not None:  # None: never admitted
                    self.session.cancel(job.id)
            now = time.monotonic()
            for job in admit:
                job.id, job.admitted = self.session.add_prepared(job.row), now
                self._jobs[job.id] = job
            self.peak = max(self.peak, len(self._jobs))
            for rid, job in list(self._jobs.items()):
                if now > job.deadline:
                    self.session.cancel(rid)
                    del self._jobs[rid]
                    job.fail(504, "the request timed out before it finished decoding")
            if not len(self.session):
                continue
            try:
                events: list[RowStep] = self.session.step()
            except Exception as e:  # the session fails only a failing group's rows; anything else fails the batch
                for rid, job in self._jobs.items():
                    self.session.cancel(rid)
                    job.fail(500, f"decoding failed: {type(e).__name__}: {e}")
                self._jobs.clear()
                continue
            self.row_steps += len(events)
            for ev in events:
                owner = self._jobs.get(ev.row)
                if owner is None:
                    continue
                if ev.trace is not None:
                    owner.traces.append(ev.trace)
                if ev.error is not None:  # this row's decode failed; it left the session, the others go on
                    del self._jobs[ev.row]
                    owner.fail(500, ev.error)
                    continue
                if owner.stream or ev.done is not None:
                    owner.put(Stepped(owner, ev))
                if ev.done is not None:
                    del self._jobs[ev.row]


def _resolve(future: asyncio.Future, result, error: Exception | None) -> None:
    if future.done():  # the request went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
