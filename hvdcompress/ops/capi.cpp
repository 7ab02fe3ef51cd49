// The kernels of kernels.h as a plain C ABI, for ctypes (hvdcompress/ops/native.py): no Python,
// torch or TensorFlow header, so the library builds and loads without any framework.
//
// Every function returns 0 on success; on a C++ exception it returns 1 (std::invalid_argument),
// 2 (std::out_of_range) or 3 (anything else), writes nothing, and hvdc_error() gives the message
// (per thread). Scalar results are written through the last pointer argument. Argument rules
// (sizes, dtypes) are checked by the caller; semantics are those of kernels.h.
#include <exception>
#include <stdexcept>
#include <string>

#include "kernels.h"

namespace {

thread_local std::string last_error;

template <class F>
int guarded(F f) {
  try {
    f();
    return 0;
  } catch (const std::invalid_argument& e) {
    last_error = e.what();
    return 1;
  } catch (const std::out_of_range& e) {
    last_error = e.what();
    return 2;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 3;
  }
}

}  // namespace

extern "C" {

const char* hvdc_error() { return last_error.c_str(); }

int hvdc_sign_pack(const float* x, int64_t n, uint8_t* out, double* sum_abs) {
  return guarded([&] { *sum_abs = hvdc::sign_pack(x, n, out); });
}

int hvdc_ef_sign_pack(const float* x, const float* residual, int64_t n, uint8_t* out, float* res_out,
                      float* scale) {
  return guarded([&] { *scale = hvdc::ef_sign_pack(x, residual, n, out, res_out); });
}

int hvdc_twobit_pack(const float* x, const float* residual, int64_t n, float t, uint8_t* out,
                     float* res_out) {
  return guarded([&] { hvdc::twobit_pack(x, residual, n, t, out, res_out); });
}

int hvdc_levels_pack(const float* x, int64_t n, float inv, int levels, int natural, uint32_t key,
                     uint8_t* out) {
  return guarded([&] { hvdc::levels_pack(x, n, inv, levels, natural != 0, key, out); });
}

int hvdc_ternary_pack(const float* x, int64_t n, float inv, uint32_t key, uint8_t* out) {
  return guarded([&] { hvdc::ternary_pack(x, n, inv, key, out); });
}

int hvdc_natural_pack(const float* x, int64_t n, uint32_t key, uint8_t* out) {
  return guarded([&] { hvdc::natural_pack(x, n, key, out); });
}

int hvdc_half_cast(const float* x, int64_t n, int bf16, uint16_t* out) {
  return guarded([&] { hvdc::half_cast(x, n, bf16 != 0, out); });
}

int hvdc_unpack_sum(const uint8_t* packed, int64_t n, int bits, const float* tables, int64_t R,
                    float* out) {
  return guarded([&] { hvdc::unpack_sum(packed, n, bits, tables, R, out); });
}

int hvdc_bf16_sum(const uint16_t* bits, int64_t n, int64_t R, float* out) {
  return guarded([&] { hvdc::bf16_sum(bits, n, R, out); });
}

int hvdc_sign_vote(const uint8_t* packed, int64_t n, int64_t R, float scale, float* out) {
  return guarded([&] { hvdc::sign_vote(packed, n, R, scale, out); });
}

int hvdc_minmax_pack(const float* x, int64_t n, int64_t chunk, uint8_t* codes, float* bounds) {
  return guarded([&] { hvdc::minmax_pack(x, n, chunk, codes, bounds); });
}

int hvdc_minmax_unpack_sum(const uint8_t* codes, const float* bounds, int64_t n, int64_t chunk,
                           int64_t R, float* out) {
  return guarded([&] { hvdc::minmax_unpack_sum(codes, bounds, n, chunk, R, out); });
}

int hvdc_max_abs(const float* x, int64_t n, float* result) {
  return guarded([&] { *result = hvdc::max_abs(x, n); });
}

int hvdc_l2_norm(const float* x, int64_t n, float* result) {
  return guarded([&] { *result = hvdc::l2_norm(x, n); });
}

int hvdc_count_ge(const float* x, int64_t n, float t, int64_t* result) {
  return guarded([&] { *result = hvdc::count_ge(x, n, t); });
}

int hvdc_select_ge(const float* x, int64_t n, float t, int64_t cap, float* values, int64_t* indices,
                   int64_t* total) {
  return guarded([&] { *total = hvdc::select_ge(x, n, t, cap, values, indices); });
}

int hvdc_sampled_threshold(const float* x, int64_t n, int64_t start, int64_t stride, int64_t top,
                           float* result) {
  return guarded([&] { *result = hvdc::sampled_threshold(x, n, start, stride, top); });
}

int hvdc_topk_abs(const float* x, int64_t n, int64_t k, float* values, int64_t* indices) {
  return guarded([&] { hvdc::topk_abs(x, n, k, values, indices); });
}

int hvdc_momentum_correction(const float* g, const float* u, const float* v, int64_t n, float mu,
                             int nesterov, float* u_out, float* v_out) {
  return guarded([&] { hvdc::momentum_correction(g, u, v, n, mu, nesterov != 0, u_out, v_out); });
}

int hvdc_sub_finite(const float* a, const float* b, int64_t n, float* out) {
  return guarded([&] { hvdc::sub_finite(a, b, n, out); });
}

int hvdc_lowrank_project(const float* e, const float* g, const float* q, int64_t rows, int64_t cols,
                         int64_t r, float* m, float* p) {
  return guarded([&] { hvdc::lowrank_project(e, g, q, rows, cols, r, m, p); });
}

int hvdc_lowrank_project_back(const float* m, const float* p, int64_t rows, int64_t cols, int64_t r,
                              float* q) {
  return guarded([&] { hvdc::lowrank_project_back(m, p, rows, cols, r, q); });
}

int hvdc_lowrank_residual(const float* m, const float* p, const float* q, int64_t rows, int64_t cols,
                          int64_t r, float* out) {
  return guarded([&] { hvdc::lowrank_residual(m, p, q, rows, cols, r, out); });
}

int hvdc_fill_at(float* x, int64_t n, const int64_t* indices, int64_t m, float value, int non_finite_only) {
  return guarded([&] { hvdc::fill_at(x, n, indices, m, value, non_finite_only != 0); });
}

int hvdc_scatter_add_i32(const float* values, const int32_t* indices, int64_t m, int64_t n, float* out) {
  return guarded([&] { hvdc::scatter_add(values, indices, m, n, out); });
}

int hvdc_scatter_add_i64(const float* values, const int64_t* indices, int64_t m, int64_t n, float* out) {
  return guarded([&] { hvdc::scatter_add(values, indices, m, n, out); });
}

}  // extern "C"
