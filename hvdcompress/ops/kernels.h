// hvdcompress kernels: the one C++ source of truth, on raw buffers, and THE specification of
// every kernel (semantics and byte layouts; the byte layouts are part of the wire format).
//
// Framework-agnostic: no torch or TensorFlow header here. capi.cpp exports the functions listed
// in HVDC_KERNELS (at the end) as a plain C ABI, which hvdcompress/ops/native.py loads with
// ctypes and calls on numpy views of PyTorch and TensorFlow CPU tensors alike (docs/kernels.md).
// The other implementations, plain torch (hvdcompress/ops/torch_fallback.py: other devices,
// builds without the library) and Triton (triton_kernels.py), follow this file bit for bit,
// random numbers included.
//
// Conventions
//  * Inputs are float32, contiguous; n is the element count. Output buffers are given by the
//    caller and have the sizes stated; no function allocates more than O(threads * 2048) words
//    unless its entry says so.
//  * Work is split over OpenMP threads when compiled with OpenMP (serial otherwise).
//  * Packed codes: a byte holds 8/bits codes, the FIRST element in the HIGHEST bits
//    (numpy.packbits order; MXNet's 2-bit order). A payload of n codes of `bits` bits takes
//    packed_bytes(n, bits) = ceil(n * bits / 8) bytes; unused low bits of the last byte are 0.
//  * Decoders add R payloads ("gathered" from R ranks, back to back) into one dense output:
//    out[i] = sum over r = 0..R-1, in that order, starting from +0.0f.
//  * Errors (bad index, bad argument) throw std::out_of_range / std::invalid_argument, outside
//    parallel regions and before anything is written.
//  * Sums that yield a float32 scale (sign_pack's mean, ef_sign_pack's scale, l2_norm) accumulate
//    in double, so that any implementation that also accumulates in double gets the same float32
//    result (the order of a double sum of float32 terms changes it by ~1e-16 relative; the float32
//    results differ only if that straddles a float32 rounding boundary).
//  * An output buffer named *_out may be the corresponding input (in place) or a separate buffer
//    (TensorFlow's immutable tensors).
#pragma once

#include <cstddef>
#include <cstdint>

namespace hvdc {

int64_t packed_bytes(int64_t n, int bits);

// ---- random numbers -------------------------------------------------------------------------
// Counter-based uniform in [0, 1) for element i under a 32-bit key (identical on every thread):
//   h = fmix32(uint32(i) * kGolden + key);  u = (h >> 8) * 2^-24
// where fmix32 is MurmurHash3's finaliser. Reproducible from (key, i) alone. Defined here once
// for C++; Python's is hvdcompress/ops/counter_hash.py, Triton's triton_kernels._uniform24.
constexpr uint32_t kGolden = 0x9E3779B1u;
inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

// ---- 1 bit: signs ---------------------------------------------------------------------------
// bit = 1 iff the sign bit of x[i] is clear (+0 -> 1, -0 -> 0). Returns the mean |x[i]|,
// float(sum / max(1, n)) with the sum in double (NaN if any element is NaN). out:
// packed_bytes(n, 1).
float sign_pack(const float* x, int64_t n, uint8_t* out);

// EF-signSGD, fused: p = x + residual; scale = float(sum|p| / n); bits of p as sign_pack;
// res_out = p - (bit ? scale : -scale), non-finite results stored as 0. Returns scale.
float ef_sign_pack(const float* x, const float* residual, int64_t n, uint8_t* out, float* res_out);

// ---- 2 bits: MXNet threshold quantisation ---------------------------------------------------
// v = x[i] + (residual ? residual[i] : 0);  code 3 (11) if v >= t, 2 (10) if v <= -t,
// 1 (01) if v is NaN, else 0 (00). With a residual: res_out[i] = v - decoded(code) where
// decoded = +t, -t, 0; non-finite results stored as 0. out: packed_bytes(n, 2). Decoding is
// unpack_sum with the table [0, NaN, -t, +t].
void twobit_pack(const float* x, const float* residual, int64_t n, float t, uint8_t* out,
                 float* res_out);

// ---- stochastic rounding to levels (dithering, QSGD, TernGrad) ------------------------------
// r = |x[i]| * inv, with inv = levels / norm (linear) or 1 / norm (natural), computed by the
// caller in float32. u = uniform(key, i).
//  linear : l = floor(r); level = l + (u < r - l)
//  natural: nonzero levels are 2^(j - levels), j = 1..levels. If r >= 2^(1 - levels):
//           r = m * 2^e (frexp, m in [0.5, 1)); level = (e + levels - 1) + (u < 2m - 1);
//           else level = (u < r * 2^(levels - 1)).  r == 0 gives level 0.
//  level is clamped to [0, levels]. NaN inputs and a non-finite or zero inv give level 0, except
//  that a NaN input is marked (see the writers).
// levels_pack writes one byte per element: the level as a two's-complement int8, negated when
// x[i] < 0; 0x80 (-128) marks NaN. Requires 1 <= levels <= 127.
void levels_pack(const float* x, int64_t n, float inv, int levels, bool natural, uint32_t key,
                 uint8_t* out);
// ternary_pack: levels == 1 written as 2-bit codes in twobit_pack's format (+1 -> 11,
// -1 -> 10, 0 -> 00, NaN -> 01). out: packed_bytes(n, 2).
void ternary_pack(const float* x, int64_t n, float inv, uint32_t key, uint8_t* out);

// ---- natural compression (Horvath et al. 2019) ----------------------------------------------
// |x| in [2^E, 2^(E+1)) rounds to 2^(E+1) with probability |x| / 2^E - 1, else to 2^E.
// One byte: bit 7 = sign bit of x, bits 0-6 = c: c = 0 -> 0 (|x| < 2^-100 and zeros flush to 0),
// c = 1..126 -> 2^(c - 101), c = 127 -> infinity (|x| rounds to 2^26 or more). NaN -> 0x80.
void natural_pack(const float* x, int64_t n, uint32_t key, uint8_t* out);

// ---- 16-bit floats ----------------------------------------------------------------------------
// out[i] = the 16-bit pattern of x[i] rounded to nearest, ties to even. bf16 = false: IEEE
// binary16, as x86's F16C converts (overflow to +-inf, binary16 subnormals kept); a NaN becomes
// sign | 0x7E00 | the top 10 bits of its payload (quiet). bf16 = true: bfloat16, the top 16 bits
// of (bits + 0x7FFF + bit 16 of bits); a NaN becomes 0xFFFF (as torch's CPU cast). Decoding
// bfloat16 is bf16_sum, binary16 fp16_sum.
void half_cast(const float* x, int64_t n, bool bf16, uint16_t* out);

// ---- decoding of packed codes ---------------------------------------------------------------
// out[i] = sum_r tables[r * 2^bits + code_r(i)], code_r(i) the i-th `bits`-bit code of payload r
// (payload r starts at byte r * packed_bytes(n, bits)). bits in {1, 2, 8}.
void unpack_sum(const uint8_t* packed, int64_t n, int bits, const float* tables, int64_t R,
                float* out);

// Sum of R payloads of n bfloat16 values given as their 16-bit patterns (back to back):
// out[i] = sum_r float(bits_r[i] << 16), in float32, in rank order from +0.0.
void bf16_sum(const uint16_t* bits, int64_t n, int64_t R, float* out);

// Sum of R payloads of n IEEE binary16 values given as their 16-bit patterns (back to back):
// out[i] = float(bits_0[i]) + float(bits_1[i]) + ... in float32, in rank order (not from +0.0:
// for R = 1, the exact float32 value of each half, -0.0 included). A NaN pattern decodes as
// F16C's vcvtph2ps does: sign and payload kept, quiet bit set (a sum where two payloads hold
// NaNs is one of them, which one unspecified).
void fp16_sum(const uint16_t* bits, int64_t n, int64_t R, float* out);

// Majority vote of R 1-bit payloads: out[i] = scale * sign(sum_r (bit_r(i) ? 1 : -1)), 0 on a tie.
void sign_vote(const uint8_t* packed, int64_t n, int64_t R, float scale, float* out);

// ---- signs with a scale per run (OneBit(chunk=...)) -------------------------------------------
// Run c covers elements [c*run, min(n, (c+1)*run)). sign_pack_runs: the codes of sign_pack into
// out, and means[c] = float(sum |x| over run c, in double, / its length). Decode:
// out[i] = sum_r (bit_r(i) ? means_r[i / run] : -means_r[i / run]), in rank order from +0.0, over
// R payloads of (packed_bytes(n, 1) bytes; ceil(n / run) means each).
void sign_pack_runs(const float* x, int64_t n, int64_t run, uint8_t* out, float* means);
void sign_runs_sum(const uint8_t* packed, const float* means, int64_t n, int64_t run, int64_t R,
                   float* out);

// ---- 8 or 4 bits: min-max per chunk (Bagua) -------------------------------------------------
// Chunk c covers elements [c*chunk, min(n, (c+1)*chunk)). bounds[2c] = min, bounds[2c+1] = max
// of the chunk (both NaN when the chunk holds a non-finite value). In float32, top = 2^bits - 1:
//   range = max - min;  inv = range > 0 ? top / range : 0;
//   code = clamp(rint((x - min) * inv), 0, top)   (round half to even; 0 for a NaN chunk)
// codes: packed_bytes(n, bits) bytes (bits 4: element i in byte i / 2, the high nibble for even
// i; chunk must be even); bounds: 2 * ceil(n / chunk) floats. bits in {4, 8}.
void minmax_pack(const float* x, int64_t n, int64_t chunk, int bits, uint8_t* codes, float* bounds);
// Decode: value = min + code * (range / top), summed over R payloads of (codes, bounds).
void minmax_unpack_sum(const uint8_t* codes, const float* bounds, int64_t n, int64_t chunk, int bits,
                       int64_t R, float* out);

// ---- reductions -----------------------------------------------------------------------------
// max |x[i]| (0 for n = 0), NaN if some element is NaN.
float max_abs(const float* x, int64_t n);
// float(sqrt(sum x[i]^2)), the squares (exact in double) summed in double (16 fixed lanes per
// block of 2048, whatever the vector width); NaN if some element is NaN, +inf if one is infinite.
float l2_norm(const float* x, int64_t n);

// ---- sparsification -------------------------------------------------------------------------
// "Selected" means |x[i]| >= t or x[i] is NaN.
int64_t count_ge(const float* x, int64_t n, float t);
// Writes the selected values and their indices, ascending, up to `cap` of them; returns how many
// are selected in total (which may exceed cap).
int64_t select_ge(const float* x, int64_t n, float t, int64_t cap, float* values,
                  int64_t* indices);
// The `top`-th largest magnitude (1-based) among x[start], x[start + stride], ... with NaN
// larger than +inf (returned as NaN). Requires 1 <= top <= sample count. Allocates the sample.
float sampled_threshold(const float* x, int64_t n, int64_t start, int64_t stride, int64_t top);
// Exact top-k by magnitude (NaN largest, then +inf): the k elements, ties broken towards the
// lower index, written with ascending indices. 0 <= k <= n. A radix select on the magnitude
// keys, two passes over x (three when the k-th key's top 16 bits are shared by more than
// max(2^16, k / 4) elements); allocates 2^16 counters per thread and up to max(2^16, k / 4)
// candidates.
void topk_abs(const float* x, int64_t n, int64_t k, float* values, int64_t* indices);

// DGC's momentum correction over the local gradient g, in one pass, into u_out and v_out:
//   plain:    u = u * mu + g;      v = v + u
//   nesterov: u = (u + g) * mu;    v = (v + u) + g
// (float32, in this order: identical to the same steps done one array operation at a time).
void momentum_correction(const float* g, const float* u, const float* v, int64_t n, float mu,
                         bool nesterov, float* u_out, float* v_out);

// DGC's momentum correction fused with its selection (dgc.py), in one pass over g, u, v:
//  1. t = the `top`-th largest magnitude key among v_new[start], v_new[start + stride], ...
//     (v_new: momentum_correction's v, computed at those positions only), +inf when that key is
//     a NaN's: sampled_threshold of momentum_correction's v, NaN mapped to +inf. *threshold = t.
//  2. u_out, v_out = momentum_correction's u, v; the elements with |v_new[i]| >= t or NaN
//     ("selected") are counted (the returned count), and the first min(count, cap) of them (in
//     index order) are written to values (v_new[i]) and indices (i, ascending), and cleared:
//     v_out[i] = +0, u_out[i] = +0 if masking or u_new[i] is not finite (fill_at's release).
//  3. Unless low <= count <= high, nothing is cleared (u_out, v_out are momentum_correction's)
//     and the values / indices written are meaningless: the caller then selects again.
// values, indices: cap entries. Requires 1 <= top <= sample count, 0 <= cap <= n. Results do not
// depend on the thread count. Allocates the sample's keys (and per-thread lists of selected
// elements when threads > 1).
int64_t dgc_select(const float* g, const float* u, const float* v, int64_t n, float mu,
                   bool nesterov, int64_t start, int64_t stride, int64_t top, int64_t cap,
                   int64_t low, int64_t high, bool masking, float* u_out, float* v_out,
                   float* values, int64_t* indices, float* threshold);

// ---- error feedback -------------------------------------------------------------------------
// out[i] = a[i] - b[i], non-finite results stored as 0 (the residual e = p - C(p)); out may be
// a or b.
void sub_finite(const float* a, const float* b, int64_t n, float* out);

// ---- low rank (PowerSGD) --------------------------------------------------------------------
// PowerSGD's products, with e, m (rows x cols), p (rows x r) and q (cols x r) row-major:
// lowrank_project: m = e + g (m = e when g is null; m may be e), then p = m q; each dot product
// is summed in float32 over blocks of 2048 columns (8 fixed lanes) and the blocks in double.
void lowrank_project(const float* e, const float* g, const float* q, int64_t rows, int64_t cols,
                     int64_t r, float* m, float* p);
// lowrank_project_back: q = m^T p, each entry summed in float32 over the rows in order.
void lowrank_project_back(const float* m, const float* p, int64_t rows, int64_t cols, int64_t r,
                          float* q);
// out (rows x cols, row-major; may be m) = m - p q^T, with p (rows x r) and q (cols x r)
// row-major; non-finite results are stored as 0. The product is accumulated in float32 over
// k = 0..r-1. Allocates q transposed (r * cols floats).
void lowrank_residual(const float* m, const float* p, const float* q, int64_t rows, int64_t cols,
                      int64_t r, float* out);

// x[indices[j]] = value for j = 0..m-1 (e.g. clearing the sent elements of DGC's velocity); with
// non_finite_only, for the j where x[indices[j]] is NaN or +-inf (DGC's momentum without masking).
// Throws std::out_of_range before writing if an index is outside [0, n).
void fill_at(float* x, int64_t n, const int64_t* indices, int64_t m, float value, bool non_finite_only);

// out[0..n) = 0, then out[indices[j]] += values[j] for j = 0..m-1 in order. Throws
// std::out_of_range (naming the first bad position) before writing if an index is outside [0, n).
void scatter_add_i32(const float* values, const int32_t* indices, int64_t m, int64_t n, float* out);
void scatter_add_i64(const float* values, const int64_t* indices, int64_t m, int64_t n, float* out);

}  // namespace hvdc

// The kernels that capi.cpp exports: for each hvdc::<name> here, a C function generated from its
// C++ signature (a returned value is written through an extra last pointer argument; argument
// types: pointers, bool, int, uint32_t, int64_t, float, double). The names are the C functions
// of hvdcompress/ops/table.py; native.py checks, when it loads the library, that both list the
// same ones.
#define HVDC_KERNELS(X)                                                                        \
  X(sign_pack) X(ef_sign_pack) X(twobit_pack) X(levels_pack) X(ternary_pack) X(natural_pack)  \
  X(half_cast) X(unpack_sum) X(bf16_sum) X(fp16_sum) X(sign_vote) X(minmax_pack) X(minmax_unpack_sum)     \
  X(sign_pack_runs) X(sign_runs_sum)                                                          \
  X(max_abs) X(l2_norm) X(count_ge) X(select_ge) X(sampled_threshold) X(topk_abs)             \
  X(momentum_correction) X(dgc_select) X(sub_finite) X(lowrank_project) X(lowrank_project_back)             \
  X(lowrank_residual) X(fill_at) X(scatter_add_i32) X(scatter_add_i64)
