// The state updates of kernels.h: error feedback (sub_finite), DGC's momentum correction and
// its fused selection (dgc_select), fill_at; semantics: kernels.h.
#include "kernels_common.h"

namespace hvdc {
namespace {

HVDC_ISA_CLONES void sub_finite_block(const float* a, const float* b, int64_t m, float* out) {
#pragma omp simd
  for (int64_t j = 0; j < m; ++j) out[j] = finite_or_zero(a[j] - b[j]);
}

}  // namespace

void sub_finite(const float* a, const float* b, int64_t n, float* out) {
  parallel_blocks(n, [=](int64_t i0, int64_t m) { sub_finite_block(a + i0, b + i0, m, out + i0); });
}

// u' = m, v' = v + m (+ g) over [b, e); the arithmetic of kernels.h, one element at a time.
template <bool kNesterov>
HVDC_INLINE void momentum_elements(const float* g, const float* u, const float* v, int64_t b, int64_t e,
                                   float mu, float* u_out, float* v_out) {
#pragma omp simd
  for (int64_t i = b; i < e; ++i) {
    const float m = kNesterov ? (u[i] + g[i]) * mu : u[i] * mu + g[i];
    v_out[i] = kNesterov ? (v[i] + m) + g[i] : v[i] + m;
    u_out[i] = m;
  }
}

// Into outputs other than u and v (TensorFlow's tensors are immutable): streaming stores, which
// skip reading each output line before writing it (7 memory streams become 5, as in place). The
// same operations as momentum_elements, four lanes at a time, so the bits are the same.
template <bool kNesterov>
void momentum_streamed(const float* g, const float* u, const float* v, int64_t b, int64_t e, float mu,
                       float* u_out, float* v_out) {
#if defined(__SSE2__)
  int64_t i = b;
  const int64_t head = std::min(e, b + static_cast<int64_t>(((16 - reinterpret_cast<uintptr_t>(u_out + b) % 16) % 16) / 4));
  momentum_elements<kNesterov>(g, u, v, b, head, mu, u_out, v_out);
  const __m128 m4 = _mm_set1_ps(mu);
  for (i = head; i + 4 <= e; i += 4) {
    const __m128 gi = _mm_loadu_ps(g + i), ui = _mm_loadu_ps(u + i), vi = _mm_loadu_ps(v + i);
    const __m128 m = kNesterov ? _mm_mul_ps(_mm_add_ps(ui, gi), m4) : _mm_add_ps(_mm_mul_ps(ui, m4), gi);
    _mm_stream_ps(v_out + i, kNesterov ? _mm_add_ps(_mm_add_ps(vi, m), gi) : _mm_add_ps(vi, m));
    _mm_stream_ps(u_out + i, m);
  }
  momentum_elements<kNesterov>(g, u, v, i, e, mu, u_out, v_out);
  _mm_sfence();
#else
  momentum_elements<kNesterov>(g, u, v, b, e, mu, u_out, v_out);
#endif
}

void momentum_correction(const float* g, const float* u, const float* v, int64_t n, float mu,
                         bool nesterov, float* u_out, float* v_out) {
  // streamed when the outputs are separate and equally aligned (both 16-byte steps from b)
  const bool stream = u_out != u && v_out != v && n >= kGrain &&
                      (reinterpret_cast<uintptr_t>(u_out) - reinterpret_cast<uintptr_t>(v_out)) % 16 == 0;
  parallel_for(n, 1, [&](int64_t b, int64_t e) {
    if (stream)
      nesterov ? momentum_streamed<true>(g, u, v, b, e, mu, u_out, v_out)
               : momentum_streamed<false>(g, u, v, b, e, mu, u_out, v_out);
    else
      nesterov ? momentum_elements<true>(g, u, v, b, e, mu, u_out, v_out)
               : momentum_elements<false>(g, u, v, b, e, mu, u_out, v_out);
  });
}

// ---- DGC: momentum correction fused with the selection ------------------------------------------
namespace {

// Where dgc_select's pass records the selected elements: the first `room` into the caller's
// values / indices, the later ones (when `keep_later`, a slice after the first) into lists, all
// of those cleared; with keep_later false, the later ones are only counted (not cleared). The u
// values it clears are kept, to be put back if the selection is not taken.
struct DgcSink {
  float* values = nullptr;
  int64_t* indices = nullptr;
  int64_t room = 0;
  bool keep_later = false;
  bool masking = false;
  int64_t count = 0;
  std::vector<int64_t> later_i;
  std::vector<float> later_v;
  std::vector<std::pair<int64_t, float>> cleared_u;

  // Records selected element i (v_new, u_new); returns whether it is cleared, and clears m, vn.
  HVDC_INLINE void take(int64_t i, float& vn, float& m) {
    if (count < room) {
      values[count] = vn;
      indices[count] = i;
    } else if (keep_later) {
      later_i.push_back(i);
      later_v.push_back(vn);
    } else {
      ++count;
      return;
    }
    ++count;
    vn = 0.0f;
    if (masking || !(m - m == 0.0f)) {
      cleared_u.emplace_back(i, m);
      m = 0.0f;
    }
  }
};

template <bool kNesterov>
HVDC_INLINE void dgc_values(float g, float u, float v, float mu, float& m, float& vn) {
  m = kNesterov ? (u + g) * mu : u * mu + g;
  vn = kNesterov ? (v + m) + g : v + m;
}

template <bool kNesterov>
HVDC_INLINE void dgc_elements(const float* g, const float* u, const float* v, int64_t b, int64_t e, float mu,
                              float t, float* u_out, float* v_out, DgcSink& sink) {
  for (int64_t i = b; i < e; ++i) {
    float m, vn;
    dgc_values<kNesterov>(g[i], u[i], v[i], mu, m, vn);
    if (selected(vn, t)) sink.take(i, vn, m);
    u_out[i] = m;
    v_out[i] = vn;
  }
}

// The pass over [b, e): scalar.
template <bool kNesterov, bool kStream>
void dgc_pass_scalar(const float* g, const float* u, const float* v, int64_t b, int64_t e, float mu, float t,
                     float* u_out, float* v_out, DgcSink& sink) {
  dgc_elements<kNesterov>(g, u, v, b, e, mu, t, u_out, v_out, sink);
}

#ifdef HVDC_F16C
// The vector registers of the SIMD pass: 8 lanes (AVX2) or 16 (AVX-512F). Each function carries
// its instruction set; the passes below are flattened into functions of the same one.
struct Lanes8 {
  using V = __m256;
  static constexpr int kWidth = 8;
  __attribute__((target("avx2"))) static V load(const float* p) { return _mm256_loadu_ps(p); }
  __attribute__((target("avx2"))) static V set1(float x) { return _mm256_set1_ps(x); }
  __attribute__((target("avx2"))) static V add(V a, V b) { return _mm256_add_ps(a, b); }
  __attribute__((target("avx2"))) static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  __attribute__((target("avx2"))) static void store(float* p, V a) { _mm256_storeu_ps(p, a); }
  __attribute__((target("avx2"))) static void stream(float* p, V a) { _mm256_stream_ps(p, a); }
  // bit j: lane j's |vn| >= t or NaN (selected())
  __attribute__((target("avx2"))) static unsigned selected(V vn, V t) {
    const V magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    return static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(vn, magnitude), t, _CMP_NLT_UQ)));
  }
};

struct Lanes16 {
  using V = __m512;
  static constexpr int kWidth = 16;
  __attribute__((target("avx512f"))) static V load(const float* p) { return _mm512_loadu_ps(p); }
  __attribute__((target("avx512f"))) static V set1(float x) { return _mm512_set1_ps(x); }
  __attribute__((target("avx512f"))) static V add(V a, V b) { return _mm512_add_ps(a, b); }
  __attribute__((target("avx512f"))) static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  __attribute__((target("avx512f"))) static void store(float* p, V a) { _mm512_storeu_ps(p, a); }
  __attribute__((target("avx512f"))) static void stream(float* p, V a) { _mm512_stream_ps(p, a); }
  __attribute__((target("avx512f"))) static unsigned selected(V vn, V t) {
    return _mm512_cmp_ps_mask(_mm512_abs_ps(vn), t, _CMP_NLT_UQ);
  }
};

// The pass over [b, e) in L::kWidth lanes, the same operations per element as dgc_elements;
// blocks holding a selected element go through a small buffer. kStream: u_out and v_out are
// separate from u and v and equally aligned (streaming stores from the first vector boundary of
// u_out).
// (Only ever flattened into dgc_pass_avx2 / dgc_pass_avx512, so the vector ABI of a separate
// copy, which GCC warns about, never applies.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
template <class L, bool kNesterov, bool kStream>
void dgc_pass_simd(const float* g, const float* u, const float* v, int64_t b, int64_t e, float mu, float t,
                   float* u_out, float* v_out, DgcSink& sink) {
  using V = typename L::V;
  constexpr int W = L::kWidth, kBytes = 4 * L::kWidth;
  int64_t i = b;
  if (kStream) {
    const int64_t head =
        std::min(e, b + static_cast<int64_t>(((kBytes - reinterpret_cast<uintptr_t>(u_out + b) % kBytes) % kBytes) / 4));
    dgc_elements<kNesterov>(g, u, v, b, head, mu, t, u_out, v_out, sink);
    i = head;
  }
  const V muv = L::set1(mu), tv = L::set1(t);
  for (; i + W <= e; i += W) {
    const V gi = L::load(g + i), ui = L::load(u + i), vi = L::load(v + i);
    V m = kNesterov ? L::mul(L::add(ui, gi), muv) : L::add(L::mul(ui, muv), gi);
    V vn = kNesterov ? L::add(L::add(vi, m), gi) : L::add(vi, m);
    unsigned mask = L::selected(vn, tv);
    if (mask) {
      alignas(64) float mb[W], vb[W];
      L::store(mb, m);
      L::store(vb, vn);
      for (; mask; mask &= mask - 1) {
        const int j = __builtin_ctz(mask);
        sink.take(i + j, vb[j], mb[j]);
      }
      m = L::load(mb);
      vn = L::load(vb);
    }
    if (kStream) {
      L::stream(u_out + i, m);
      L::stream(v_out + i, vn);
    } else {
      L::store(u_out + i, m);
      L::store(v_out + i, vn);
    }
  }
  dgc_elements<kNesterov>(g, u, v, i, e, mu, t, u_out, v_out, sink);
  if (kStream) _mm_sfence();
}
#pragma GCC diagnostic pop

template <bool kNesterov, bool kStream>
__attribute__((target("avx2"), flatten)) void dgc_pass_avx2(const float* g, const float* u, const float* v,
                                                           int64_t b, int64_t e, float mu, float t, float* u_out,
                                                           float* v_out, DgcSink& sink) {
  dgc_pass_simd<Lanes8, kNesterov, kStream>(g, u, v, b, e, mu, t, u_out, v_out, sink);
}

template <bool kNesterov, bool kStream>
__attribute__((target("avx512f"), flatten)) void dgc_pass_avx512(const float* g, const float* u, const float* v,
                                                                int64_t b, int64_t e, float mu, float t,
                                                                float* u_out, float* v_out, DgcSink& sink) {
  dgc_pass_simd<Lanes16, kNesterov, kStream>(g, u, v, b, e, mu, t, u_out, v_out, sink);
}
#endif

using DgcPass = void (*)(const float*, const float*, const float*, int64_t, int64_t, float, float, float*, float*,
                         DgcSink&);

// The pass for this CPU: [isa][nesterov][stream]; isa 0 scalar, 1 AVX2, 2 AVX-512F.
DgcPass dgc_pass(bool nesterov, bool stream) {
  const int isa = cpu_isa();
  static const DgcPass table[3][2][2] = {
      {{dgc_pass_scalar<false, false>, dgc_pass_scalar<false, true>},
       {dgc_pass_scalar<true, false>, dgc_pass_scalar<true, true>}},
#ifdef HVDC_F16C
      {{dgc_pass_avx2<false, false>, dgc_pass_avx2<false, true>},
       {dgc_pass_avx2<true, false>, dgc_pass_avx2<true, true>}},
      {{dgc_pass_avx512<false, false>, dgc_pass_avx512<false, true>},
       {dgc_pass_avx512<true, false>, dgc_pass_avx512<true, true>}},
#else
      {{nullptr, nullptr}, {nullptr, nullptr}},
      {{nullptr, nullptr}, {nullptr, nullptr}},
#endif
  };
  return table[isa][nesterov][stream];
}

// Step 1 of dgc_select: the threshold from v_new at the sample positions.
float dgc_threshold(const float* g, const float* u, const float* v, float mu, bool nesterov, int64_t start,
                    int64_t stride, int64_t count, int64_t top) {
  std::vector<uint32_t> keys(static_cast<size_t>(count));
  constexpr int64_t kAhead = 16;
  for (int64_t j = 0; j < count; ++j) {
    const int64_t i = start + j * stride;
    if (j + kAhead < count) {
      const int64_t a = i + kAhead * stride;
      __builtin_prefetch(g + a);
      __builtin_prefetch(u + a);
      __builtin_prefetch(v + a);
    }
    float m, vn;
    if (nesterov)
      dgc_values<true>(g[i], u[i], v[i], mu, m, vn);
    else
      dgc_values<false>(g[i], u[i], v[i], mu, m, vn);
    keys[j] = bits_of(vn) & 0x7FFFFFFFu;
  }
  std::nth_element(keys.begin(), keys.begin() + (top - 1), keys.end(), std::greater<uint32_t>());
  const uint32_t key = keys[top - 1];
  return key > 0x7F800000u ? INFINITY : float_of(key);
}

}  // namespace

int64_t dgc_select(const float* g, const float* u, const float* v, int64_t n, float mu, bool nesterov,
                   int64_t start, int64_t stride, int64_t top, int64_t cap, int64_t low, int64_t high,
                   bool masking, float* u_out, float* v_out, float* values, int64_t* indices, float* threshold) {
  if (stride < 1 || start < 0) throw std::invalid_argument("dgc_select: need start >= 0, stride >= 1");
  const int64_t samples = start < n ? (n - start + stride - 1) / stride : 0;
  if (top < 1 || top > samples)
    throw std::invalid_argument("dgc_select: top=" + std::to_string(top) + " is outside [1, " +
                                std::to_string(samples) + "]");
  if (cap < 0 || cap > n)
    throw std::invalid_argument("dgc_select: cap=" + std::to_string(cap) + " is outside [0, " + std::to_string(n) + "]");
  const float t = dgc_threshold(g, u, v, mu, nesterov, start, stride, samples, top);
  *threshold = t;
  // streamed when the outputs are separate and equally aligned (as momentum_correction)
  const bool stream = u_out != u && v_out != v && n >= kGrain &&
                      (reinterpret_cast<uintptr_t>(u_out) - reinterpret_cast<uintptr_t>(v_out)) % 64 == 0;
  const DgcPass pass = dgc_pass(nesterov, stream);
  const int slices = threads_for(n);
  std::vector<DgcSink> sinks(static_cast<size_t>(slices));
  for (int s = 0; s < slices; ++s) {
    sinks[s].masking = masking;
    sinks[s].keep_later = s > 0;
  }
  sinks[0].values = values;
  sinks[0].indices = indices;
  sinks[0].room = cap;
  run_slices(n, slices, [&](int s, int, int64_t b, int64_t e) { pass(g, u, v, b, e, mu, t, u_out, v_out, sinks[s]); });
  int64_t total = 0;
  for (const DgcSink& s : sinks) total += s.count;
  const bool taken = low <= total && total <= high;
  // Puts back what slice s cleared from its j-th recorded element on (all of it: from = 0).
  auto put_back = [&](DgcSink& s, int64_t from) {
    const int64_t direct = std::min(s.count, s.room);
    int64_t first = -1;  // the first index put back
    for (int64_t j = from; j < direct; ++j) {
      v_out[s.indices[j]] = s.values[j];
      if (first < 0) first = s.indices[j];
    }
    for (size_t j = static_cast<size_t>(std::max(from - direct, int64_t{0})); j < s.later_i.size(); ++j) {
      v_out[s.later_i[j]] = s.later_v[j];
      if (first < 0) first = s.later_i[j];
    }
    if (first >= 0)
      for (const auto& c : s.cleared_u)
        if (c.first >= first) u_out[c.first] = c.second;
  };
  if (!taken) {
    for (DgcSink& s : sinks) put_back(s, 0);
    return total;
  }
  int64_t w = sinks[0].count;  // slice 0 wrote its first min(count, cap) itself
  for (int s = 1; s < slices; ++s) {
    DgcSink& k = sinks[s];
    const int64_t fit = std::max<int64_t>(0, std::min<int64_t>(static_cast<int64_t>(k.later_i.size()), cap - w));
    for (int64_t j = 0; j < fit; ++j) {
      values[w + j] = k.later_v[j];
      indices[w + j] = k.later_i[j];
    }
    put_back(k, fit);
    w += k.count;
  }
  return total;
}

void fill_at(float* x, int64_t n, const int64_t* indices, int64_t m, float value, bool non_finite_only) {
  check_indices("fill_at", indices, m, n);
  // Sparse indices into a large x miss the cache at every element, and no hardware prefetcher
  // follows them: each target is prefetched kAhead elements early.
  constexpr int64_t kAhead = 48;
  parallel_for(m, 1, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      if (j + kAhead < e) __builtin_prefetch(x + indices[j + kAhead], 1);
      float& target = x[indices[j]];
      if (!non_finite_only || !(target - target == 0.0f)) target = value;  // NaN or +-inf
    }
  });
}

}  // namespace hvdc
