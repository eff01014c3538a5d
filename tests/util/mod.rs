//! Shared test helpers: deterministic inputs whose reductions are exact in every type, an
//! independent reference for every collective (computed in i128 / f64 and rounded once), and
//! a runner that simulates a plan on n ranks and checks every rank's result.
#![allow(dead_code)]

pub mod procs;

use oxccl::algo::sim::{self, RankBuffers, SimConfig, SimReport};
use oxccl::algo::{self, Buffer, Choice, Collective, Plan};
use oxccl::reduce::Cpu;
use oxccl::types::{DataType, ReduceOp};

/// An element value independent of its storage type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum V {
    I(i128),
    F(f64),
}

/// splitmix64: a tiny deterministic generator.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn signed(d: DataType) -> bool {
    matches!(d, DataType::I8 | DataType::I32 | DataType::I64)
}

/// Wraps an integer to `d`'s range (two's complement).
pub fn wrap(d: DataType, x: i128) -> i128 {
    let bits = d.size() as u32 * 8;
    let m = x & ((1i128 << bits) - 1);
    if signed(d) && m >= 1i128 << (bits - 1) {
        m - (1i128 << bits)
    } else {
        m
    }
}

/// Rounds an f64 to `d` once (correctly rounded) and back. The 8-bit floats saturate, as the
/// library's conversions do: past the largest finite value, infinity included, is that value.
pub fn round(d: DataType, x: f64) -> f64 {
    match d {
        DataType::F16 => half::f16::from_f64(x).to_f64(),
        DataType::BF16 => half::bf16::from_f64(x).to_f64(),
        DataType::F32 => x as f32 as f64,
        DataType::F64 => x,
        DataType::F8E4M3 | DataType::F8E5M2 => fp8_round(Fp8::of(d), x),
        _ => unreachable!("not a float"),
    }
}

/// An 8-bit float format, by its definition (OCP FP8): mantissa bits, exponent bias, whether
/// the top exponent holds infinities and NaNs (E5M2, IEEE-like) or only the NaN `S.1111.111`
/// (E4M3), and the largest finite value.
#[derive(Clone, Copy)]
pub struct Fp8 {
    pub mantissa_bits: u32,
    pub bias: i32,
    pub ieee: bool,
    pub max: f64,
}

impl Fp8 {
    pub const E4M3: Fp8 = Fp8 {
        mantissa_bits: 3,
        bias: 7,
        ieee: false,
        max: 448.0,
    };
    pub const E5M2: Fp8 = Fp8 {
        mantissa_bits: 2,
        bias: 15,
        ieee: true,
        max: 57344.0,
    };

    pub fn of(d: DataType) -> Fp8 {
        match d {
            DataType::F8E4M3 => Fp8::E4M3,
            DataType::F8E5M2 => Fp8::E5M2,
            _ => unreachable!("{d} is not an 8-bit float"),
        }
    }

    /// Exponent of the smallest normal number.
    fn emin(self) -> i32 {
        1 - self.bias
    }
}

/// `2^k`, exactly (`k` in f64's normal range).
fn pow2(k: i32) -> f64 {
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// The value of 8-bit float bits `b` (a table of [`fp8_definition`], built once per format).
pub fn fp8_value(f: Fp8, b: u8) -> f64 {
    static TABLES: std::sync::OnceLock<[[f64; 256]; 2]> = std::sync::OnceLock::new();
    let tables = TABLES.get_or_init(|| {
        [Fp8::E4M3, Fp8::E5M2].map(|f| std::array::from_fn(|b| fp8_definition(f, b as u8)))
    });
    tables[usize::from(f.ieee)][usize::from(b)]
}

/// The value of 8-bit float bits `b`, from the format's definition.
pub fn fp8_definition(f: Fp8, b: u8) -> f64 {
    let m = f.mantissa_bits;
    let exp_mask: i32 = 0x7f >> m;
    let e = i32::from(b & 0x7f) >> m;
    let frac = f64::from(b & ((1 << m) - 1));
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let top = e == exp_mask;
    let magnitude = if top && f.ieee {
        if frac == 0.0 { f64::INFINITY } else { f64::NAN }
    } else if top && frac == f64::from((1u8 << m) - 1) {
        f64::NAN
    } else if e == 0 {
        frac * pow2(f.emin() - m as i32)
    } else {
        (1.0 + frac / f64::from(1u32 << m)) * pow2(e - f.bias)
    };
    sign * magnitude
}

/// `x` rounded to nearest (ties to even) in the format, saturating: the quantum at `x`'s
/// binade (or the subnormal quantum) divides `x` exactly in f64, and `round_ties_even` rounds.
pub fn fp8_round(f: Fp8, x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    let a = x.abs();
    if a >= f.max {
        return f.max.copysign(x);
    }
    if a == 0.0 {
        return x;
    }
    let e = if a.is_normal() {
        (((a.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(f.emin())
    } else {
        f.emin()
    };
    let quantum = pow2(e - f.mantissa_bits as i32);
    ((a / quantum).round_ties_even() * quantum)
        .min(f.max)
        .copysign(x)
}

/// The bits of `x` in the format after [`fp8_round`] (any NaN becomes `0x7f`).
pub fn fp8_bits(f: Fp8, x: f64) -> u8 {
    let r = fp8_round(f, x);
    if r.is_nan() {
        return 0x7f;
    }
    let sign = if r.is_sign_negative() { 0x80 } else { 0 };
    let a = r.abs();
    let m = f.mantissa_bits as i32;
    let magnitude = if a == 0.0 {
        0
    } else {
        let e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        if e < f.emin() {
            (a / pow2(f.emin() - m)) as u8
        } else {
            let frac = a / pow2(e - m) - f64::from(1u32 << m);
            (((e + f.bias) << m) as u8) | frac as u8
        }
    };
    let b = magnitude | sign;
    debug_assert_eq!(fp8_value(f, b), r);
    b
}

/// Values stored as bytes of `d`.
pub fn encode(d: DataType, vals: &[V]) -> Vec<u8> {
    let mut out = Vec::with_capacity(vals.len() * d.size());
    for &v in vals {
        encode_into(d, v, &mut out);
    }
    out
}

/// Appends one value as bytes of `d`.
pub fn encode_into(d: DataType, v: V, out: &mut Vec<u8>) {
    {
        match (d, v) {
            (DataType::I8 | DataType::U8, V::I(x)) => out.push(x as u8),
            (DataType::I32 | DataType::U32, V::I(x)) => out.extend((x as u32).to_le_bytes()),
            (DataType::I64 | DataType::U64, V::I(x)) => out.extend((x as u64).to_le_bytes()),
            (DataType::F16, V::F(x)) => out.extend(half::f16::from_f64(x).to_le_bytes()),
            (DataType::BF16, V::F(x)) => out.extend(half::bf16::from_f64(x).to_le_bytes()),
            (DataType::F32, V::F(x)) => out.extend((x as f32).to_le_bytes()),
            (DataType::F64, V::F(x)) => out.extend(x.to_le_bytes()),
            (DataType::F8E4M3 | DataType::F8E5M2, V::F(x)) => out.push(fp8_bits(Fp8::of(d), x)),
            _ => panic!("value {v:?} does not fit {d}"),
        }
    }
}

/// Bytes of `d` as values.
pub fn decode(d: DataType, bytes: &[u8]) -> Vec<V> {
    (0..bytes.len() / d.size())
        .map(|i| value(d, bytes, i))
        .collect()
}

/// Rank `rank`'s `len` input values for reductions with `op`, chosen so that every reduction
/// order gives the same bits: full-range integers (wrapping is associative); for floats, small
/// integers for sum/avg, ±1 (and 2 on the first 8 ranks) for prod, anything — NaN, ±inf, ±0
/// included — for min/max. The 8-bit floats hold every integer only up to 16 (E4M3) or 8
/// (E5M2), so for sum/avg at most 5 ranks contribute to each element (rank `r` to the elements
/// `i` with `(r + i) % 8 == 0`, among ranks below 40), with values that keep every partial sum
/// exact; their infinities saturate to the largest finite value, as the library's conversions
/// do.
pub fn inputs(d: DataType, op: ReduceOp, rank: usize, len: usize, rng: &mut Rng) -> Vec<V> {
    (0..len).map(|i| input(d, op, rank, i, rng)).collect()
}

/// Input value `index` of rank `rank` (see [`inputs`]).
pub fn input(d: DataType, op: ReduceOp, rank: usize, index: usize, rng: &mut Rng) -> V {
    if !d.is_float() {
        let raw = rng.next() as i128 | ((rng.next() as i128) << 64);
        return V::I(wrap(d, raw));
    }
    let fp8 = matches!(d, DataType::F8E4M3 | DataType::F8E5M2);
    V::F(match op {
        ReduceOp::Sum | ReduceOp::Avg if fp8 => {
            if rank >= 40 || !(rank + index).is_multiple_of(8) {
                0.0
            } else if d == DataType::F8E4M3 {
                // -1.5..=1.5 in halves: five of them sum to at most 7.5, four significant bits.
                rng.below(7) as f64 * 0.5 - 1.5
            } else {
                // -1..=1: five of them sum to at most 5, three significant bits.
                rng.below(3) as f64 - 1.0
            }
        }
        _ if fp8 && !matches!(op, ReduceOp::Prod) => {
            // Min/max: as for the other floats, rounded (and saturated) to the type.
            let V::F(x) = input(DataType::F64, op, rank, index, rng) else {
                unreachable!()
            };
            round(d, x)
        }
        ReduceOp::Sum | ReduceOp::Avg => rng.below(17) as f64 - 8.0,
        ReduceOp::Prod => {
            let sign = if rng.below(2) == 0 { -1.0 } else { 1.0 };
            if rank < 8 && rng.below(3) == 0 {
                2.0 * sign
            } else {
                sign
            }
        }
        _ => match rng.below(20) {
            0 => f64::NAN,
            1 => f64::INFINITY,
            2 => f64::NEG_INFINITY,
            3 => 0.0,
            4 => -0.0,
            _ => round(
                d,
                (rng.next() as i64 as f64) / 2f64.powi(rng.below(80) as i32),
            ),
        },
    })
}

/// [`inputs`], encoded straight into bytes of `d` (no per-element allocation).
pub fn input_bytes(d: DataType, op: ReduceOp, rank: usize, len: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(len * d.size());
    for i in 0..len {
        encode_into(d, input(d, op, rank, i, rng), &mut out);
    }
    out
}

/// Element `i` of `bytes` holding elements of `d`.
pub fn value(d: DataType, bytes: &[u8], i: usize) -> V {
    let s = d.size();
    let c = &bytes[i * s..(i + 1) * s];
    let b8 = |c: &[u8]| -> [u8; 8] { c.try_into().expect("8 bytes") };
    let b4 = |c: &[u8]| -> [u8; 4] { c.try_into().expect("4 bytes") };
    let b2 = |c: &[u8]| -> [u8; 2] { c.try_into().expect("2 bytes") };
    match d {
        DataType::I8 => V::I(c[0] as i8 as i128),
        DataType::U8 => V::I(c[0] as i128),
        DataType::I32 => V::I(i32::from_le_bytes(b4(c)) as i128),
        DataType::U32 => V::I(u32::from_le_bytes(b4(c)) as i128),
        DataType::I64 => V::I(i64::from_le_bytes(b8(c)) as i128),
        DataType::U64 => V::I(u64::from_le_bytes(b8(c)) as i128),
        DataType::F16 => V::F(half::f16::from_le_bytes(b2(c)).to_f64()),
        DataType::BF16 => V::F(half::bf16::from_le_bytes(b2(c)).to_f64()),
        DataType::F32 => V::F(f32::from_le_bytes(b4(c)) as f64),
        DataType::F64 => V::F(f64::from_le_bytes(b8(c))),
        DataType::F8E4M3 | DataType::F8E5M2 => V::F(fp8_value(Fp8::of(d), c[0])),
    }
}

/// The element-wise reduction of all ranks' input bytes, as bytes of the plan's type,
/// computed once by [`reference`].
pub fn reduced_bytes(plan: &Plan, n: usize, ins: &[Vec<u8>]) -> Vec<u8> {
    let len = match plan.collective {
        Collective::AllReduce | Collective::Reduce => plan.count,
        Collective::ReduceScatter => n * plan.count,
        _ => 0,
    };
    let mut col = Vec::with_capacity(n);
    let mut out = Vec::with_capacity(len * plan.dtype.size());
    for i in 0..len {
        col.clear();
        col.extend(ins.iter().map(|x| value(plan.dtype, x, i)));
        encode_into(
            plan.dtype,
            reference(plan.dtype, plan.op, &col, n),
            &mut out,
        );
    }
    out
}

/// What rank `r` must hold in its output, as bytes; `red` is [`reduced_bytes`].
pub fn expected_bytes(plan: &Plan, ins: &[Vec<u8>], red: &[u8], r: usize) -> Vec<u8> {
    let b = plan.count * plan.dtype.size();
    match plan.collective {
        Collective::AllReduce => red.to_vec(),
        Collective::Reduce => {
            if r == plan.root {
                red.to_vec()
            } else {
                vec![]
            }
        }
        Collective::ReduceScatter => red[r * b..(r + 1) * b].to_vec(),
        Collective::Broadcast => ins[plan.root][..b].to_vec(),
        Collective::AllGather => ins.iter().flat_map(|x| x[..b].to_vec()).collect(),
        Collective::Gather => {
            if r == plan.root {
                ins.iter().flat_map(|x| x[..b].to_vec()).collect()
            } else {
                vec![]
            }
        }
        Collective::Scatter => ins[plan.root][r * b..(r + 1) * b].to_vec(),
        Collective::AllToAll => ins
            .iter()
            .flat_map(|x| x[r * b..(r + 1) * b].to_vec())
            .collect(),
        Collective::Barrier => vec![],
    }
}

/// The first element where `got` and `want` differ (any NaN equals any NaN), if any.
pub fn first_difference(d: DataType, got: &[u8], want: &[u8]) -> Option<usize> {
    if got == want {
        return None;
    }
    if got.len() != want.len() {
        return Some(got.len().min(want.len()) / d.size());
    }
    (0..got.len() / d.size()).find(|&i| !same(value(d, got, i), value(d, want, i)))
}

/// The reduction of `vals` (one per rank) with `op` over `n` ranks, computed exactly and
/// rounded once to `d`.
pub fn reference(d: DataType, op: ReduceOp, vals: &[V], n: usize) -> V {
    let ints = || vals.iter().map(|v| if let V::I(x) = v { *x } else { 0 });
    let floats = || vals.iter().map(|v| if let V::F(x) = v { *x } else { 0.0 });
    if !d.is_float() {
        let sum = || wrap(d, ints().sum());
        return V::I(match op {
            ReduceOp::Sum => sum(),
            ReduceOp::Prod => wrap(d, ints().fold(1i128, |a, b| a.wrapping_mul(b))),
            ReduceOp::Min => ints().min().expect("at least one rank"),
            ReduceOp::Max => ints().max().expect("at least one rank"),
            ReduceOp::BAnd => wrap(d, ints().fold(-1i128, |a, b| a & b)),
            ReduceOp::BOr => wrap(d, ints().fold(0i128, |a, b| a | b)),
            ReduceOp::BXor => wrap(d, ints().fold(0i128, |a, b| a ^ b)),
            ReduceOp::Avg => sum() / n as i128,
        });
    }
    V::F(match op {
        ReduceOp::Sum => round(d, floats().sum()),
        ReduceOp::Prod => round(d, floats().product()),
        ReduceOp::Avg => round(d, floats().sum::<f64>() / n as f64),
        ReduceOp::Min | ReduceOp::Max if floats().any(|x| x.is_nan()) => f64::NAN,
        ReduceOp::Min => floats()
            .min_by(|a, b| a.total_cmp(b))
            .expect("at least one rank"),
        ReduceOp::Max => floats()
            .max_by(|a, b| a.total_cmp(b))
            .expect("at least one rank"),
        _ => unreachable!("bitwise on floats"),
    })
}

/// Same value, bit for bit (any NaN equals any NaN).
pub fn same(a: V, b: V) -> bool {
    match (a, b) {
        (V::F(x), V::F(y)) => (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits(),
        _ => a == b,
    }
}

/// The element-wise reduction of all ranks' inputs over `0..len`, computed once.
pub fn reduced(plan: &Plan, n: usize, ins: &[Vec<V>]) -> Vec<V> {
    let len = match plan.collective {
        Collective::AllReduce | Collective::Reduce => plan.count,
        Collective::ReduceScatter => n * plan.count,
        _ => 0,
    };
    let mut col = Vec::with_capacity(n);
    (0..len)
        .map(|i| {
            col.clear();
            col.extend(ins.iter().map(|x| x[i]));
            reference(plan.dtype, plan.op, &col, n)
        })
        .collect()
}

/// What rank `r` must hold in its output after the collective; `red` is [`reduced`].
pub fn expected(plan: &Plan, ins: &[Vec<V>], red: &[V], r: usize) -> Vec<V> {
    let c = plan.count;
    match plan.collective {
        Collective::AllReduce => red.to_vec(),
        Collective::Reduce => {
            if r == plan.root {
                red.to_vec()
            } else {
                vec![]
            }
        }
        Collective::ReduceScatter => red[r * c..(r + 1) * c].to_vec(),
        Collective::Broadcast => ins[plan.root][..c].to_vec(),
        Collective::AllGather => ins.iter().flat_map(|x| x[..c].to_vec()).collect(),
        Collective::Gather => {
            if r == plan.root {
                ins.iter().flat_map(|x| x[..c].to_vec()).collect()
            } else {
                vec![]
            }
        }
        Collective::Scatter => ins[plan.root][r * c..(r + 1) * c].to_vec(),
        Collective::AllToAll => ins
            .iter()
            .flat_map(|x| x[r * c..(r + 1) * c].to_vec())
            .collect(),
        Collective::Barrier => vec![],
    }
}

/// Rank buffers laid out as the plan says (in place: one buffer holding both), filled with the
/// inputs and a poison pattern elsewhere.
pub fn buffers(plan: &Plan, n: usize, ins: &[Vec<V>]) -> Vec<RankBuffers> {
    let size = plan.dtype.size();
    (0..n)
        .map(|r| {
            let lay = plan.layout(r, n);
            let in_len = plan.input_count(r, n) * size;
            let out_len = plan.output_count(r, n) * size;
            let mut b = RankBuffers::default();
            for (buf, off, len) in [
                (lay.input.0, lay.input.1, in_len),
                (lay.output.0, lay.output.1, out_len),
            ] {
                let v = match buf {
                    Buffer::Input => &mut b.input,
                    Buffer::Output => &mut b.output,
                    Buffer::Scratch => unreachable!(),
                };
                if v.len() < off + len {
                    v.resize(off + len, 0xA5);
                }
            }
            let data = encode(plan.dtype, &ins[r][..plan.input_count(r, n)]);
            let (buf, off) = lay.input;
            let v = if buf == Buffer::Input {
                &mut b.input
            } else {
                &mut b.output
            };
            v[off..off + data.len()].copy_from_slice(&data);
            b
        })
        .collect()
}

/// One simulated run of `plan` with `choice` on `n` ranks.
#[derive(Clone, Debug)]
pub struct Case {
    pub plan: Plan,
    pub choice: Choice,
    pub n: usize,
    pub seed: u64,
    pub link_buffer: usize,
}

/// Runs the case in the simulator and checks every rank's output against the reference and
/// every byte outside the outputs against its initial value. Returns the report.
pub fn run(case: &Case) -> Result<SimReport, String> {
    run_checked(case, true)
}

/// [`run`], optionally without the (quadratic) race check.
pub fn run_checked(case: &Case, check_races: bool) -> Result<SimReport, String> {
    run_on(case, &algo::Hosts::flat(case.n), check_races)
}

/// [`run_checked`] with the ranks on `hosts` (which has `case.n` ranks).
pub fn run_on(case: &Case, hosts: &algo::Hosts, check_races: bool) -> Result<SimReport, String> {
    let Case {
        plan,
        choice,
        n,
        seed,
        link_buffer,
    } = case.clone();
    let mut rng = Rng(seed);
    let ins: Vec<Vec<V>> = (0..n)
        .map(|r| inputs(plan.dtype, plan.op, r, plan.input_count(r, n), &mut rng))
        .collect();
    let schedules: Vec<_> = (0..n)
        .map(|r| algo::schedule_on(&plan, &choice, r, hosts))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{case:?}: {e}"))?;
    let mut bufs = buffers(&plan, n, &ins);
    let before = bufs.clone();
    let config = SimConfig {
        link_buffer,
        check_races,
        ..SimConfig::default()
    };
    let report = sim::simulate(&schedules, plan.dtype, &mut bufs, &Cpu, &config)
        .map_err(|e| format!("{case:?}: {e}"))?;
    let size = plan.dtype.size();
    let red = reduced(&plan, n, &ins);
    for r in 0..n {
        let (buf, off) = plan.layout(r, n).output;
        let out_len = plan.output_count(r, n) * size;
        let now = if buf == Buffer::Input {
            &bufs[r].input
        } else {
            &bufs[r].output
        };
        let got = decode(plan.dtype, &now[off..off + out_len]);
        let want = expected(&plan, &ins, &red, r);
        assert_eq!(got.len(), want.len());
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            if !same(g, w) {
                return Err(format!(
                    "{case:?}: rank {r} element {i}: got {g:?}, want {w:?}"
                ));
            }
        }
        // Nothing outside the output may change: inputs are read-only, scratch is internal.
        for (which, now, was) in [
            (Buffer::Input, &bufs[r].input, &before[r].input),
            (Buffer::Output, &bufs[r].output, &before[r].output),
        ] {
            for (i, (x, y)) in now.iter().zip(was.iter()).enumerate() {
                let in_output = which == buf && (off..off + out_len).contains(&i);
                if x != y && !in_output {
                    return Err(format!(
                        "{case:?}: rank {r} wrote {which:?} byte {i} outside its output"
                    ));
                }
            }
        }
    }
    Ok(report)
}

/// IEEE 754-2019 `maximum` (NaN wins, -0 < +0), as the library's float contract says.
pub fn ieee_max(x: f64, y: f64) -> f64 {
    if x.is_nan() || y.is_nan() {
        f64::NAN
    } else if x.total_cmp(&y).is_ge() {
        x
    } else {
        y
    }
}

/// IEEE 754-2019 `minimum`.
pub fn ieee_min(x: f64, y: f64) -> f64 {
    if x.is_nan() || y.is_nan() {
        f64::NAN
    } else if x.total_cmp(&y).is_le() {
        x
    } else {
        y
    }
}

/// `x ⊕ y` for a float operator in f64: exact where the sum or product is (always for the
/// 8- and 16-bit floats and for `f32` products), correctly rounded to f64 otherwise.
pub fn float_op(op: ReduceOp, x: f64, y: f64) -> f64 {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => x + y,
        ReduceOp::Prod => x * y,
        ReduceOp::Max => ieee_max(x, y),
        ReduceOp::Min => ieee_min(x, y),
        other => panic!("{other} is not a float operator"),
    }
}

/// Checks that `comm` takes, for `plan`, a route it priced, at most the tie margin above the
/// cheapest it priced (within the margin, fewer message hops win); the error shows the table.
pub fn takes_a_cheapest_route(comm: &oxccl::Communicator, plan: &Plan) -> Result<(), String> {
    let decision = comm.explain(plan);
    let priced = comm.candidates(plan);
    let best = priced
        .iter()
        .filter_map(|p| p.1)
        .fold(f64::INFINITY, f64::min);
    let mine = priced
        .iter()
        .find(|p| p.0 == decision.route)
        .and_then(|p| p.1);
    if mine.is_some_and(|t| t <= best * (1.0 + oxccl::tune::TIE)) {
        Ok(())
    } else {
        Err(format!(
            "rank {}: {decision} is not a cheapest of {priced:?}",
            comm.rank()
        ))
    }
}
