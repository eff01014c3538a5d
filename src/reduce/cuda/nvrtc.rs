//! The kernels' CUDA C source and its compilation by NVRTC. Needs libnvrtc only: no driver, no
//! device. This is what CI runs to prove that every kernel compiles.
//!
//! One NVRTC program is compiled per [`Kernel`] (an element type and an operator, or an element
//! type's division), by defining macros in front of the one templated source
//! `kernels/reduce.cu`. Results are cached for the life of the process per
//! ([`Target`], [`Kernel`]), so every device of one architecture shares one compilation.

use std::collections::HashMap;
use std::ffi::{CString, c_char};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::{result, sys};

use crate::error::{Error, Result};
use crate::types::{DataType, ReduceOp};

/// The CUDA C source of every kernel (`kernels/reduce.cu`), embedded at build time.
pub const SOURCE: &str = include_str!("../../../kernels/reduce.cu");

/// Threads per block: the kernels' launch bounds, and what every launch uses.
pub(super) const THREADS: u32 = 256;

/// 16-byte vectors per operand that each thread loads before it uses the first.
pub(super) const UNROLL: u32 = 4;

/// The operators that have kernels of their own (`Avg` combines with `Sum`'s).
const COMBINERS: [ReduceOp; 7] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::BAnd,
    ReduceOp::BOr,
    ReduceOp::BXor,
];

/// One NVRTC compilation of `kernels/reduce.cu`: the kernels of one element type and operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kernel {
    /// `oxccl_reduce` (`dst = dst ⊕ src`) and `oxccl_reduce_into` (`out = a ⊕ b`). `op` is never
    /// `Avg`, which combines with `Sum`'s kernels ([`Kernel::combine`] maps it).
    Combine {
        /// The element type.
        dtype: DataType,
        /// The operator.
        op: ReduceOp,
    },
    /// `oxccl_divide` (`dst = dst / by`): the final step of `avg`.
    Divide {
        /// The element type.
        dtype: DataType,
    },
}

impl Kernel {
    /// The kernels that combine `op` on `dtype` (`Sum`'s for `Avg`).
    ///
    /// Fails with [`Error::InvalidArgument`] when `op` is not defined on `dtype`.
    pub fn combine(dtype: DataType, op: ReduceOp) -> Result<Kernel> {
        if !op.supports(dtype) {
            return Err(Error::InvalidArgument(format!(
                "reduce: operator {op} is not defined on {dtype}"
            )));
        }
        Ok(Kernel::Combine {
            dtype,
            op: op.combiner(),
        })
    }

    /// Every kernel: each data type with each operator defined on it, and each data type's
    /// division (78 in all).
    pub fn all() -> Vec<Kernel> {
        let mut all = Vec::new();
        for dtype in DataType::ALL {
            for op in COMBINERS.into_iter().filter(|op| op.supports(dtype)) {
                all.push(Kernel::Combine { dtype, op });
            }
            all.push(Kernel::Divide { dtype });
        }
        all
    }

    /// The element type.
    pub fn dtype(self) -> DataType {
        match self {
            Kernel::Combine { dtype, .. } | Kernel::Divide { dtype } => dtype,
        }
    }

    /// The `extern "C"` entry points the compiled program holds.
    pub fn entry_points(self) -> &'static [&'static str] {
        match self {
            Kernel::Combine { .. } => &[REDUCE, REDUCE_INTO, REDUCE_MULTI],
            Kernel::Divide { .. } => &[DIVIDE],
        }
    }

    /// The macros that select this kernel in the source.
    fn defines(self) -> Vec<String> {
        let mut d = vec![
            format!("-DOXCCL_ELEM={}", elem_name(self.dtype())),
            format!("-DOXCCL_THREADS={THREADS}"),
            format!("-DOXCCL_UNROLL={UNROLL}"),
        ];
        d.push(match self {
            Kernel::Combine { op, .. } => format!("-DOXCCL_OP={}", op_name(op)),
            Kernel::Divide { .. } => "-DOXCCL_DIVIDE".to_owned(),
        });
        d
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kernel::Combine { dtype, op } => write!(f, "{dtype} {op}"),
            Kernel::Divide { dtype } => write!(f, "{dtype} divide"),
        }
    }
}

/// Entry point: `dst = dst ⊕ src`.
pub(super) const REDUCE: &str = "oxccl_reduce";
/// Entry point: `out = a ⊕ b`.
pub(super) const REDUCE_INTO: &str = "oxccl_reduce_into";
/// Entry point: `dst = dst / by`.
pub(super) const DIVIDE: &str = "oxccl_divide";
/// Entry point: every output `= in_0 ⊕ ... ⊕ in_k` (then `/ by` when `by` is not zero).
pub(super) const REDUCE_MULTI: &str = "oxccl_reduce_multi";
/// The most inputs, and the most outputs, one `oxccl_reduce_multi` launch takes
/// (`OXCCL_MULTI` in the source).
pub const MULTI_MAX: usize = 8;

/// The element type's name in `kernels/reduce.cu`.
fn elem_name(dtype: DataType) -> &'static str {
    match dtype {
        DataType::I8 => "I8",
        DataType::U8 => "U8",
        DataType::I32 => "I32",
        DataType::U32 => "U32",
        DataType::I64 => "I64",
        DataType::U64 => "U64",
        DataType::F16 => "F16",
        DataType::BF16 => "BF16",
        DataType::F32 => "F32",
        DataType::F64 => "F64",
        DataType::F8E4M3 => "F8E4M3",
        DataType::F8E5M2 => "F8E5M2",
    }
}

/// The operator's name in `kernels/reduce.cu`.
fn op_name(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => "Sum",
        ReduceOp::Prod => "Prod",
        ReduceOp::Max => "Max",
        ReduceOp::Min => "Min",
        ReduceOp::BAnd => "BAnd",
        ReduceOp::BOr => "BOr",
        ReduceOp::BXor => "BXor",
    }
}

/// What NVRTC produces, for which architecture. The number is `10 × major + minor` of a compute
/// capability: 90 for the H100.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// PTX for the virtual architecture `compute_N`; the driver compiles it when loading.
    Ptx(u32),
    /// Machine code (a CUBIN) for `sm_N`: loads without the driver's compiler, and does not
    /// need a driver as new as NVRTC.
    Cubin(u32),
}

impl Target {
    fn arch_option(self) -> String {
        match self {
            Target::Ptx(n) => format!("--gpu-architecture=compute_{n}"),
            Target::Cubin(n) => format!("--gpu-architecture=sm_{n}"),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Ptx(n) => write!(f, "compute_{n} (PTX)"),
            Target::Cubin(n) => write!(f, "sm_{n} (CUBIN)"),
        }
    }
}

/// A compiled program, as the driver loads it.
#[derive(Debug)]
pub(super) enum Image {
    /// PTX text.
    Ptx(String),
    /// A CUBIN.
    Cubin(Vec<u8>),
}

/// Whether libnvrtc could be loaded, and its version: probed once per process.
fn probe() -> &'static std::result::Result<(i32, i32), String> {
    static NVRTC: OnceLock<std::result::Result<(i32, i32), String>> = OnceLock::new();
    NVRTC.get_or_init(|| {
        // SAFETY: loading libnvrtc runs its initialisers, which are sound to run at any time;
        // nothing else happens.
        if !unsafe { sys::is_culib_present() } {
            return Err(
                "no NVRTC library (libnvrtc.so.13 or .so.12 is not on the library \
                        path; set LD_LIBRARY_PATH)"
                    .to_owned(),
            );
        }
        let (mut major, mut minor) = (0, 0);
        // SAFETY: the library is present (checked above), and both pointers are valid for writes.
        unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map_err(|e| format!("NVRTC does not answer nvrtcVersion: {e:?}"))?;
        Ok((major, minor))
    })
}

/// The version `(major, minor)` of the NVRTC library this process loads.
///
/// Fails with [`Error::Unavailable`] when no libnvrtc can be loaded (it is found through the
/// dynamic loader's search path, `LD_LIBRARY_PATH` included).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    probe().clone().map_err(Error::Unavailable)
}

/// The architectures (`10 × major + minor`) this NVRTC can compile for, ascending.
///
/// Fails with [`Error::Unavailable`] when no libnvrtc can be loaded.
pub fn supported_archs() -> Result<Vec<u32>> {
    nvrtc_version()?;
    let mut n = 0;
    // SAFETY: libnvrtc is loaded (checked above); the pointer is valid for a write.
    unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) }
        .result()
        .map_err(|e| nvrtc_error("nvrtcGetNumSupportedArchs", e))?;
    let mut archs = vec![0; usize::try_from(n).unwrap_or(0)];
    // SAFETY: `archs` has room for the `n` entries NVRTC writes.
    unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
        .result()
        .map_err(|e| nvrtc_error("nvrtcGetSupportedArchs", e))?;
    let mut archs: Vec<u32> = archs
        .into_iter()
        .filter_map(|a| u32::try_from(a).ok())
        .collect();
    archs.sort_unstable();
    Ok(archs)
}

fn nvrtc_error(what: &str, e: result::NvrtcError) -> Error {
    Error::Unavailable(format!("NVRTC: {what} failed: {:?}", e.0))
}

/// Compiles `kernel` to PTX for `compute_{arch}` (`arch` = 90 for the H100), exactly as a
/// device would have it compiled (same source, same options), and returns the PTX text.
///
/// Fails with [`Error::Unavailable`] when no libnvrtc can be loaded or NVRTC rejects the
/// program (the message holds NVRTC's log).
pub fn compile_ptx(kernel: Kernel, arch: u32) -> Result<String> {
    match compile(kernel, Target::Ptx(arch))? {
        Image::Ptx(ptx) => Ok(ptx),
        Image::Cubin(_) => unreachable!("a PTX target yields PTX"),
    }
}

/// Compiles `kernel` to machine code (a CUBIN, an ELF file) for `sm_{arch}`, as
/// [`crate::reduce::cuda::CudaReducer`] does for a device of that architecture.
///
/// Fails as [`compile_ptx`] does.
pub fn compile_cubin(kernel: Kernel, arch: u32) -> Result<Vec<u8>> {
    match compile(kernel, Target::Cubin(arch))? {
        Image::Cubin(cubin) => Ok(cubin),
        Image::Ptx(_) => unreachable!("a CUBIN target yields a CUBIN"),
    }
}

/// [`compile_ptx`] for every kernel of [`Kernel::all`], on all cores, in that order.
///
/// Fails on the first kernel NVRTC rejects.
pub fn compile_all_ptx(arch: u32) -> Result<Vec<(Kernel, String)>> {
    nvrtc_version()?;
    let kernels = Kernel::all();
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(kernels.len());
    let chunk = kernels.len().div_ceil(workers);
    let compiled: Vec<Result<Vec<(Kernel, String)>>> = std::thread::scope(|s| {
        let handles: Vec<_> = kernels
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|&k| compile_ptx(k, arch).map(|ptx| (k, ptx)))
                        .collect::<Result<Vec<_>>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::Unavailable("an NVRTC compilation panicked".into()))
                })
            })
            .collect()
    });
    let mut all = Vec::with_capacity(kernels.len());
    for part in compiled {
        all.extend(part?);
    }
    Ok(all)
}

/// `kernel` compiled for `target`, from the process-wide cache or compiled now.
pub(super) fn cached(kernel: Kernel, target: Target) -> Result<Arc<Image>> {
    type Cache = Mutex<HashMap<(Target, Kernel), Arc<Image>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Cache::default);
    let key = (target, kernel);
    if let Some(image) = lock(cache).get(&key) {
        return Ok(image.clone());
    }
    // Compiled outside the lock, so other kernels compile meanwhile; two threads that want the
    // same one may both compile it, and the first to finish wins.
    let image = Arc::new(compile(kernel, target)?);
    Ok(lock(cache).entry(key).or_insert(image).clone())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave a map half-written in a way that matters here.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An NVRTC program, destroyed on drop.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed only here. A
        // failure to destroy leaks it, which is all that can be done.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

impl Program {
    /// NVRTC's log for the last compilation (warnings, errors), trimmed.
    fn log(&self) -> String {
        // SAFETY: the program is live (owned by self).
        match unsafe { result::get_program_log(self.0) } {
            Ok(log) => c_chars_to_string(&log).trim().to_owned(),
            Err(e) => format!("(no log: {:?})", e.0),
        }
    }
}

/// NUL-terminated C characters as a `String` (lossily, up to the first NUL).
fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The options every compilation uses: no contraction into fused multiply-adds, no flushing of
/// subnormals, IEEE division — so the arithmetic matches the CPU's bit for bit.
fn options(kernel: Kernel, target: Target) -> Vec<String> {
    let mut o = vec![
        target.arch_option(),
        "--fmad=false".to_owned(),
        "--ftz=false".to_owned(),
        "--prec-div=true".to_owned(),
        "--prec-sqrt=true".to_owned(),
        "--std=c++17".to_owned(),
    ];
    o.extend(kernel.defines());
    o
}

/// Compiles `kernel` for `target` (no cache).
fn compile(kernel: Kernel, target: Target) -> Result<Image> {
    nvrtc_version()?;
    let source = CString::new(SOURCE)
        .map_err(|_| Error::InvalidArgument("kernels/reduce.cu contains a NUL byte".into()))?;
    let prog = Program(
        result::create_program(&source, Some(c"reduce.cu"))
            .map_err(|e| nvrtc_error("nvrtcCreateProgram", e))?,
    );
    let opts = options(kernel, target);
    // SAFETY: the program is live; the options are plain strings without NUL bytes.
    if let Err(e) = unsafe { result::compile_program(prog.0, &opts) } {
        return Err(Error::Unavailable(format!(
            "NVRTC could not compile the {kernel} kernels for {target} ({:?}; options {}):\n{}",
            e.0,
            opts.join(" "),
            prog.log()
        )));
    }
    match target {
        Target::Ptx(_) => {
            // SAFETY: the program is live and compiled.
            let ptx =
                unsafe { result::get_ptx(prog.0) }.map_err(|e| nvrtc_error("nvrtcGetPTX", e))?;
            Ok(Image::Ptx(c_chars_to_string(&ptx)))
        }
        Target::Cubin(_) => {
            let mut size = 0usize;
            // SAFETY: the program is live and compiled; the pointer is valid for a write.
            unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) }
                .result()
                .map_err(|e| nvrtc_error("nvrtcGetCUBINSize", e))?;
            let mut cubin = vec![0u8; size];
            // SAFETY: `cubin` has room for the `size` bytes NVRTC writes.
            unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) }
                .result()
                .map_err(|e| nvrtc_error("nvrtcGetCUBIN", e))?;
            Ok(Image::Cubin(cubin))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_pair_has_one_kernel() {
        let all = Kernel::all();
        assert_eq!(all.len(), 6 * (7 + 1) + 6 * (4 + 1));
        for dtype in DataType::ALL {
            for op in ReduceOp::ALL {
                match Kernel::combine(dtype, op) {
                    Ok(k) => assert!(all.contains(&k), "{k} missing"),
                    Err(_) => assert!(!op.supports(dtype)),
                }
            }
            assert!(all.contains(&Kernel::Divide { dtype }));
        }
        assert_eq!(
            Kernel::combine(DataType::F16, ReduceOp::Avg).unwrap(),
            Kernel::Combine {
                dtype: DataType::F16,
                op: ReduceOp::Sum
            }
        );
    }

    #[test]
    fn options_select_the_kernel() {
        let k = Kernel::combine(DataType::BF16, ReduceOp::Max).unwrap();
        let o = options(k, Target::Cubin(90));
        assert!(o.contains(&"--gpu-architecture=sm_90".to_owned()));
        assert!(o.contains(&"-DOXCCL_ELEM=BF16".to_owned()));
        assert!(o.contains(&"-DOXCCL_OP=Max".to_owned()));
        assert!(o.contains(&"--fmad=false".to_owned()));
        let d = options(
            Kernel::Divide {
                dtype: DataType::U8,
            },
            Target::Ptx(75),
        );
        assert!(d.contains(&"-DOXCCL_DIVIDE".to_owned()));
        assert!(d.contains(&"--gpu-architecture=compute_75".to_owned()));
    }

    #[test]
    fn source_names_every_entry_point_and_macro() {
        for name in [REDUCE, REDUCE_INTO, DIVIDE, REDUCE_MULTI] {
            assert!(SOURCE.contains(name), "{name}");
        }
        assert!(SOURCE.contains(&format!("#define OXCCL_MULTI {MULTI_MAX}\n")));
        for dtype in DataType::ALL {
            let name = elem_name(dtype);
            assert!(
                SOURCE.contains(&format!("OXCCL_INT_ELEM({name},"))
                    || SOURCE.contains(&format!("struct {name} : FloatElem")),
                "{name}"
            );
        }
        assert!(
            !SOURCE
                .lines()
                .any(|l| l.trim_start().starts_with("#include")),
            "the kernels must build without toolkit headers"
        );
    }
}
