"""Python lines executed per request in a running server, by file and by function.

Not collected by pytest. Line counts are deterministic where timings are not (these machines are
noisy), so they show what a change removed from the hot path. Two steps:

    python tests/bench/line_count.py serve --model-repository R --http-port 9340 ...   # trident serve
    kill -USR1 PID; <load, e.g. wrk for 3 s>; kill -USR1 PID   # count between the two signals
    python tests/bench/line_count.py show --requests N [--out FILE] [--top 40]

``serve`` runs ``trident serve`` with the arguments given; the first SIGUSR1 starts counting the
lines run by the event loop's thread and threads started after it, the second stops and writes
the counts to ``--out`` (default ``line_counts.pkl`` in the working directory: the
environment variable ``TRIDENT_LINE_COUNTS`` overrides it). ``show`` divides by the number of
requests the load made (N) and prints lines per request by file and by function; ``--lines
FILE:FUNCTION`` prints that function line by line. Counting makes the server several times
slower: use it for counts, never for rates.
"""

from __future__ import annotations

import argparse
import collections
import linecache
import os
import pickle
import signal
import sys
import threading
from types import FrameType
from typing import Any

_DEFAULT_OUT = "line_counts.pkl"


def _serve(argv: list[str]) -> int:
    counts: collections.Counter[tuple[str, str, int]] = collections.Counter()
    on = False

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            code = frame.f_code
            counts[(code.co_filename, code.co_name, frame.f_lineno)] += 1
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        return local if event == "call" else None

    def toggle(signum: int, frame: FrameType | None) -> None:
        nonlocal on
        if not on:
            counts.clear()
            on = True
            sys.settrace(tracer)
            threading.settrace(tracer)
            return
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
        on = False
        with open(os.environ.get("TRIDENT_LINE_COUNTS", _DEFAULT_OUT), "wb") as f:
            pickle.dump(dict(counts), f)

    signal.signal(signal.SIGUSR1, toggle)
    from trident.cli import main

    return main(["serve", *argv])


def _show(args: argparse.Namespace) -> int:
    with open(args.out, "rb") as f:
        counts: dict[tuple[str, str, int], int] = pickle.load(f)
    n = float(args.requests)
    root = os.getcwd() + os.sep
    by_file: collections.Counter[str] = collections.Counter()
    by_function: collections.Counter[tuple[str, str]] = collections.Counter()
    for (filename, function, _), k in counts.items():
        short = filename.split("site-packages/")[-1]
        if short.startswith(root):
            short = short[len(root):]
        by_file[short] += k
        by_function[(short, function)] += k
    print(f"lines per request: {sum(counts.values()) / n:.0f}")
    for name, k in by_file.most_common(args.top):
        print(f"{k / n:8.1f}  {name}")
    print()
    for (name, function), k in by_function.most_common(args.top):
        print(f"{k / n:8.1f}  {name}:{function}")
    for spec in args.lines:
        file_part, function = spec.rsplit(":", 1)
        keys = sorted((key for key in counts if file_part in key[0] and key[1] == function), key=lambda key: key[2])
        print(f"\n== {spec}: {sum(counts[key] for key in keys) / n:.1f}")
        for key in keys:
            print(f"{counts[key] / n:6.2f} {key[2]:5d} {linecache.getline(key[0], key[2]).rstrip()[:100]}")
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        return _serve(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="lines per request from a count file")
    show.add_argument("--requests", type=int, required=True, help="requests made while counting")
    show.add_argument("--out", default=os.environ.get("TRIDENT_LINE_COUNTS", _DEFAULT_OUT))
    show.add_argument("--top", type=int, default=40)
    show.add_argument("--lines", action="append", default=[], metavar="FILE:FUNCTION")
    sub.add_parser("serve", help="trident serve with the counter (all further arguments go to it)")
    return _show(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
