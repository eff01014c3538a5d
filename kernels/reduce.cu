// oxccl's element-wise reduction kernels, for one element type and one operator per compilation:
//
//   oxccl_reduce(dst, src, n)         dst[i] = dst[i] op src[i]
//   oxccl_reduce_into(out, a, b, n)   out[i] = a[i] op b[i]
//   oxccl_divide(dst, n, by)          dst[i] = dst[i] / by      (the final step of avg)
//   oxccl_reduce_multi(m)             out_j[i] = in_0[i] op ... op in_k[i], for every output j
//
// src/reduce/cuda/nvrtc.rs embeds this file with include_str! and compiles it with NVRTC at run
// time, defining:
//
//   OXCCL_ELEM     I8 U8 I32 U32 I64 U64 F16 BF16 F32 F64    the element type
//                  F8E4M3 F8E5M2
//   OXCCL_OP       Sum Prod Max Min BAnd BOr BXor            the operator (not with OXCCL_DIVIDE)
//   OXCCL_DIVIDE   defined: compile oxccl_divide instead of the two combining kernels
//   OXCCL_THREADS  threads per block (the launch bounds; the host launches exactly this many)
//   OXCCL_UNROLL   16-byte vectors each thread loads per operand before it uses the first
//
// The file includes no header, not even cuda_fp16.h: a machine with only a driver and libnvrtc
// (no toolkit) compiles it. f16 converts with PTX's own cvt instructions, bf16 and the 8-bit
// floats with integer arithmetic, all correctly rounded.
//
// Arithmetic is the contract of src/types.rs, bit for bit equal to src/reduce/cpu.rs (except for
// which NaN comes out): integers wrap; float min/max are IEEE 754-2019 minimum/maximum (NaN wins,
// -0 < +0); f16/bf16 compute in f32 and round back to nearest even after every operation;
// f8e4m3/f8e5m2 likewise, with NCCL's saturating rounding (__NV_SATFINITE);
// integer division truncates toward zero; float division is correctly rounded (f16/bf16 go
// through f64 and round-to-odd f32, as the CPU does). NVRTC is called with --fmad=false
// --ftz=false --prec-div=true, so no contraction, flush or approximation changes a bit.
//
// Access pattern: when every operand has the same address modulo 16, each thread loads
// OXCCL_UNROLL 16-byte vectors of each operand (coalesced across the warp, all loads issued before
// the first use), combines them lane by lane and stores them; the few elements before the first
// 16-byte boundary and after the last whole vector take a scalar path. Operands whose addresses
// differ modulo 16 are processed element by element (still coalesced and unrolled, just narrower).
// Blocks loop over the buffer (grid-stride), so any grid size is correct.

typedef unsigned char ox_u8;
typedef unsigned short ox_u16;
typedef unsigned int ox_u32;
typedef long long ox_i64;
typedef unsigned long long ox_u64;

#ifndef OXCCL_THREADS
#define OXCCL_THREADS 256
#endif
#ifndef OXCCL_UNROLL
#define OXCCL_UNROLL 4
#endif

namespace oxccl {

// ---------------------------------------------------------------------------------------------
// Bits of floats, and IEEE 754-2019 maximum/minimum.

__device__ __forceinline__ ox_u32 bits(float x) { return __float_as_uint(x); }
__device__ __forceinline__ ox_u64 bits(double x) { return (ox_u64)__double_as_longlong(x); }
__device__ __forceinline__ float from_bits(ox_u32 b) { return __uint_as_float(b); }
__device__ __forceinline__ double from_bits(ox_u64 b) { return __longlong_as_double((ox_i64)b); }

// NaN if either is NaN (their sum is); equal values differ only as -0/+0, where the and of the
// bits is +0 unless both are -0.
template <class C>
__device__ __forceinline__ C ieee_max(C a, C b) {
    if (a != a || b != b) return a + b;
    if (a == b) return from_bits(bits(a) & bits(b));
    return a > b ? a : b;
}

template <class C>
__device__ __forceinline__ C ieee_min(C a, C b) {
    if (a != a || b != b) return a + b;
    if (a == b) return from_bits(bits(a) | bits(b));
    return a < b ? a : b;
}

// ---------------------------------------------------------------------------------------------
// Half-precision conversions.

// f16 <-> f32 with PTX's conversions: exact widening; narrowing rounds to nearest even, keeps
// subnormals, gives inf on overflow and a quiet NaN for a NaN.
__device__ __forceinline__ float f16_to_f32(ox_u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ ox_u16 f32_to_f16(float f) {
    ox_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// bf16 <-> f32 in integer arithmetic (PTX's bf16 conversion needs sm_80): widening is a shift;
// narrowing adds 0x7fff plus the lowest kept bit, which rounds the discarded half to nearest even
// (a carry correctly bumps the exponent, up to infinity); a NaN keeps its top bits, made quiet.
__device__ __forceinline__ float bf16_to_f32(ox_u16 h) { return from_bits((ox_u32)h << 16); }

__device__ __forceinline__ ox_u16 f32_to_bf16(float x) {
    ox_u32 b = bits(x);
    ox_u32 rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
    ox_u32 nan = (b >> 16) | 0x0040u;
    return (ox_u16)(x != x ? nan : rounded);
}

// 8-bit floats (OCP FP8) <-> f32 in integer arithmetic (PTX's fp8 conversions need sm_89), the
// same steps as src/float8.rs. Widening is exact. Narrowing rounds to nearest even and
// saturates, as NCCL's __nv_fp8_e4m3/__nv_fp8_e5m2 constructors do (__NV_SATFINITE): beyond
// the largest finite value, infinity included, gives the largest finite value; a NaN gives
// 0x7f. Normal results round by adding half an ulp minus one plus the lowest kept bit to the
// rebiased f32 bits; subnormal ones by an f32 addition of 2^(1 - bias - mantissa bits + 23),
// which leaves the count of smallest subnormals, rounded to nearest even, in the low bits.
template <int M, int BIAS, ox_u32 MAX_BITS>
__device__ __forceinline__ ox_u8 f32_to_f8(float x) {
    const ox_u32 b = bits(x);
    const ox_u32 sign = (b >> 24) & 0x80u;
    ox_u32 abs = b & 0x7fffffffu;
    const bool nan = abs > 0x7f800000u;
    abs = abs < MAX_BITS ? abs : MAX_BITS;  // saturate, infinity included
    const ox_u32 drop = 23 - M;
    const ox_u32 min_normal = (ox_u32)(128 - BIAS) << 23;
    const ox_u32 magic = (ox_u32)(128 - BIAS + drop) << 23;
    const ox_u32 sub = bits(from_bits(abs) + from_bits(magic)) - magic;
    const ox_u32 rebias = abs - ((ox_u32)(127 - BIAS) << 23);
    const ox_u32 normal = (rebias + (1u << (drop - 1)) - 1u + ((abs >> drop) & 1u)) >> drop;
    const ox_u32 magnitude = abs < min_normal ? sub : normal;
    return (ox_u8)(nan ? 0x7fu : (magnitude | sign));
}

// E4M3 (bias 7): no infinities; S.1111.111 is NaN.
__device__ __forceinline__ float f8e4m3_to_f32(ox_u8 h) {
    const ox_u32 sign = (ox_u32)(h & 0x80u) << 24;
    const ox_u32 em = h & 0x7fu;
    ox_u32 magnitude = em < 0x08u ? bits((float)em * (1.0f / 512.0f)) : (em << 20) + (120u << 23);
    if (em == 0x7fu) magnitude = 0x7fc00000u;
    return from_bits(magnitude | sign);
}

// E5M2 (bias 15): S.11111.00 is infinity, S.11111.xx NaN.
__device__ __forceinline__ float f8e5m2_to_f32(ox_u8 h) {
    const ox_u32 sign = (ox_u32)(h & 0x80u) << 24;
    const ox_u32 em = h & 0x7fu;
    ox_u32 magnitude = em < 0x04u ? bits((float)em * (1.0f / 65536.0f)) : (em << 21) + (112u << 23);
    if (em == 0x7cu) magnitude = 0x7f800000u;
    if (em > 0x7cu) magnitude = 0x7fc00000u;
    return from_bits(magnitude | sign);
}

__device__ __forceinline__ ox_u8 f32_to_f8e4m3(float x) { return f32_to_f8<3, 7, 0x43e00000u>(x); }
__device__ __forceinline__ ox_u8 f32_to_f8e5m2(float x) { return f32_to_f8<2, 15, 0x47600000u>(x); }

// x / by for x a half-type (or 8-bit float) value widened to f32, as an f32 that rounds (to
// nearest even) to the correctly rounded half-type quotient: the quotient in f64 (never within
// 2^-53 of a half-type midpoint unless it is one, for by < 2^40), then rounded to f32 by
// round-to-odd, which a second rounding to 11, 8, 4 or 3 bits cannot spoil. Round-to-odd: truncate, and set the last bit if
// anything was cut off.
__device__ __forceinline__ float half_quotient(float x, ox_u64 by) {
    double q = (double)x / (double)by;
    float t;
    asm("cvt.rz.f32.f64 %0, %1;" : "=f"(t) : "d"(q));
    if ((double)t != q && q == q) t = from_bits(bits(t) | 1u);
    return t;
}

// ---------------------------------------------------------------------------------------------
// Element types. Each says how it is stored (T) and defines the operators it supports; an
// operator a type lacks (bitwise on floats) fails to compile, which is what we want.

// Integers: wrapping sum and product in the unsigned type W (at least as wide as T, and at least
// unsigned int so that no promotion to signed int can overflow); truncating division of the
// magnitude, in 32 bits when T fits, then the sign put back.
#define OXCCL_INT_ELEM(NAME, TYPE, W, SIGNED)                                                   \
    struct NAME {                                                                               \
        typedef TYPE T;                                                                         \
        static __device__ __forceinline__ T sum(T a, T b) { return (T)((W)a + (W)b); }          \
        static __device__ __forceinline__ T prod(T a, T b) { return (T)((W)a * (W)b); }         \
        static __device__ __forceinline__ T max(T a, T b) { return a > b ? a : b; }             \
        static __device__ __forceinline__ T min(T a, T b) { return a < b ? a : b; }             \
        static __device__ __forceinline__ T band(T a, T b) { return (T)(a & b); }               \
        static __device__ __forceinline__ T bor(T a, T b) { return (T)(a | b); }                \
        static __device__ __forceinline__ T bxor(T a, T b) { return (T)(a ^ b); }               \
        static __device__ __forceinline__ T divide(T a, ox_u64 by) {                            \
            bool neg = SIGNED && a < 0;                                                         \
            W mag = neg ? (W)0 - (W)a : (W)a;                                                   \
            W q;                                                                                \
            if (sizeof(W) == 4) {                                                               \
                q = by > 0xffffffffull ? (W)0 : (W)((ox_u32)mag / (ox_u32)by);                 \
            } else {                                                                            \
                q = (W)((ox_u64)mag / by);                                                      \
            }                                                                                   \
            return (T)(neg ? (W)0 - q : q);                                                     \
        }                                                                                       \
    };

OXCCL_INT_ELEM(I8, signed char, ox_u32, true)
OXCCL_INT_ELEM(U8, unsigned char, ox_u32, false)
OXCCL_INT_ELEM(I32, int, ox_u32, true)
OXCCL_INT_ELEM(U32, unsigned int, ox_u32, false)
OXCCL_INT_ELEM(I64, long long, ox_u64, true)
OXCCL_INT_ELEM(U64, unsigned long long, ox_u64, false)

// Floats: R says how the stored value T widens to the compute type C and narrows back, and how
// it divides.
template <class R>
struct FloatElem {
    typedef typename R::T T;
    typedef typename R::C C;
    static __device__ __forceinline__ T sum(T a, T b) { return R::narrow(R::widen(a) + R::widen(b)); }
    static __device__ __forceinline__ T prod(T a, T b) { return R::narrow(R::widen(a) * R::widen(b)); }
    static __device__ __forceinline__ T max(T a, T b) { return R::narrow(ieee_max(R::widen(a), R::widen(b))); }
    static __device__ __forceinline__ T min(T a, T b) { return R::narrow(ieee_min(R::widen(a), R::widen(b))); }
    static __device__ __forceinline__ T divide(T a, ox_u64 by) { return R::divide(a, by); }
};

// f32 and f64 divide by the divisor rounded to the type, as the CPU does (exact for any rank
// count up to 2^24 and 2^53).
struct F32Repr {
    typedef float T;
    typedef float C;
    static __device__ __forceinline__ C widen(T x) { return x; }
    static __device__ __forceinline__ T narrow(C x) { return x; }
    static __device__ __forceinline__ T divide(T x, ox_u64 by) { return x / (float)by; }
};

struct F64Repr {
    typedef double T;
    typedef double C;
    static __device__ __forceinline__ C widen(T x) { return x; }
    static __device__ __forceinline__ T narrow(C x) { return x; }
    static __device__ __forceinline__ T divide(T x, ox_u64 by) { return x / (double)by; }
};

struct F16Repr {
    typedef ox_u16 T;
    typedef float C;
    static __device__ __forceinline__ C widen(T x) { return f16_to_f32(x); }
    static __device__ __forceinline__ T narrow(C x) { return f32_to_f16(x); }
    static __device__ __forceinline__ T divide(T x, ox_u64 by) {
        return f32_to_f16(half_quotient(f16_to_f32(x), by));
    }
};

struct BF16Repr {
    typedef ox_u16 T;
    typedef float C;
    static __device__ __forceinline__ C widen(T x) { return bf16_to_f32(x); }
    static __device__ __forceinline__ T narrow(C x) { return f32_to_bf16(x); }
    static __device__ __forceinline__ T divide(T x, ox_u64 by) {
        return f32_to_bf16(half_quotient(bf16_to_f32(x), by));
    }
};

struct F8E4M3Repr {
    typedef ox_u8 T;
    typedef float C;
    static __device__ __forceinline__ C widen(T x) { return f8e4m3_to_f32(x); }
    static __device__ __forceinline__ T narrow(C x) { return f32_to_f8e4m3(x); }
    static __device__ __forceinline__ T divide(T x, ox_u64 by) {
        return f32_to_f8e4m3(half_quotient(f8e4m3_to_f32(x), by));
    }
};

struct F8E5M2Repr {
    typedef ox_u8 T;
    typedef float C;
    static __device__ __forceinline__ C widen(T x) { return f8e5m2_to_f32(x); }
    static __device__ __forceinline__ T narrow(C x) { return f32_to_f8e5m2(x); }
    static __device__ __forceinline__ T divide(T x, ox_u64 by) {
        return f32_to_f8e5m2(half_quotient(f8e5m2_to_f32(x), by));
    }
};

struct F32 : FloatElem<F32Repr> {};
struct F64 : FloatElem<F64Repr> {};
struct F16 : FloatElem<F16Repr> {};
struct BF16 : FloatElem<BF16Repr> {};
struct F8E4M3 : FloatElem<F8E4M3Repr> {};
struct F8E5M2 : FloatElem<F8E5M2Repr> {};

// Operators: each picks the element type's function of its name.
#define OXCCL_OPERATOR(NAME, FN)                                                                \
    struct NAME {                                                                               \
        template <class E>                                                                      \
        static __device__ __forceinline__ typename E::T apply(typename E::T a, typename E::T b) { \
            return E::FN(a, b);                                                                 \
        }                                                                                       \
    };

OXCCL_OPERATOR(Sum, sum)
OXCCL_OPERATOR(Prod, prod)
OXCCL_OPERATOR(Max, max)
OXCCL_OPERATOR(Min, min)
OXCCL_OPERATOR(BAnd, band)
OXCCL_OPERATOR(BOr, bor)
OXCCL_OPERATOR(BXor, bxor)

// ---------------------------------------------------------------------------------------------
// Traversal.

typedef OXCCL_ELEM Elem;
typedef Elem::T T;

enum { VEC = 16 / sizeof(T), UNROLL = OXCCL_UNROLL };

// Sixteen bytes, loaded and stored as one vector access (ld.global.v4.u32).
struct __align__(16) Vec16 {
    ox_u32 w[4];
};

// A vector's elements.
union Lanes {
    Vec16 v;
    T e[VEC];
};

// This thread's index in the grid, and the grid's size.
__device__ __forceinline__ ox_u64 thread_index() {
    return (ox_u64)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ ox_u64 grid_size() { return (ox_u64)gridDim.x * blockDim.x; }

__device__ __forceinline__ ox_u64 min_u64(ox_u64 a, ox_u64 b) { return a < b ? a : b; }

// Elements of T before p reaches a 16-byte boundary, at most n.
__device__ __forceinline__ ox_u64 head_len(const void* p, ox_u64 n) {
    return min_u64(n, ((16u - ((ox_u64)p & 15u)) & 15u) / sizeof(T));
}

// Runs `f(i)` for every i in [lo, hi): each thread takes U indices a grid apart per step and calls
// f.load for all of them before f.store for any, so U loads per operand are in flight at once.
template <int U, class F>
__device__ __forceinline__ void for_each(F& f, ox_u64 lo, ox_u64 hi) {
    const ox_u64 stride = grid_size();
    for (ox_u64 base = lo + thread_index(); base < hi; base += stride * U) {
        typename F::Item item[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            ox_u64 i = base + u * stride;
            if (i < hi) item[u] = f.load(i);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            ox_u64 i = base + u * stride;
            if (i < hi) f.store(i, item[u]);
        }
    }
}

// The operands of one kernel, element by element (scalar) or 16 bytes at a time (vector).
template <class Op>
struct Combine2 {  // dst = dst op src
    T* dst;
    const T* src;
    struct Item { T d, s; };
    __device__ __forceinline__ Item load(ox_u64 i) const { Item it = {dst[i], src[i]}; return it; }
    __device__ __forceinline__ void store(ox_u64 i, const Item& it) const {
        dst[i] = Op::template apply<Elem>(it.d, it.s);
    }
};

template <class Op>
struct Combine2Vec {
    Vec16* dst;
    const Vec16* src;
    struct Item { Lanes d, s; };
    __device__ __forceinline__ Item load(ox_u64 i) const {
        Item it;
        it.d.v = dst[i];
        it.s.v = src[i];
        return it;
    }
    __device__ __forceinline__ void store(ox_u64 i, const Item& it) const {
        Lanes r;
#pragma unroll
        for (int k = 0; k < VEC; ++k) r.e[k] = Op::template apply<Elem>(it.d.e[k], it.s.e[k]);
        dst[i] = r.v;
    }
};

template <class Op>
struct Combine3 {  // out = a op b
    T* out;
    const T* a;
    const T* b;
    struct Item { T a, b; };
    __device__ __forceinline__ Item load(ox_u64 i) const { Item it = {a[i], b[i]}; return it; }
    __device__ __forceinline__ void store(ox_u64 i, const Item& it) const {
        out[i] = Op::template apply<Elem>(it.a, it.b);
    }
};

template <class Op>
struct Combine3Vec {
    Vec16* out;
    const Vec16* a;
    const Vec16* b;
    struct Item { Lanes a, b; };
    __device__ __forceinline__ Item load(ox_u64 i) const {
        Item it;
        it.a.v = a[i];
        it.b.v = b[i];
        return it;
    }
    __device__ __forceinline__ void store(ox_u64 i, const Item& it) const {
        Lanes r;
#pragma unroll
        for (int k = 0; k < VEC; ++k) r.e[k] = Op::template apply<Elem>(it.a.e[k], it.b.e[k]);
        out[i] = r.v;
    }
};

struct Divide {  // dst = dst / by
    T* dst;
    ox_u64 by;
    typedef T Item;
    __device__ __forceinline__ Item load(ox_u64 i) const { return dst[i]; }
    __device__ __forceinline__ void store(ox_u64 i, const Item& x) const { dst[i] = Elem::divide(x, by); }
};

struct DivideVec {
    Vec16* dst;
    ox_u64 by;
    typedef Lanes Item;
    __device__ __forceinline__ Item load(ox_u64 i) const {
        Lanes x;
        x.v = dst[i];
        return x;
    }
    __device__ __forceinline__ void store(ox_u64 i, const Item& x) const {
        Lanes r;
#pragma unroll
        for (int k = 0; k < VEC; ++k) r.e[k] = Elem::divide(x.e[k], by);
        dst[i] = r.v;
    }
};

// Runs a kernel over n elements whose operands all start `head` elements before a 16-byte
// boundary: the head and the tail element by element, the middle as vectors.
template <class S, class V>
__device__ __forceinline__ void split(S& s, V& v, ox_u64 head, ox_u64 n) {
    const ox_u64 nvec = (n - head) / VEC;
    for_each<1>(s, 0, head);
    for_each<UNROLL>(v, 0, nvec);
    for_each<1>(s, head + nvec * VEC, n);
}

}  // namespace oxccl

using namespace oxccl;

#ifndef OXCCL_DIVIDE

typedef OXCCL_OP Op;

extern "C" __global__ void __launch_bounds__(OXCCL_THREADS)
oxccl_reduce(T* dst, const T* src, ox_u64 n) {
    Combine2<Op> s = {dst, src};
    if ((((ox_u64)dst ^ (ox_u64)src) & 15u) != 0) {
        for_each<UNROLL>(s, 0, n);
        return;
    }
    const ox_u64 head = head_len(dst, n);
    Combine2Vec<Op> v = {(Vec16*)(dst + head), (const Vec16*)(src + head)};
    split(s, v, head, n);
}

extern "C" __global__ void __launch_bounds__(OXCCL_THREADS)
oxccl_reduce_into(T* out, const T* a, const T* b, ox_u64 n) {
    Combine3<Op> s = {out, a, b};
    if ((((ox_u64)out ^ (ox_u64)a) & 15u) != 0 || (((ox_u64)out ^ (ox_u64)b) & 15u) != 0) {
        for_each<UNROLL>(s, 0, n);
        return;
    }
    const ox_u64 head = head_len(out, n);
    Combine3Vec<Op> v = {(Vec16*)(out + head), (const Vec16*)(a + head), (const Vec16*)(b + head)};
    split(s, v, head, n);
}

// Up to OXCCL_MULTI inputs folded in order into every output: out_j[i] = in_0[i] op in_1[i] op
// ... op in_{n_in-1}[i] for every j (then divided by `by` when it is not zero: avg). One input
// makes it a copy to several outputs. The device-memory collectives of ranks that share a GPU
// run on it: each element is read once from every input and written once to every output, the
// least memory traffic a collective between buffers of one GPU can have. An output may be an
// input (in place): each element is read, combined and written by one thread.
#define OXCCL_MULTI 8

struct Multi {
    const T* in[OXCCL_MULTI];
    T* out[OXCCL_MULTI];
    ox_u64 n;
    ox_u64 by;
    ox_u32 n_in;
    ox_u32 n_out;
};

__device__ __forceinline__ void multi_scalar(const Multi& m, ox_u64 lo, ox_u64 hi) {
    const ox_u64 stride = grid_size();
    for (ox_u64 i = lo + thread_index(); i < hi; i += stride) {
        T acc = m.in[0][i];
        for (ox_u32 k = 1; k < m.n_in; ++k) acc = Op::template apply<Elem>(acc, m.in[k][i]);
        if (m.by != 0) acc = Elem::divide(acc, m.by);
        for (ox_u32 k = 0; k < m.n_out; ++k) m.out[k][i] = acc;
    }
}

// The vectors [0, nvec) of every operand advanced by `head` elements (all 16-byte aligned there).
__device__ __forceinline__ void multi_vec(const Multi& m, ox_u64 head, ox_u64 nvec) {
    const ox_u64 stride = grid_size();
    for (ox_u64 base = thread_index(); base < nvec; base += stride * UNROLL) {
        Lanes acc[UNROLL];
        const Vec16* first = (const Vec16*)(m.in[0] + head);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            ox_u64 i = base + u * stride;
            if (i < nvec) acc[u].v = first[i];
        }
        for (ox_u32 k = 1; k < m.n_in; ++k) {
            const Vec16* src = (const Vec16*)(m.in[k] + head);
            Lanes x[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                ox_u64 i = base + u * stride;
                if (i < nvec) x[u].v = src[i];
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
                for (int l = 0; l < VEC; ++l) acc[u].e[l] = Op::template apply<Elem>(acc[u].e[l], x[u].e[l]);
            }
        }
        if (m.by != 0) {
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
                for (int l = 0; l < VEC; ++l) acc[u].e[l] = Elem::divide(acc[u].e[l], m.by);
            }
        }
        for (ox_u32 k = 0; k < m.n_out; ++k) {
            Vec16* dst = (Vec16*)(m.out[k] + head);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                ox_u64 i = base + u * stride;
                if (i < nvec) dst[i] = acc[u].v;
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(OXCCL_THREADS)
oxccl_reduce_multi(const Multi m) {
    const ox_u64 mis = (ox_u64)m.in[0] & 15u;
    bool aligned = true;
    for (ox_u32 k = 1; k < m.n_in; ++k) aligned = aligned && (((ox_u64)m.in[k] & 15u) == mis);
    for (ox_u32 k = 0; k < m.n_out; ++k) aligned = aligned && (((ox_u64)m.out[k] & 15u) == mis);
    if (!aligned) {
        multi_scalar(m, 0, m.n);
        return;
    }
    const ox_u64 head = head_len(m.in[0], m.n);
    const ox_u64 nvec = (m.n - head) / VEC;
    multi_scalar(m, 0, head);
    multi_vec(m, head, nvec);
    multi_scalar(m, head + nvec * VEC, m.n);
}

#else

extern "C" __global__ void __launch_bounds__(OXCCL_THREADS)
oxccl_divide(T* dst, ox_u64 n, ox_u64 by) {
    Divide s = {dst, by};
    const ox_u64 head = head_len(dst, n);
    DivideVec v = {(Vec16*)(dst + head), by};
    split(s, v, head, n);
}

#endif
