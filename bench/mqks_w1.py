"""W1 over MQKS: publish N messages pipelined, then drain and ack them all.

    python -m bench.mqks_w1 [--messages N] [--size S] [--rounds R] [--storage NAME]
                            [--journal DIR] [--compare-journal]

Starts ``twistd -n mqserver`` on an ephemeral port, uses lean raw-socket
clients (pre-encoded lines, one recv per chunk), prints msgs/s for produce,
drain and total, the median of the rounds, and the client's CPU time.
``--journal DIR`` runs the server with the event journal on;
``--compare-journal`` runs a server without and one with it (in a temporary
directory), alternating rounds between them, and prints the ratio.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.servers import settle_journal

LISTENING = re.compile(r"mqks listening on [\d.]+:(\d+)")


def start_server(
    storage: str, workdir: str, journal: str | None = None
) -> tuple[subprocess.Popen, int]:
    twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
    extra = [f"--journal={journal}"] if journal else []
    process = subprocess.Popen(
        [twistd, "-n", "--pidfile=", "mqserver", "--protocol=mqks:tcp:0:interface=127.0.0.1",
         f"--storage={storage}", f"--data-dir={workdir}/data", "--no-http", *extra],
        cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert process.stdout is not None
    for line in process.stdout:
        match = LISTENING.search(line)
        if match:
            return process, int(match.group(1))
    raise RuntimeError("server did not start")


def one_round(port: int, queue: str, count: int, size: int) -> tuple[float, float]:
    body = b"x" * size
    producer = socket.create_connection(("127.0.0.1", port))
    # bind first so the queue keeps what is published before anyone consumes
    producer.sendall(f"rb rebind --confirm {queue} ev{queue}\n".encode())
    assert producer.recv(100) == b"rb ok \n"
    lines = b"".join(b"m%d publish ev%s %s\n" % (n, queue.encode(), body) for n in range(count))
    lines += b"done publish --confirm nobody x\n"
    started = time.perf_counter()
    producer.sendall(lines)
    reply = b""
    while not reply.endswith(b"done ok \n"):
        reply += producer.recv(100)
    produced = time.perf_counter()
    consumer = socket.create_connection(("127.0.0.1", port))
    consumer.sendall(f"c{queue} consume {queue} --manual-ack\n".encode())
    received = 0
    pending = b""
    prefix = f"c{queue} ok ".encode()
    while received < count:
        chunk = consumer.recv(1 << 20)
        data = pending + chunk
        cut = data.rfind(b"\n") + 1
        complete, pending = data[:cut], data[cut:]
        ids = [line[len(prefix):line.index(b" ", len(prefix))]
               for line in complete.split(b"\n")[:-1]]
        received += len(ids)
        consumer.sendall(b"".join(b"a ack c%s %s\n" % (queue.encode(), mid) for mid in ids))
    drained = time.perf_counter()
    producer.close()
    consumer.close()
    return produced - started, drained - produced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--storage", default="memory")
    parser.add_argument("--journal", default=None, help="journal directory (journal on)")
    parser.add_argument("--compare-journal", action="store_true",
                        help="run without and with a journal, rounds interleaved, and print "
                             "the ratio")
    args = parser.parse_args()
    if args.compare_journal:
        compare(args)
    else:
        run(args, args.journal)


def compare(args: argparse.Namespace) -> None:
    """Both servers at once, rounds alternating off/on: on a shared, noisy
    machine a slow spell then hits both sides instead of one whole run.  After
    each journaled round the journal process is let finish, as it would in
    any pause of the traffic."""
    with tempfile.TemporaryDirectory() as workdir, tempfile.TemporaryDirectory() as journal:
        os.makedirs(f"{workdir}/off")
        os.makedirs(f"{workdir}/on")
        off_process, off_port = start_server(args.storage, f"{workdir}/off")
        on_process, on_port = start_server(args.storage, f"{workdir}/on", journal)
        results: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
        try:
            for n in range(args.rounds):
                results["off"].append(one_round(off_port, f"q{n}", args.messages, args.size))
                results["on"].append(one_round(on_port, f"q{n}", args.messages, args.size))
                settle_journal(Path(journal))
        finally:
            for process in (off_process, on_process):
                process.terminate()
                process.wait()
    totals = {}
    for side, rounds in results.items():
        produce = statistics.median(args.messages / p for p, _ in rounds)
        drain = statistics.median(args.messages / d for _, d in rounds)
        totals[side] = statistics.median(args.messages / (p + d) for p, d in rounds)
        print(f"W1 mqks storage={args.storage} N={args.messages} S={args.size} "
              f"rounds={args.rounds} journal={side}: produce {produce:,.0f} msgs/s  "
              f"drain {drain:,.0f} msgs/s  total {totals[side]:,.0f} msgs/s")
    print(f"journal on / off (total): {100 * totals['on'] / totals['off']:.1f}%")


def run(args: argparse.Namespace, journal: str | None) -> float:
    """One benchmark (a fresh server, ``rounds`` rounds); returns total msgs/s."""
    with tempfile.TemporaryDirectory() as workdir:
        process, port = start_server(args.storage, workdir, journal)
        try:
            results = []
            cpu0 = resource.getrusage(resource.RUSAGE_SELF)
            for n in range(args.rounds):
                results.append(one_round(port, f"q{n}", args.messages, args.size))
            cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        finally:
            process.terminate()
            process.wait()
    produce = statistics.median(args.messages / p for p, _ in results)
    drain = statistics.median(args.messages / d for _, d in results)
    total = statistics.median(args.messages / (p + d) for p, d in results)
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    wall = sum(p + d for p, d in results)
    print(f"W1 mqks storage={args.storage} N={args.messages} S={args.size} rounds={args.rounds}"
          f" journal={'on' if journal else 'off'}")
    print(f"produce {produce:,.0f} msgs/s  drain {drain:,.0f} msgs/s  total {total:,.0f} msgs/s")
    print(f"client CPU {cpu:.2f} s over {wall:.2f} s wall ({100 * cpu / wall:.0f}%)")
    return total


if __name__ == "__main__":
    main()
