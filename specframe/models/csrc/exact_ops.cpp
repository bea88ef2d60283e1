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
//     is one dot product over the head dimension (one register of lanes, then a fixed
//     halving fold); one exp per score (the vector exp below, lane by lane, the tail padded);
//     the normaliser is summed in lanes keyed by the key's logical index and folded once; the
//     output accumulates p_j v_j key by key in logical order and is divided by the normaliser
//     once. Invisible keys (masked, padding, other sequences) are never touched.
//   * silu: x / (1 + exp(-x)) with the same vector exp, a register at a time, the tail padded.
// A work unit is a tile of query rows and the query heads of one key/value head; head
// dimensions of 2, 4, 8 or 16 registers keep q and the output sum in registers, others go
// through memory with the same per-element arithmetic.
// Threads split whole units (attention) or registers (silu), so the thread count changes nothing.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

namespace {

// One SIMD register of floats (8 on AVX2; GCC splits or widens it for other targets).
template <typename T>
struct Vec {
  static constexpr int lanes = 32 / sizeof(T);
  typedef T type __attribute__((vector_size(32)));
};
template <typename T>
using vec_t = typename Vec<T>::type;
typedef int32_t vec_i32 __attribute__((vector_size(32)));

// acc + a * b, one fused multiply-add where the CPU has FMA (the build never fuses on its own).
inline vec_t<float> fmadd(vec_t<float> a, vec_t<float> b, vec_t<float> acc) {
#if defined(__FMA__)
  return _mm256_fmadd_ps(a, b, acc);
#else
  return acc + a * b;
#endif
}

inline vec_t<double> fmadd(vec_t<double> a, vec_t<double> b, vec_t<double> acc) { return acc + a * b; }

// x in every lane.
inline vec_t<float> splat(float x) {
#if defined(__AVX__)
  return _mm256_set1_ps(x);
#else
  return vec_t<float>{} + x;
#endif
}

inline vec_t<double> splat(double x) { return vec_t<double>{} + x; }

template <typename T>
inline vec_t<T> load(const T* p) {
  vec_t<T> v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <typename T>
inline vec_t<T> load_part(const T* p, int64_t n) {  // n <= lanes: zero-padded
  vec_t<T> v = vec_t<T>{};
  std::memcpy(&v, p, n * sizeof(T));
  return v;
}

// exp lane by lane: Cody-Waite reduction by ln 2 and Cephes' degree-6 polynomial (float), the C
// library's exp (double, tests only). Lanes below the underflow bound give 0; no lane reads
// another, so an element's exp does not depend on its neighbours.
inline vec_t<float> vexp(vec_t<float> x) {
  const vec_t<float> lo = vec_t<float>{} - 87.33654f, hi = vec_t<float>{} + 88.37626f;
  const vec_t<float> magic = vec_t<float>{} + 12582912.0f;  // 1.5 * 2^23: rounds to an integer
  vec_t<float> xc = x < lo ? lo : (x > hi ? hi : x);
  vec_t<float> n = (xc * 1.44269504088896341f + magic) - magic;
  vec_t<float> r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  vec_t<float> p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  vec_i32 bits = (__builtin_convertvector(n, vec_i32) + 127) << 23;
  vec_t<float> scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  vec_t<float> out = p * scale;
  return x < lo ? vec_t<float>{} : out;
}

inline vec_t<double> vexp(vec_t<double> x) {
  vec_t<double> out;
  for (int i = 0; i < Vec<double>::lanes; ++i) out[i] = std::exp(x[i]);
  return out;
}

// The lanes of v summed in a fixed tree: halves, then quarters, then pairs.
inline float hsum(vec_t<float> v) {
  v += __builtin_shuffle(v, vec_i32{4, 5, 6, 7, 0, 1, 2, 3});
  v += __builtin_shuffle(v, vec_i32{2, 3, 0, 1, 6, 7, 4, 5});
  return v[0] + v[1];
}

inline double hsum(vec_t<double> v) { return (v[0] + v[2]) + (v[1] + v[3]); }

// q . k over d elements: whole registers in order, the tail zero-padded into one more.
template <typename T>
inline T dot(const T* q, const T* k, int64_t d) {
  constexpr int L = Vec<T>::lanes;
  vec_t<T> acc = vec_t<T>{};
  int64_t i = 0;
  for (; i + L <= d; i += L) acc = fmadd(load(q + i), load(k + i), acc);
  if (i < d) acc = fmadd(load_part(q + i, d - i), load_part(k + i, d - i), acc);
  return hsum(acc);
}

// out[0, d) += p * v[0, d), one register at a time (the tail zero-padded), so every element
// takes the same multiply-add whatever d.
template <typename T>
inline void axpy(T* out, T p, const T* v, int64_t d) {
  constexpr int L = Vec<T>::lanes;
  int64_t i = 0;
  for (; i + L <= d; i += L) {
    vec_t<T> o = fmadd(splat(p), load(v + i), load(out + i));
    std::memcpy(out + i, &o, sizeof(o));
  }
  if (i < d) {
    vec_t<T> o = fmadd(splat(p), load_part(v + i, d - i), load_part(out + i, d - i));
    std::memcpy(out + i, &o, (d - i) * sizeof(T));
  }
}

struct Strides {
  int64_t b, h, s;
};

inline Strides strides_of(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

constexpr int64_t kRowTile = 8;  // query rows per work unit

// The scores of one (row, head): q . k_j * scale for each visible key j, in logical order. NB
// registers hold q across the keys (NB = 0: any head dimension, q read from memory); every
// path computes each score with dot(), the same arithmetic.
template <typename T, int NB>
void scores(const T* q, const T* kbase, int64_t kstride, const int64_t* keys, int64_t n, int64_t d, T scale, T* s) {
  constexpr int L = Vec<T>::lanes;
  if constexpr (NB == 0) {
    for (int64_t j = 0; j < n; ++j) s[j] = dot<T>(q, kbase + keys[j] * kstride, d) * scale;
  } else {
    vec_t<T> qv[NB];
    for (int i = 0; i < NB; ++i) qv[i] = load(q + i * L);
    for (int64_t j = 0; j < n; ++j) {
      const T* k = kbase + keys[j] * kstride;
      vec_t<T> acc = vec_t<T>{};
      for (int i = 0; i < NB; ++i) acc = fmadd(qv[i], load(k + i * L), acc);
      s[j] = hsum(acc) * scale;
    }
  }
}

// out = sum_j p_j v_j over the visible keys in logical order, divided by norm; NB registers
// hold the sum (NB = 0: any head dimension, through axpy), the same arithmetic either way.
template <typename T, int NB>
void weighted_values(const T* p, const T* vbase, int64_t vstride, const int64_t* keys, int64_t n, int64_t d,
                     T norm, T* scratch, T* out) {
  constexpr int L = Vec<T>::lanes;
  if constexpr (NB == 0) {
    std::fill(scratch, scratch + d, T(0));
    for (int64_t j = 0; j < n; ++j) axpy<T>(scratch, p[j], vbase + keys[j] * vstride, d);
    for (int64_t i = 0; i < d; ++i) out[i] = scratch[i] / norm;
  } else {
    vec_t<T> acc[NB];
    for (int i = 0; i < NB; ++i) acc[i] = vec_t<T>{};
    for (int64_t j = 0; j < n; ++j) {
      const T* v = vbase + keys[j] * vstride;
      for (int i = 0; i < NB; ++i) acc[i] = fmadd(splat(p[j]), load(v + i * L), acc[i]);
    }
    for (int i = 0; i < NB; ++i) {
      vec_t<T> o = acc[i] / norm;
      std::memcpy(out + i * L, &o, sizeof(o));
    }
  }
}

template <typename T>
using ScoresFn = void (*)(const T*, const T*, int64_t, const int64_t*, int64_t, int64_t, T, T*);
template <typename T>
using ValuesFn = void (*)(const T*, const T*, int64_t, const int64_t*, int64_t, int64_t, T, T*, T*);

// One work unit: query rows [r0, r1) of batch b against key/value head g, for its `group` query
// heads. Each (row, head) visits the keys its row sees in ascending (logical) order, so its
// arithmetic is that of the row alone.
template <typename T>
struct Unit {
  const T *qp, *kp, *vp;
  Strides qs, ks, vs;
  const bool* mp;
  int64_t mb, mq, mk;
  int64_t Q, S, D, Hq, group;
  bool causal;
  T scale;
  T* op;
  ScoresFn<T> score_fn;
  ValuesFn<T> value_fn;

  void visible(int64_t b, int64_t i, std::vector<int64_t>& keys) const {
    keys.clear();
    if (mp) {
      const bool* m = mp + b * mb + i * mq;
      for (int64_t j = 0; j < S; ++j)
        if (m[j * mk]) keys.push_back(j);
    } else {
      const int64_t seen = causal ? S - Q + i + 1 : S;
      for (int64_t j = 0; j < seen; ++j) keys.push_back(j);
    }
  }

  void run(int64_t b, int64_t g, int64_t r0, int64_t r1, std::vector<int64_t>& keys, std::vector<T>& p,
           std::vector<T>& scratch) const {
    constexpr int L = Vec<T>::lanes;
    const T* kbase = kp + b * ks.b + g * ks.h;
    const T* vbase = vp + b * vs.b + g * vs.h;
    scratch.resize(D);
    for (int64_t i = r0; i < r1; ++i) {
      visible(b, i, keys);
      const int64_t n = static_cast<int64_t>(keys.size());
      p.assign(((n + L - 1) / L) * L, T(0));
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        T* o = op + ((b * Q + i) * Hq + h) * D;
        if (n == 0) {  // a row that sees nothing (padding): zeros, never read
          std::fill(o, o + D, T(0));
          continue;
        }
        score_fn(qp + b * qs.b + h * qs.h + i * qs.s, kbase, ks.s, keys.data(), n, D, scale, p.data());
        T top = p[0];
        for (int64_t j = 1; j < n; ++j) top = p[j] > top ? p[j] : top;
        // Softmax weights; their sum in lanes keyed by the key's logical index, folded once.
        vec_t<T> total = vec_t<T>{};
        for (int64_t j = 0; j < n; j += L) {
          vec_t<T> e = vexp(load(p.data() + j) - top);
          for (int64_t lane = n - j; lane < L; ++lane) e[lane] = T(0);  // past the last key
          std::memcpy(p.data() + j, &e, sizeof(e));
          total += e;
        }
        value_fn(p.data(), vbase, vs.s, keys.data(), n, D, hsum(total), scratch.data(), o);
      }
    }
  }
};

template <typename T>
std::pair<ScoresFn<T>, ValuesFn<T>> kernels_for(int64_t d) {
  constexpr int L = Vec<T>::lanes;
  switch (d % L == 0 ? d / L : 0) {
    case 2: return {&scores<T, 2>, &weighted_values<T, 2>};
    case 4: return {&scores<T, 4>, &weighted_values<T, 4>};
    case 8: return {&scores<T, 8>, &weighted_values<T, 8>};
    case 16: return {&scores<T, 16>, &weighted_values<T, 16>};
    default: return {&scores<T, 0>, &weighted_values<T, 0>};
  }
}

// query [B, Hq, Q, D], key/value [B, Hkv, S, D] (last dim contiguous), mask bool [Bm, 1, Q, S]
// (Bm 1 or B; broadcast strides allowed) or none with `causal` (row i sees keys <= S - Q + i)
// or all keys. Returns [B, Q, Hq, D], the layout transformers' attention functions return.
template <typename T>
at::Tensor attention_impl(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                          const std::optional<at::Tensor>& mask, double scale, bool causal) {
  const int64_t B = query.size(0), Hq = query.size(1), Q = query.size(2), D = query.size(3);
  const int64_t Hkv = key.size(1), S = key.size(2);
  TORCH_CHECK(Hq % Hkv == 0, "exact attention: query heads are not a multiple of key/value heads");
  TORCH_CHECK(query.stride(3) == 1 && key.stride(3) == 1 && value.stride(3) == 1,
              "exact attention: the head dimension must be contiguous");
  auto out = at::empty({B, Q, Hq, D}, query.options());
  Unit<T> u{query.data_ptr<T>(), key.data_ptr<T>(), value.data_ptr<T>(), strides_of(query), strides_of(key),
            strides_of(value), nullptr, 0, 0, 0, Q, S, D, Hq, Hq / Hkv, causal, static_cast<T>(scale),
            out.data_ptr<T>(), kernels_for<T>(D).first, kernels_for<T>(D).second};
  if (mask && mask->defined()) {
    TORCH_CHECK(mask->scalar_type() == at::kBool && mask->dim() == 4 && mask->size(1) == 1,
                "exact attention: a bool mask [batch, 1, queries, keys]");
    TORCH_CHECK(mask->size(2) == Q && mask->size(3) == S, "exact attention: the mask does not match queries x keys");
    u.mp = mask->data_ptr<bool>();
    u.mb = mask->size(0) == 1 ? 0 : mask->stride(0);
    u.mq = mask->stride(2);
    u.mk = mask->stride(3);
  }
  const int64_t tiles = (Q + kRowTile - 1) / kRowTile;
  at::parallel_for(0, B * Hkv * tiles, 1, [&](int64_t first, int64_t last) {
    std::vector<T> p, scratch;
    std::vector<int64_t> keys;
    keys.reserve(S);
    for (int64_t unit = first; unit < last; ++unit) {
      const int64_t t = unit % tiles, g = (unit / tiles) % Hkv, b = unit / (tiles * Hkv);
      u.run(b, g, t * kRowTile, std::min(Q, (t + 1) * kRowTile), keys, p, scratch);
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
  constexpr int L = Vec<T>::lanes;
  at::parallel_for(0, (n + L - 1) / L, 256, [&](int64_t first, int64_t last) {
    for (int64_t blk = first; blk < last; ++blk) {
      const int64_t i = blk * L, width = std::min<int64_t>(L, n - i);
      const vec_t<T> v = width == L ? load(x + i) : load_part(x + i, width);
      const vec_t<T> r = v / (T(1) + vexp(-v));
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
