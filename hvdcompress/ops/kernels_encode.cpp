// The encoders of kernels.h (signs, 2 bits, stochastic levels, natural compression, 16-bit
// floats, min-max 8 bits); semantics and byte layouts: kernels.h.
#include "kernels_common.h"

namespace hvdc {
namespace {

// The uniforms of elements i0 + j, j = 0, 1, ... (kernels.h): base = uint32(i0) * kGolden + key,
// so that vectorised loops keep a 32-bit counter j.
inline uint32_t block_base(uint32_t key, int64_t i0) { return static_cast<uint32_t>(i0) * kGolden + key; }

inline uint32_t uniform24(uint32_t base, uint32_t j) { return fmix32(base + j * kGolden) >> 8; }

inline float uniform(uint32_t base, uint32_t j) {
  return static_cast<float>(uniform24(base, j)) * (1.0f / 16777216.0f);
}

// Round half to even for 0 <= y < 2^22, vectorisable (no libm call).
inline float rint_small(float y) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  return (y + magic) - magic;
}

inline int twobit_code(float v, float t) {
  return (v >= t ? 3 : 0) + (v <= -t ? 2 : 0) + (v != v ? 1 : 0);  // exclusive cases
}

// Stochastic rounding of r = |x| * inv to a level in [0, levels]; see kernels.h. Branch-free
// (selects only) so that the element loops vectorise.
template <bool Natural>
struct Levels {
  int levels;
  float smallest;  // natural: the smallest nonzero level, 2^(1 - levels)
  float stretch;   // natural: 2^(levels - 1), maps [0, smallest) onto [0, 1)

  explicit Levels(int levels_)
      : levels(levels_), smallest(std::ldexp(1.0f, 1 - levels_)), stretch(std::ldexp(1.0f, levels_ - 1)) {}

  int operator()(float r, float u) const {
    r = r >= 0.0f ? r : 0.0f;  // NaN -> 0
    if (Natural) {
      r = std::min(r, 2.0f);
      const uint32_t b = bits_of(r);
      const float p = float_of((b & 0x7FFFFFu) | 0x3F800000u) - 1.0f;  // 2m - 1 of frexp
      const int big = std::min(static_cast<int>(b >> 23) - 127 + levels + (u < p ? 1 : 0), levels);
      const int small = u < r * stretch ? 1 : 0;
      return r < smallest ? small : big;
    }
    const float top = static_cast<float>(levels) + 1.0f;
    r = r < top ? r : top;
    const float low = static_cast<float>(static_cast<int>(r));  // floor for r >= 0
    const int level = static_cast<int>(low + (u < r - low ? 1.0f : 0.0f));
    return level < levels ? level : levels;
  }
};

// One block of levels_pack / ternary_pack: m elements of x, uniforms from base.
template <bool Natural>
HVDC_INLINE void levels_block(const float* x, uint32_t m, float inv, int levels, uint32_t base,
                              uint8_t* out) {
  const Levels<Natural> level_of(levels);
#pragma omp simd
  for (uint32_t j = 0; j < m; ++j) {
    const float v = x[j];
    const int level = level_of(std::fabs(v) * inv, uniform(base, j));
    out[j] = static_cast<uint8_t>(v != v ? -128 : (v < 0 ? -level : level));
  }
}

HVDC_WIDE(levels_block_linear, (const float* x, uint32_t m, float inv, int levels, uint32_t base, uint8_t* out),
          levels_block<false>(x, m, inv, levels, base, out))
HVDC_WIDE(levels_block_natural, (const float* x, uint32_t m, float inv, int levels, uint32_t base, uint8_t* out),
          levels_block<true>(x, m, inv, levels, base, out))

HVDC_INLINE void ternary_body(const float* x, uint32_t m, float inv, uint32_t base, uint8_t* out) {
  const Levels<false> level_of(1);
#pragma omp simd
  for (uint32_t j = 0; j < m; ++j) {
    const float v = x[j];
    const int level = level_of(std::fabs(v) * inv, uniform(base, j));
    out[j] = static_cast<uint8_t>(v != v ? 1 : level * (v < 0 ? 2 : 3));
  }
}
HVDC_WIDE(ternary_block, (const float* x, uint32_t m, float inv, uint32_t base, uint8_t* out),
          ternary_body(x, m, inv, base, out))


HVDC_INLINE double abs_term(float v) { return static_cast<double>(std::fabs(v)); }

// c[j] = 1 iff the sign bit of v[j] is clear (+0 -> 1, -0 -> 0).
HVDC_INLINE void sign_codes(const float* v, int64_t m, uint8_t* c) {
  for (int64_t j = 0; j < m; ++j) c[j] = static_cast<uint8_t>((~bits_of(v[j])) >> 31);
}

// sign_pack's block: the codes of x into c, and *s = sum |x[j]| in 16 lanes (each |x[j]| is
// exact in double, so the sum barely depends on the order: its float32 mean equals any other
// double-accumulated sum's, e.g. the plain-torch fallback's).
HVDC_INLINE void sign_body(const float* x, int64_t m, uint8_t* c, double* s) {
  *s = lanes16_sum(x, m, abs_term);
  sign_codes(x, m, c);
}

// EF-signSGD's first pass over a block: *s = sum |residual[j] + x[j]| (as sign_body), writing
// nothing: the second pass reads x and the residual again rather than a stored sum (one write
// of n floats less, which costs more than the read).
HVDC_INLINE void ef_abs_body(const float* x, const float* residual, int64_t m, double* s) {
  alignas(64) float p[kBlock];
  for (int64_t j = 0; j < m; ++j) p[j] = residual[j] + x[j];
  *s = lanes16_sum(p, m, abs_term);
}

// Its second pass: p = residual + x, the sign bits of p into c, and
// res_out = p - (bit ? scale : -scale), non-finite results stored as 0.
HVDC_INLINE void ef_sign_body(const float* x, const float* residual, int64_t m, float scale, float* res_out,
                              uint8_t* c) {
  for (int64_t j = 0; j < m; ++j) {
    const float p = residual[j] + x[j];
    const uint32_t bit = (~bits_of(p)) >> 31;
    res_out[j] = finite_or_zero(p - (bit ? scale : -scale));
    c[j] = static_cast<uint8_t>(bit);
  }
}

// One chunk of minmax_pack (m elements, `top` = 255 or 15 codes): bounds[0..1] = min, max, and
// the m codes, one per byte (top 255) or two, the first in the high nibble (top 15: m even but
// for the last chunk). Min, max
// and the elementwise quantisation are exact in any order, so an ISA clone.
HVDC_ISA_CLONES void minmax_chunk(const float* v, int64_t m, float top, uint8_t* q, float* bounds) {
  float mn = v[0], mx = v[0], poison = 0.0f;
#pragma omp simd reduction(min : mn) reduction(max : mx) reduction(+ : poison)
  for (int64_t i = 0; i < m; ++i) {
    mn = v[i] < mn ? v[i] : mn;
    mx = v[i] > mx ? v[i] : mx;
    poison += v[i] * 0.0f;  // NaN iff some element is not finite
  }
  if (poison != 0.0f) {
    bounds[0] = bounds[1] = std::nanf("");
    std::fill(q, q + (top > 15.0f ? m : (m + 1) / 2), uint8_t{0});
    return;
  }
  bounds[0] = mn;
  bounds[1] = mx;
  const float range = mx - mn;
  const float inv = range > 0.0f ? top / range : 0.0f;
  const auto code = [=](float x) {
    const float y = rint_small((x - mn) * inv);
    return static_cast<uint8_t>(static_cast<int>(y < 0.0f ? 0.0f : (y > top ? top : y)));
  };
  if (top > 15.0f) {
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) q[i] = code(v[i]);
    return;
  }
  for (int64_t i = 0; i + 1 < m; i += 2) q[i / 2] = static_cast<uint8_t>((code(v[i]) << 4) | code(v[i + 1]));
  if (m % 2) q[m / 2] = static_cast<uint8_t>(code(v[m - 1]) << 4);
}

// One block of twobit_pack: codes of x[0..m) (+ residual, the new residual into res_out, which
// may be residual, when given).
HVDC_ISA_CLONES void twobit_block(const float* x, const float* residual, uint32_t m, float t,
                                  uint8_t* c, float* res_out) {
  if (residual == nullptr) {
#pragma omp simd
    for (uint32_t j = 0; j < m; ++j) c[j] = static_cast<uint8_t>(twobit_code(x[j], t));
    return;
  }
#pragma omp simd
  for (uint32_t j = 0; j < m; ++j) {
    const float v = x[j] + residual[j];
    const int pos = v >= t, neg = v <= -t;
    res_out[j] = finite_or_zero(v - t * static_cast<float>(pos - neg));
    c[j] = static_cast<uint8_t>(3 * pos + 2 * neg + (v != v ? 1 : 0));
  }
}

// Compares are on int32 (every operand is below 2^31): AVX2 has no unsigned 32-bit compare.
HVDC_INLINE void natural_body(const float* x, uint32_t m, uint32_t base, uint8_t* out) {
#pragma omp simd
  for (uint32_t j = 0; j < m; ++j) {
    const uint32_t u = bits_of(x[j]);
    const int32_t a = static_cast<int32_t>(u & 0x7FFFFFFFu);
    const int32_t up = static_cast<int32_t>(uniform24(base, j)) < 2 * (a & 0x7FFFFF) ? 1 : 0;
    const int32_t e8 = (a >> 23) + up;
    int32_t c = e8 < 27 ? 0 : (e8 > 152 ? 127 : e8 - 26);
    c = (a >> 23) == 0 ? 0 : c;
    c |= static_cast<int32_t>(u >> 31) << 7;
    out[j] = static_cast<uint8_t>(a > 0x7F800000 ? 0x80 : c);
  }
}
HVDC_WIDE(natural_block, (const float* x, uint32_t m, uint32_t base, uint8_t* out), natural_body(x, m, base, out))

// The binary16 bits of v (kernels.h half_cast), in integer arithmetic: the code for CPUs without
// F16C, whose vcvtps2ph gives the same bits.
inline uint16_t fp16_bits(float v) {
  const uint32_t u = bits_of(v), a = u & 0x7FFFFFFFu;
  uint32_t h;
  if (a > 0x7F800000u) {  // NaN: quiet, with the top 10 bits of the payload
    h = 0x7E00u | ((a >> 13) & 0x3FFu);
  } else if (a >= 0x477FF000u) {  // 65520 (the midpoint above 65504, which is odd) or more
    h = 0x7C00u;
  } else if (a >= 0x38800000u) {  // 2^-14 or more: normal; rebias the exponent, round off 13 bits
    const uint32_t r = a - 0x38000000u;
    h = (r + 0xFFFu + ((r >> 13) & 1u)) >> 13;
  } else if (a >= 0x33000000u) {  // 2^-25 or more: a subnormal count of 2^-24, rounded
    const uint32_t m = (a & 0x7FFFFFu) | 0x800000u, shift = 126 - (a >> 23);  // |v| = m 2^-shift 2^-24
    h = (m + (1u << (shift - 1)) - 1u + ((m >> shift) & 1u)) >> shift;
  } else {  // below half of 2^-24: zero
    h = 0;
  }
  return static_cast<uint16_t>(((u >> 16) & 0x8000u) | h);
}

void fp16_block(const float* x, int64_t m, uint16_t* out) {
  for (int64_t j = 0; j < m; ++j) out[j] = fp16_bits(x[j]);
}

#ifdef HVDC_F16C
// fp16_block by F16C (8 at a time; the tail through a zero-padded vector).
__attribute__((target("avx,f16c"))) void fp16_block_f16c(const float* x, int64_t m, uint16_t* out) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  int64_t j = 0;
  for (; j + 8 <= m; j += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j), _mm256_cvtps_ph(_mm256_loadu_ps(x + j), kRound));
  if (j < m) {
    float tail[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    uint16_t h[8];
    std::memcpy(tail, x + j, static_cast<size_t>(m - j) * sizeof(float));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h), _mm256_cvtps_ph(_mm256_loadu_ps(tail), kRound));
    std::memcpy(out + j, h, static_cast<size_t>(m - j) * sizeof(uint16_t));
  }
}
#endif

// The bfloat16 bits of x[0..m) (kernels.h half_cast); integer arithmetic, so at any width.
HVDC_INLINE void bf16_cast_body(const float* x, int64_t m, uint16_t* out) {
#pragma omp simd
  for (int64_t j = 0; j < m; ++j) {
    const uint32_t u = bits_of(x[j]);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    out[j] = static_cast<uint16_t>(static_cast<int32_t>(u & 0x7FFFFFFFu) > 0x7F800000 ? 0xFFFFu : rounded);
  }
}
HVDC_WIDE(bf16_cast_block, (const float* x, int64_t m, uint16_t* out), bf16_cast_body(x, m, out))

// Packs the m codes of c (BITS bits each; c has room for padding up to a whole byte) into
// ceil(m * BITS / 8) bytes of o, 8 / BITS codes per byte by one multiplication.
template <int BITS>
HVDC_INLINE void pack_block(uint8_t* c, int64_t m, uint8_t* __restrict o) {
  constexpr int per = 8 / BITS;
  for (int64_t j = m; j < (m + per - 1) / per * per; ++j) c[j] = 0;
  for (int64_t b = 0; b < (m + per - 1) / per; ++b) {
    if (BITS == 1) {
      uint64_t v;
      std::memcpy(&v, c + 8 * b, 8);
      o[b] = static_cast<uint8_t>((v * 0x8040201008040201ull) >> 56);
    } else if (BITS == 2) {
      uint32_t v;
      std::memcpy(&v, c + 4 * b, 4);
      o[b] = static_cast<uint8_t>((static_cast<uint64_t>(v) * 0x40100401ull) >> 24);
    } else {
      o[b] = c[b];
    }
  }
}

// Packs BITS-bit codes, block by block: fill(i0, m, c) writes the codes of elements
// [i0, i0 + m) into the byte array c, then pack_block packs them.
template <int BITS, class Fill>
void pack_codes(int64_t n, uint8_t* __restrict out, Fill fill) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_for(blocks, kBlock, [&](int64_t k0, int64_t k1) {
    alignas(64) uint8_t c[kBlock];
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t i0 = k * kBlock, m = std::min(kBlock, n - i0);
      fill(i0, static_cast<uint32_t>(m), c);
      pack_block<BITS>(c, m, out + i0 / (8 / BITS));
    }
  });
}

HVDC_WIDE(sign_block, (const float* x, int64_t m, uint8_t* c, double* s), sign_body(x, m, c, s))
HVDC_WIDE(ef_abs_block, (const float* x, const float* residual, int64_t m, double* s),
          ef_abs_body(x, residual, m, s))
HVDC_WIDE(ef_sign_block, (const float* x, const float* residual, int64_t m, float scale, float* res_out, uint8_t* c),
          ef_sign_body(x, residual, m, scale, res_out, c))

}  // namespace

int64_t packed_bytes(int64_t n, int bits) { return (n * bits + 7) / 8; }

// ---- signs ------------------------------------------------------------------------------------
float sign_pack(const float* x, int64_t n, uint8_t* out) {
  const double total = block_sum(n, [&](int64_t i0, int64_t m) {  // one read of x
    alignas(64) uint8_t c[kBlock];
    double s;
    sign_block(x + i0, m, c, &s);
    pack_block<1>(c, m, out + i0 / 8);
    return s;
  });
  return static_cast<float>(total / static_cast<double>(std::max<int64_t>(1, n)));
}

void sign_pack_runs(const float* x, int64_t n, int64_t run, uint8_t* out, float* means) {
  if (run < 1) throw std::invalid_argument("sign_pack_runs: run must be >= 1");
  pack_codes<1>(n, out, [=](int64_t i0, uint32_t m, uint8_t* c) { sign_codes(x + i0, m, c); });
  parallel_for((n + run - 1) / run, run, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t i0 = c * run, m = std::min(run, n - i0);
      double s = 0.0;  // in element order: |x| is exact in double, the sum barely order-dependent
      for (int64_t j = 0; j < m; ++j) s += abs_term(x[i0 + j]);
      means[c] = static_cast<float>(s / static_cast<double>(m));
    }
  });
}

float ef_sign_pack(const float* x, const float* residual, int64_t n, uint8_t* out, float* res_out) {
  const double total = block_sum(n, [&](int64_t i0, int64_t m) {
    double s;
    ef_abs_block(x + i0, residual + i0, m, &s);
    return s;
  });
  const float scale = n ? static_cast<float>(total / static_cast<double>(n)) : 0.0f;
  pack_codes<1>(n, out, [=](int64_t i0, uint32_t m, uint8_t* c) {
    ef_sign_block(x + i0, residual + i0, m, scale, res_out + i0, c);
  });
  return scale;
}

// ---- 2 bits -----------------------------------------------------------------------------------
void twobit_pack(const float* x, const float* residual, int64_t n, float t, uint8_t* out, float* res_out) {
  if (residual != nullptr && res_out == nullptr)
    throw std::invalid_argument("twobit_pack: a residual needs an output buffer for the new residual");
  pack_codes<2>(n, out, [=](int64_t i0, uint32_t m, uint8_t* c) {
    twobit_block(x + i0, residual ? residual + i0 : nullptr, m, t, c, residual ? res_out + i0 : nullptr);
  });
}

// ---- stochastic levels ------------------------------------------------------------------------
void levels_pack(const float* x, int64_t n, float inv, int levels, bool natural, uint32_t key,
                 uint8_t* out) {
  if (levels < 1 || levels > 127)
    throw std::invalid_argument("levels_pack: levels=" + std::to_string(levels) + " is outside [1, 127]");
  const auto block = natural ? levels_block_natural : levels_block_linear;
  parallel_blocks(n, [=](int64_t i0, int64_t m) {
    block(x + i0, static_cast<uint32_t>(m), inv, levels, block_base(key, i0), out + i0);
  });
}

void ternary_pack(const float* x, int64_t n, float inv, uint32_t key, uint8_t* out) {
  pack_codes<2>(n, out, [=](int64_t i0, uint32_t m, uint8_t* c) {
    ternary_block(x + i0, m, inv, block_base(key, i0), c);
  });
}

void natural_pack(const float* x, int64_t n, uint32_t key, uint8_t* out) {
  parallel_blocks(n, [=](int64_t i0, int64_t m) {
    natural_block(x + i0, static_cast<uint32_t>(m), block_base(key, i0), out + i0);
  });
}

void half_cast(const float* x, int64_t n, bool bf16, uint16_t* out) {
#ifdef HVDC_F16C
  static const bool f16c = cpu_has_f16c();
  void (*fp16)(const float*, int64_t, uint16_t*) = f16c ? fp16_block_f16c : fp16_block;
#else
  void (*fp16)(const float*, int64_t, uint16_t*) = fp16_block;
#endif
  parallel_blocks(n, [=](int64_t i0, int64_t m) { (bf16 ? bf16_cast_block : fp16)(x + i0, m, out + i0); });
}

// ---- min-max, 8 or 4 bits ----------------------------------------------------------------------
void minmax_pack(const float* x, int64_t n, int64_t chunk, int bits, uint8_t* codes, float* bounds) {
  check_minmax("minmax_pack", chunk, bits);
  const int64_t chunks = (n + chunk - 1) / chunk;
  const float top = static_cast<float>((1 << bits) - 1);
  parallel_for(chunks, chunk, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      minmax_chunk(x + c * chunk, std::min(chunk, n - c * chunk), top, codes + c * chunk * bits / 8,
                   bounds + 2 * c);
  });
}

}  // namespace hvdc
