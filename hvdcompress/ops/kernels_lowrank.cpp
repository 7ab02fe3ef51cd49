// PowerSGD's low-rank products of kernels.h (lowrank_project, lowrank_project_back,
// lowrank_residual); semantics: kernels.h.
#include "kernels_common.h"

namespace hvdc {
namespace {

// q (cols x r, row-major) transposed: row k of the result is column k of q.
inline std::vector<float> transposed(const float* q, int64_t cols, int64_t r) {
  std::vector<float> qt(static_cast<size_t>(r * cols));
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t k = 0; k < r; ++k) qt[k * cols + j] = q[j * r + k];
  return qt;
}

// ---- PowerSGD blocks: len <= kBlock columns of one row; qt is q transposed (row stride cols).
// Elementwise in float32 (the same results with or without AVX2); dot products use 8 fixed
// lanes summed in lane order, whatever the vector width.
HVDC_ISA_CLONES void project_block(const float* eb, const float* gb, float* mb, const float* qt,
                                   int64_t cols, int64_t r, int64_t len, double* dot) {
  if (gb != nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) mb[j] = eb[j] + gb[j];
  } else if (mb != eb) {
    std::memcpy(mb, eb, static_cast<size_t>(len) * sizeof(float));
  }
  for (int64_t k = 0; k < r; ++k) {
    const float* qk = qt + k * cols;
    float lane[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int64_t j = 0;
    for (; j + 8 <= len; j += 8)
      for (int l = 0; l < 8; ++l) lane[l] += mb[j + l] * qk[j + l];
    float s = 0.0f;
    for (int l = 0; l < 8; ++l) s += lane[l];
    for (; j < len; ++j) s += mb[j] * qk[j];
    dot[k] += s;
  }
}

// acc[k * kBlock + j] += p_i[k] * mb[j]
HVDC_ISA_CLONES void back_block(float* acc, const float* p_i, const float* mb, int64_t r, int64_t len) {
  for (int64_t k = 0; k < r; ++k) {
    const float pk = p_i[k];
    float* ak = acc + k * kBlock;
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) ak[j] += pk * mb[j];
  }
}

// out[j] = row[j] - sum_k p_i[k] * qt[k][j], non-finite results stored as 0 (out may be row)
HVDC_ISA_CLONES void residual_block(const float* row, const float* p_i, const float* qt, int64_t cols,
                                    int64_t r, int64_t len, float* out) {
  alignas(64) float acc[kBlock];
#pragma omp simd
  for (int64_t j = 0; j < len; ++j) acc[j] = p_i[0] * qt[j];
  for (int64_t k = 1; k < r; ++k) {
    const float pk = p_i[k];
    const float* qk = qt + k * cols;
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) acc[j] += pk * qk[j];
  }
#pragma omp simd
  for (int64_t j = 0; j < len; ++j) out[j] = finite_or_zero(row[j] - acc[j]);
}

}  // namespace

void lowrank_project(const float* e, const float* g, const float* q, int64_t rows, int64_t cols,
                     int64_t r, float* m, float* p) {
  if (rows < 0 || cols < 0 || r < 1)
    throw std::invalid_argument("lowrank_project: need rows >= 0, cols >= 0, r >= 1");
  const std::vector<float> qt = transposed(q, cols, r);
  parallel_for(rows, cols, [&](int64_t i0, int64_t i1) {
    std::vector<double> dot(static_cast<size_t>(r));
    for (int64_t i = i0; i < i1; ++i) {
      std::fill(dot.begin(), dot.end(), 0.0);
      for (int64_t j0 = 0; j0 < cols; j0 += kBlock)
        project_block(e + i * cols + j0, g ? g + i * cols + j0 : nullptr, m + i * cols + j0, qt.data() + j0,
                      cols, r, std::min(kBlock, cols - j0), dot.data());
      for (int64_t k = 0; k < r; ++k) p[i * r + k] = static_cast<float>(dot[k]);
    }
  });
}

void lowrank_project_back(const float* m, const float* p, int64_t rows, int64_t cols, int64_t r,
                          float* q) {
  if (rows < 0 || cols < 0 || r < 1)
    throw std::invalid_argument("lowrank_project_back: need rows >= 0, cols >= 0, r >= 1");
  const int64_t blocks = (cols + kBlock - 1) / kBlock;
  // Each thread owns whole column blocks, so every q[j, k] is summed over the rows in order.
  parallel_for(blocks, rows * kBlock, [&](int64_t b0, int64_t b1) {
    std::vector<float> acc(static_cast<size_t>(r * kBlock));
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t j0 = b * kBlock, len = std::min(kBlock, cols - j0);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t i = 0; i < rows; ++i) back_block(acc.data(), p + i * r, m + i * cols + j0, r, len);
      for (int64_t j = 0; j < len; ++j)
        for (int64_t k = 0; k < r; ++k) q[(j0 + j) * r + k] = acc[k * kBlock + j];
    }
  });
}

void lowrank_residual(const float* m, const float* p, const float* q, int64_t rows, int64_t cols, int64_t r,
                      float* out) {
  if (rows < 0 || cols < 0 || r < 1)
    throw std::invalid_argument("lowrank_residual: need rows >= 0, cols >= 0, r >= 1");
  const std::vector<float> qt = transposed(q, cols, r);
  parallel_for(rows, cols, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t j0 = 0; j0 < cols; j0 += kBlock)
        residual_block(m + i * cols + j0, p + i * r, qt.data() + j0, cols, r, std::min(kBlock, cols - j0),
                       out + i * cols + j0);
  });
}

}  // namespace hvdc
