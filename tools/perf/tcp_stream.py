#!/usr/bin/env python3
"""One TCP stream between two simulated hosts: the ceiling a collective between them is
compared with. Run as two ranks of tools/sim-hosts/hosts.sh (-n 2 -r 1): host 1 sends for
SECONDS (default 3) to host 0, which prints the bytes per second it received.
Usage: hosts.sh -n 2 -- python3 tcp_stream.py [SECONDS]"""
import os
import socket
import sys
import time

PORT = 29611
CHUNK = 4 << 20


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    host = int(os.environ["SIM_HOST_INDEX"])
    master = os.environ["SIM_MASTER_ADDR"]
    if host == 0:
        srv = socket.create_server((master, PORT))
        conn, _ = srv.accept()
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        total, start = 0, None
        while True:
            n = conn.recv_into(view)
            if n == 0:
                break
            if start is None:
                start = time.perf_counter()
            total += n
        took = time.perf_counter() - start
        print(f"tcp stream: {total} B in {took:.3f} s = {total / took / 1e9:.3f} GB/s")
    else:
        for _ in range(100):
            try:
                conn = socket.create_connection((master, PORT))
                break
            except OSError:
                time.sleep(0.05)
        data = memoryview(bytearray(CHUNK))
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            conn.sendall(data)
        conn.close()


if __name__ == "__main__":
    main()
