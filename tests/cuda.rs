//! The CUDA reductions (feature `cuda`).
//!
//! Without a GPU, two things are still proven: every kernel compiles with NVRTC through the
//! library's own code path (to PTX for the H100's `compute_90` and NVRTC's oldest architecture,
//! and a few to CUBINs), and `CudaReducer::new` reports a missing driver as `Unavailable` instead
//! of panicking. When no libnvrtc can be loaded the compile tests print "skipped: no NVRTC library
//! (...)", unless `OXCCL_REQUIRE_NVRTC` is set (CI sets it after installing NVRTC's wheel), which
//! makes that a failure.
//!
//! With a GPU, every data type × operator runs against `reduce::cpu` on fresh random data
//! (special values included) of odd sizes, at element offsets chosen so that the operands'
//! 16-byte vectors line up in some cases and not in others. Outputs are poisoned first and
//! guard zones around every operand are checked afterwards; results must match bit for bit
//! (any NaN matches any NaN). Without a device these tests print "skipped: no CUDA device
//! (...)" and pass, unless `OXCCL_REQUIRE_CUDA` is set (tools/gpu-check sets it). The seed is
//! printed; `OXCCL_TEST_SEED` replays one. With a device, the topology's NVIDIA GPUs must be
//! the ones `nvidia-smi` lists, each with NVML's answer (NVLinks, peer-to-peer reachability).
#![cfg(feature = "cuda")]

use std::time::Instant;

use oxccl::Error;
use oxccl::reduce::cpu;
use oxccl::reduce::cuda::{
    self, CudaReducer, CudaSlice, CudaView, CudaViewMut, GridSize, Kernel, Target,
};
use oxccl::types::{DataType, ReduceOp};

// ---------------------------------------------------------------------------------------------
// Skipping.

/// NVRTC's version, or `None` after printing why the test is skipped.
fn nvrtc_or_skip() -> Option<(i32, i32)> {
    match cuda::nvrtc_version() {
        Ok(v) => Some(v),
        Err(e) => {
            assert!(
                std::env::var_os("OXCCL_REQUIRE_NVRTC").is_none(),
                "OXCCL_REQUIRE_NVRTC is set, but {e}"
            );
            // The message starts "no NVRTC library (...)".
            let why = match e {
                Error::Unavailable(why) => why,
                other => other.to_string(),
            };
            println!("skipped: {why}");
            None
        }
    }
}

/// A reducer on device 0, or `None` after printing why the test is skipped.
fn device_or_skip() -> Option<CudaReducer> {
    match CudaReducer::new(0) {
        Ok(r) => Some(r),
        Err(e) => {
            assert!(
                std::env::var_os("OXCCL_REQUIRE_CUDA").is_none(),
                "OXCCL_REQUIRE_CUDA is set, but {e}"
            );
            let Error::Unavailable(why) = e else {
                panic!("{e}")
            };
            println!("skipped: no CUDA device ({why})");
            None
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Without a device.

/// The body of entry point `entry` in `ptx`: from its `.entry` line to the next one.
fn entry_body<'a>(ptx: &'a str, entry: &str) -> Option<&'a str> {
    let start = ptx.find(&format!(".entry {entry}("))?;
    let rest = &ptx[start + 1..];
    Some(&rest[..rest.find(".entry ").unwrap_or(rest.len())])
}

/// The widths in bytes of the `instr` accesses (`ld.global`, `st.global`) in PTX `body`:
/// `ld.global.v4.f32` is 16, `ld.global.u8` is 1.
fn access_widths(body: &str, instr: &str) -> Vec<usize> {
    body.lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|op| op.starts_with(instr))
        .filter_map(|op| {
            let parts: Vec<&str> = op.split('.').collect();
            let lanes = parts
                .iter()
                .find_map(|p| p.strip_prefix('v').and_then(|n| n.parse::<usize>().ok()))
                .unwrap_or(1);
            let bits = parts.last()?.get(1..)?.parse::<usize>().ok()?;
            Some(lanes * bits / 8)
        })
        .collect()
}

#[test]
fn every_kernel_compiles_to_ptx() {
    let Some((major, minor)) = nvrtc_or_skip() else {
        return;
    };
    let archs = cuda::supported_archs().unwrap();
    let mut targets = vec![90];
    if let Some(&oldest) = archs.first()
        && oldest != 90
    {
        targets.push(oldest);
    }
    let start = Instant::now();
    let mut entries = 0;
    for &arch in &targets {
        let all = cuda::compile_all_ptx(arch).unwrap_or_else(|e| panic!("compute_{arch}: {e}"));
        assert_eq!(all.len(), Kernel::all().len());
        for (kernel, ptx) in &all {
            let case = format!("{kernel} (compute_{arch})");
            assert!(
                ptx.contains(&format!(".target sm_{arch}")),
                "{case}: wrong target"
            );
            // No spills or stack arrays: the unrolled loads stay in registers.
            assert!(!ptx.contains(".local"), "{case}: uses local memory");
            let size = kernel.dtype().size();
            for entry in kernel.entry_points() {
                let body = entry_body(ptx, entry)
                    .unwrap_or_else(|| panic!("{case}: no entry point {entry}"));
                let loads = access_widths(body, "ld.global");
                let stores = access_widths(body, "st.global");
                // The aligned path moves whole 16-byte vectors; the head, the tail and
                // misaligned operands move single elements.
                for (what, widths) in [("load", &loads), ("store", &stores)] {
                    assert!(
                        widths.contains(&16),
                        "{case} {entry}: no 16-byte vector {what} ({widths:?})"
                    );
                    assert!(
                        widths.contains(&size),
                        "{case} {entry}: no {size}-byte element {what} ({widths:?})"
                    );
                    assert!(
                        widths.iter().all(|&w| w == 16 || w == size),
                        "{case} {entry}: a {what} of another width ({widths:?})"
                    );
                }
                entries += 1;
            }
        }
    }
    println!(
        "compiled {} kernels ({entries} entry points) to PTX for compute_{targets:?} with NVRTC \
         {major}.{minor} in {:.1?}: each has 16-byte vector and element loads and stores, no \
         local memory",
        Kernel::all().len(),
        start.elapsed()
    );
}

#[test]
fn kernels_compile_to_cubins_for_the_h100() {
    if nvrtc_or_skip().is_none() {
        return;
    }
    let kernels = [
        Kernel::combine(DataType::F32, ReduceOp::Sum).unwrap(),
        Kernel::combine(DataType::F16, ReduceOp::Max).unwrap(),
        Kernel::combine(DataType::U8, ReduceOp::BXor).unwrap(),
        Kernel::Divide {
            dtype: DataType::BF16,
        },
        Kernel::combine(DataType::F8E4M3, ReduceOp::Sum).unwrap(),
        Kernel::combine(DataType::F8E5M2, ReduceOp::Min).unwrap(),
        Kernel::Divide {
            dtype: DataType::F8E5M2,
        },
    ];
    for kernel in kernels {
        let cubin = cuda::compile_cubin(kernel, 90).unwrap_or_else(|e| panic!("{kernel}: {e}"));
        assert_eq!(&cubin[..4], b"\x7fELF", "{kernel}: not an ELF file");
    }
}

#[test]
fn bitwise_operators_on_floats_have_no_kernel() {
    for dtype in DataType::ALL.into_iter().filter(|d| d.is_float()) {
        for op in [ReduceOp::BAnd, ReduceOp::BOr, ReduceOp::BXor] {
            assert!(matches!(
                Kernel::combine(dtype, op),
                Err(Error::InvalidArgument(_))
            ));
        }
    }
}

#[test]
fn a_missing_driver_is_unavailable_not_a_panic() {
    match cuda::driver_version() {
        Err(e) => {
            assert!(matches!(e, Error::Unavailable(_)), "{e}");
            let r = CudaReducer::new(0);
            assert!(matches!(r, Err(Error::Unavailable(_))), "{r:?}");
            let msg = r.unwrap_err().to_string();
            assert!(msg.contains("no CUDA driver"), "{msg}");
            assert!(matches!(cuda::device_count(), Err(Error::Unavailable(_))));
        }
        Ok(version) => {
            // A driver is here: a device that does not exist is an error, not a panic.
            println!("CUDA driver {version} present");
            let r = CudaReducer::new(usize::MAX);
            assert!(
                matches!(
                    r,
                    Err(Error::InvalidArgument(_)) | Err(Error::Unavailable(_))
                ),
                "{r:?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Random elements.

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A fresh seed per run (or `OXCCL_TEST_SEED`), printed so a failure can be replayed.
fn seed(test: &str) -> Rng {
    let seed = match std::env::var("OXCCL_TEST_SEED") {
        Ok(s) => s.parse().expect("OXCCL_TEST_SEED is a u64"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
    };
    println!("{test}: seed {seed} (replay with OXCCL_TEST_SEED={seed})");
    Rng(seed)
}

/// A float's bits in `dtype` (a float type), from an `f64` (rounded to nearest; the 8-bit
/// types saturate, except that E5M2 keeps its infinities).
fn float_bits(dtype: DataType, x: f64) -> u64 {
    match dtype {
        DataType::F16 => u64::from(half::f16::from_f64(x).to_bits()),
        DataType::BF16 => u64::from(half::bf16::from_f64(x).to_bits()),
        DataType::F32 => u64::from((x as f32).to_bits()),
        DataType::F64 => x.to_bits(),
        DataType::F8E4M3 => u64::from(oxccl::F8E4M3::from_f64(x).to_bits()),
        DataType::F8E5M2 if x.is_infinite() => 0x7c | u64::from(x.is_sign_negative()) << 7,
        DataType::F8E5M2 => u64::from(oxccl::F8E5M2::from_f64(x).to_bits()),
        _ => unreachable!("{dtype} is not a float"),
    }
}

/// The bits of `dtype`'s largest finite value (a float type).
fn max_finite_bits(dtype: DataType) -> u64 {
    match dtype {
        DataType::F8E4M3 => 0x7e,
        DataType::F8E5M2 => 0x7b,
        _ => float_bits(dtype, f64::INFINITY) - 1,
    }
}

/// One random element of `dtype` as bits: often small values (so that sums are exact, equal
/// values and ties occur), sometimes raw random bits (any value: NaNs, infinities, subnormals),
/// sometimes edge cases.
fn element(dtype: DataType, rng: &mut Rng) -> u64 {
    let bits = 8 * dtype.size() as u32;
    let mask = if bits == 64 {
        u64::MAX
    } else {
        (1 << bits) - 1
    };
    let small = rng.below(129) as i64 - 64;
    match (dtype.is_float(), rng.below(16)) {
        (_, 0..=3) => rng.next() & mask,
        (false, 4..=11) => small as u64 & mask,
        (false, _) => {
            let top = 1u64 << (bits - 1);
            [0, mask, top, top - 1, 1, top + 1][rng.below(6) as usize]
        }
        (true, 4..=11) => float_bits(dtype, small as f64 / 8.0),
        (true, _) => {
            let specials = [
                0.0,
                -0.0,
                f64::INFINITY,
                f64::NEG_INFINITY,
                f64::NAN,
                1.0,
                -1.0,
            ];
            let pick = rng.below(specials.len() as u64 + 2) as usize;
            match pick {
                p if p < specials.len() => float_bits(dtype, specials[p]),
                // The smallest subnormal and the largest finite value, negated half the time.
                p => {
                    let neg = rng.below(2) << (bits - 1);
                    let magnitude = if p == specials.len() {
                        1
                    } else {
                        max_finite_bits(dtype)
                    };
                    magnitude | neg
                }
            }
        }
    }
}

/// `n` random elements of `dtype`, as bytes.
fn elements(dtype: DataType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let size = dtype.size();
    let mut out = Vec::with_capacity(n * size);
    for _ in 0..n {
        out.extend_from_slice(&element(dtype, rng).to_le_bytes()[..size]);
    }
    out
}

/// Element `i` of `bytes` as bits.
fn bits_at(dtype: DataType, bytes: &[u8], i: usize) -> u64 {
    let size = dtype.size();
    let mut b = [0u8; 8];
    b[..size].copy_from_slice(&bytes[i * size..(i + 1) * size]);
    u64::from_le_bytes(b)
}

fn is_nan(dtype: DataType, b: u64) -> bool {
    match dtype {
        DataType::F16 => b & 0x7c00 == 0x7c00 && b & 0x03ff != 0,
        DataType::BF16 => b & 0x7f80 == 0x7f80 && b & 0x007f != 0,
        DataType::F8E4M3 => b & 0x7f == 0x7f,
        DataType::F8E5M2 => b & 0x7f > 0x7c,
        DataType::F32 => f32::from_bits(b as u32).is_nan(),
        DataType::F64 => f64::from_bits(b).is_nan(),
        _ => false,
    }
}

/// Panics with the first element where `got` and `want` differ (bits, except NaN vs NaN).
fn assert_same(dtype: DataType, got: &[u8], want: &[u8], case: &str) {
    assert_eq!(got.len(), want.len(), "{case}: lengths");
    for i in 0..want.len() / dtype.size() {
        let (g, w) = (bits_at(dtype, got, i), bits_at(dtype, want, i));
        if g != w && !(is_nan(dtype, g) && is_nan(dtype, w)) {
            panic!(
                "{case}: element {i} of {}: device {g:#x}, CPU {w:#x}",
                want.len() / dtype.size()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Operands on the device, between guard zones.

/// Bytes of poison before and after every operand: more than a vector, so an overrun shows.
const GUARD: usize = 64;
/// What unwritten memory holds.
const POISON: u8 = 0xa5;

/// One operand: `len` bytes at byte `lo` of `buf`, poison everywhere else.
struct Operand {
    buf: CudaSlice<u8>,
    lo: usize,
    len: usize,
}

impl Operand {
    /// `bytes`, placed `offset` elements past a 256-byte-aligned point (cudaMalloc aligns to
    /// 256, and `GUARD` is a multiple of 16).
    fn new(r: &CudaReducer, dtype: DataType, bytes: &[u8], offset: usize) -> Operand {
        let lo = GUARD + offset * dtype.size();
        let mut host = vec![POISON; lo + bytes.len() + GUARD];
        host[lo..lo + bytes.len()].copy_from_slice(bytes);
        Operand {
            buf: r.upload_bytes(&host).unwrap(),
            lo,
            len: bytes.len(),
        }
    }

    /// `len` bytes of poison: an output that the kernel must fill.
    fn poisoned(r: &CudaReducer, dtype: DataType, len: usize, offset: usize) -> Operand {
        Operand::new(r, dtype, &vec![POISON; len], offset)
    }

    fn view(&self) -> CudaView<'_, u8> {
        self.buf.slice(self.lo..self.lo + self.len)
    }

    fn view_mut(&mut self) -> CudaViewMut<'_, u8> {
        self.buf.slice_mut(self.lo..self.lo + self.len)
    }

    /// The operand's bytes, after checking that nothing was written outside them.
    fn read(&self, r: &CudaReducer, case: &str) -> Vec<u8> {
        let mut host = vec![0u8; self.buf.len()];
        r.download(&self.buf, &mut host).unwrap();
        let (before, rest) = host.split_at(self.lo);
        let (inside, after) = rest.split_at(self.len);
        assert!(
            before.iter().all(|&b| b == POISON),
            "{case}: wrote before the operand"
        );
        assert!(
            after.iter().all(|&b| b == POISON),
            "{case}: wrote after the operand"
        );
        inside.to_vec()
    }
}

/// Odd element counts: below one vector, around a few, and large enough for many blocks.
const SIZES: [usize; 8] = [1, 2, 7, 33, 1023, 4099, 65_537, (1 << 20) + 3];

/// Element offsets of (dst, src): vectors aligned together, aligned after a scalar head, and
/// mutually misaligned (the element-by-element path).
const OFFSETS2: [(usize, usize); 4] = [(0, 0), (3, 3), (0, 1), (5, 2)];

/// Element offsets of (out, a, b), likewise.
const OFFSETS3: [(usize, usize, usize); 4] = [(0, 0, 0), (1, 1, 1), (0, 0, 3), (2, 7, 2)];

/// Checks `reduce` and `reduce_into` of `op` on `dtype` for one size and one set of offsets.
fn check_combine(
    r: &CudaReducer,
    rng: &mut Rng,
    dtype: DataType,
    op: ReduceOp,
    n: usize,
    (dst_off, src_off): (usize, usize),
    (out_off, a_off, b_off): (usize, usize, usize),
) {
    let a = elements(dtype, n, rng);
    let b = elements(dtype, n, rng);
    let mut want = a.clone();
    cpu::reduce_bytes(&mut want, &b, dtype, op).unwrap();

    let case = format!("reduce {dtype} {op} n={n} offsets=({dst_off},{src_off})");
    let mut dst = Operand::new(r, dtype, &a, dst_off);
    let src = Operand::new(r, dtype, &b, src_off);
    r.reduce(&mut dst.view_mut(), &src.view(), dtype, op)
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_same(dtype, &dst.read(r, &case), &want, &case);
    assert_eq!(src.read(r, &case), b, "{case}: changed the source");

    let case = format!("reduce_into {dtype} {op} n={n} offsets=({out_off},{a_off},{b_off})");
    let mut out = Operand::poisoned(r, dtype, a.len(), out_off);
    let x = Operand::new(r, dtype, &a, a_off);
    let y = Operand::new(r, dtype, &b, b_off);
    r.reduce_into(&mut out.view_mut(), &x.view(), &y.view(), dtype, op)
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_same(dtype, &out.read(r, &case), &want, &case);
}

/// Checks `divide` of `dtype` by `by` for one size and offset.
fn check_divide(r: &CudaReducer, rng: &mut Rng, dtype: DataType, by: usize, n: usize, off: usize) {
    let a = elements(dtype, n, rng);
    let mut want = a.clone();
    cpu::divide_bytes(&mut want, dtype, by).unwrap();
    let case = format!("divide {dtype} by {by} n={n} offset={off}");
    let mut dst = Operand::new(r, dtype, &a, off);
    r.divide(&mut dst.view_mut(), dtype, by)
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_same(dtype, &dst.read(r, &case), &want, &case);
}

// ---------------------------------------------------------------------------------------------
// With a device.

#[test]
fn every_dtype_and_op_matches_the_cpu() {
    let Some(r) = device_or_skip() else { return };
    let mut rng = seed("every_dtype_and_op_matches_the_cpu");
    let start = Instant::now();
    let mut cases = 0;
    for dtype in DataType::ALL {
        for op in ReduceOp::ALL.into_iter().filter(|op| op.supports(dtype)) {
            for n in SIZES {
                for (o2, o3) in OFFSETS2.into_iter().zip(OFFSETS3) {
                    check_combine(&r, &mut rng, dtype, op, n, o2, o3);
                    cases += 2;
                }
            }
        }
    }
    println!(
        "{cases} cases on {} ({}) in {:.1?}",
        r.name().unwrap(),
        r.target(),
        start.elapsed()
    );
}

#[test]
fn division_matches_the_cpu() {
    let Some(r) = device_or_skip() else { return };
    let mut rng = seed("division_matches_the_cpu");
    let divisors = [1, 2, 3, 7, 8, 255, 1000, 16_777_215, 1 << 40, usize::MAX];
    for dtype in DataType::ALL {
        for by in divisors {
            for (n, off) in SIZES.into_iter().zip([0, 1, 3, 0, 1, 2, 5, 1]) {
                check_divide(&r, &mut rng, dtype, by, n, off);
            }
        }
    }
}

#[test]
fn avg_is_a_sum_then_one_division() {
    let Some(r) = device_or_skip() else { return };
    let mut rng = seed("avg_is_a_sum_then_one_division");
    let (n, ranks) = (10_001, 5);
    for dtype in DataType::ALL {
        let inputs: Vec<Vec<u8>> = (0..ranks).map(|_| elements(dtype, n, &mut rng)).collect();
        let mut want = inputs[0].clone();
        for x in &inputs[1..] {
            cpu::reduce_bytes(&mut want, x, dtype, ReduceOp::Avg).unwrap();
        }
        cpu::divide_bytes(&mut want, dtype, ranks).unwrap();

        let mut acc = r.upload_bytes(&inputs[0]).unwrap();
        for x in &inputs[1..] {
            let x = r.upload_bytes(x).unwrap();
            r.reduce(&mut acc, &x, dtype, ReduceOp::Avg).unwrap();
        }
        r.divide(&mut acc, dtype, ranks).unwrap();
        let mut got = vec![0u8; want.len()];
        r.download(&acc, &mut got).unwrap();
        assert_same(dtype, &got, &want, &format!("avg {dtype} over {ranks}"));
    }
}

#[test]
fn every_grid_size_gives_the_same_result() {
    let Some(mut r) = device_or_skip() else {
        return;
    };
    let mut rng = seed("every_grid_size_gives_the_same_result");
    let n = (1 << 22) + 5;
    let grids = [
        GridSize::Resident,
        GridSize::PerSm(1),
        GridSize::PerSm(3),
        GridSize::Unbounded,
    ];
    for grid in grids {
        r.set_grid(grid);
        for (dtype, op) in [
            (DataType::F32, ReduceOp::Sum),
            (DataType::U8, ReduceOp::BXor),
            (DataType::BF16, ReduceOp::Prod),
        ] {
            check_combine(&r, &mut rng, dtype, op, n, (1, 1), (2, 2, 2));
            check_combine(&r, &mut rng, dtype, op, n, (0, 1), (0, 3, 0));
        }
        check_divide(&r, &mut rng, DataType::F16, 7, n, 3);
    }
}

#[test]
fn ptx_compiled_by_the_driver_gives_the_same_result() {
    let Some(mut r) = device_or_skip() else {
        return;
    };
    let mut rng = seed("ptx_compiled_by_the_driver_gives_the_same_result");
    let (major, minor) = r.compute_capability();
    let arch = major * 10 + minor;
    let Some(ptx_arch) = cuda::supported_archs()
        .unwrap()
        .into_iter()
        .filter(|&a| a <= arch)
        .max()
    else {
        panic!("NVRTC supports no architecture at or below {arch}");
    };
    r.set_target(Target::Ptx(ptx_arch));
    for (dtype, op) in [
        (DataType::F16, ReduceOp::Sum),
        (DataType::I8, ReduceOp::Prod),
        (DataType::F64, ReduceOp::Max),
        (DataType::BF16, ReduceOp::Min),
    ] {
        check_combine(&r, &mut rng, dtype, op, 4099, (3, 3), (0, 0, 1));
        check_divide(&r, &mut rng, dtype, 3, 4099, 1);
    }
}

#[test]
fn bad_operands_are_invalid_arguments() {
    let Some(r) = device_or_skip() else { return };
    let invalid = |res: oxccl::Result<()>, what: &str| {
        assert!(
            matches!(res, Err(Error::InvalidArgument(_))),
            "{what}: {res:?}"
        );
    };
    let mut a = r.alloc(64).unwrap();
    let b = r.alloc(64).unwrap();
    let c = r.alloc(60).unwrap();
    invalid(
        r.reduce(&mut a, &c, DataType::F32, ReduceOp::Sum),
        "lengths differ",
    );
    invalid(
        r.reduce(&mut a, &b, DataType::F32, ReduceOp::BXor),
        "bitwise on floats",
    );
    invalid(
        r.reduce(
            &mut a.slice_mut(0..63),
            &b.slice(0..63),
            DataType::F32,
            ReduceOp::Sum,
        ),
        "not whole elements",
    );
    invalid(
        r.reduce(
            &mut a.slice_mut(1..61),
            &b.slice(1..61),
            DataType::F32,
            ReduceOp::Sum,
        ),
        "misaligned",
    );
    invalid(r.divide(&mut a, DataType::I32, 0), "divide by zero");
    let mut host = vec![0u8; 10];
    invalid(r.download(&a, &mut host), "download length");
    // Empty operands are fine.
    r.reduce(
        &mut a.slice_mut(0..0),
        &b.slice(0..0),
        DataType::F64,
        ReduceOp::Prod,
    )
    .unwrap();
    r.synchronize().unwrap();
}

// ---------------------------------------------------------------------------------------------
// The topology's GPUs, against nvidia-smi.

/// With a device, discovery finds this host's NVIDIA GPUs on the PCI bus and NVML answers for
/// each (its peer-to-peer list is known, its NVLinks listed): checked against `nvidia-smi`'s
/// bus ids, and printed beside `nvidia-smi topo -m` for a person to compare the links.
#[test]
fn the_topology_sees_every_gpu_and_nvml_answers_for_it() {
    if device_or_skip().is_none() {
        return;
    }
    let comms = oxccl::Communicator::init_local(1, oxccl::Config::default()).unwrap();
    let t = comms[0].topology();
    println!("{t}");
    let smi = |args: &[&str]| {
        std::process::Command::new("nvidia-smi")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let Some(buses) = smi(&["--query-gpu=pci.bus_id", "--format=csv,noheader"]) else {
        assert!(
            std::env::var_os("OXCCL_REQUIRE_CUDA").is_none(),
            "OXCCL_REQUIRE_CUDA is set, but nvidia-smi does not answer"
        );
        println!("skipped: no nvidia-smi to compare with");
        return;
    };
    if let Some(m) = smi(&["topo", "-m"]) {
        println!("nvidia-smi topo -m:\n{m}");
    }
    // nvidia-smi writes `00000000:18:00.0`; sysfs (and the topology) `0000:18:00.0`.
    let mut want: Vec<String> = buses
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let l = l.trim().to_ascii_lowercase();
            match l.split_once(':') {
                Some((domain, rest)) if domain.len() > 4 => {
                    format!("{}:{rest}", &domain[domain.len() - 4..])
                }
                _ => l,
            }
        })
        .collect();
    want.sort();
    let gpus = &t.machines[0].gpus;
    let mut got: Vec<String> = gpus
        .iter()
        .filter(|g| g.vendor == "0x10de")
        .map(|g| g.pci.clone())
        .collect();
    got.sort();
    assert_eq!(got, want, "the topology's NVIDIA GPUs against nvidia-smi's");
    for g in gpus.iter().filter(|g| g.vendor == "0x10de") {
        assert!(g.p2p.is_some(), "NVML did not answer for {}: {t}", g.pci);
    }
}
