// The reductions and selections of kernels.h: max |x|, the l2 norm, count and select >= t, the
// sampled threshold and the exact top-k; semantics: kernels.h.
#include "kernels_common.h"

namespace hvdc {
namespace {

// max over [0, m) of the magnitude keys bits(|x|) & 0x7FFFFFFF, which order like |x| with NaN
// above +inf. An integer max: exact in any order, so an ISA clone.
HVDC_ISA_CLONES uint32_t max_magnitude_key(const float* x, int64_t m) {
  uint32_t best = 0;
#pragma omp simd reduction(max : best)
  for (int64_t j = 0; j < m; ++j) {
    const uint32_t key = bits_of(x[j]) & 0x7FFFFFFFu;
    best = key > best ? key : best;
  }
  return best;
}

// *s = sum of x[j]^2 in double, in 16 lanes as lanes16_sum.
HVDC_INLINE void squares_body(const float* x, int64_t m, double* s) {
  *s = lanes16_sum(x, m, [](float v) { return static_cast<double>(v) * static_cast<double>(v); });
}

HVDC_WIDE(squares_block, (const float* x, int64_t m, double* s), squares_body(x, m, s))

// Counted in 32-bit lanes per chunk of 2^16 (vectorises on every SIMD width; an integer sum, so
// the clones agree), summed in 64 bits.
HVDC_ISA_CLONES int64_t count_selected(const float* x, int64_t b, int64_t e, float t) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  int64_t c = 0;
  for (int64_t i0 = b; i0 < e; i0 += kChunk) {
    const int64_t i1 = std::min(e, i0 + kChunk);
    int32_t chunk = 0;
#pragma omp simd reduction(+ : chunk)
    for (int64_t i = i0; i < i1; ++i) chunk += selected(x[i], t) ? 1 : 0;
    c += chunk;
  }
  return c;
}

// masks[g] bit j = selected(x[64 g + j], t), for g < groups: the selection's flags as bits.
void selected_masks(const float* x, int64_t groups, float t, uint64_t* masks) {
  for (int64_t g = 0; g < groups; ++g, x += 64) {
    uint64_t mask = 0;
#if defined(__SSE2__)
    const __m128 magnitude = _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF));
    const __m128 threshold = _mm_set1_ps(t);
    for (int q = 0; q < 16; ++q) {  // !(|x| < t): NaN is selected, as in selected()
      const __m128 a = _mm_and_ps(_mm_loadu_ps(x + 4 * q), magnitude);
      mask |= static_cast<uint64_t>(_mm_movemask_ps(_mm_cmpnlt_ps(a, threshold))) << (4 * q);
    }
#else
    for (int j = 0; j < 64; ++j) mask |= (selected(x[j], t) ? uint64_t{1} : 0) << j;
#endif
    masks[g] = mask;
  }
}

#ifdef HVDC_F16C
// selected_masks, eight lanes at a time (AVX2 CPUs).
__attribute__((target("avx2"))) void selected_masks_avx2(const float* x, int64_t groups, float t, uint64_t* masks) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 threshold = _mm256_set1_ps(t);
  for (int64_t g = 0; g < groups; ++g, x += 64) {
    uint64_t mask = 0;
    for (int q = 0; q < 8; ++q) {  // not-less-than, unordered: NaN is selected
      const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + 8 * q), magnitude);
      mask |= static_cast<uint64_t>(_mm256_movemask_ps(_mm256_cmp_ps(a, threshold, _CMP_NLT_UQ))) << (8 * q);
    }
    masks[g] = mask;
  }
}
#endif

using MasksFn = void (*)(const float*, int64_t, float, uint64_t*);

MasksFn masks_kernel() {
#ifdef HVDC_F16C
  static const MasksFn chosen = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? selected_masks_avx2 : selected_masks;
  }();
  return chosen;
#else
  return selected_masks;
#endif
}

// Calls f(i) for the selected i in [b, e), ascending: the flags of 4,096 elements at a time as
// bit masks (vectorised), then one call per set bit, so a sparse selection costs about one read
// of x.
template <class F>
HVDC_INLINE void for_each_selected(const float* x, int64_t b, int64_t e, float t, F f) {
  constexpr int64_t kGroups = 64;
  uint64_t masks[kGroups];
  const MasksFn fill = masks_kernel();
  int64_t i = b;
  while (i + 64 <= e) {
    const int64_t groups = std::min(kGroups, (e - i) / 64);
    fill(x + i, groups, t, masks);
    for (int64_t g = 0; g < groups; ++g, i += 64)
      for (uint64_t mask = masks[g]; mask; mask &= mask - 1) f(i + __builtin_ctzll(mask));
  }
  for (; i < e; ++i)
    if (selected(x[i], t)) f(i);
}

// ---- exact top-k (topk_abs) ----------------------------------------------------------------------
// Magnitude keys: the bits of |v|, which order like |v| with NaN above +inf (below 2^31).
inline uint32_t magnitude_key(float v) { return bits_of(v) & 0x7FFFFFFFu; }

constexpr int64_t kTopkStored = int64_t{1} << 16;  // candidates kept in memory: max(this, k / 4)
constexpr int kTopkLowBits = 15;  // topk_abs's first histogram counts the top 16 bits of a key ...
constexpr int kTopkSmallLowBits = 20;  // ... or 11 when n < kTopkStored (2048 counters)

// h[key >> shift] += 1 over the keys of x[0..m).
void top_histogram(const float* x, int64_t m, int shift, uint32_t* h) {
  for (int64_t i = 0; i < m; ++i) ++h[magnitude_key(x[i]) >> shift];
}

// h[key & (2^kTopkLowBits - 1)] += 1 over the keys of x[0..m) whose top 16 bits are `top`.
void low_histogram(const float* x, int64_t m, uint32_t top, uint32_t* h) {
  for (int64_t i = 0; i < m; ++i) {
    const uint32_t key = magnitude_key(x[i]);
    if ((key >> kTopkLowBits) == top) ++h[key & ((1u << kTopkLowBits) - 1)];
  }
}

// The bucket, counted from the top, that holds the need-th largest key of the slices'
// histograms (slice s at h + s * width); need becomes the key's rank within that bucket.
uint32_t rank_bucket(const uint32_t* h, int slices, uint32_t width, int64_t& need) {
  uint32_t bucket = width - 1;
  for (;; --bucket) {
    int64_t c = 0;
    for (int s = 0; s < slices; ++s) c += h[static_cast<size_t>(s) * width + bucket];
    if (c >= need || bucket == 0) return bucket;
    need -= c;
  }
}

// Calls f(i, key) for the i in [b, e) whose magnitude key is >= lo, ascending; like
// for_each_selected, only groups of 16 holding such a key are walked. Keys and lo are below 2^31,
// so the group test is a signed compare (vectorised on any x86-64).
template <class F>
HVDC_INLINE void for_each_key_from(const float* x, int64_t b, int64_t e, uint32_t lo, F f) {
  constexpr int kGroup = 16;
  const int32_t low = static_cast<int32_t>(lo);
  int64_t i = b;
  for (; i + kGroup <= e; i += kGroup) {
    int any = 0;
#pragma omp simd reduction(| : any)
    for (int j = 0; j < kGroup; ++j) any |= static_cast<int32_t>(magnitude_key(x[i + j])) >= low ? 1 : 0;
    if (!any) continue;
    for (int j = 0; j < kGroup; ++j) {
      const uint32_t key = magnitude_key(x[i + j]);
      if (key >= lo) f(i + j, key);
    }
  }
  for (; i < e; ++i) {
    const uint32_t key = magnitude_key(x[i]);
    if (key >= lo) f(i, key);
  }
}

// Keeps, in place and in their order, the `need` (1 <= need <= m) largest-keyed of the m
// candidates (v[j], idx[j]), ties to the earlier ones; returns need.
int64_t keep_largest(float* v, int64_t* idx, int64_t m, int64_t need) {
  if (need == m) return m;
  std::vector<uint32_t> keys(static_cast<size_t>(m));
  for (int64_t j = 0; j < m; ++j) keys[j] = magnitude_key(v[j]);
  std::nth_element(keys.begin(), keys.begin() + (need - 1), keys.end(), std::greater<uint32_t>());
  const uint32_t kth = keys[need - 1];
  int64_t ties = need;  // how many keys equal to kth are kept: need - #(keys > kth)
  for (int64_t j = 0; j < m; ++j) ties -= keys[j] > kth ? 1 : 0;
  int64_t w = 0;
  for (int64_t j = 0; j < m; ++j) {
    const uint32_t key = magnitude_key(v[j]);
    if (key > kth || (key == kth && ties-- > 0)) {
      v[w] = v[j];
      idx[w++] = idx[j];
    }
  }
  return w;
}

}  // namespace

// ---- reductions --------------------------------------------------------------------------------
float max_abs(const float* x, int64_t n) {
  uint32_t part[kMaxThreads] = {0};
  const int slices = threads_for(n);
  run_slices(n, slices, [&](int t, int, int64_t b, int64_t e) { part[t] = max_magnitude_key(x + b, e - b); });
  uint32_t m = 0;
  for (int t = 0; t < slices; ++t) m = std::max(m, part[t]);
  return m > 0x7F800000u ? std::nanf("") : float_of(m);  // keys above +inf's are NaNs
}

float l2_norm(const float* x, int64_t n) {
  const double total = block_sum(n, [&](int64_t i0, int64_t m) {
    double s;
    squares_block(x + i0, m, &s);
    return s;
  });
  return static_cast<float>(std::sqrt(total));
}

// ---- sparsification ---------------------------------------------------------------------------
int64_t count_ge(const float* x, int64_t n, float t) {
  return static_cast<int64_t>(parallel_sum(n, 1, [&](int64_t b, int64_t e) {
    return static_cast<double>(count_selected(x, b, e, t));
  }));
}

int64_t select_ge(const float* x, int64_t n, float t, int64_t cap, float* values, int64_t* indices) {
  const int threads = threads_for(n);
  std::vector<int64_t> offset(threads + 1, 0);
  if (threads > 1) {  // order-preserving: each slice writes from the count of the slices before
    run_slices(n, threads, [&](int th, int, int64_t b, int64_t e) { offset[th + 1] = count_selected(x, b, e, t); });
    for (int th = 0; th < threads; ++th) offset[th + 1] += offset[th];
  }
  int64_t total = 0;
  run_slices(n, threads, [&](int th, int, int64_t b, int64_t e) {
    int64_t w = offset[th];
    for_each_selected(x, b, e, t, [&](int64_t i) {
      if (w < cap) {
        values[w] = x[i];
        indices[w] = i;
      }
      ++w;
    });
    if (th == threads - 1) total = w;
  });
  return total;
}

float sampled_threshold(const float* x, int64_t n, int64_t start, int64_t stride, int64_t top) {
  if (stride < 1 || start < 0) throw std::invalid_argument("sampled_threshold: need start >= 0, stride >= 1");
  const int64_t count = start < n ? (n - start + stride - 1) / stride : 0;
  if (top < 1 || top > count)
    throw std::invalid_argument("sampled_threshold: top=" + std::to_string(top) + " is outside [1, " +
                                std::to_string(count) + "]");
  std::vector<uint32_t> keys(count);
  for (int64_t j = 0; j < count; ++j) keys[j] = bits_of(x[start + j * stride]) & 0x7FFFFFFFu;
  std::nth_element(keys.begin(), keys.begin() + (top - 1), keys.end(), std::greater<uint32_t>());
  return float_of(keys[top - 1]);
}

// Two passes over x. Pass 1: per-slice histograms of the keys' top 16 bits (11 when n < 2^16,
// where 2^16 counters would cost more than the data); their totals give the bucket `top` that
// holds the k-th largest key, and `need`, that key's rank within it. Pass 2: each slice writes
// its keys above `top` (all taken) to the output and its keys in `top` (the candidates) to a
// buffer, both from the counts of the slices before it, so that both lists ascend. The `need`
// largest candidates (nth_element; ties to the lower index) are then merged into the output from
// the back. Memory: 256 KiB of counters per slice, and the candidates, which are kept only when
// there are at most max(2^16, k / 4) of them (always when n < 2^16; for smooth data a bucket,
// 1/256 of an octave, holds few). Otherwise (many equal or nearly equal magnitudes, e.g. zeros)
// a second pass counts the low 15 bits within `top`, which gives the k-th key exactly, and a
// third takes the keys above it and the first `need` equal to it.
void topk_abs(const float* x, int64_t n, int64_t k, float* values, int64_t* indices) {
  if (k < 0 || k > n)
    throw std::invalid_argument("topk_abs: k=" + std::to_string(k) + " is outside [0, " + std::to_string(n) + "]");
  if (k == 0) return;
  // Slices of fewer than 2^31 elements: uint32 counters.
  const int slices = static_cast<int>(std::max<int64_t>(threads_for(n), ((n - 1) >> 31) + 1));
  const int shift = n < kTopkStored ? kTopkSmallLowBits : kTopkLowBits;
  const uint32_t width = 1u << (31 - shift);
  std::vector<uint32_t> hist(static_cast<size_t>(slices) * width, 0);
  run_slices(n, slices, [&](int s, int, int64_t b, int64_t e) {
    top_histogram(x + b, e - b, shift, hist.data() + static_cast<size_t>(s) * width);
  });
  int64_t need = k;
  const uint32_t top = rank_bucket(hist.data(), slices, width, need);
  std::vector<int64_t> above(slices + 1, 0), in_top(slices + 1, 0);  // prefix sums over slices
  for (int s = 0; s < slices; ++s) {
    const uint32_t* h = hist.data() + static_cast<size_t>(s) * width;
    above[s + 1] = above[s] + std::accumulate(h + top + 1, h + width, int64_t{0});
    in_top[s + 1] = in_top[s] + h[top];
  }
  const int64_t count = in_top[slices];
  if (count <= std::max(kTopkStored, k / 4)) {
    std::vector<float> cand_v(static_cast<size_t>(count));
    std::vector<int64_t> cand_i(static_cast<size_t>(count));
    const uint32_t lo = top << shift, hi = lo + (1u << shift);
    run_slices(n, slices, [&](int s, int, int64_t b, int64_t e) {
      int64_t w = above[s], c = in_top[s];
      for_each_key_from(x, b, e, lo, [&](int64_t i, uint32_t key) {
        if (key >= hi) {
          values[w] = x[i];
          indices[w++] = i;
        } else {
          cand_v[c] = x[i];
          cand_i[c++] = i;
        }
      });
    });
    int64_t a = k - need - 1, c = keep_largest(cand_v.data(), cand_i.data(), count, need) - 1, w = k - 1;
    while (c >= 0) {  // merge the two ascending lists from the back, in place
      if (a >= 0 && indices[a] > cand_i[c]) {
        values[w] = values[a];
        indices[w--] = indices[a--];
      } else {
        values[w] = cand_v[c];
        indices[w--] = cand_i[c--];
      }
    }
    return;
  }
  constexpr uint32_t low_width = 1u << kTopkLowBits;
  std::vector<uint32_t> low(static_cast<size_t>(slices) * low_width, 0);
  run_slices(n, slices, [&](int s, int, int64_t b, int64_t e) {
    low_histogram(x + b, e - b, top, low.data() + static_cast<size_t>(s) * low_width);
  });
  const uint32_t low_bucket = rank_bucket(low.data(), slices, low_width, need);
  const uint32_t kth = (top << kTopkLowBits) | low_bucket;  // take every key > kth, the first `need` == kth
  std::vector<int64_t> offset(slices), take(slices);
  int64_t pos = 0, left = need;
  for (int s = 0; s < slices; ++s) {
    const uint32_t* h = low.data() + static_cast<size_t>(s) * low_width;
    take[s] = std::min<int64_t>(left, h[low_bucket]);
    left -= take[s];
    offset[s] = pos;
    pos += above[s + 1] - above[s] + std::accumulate(h + low_bucket + 1, h + low_width, int64_t{0}) + take[s];
  }
  run_slices(n, slices, [&](int s, int, int64_t b, int64_t e) {
    int64_t w = offset[s], ties = take[s];
    for_each_key_from(x, b, e, kth, [&](int64_t i, uint32_t key) {
      if (key > kth || ties-- > 0) {
        values[w] = x[i];
        indices[w++] = i;
      }
    });
  });
}

}  // namespace hvdc
