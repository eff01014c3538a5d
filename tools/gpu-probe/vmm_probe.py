"""Probes what docs/cuda.md's design for ranks in several processes stands on, on the GPU machine
it runs on (written 2026-11-28 without a GPU: not yet run). Driver API through ctypes only (no
cupy, no torch). Prints one line per finding, `probe NAME: ok ...` or `probe NAME: FAILED ...`:

1. vmm-export: a buffer made with cuMemCreate (POSIX file descriptor handle type) and passed
   to another process with SCM_RIGHTS is imported, mapped and read there with the bytes written.
2. survivor-read: a process imports a peer's buffer, the peer is killed (SIGKILL), and the
   survivor still reads the peer's bytes and its context still works (the survivor's reference
   keeps the memory, as the design needs).
3. wait-value: a stream waiting with cuStreamWaitValue32 (GEQ) on page-locked shared memory
   (mmap MAP_SHARED, cuMemHostRegister DEVICEMAP) stays blocked until the host writes the
   word, then proceeds; prints how long after the write the stream's event completed.
4. costs: cuMemCreate + map, export, import + map, each in microseconds.

usage: python3 tools/gpu-probe/vmm_probe.py            (parent; spawns its children itself)
"""
import ctypes
import mmap
import os
import signal
import socket
import subprocess
import sys
import time

CU = None
SIZE = 4 << 20  # bytes of the probed buffers (rounded up to the granularity)


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class AllocProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", Location), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", AllocFlags)]


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


PINNED, POSIX_FD, LOC_DEVICE, PROT_RW, GRAN_MIN = 1, 1, 1, 3, 0
HOSTREGISTER_PORTABLE, HOSTREGISTER_DEVICEMAP = 1, 2
WAIT_GEQ, STREAM_NON_BLOCKING, EVENT_DISABLE_TIMING, NOT_READY = 0, 1, 2, 600


def fn(*names):
    for n in names:
        f = getattr(CU, n, None)
        if f is not None:
            return f
    raise RuntimeError(f"libcuda has none of {names}")


def check(r, what):
    if r != 0:
        raise RuntimeError(f"{what} returned CUresult {r}")


def init():
    """Loads the driver, makes device 0's primary context current; returns the device."""
    global CU
    CU = ctypes.CDLL("libcuda.so.1")
    check(fn("cuInit")(0), "cuInit")
    dev = ctypes.c_int()
    check(fn("cuDeviceGet")(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(fn("cuDevicePrimaryCtxRetain")(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(fn("cuCtxSetCurrent")(ctx), "cuCtxSetCurrent")
    return dev.value


def prop_for(dev):
    p = AllocProp()
    p.type, p.requestedHandleTypes = PINNED, POSIX_FD
    p.location = Location(LOC_DEVICE, dev)
    return p


def granularity(dev):
    g = ctypes.c_size_t()
    p = prop_for(dev)
    check(fn("cuMemGetAllocationGranularity")(ctypes.byref(g), ctypes.byref(p), GRAN_MIN),
          "cuMemGetAllocationGranularity")
    return g.value


def map_handle(dev, handle, size):
    """Reserves an address range, maps `handle` there read-write for `dev`; returns the address."""
    ptr = ctypes.c_uint64()
    check(fn("cuMemAddressReserve")(ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                    ctypes.c_uint64(0), ctypes.c_ulonglong(0)), "cuMemAddressReserve")
    check(fn("cuMemMap")(ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_uint64(handle),
                         ctypes.c_ulonglong(0)), "cuMemMap")
    d = AccessDesc(Location(LOC_DEVICE, dev), PROT_RW)
    check(fn("cuMemSetAccess")(ptr, ctypes.c_size_t(size), ctypes.byref(d), ctypes.c_size_t(1)),
          "cuMemSetAccess")
    return ptr.value


def create_exported(dev, size, fill):
    """A buffer of `size` bytes filled with the byte `fill`; returns (address, fd, timings)."""
    t0 = time.perf_counter()
    h = ctypes.c_uint64()
    p = prop_for(dev)
    check(fn("cuMemCreate")(ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(p),
                            ctypes.c_ulonglong(0)), "cuMemCreate")
    ptr = map_handle(dev, h.value, size)
    t1 = time.perf_counter()
    fd = ctypes.c_int(-1)
    check(fn("cuMemExportToShareableHandle")(ctypes.byref(fd), ctypes.c_uint64(h.value), POSIX_FD,
                                             ctypes.c_ulonglong(0)), "cuMemExportToShareableHandle")
    t2 = time.perf_counter()
    host = (ctypes.c_ubyte * size)()
    ctypes.memset(host, fill, size)
    check(fn("cuMemcpyHtoD_v2", "cuMemcpyHtoD")(ctypes.c_uint64(ptr), host, ctypes.c_size_t(size)),
          "cuMemcpyHtoD")
    return ptr, fd.value, ((t1 - t0) * 1e6, (t2 - t1) * 1e6)


def import_fd(dev, fd, size):
    t0 = time.perf_counter()
    h = ctypes.c_uint64()
    check(fn("cuMemImportFromShareableHandle")(ctypes.byref(h), ctypes.c_void_p(fd), POSIX_FD),
          "cuMemImportFromShareableHandle")
    ptr = map_handle(dev, h.value, size)
    return ptr, (time.perf_counter() - t0) * 1e6


def read_all(ptr, size):
    host = (ctypes.c_ubyte * size)()
    check(fn("cuMemcpyDtoH_v2", "cuMemcpyDtoH")(host, ctypes.c_uint64(ptr), ctypes.c_size_t(size)),
          "cuMemcpyDtoH")
    return bytes(host)


def child(role, path):
    """`import`: receives a descriptor, reads the buffer, says what it read.
    `export`: makes a buffer of 0x5a bytes, sends its descriptor, then sleeps until killed."""
    dev = init()
    size = -(-SIZE // granularity(dev)) * granularity(dev)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    if role == "import":
        _, fds, _, _ = socket.recv_fds(s, 16, 1)
        ptr, us = import_fd(dev, fds[0], size)
        data = read_all(ptr, size)
        ok = data == bytes([0xA5]) * size
        s.sendall(f"{'ok' if ok else 'WRONG BYTES'} import+map {us:.0f} us".encode())
    else:
        ptr, fd, _ = create_exported(dev, size, 0x5A)
        socket.send_fds(s, [b"x"], [fd])
        s.recv(1)  # the parent has imported it
        time.sleep(3600)


def listen():
    path = f"/tmp/oxccl-vmm-probe-{os.getpid()}-{time.monotonic_ns()}"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    srv.settimeout(60)
    return srv, path


def spawn(role, path):
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "child", role, path])


def probe_export(dev, size):
    srv, path = listen()
    ptr, fd, (t_create, t_export) = create_exported(dev, size, 0xA5)
    p = spawn("import", path)
    conn, _ = srv.accept()
    conn.settimeout(60)
    socket.send_fds(conn, [b"x"], [fd])
    said = conn.recv(200).decode()
    p.wait(timeout=60)
    state = "ok" if said.startswith("ok") else "FAILED"
    print(f"probe vmm-export: {state} (child: {said}; create+map {t_create:.0f} us, export "
          f"{t_export:.0f} us, {size} bytes)", flush=True)
    os.unlink(path)


def probe_survivor(dev, size):
    srv, path = listen()
    p = spawn("export", path)
    conn, _ = srv.accept()
    conn.settimeout(60)
    _, fds, _, _ = socket.recv_fds(conn, 16, 1)
    ptr, us = import_fd(dev, fds[0], size)
    before = read_all(ptr, size) == bytes([0x5A]) * size
    conn.sendall(b"k")
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=60)
    time.sleep(0.5)
    try:
        after = read_all(ptr, size) == bytes([0x5A]) * size
        r = fn("cuCtxSynchronize")()
        state = "ok" if before and after and r == 0 else "FAILED"
        print(f"probe survivor-read: {state} (before the kill {before}, after {after}, "
              f"cuCtxSynchronize {r}; import+map {us:.0f} us)", flush=True)
    except RuntimeError as e:
        print(f"probe survivor-read: FAILED ({e}; before the kill {before})", flush=True)
    os.unlink(path)


def probe_wait_value():
    mm = mmap.mmap(-1, 4096, flags=mmap.MAP_SHARED)
    word = ctypes.c_uint32.from_buffer(mm)
    word.value = 0
    addr = ctypes.addressof(word)
    check(fn("cuMemHostRegister_v2", "cuMemHostRegister")(
        ctypes.c_void_p(addr), ctypes.c_size_t(4096),
        HOSTREGISTER_PORTABLE | HOSTREGISTER_DEVICEMAP), "cuMemHostRegister")
    dptr = ctypes.c_uint64()
    check(fn("cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer")(
        ctypes.byref(dptr), ctypes.c_void_p(addr), 0), "cuMemHostGetDevicePointer")
    stream, ev = ctypes.c_void_p(), ctypes.c_void_p()
    check(fn("cuStreamCreate")(ctypes.byref(stream), STREAM_NON_BLOCKING), "cuStreamCreate")
    check(fn("cuEventCreate")(ctypes.byref(ev), EVENT_DISABLE_TIMING), "cuEventCreate")
    check(fn("cuStreamWaitValue32_v2", "cuStreamWaitValue32")(stream, dptr, ctypes.c_uint32(1),
                                                             WAIT_GEQ), "cuStreamWaitValue32")
    check(fn("cuEventRecord")(ev, stream), "cuEventRecord")
    time.sleep(0.1)
    blocked = fn("cuEventQuery")(ev) == NOT_READY
    t0 = time.perf_counter()
    word.value = 1
    while True:
        r = fn("cuEventQuery")(ev)
        if r != NOT_READY or time.perf_counter() - t0 > 5:
            break
    us = (time.perf_counter() - t0) * 1e6
    state = "ok" if blocked and r == 0 else "FAILED"
    print(f"probe wait-value: {state} (blocked before the write: {blocked}; event after the "
          f"write: {r} in {us:.1f} us)", flush=True)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "child":
        child(sys.argv[2], sys.argv[3])
        return
    try:
        dev = init()
    except OSError as e:
        print(f"skipped: no CUDA driver ({e})", flush=True)
        return
    attr = ctypes.c_int()
    # The driver API's numbers (cuda.h's CUdevice_attribute; the runtime's cudaDeviceAttr, which
    # ipc_probe.py reads through cupy, numbers some of them differently).
    for name, a in [("can_use_stream_mem_ops_v1", 92), ("virtual_memory_management", 102),
                    ("handle_type_posix_file_descriptor", 103)]:
        r = fn("cuDeviceGetAttribute")(ctypes.byref(attr), a, dev)
        print(f"attribute {name} ({a}): {attr.value if r == 0 else f'error {r}'}", flush=True)
    size = -(-SIZE // granularity(dev)) * granularity(dev)
    for probe in (lambda: probe_export(dev, size), lambda: probe_survivor(dev, size),
                  probe_wait_value):
        try:
            probe()
        except Exception as e:  # noqa: BLE001
            print(f"probe FAILED: {e!r}", flush=True)


if __name__ == "__main__":
    main()
