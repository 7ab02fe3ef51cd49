// Thin torch binding of kernels.h: checks the tensors, allocates outputs, releases the GIL and
// calls the raw kernel. Argument semantics are those of hvdcompress.backend.Ops.
#include <torch/extension.h>

#include "kernels.h"

namespace {

using torch::Tensor;

void check(const Tensor& t, torch::ScalarType dtype, const char* what) {
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, what, " must be ", c10::toString(dtype), ", got ",
                   c10::toString(t.scalar_type()));
  TORCH_CHECK_VALUE(t.device().is_cpu(), what, " must be a CPU tensor");
  TORCH_CHECK_VALUE(t.is_contiguous(), what, " must be contiguous");
}

Tensor bytes(int64_t count, const Tensor& like) {
  return torch::empty({count}, like.options().dtype(torch::kUInt8));
}

Tensor floats(int64_t count, const Tensor& like) {
  return torch::empty({count}, like.options().dtype(torch::kFloat32));
}

// A decoder's output: the caller's buffer `out` (checked: float32, contiguous, `count` elements)
// or a new one.
Tensor output(const c10::optional<Tensor>& out, int64_t count, const Tensor& like) {
  if (!out) return floats(count, like);
  check(*out, torch::kFloat32, "out");
  TORCH_CHECK_VALUE(out->numel() == count, "out has ", out->numel(), " elements; the result has ", count);
  return *out;
}

// R payloads of `each` elements back to back; returns R.
int64_t payloads(const Tensor& t, int64_t each, const char* what) {
  TORCH_CHECK_VALUE(each > 0 && t.numel() % each == 0 && t.numel() > 0, what, " has ", t.numel(),
                    " elements, not a positive multiple of ", each);
  return t.numel() / each;
}

std::tuple<Tensor, Tensor> sign_pack(const Tensor& x) {
  check(x, torch::kFloat32, "x");
  Tensor out = bytes(hvdc::packed_bytes(x.numel(), 1), x);
  double total;
  {
    pybind11::gil_scoped_release nogil;
    total = hvdc::sign_pack(x.data_ptr<float>(), x.numel(), out.data_ptr<uint8_t>());
  }
  const float mean = x.numel() ? static_cast<float>(total / static_cast<double>(x.numel())) : 0.0f;
  return {out, torch::full({1}, mean, x.options())};
}

std::tuple<Tensor, Tensor> ef_sign_pack(const Tensor& x, Tensor residual) {
  check(x, torch::kFloat32, "x");
  check(residual, torch::kFloat32, "residual");
  TORCH_CHECK_VALUE(residual.numel() == x.numel(), "residual has ", residual.numel(),
                    " elements, x has ", x.numel());
  Tensor out = bytes(hvdc::packed_bytes(x.numel(), 1), x);
  float scale;
  {
    pybind11::gil_scoped_release nogil;
    scale = hvdc::ef_sign_pack(x.data_ptr<float>(), residual.data_ptr<float>(), x.numel(),
                               out.data_ptr<uint8_t>());
  }
  return {out, torch::full({1}, scale, x.options())};
}

Tensor twobit_pack(const Tensor& x, double threshold, c10::optional<Tensor> residual) {
  check(x, torch::kFloat32, "x");
  float* res = nullptr;
  if (residual) {
    check(*residual, torch::kFloat32, "residual");
    TORCH_CHECK_VALUE(residual->numel() == x.numel(), "residual has ", residual->numel(),
                      " elements, x has ", x.numel());
    res = residual->data_ptr<float>();
  }
  Tensor out = bytes(hvdc::packed_bytes(x.numel(), 2), x);
  pybind11::gil_scoped_release nogil;
  hvdc::twobit_pack(x.data_ptr<float>(), res, x.numel(), static_cast<float>(threshold),
                    out.data_ptr<uint8_t>());
  return out;
}

Tensor levels_pack(const Tensor& x, double inv, int64_t levels, bool natural, int64_t key) {
  check(x, torch::kFloat32, "x");
  TORCH_CHECK_VALUE(levels >= 1 && levels <= 127, "levels=", levels, " is outside [1, 127]");
  Tensor out = bytes(x.numel(), x);
  pybind11::gil_scoped_release nogil;
  hvdc::levels_pack(x.data_ptr<float>(), x.numel(), static_cast<float>(inv), static_cast<int>(levels),
                    natural, static_cast<uint32_t>(key), out.data_ptr<uint8_t>());
  return out;
}

Tensor ternary_pack(const Tensor& x, double inv, int64_t key) {
  check(x, torch::kFloat32, "x");
  Tensor out = bytes(hvdc::packed_bytes(x.numel(), 2), x);
  pybind11::gil_scoped_release nogil;
  hvdc::ternary_pack(x.data_ptr<float>(), x.numel(), static_cast<float>(inv),
                     static_cast<uint32_t>(key), out.data_ptr<uint8_t>());
  return out;
}

Tensor natural_pack(const Tensor& x, int64_t key) {
  check(x, torch::kFloat32, "x");
  Tensor out = bytes(x.numel(), x);
  pybind11::gil_scoped_release nogil;
  hvdc::natural_pack(x.data_ptr<float>(), x.numel(), static_cast<uint32_t>(key), out.data_ptr<uint8_t>());
  return out;
}

Tensor unpack_sum(const Tensor& packed, int64_t n, int64_t bits, const Tensor& tables,
                  const c10::optional<Tensor>& out_) {
  check(packed, torch::kUInt8, "packed");
  check(tables, torch::kFloat32, "tables");
  TORCH_CHECK_VALUE(bits == 1 || bits == 2 || bits == 8, "bits=", bits, "; allowed: 1, 2, 8");
  TORCH_CHECK_VALUE(n >= 1, "n=", n, " must be >= 1");
  const int64_t R = payloads(packed, hvdc::packed_bytes(n, static_cast<int>(bits)), "packed");
  TORCH_CHECK_VALUE(tables.numel() == (R << bits), "tables has ", tables.numel(), " entries; ", R,
                    " payloads of ", bits, "-bit codes need ", (R << bits));
  Tensor out = output(out_, n, tables);
  pybind11::gil_scoped_release nogil;
  hvdc::unpack_sum(packed.data_ptr<uint8_t>(), n, static_cast<int>(bits), tables.data_ptr<float>(),
                   R, out.data_ptr<float>());
  return out;
}

Tensor bf16_sum(const Tensor& bits, int64_t n, const c10::optional<Tensor>& out_) {
  check(bits, torch::kInt16, "bits");
  TORCH_CHECK_VALUE(n >= 1, "n=", n, " must be >= 1");
  const int64_t R = payloads(bits, n, "bits");
  Tensor out = output(out_, n, bits);
  pybind11::gil_scoped_release nogil;
  hvdc::bf16_sum(reinterpret_cast<const uint16_t*>(bits.data_ptr<int16_t>()), n, R, out.data_ptr<float>());
  return out;
}

Tensor sign_vote(const Tensor& packed, int64_t n, double scale, const c10::optional<Tensor>& out_) {
  check(packed, torch::kUInt8, "packed");
  TORCH_CHECK_VALUE(n >= 1, "n=", n, " must be >= 1");
  const int64_t R = payloads(packed, hvdc::packed_bytes(n, 1), "packed");
  Tensor out = output(out_, n, packed);
  pybind11::gil_scoped_release nogil;
  hvdc::sign_vote(packed.data_ptr<uint8_t>(), n, R, static_cast<float>(scale), out.data_ptr<float>());
  return out;
}

std::tuple<Tensor, Tensor> minmax_pack(const Tensor& x, int64_t chunk) {
  check(x, torch::kFloat32, "x");
  TORCH_CHECK_VALUE(chunk >= 1, "chunk=", chunk, " must be >= 1");
  Tensor codes = bytes(x.numel(), x);
  Tensor bounds = floats(2 * ((x.numel() + chunk - 1) / chunk), x);
  pybind11::gil_scoped_release nogil;
  hvdc::minmax_pack(x.data_ptr<float>(), x.numel(), chunk, codes.data_ptr<uint8_t>(), bounds.data_ptr<float>());
  return {codes, bounds};
}

Tensor minmax_unpack_sum(const Tensor& codes, const Tensor& bounds, int64_t n, int64_t chunk,
                         const c10::optional<Tensor>& out_) {
  check(codes, torch::kUInt8, "codes");
  check(bounds, torch::kFloat32, "bounds");
  TORCH_CHECK_VALUE(chunk >= 1 && n >= 1, "need n >= 1 and chunk >= 1, got n=", n, ", chunk=", chunk);
  const int64_t R = payloads(codes, n, "codes");
  const int64_t chunks = (n + chunk - 1) / chunk;
  TORCH_CHECK_VALUE(bounds.numel() == 2 * chunks * R, "bounds has ", bounds.numel(), " entries; ", R,
                    " payloads of ", chunks, " chunks need ", 2 * chunks * R);
  Tensor out = output(out_, n, bounds);
  pybind11::gil_scoped_release nogil;
  hvdc::minmax_unpack_sum(codes.data_ptr<uint8_t>(), bounds.data_ptr<float>(), n, chunk, R,
                          out.data_ptr<float>());
  return out;
}

Tensor max_abs(const Tensor& x) {
  check(x, torch::kFloat32, "x");
  float m;
  {
    pybind11::gil_scoped_release nogil;
    m = hvdc::max_abs(x.data_ptr<float>(), x.numel());
  }
  return torch::full({}, m, x.options());
}

int64_t count_ge(const Tensor& x, double t) {
  check(x, torch::kFloat32, "x");
  pybind11::gil_scoped_release nogil;
  return hvdc::count_ge(x.data_ptr<float>(), x.numel(), static_cast<float>(t));
}

// One compaction pass into a guessed capacity, again with the exact count if the guess was short.
std::tuple<Tensor, Tensor> select_ge(const Tensor& x, double t) {
  check(x, torch::kFloat32, "x");
  int64_t cap = std::min<int64_t>(x.numel(), std::max<int64_t>(1024, x.numel() / 64));
  for (;;) {
    Tensor values = floats(cap, x);
    Tensor indices = torch::empty({cap}, x.options().dtype(torch::kInt64));
    int64_t total;
    {
      pybind11::gil_scoped_release nogil;
      total = hvdc::select_ge(x.data_ptr<float>(), x.numel(), static_cast<float>(t), cap,
                              values.data_ptr<float>(), indices.data_ptr<int64_t>());
    }
    if (total <= cap) return {values.narrow(0, 0, total), indices.narrow(0, 0, total)};
    cap = total;
  }
}

double sampled_threshold(const Tensor& x, int64_t start, int64_t stride, int64_t top) {
  check(x, torch::kFloat32, "x");
  pybind11::gil_scoped_release nogil;
  return hvdc::sampled_threshold(x.data_ptr<float>(), x.numel(), start, stride, top);
}

std::tuple<Tensor, Tensor> topk_abs(const Tensor& x, int64_t k) {
  check(x, torch::kFloat32, "x");
  TORCH_CHECK_VALUE(k >= 0 && k <= x.numel(), "k=", k, " is outside [0, ", x.numel(), "]");
  Tensor values = floats(k, x);
  Tensor indices = torch::empty({k}, x.options().dtype(torch::kInt64));
  pybind11::gil_scoped_release nogil;
  hvdc::topk_abs(x.data_ptr<float>(), x.numel(), k, values.data_ptr<float>(), indices.data_ptr<int64_t>());
  return {values, indices};
}

Tensor scatter_add(int64_t n, const Tensor& indices, const Tensor& values,
                   const c10::optional<Tensor>& out_) {
  check(values, torch::kFloat32, "values");
  TORCH_CHECK_VALUE(n >= 0, "n=", n, " must be >= 0");
  TORCH_CHECK_VALUE(indices.numel() == values.numel(), "indices has ", indices.numel(),
                    " elements, values has ", values.numel());
  Tensor out = output(out_, n, values);
  if (indices.scalar_type() == torch::kInt32) {
    check(indices, torch::kInt32, "indices");
    pybind11::gil_scoped_release nogil;
    hvdc::scatter_add(values.data_ptr<float>(), indices.data_ptr<int32_t>(), values.numel(), n,
                      out.data_ptr<float>());
  } else {
    check(indices, torch::kInt64, "indices");
    pybind11::gil_scoped_release nogil;
    hvdc::scatter_add(values.data_ptr<float>(), indices.data_ptr<int64_t>(), values.numel(), n,
                      out.data_ptr<float>());
  }
  return out;
}

Tensor fill_at(Tensor x, const Tensor& indices, double value) {
  check(x, torch::kFloat32, "x");
  check(indices, torch::kInt64, "indices");
  pybind11::gil_scoped_release nogil;
  hvdc::fill_at(x.data_ptr<float>(), x.numel(), indices.data_ptr<int64_t>(), indices.numel(),
                static_cast<float>(value));
  return x;
}

Tensor sub_finite(const Tensor& a, const Tensor& b, const c10::optional<Tensor>& out_) {
  check(a, torch::kFloat32, "a");
  check(b, torch::kFloat32, "b");
  TORCH_CHECK_VALUE(a.numel() == b.numel(), "a has ", a.numel(), " elements, b has ", b.numel());
  Tensor out = output(out_, a.numel(), a);
  pybind11::gil_scoped_release nogil;
  hvdc::sub_finite(a.data_ptr<float>(), b.data_ptr<float>(), a.numel(), out.data_ptr<float>());
  return out;
}

void momentum_correction(const Tensor& g, Tensor u, Tensor v, double mu, bool nesterov) {
  check(g, torch::kFloat32, "g");
  check(u, torch::kFloat32, "u");
  check(v, torch::kFloat32, "v");
  TORCH_CHECK_VALUE(u.numel() == g.numel() && v.numel() == g.numel(), "g, u and v have ", g.numel(),
                    ", ", u.numel(), " and ", v.numel(), " elements; they must be equal");
  pybind11::gil_scoped_release nogil;
  hvdc::momentum_correction(g.data_ptr<float>(), u.data_ptr<float>(), v.data_ptr<float>(), g.numel(),
                            static_cast<float>(mu), nesterov);
}

// m (rows, cols), p (rows, r) and q (cols, r): checks dtypes, contiguity and that the shapes fit.
void check_lowrank(const Tensor& m, const Tensor& p, const Tensor& q, const char* what) {
  check(m, torch::kFloat32, "m");
  check(p, torch::kFloat32, "p");
  check(q, torch::kFloat32, "q");
  TORCH_CHECK_VALUE(m.dim() == 2 && p.dim() == 2 && q.dim() == 2 && p.size(0) == m.size(0) &&
                        q.size(0) == m.size(1) && p.size(1) == q.size(1) && p.size(1) >= 1,
                    what, ": shapes ", m.sizes(), ", ", p.sizes(), ", ", q.sizes(),
                    " do not fit m (rows, cols), p (rows, r), q (cols, r)");
}

// (m, p): m = e + g in place in e (g may be None), p = m q.
std::tuple<Tensor, Tensor> lowrank_project(Tensor e, const c10::optional<Tensor>& g, const Tensor& q) {
  Tensor p = torch::empty({e.size(0), q.size(1)}, q.options());
  check_lowrank(e, p, q, "lowrank_project");
  if (g) {
    check(*g, torch::kFloat32, "g");
    TORCH_CHECK_VALUE(g->numel() == e.numel(), "g has ", g->numel(), " elements, e has ", e.numel());
  }
  pybind11::gil_scoped_release nogil;
  hvdc::lowrank_project(e.data_ptr<float>(), g ? g->data_ptr<float>() : nullptr, q.data_ptr<float>(),
                        e.size(0), e.size(1), q.size(1), p.data_ptr<float>());
  return {e, p};
}

Tensor lowrank_project_back(const Tensor& m, const Tensor& p) {
  Tensor q = torch::empty({m.size(1), p.size(1)}, p.options());
  check_lowrank(m, p, q, "lowrank_project_back");
  pybind11::gil_scoped_release nogil;
  hvdc::lowrank_project_back(m.data_ptr<float>(), p.data_ptr<float>(), m.size(0), m.size(1), p.size(1),
                             q.data_ptr<float>());
  return q;
}

// m - p q^T in place in m (non-finite entries 0), returned flat.
Tensor lowrank_residual(Tensor m, const Tensor& p, const Tensor& q) {
  check_lowrank(m, p, q, "lowrank_residual");
  {
    pybind11::gil_scoped_release nogil;
    hvdc::lowrank_residual(m.data_ptr<float>(), p.data_ptr<float>(), q.data_ptr<float>(), m.size(0),
                           m.size(1), p.size(1));
  }
  return m.view({-1});
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "hvdcompress C++ kernels (see hvdcompress/ops/kernels.h and hvdcompress.backend.Ops)";
  m.def("sign_pack", &sign_pack);
  m.def("ef_sign_pack", &ef_sign_pack);
  m.def("twobit_pack", &twobit_pack);
  m.def("levels_pack", &levels_pack);
  m.def("ternary_pack", &ternary_pack);
  m.def("natural_pack", &natural_pack);
  m.def("unpack_sum", &unpack_sum, py::arg("packed"), py::arg("n"), py::arg("bits"), py::arg("tables"),
        py::arg("out") = py::none());
  m.def("bf16_sum", &bf16_sum, py::arg("bits"), py::arg("n"), py::arg("out") = py::none());
  m.def("sign_vote", &sign_vote, py::arg("packed"), py::arg("n"), py::arg("scale"), py::arg("out") = py::none());
  m.def("minmax_pack", &minmax_pack);
  m.def("minmax_unpack_sum", &minmax_unpack_sum, py::arg("codes"), py::arg("bounds"), py::arg("n"),
        py::arg("chunk"), py::arg("out") = py::none());
  m.def("max_abs", &max_abs);
  m.def("count_ge", &count_ge);
  m.def("select_ge", &select_ge);
  m.def("sampled_threshold", &sampled_threshold);
  m.def("topk_abs", &topk_abs);
  m.def("scatter_add", &scatter_add, py::arg("n"), py::arg("indices"), py::arg("values"),
        py::arg("out") = py::none());
  m.def("momentum_correction", &momentum_correction);
  m.def("fill_at", &fill_at);
  m.def("sub_finite", &sub_finite, py::arg("a"), py::arg("b"), py::arg("out") = py::none());
  m.def("lowrank_project", &lowrank_project);
  m.def("lowrank_project_back", &lowrank_project_back);
  m.def("lowrank_residual", &lowrank_residual);
}
