"""liboxccl's C ABI through ctypes: the library, its constants (nccl.h's values) and error
handling. Nothing here imports torch.

The library is the one built into this package at install time (``_liboxccl*.so``), or the
file ``OXCCL_LIBRARY`` names (for a development build: ``target/release/liboxccl.so``).
ctypes releases the GIL for the duration of every call, so other Python threads run while a
rank waits for its peers.
"""

import ctypes
import glob
import os
from ctypes import POINTER, c_char_p, c_int, c_size_t, c_void_p

# Result codes (nccl.h's values).
SUCCESS = 0
UNHANDLED_CUDA_ERROR = 1
SYSTEM_ERROR = 2
INTERNAL_ERROR = 3
INVALID_ARGUMENT = 4
INVALID_USAGE = 5
REMOTE_ERROR = 6
IN_PROGRESS = 7
TIMEOUT = 8

# Data types.
INT8, UINT8, INT32, UINT32, INT64, UINT64 = 0, 1, 2, 3, 4, 5
FLOAT16, FLOAT32, FLOAT64, BFLOAT16 = 6, 7, 8, 9
FLOAT8E4M3, FLOAT8E5M2 = 10, 11

# Reduction operators; the bitwise ones are oxccl's extension values above NCCL's.
SUM, PROD, MAX, MIN, AVG = 0, 1, 2, 3, 4
BAND, BOR, BXOR = 4096, 4097, 4098

# Where a pre-multiplier lives (oxcclRedOpCreatePreMulSum).
SCALAR_DEVICE, SCALAR_HOST_IMMEDIATE = 0, 1

UNIQUE_ID_BYTES = 128


class UniqueId(ctypes.Structure):
    """oxcclUniqueId, passed by value as nccl.h's ncclUniqueId is."""

    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


class OxcclError(RuntimeError):
    """An oxccl call failed. ``code`` is the result code (``TIMEOUT``, ``REMOTE_ERROR``,
    ...); the message names the rank, the operation and, where one is to blame, the peer."""

    def __init__(self, code, message, detail=None):
        super().__init__(message)
        self.code = code
        self.detail = detail or message  # what oxccl said, without the call's name


def _find_library():
    path = os.environ.get("OXCCL_LIBRARY")
    if path:
        return path
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_liboxccl*.so")))
    if not found:
        raise ImportError(
            f"oxccl: no _liboxccl*.so in {here} (install the package with `pip install ./python` "
            "from a checkout, or set OXCCL_LIBRARY to a liboxccl.so)"
        )
    return found[0]


LIBRARY = _find_library()
lib = ctypes.CDLL(LIBRARY)

_comm_p = POINTER(c_void_p)
_signatures = {
    "oxcclGetVersion": [POINTER(c_int)],
    "oxcclGetUniqueId": [POINTER(UniqueId)],
    "oxcclCommInitRank": [_comm_p, c_int, UniqueId, c_int],
    "oxcclCommSplit": [c_void_p, c_int, c_int, _comm_p, c_void_p],
    "oxcclCommSplitOptions": [c_void_p, c_int, c_int, _comm_p, c_void_p, c_char_p],
    "oxcclCommFinalize": [c_void_p],
    "oxcclCommDestroy": [c_void_p],
    "oxcclCommAbort": [c_void_p],
    "oxcclCommGetAsyncError": [c_void_p, POINTER(c_int)],
    "oxcclCommFailedPeer": [c_void_p, POINTER(c_int)],
    "oxcclCommPeerFailed": [c_void_p, c_int, POINTER(c_int)],
    "oxcclCommCount": [c_void_p, POINTER(c_int)],
    "oxcclCommUserRank": [c_void_p, POINTER(c_int)],
    "oxcclAllReduce": [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p],
    "oxcclBroadcast": [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p],
    "oxcclReduce": [c_void_p, c_void_p, c_size_t, c_int, c_int, c_int, c_void_p, c_void_p],
    "oxcclAllGather": [c_void_p, c_void_p, c_size_t, c_int, c_void_p, c_void_p],
    "oxcclReduceScatter": [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p],
    "oxcclAlltoAll": [c_void_p, c_void_p, c_size_t, c_int, c_void_p, c_void_p],
    "oxcclGather": [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p],
    "oxcclScatter": [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p],
    "oxcclSend": [c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p],
    "oxcclRecv": [c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p],
    "oxcclBarrier": [c_void_p, c_void_p],
    "oxcclSendStart": [c_void_p, c_size_t, c_int, c_int, c_int, c_void_p, POINTER(c_void_p)],
    "oxcclRecvStart": [c_void_p, c_size_t, c_int, c_int, c_int, c_void_p, POINTER(c_void_p)],
    "oxcclRequestWait": [POINTER(c_void_p)],
    "oxcclRequestTest": [POINTER(c_void_p), POINTER(c_int)],
    "oxcclCommInitRankOptions": [_comm_p, c_int, UniqueId, c_int, c_void_p, c_char_p],
    "oxcclGroupStart": [],
    "oxcclGroupEnd": [],
    "oxcclRedOpCreatePreMulSum": [POINTER(c_int), c_void_p, c_int, c_int, c_void_p],
    "oxcclRedOpDestroy": [c_int, c_void_p],
}
for _name, _args in _signatures.items():
    _f = getattr(lib, _name)
    _f.argtypes = _args
    _f.restype = c_int
lib.oxcclGetErrorString.argtypes = [c_int]
lib.oxcclGetErrorString.restype = c_char_p
lib.oxcclGetLastError.argtypes = [c_void_p]
lib.oxcclGetLastError.restype = c_char_p


def error_string(code):
    return (lib.oxcclGetErrorString(code) or b"").decode(errors="replace")


def last_error(comm=None):
    """The message of the last failure on this thread (``comm`` None) or of ``comm``."""
    return (lib.oxcclGetLastError(comm) or b"").decode(errors="replace")


def fail(code, what, comm=None):
    """Raises OxcclError for a failed call's result ``code``."""
    detail = last_error(comm) or last_error(None) or error_string(code)
    raise OxcclError(code, f"oxccl {what}: {detail} ({error_string(code)})", detail)


def check(code, what, comm=None):
    if code != SUCCESS:
        fail(code, what, comm)


def version():
    v = c_int(0)
    check(lib.oxcclGetVersion(ctypes.byref(v)), "GetVersion")
    return v.value


def unique_id():
    """A fresh UniqueId as bytes (rank 0 makes it; it travels to the others)."""
    uid = UniqueId()
    check(lib.oxcclGetUniqueId(ctypes.byref(uid)), "GetUniqueId")
    return ctypes.string_at(ctypes.addressof(uid), UNIQUE_ID_BYTES)


def _options(timeout_s):
    """The settings of a communicator this package makes: its timeout, and its UniqueId's
    store server kept by rank 0's communicator rather than the process (so that groups made
    and destroyed again and again leave no thread or socket behind; the package never uses
    an id twice)."""
    options = "OXCCL_UNIQUE_ID_SERVER=comm"
    if timeout_s is not None:
        options += f";OXCCL_TIMEOUT={float(timeout_s)!r}"
    return options.encode()


class Config(ctypes.Structure):
    """oxcclConfig_t up to ``blocking`` (an older caller's smaller layout, which the library
    accepts: the fields past ``size`` count as undefined)."""

    _fields_ = [("size", c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("blocking", c_int)]


CONFIG_MAGIC = 0xCAFEBEEF
CONFIG_VERSION = 22705  # NCCL 2.27.5's layout, as OXCCL_CONFIG_INITIALIZER writes


def init_rank(nranks, uid_bytes, rank, timeout_s=None, blocking=True):
    """A communicator of ``nranks`` for ``rank``, meeting at the UniqueId ``uid_bytes``;
    ``timeout_s`` (seconds) becomes its deadline for creation and every operation (a setting
    of this communicator: the process's environment is left alone, since other threads may
    be creating communicators). With ``blocking`` False the creation only starts: poll
    ``comm_state`` until it is no longer IN_PROGRESS (``oxcclCommAbort`` gives it up)."""
    if len(uid_bytes) != UNIQUE_ID_BYTES:
        raise ValueError(f"oxccl: a unique id is {UNIQUE_ID_BYTES} bytes, not {len(uid_bytes)}")
    uid = UniqueId.from_buffer_copy(uid_bytes)
    config = None
    if not blocking:
        size = Config.blocking.offset + ctypes.sizeof(c_int)
        config = ctypes.byref(Config(size, CONFIG_MAGIC, CONFIG_VERSION, 0))
    comm = c_void_p()
    code = lib.oxcclCommInitRankOptions(
        ctypes.byref(comm), nranks, uid, rank, config, _options(timeout_s)
    )
    if blocking or code != IN_PROGRESS:
        check(code, f"CommInitRank (rank {rank} of {nranks})")
    return comm.value


def comm_state(comm):
    """oxcclCommGetAsyncError: SUCCESS, IN_PROGRESS, or the failure that broke ``comm``
    (``last_error()`` then says what)."""
    state = c_int(SUCCESS)
    check(lib.oxcclCommGetAsyncError(comm, ctypes.byref(state)), "CommGetAsyncError", comm)
    return state.value


def peer_failed(comm, peer):
    """oxcclCommPeerFailed: whether ``comm`` has seen rank ``peer`` fail (heartbeats), whichever
    rank failed first."""
    failed = c_int(0)
    check(lib.oxcclCommPeerFailed(comm, peer, ctypes.byref(failed)), "CommPeerFailed", comm)
    return bool(failed.value)


def split(comm, color, key, timeout_s=None):
    """oxcclCommSplitOptions: the new communicator's handle, or None (``color`` < 0: not a
    member). It has this package's settings with its own timeout (``timeout_s``: a subgroup's
    own, which may differ from the parent's)."""
    new = c_void_p()
    code = lib.oxcclCommSplitOptions(comm, color, key, ctypes.byref(new), None,
                                     _options(timeout_s))
    check(code, f"CommSplit (color {color}, key {key})", comm)
    return new.value


def pre_mul_sum(scalar_ptr, dtype, comm):
    """An operator that multiplies every input by the scalar at ``scalar_ptr`` (host memory,
    one element of ``dtype``, read now) and sums."""
    op = c_int(0)
    check(
        lib.oxcclRedOpCreatePreMulSum(
            ctypes.byref(op), scalar_ptr, dtype, SCALAR_HOST_IMMEDIATE, comm
        ),
        "RedOpCreatePreMulSum",
        comm,
    )
    return op.value


def destroy_op(op, comm):
    check(lib.oxcclRedOpDestroy(op, comm), "RedOpDestroy", comm)
