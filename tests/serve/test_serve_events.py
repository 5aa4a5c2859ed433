"""The server as a class and the typed events of a request's queue (docs/architecture.md): the batcher hands a
request :class:`Stepped` (a step of its row) and :class:`Failed` (an error with its status), its watcher
:class:`Gone` (the client left); the readers match on the class."""

import asyncio

import pytest

pytest.importorskip("starlette")

from setdlm.decoding import generate  # noqa: E402
from setdlm.decoding.session import prepare  # noqa: E402
from setdlm.serve import ServeOptions, Server, create_app  # noqa: E402
from setdlm.serve.batching import Batcher, Event, Failed, Gone, Job, Stepped  # noqa: E402
from setdlm.serve.completions import _until_done  # noqa: E402
from setdlm.serve.schemas import APIError  # noqa: E402

from support import CharTokenizer, tiny_model  # noqa: E402


def _model():
    model = tiny_model("setdlm", L=48)
    model.tokenizer = CharTokenizer()
    return model


def _events(batcher: Batcher, jobs_of, until) -> list[Event]:
    """Run the batcher on the jobs ``jobs_of(loop, queue)`` makes, reading events until ``until(events)``."""
    async def read():
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        batcher.submit_all(jobs_of(loop, queue))
        events = []
        while not until(events):
            events.append(await asyncio.wait_for(queue.get(), 60))
        return events

    batcher.start()
    try:
        return asyncio.run(read())
    finally:
        batcher.stop()


def test_a_streamed_job_gets_a_stepped_event_per_step_and_the_last_is_done():
    model = _model()
    batcher = Batcher(model, ServeOptions())
    row = prepare(model, "ab", width=batcher.width, max_new_tokens=6, ignore_eos=True)
    jobs = []

    def make(loop, queue):
        jobs.append(Job(row, loop, queue, deadline=float("inf"), stream=True))
        return jobs

    events = _events(batcher, make, lambda evs: evs and evs[-1].step.done is not None)
    assert all(type(e) is Stepped and e.job is jobs[0] for e in events)
    assert [e.step.step for e in events] == list(range(len(events)))
    assert events[-1].step.done.tokens == generate(model, "ab", max_new_tokens=6, ignore_eos=True).tokens[0]


def test_a_job_past_its_deadline_fails_with_504():
    model = _model()
    batcher = Batcher(model, ServeOptions())
    row = prepare(model, "ab", width=batcher.width, max_new_tokens=6)
    events = _events(batcher, lambda loop, queue: [Job(row, loop, queue, deadline=0.0)], lambda evs: evs)
    assert len(events) == 1 and type(events[0]) is Failed and events[0].status == 504
    assert "timed out" in events[0].message


def test_the_readers_match_on_the_event_class():
    model = _model()
    row = prepare(model, "ab", max_new_tokens=2)

    async def read(put) -> APIError:
        queue: asyncio.Queue[Event] = asyncio.Queue()
        job = Job(row, asyncio.get_running_loop(), queue, deadline=float("inf"))
        queue.put_nowait(put(job))
        with pytest.raises(APIError) as e:
            await _until_done([job], queue)
        return e.value

    gone = asyncio.run(read(lambda job: Gone()))
    assert gone.status == 499
    failed = asyncio.run(read(lambda job: Failed(job, 503, "shutting down")))
    assert (failed.status, failed.message, failed.type) == (503, "shutting down", "server_error")


def test_the_server_is_a_class_whose_routes_are_its_methods():
    model = _model()
    server = Server(model, "m", ServeOptions(max_batch=3))
    app = server.app()
    routes = {r.path: r.endpoint for r in app.routes}
    assert routes["/health"] == server.health and routes["/v1/completions"] == server.completion
    assert routes["/v1/chat/completions"] == server.chat_completion and routes["/tokenize"] == server.tokenize
    assert server.card()["id"] == "m" and server.batcher.max_batch == 3 and app.state.batcher is server.batcher
    assert type(create_app(model, "m")).__name__ == "Starlette"
