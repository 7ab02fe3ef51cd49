// The decoders of kernels.h: the float32 sum of R payloads (packed codes, 16-bit floats, sign
// votes, min-max chunks, sparse values); semantics and byte layouts: kernels.h.
#include "kernels_common.h"

namespace hvdc {
namespace {

// o[j] (+)= the float32 value of the bfloat16 bit pattern b[j]; exact, so at any width.
HVDC_INLINE void bf16_body(const uint16_t* b, int64_t m, bool first, float* o) {
  if (first) {
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) o[j] = 0.0f + float_of(static_cast<uint32_t>(b[j]) << 16);
  } else {
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) o[j] += float_of(static_cast<uint32_t>(b[j]) << 16);
  }
}
HVDC_WIDE(bf16_block, (const uint16_t* b, int64_t m, bool first, float* o), bf16_body(b, m, first, o))

// The float32 value of the binary16 pattern h (kernels.h fp16_sum): exact, in integer
// arithmetic, with the bits of F16C's vcvtph2ps (a NaN keeps its sign and payload, made quiet).
inline float fp16_value(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1Fu) return float_of(sign | 0x7F800000u | (m << 13) | (m != 0 ? 0x400000u : 0u));
  if (e != 0) return float_of(sign | ((e + 112u) << 23) | (m << 13));  // rebias 15 -> 127
  return float_of(sign | bits_of(static_cast<float>(m) * 0x1p-24f));  // subnormal (or zero): m 2^-24
}

// o[j] = (first) or += the float32 value of the binary16 pattern b[j].
void fp16_sum_block(const uint16_t* b, int64_t m, bool first, float* o) {
  if (first) {
    for (int64_t j = 0; j < m; ++j) o[j] = fp16_value(b[j]);
  } else {
    for (int64_t j = 0; j < m; ++j) o[j] += fp16_value(b[j]);
  }
}

#ifdef HVDC_F16C
// fp16_sum_block by F16C, 8 at a time (the tail by fp16_value: the same bits).
__attribute__((target("avx,f16c"))) void fp16_sum_block_f16c(const uint16_t* b, int64_t m, bool first,
                                                             float* o) {
  int64_t j = 0;
  for (; j + 8 <= m; j += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + j)));
    _mm256_storeu_ps(o + j, first ? v : _mm256_add_ps(_mm256_loadu_ps(o + j), v));
  }
  fp16_sum_block(b + j, m - j, first, o + j);
}

// The same by AVX-512, 16 at a time.
__attribute__((target("avx512f"))) void fp16_sum_block_avx512(const uint16_t* b, int64_t m, bool first,
                                                              float* o) {
  int64_t j = 0;
  for (; j + 16 <= m; j += 16) {
    const __m512 v =  // (maskz: GCC 12 warns on the unmasked intrinsic's undefined source)
        _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + j)));
    _mm512_storeu_ps(o + j, first ? v : _mm512_add_ps(_mm512_loadu_ps(o + j), v));
  }
  fp16_sum_block(b + j, m - j, first, o + j);
}
#endif

// Output blocks of the decoders: summed in an L1 buffer, then stored. Outputs of at least
// kStreamMin floats take streaming stores (16-byte aligned): a large output is not read before
// it is written (a third less memory traffic), nor kept in cache.
constexpr int64_t kStreamMin = int64_t{1} << 20;

inline void store_block(float* __restrict dst, const float* __restrict src, int64_t m, bool stream) {
#if defined(__SSE2__)
  if (stream) {
    int64_t j = 0;
    for (; j < m && reinterpret_cast<uintptr_t>(dst + j) % 16; ++j) dst[j] = src[j];
    for (; j + 4 <= m; j += 4) _mm_stream_ps(dst + j, _mm_loadu_ps(src + j));
    for (; j < m; ++j) dst[j] = src[j];
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, static_cast<size_t>(m) * sizeof(float));
}

inline void stream_fence(bool stream) {
#if defined(__SSE2__)
  if (stream) _mm_sfence();
#endif
  (void)stream;
}

// Decodes and sums R payloads block by block, then applies finish(block, m) to each summed block
// while it is in L1. Codes of fewer than 8 bits are looked up a byte at a time when n is large:
// each rank's table widened to the 8 / BITS floats of every byte value (256 rows, built once per
// call), so a byte adds a short vector instead of 8 / BITS extracted lookups. The same floats are
// added in the same order either way.
template <int BITS, class Finish>
void unpack_sum_impl(const uint8_t* packed, int64_t n, const float* tables, int64_t R, float* out,
                     Finish finish) {
  constexpr int per = 8 / BITS;
  constexpr uint32_t mask = (1u << BITS) - 1;
  const int64_t nbytes = packed_bytes(n, BITS);
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const bool widen = BITS < 8 && n >= 64 * 256 * per;
  std::vector<float> wide(widen ? static_cast<size_t>(R) * 256 * per : 0);
  for (int64_t r = 0; r < (widen ? R : 0); ++r)
    for (int byte = 0; byte < 256; ++byte)
      for (int j = 0; j < per; ++j)
        wide[(r * 256 + byte) * per + j] = tables[(r << BITS) + ((byte >> (8 - BITS * (j + 1))) & mask)];
  const bool stream = n >= kStreamMin;
  parallel_for(blocks, kBlock, [&](int64_t k0, int64_t k1) {
    alignas(64) uint8_t c[kBlock];
    alignas(64) float o[kBlock];
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t i0 = k * kBlock, m = std::min(kBlock, n - i0);
      if (BITS < 8 || R == 0)
        for (int64_t i = 0; i < m; ++i) o[i] = 0.0f;
      for (int64_t r = 0; r < R; ++r) {
        const uint8_t* p = packed + r * nbytes + i0 / per;
        const float* table = tables + (r << BITS);
        const uint8_t* code = p;
        int64_t done = 0;  // elements added through the widened table
        if (widen) {
          const float* w = wide.data() + r * 256 * per;
          for (; done + per <= m; done += per) {
            const float* row = w + p[done / per] * per;
#if defined(__SSE2__)
            for (int j = 0; j < per; j += 4)
              _mm_storeu_ps(o + done + j, _mm_add_ps(_mm_loadu_ps(o + done + j), _mm_loadu_ps(row + j)));
#else
            for (int j = 0; j < per; ++j) o[done + j] += row[j];
#endif
          }
        }
        if (BITS < 8) {
          for (int64_t b = done / per; b < (m + per - 1) / per; ++b)
            for (int j = 0; j < per; ++j) c[b * per + j] = (p[b] >> (8 - BITS * (j + 1))) & mask;
          code = c;
        }
        if (BITS == 8 && r == 0)  // the first rank's values onto +0.0 (no zeroing pass)
          for (int64_t i = 0; i < m; ++i) o[i] = 0.0f + table[code[i]];
        else
          for (int64_t i = done; i < m; ++i) o[i] += table[code[i]];
      }
      finish(o, m);
      store_block(out + i0, o, m, stream);
    }
    stream_fence(stream);
  });
}

// out[0..m) = +0.0; streaming stores for a large output (kStreamMin floats or more), which is
// then not read before being written.
inline void zero_fill(float* out, int64_t m) {
#if defined(__SSE2__)
  if (m >= kStreamMin) {
    int64_t j = 0;
    for (; j < m && reinterpret_cast<uintptr_t>(out + j) % 16; ++j) out[j] = 0.0f;
    const __m128 zero = _mm_setzero_ps();
    for (; j + 4 <= m; j += 4) _mm_stream_ps(out + j, zero);
    for (; j < m; ++j) out[j] = 0.0f;
    _mm_sfence();
    return;
  }
#endif
  std::fill(out, out + m, 0.0f);
}

template <class Index>
void scatter_add_impl(const float* values, const Index* indices, int64_t m, int64_t n, float* out) {
  check_indices("scatter_add", indices, m, n);
  parallel_for(n, 1, [&](int64_t b, int64_t e) { zero_fill(out + b, e - b); });
  // Each thread owns a range of destinations and applies the entries that fall in it, in order.
  run_slices(n, std::min<int>(threads_for(m * 8), threads_for(n)), [&](int, int, int64_t b, int64_t e) {
    for (int64_t j = 0; j < m; ++j) {
      int64_t i = indices[j];
      if (i >= b && i < e) out[i] += values[j];
    }
  });
}

// The R 16-bit payloads summed block by block: block(bits, m, first, o) adds (or, first, writes)
// m decoded values into the L1 block o, stored once summed.
template <class Block>
void half_sum(const uint16_t* bits, int64_t n, int64_t R, float* out, Block block) {
  const bool stream = n >= kStreamMin;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_for(blocks, kBlock, [&](int64_t k0, int64_t k1) {
    alignas(64) float o[kBlock];
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t i0 = k * kBlock, m = std::min(kBlock, n - i0);
      for (int64_t r = 0; r < R; ++r) block(bits + r * n + i0, m, r == 0, o);
      if (R == 0) std::fill(o, o + m, 0.0f);
      store_block(out + i0, o, m, stream);
    }
    stream_fence(stream);
  });
}

}  // namespace

void unpack_sum(const uint8_t* packed, int64_t n, int bits, const float* tables, int64_t R,
                float* out) {
  const auto keep = [](float*, int64_t) {};
  switch (bits) {
    case 1: return unpack_sum_impl<1>(packed, n, tables, R, out, keep);
    case 2: return unpack_sum_impl<2>(packed, n, tables, R, out, keep);
    case 8: return unpack_sum_impl<8>(packed, n, tables, R, out, keep);
    default: throw std::invalid_argument("unpack_sum: bits=" + std::to_string(bits) + "; allowed: 1, 2, 8");
  }
}

void bf16_sum(const uint16_t* bits, int64_t n, int64_t R, float* out) { half_sum(bits, n, R, out, bf16_block); }

void fp16_sum(const uint16_t* bits, int64_t n, int64_t R, float* out) {
#ifdef HVDC_F16C  // AVX-512, F16C (on an AVX2 CPU; HVDC_NO_AVX2 selects the scalar code), or scalar
  static const auto block = cpu_isa() == 2 ? fp16_sum_block_avx512
                            : cpu_isa() == 1 && cpu_has_f16c() ? fp16_sum_block_f16c : fp16_sum_block;
#else
  const auto block = fp16_sum_block;
#endif
  half_sum(bits, n, R, out, block);
}

void sign_vote(const uint8_t* packed, int64_t n, int64_t R, float scale, float* out) {
  std::vector<float> tables(2 * R);
  for (int64_t r = 0; r < R; ++r) tables[2 * r] = -1.0f, tables[2 * r + 1] = 1.0f;
  unpack_sum_impl<1>(packed, n, tables.data(), R, out, [scale](float* o, int64_t m) {
#pragma omp simd
    for (int64_t i = 0; i < m; ++i)  // branch-free: the signs are random
      o[i] = static_cast<float>(static_cast<int>(o[i] > 0.0f) - static_cast<int>(o[i] < 0.0f)) * scale;
  });
}

namespace {
// kFlips[byte][j]: the sign bit where bit j of byte (the highest first) is clear, else 0: a
// scale's bits xor it are the scale or its negation (exactly, NaN included).
const auto kFlips = [] {
  std::array<std::array<uint32_t, 8>, 256> t{};
  for (int b = 0; b < 256; ++b)
    for (int j = 0; j < 8; ++j) t[b][j] = (b >> (7 - j)) & 1 ? 0u : 0x80000000u;
  return t;
}();

// One payload's part of a block: o[i - i0] += +-means[i / run] for i in [i0, i0 + m).
HVDC_INLINE void runs_body(const uint8_t* p, const float* means, int64_t i0, int64_t m, int64_t run, float* o) {
  for (int64_t i = i0; i < i0 + m;) {  // one run (or the block's part of it) at a time
    const int64_t end = std::min(i0 + m, (i / run + 1) * run);
    const uint32_t s = bits_of(means[i / run]);
    for (; i < end && (i & 7); ++i) o[i - i0] += float_of(s ^ kFlips[p[i >> 3]][i & 7]);
    for (; i + 8 <= end; i += 8) {  // whole bytes: s or -s by the byte's 8 bits
      const uint32_t* flip = kFlips[p[i >> 3]].data();
      float* oi = o + (i - i0);
      for (int j = 0; j < 8; ++j) oi[j] += float_of(s ^ flip[j]);
    }
    for (; i < end; ++i) o[i - i0] += float_of(s ^ kFlips[p[i >> 3]][i & 7]);
  }
}
HVDC_WIDE(runs_block, (const uint8_t* p, const float* means, int64_t i0, int64_t m, int64_t run, float* o),
          runs_body(p, means, i0, m, run, o))
}  // namespace

void sign_runs_sum(const uint8_t* packed, const float* means, int64_t n, int64_t run, int64_t R,
                   float* out) {
  if (run < 1) throw std::invalid_argument("sign_runs_sum: run must be >= 1");
  const int64_t runs = (n + run - 1) / run, nbytes = packed_bytes(n, 1);
  const bool stream = n >= kStreamMin;
  parallel_for((n + kBlock - 1) / kBlock, kBlock, [&](int64_t k0, int64_t k1) {
    alignas(64) float o[kBlock];
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t i0 = k * kBlock, m = std::min(kBlock, n - i0);
      for (int64_t i = 0; i < m; ++i) o[i] = 0.0f;
      for (int64_t r = 0; r < R; ++r) runs_block(packed + r * nbytes, means + r * runs, i0, m, run, o);
      store_block(out + i0, o, m, stream);
    }
    stream_fence(stream);
  });
}

void minmax_unpack_sum(const uint8_t* codes, const float* bounds, int64_t n, int64_t chunk, int bits,
                       int64_t R, float* out) {
  check_minmax("minmax_unpack_sum", chunk, bits);
  const int64_t chunks = (n + chunk - 1) / chunk, nbytes = packed_bytes(n, bits);
  const float top = static_cast<float>((1 << bits) - 1);
  parallel_for(chunks, chunk, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t i0 = c * chunk, m = std::min(chunk, n - i0);
      float* o = out + i0;
      for (int64_t i = 0; i < m; ++i) o[i] = 0.0f;
      for (int64_t r = 0; r < R; ++r) {
        const float mn = bounds[2 * (r * chunks + c)], mx = bounds[2 * (r * chunks + c) + 1];
        const float step = (mx - mn) / top;
        const uint8_t* q = codes + r * nbytes + i0 * bits / 8;
        if (bits == 8) {
          for (int64_t i = 0; i < m; ++i) o[i] += mn + static_cast<float>(q[i]) * step;
        } else {
          for (int64_t i = 0; i < m; ++i) o[i] += mn + static_cast<float>((q[i / 2] >> (4 - 4 * (i % 2))) & 15) * step;
        }
      }
    }
  });
}

void scatter_add_i32(const float* values, const int32_t* indices, int64_t m, int64_t n, float* out) {
  scatter_add_impl(values, indices, m, n, out);
}

void scatter_add_i64(const float* values, const int64_t* indices, int64_t m, int64_t n, float* out) {
  scatter_add_impl(values, indices, m, n, out);
}

}  // namespace hvdc
