"""Probes what the processes path of the GPU issue would stand on, on the machine it runs on:
CUDA IPC of memory and events between two processes on one GPU, whether streams can wait on a
32-bit value, and what cross-process event waits and host functions cost. Prints one line per
finding. Needs cupy (the device image has it)."""
import multiprocessing as mp
import sys
import time

import cupy as cp
from cupy.cuda import runtime as rt


def child(q_in, q_out):
    try:
        cp.cuda.Device(0).use()
        h, ev_h, n = q_in.get()
        t0 = time.perf_counter()
        ptr = rt.ipcOpenMemHandle(h)
        t_open = time.perf_counter() - t0
        ev = rt.ipcOpenEventHandle(ev_h)
        s = cp.cuda.Stream(non_blocking=True)
        rt.streamWaitEvent(s.ptr, ev, 0)
        mem = cp.cuda.UnownedMemory(ptr, n * 4, None)
        a = cp.ndarray((n,), cp.float32, cp.cuda.MemoryPointer(mem, 0))
        with s:
            total = float(a.sum())
        s.synchronize()
        rt.ipcCloseMemHandle(ptr)
        q_out.put(("ok", t_open, total))
    except Exception as e:  # noqa: BLE001
        q_out.put(("error", repr(e)[:300]))


def main():
    cp.cuda.Device(0).use()
    for name, attr in [("can_use_stream_wait_value_nor", 92), ("stream_mem_ops_v1 (can_use_stream_mem_ops_v1)", 120),
                       ("unified_addressing", 41), ("concurrent_managed_access", 89),
                       ("handle_type_posix_fd_supported", 102), ("ipc_event_supported", 125)]:
        try:
            print(f"attribute {name} ({attr}): {rt.deviceGetAttribute(attr, 0)}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"attribute {name} ({attr}): error {e!r}", flush=True)
    n = 1 << 20
    a = cp.ones(n, dtype=cp.float32)
    ev = rt.eventCreateWithFlags(rt.eventDisableTiming | rt.eventInterprocess)
    rt.eventRecord(ev, cp.cuda.get_current_stream().ptr)
    try:
        h = rt.ipcGetMemHandle(a.data.ptr)
        eh = rt.ipcGetEventHandle(ev)
    except Exception as e:  # noqa: BLE001
        print("ipc handles: error", repr(e), flush=True)
        return
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(q_in, q_out))
    p.start()
    q_in.put((h, eh, n))
    try:
        print("ipc child:", q_out.get(timeout=60), flush=True)
    except Exception as e:  # noqa: BLE001
        print("ipc child: no answer", repr(e), flush=True)
    p.join(10)
    # Launch costs in this process: an empty-ish kernel, an event record + wait, a host function.
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    x = cp.zeros(1, cp.float32)
    e = rt.eventCreateWithFlags(rt.eventDisableTiming)
    for label, fn in [("kernel launch (x += 1)", lambda: x.__iadd__(1)),
                      ("event record + cross-stream wait", lambda: (rt.eventRecord(e, s1.ptr), rt.streamWaitEvent(s2.ptr, e, 0)))]:
        with s1:
            for _ in range(100):
                fn()
            s1.synchronize(); s2.synchronize()
            t0 = time.perf_counter()
            for _ in range(2000):
                fn()
            t1 = time.perf_counter()
            s1.synchronize(); s2.synchronize()
        print(f"{label}: {1e6 * (t1 - t0) / 2000:.2f} us per call on the host", flush=True)
    try:
        done = []
        t0 = time.perf_counter()
        for _ in range(200):
            s1.launch_host_func(lambda _: done.append(1), None)
        s1.synchronize()
        print(f"host function: {1e6 * (time.perf_counter() - t0) / 200:.2f} us each end to end, {len(done)} ran", flush=True)
    except Exception as e:  # noqa: BLE001
        print("host function: error", repr(e), flush=True)


if __name__ == "__main__":
    main()
