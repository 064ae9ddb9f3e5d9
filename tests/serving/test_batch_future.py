"""BatchFuture: settling a whole batch hands each event loop its answers in one hop."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from modelyard.errors import Code, ServingError
from modelyard.serving.batching.batch_future import BatchFuture, settle_all


class CountingLoop:
    """A running asyncio loop on its own thread that counts the thread-safe hand-offs it gets."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.hops = 0
        original = self.loop.call_soon_threadsafe

        def counted(callback, *args, **kwargs):
            self.hops += 1
            return original(callback, *args, **kwargs)

        self.loop.call_soon_threadsafe = counted
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def drain(self) -> None:
        """Wait until everything handed to the loop so far has run."""
        done = threading.Event()
        self.loop.call_soon_threadsafe(done.set)
        self.hops -= 1  # the drain's own hop
        assert done.wait(5)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def counting_loop():
    rig = CountingLoop()
    yield rig
    if not rig.loop.is_closed():
        rig.stop()


def test_a_settled_batch_reaches_each_loop_in_one_hop_in_order(counting_loop):
    other = CountingLoop()
    try:
        seen: list[tuple[str, int, object]] = []
        futures = [BatchFuture() for _ in range(6)]
        for i, future in enumerate(futures):
            loop = counting_loop if i % 3 else other
            future.call_on_loop(loop.loop, lambda tag, f: seen.append((tag, threading.get_ident(), f)), f"r{i}")
        plain: list[int] = []
        futures[0].add_done_callback(lambda f: plain.append(threading.get_ident()))

        errors = ServingError(Code.INVALID_ARGUMENT, "bad row")
        assert settle_all([(f, errors if i == 4 else None, {"y": i}) for i, f in enumerate(futures)]) == 6
        counting_loop.drain()
        other.drain()

        assert counting_loop.hops == 1 and other.hops == 1
        assert plain == [threading.get_ident()]  # plain callbacks run on the settling thread
        assert [tag for tag, _, _ in seen if tag in ("r1", "r2", "r4", "r5")] == ["r1", "r2", "r4", "r5"]
        assert sorted(tag for tag, _, _ in seen) == [f"r{i}" for i in range(6)]
        threads = {tag: ident for tag, ident, _ in seen}
        assert threads["r1"] == counting_loop.thread.ident and threads["r0"] == other.thread.ident
        by_tag = {tag: f for tag, _, f in seen}
        assert by_tag["r3"].result() == {"y": 3}
        with pytest.raises(ServingError) as raised:
            by_tag["r4"].result()
        assert raised.value.code == Code.INVALID_ARGUMENT
        stamps = {f.settled_at for f in futures}
        assert len(stamps) == 1 and None not in stamps  # one stamp for the whole batch
    finally:
        other.stop()


def test_the_first_settling_wins_and_later_ones_report_it(counting_loop):
    future = BatchFuture()
    calls = []
    future.call_on_loop(counting_loop.loop, lambda f: calls.append(f.result()))
    assert future.set_result(1) is True
    assert future.set_exception(ServingError(Code.INTERNAL, "late")) is False
    assert settle_all([(future, None, 3)]) == 0
    counting_loop.drain()
    assert calls == [1] and future.result() == 1 and counting_loop.hops == 1


def test_registering_on_a_settled_future_posts_at_once(counting_loop):
    future = BatchFuture()
    future.set_result("done")
    got = threading.Event()
    future.call_on_loop(counting_loop.loop, lambda f: got.set() if f.result() == "done" else None)
    assert got.wait(5)


def test_a_failing_loop_callback_does_not_keep_the_others_from_running(counting_loop, caplog):
    futures = [BatchFuture() for _ in range(3)]
    ran = []

    def answer(i, _future):
        if i == 1:
            raise RuntimeError("encoder bug")
        ran.append(i)

    for i, future in enumerate(futures):
        future.call_on_loop(counting_loop.loop, answer, i)
    settle_all([(f, None, i) for i, f in enumerate(futures)])
    counting_loop.drain()
    assert ran == [0, 2]
    assert "loop callback failed" in caplog.text and "encoder bug" in caplog.text


def test_a_closed_loop_runs_if_closed_on_the_settling_thread(counting_loop):
    future, settled_early = BatchFuture(), BatchFuture()
    released = []
    future.call_on_loop(counting_loop.loop, lambda f: released.append("loop"),
                        if_closed=lambda: released.append(threading.get_ident()))
    counting_loop.stop()
    settle_all([(future, None, 1)])
    assert released == [threading.get_ident()]
    settled_early.set_result(2)  # and on a future settled before registering
    settled_early.call_on_loop(counting_loop.loop, lambda f: released.append("loop"),
                               if_closed=lambda: released.append("closed"))
    assert released[-1] == "closed"


def test_a_blocked_reader_wakes_when_its_batch_settles():
    future = BatchFuture()
    threading.Timer(0.05, lambda: settle_all([(future, None, "late")])).start()
    started = time.monotonic()
    assert future.result(5) == "late"
    assert time.monotonic() - started < 5


def test_an_escaping_base_exception_stops_no_other_answer(counting_loop):
    futures = [BatchFuture() for _ in range(4)]
    ran = []

    def answer(i, _future):
        if i == 1:
            raise asyncio.CancelledError()  # a BaseException, not an Exception
        ran.append(i)

    for i, future in enumerate(futures):
        future.call_on_loop(counting_loop.loop, answer, i)
    settle_all([(f, None, i) for i, f in enumerate(futures)])
    counting_loop.drain()
    assert ran == [0, 2, 3]

    # A plain callback's BaseException leaves settle_all, after every loop got its answers.
    more = [BatchFuture() for _ in range(2)]
    more[0].add_done_callback(lambda f: (_ for _ in ()).throw(KeyboardInterrupt()))
    for i, future in enumerate(more):
        future.call_on_loop(counting_loop.loop, answer, 10 + i)
    with pytest.raises(KeyboardInterrupt):
        settle_all([(f, None, i) for i, f in enumerate(more)])
    counting_loop.drain()
    assert ran == [0, 2, 3, 10, 11]
