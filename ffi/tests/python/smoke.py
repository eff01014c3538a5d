"""A ctypes smoke test of liboxccl.so: versions, ids, error strings and messages, and a 1-rank
communicator's all-reduce. Run by ffi/tests/python.rs as `python3 smoke.py LIBRARY VERSION`;
prints "ok" when every check holds."""

import ctypes
import sys
from ctypes import POINTER, byref, c_char_p, c_float, c_int, c_size_t, c_void_p

SUCCESS, INVALID_ARGUMENT = 0, 4
FLOAT32, SUM, AVG = 7, 0, 4


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def main(path, version):
    lib = ctypes.CDLL(path)
    lib.oxcclGetErrorString.restype = c_char_p
    lib.oxcclGetErrorString.argtypes = [c_int]
    lib.oxcclGetLastError.restype = c_char_p
    lib.oxcclGetLastError.argtypes = [c_void_p]
    lib.oxcclCommInitRank.argtypes = [POINTER(c_void_p), c_int, UniqueId, c_int]
    lib.oxcclCommCount.argtypes = [c_void_p, POINTER(c_int)]
    lib.oxcclCommDestroy.argtypes = [c_void_p]
    lib.oxcclAllReduce.argtypes = [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p]

    def fails(result, code, words):
        message = lib.oxcclGetLastError(None).decode()
        assert result == code, f"result {result}, expected {code}: {message}"
        assert words in message, f"{message!r} does not name {words!r}"

    v = c_int(0)
    assert lib.oxcclGetVersion(byref(v)) == SUCCESS
    assert v.value == version, f"version {v.value}, expected {version}"
    fails(lib.oxcclGetVersion(None), INVALID_ARGUMENT, "version")

    assert lib.oxcclGetErrorString(SUCCESS) == b"no error"
    assert b"invalid argument" in lib.oxcclGetErrorString(INVALID_ARGUMENT)
    assert lib.oxcclGetErrorString(1000) == b"unknown result code"

    uid = UniqueId()
    assert lib.oxcclGetUniqueId(byref(uid)) == SUCCESS
    assert any(uid.internal), "an all-zero unique id"
    comm = c_void_p()
    assert lib.oxcclCommInitRank(byref(comm), 1, uid, 0) == SUCCESS, lib.oxcclGetLastError(None)
    n = c_int(0)
    assert lib.oxcclCommCount(comm, byref(n)) == SUCCESS and n.value == 1

    values = [1.5 * i - 3 for i in range(10)]
    send, recv = (c_float * 10)(*values), (c_float * 10)()
    assert lib.oxcclAllReduce(send, recv, 10, FLOAT32, SUM, comm, None) == SUCCESS
    assert list(recv) == values, list(recv)
    assert lib.oxcclAllReduce(recv, recv, 10, FLOAT32, AVG, comm, None) == SUCCESS
    assert list(recv) == values, list(recv)
    fails(lib.oxcclAllReduce(send, recv, 10, 99, SUM, comm, None), INVALID_ARGUMENT, "datatype")

    assert lib.oxcclCommDestroy(comm) == SUCCESS
    fails(lib.oxcclCommDestroy(comm), INVALID_ARGUMENT, "not a live communicator")
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
