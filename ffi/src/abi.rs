//! The C types: result codes, data types and reduction operators as plain `int`s with nccl.h's
//! values (a C caller can pass any int, so they are validated, never transmuted), the 128-byte
//! unique id and the opaque communicator handle.

use std::ffi::{c_char, c_int};

/// Result of every oxccl call (nccl.h's `ncclResult_t`); one of the `oxccl*` result codes.
pub type oxcclResult_t = c_int;
/// Success.
pub const oxcclSuccess: oxcclResult_t = 0;
/// A CUDA call failed (not returned by this host-memory build).
pub const oxcclUnhandledCudaError: oxcclResult_t = 1;
/// The operating system or the network failed: a socket, a store, a missing launcher
/// environment, a feature this machine lacks.
pub const oxcclSystemError: oxcclResult_t = 2;
/// A bug in oxccl (a panic, which is caught at the boundary).
pub const oxcclInternalError: oxcclResult_t = 3;
/// An argument was wrong; `oxcclGetLastError` names it.
pub const oxcclInvalidArgument: oxcclResult_t = 4;
/// The call is not allowed in this state or configuration (a CUDA stream where this version
/// takes host memory only, ranks whose calls do not match).
pub const oxcclInvalidUsage: oxcclResult_t = 5;
/// A peer failed (died, closed its connection, aborted) or the communicator was aborted.
pub const oxcclRemoteError: oxcclResult_t = 6;
/// An operation is still running (non-blocking communicators; not returned yet).
pub const oxcclInProgress: oxcclResult_t = 7;
/// A wait ran past the communicator's deadline (`OXCCL_TIMEOUT`).
pub const oxcclTimeout: oxcclResult_t = 8;
/// One more than the largest result code.
pub const oxcclNumResults: oxcclResult_t = 9;

/// Element type of a buffer (nccl.h's `ncclDataType_t`); one of the `oxccl*` data types.
pub type oxcclDataType_t = c_int;
/// Signed 8-bit integer.
pub const oxcclInt8: oxcclDataType_t = 0;
/// Same as `oxcclInt8`.
pub const oxcclChar: oxcclDataType_t = 0;
/// Unsigned 8-bit integer.
pub const oxcclUint8: oxcclDataType_t = 1;
/// Signed 32-bit integer.
pub const oxcclInt32: oxcclDataType_t = 2;
/// Same as `oxcclInt32`.
pub const oxcclInt: oxcclDataType_t = 2;
/// Unsigned 32-bit integer.
pub const oxcclUint32: oxcclDataType_t = 3;
/// Signed 64-bit integer.
pub const oxcclInt64: oxcclDataType_t = 4;
/// Unsigned 64-bit integer.
pub const oxcclUint64: oxcclDataType_t = 5;
/// IEEE 754 binary16.
pub const oxcclFloat16: oxcclDataType_t = 6;
/// Same as `oxcclFloat16`.
pub const oxcclHalf: oxcclDataType_t = 6;
/// IEEE 754 binary32.
pub const oxcclFloat32: oxcclDataType_t = 7;
/// Same as `oxcclFloat32`.
pub const oxcclFloat: oxcclDataType_t = 7;
/// IEEE 754 binary64.
pub const oxcclFloat64: oxcclDataType_t = 8;
/// Same as `oxcclFloat64`.
pub const oxcclDouble: oxcclDataType_t = 8;
/// bfloat16.
pub const oxcclBfloat16: oxcclDataType_t = 9;
/// 8-bit float, OCP E4M3FN: 4 exponent bits, 3 mantissa bits, no infinities, largest 448.
/// Each reduction step computes in f32 and rounds to nearest even, saturating to ±448 (as
/// NCCL does); NaN stays NaN.
pub const oxcclFloat8e4m3: oxcclDataType_t = 10;
/// 8-bit float, OCP E5M2: 5 exponent bits, 2 mantissa bits, largest finite 57344. Each
/// reduction step computes in f32 and rounds to nearest even, saturating to ±57344 (as NCCL
/// does: an infinity that takes part in a step becomes ±57344); NaN stays NaN.
pub const oxcclFloat8e5m2: oxcclDataType_t = 11;
/// One more than the largest data type.
pub const oxcclNumTypes: oxcclDataType_t = 12;

/// Reduction operator (nccl.h's `ncclRedOp_t`); one of the `oxccl*` operators.
///
/// Values 0 to 4 are nccl.h's. The bitwise operators are oxccl extensions, numbered from
/// 0x1000 so that they stay clear of the values NCCL gives the operators
/// `ncclRedOpCreatePreMulSum` creates (`ncclNumOps` upward); they are defined on integer types
/// only.
pub type oxcclRedOp_t = c_int;
/// Sum (wrapping on integers).
pub const oxcclSum: oxcclRedOp_t = 0;
/// Product (wrapping on integers).
pub const oxcclProd: oxcclRedOp_t = 1;
/// Maximum (NaN-propagating on floats).
pub const oxcclMax: oxcclRedOp_t = 2;
/// Minimum (NaN-propagating on floats).
pub const oxcclMin: oxcclRedOp_t = 3;
/// Sum divided once by the number of ranks.
pub const oxcclAvg: oxcclRedOp_t = 4;
/// Number of nccl.h's built-in operators.
pub const oxcclNumOps: oxcclRedOp_t = 5;
/// Extension: bitwise and (integer types only).
pub const oxcclBand: oxcclRedOp_t = 0x1000;
/// Extension: bitwise or (integer types only).
pub const oxcclBor: oxcclRedOp_t = 0x1001;
/// Extension: bitwise exclusive or (integer types only).
pub const oxcclBxor: oxcclRedOp_t = 0x1002;

/// Size of an `oxcclUniqueId` in bytes.
pub const OXCCL_UNIQUE_ID_BYTES: usize = 128;

/// What every rank needs to find the others (nccl.h's `ncclUniqueId`): made once by
/// `oxcclGetUniqueId`, copied to every rank out of band (a file, MPI_Bcast, a socket), passed
/// by value to `oxcclCommInitRank`. It holds the address of a store and a job secret: treat it
/// as a password.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct oxcclUniqueId {
    /// Opaque bytes.
    pub internal: [c_char; OXCCL_UNIQUE_ID_BYTES],
}

/// A communicator; only ever handled through an `oxcclComm_t`.
pub struct oxcclComm {
    _private: [u8; 0],
}

/// Handle of a communicator (nccl.h's `ncclComm_t`). Opaque: it is never dereferenced, by the
/// caller or by oxccl, only looked up among the live communicators.
pub type oxcclComm_t = *mut oxcclComm;

/// A CUDA stream (`cudaStream_t`): NULL for host memory; a collective, send or receive given a
/// stream takes CUDA device memory, ordered on that stream.
pub type oxcclStream_t = *mut std::ffi::c_void;

/// Where the scalar of `oxcclRedOpCreatePreMulSum` lives (nccl.h's `ncclScalarResidence_t`).
pub type oxcclScalarResidence_t = c_int;
/// The scalar is read through its pointer when each operation using the operator runs (NCCL:
/// device memory; in this host-memory build, host memory that must stay valid until the
/// operator is destroyed).
pub const oxcclScalarDevice: oxcclScalarResidence_t = 0;
/// The scalar is copied from the pointer when the operator is created.
pub const oxcclScalarHostImmediate: oxcclScalarResidence_t = 1;

/// The `color` of `oxcclCommSplit` for a rank that joins no new communicator.
pub const OXCCL_SPLIT_NOCOLOR: c_int = -1;
/// `oxcclCommShrink`'s flags: wait for the communicator's earlier operations.
pub const OXCCL_SHRINK_DEFAULT: c_int = 0;
/// `oxcclCommShrink`'s flags: abort the communicator's earlier operations first.
pub const OXCCL_SHRINK_ABORT: c_int = 1;
/// An `int` field of `oxcclConfig_t` left to the library (`INT_MIN`).
pub const OXCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `oxcclConfig_t.magic` as `OXCCL_CONFIG_INITIALIZER` sets it (NCCL's value).
pub const OXCCL_CONFIG_MAGIC: u32 = 0xcafe_beef;

/// Options of a new communicator (nccl.h's `ncclConfig_t`, NCCL 2.27's layout). Start from
/// `OXCCL_CONFIG_INITIALIZER`, which sets `size`, `magic` and `version` and leaves every other
/// field undefined (`OXCCL_CONFIG_UNDEF_INT`, NULL); a caller built against an older, smaller
/// layout passes its own `size`, and the fields past it count as undefined.
///
/// oxccl uses `blocking` (0: creation and operations return `oxcclInProgress` and run in the
/// background; `oxcclCommGetAsyncError` tells when they are done; undefined or 1: every call
/// completes before it returns). The other fields are NCCL's and are accepted and ignored:
/// the GPU ones (`cgaClusterSize`, `minCTAs`, `maxCTAs`, `nvlsCTAs`, `CTAPolicy`), `netName`
/// (transports come from `OXCCL_TRANSPORTS`), `splitShare`, `trafficClass`, `commName`,
/// `collnetEnable` and `shrinkShare`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct oxcclConfig_t {
    /// `sizeof(oxcclConfig_t)` of the caller's build.
    pub size: usize,
    /// `OXCCL_CONFIG_MAGIC`.
    pub magic: u32,
    /// The version of the caller's header (`major * 10000 + minor * 100 + patch`).
    pub version: u32,
    /// 1 (or undefined): calls complete before they return; 0: they may return
    /// `oxcclInProgress`.
    pub blocking: c_int,
    /// NCCL: CUDA thread block cluster size; ignored.
    pub cgaClusterSize: c_int,
    /// NCCL: minimum CTAs; ignored.
    pub minCTAs: c_int,
    /// NCCL: maximum CTAs; ignored.
    pub maxCTAs: c_int,
    /// NCCL: network plugin name; ignored (transports come from `OXCCL_TRANSPORTS`).
    pub netName: *const c_char,
    /// NCCL: share resources with the parent on split; ignored.
    pub splitShare: c_int,
    /// NCCL: network traffic class; ignored.
    pub trafficClass: c_int,
    /// NCCL: a name for the communicator; ignored.
    pub commName: *const c_char,
    /// NCCL: CollNet; ignored.
    pub collnetEnable: c_int,
    /// NCCL: CTA policy; ignored.
    pub CTAPolicy: c_int,
    /// NCCL: share resources with the parent on shrink; ignored.
    pub shrinkShare: c_int,
    /// NCCL: NVLink SHARP CTAs; ignored.
    pub nvlsCTAs: c_int,
}

/// A started send or receive; only ever handled through an `oxcclRequest_t`.
pub struct oxcclRequest {
    _private: [u8; 0],
}

/// Handle of a send or receive started by `oxcclSendStart` or `oxcclRecvStart` (an
/// extension), opaque like `oxcclComm_t`: looked up among the live requests, never
/// dereferenced. `oxcclRequestWait`, or an `oxcclRequestTest` that finds it done, ends it.
pub type oxcclRequest_t = *mut oxcclRequest;

/// A registered window; only ever handled through an `oxcclWindow_t`.
pub struct oxcclWindow {
    _private: [u8; 0],
}

/// Handle of a registered window (nccl.h's `ncclWindow_t`), opaque like `oxcclComm_t`.
pub type oxcclWindow_t = *mut oxcclWindow;
