"""The image's HEALTHCHECK (installed as ``trident-healthcheck``): GET /v2/health/ready on the
HTTP port the running server was started with.

The server's flags are read from ``/proc/1/cmdline`` (the container's main process, ``trident
serve ...`` or ``tritonserver ...``) and parsed with trident's own ``serve`` parser, so
``--http-port 9000``, ``--http-port=9000`` and ``--http-address`` are honoured as the server
reads them. With ``--allow-http=false`` the check connects to the gRPC port instead. Exit status
0 is healthy, 1 unhealthy (Docker's and podman's convention); a line on stdout says why.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path

TIMEOUT = 2.0  # seconds; below the HEALTHCHECK's --timeout


def server_args(cmdline: list[str]) -> list[str]:
    """The serve flags of a trident/tritonserver command line (what follows ``trident serve`` or
    ``tritonserver``, also when started as ``python -m trident serve``)."""
    for i, arg in enumerate(cmdline):
        name = os.path.basename(arg)
        if name == "tritonserver":
            return cmdline[i + 1:]
        if name == "trident" and i + 1 < len(cmdline) and cmdline[i + 1] == "serve":
            return cmdline[i + 2:]
    return []


def target(cmdline: list[str]) -> tuple[str, str, int]:
    """(kind, host, port): ``("http", ...)`` or ``("grpc", ...)`` for the running server."""
    from trident.cli import add_serve_arguments

    parser = argparse.ArgumentParser(add_help=False)
    add_serve_arguments(parser)
    args, _ = parser.parse_known_args(server_args(cmdline))
    if args.allow_http:
        kind, address, port = "http", args.http_address, args.http_port
    else:
        kind, address, port = "grpc", args.grpc_address, args.grpc_port
    if address in ("", "0.0.0.0", "::", "[::]"):
        address = "127.0.0.1"
    return kind, address, port


def main() -> int:
    try:
        cmdline = Path("/proc/1/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        cmdline = []
    kind, host, port = target([a for a in cmdline if a])
    if kind == "grpc":
        try:
            socket.create_connection((host, port), timeout=TIMEOUT).close()
        except OSError as e:
            print(f"unhealthy: gRPC {host}:{port}: {e}")
            return 1
        print(f"healthy: gRPC {host}:{port} accepts connections")
        return 0
    url = f"http://{host}:{port}/v2/health/ready"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:  # noqa: S310 (a fixed http URL)
            status = response.status
    except urllib.error.HTTPError as e:
        status = e.code
    except OSError as e:
        print(f"unhealthy: {url}: {e}")
        return 1
    print(f"{'healthy' if status == 200 else 'unhealthy'}: {url} answered {status}")
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
