"""trident serve runs each batch of ready trio tasks first come, first served
(trident.serve.fifo_task_order): the tail latency of many connections under load."""

from __future__ import annotations

import subprocess
import sys

_SCRIPT = """
import sys
import trio, trio.testing

async def order_of_wakeups(rounds=40, tasks=6):
    seen = []
    for _ in range(rounds):
        events = [trio.Event() for _ in range(tasks)]
        ran = []

        async def waiter(i):
            await events[i].wait()
            ran.append(i)

        async with trio.open_nursery() as nursery:
            for i in range(tasks):
                nursery.start_soon(waiter, i)
            await trio.testing.wait_all_tasks_blocked()
            for event in events:  # woken in this order: one batch of runnable tasks
                event.set()
        seen.append(ran)
    return seen

def report(seen):
    tasks = len(seen[0])
    fifo = sum(ran == list(range(tasks)) for ran in seen)
    lifo = sum(ran == list(range(tasks))[::-1] for ran in seen)
    print(fifo, lifo, len(seen))

mode = sys.argv[1]
if mode == "cli":  # trident serve itself, with the server swapped for the check
    import trident.serve
    from trident.cli import main

    async def serve(options):
        report(await order_of_wakeups())
        return 0

    trident.serve.serve = serve
    sys.exit(main(["serve", "--model-repository", sys.argv[2]]))
from trident.serve import fifo_task_order
if mode == "fifo":
    print(fifo_task_order(), fifo_task_order(), end=" ")
report(trio.run(order_of_wakeups))
"""


def _run(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", _SCRIPT, *args], capture_output=True, text=True, timeout=120,
                         check=True)
    return out.stdout.split()


def test_trio_alone_runs_a_batch_in_either_order():
    fifo, lifo, rounds = map(int, _run("plain"))
    assert fifo + lifo == rounds  # each batch whole, one way or the other
    assert fifo and lifo  # 40 rounds of one order by chance: 2 ** -39


def test_fifo_task_order_runs_every_batch_first_come_first_served():
    applied, again, fifo, lifo, rounds = _run("fifo")
    assert (applied, again) == ("True", "True")  # applied, and a second call keeps it
    assert (int(fifo), int(lifo), int(rounds)) == (40, 0, 40)


def test_trident_serve_applies_it(tmp_path):
    fifo, lifo, rounds = map(int, _run("cli", str(tmp_path)))
    assert (fifo, lifo, rounds) == (40, 0, 40)
