//! The vocabulary every room shares: element types, reduction operators, ranks, and the
//! [`Element`] trait that ties Rust types to [`DataType`]. Plain data; no I/O.
//!
//! # Arithmetic contract
//!
//! These choices hold for every algorithm, transport and device, so that a result never depends on
//! the order in which ranks' contributions were combined (except for the rounding of float sums
//! and products, which no reduction order can avoid):
//!
//! - **Integer overflow wraps** (two's complement), as in NCCL: `sum` and `prod` are
//!   `wrapping_add`/`wrapping_mul`. Wrapping arithmetic is associative, so integer results are exact
//!   and identical under every algorithm.
//! - **`avg`** is `sum` followed by one division by the number of ranks, applied once to the fully
//!   reduced value. On integers the sum wraps and the division truncates toward zero (like Rust's
//!   `/`); on floats it is the correctly rounded quotient of the reduced value by the rank
//!   count (for `f16`/`bf16` and the 8-bit types, computed so that it stays correctly rounded
//!   even when the count is not representable in the element type; see `reduce::cpu::divide`).
//! - **`min`/`max` on floats** follow IEEE 754-2019 `minimum`/`maximum`: a NaN in any contribution
//!   makes the result NaN (a gradient that went NaN anywhere is not silently hidden), and
//!   `-0.0 < +0.0`. Both rules make them commutative and associative bit for bit, except for
//!   which NaN payload comes out.
//! - **`f16`/`bf16`** arithmetic is performed in `f32` and rounded back after every operation,
//!   as NCCL's `__hadd` does; the result equals the correctly rounded operation in the element type.
//! - **`f8e4m3`/`f8e5m2`** ([`F8E4M3`], [`F8E5M2`]) likewise compute in `f32` and round back to
//!   nearest even after every operation, but the rounding **saturates**, as NCCL's does
//!   (`__NV_SATFINITE`): a result beyond the largest finite value, infinity included, becomes
//!   that value (±448, ±57344), and a NaN stays a NaN. So an E5M2 infinity that takes part in a
//!   reduction step comes out as ±57344. `avg` divides once at the end, as for every float.
//! - **`band`/`bor`/`bxor`** are defined on integer types only.

use std::fmt;
use std::str::FromStr;

pub use crate::float8::{F8E4M3, F8E5M2};

/// A process's index in a communicator, `0..size`.
pub type Rank = usize;

/// The element type of a buffer.
///
/// The discriminants equal nccl.h's `ncclDataType_t` values, so the C ABI can pass them through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DataType {
    /// Signed 8-bit integer (`int8`).
    I8 = 0,
    /// Unsigned 8-bit integer (`uint8`).
    U8 = 1,
    /// Signed 32-bit integer (`int32`).
    I32 = 2,
    /// Unsigned 32-bit integer (`uint32`).
    U32 = 3,
    /// Signed 64-bit integer (`int64`).
    I64 = 4,
    /// Unsigned 64-bit integer (`uint64`).
    U64 = 5,
    /// IEEE 754 binary16 (`half`).
    F16 = 6,
    /// IEEE 754 binary32 (`float`).
    F32 = 7,
    /// IEEE 754 binary64 (`double`).
    F64 = 8,
    /// bfloat16: binary32 truncated to 8 significant bits (`bfloat16`).
    BF16 = 9,
    /// OCP FP8 E4M3 (`ncclFloat8e4m3`): no infinities, ±448 at most; see [`F8E4M3`].
    F8E4M3 = 10,
    /// OCP FP8 E5M2 (`ncclFloat8e5m2`): IEEE-like, ±57344 at most; see [`F8E5M2`].
    F8E5M2 = 11,
}

impl DataType {
    /// Every data type, in nccl.h order.
    pub const ALL: [DataType; 12] = [
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::BF16,
        DataType::F8E4M3,
        DataType::F8E5M2,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 | DataType::F8E4M3 | DataType::F8E5M2 => 1,
            DataType::F16 | DataType::BF16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// The name nccl-tests prints and accepts (`float`, `half`, `bfloat16`, `f8e4m3`, `int32`,
    /// ...).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::F16 => "half",
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::BF16 => "bfloat16",
            DataType::F8E4M3 => "f8e4m3",
            DataType::F8E5M2 => "f8e5m2",
        }
    }

    /// True for the six floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F8E4M3
                | DataType::F8E5M2
                | DataType::F16
                | DataType::BF16
                | DataType::F32
                | DataType::F64
        )
    }

    /// The type whose nccl.h value is `raw`, or `None` for a value nccl.h does not define.
    pub const fn from_raw(raw: i64) -> Option<DataType> {
        Some(match raw {
            0 => DataType::I8,
            1 => DataType::U8,
            2 => DataType::I32,
            3 => DataType::U32,
            4 => DataType::I64,
            5 => DataType::U64,
            6 => DataType::F16,
            7 => DataType::F32,
            8 => DataType::F64,
            9 => DataType::BF16,
            10 => DataType::F8E4M3,
            11 => DataType::F8E5M2,
            _ => return None,
        })
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A string that names no known data type or reduction operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownName {
    /// What kind of name was expected (`"data type"`, `"reduction operator"`).
    pub kind: &'static str,
    /// The name as given.
    pub name: String,
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown {} {:?}", self.kind, self.name)
    }
}

impl std::error::Error for UnknownName {}

impl FromStr for DataType {
    type Err = UnknownName;

    /// Parses nccl-tests names (`int8 uint8 int32 uint32 int64 uint64 half float double
    /// bfloat16 f8e4m3 f8e5m2`), nccl.h spellings (`float16`, `float32`, `float64`, `char`,
    /// `int`, `float8e4m3`, `float8e5m2`), PyTorch's (`float8_e4m3fn`, `float8_e5m2`) and Rust
    /// names (`i8`, `f32`, `bf16`, ...), ignoring ASCII case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        Ok(match lower.as_str() {
            "int8" | "i8" | "char" => DataType::I8,
            "uint8" | "u8" => DataType::U8,
            "int32" | "i32" | "int" => DataType::I32,
            "uint32" | "u32" => DataType::U32,
            "int64" | "i64" => DataType::I64,
            "uint64" | "u64" => DataType::U64,
            "half" | "float16" | "f16" | "fp16" => DataType::F16,
            "float" | "float32" | "f32" | "fp32" => DataType::F32,
            "double" | "float64" | "f64" | "fp64" => DataType::F64,
            "bfloat16" | "bf16" => DataType::BF16,
            "f8e4m3" | "float8e4m3" | "fp8e4m3" | "fp8_e4m3" | "float8_e4m3fn" | "f8e4m3fn" => {
                DataType::F8E4M3
            }
            "f8e5m2" | "float8e5m2" | "fp8e5m2" | "fp8_e5m2" | "float8_e5m2" => DataType::F8E5M2,
            _ => {
                return Err(UnknownName {
                    kind: "data type",
                    name: s.to_owned(),
                });
            }
        })
    }
}

/// How contributions are combined.
///
/// The first five discriminants equal nccl.h's `ncclRedOp_t` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum ReduceOp {
    /// Sum (wrapping on integers).
    Sum = 0,
    /// Product (wrapping on integers).
    Prod = 1,
    /// Maximum (NaN-propagating on floats, `-0.0 < +0.0`).
    Max = 2,
    /// Minimum (NaN-propagating on floats, `-0.0 < +0.0`).
    Min = 3,
    /// Sum, then one division by the number of ranks (see the module's arithmetic contract).
    Avg = 4,
    /// Bitwise and (integers only).
    BAnd = 5,
    /// Bitwise or (integers only).
    BOr = 6,
    /// Bitwise exclusive or (integers only).
    BXor = 7,
}

impl ReduceOp {
    /// Every operator.
    pub const ALL: [ReduceOp; 8] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
        ReduceOp::BAnd,
        ReduceOp::BOr,
        ReduceOp::BXor,
    ];

    /// The name nccl-tests prints (`sum`, `prod`, `max`, `min`, `avg`) or ours for the bitwise
    /// operators (`band`, `bor`, `bxor`).
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
            ReduceOp::BAnd => "band",
            ReduceOp::BOr => "bor",
            ReduceOp::BXor => "bxor",
        }
    }

    /// Whether this operator is defined on `dtype` (bitwise operators are integer-only).
    pub const fn supports(self, dtype: DataType) -> bool {
        !(self.is_bitwise() && dtype.is_float())
    }

    /// True for `band`, `bor` and `bxor`.
    pub const fn is_bitwise(self) -> bool {
        matches!(self, ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor)
    }

    /// The operator used to combine two partial results: `Sum` for `Avg` (whose division happens
    /// once, at the end), the operator itself otherwise.
    pub const fn combiner(self) -> ReduceOp {
        match self {
            ReduceOp::Avg => ReduceOp::Sum,
            other => other,
        }
    }

    /// The operator whose ncclRedOp_t-style value is `raw`, or `None`.
    pub const fn from_raw(raw: i64) -> Option<ReduceOp> {
        Some(match raw {
            0 => ReduceOp::Sum,
            1 => ReduceOp::Prod,
            2 => ReduceOp::Max,
            3 => ReduceOp::Min,
            4 => ReduceOp::Avg,
            5 => ReduceOp::BAnd,
            6 => ReduceOp::BOr,
            7 => ReduceOp::BXor,
            _ => return None,
        })
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = UnknownName;

    /// Parses `sum prod max min avg band bor bxor` (ASCII case ignored; `mean` means `avg`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        Ok(match lower.as_str() {
            "sum" => ReduceOp::Sum,
            "prod" | "product" => ReduceOp::Prod,
            "max" => ReduceOp::Max,
            "min" => ReduceOp::Min,
            "avg" | "mean" => ReduceOp::Avg,
            "band" => ReduceOp::BAnd,
            "bor" => ReduceOp::BOr,
            "bxor" => ReduceOp::BXor,
            _ => {
                return Err(UnknownName {
                    kind: "reduction operator",
                    name: s.to_owned(),
                });
            }
        })
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that oxccl can move and reduce: one per [`DataType`].
///
/// Sealed: the set of element types is the set of `DataType`s.
pub trait Element:
    bytemuck::Pod + Send + Sync + PartialEq + fmt::Debug + sealed::Sealed + 'static
{
    /// The data type this Rust type stands for.
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = DataType::$d;
        }
    )*};
}

element! {
    i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
    half::f16 => F16, half::bf16 => BF16, f32 => F32, f64 => F64,
    F8E4M3 => F8E4M3, F8E5M2 => F8E5M2,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes_match_rust_types() {
        for d in DataType::ALL {
            assert_eq!(d.name().parse::<DataType>().unwrap(), d);
            assert_eq!(DataType::from_raw(d as i64), Some(d));
        }
        assert_eq!(DataType::I8.size(), size_of::<i8>());
        assert_eq!(DataType::U64.size(), size_of::<u64>());
        assert_eq!(DataType::F16.size(), size_of::<half::f16>());
        assert_eq!(DataType::BF16.size(), size_of::<half::bf16>());
        assert_eq!(DataType::F8E4M3.size(), size_of::<F8E4M3>());
        assert_eq!(DataType::F8E5M2.size(), size_of::<F8E5M2>());
        assert_eq!(DataType::F64.size(), size_of::<f64>());
        assert_eq!("FLOAT32".parse::<DataType>().unwrap(), DataType::F32);
        assert_eq!("bf16".parse::<DataType>().unwrap(), DataType::BF16);
        assert!("float8".parse::<DataType>().is_err());
        assert_eq!("F8E4M3".parse::<DataType>().unwrap(), DataType::F8E4M3);
        assert_eq!("float8_e5m2".parse::<DataType>().unwrap(), DataType::F8E5M2);
        // nccl.h's numbering: ncclFloat8e4m3 = 10, ncclFloat8e5m2 = 11, ncclNumTypes = 12.
        assert_eq!(DataType::from_raw(10), Some(DataType::F8E4M3));
        assert_eq!(DataType::from_raw(11), Some(DataType::F8E5M2));
        assert_eq!(DataType::from_raw(12), None);
        assert_eq!(DataType::from_raw(-1), None);
    }

    #[test]
    fn ops_parse_and_bitwise_ops_are_integer_only() {
        for op in ReduceOp::ALL {
            assert_eq!(op.name().parse::<ReduceOp>().unwrap(), op);
            assert_eq!(ReduceOp::from_raw(op as i64), Some(op));
        }
        assert!(!ReduceOp::BXor.supports(DataType::F32));
        assert!(!ReduceOp::BAnd.supports(DataType::F8E5M2));
        assert!(ReduceOp::Avg.supports(DataType::F8E4M3));
        assert!(ReduceOp::BXor.supports(DataType::U8));
        assert!(ReduceOp::Avg.supports(DataType::I32));
        assert_eq!(ReduceOp::Avg.combiner(), ReduceOp::Sum);
        assert!("mulsum".parse::<ReduceOp>().is_err());
    }
}
