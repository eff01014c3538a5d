#!/usr/bin/env python3
"""The TCP ceilings a 2-rank collective over loopback is compared with, in one run:

- one way: one process sends for SECONDS to another over one connection (the stream the
  issue's "loopback stream ceiling" names);
- both ways: two processes each send to the other at once over one connection, as every rank
  of a 2-rank all-reduce must (each sends S and receives S per call). Reported per direction;
- both ways over two connections: the same, each direction on a connection of its own, as
  oxccl's TCP links have done since 2026-12-05 (one per direction of data).

On loopback the sender's write carries its segments through the whole stack into the
receiver's socket, and the receiver's read copies them out; with both directions busy each
process does both, so both ways is the honest ceiling for a 2-rank all-reduce's bus bandwidth
(bytes sent per rank per second). Prints `one_way_GBps,...`, `both_ways_GBps_per_direction,...`
and `both_ways_two_connections_GBps_per_direction,...` lines with the median, minimum and
maximum over ROUNDS.

Usage: tcp_ceiling.py [ROUNDS=3] [SECONDS=2]"""
import os
import socket
import statistics
import sys
import threading
import time

CHUNK = 4 << 20


def drain(conn, counter):
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while True:
        n = conn.recv_into(view)
        if n == 0:
            return
        counter[0] += n


def pour(conn, seconds):
    data = memoryview(bytearray(CHUNK))
    sent = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        conn.sendall(data)
        sent += CHUNK
    conn.shutdown(socket.SHUT_WR)
    return sent


def pair():
    srv = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(srv.getsockname())
    b, _ = srv.accept()
    srv.close()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return a, b


class Duplex:
    """Receives on one connection and sends on another, with a socket's methods."""

    def __init__(self, rx, tx):
        self.rx, self.tx = rx, tx

    def recv_into(self, view):
        return self.rx.recv_into(view)

    def sendall(self, data):
        self.tx.sendall(data)

    def shutdown(self, how):
        self.tx.shutdown(how)

    def close(self):
        self.rx.close()
        self.tx.close()


def one_way(seconds):
    a, b = pair()
    pid = os.fork()
    if pid == 0:
        b.close()
        pour(a, seconds)
        a.close()
        os._exit(0)
    a.close()
    got = [0]
    start = time.perf_counter()
    drain(b, got)
    took = time.perf_counter() - start
    os.waitpid(pid, 0)
    b.close()
    return got[0] / took


def both_ways(seconds, split=False):
    """Each side sends and receives at once; returns the bytes per second one side received.
    With `split`, each direction goes over a connection of its own."""
    if split:
        (a_tx, b_rx), (b_tx, a_rx) = pair(), pair()
        a, b = Duplex(a_rx, a_tx), Duplex(b_rx, b_tx)
    else:
        a, b = pair()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        b.close()
        os.close(r)
        got = [0]
        t = threading.Thread(target=drain, args=(a, got))
        t.start()
        pour(a, seconds)
        t.join()
        os.write(w, b"x")
        a.close()
        os._exit(0)
    a.close()
    os.close(w)
    got = [0]
    start = time.perf_counter()
    t = threading.Thread(target=drain, args=(b, got))
    t.start()
    pour(b, seconds)
    t.join()
    took = time.perf_counter() - start
    os.read(r, 1)
    os.waitpid(pid, 0)
    b.close()
    return got[0] / took


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    one, both, split = [], [], []
    for _ in range(rounds):
        one.append(one_way(seconds) / 1e9)
        both.append(both_ways(seconds) / 1e9)
        split.append(both_ways(seconds, split=True) / 1e9)
    for name, v in (
        ("one_way_GBps", one),
        ("both_ways_GBps_per_direction", both),
        ("both_ways_two_connections_GBps_per_direction", split),
    ):
        print(f"{name},{rounds},{statistics.median(v):.3f},{min(v):.3f},{max(v):.3f}")


if __name__ == "__main__":
    main()
