"""trident.server.worker_threads: heavy jobs in worker threads, at low CPU priority, with a short GIL switch interval."""

from __future__ import annotations

import os
import sys
import threading

import trio

from trident.server import worker_threads


async def test_a_job_runs_at_the_lowest_priority_and_a_short_switch_interval() -> None:
    def probe() -> tuple[int, float, int]:
        tid = threading.get_native_id()
        return os.getpriority(os.PRIO_PROCESS, tid), sys.getswitchinterval(), tid

    before = sys.getswitchinterval()
    nice, interval, tid = await worker_threads.run_sync(probe, limiter=trio.CapacityLimiter(1))
    assert nice == worker_threads.LOW_PRIORITY
    assert abs(interval - min(before, worker_threads.SWITCH_INTERVAL)) < 1e-9
    assert sys.getswitchinterval() == before  # restored once no job runs
    assert tid != threading.get_native_id()  # not the loop's thread


async def test_a_job_returns_and_raises_what_it_does() -> None:
    limiter = trio.CapacityLimiter(2)
    assert await worker_threads.run_sync(sum, [1, 2, 3], limiter=limiter) == 6
    try:
        await worker_threads.run_sync(int, "x", limiter=limiter)
    except ValueError as e:
        assert "invalid literal" in str(e)
    else:
        raise AssertionError("the job's error was not raised")


async def test_a_refusal_comes_back_bare_and_frees_what_the_job_held_at_once() -> None:
    """A TritonError raised in a job reaches the caller with no frame of the job's and no
    exception it was raised from, so what the job held (a decoded body) is freed by reference
    counting as soon as the caller lets the error go, with the cyclic collector off."""
    import gc
    import weakref

    from trident.errors import Code, TritonError

    class Held:
        pass

    held: list[weakref.ref] = []

    def job() -> None:
        big = Held()
        held.append(weakref.ref(big))
        try:
            int("x")
        except ValueError:
            raise TritonError(Code.INVALID_ARG, "refused") from None

    gc.disable()
    try:
        try:
            await worker_threads.run_sync(job, limiter=trio.CapacityLimiter(1))
        except TritonError as e:
            assert e.code == Code.INVALID_ARG and e.message == "refused"
            assert e.__context__ is None and e.__cause__ is None
            frames = []
            tb = e.__traceback__
            while tb is not None:
                frames.append(tb.tb_frame.f_code.co_name)
                tb = tb.tb_next
            assert "job" not in frames
        else:
            raise AssertionError("the job's refusal was not raised")
        assert held and held[0]() is None  # freed without a collection
    finally:
        gc.enable()


# ---- threads owned by a nursery (a model version's long-lived threads) ------------------------


async def test_the_nursery_waits_for_its_threads_and_names_them() -> None:
    release = threading.Event()
    seen: list[str] = []

    def work() -> None:
        seen.append(threading.current_thread().name)
        release.wait(5)

    async with worker_threads.open_thread_nursery() as threads:
        first = threads.start(work, name="owned-1")
        # from another thread (a model's own thread, a process reader) as well
        second = await trio.to_thread.run_sync(lambda: threads.start(work, name="owned-2"))
        await trio.sleep(0.05)
        assert first.is_alive() and second.is_alive()
        release.set()
    # the body's exit waited for both
    assert not first.is_alive() and not second.is_alive()
    assert sorted(seen) == ["owned-1", "owned-2"]
    assert "owned-1" not in {t.name for t in threading.enumerate()}  # the name goes with the work


async def test_a_closed_nursery_refuses_threads_and_body_errors_pass_as_themselves() -> None:
    class Boom(Exception):
        pass

    try:
        async with worker_threads.open_thread_nursery() as threads:
            threads.start(lambda: None, name="quick")
            raise Boom("the body failed")
    except Boom as exc:  # not an exception group
        assert str(exc) == "the body failed"
    else:
        raise AssertionError("the body's exception was lost")
    try:
        threads.start(lambda: None, name="late")
    except RuntimeError as exc:
        assert "its owner has finished" in str(exc)
    else:
        raise AssertionError("a finished owner started a thread")


async def test_a_failing_thread_is_logged_and_cancelling_the_owner_abandons_a_stuck_one(caplog) -> None:
    stuck = threading.Event()

    def fail() -> None:
        raise ValueError("thread failed")

    with trio.move_on_after(0.3) as scope:
        async with worker_threads.open_thread_nursery() as threads:
            threads.start(fail, name="failing")
            handle = threads.start(stuck.wait, name="stuck")
    assert scope.cancelled_caught  # the owner did not wait for the stuck thread forever
    assert handle.is_alive()
    assert any("thread 'failing' failed" in r.getMessage() for r in caplog.records)
    stuck.set()
    handle.join(5)
    assert not handle.is_alive()
