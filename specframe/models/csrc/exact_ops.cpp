// Shape-invariant attention and SiLU for the exact forward (specframe.models.exact).
//
// Why not torch's kernels: the CPU SDPA picks its query and key blocks from the number of
// queries and keys, calls BLAS with that block as n, and runs a vector body plus a scalar tail
// whose split moves with the key count; an element-wise op's vector body and scalar tail (and
// its thread split) move with the tensor's size. The same token alone and inside a tree then
// sums in different orders, and a float32 near-tie flips.
//
// Here every output element has one fixed recipe that depends only on what the row may see:
//   * attention, for one query row and head: the visible keys are gathered in logical order
//     (ascending cache index: the prefix, then the row's ancestors root to self); each score
//     is one dot product over the head dimension (16 lanes, then a fixed pairwise fold); one
//     exp per score (the vector exp below, applied lane by lane, the tail padded); the
//     normaliser is summed in 16 lanes keyed by the key's logical index and folded in a fixed
//     order; the output accumulates p_j v_j key by key in logical order and is divided by the
//     normaliser once. Invisible keys (masked, padding, other sequences) are never touched.
//   * silu: x / (1 + exp(-x)) with the same vector exp, 16 elements at a time, the tail padded.
// Work is split between threads by whole rows (attention) or 16-element blocks (silu); a
// thread computes its outputs with the same recipe, so the thread count changes nothing.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

namespace {

constexpr int kLanes = 16;

template <typename T>
struct Vec {
  typedef T type __attribute__((vector_size(kLanes * sizeof(T))));
};

template <typename T>
using vec_t = typename Vec<T>::type;

// exp for 16 lanes at once, each lane alone: Cody-Waite reduction by ln 2 and a degree-6
// polynomial (float) or the C library's exp (double, used by tests only). Lanes below the
// underflow bound give 0; no lane reads another.
inline vec_t<float> vexp(vec_t<float> x) {
  const float lo = -87.33654f, hi = 88.72283f;
  vec_t<float> out;
  vec_t<float> n, r;
  for (int i = 0; i < kLanes; ++i) {
    float xi = x[i] < lo ? lo : (x[i] > hi ? hi : x[i]);
    n[i] = __builtin_rintf(xi * 1.44269504088896341f);
    r[i] = xi - n[i] * 0.693359375f;
    r[i] = r[i] + n[i] * 2.12194440e-4f;
  }
  vec_t<float> p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  for (int i = 0; i < kLanes; ++i) {
    int32_t bits = (static_cast<int32_t>(n[i]) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof(scale));
    out[i] = x[i] < lo ? 0.0f : p[i] * scale;
  }
  return out;
}

inline vec_t<double> vexp(vec_t<double> x) {
  vec_t<double> out;
  for (int i = 0; i < kLanes; ++i) out[i] = std::exp(x[i]);
  return out;
}

// The 16 lanes of v summed pairwise: (0+8, 1+9, ...), then 4 apart, 2 apart, 1 apart.
template <typename T>
inline T fold(vec_t<T> v) {
  T a[kLanes];
  std::memcpy(a, &v, sizeof(a));
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int i = 0; i < width; ++i) a[i] = a[i] + a[i + width];
  return a[0];
}

template <typename T>
inline vec_t<T> load(const T* p, int64_t n) {  // n <= kLanes: zero-padded
  vec_t<T> v = vec_t<T>{};
  std::memcpy(&v, p, n * sizeof(T));
  return v;
}

// q . k over d elements: full 16-lane blocks, the tail zero-padded into one more block.
template <typename T>
inline T dot(const T* q, const T* k, int64_t d) {
  vec_t<T> acc = vec_t<T>{};
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    vec_t<T> a, b;
    std::memcpy(&a, q + i, sizeof(a));
    std::memcpy(&b, k + i, sizeof(b));
    acc += a * b;
  }
  if (i < d) acc += load(q + i, d - i) * load(k + i, d - i);
  return fold<T>(acc);
}

struct Strides {
  int64_t b, h, s;
};

inline Strides strides_of(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

template <typename T>
void attend_row(const T* q, int64_t d, const std::vector<int64_t>& keys, const T* k, Strides ks,
                const T* v, Strides vs, T scale, std::vector<T>& p, std::vector<T>& acc, T* out) {
  const int64_t n = static_cast<int64_t>(keys.size());
  p.assign(((n + kLanes - 1) / kLanes) * kLanes, T(0));
  T top = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    p[j] = dot<T>(q, k + keys[j] * ks.s, d) * scale;
    top = p[j] > top ? p[j] : top;
  }
  vec_t<T> total = vec_t<T>{};
  for (int64_t j = 0; j < n; j += kLanes) {
    vec_t<T> s;
    std::memcpy(&s, p.data() + j, sizeof(s));
    vec_t<T> e = vexp(s - top);
    for (int64_t i = n - j; i < kLanes; ++i) e[i] = T(0);  // padding lanes add nothing
    std::memcpy(p.data() + j, &e, sizeof(e));
    total += e;
  }
  const T norm = fold<T>(total);
  // One vector accumulator per 16 output elements (the last one zero-padded), so every element
  // takes the same vector multiply-add whatever the head dimension.
  const int64_t blocks = (d + kLanes - 1) / kLanes;
  acc.assign(blocks * kLanes, T(0));
  vec_t<T>* a = reinterpret_cast<vec_t<T>*>(acc.data());
  for (int64_t j = 0; j < n; ++j) {
    const T* vj = v + keys[j] * vs.s;
    const T pj = p[j];
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t width = std::min<int64_t>(kLanes, d - blk * kLanes);
      vec_t<T> vv;
      if (width == kLanes) std::memcpy(&vv, vj + blk * kLanes, sizeof(vv));
      else vv = load(vj + blk * kLanes, width);
      vec_t<T> cur;
      std::memcpy(&cur, a + blk, sizeof(cur));
      cur += pj * vv;
      std::memcpy(a + blk, &cur, sizeof(cur));
    }
  }
  for (int64_t i = 0; i < d; ++i) out[i] = acc[i] / norm;
}

// query [B, Hq, Q, D], key/value [B, Hkv, S, D] (last dim contiguous), mask bool [Bm, 1, Q, S]
// (Bm 1 or B; broadcast strides allowed) or none with `causal` (row i sees keys < S - Q + i + 1)
// or all keys. Returns [B, Q, Hq, D], the layout transformers' attention functions return.
template <typename T>
at::Tensor attention_impl(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                          const std::optional<at::Tensor>& mask, double scale, bool causal) {
  const int64_t B = query.size(0), Hq = query.size(1), Q = query.size(2), D = query.size(3);
  const int64_t Hkv = key.size(1), S = key.size(2);
  TORCH_CHECK(Hq % Hkv == 0, "exact attention: query heads are not a multiple of key/value heads");
  TORCH_CHECK(query.stride(3) == 1 && key.stride(3) == 1 && value.stride(3) == 1,
              "exact attention: the head dimension must be contiguous");
  const int64_t group = Hq / Hkv;
  auto out = at::empty({B, Q, Hq, D}, query.options());
  const T* qp = query.data_ptr<T>();
  const T* kp = key.data_ptr<T>();
  const T* vp = value.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const Strides qs = strides_of(query), ks = strides_of(key), vs = strides_of(value);
  const bool* mp = nullptr;
  int64_t mb = 0, mq = 0, mk = 0;
  if (mask && mask->defined()) {
    TORCH_CHECK(mask->scalar_type() == at::kBool && mask->dim() == 4 && mask->size(1) == 1,
                "exact attention: a bool mask [batch, 1, queries, keys]");
    TORCH_CHECK(mask->size(2) == Q && mask->size(3) == S, "exact attention: the mask does not match queries x keys");
    mp = mask->data_ptr<bool>();
    mb = mask->size(0) == 1 ? 0 : mask->stride(0);
    mq = mask->stride(2);
    mk = mask->stride(3);
  }
  const T sc = static_cast<T>(scale);
  at::parallel_for(0, B * Q, 1, [&](int64_t first, int64_t last) {
    std::vector<int64_t> keys;
    std::vector<T> p, acc;
    keys.reserve(S);
    for (int64_t row = first; row < last; ++row) {
      const int64_t b = row / Q, i = row % Q;
      keys.clear();
      if (mp) {
        const bool* m = mp + b * mb + i * mq;
        for (int64_t j = 0; j < S; ++j)
          if (m[j * mk]) keys.push_back(j);
      } else {
        const int64_t seen = causal ? S - Q + i + 1 : S;
        for (int64_t j = 0; j < seen; ++j) keys.push_back(j);
      }
      for (int64_t h = 0; h < Hq; ++h) {
        T* o = op + ((b * Q + i) * Hq + h) * D;
        if (keys.empty()) {  // a padding row sees nothing: zeros, never read
          std::memset(o, 0, D * sizeof(T));
          continue;
        }
        const int64_t g = h / group;
        attend_row<T>(qp + b * qs.b + h * qs.h + i * qs.s, D, keys, kp + b * ks.b + g * ks.h, ks,
                      vp + b * vs.b + g * vs.h, vs, sc, p, acc, o);
      }
    }
  });
  return out;
}

at::Tensor attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                     const std::optional<at::Tensor>& mask, double scale, bool causal) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, "exact attention: 4-D query, key, value");
  TORCH_CHECK(query.scalar_type() == key.scalar_type() && key.scalar_type() == value.scalar_type(),
              "exact attention: query, key and value of one dtype");
  TORCH_CHECK(query.device().is_cpu(), "exact attention: CPU tensors (no GPU kernel yet)");
  if (query.scalar_type() == at::kFloat) return attention_impl<float>(query, key, value, mask, scale, causal);
  TORCH_CHECK(query.scalar_type() == at::kDouble, "exact attention: float32 or float64");
  return attention_impl<double>(query, key, value, mask, scale, causal);
}

template <typename T>
void silu_impl(const T* x, T* y, int64_t n) {
  at::parallel_for(0, (n + kLanes - 1) / kLanes, 64, [&](int64_t first, int64_t last) {
    for (int64_t blk = first; blk < last; ++blk) {
      const int64_t i = blk * kLanes, width = std::min<int64_t>(kLanes, n - i);
      vec_t<T> v = load(x + i, width);
      vec_t<T> r = v / (T(1) + vexp(-v));
      std::memcpy(y + i, &r, width * sizeof(T));
    }
  });
}

at::Tensor silu(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu(), "exact silu: a CPU tensor");
  const auto xc = x.contiguous();
  auto y = at::empty_like(xc);
  if (xc.scalar_type() == at::kFloat) {
    silu_impl<float>(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel());
  } else {
    TORCH_CHECK(xc.scalar_type() == at::kDouble, "exact silu: float32 or float64");
    silu_impl<double>(xc.data_ptr<double>(), y.data_ptr<double>(), xc.numel());
  }
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attention", &attention, "Row-by-row attention over the visible keys in logical order",
        py::arg("query"), py::arg("key"), py::arg("value"), py::arg("mask"), py::arg("scale"), py::arg("causal"));
  m.def("silu", &silu, "x / (1 + exp(-x)), one fixed recipe per element");
}
