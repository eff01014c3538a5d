//! Reduction operators: nccl.h's built-in ones, our bitwise extensions, and the pre-multiplied
//! sums a caller makes with `oxcclRedOpCreatePreMulSum` (each rank's input times a scalar,
//! then summed: what DDP uses to average gradients by a factor other than 1/nranks).
//!
//! A pre-multiplied sum runs as a sum over a scaled copy of the input: the scaling rounds once
//! per element in the data type (integers wrap; 16-bit floats multiply in f32 and round to
//! nearest even, as NCCL does), then the sum rounds as the sum does.

use std::collections::BTreeMap;
use std::ffi::c_void;

use half::{bf16, f16};
use oxccl_core::{DataType, F8E4M3, F8E5M2, ReduceOp};

use crate::abi::*;
use crate::boundary::{Failure, Outcome, data_type, non_null};
use crate::handles;

/// Where a pre-multiplied sum's scalar is.
#[derive(Clone, Copy)]
enum Scalar {
    /// Copied at creation (`oxcclScalarHostImmediate`), in the data type's bytes.
    Value([u8; 8]),
    /// Read from this address when an operation is issued (`oxcclScalarDevice`).
    At(usize),
}

#[derive(Clone, Copy)]
struct PreMulSum {
    dtype: DataType,
    scalar: Scalar,
}

/// A communicator's pre-multiplied sums, by operator value.
#[derive(Default)]
pub(crate) struct Operators {
    live: BTreeMap<oxcclRedOp_t, PreMulSum>,
}

/// The operator of a call.
pub(crate) enum Operator {
    /// A built-in or extension operator.
    Plain(ReduceOp),
    /// Sum of each rank's input scaled by the scalar (its bytes in the data type).
    PreMulSum([u8; 8]),
    /// The same with the scalar in device memory at this address (`oxcclScalarDevice`): read
    /// on the call's stream when the call runs ([`crate::device::scalar_at`]).
    PreMulSumAt(usize),
}

/// Values of created operators: from nccl.h's `ncclNumOps` up to, not including, our first
/// bitwise extension.
const FIRST: oxcclRedOp_t = oxcclNumOps;
const END: oxcclRedOp_t = oxcclBand;

/// The operator `raw` of a call on data of `dtype` on `comm`'s entry (`cuda`: the program used
/// CUDA when the communicator was made, so a scalar may lie in device memory).
pub(crate) fn operator(
    raw: oxcclRedOp_t,
    dtype: DataType,
    ops: &std::sync::Mutex<Operators>,
    cuda: bool,
) -> Result<Operator, Failure> {
    let plain = match raw {
        oxcclSum => ReduceOp::Sum,
        oxcclProd => ReduceOp::Prod,
        oxcclMax => ReduceOp::Max,
        oxcclMin => ReduceOp::Min,
        oxcclAvg => ReduceOp::Avg,
        oxcclBand => ReduceOp::BAnd,
        oxcclBor => ReduceOp::BOr,
        oxcclBxor => ReduceOp::BXor,
        _ => {
            let found = ops
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .live
                .get(&raw)
                .copied();
            let Some(p) = found else {
                return Err(Failure::invalid(format!(
                    "op: {raw} is not an oxcclRedOp_t (oxcclSum to oxcclAvg, oxcclBand, \
                     oxcclBor, oxcclBxor, or one made by oxcclRedOpCreatePreMulSum on this \
                     comm and not destroyed)"
                )));
            };
            if p.dtype != dtype {
                return Err(Failure::invalid(format!(
                    "op: {raw} was made for {} but the data are {dtype}",
                    p.dtype
                )));
            }
            let value = match p.scalar {
                Scalar::Value(v) => v,
                // Device memory (as torch passes it) is read on the device, on the call's
                // stream; reading it here, on the host, crashed the program.
                Scalar::At(addr) if cuda && crate::device::is_device(addr as *const c_void) => {
                    return Ok(Operator::PreMulSumAt(addr));
                }
                // SAFETY: the contract of oxcclRedOpCreatePreMulSum with oxcclScalarDevice:
                // the scalar stays readable until the operator is destroyed (host memory here:
                // pinned or managed memory the device can see, or any in a program without
                // CUDA).
                Scalar::At(addr) => unsafe { read_scalar(addr as *const u8, dtype) },
            };
            return Ok(Operator::PreMulSum(value));
        }
    };
    if !plain.supports(dtype) {
        return Err(Failure::invalid(format!(
            "op: {plain} is not defined on {dtype}"
        )));
    }
    Ok(Operator::Plain(plain))
}

/// The `dtype.size()` bytes at `at`.
///
/// # Safety
///
/// `at` is readable for `dtype.size()` bytes.
unsafe fn read_scalar(at: *const u8, dtype: DataType) -> [u8; 8] {
    let mut v = [0u8; 8];
    // SAFETY: the caller's contract; size() <= 8.
    unsafe { std::ptr::copy_nonoverlapping(at, v.as_mut_ptr(), dtype.size()) };
    v
}

fn e4m3(bits: u8) -> f32 {
    F8E4M3::from_bits(bits).to_f32()
}

fn e5m2(bits: u8) -> f32 {
    F8E5M2::from_bits(bits).to_f32()
}

macro_rules! scale_int {
    ($t:ty, $dst:expr, $src:expr, $k:expr) => {{
        const N: usize = std::mem::size_of::<$t>();
        let k = <$t>::from_ne_bytes($k[..N].try_into().expect("N bytes"));
        for (d, s) in $dst.chunks_exact_mut(N).zip($src.chunks_exact(N)) {
            let x = <$t>::from_ne_bytes(s.try_into().expect("N bytes"));
            d.copy_from_slice(&x.wrapping_mul(k).to_ne_bytes());
        }
    }};
}

macro_rules! scale_float {
    ($t:ty, $dst:expr, $src:expr, $k:expr, $to:expr, $from:expr) => {{
        const N: usize = std::mem::size_of::<$t>();
        let k = $to(<$t>::from_ne_bytes($k[..N].try_into().expect("N bytes")));
        for (d, s) in $dst.chunks_exact_mut(N).zip($src.chunks_exact(N)) {
            let x = $to(<$t>::from_ne_bytes(s.try_into().expect("N bytes")));
            let y: $t = $from(x * k);
            d.copy_from_slice(&y.to_ne_bytes());
        }
    }};
}

/// `dst` becomes `src` times the scalar `k` (bytes of `dtype`), element by element.
pub(crate) fn scale(dst: &mut [u8], src: &[u8], dtype: DataType, k: [u8; 8]) -> Outcome {
    match dtype {
        DataType::I8 => scale_int!(i8, dst, src, k),
        DataType::U8 => scale_int!(u8, dst, src, k),
        DataType::I32 => scale_int!(i32, dst, src, k),
        DataType::U32 => scale_int!(u32, dst, src, k),
        DataType::I64 => scale_int!(i64, dst, src, k),
        DataType::U64 => scale_int!(u64, dst, src, k),
        DataType::F16 => scale_float!(f16, dst, src, k, f32::from, f16::from_f32),
        DataType::BF16 => scale_float!(bf16, dst, src, k, f32::from, bf16::from_f32),
        DataType::F32 => scale_float!(f32, dst, src, k, |x| x, |x| x),
        DataType::F64 => scale_float!(f64, dst, src, k, |x| x, |x| x),
        DataType::F8E4M3 => scale_float!(u8, dst, src, k, e4m3, |x| F8E4M3::from_f32(x).to_bits()),
        DataType::F8E5M2 => scale_float!(u8, dst, src, k, e5m2, |x| F8E5M2::from_f32(x).to_bits()),
        #[allow(unreachable_patterns)]
        other => {
            return Err(Failure::invalid(format!(
                "op: pre-multiplied sums are not supported on {other}"
            )));
        }
    }
    Ok(())
}

/// Makes a pre-multiplied sum on `comm`: each rank's input is multiplied by the scalar (of
/// `datatype`) at `scalar`, then summed. With `oxcclScalarHostImmediate` the scalar is copied
/// now (a pointer to CUDA device memory is an `oxcclInvalidArgument` then); with
/// `oxcclScalarDevice` it is read each time an operation using the operator is issued, so it
/// must stay readable until `oxcclRedOpDestroy`: in CUDA device memory (in a program that had
/// loaded CUDA when `comm` was made) it is copied from the device on the operation's stream
/// (NULL: CUDA's default stream) after the stream's earlier work, otherwise read from host
/// memory. The operator is valid on `comm` only, for data of `datatype` only.
///
/// # Safety
///
/// `op` is NULL (an error) or writable; `scalar` is NULL (an error) or readable for one
/// element of `datatype` (and stays so, with `oxcclScalarDevice`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclRedOpCreatePreMulSum(
    op: *mut oxcclRedOp_t,
    scalar: *mut c_void,
    datatype: oxcclDataType_t,
    residence: oxcclScalarResidence_t,
    comm: oxcclComm_t,
) -> oxcclResult_t {
    crate::boundary::guard("oxcclRedOpCreatePreMulSum", || {
        let entry = handles::get(comm, "comm")?;
        non_null(op, "op")?;
        non_null(scalar, "scalar")?;
        let dtype = data_type(datatype)?;
        let scalar = match residence {
            oxcclScalarHostImmediate => {
                if entry.cuda && crate::device::is_device(scalar.cast_const()) {
                    return Err(Failure::invalid(format!(
                        "scalar: {scalar:p} is CUDA device memory, but residence is \
                         oxcclScalarHostImmediate (the value is read on the host now): pass \
                         oxcclScalarDevice"
                    )));
                }
                // SAFETY: not NULL; the caller guarantees one readable element.
                Scalar::Value(unsafe { read_scalar(scalar.cast::<u8>(), dtype) })
            }
            oxcclScalarDevice => Scalar::At(scalar as usize),
            other => {
                return Err(Failure::invalid(format!(
                    "residence: {other} is not oxcclScalarDevice (0) or \
                     oxcclScalarHostImmediate (1)"
                )));
            }
        };
        // Check the type now, not at first use.
        scale(&mut [], &[], dtype, [0; 8])?;
        let mut ops = entry
            .operators
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let value = (FIRST..END)
            .find(|v| !ops.live.contains_key(v))
            .ok_or_else(|| {
                Failure::usage(format!(
                    "op: this comm already has {} operators; destroy some",
                    END - FIRST
                ))
            })?;
        ops.live.insert(value, PreMulSum { dtype, scalar });
        // SAFETY: not NULL; the caller guarantees it is writable.
        unsafe { op.write(value) };
        Ok(())
    })
}

/// Destroys an operator made by `oxcclRedOpCreatePreMulSum` on `comm`; its value may be
/// given to a new operator afterwards.
#[unsafe(no_mangle)]
pub extern "C" fn oxcclRedOpDestroy(op: oxcclRedOp_t, comm: oxcclComm_t) -> oxcclResult_t {
    crate::boundary::guard("oxcclRedOpDestroy", || {
        let entry = handles::get(comm, "comm")?;
        let removed = entry
            .operators
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .live
            .remove(&op);
        match removed {
            Some(_) => Ok(()),
            None => Err(Failure::invalid(format!(
                "op: {op} was not made by oxcclRedOpCreatePreMulSum on this comm (or was \
                 destroyed already)"
            ))),
        }
    })
}
