//! The exported functions called as C would call them: what differs from oxccl's ABI (version,
//! timeout code, error strings), and that both names of a function reach oxccl.

use std::ffi::{CStr, c_int, c_void};
use std::ptr::{null, null_mut};

use crate::differences::IntoNccl;
use crate::*;

fn text(s: *const std::ffi::c_char) -> String {
    // SAFETY: the functions tested return static or thread-local NUL-terminated strings.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

#[test]
fn the_version_is_nccl_s() {
    for get in [ncclGetVersion, pncclGetVersion] {
        let mut v = 0;
        // SAFETY: a writable int.
        assert_eq!(unsafe { get(&mut v) }, oxcclSuccess);
        assert_eq!(v, 22705);
        // SAFETY: NULL is checked.
        assert_eq!(unsafe { get(null_mut()) }, oxcclInvalidArgument);
        // SAFETY: any handle may be passed.
        let last = text(unsafe { ncclGetLastError(null_mut()) });
        // The caller called NCCL's function: the message says so.
        assert!(last.starts_with("ncclGetVersion: "), "{last}");
        assert!(last.contains("version"), "{last}");
        let ours = text(oxccl::oxcclGetLastError(null_mut()));
        assert!(ours.starts_with("oxcclGetVersion: "), "{ours}");
    }
}

#[test]
fn a_timeout_is_a_remote_error() {
    assert_eq!(oxcclTimeout.into_nccl(), oxcclRemoteError);
    for r in 0..oxcclTimeout {
        assert_eq!(r.into_nccl(), r);
    }
}

#[test]
fn error_strings_are_nccl_s() {
    // SAFETY: any value may be passed.
    let string = |r| text(unsafe { ncclGetErrorString(r) });
    let known: Vec<String> = (0..oxcclTimeout).map(string).collect();
    for (r, s) in known.iter().enumerate() {
        assert_ne!(s, "unknown result code", "{r}");
        assert!(!s.contains("oxcclGetLastError"), "{r}: {s}");
        assert_eq!(known.iter().filter(|t| *t == s).count(), 1, "{r}: {s}");
    }
    assert_eq!(known[0], "no error");
    assert_eq!(string(oxcclTimeout), "unknown result code");
    assert_eq!(string(-1), "unknown result code");
    // SAFETY: any value may be passed.
    assert_eq!(text(unsafe { pncclGetErrorString(4) }), known[4]);
}

#[test]
fn both_names_reach_oxccl() {
    let mut comms = [null_mut(); 2];
    // SAFETY: room for 2 handles; devlist may be NULL.
    let result = unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, null()) };
    assert_eq!(result, oxcclSuccess);
    let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
        let ranks: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, &c)| {
                let c = c as usize;
                s.spawn(move || {
                    let send = [r as f32, 10.0 + r as f32];
                    let mut recv = [0.0f32; 2];
                    let all_reduce = if r == 0 {
                        ncclAllReduce
                    } else {
                        pncclAllReduce
                    };
                    // SAFETY: 2 floats in each buffer; the handle is a live communicator.
                    let result = unsafe {
                        all_reduce(
                            send.as_ptr().cast::<c_void>(),
                            recv.as_mut_ptr().cast::<c_void>(),
                            2,
                            oxcclFloat32,
                            oxcclSum,
                            c as oxcclComm_t,
                            null_mut(),
                        )
                    };
                    assert_eq!(result, oxcclSuccess);
                    recv.to_vec()
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    assert_eq!(sums, vec![vec![1.0, 21.0]; 2]);
    let mut n: c_int = 0;
    // SAFETY: a live handle and a writable int.
    assert_eq!(unsafe { pncclCommCount(comms[1], &mut n) }, oxcclSuccess);
    assert_eq!(n, 2);
    for c in comms {
        // SAFETY: live handles, each destroyed once.
        assert_eq!(unsafe { ncclCommDestroy(c) }, oxcclSuccess);
    }
    // SAFETY: a destroyed handle is checked.
    assert_eq!(unsafe { pncclCommDestroy(comms[0]) }, oxcclInvalidArgument);
    // SAFETY: any handle may be passed.
    assert!(text(unsafe { pncclGetLastError(null_mut()) }).contains("not a live communicator"));
}

#[test]
fn functions_after_nccl_2_27_say_they_are_not_implemented() {
    for (f, name) in [
        (
            ncclDevCommDestroy as extern "C" fn() -> oxcclResult_t,
            "ncclDevCommDestroy",
        ),
        (ncclCommGetUniqueId, "ncclCommGetUniqueId"),
        (ncclGroupSimulateEnd, "ncclGroupSimulateEnd"),
        (ncclWinGetUserPtr, "ncclWinGetUserPtr"),
    ] {
        assert_eq!(f(), oxcclInvalidUsage, "{name}");
        // SAFETY: any handle may be passed.
        let last = text(unsafe { ncclGetLastError(null_mut()) });
        assert!(
            last.starts_with(name) && last.contains("not implement"),
            "{name}: {last}"
        );
    }
}
