// y = x W^T (+ b) in float32 for the few rows of a tree forward, compiled for the CPU at hand.
//
// Why not MKL or oneDNN: at 16 rows their GEMMs run at about a third of this CPU's arithmetic
// peak while the weights stream from memory, so a 16-token forward costs far more than a
// 1-token one although both read the same weights. Here the weight is packed once into panels
// of one vector of output columns laid out k-major ([panel][k][lanes]), so one pass over a panel is one
// sequential stream; each 64-byte weight vector feeds one fused multiply-add per row, and a
// software prefetch keeps the stream running while the arithmetic of the rows goes on.
//
// Every output is summed over k in the same order whatever the row count, so a row's result
// does not depend on how many rows share the call (no batch-size-dependent rounding).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

namespace {

// A panel is one vector register of output columns: 16 floats with AVX-512, 8 with AVX2 (a
// 64-byte generic vector on AVX2 is lowered through memory, 5-10x slower than F.linear).
#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
constexpr int kTileRows = 16;  // 32 vector registers: 16 accumulators, the weight, spare
#else
constexpr int64_t kLanes = 8;
constexpr int kTileRows = 12;  // 16 registers: 12 accumulators, the weight, the broadcast row
#endif
constexpr int64_t kPrefetchRows = 8192 / (kLanes * 4);  // panel rows the prefetch runs ahead: 8 KiB

typedef float vec __attribute__((vector_size(kLanes * 4)));

// x in every lane.
inline vec splat(float x) {
#if defined(__AVX512F__)
  return _mm512_set1_ps(x);
#elif defined(__AVX__)
  return _mm256_set1_ps(x);
#else
  return vec{} + x;
#endif
}

// acc + x * w, fused where the CPU has FMA (always the same instruction for every tile).
inline vec fmadd(vec x, vec w, vec acc) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(x, w, acc);
#elif defined(__FMA__)
  return _mm256_fmadd_ps(x, w, acc);
#else
  return acc + x * w;
#endif
}

at::Tensor pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat, "pack: a 2-D float32 weight");
  const auto w = weight.contiguous();
  const int64_t n_out = w.size(0), k_in = w.size(1), panels = (n_out + kLanes - 1) / kLanes;
  auto packed = at::zeros({panels, k_in, kLanes}, w.options());
  const float* src = w.data_ptr<float>();
  float* dst = packed.data_ptr<float>();
  for (int64_t n = 0; n < n_out; ++n)
    for (int64_t k = 0; k < k_in; ++k) dst[((n / kLanes) * k_in + k) * kLanes + n % kLanes] = src[n * k_in + k];
  return packed;
}

// Rows [0, R) of one row tile against one panel; xt is x transposed ([k][rows]).
template <int R>
void tile(const float* xt, int64_t rows, const float* panel, int64_t k_in, bool prefetch, float* y,
          int64_t n_out, int64_t col, const float* bias) {
  vec acc[R];
  for (int m = 0; m < R; ++m) acc[m] = vec{};
  for (int64_t k = 0; k < k_in; ++k) {
    // Into L2 only: the lines are read once, and L1 keeps x.
    if (prefetch) __builtin_prefetch(panel + (k + kPrefetchRows) * kLanes, 0, 1);
    vec w;
    std::memcpy(&w, panel + k * kLanes, sizeof(vec));
    const float* xk = xt + k * rows;
#pragma GCC unroll 16
    for (int m = 0; m < R; ++m) acc[m] = fmadd(splat(xk[m]), w, acc[m]);
  }
  const int64_t width = std::min(kLanes, n_out - col);
  for (int m = 0; m < R; ++m) {
    float* out = y + m * n_out + col;
    for (int64_t j = 0; j < width; ++j) out[j] = acc[m][j] + (bias ? bias[col + j] : 0.0f);
  }
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, bool, float*, int64_t, int64_t, const float*);

template <int... R>
constexpr std::array<TileFn, sizeof...(R)> tile_table(std::integer_sequence<int, R...>) {
  return {&tile<R + 1>...};
}
constexpr auto kTiles = tile_table(std::make_integer_sequence<int, kTileRows>{});

typedef int32_t ivec __attribute__((vector_size(kLanes * 4)));

bool any_lane(const ivec& mask) {
  bool any = false;
  for (int j = 0; j < kLanes; ++j) any = any || mask[j];
  return any;
}

// Fold a register of per-lane bests into (value, index): the largest value, the lowest index
// among equals (index < 0: nothing seen yet).
void join_lanes(const vec& values, const ivec& indices, float& value, int64_t& index) {
  for (int j = 0; j < kLanes; ++j) {
    const float v = values[j];
    const int64_t i = indices[j];
    if (index < 0 || v > value || (v == value && i < index)) {
      value = v;
      index = i;
    }
  }
}

// One thread's running argmax over the panels it computed: per row, per lane, the largest value
// seen and the first column it appeared at (a strict > keeps the first), and whether a NaN came.
struct LaneBest {
  int64_t first_panel;
  std::vector<vec> value;
  std::vector<ivec> index;
  std::vector<ivec> nan;
};

// Fold panel p's freshly written outputs (rows of y, still in L1) into a thread's LaneBest.
void fold_panel(LaneBest& best, const float* y, int64_t rows, int64_t n_out, int64_t p) {
  const int64_t col = p * kLanes, width = std::min(kLanes, n_out - col);
  ivec lane;
  for (int j = 0; j < kLanes; ++j) lane[j] = static_cast<int32_t>(col + j);
  for (int64_t m = 0; m < rows; ++m) {
    vec a;
    if (width == kLanes) {
      std::memcpy(&a, y + m * n_out + col, sizeof(vec));
    } else {  // the last panel's padding lanes never win (-inf, and their columns come last)
      for (int j = 0; j < kLanes; ++j) a[j] = j < width ? y[m * n_out + col + j] : -std::numeric_limits<float>::infinity();
    }
    if (p == best.first_panel) {
      best.value[m] = a;
      best.index[m] = lane;
      best.nan[m] = a != a;
      continue;
    }
    const ivec more = a > best.value[m];
    best.value[m] = more ? a : best.value[m];
    best.index[m] = more ? lane : best.index[m];
    best.nan[m] |= a != a;
  }
}

at::Tensor linear_impl(const at::Tensor& x, const at::Tensor& packed, int64_t n_out,
                       const std::optional<at::Tensor>& bias, at::Tensor* argmax) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat,
              "linear: 2-D float32 input and packed weight");
  const int64_t rows = x.size(0), k_in = x.size(1), panels = packed.size(0);
  TORCH_CHECK(packed.size(1) == k_in && panels * kLanes >= n_out, "linear: weight does not match the input");
  TORCH_CHECK(!argmax || n_out < (int64_t(1) << 31), "linear_argmax: too many columns");
  auto xt = at::empty({k_in, rows}, x.options());  // transposed by hand: at::Tensor::t().contiguous() costs ~10 us
  {
    const auto xc = x.contiguous();
    const float* src = xc.data_ptr<float>();
    float* dst = xt.data_ptr<float>();
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t k = 0; k < k_in; ++k) dst[k * rows + m] = src[m * k_in + k];
  }
  auto y = at::empty({rows, n_out}, x.options());
  at::Tensor b;
  if (bias && bias->defined()) b = bias->contiguous();
  const float* xt_p = xt.data_ptr<float>();
  const float* w_p = packed.data_ptr<float>();
  const float* b_p = b.defined() ? b.data_ptr<float>() : nullptr;
  float* y_p = y.data_ptr<float>();
  std::vector<LaneBest> parts;
  std::mutex parts_lock;
  at::parallel_for(0, panels, 1, [&](int64_t first, int64_t last) {
    LaneBest best{first, std::vector<vec>(argmax ? rows : 0), std::vector<ivec>(argmax ? rows : 0),
                  std::vector<ivec>(argmax ? rows : 0)};
    for (int64_t p = first; p < last; ++p) {
      const float* panel = w_p + p * k_in * kLanes;
      for (int64_t r = 0; r < rows; r += kTileRows) {
        const int64_t tile_rows = std::min<int64_t>(kTileRows, rows - r);
        // Later row tiles find the panel in cache; only the first streams it.
        kTiles[tile_rows - 1](xt_p + r, rows, panel, k_in, r == 0, y_p + r * n_out, n_out, p * kLanes, b_p);
      }
      if (argmax) fold_panel(best, y_p, rows, n_out, p);
    }
    if (argmax && first < last) {
      std::lock_guard<std::mutex> hold(parts_lock);
      parts.push_back(std::move(best));
    }
  });
  if (argmax) {
    // Join the threads' ranges in column order: an earlier range wins a tie, the first NaN wins.
    std::sort(parts.begin(), parts.end(), [](const LaneBest& a, const LaneBest& b) { return a.first_panel < b.first_panel; });
    *argmax = at::empty({rows}, x.options().dtype(at::kLong));
    int64_t* out = argmax->data_ptr<int64_t>();
    for (int64_t m = 0; m < rows; ++m) {
      float value = 0.0f;
      int64_t index = -1;
      for (const LaneBest& part : parts) {
        if (any_lane(part.nan[m])) {  // rare: the range's first NaN, scanned from the row itself
          int64_t c = part.first_panel * kLanes;
          while (c < n_out && !std::isnan(y_p[m * n_out + c])) ++c;
          index = c;
          break;
        }
        join_lanes(part.value[m], part.index[m], value, index);
      }
      out[m] = index;
    }
  }
  return y;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t n_out, const std::optional<at::Tensor>& bias) {
  return linear_impl(x, packed, n_out, bias, nullptr);
}

// linear() and the first index of each output row's maximum (torch.max(dim=-1).indices' rule),
// folded in while each panel's outputs are still in L1: a scan of the rows afterwards reads them
// back from memory (the weight stream has evicted them), most of a small verification's time.
std::tuple<at::Tensor, at::Tensor> linear_argmax(const at::Tensor& x, const at::Tensor& packed, int64_t n_out,
                                                  const std::optional<at::Tensor>& bias) {
  at::Tensor argmax;
  auto y = linear_impl(x, packed, n_out, bias, &argmax);
  return {y, argmax};
}


// First index of each row's maximum (a NaN counts as the maximum: its first index), as
// torch.max(dim=-1).indices gives it. The rows a verifier reads come straight from linear()
// above, whose threads each wrote a range of output columns: each thread scans the columns its
// own core just wrote, one register of lanes at a time, keeping per lane the largest value and
// where it first appeared; the ranges are then joined in column order, so ties keep the first
// index whatever the thread count. torch's index reduction ran about ten times slower than its
// plain max over the same rows.
struct Best {
  float value;
  int64_t index;  // -1: nothing seen
  int64_t nan;    // first NaN's column, -1: none
};

Best scan(const float* row, int64_t first, int64_t last) {
  Best best{-std::numeric_limits<float>::infinity(), -1, -1};
  int64_t c = first;
  if (last - c >= kLanes) {
    vec vmax;
    std::memcpy(&vmax, row + c, sizeof(vec));
    ivec lane;
    for (int j = 0; j < kLanes; ++j) lane[j] = static_cast<int32_t>(c + j);
    ivec vidx = lane, nan = vmax != vmax;
    for (c += kLanes; c + kLanes <= last; c += kLanes) {
      lane += static_cast<int32_t>(kLanes);
      vec x;
      std::memcpy(&x, row + c, sizeof(vec));
      nan |= x != x;
      const ivec more = x > vmax;  // strict: a lane keeps its first
      vmax = more ? x : vmax;
      vidx = more ? lane : vidx;
    }
    if (any_lane(nan)) {
      c = first;  // rare: the scalar loop below finds the first NaN
    } else {
      join_lanes(vmax, vidx, best.value, best.index);
    }
  }
  for (; c < last; ++c) {
    const float x = row[c];
    if (std::isnan(x)) return {x, c, c};
    if (best.index < 0 || x > best.value) best = {x, c, -1};
  }
  return best;
}

at::Tensor argmax_rows(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.size(1) > 0, "argmax_rows: 2-D float32 rows");
  const auto xc = x.contiguous();
  const int64_t rows = xc.size(0), cols = xc.size(1);
  TORCH_CHECK(cols < (int64_t(1) << 31), "argmax_rows: too many columns");
  auto out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* p = xc.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  const int threads = cols >= 8192 ? at::get_num_threads() : 1;
  // Column ranges in whole registers, as linear() splits its panels.
  const int64_t span = ((cols + threads - 1) / threads + kLanes - 1) / kLanes * kLanes;
  std::vector<Best> parts(static_cast<size_t>(rows * threads));
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t c0 = std::min(cols, t * span), c1 = std::min(cols, c0 + span);
      for (int64_t r = 0; r < rows; ++r)
        parts[r * threads + t] = c0 < c1 ? scan(p + r * cols, c0, c1) : Best{0.0f, -1, -1};
    }
  });
  for (int64_t r = 0; r < rows; ++r) {
    Best best{0.0f, -1, -1};
    for (int64_t t = 0; t < threads; ++t) {  // column order: the earlier range wins a tie
      const Best& part = parts[r * threads + t];
      if (part.index < 0) continue;
      if (part.nan >= 0) { best = part; break; }
      if (best.index < 0 || part.value > best.value) best = part;
    }
    o[r] = best.index;
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "Pack a [out, in] float32 weight into [panel][in][16] panels");
  m.def("linear", &linear, "x @ W^T (+ bias) for a few float32 rows against a packed weight");
  m.def("linear_argmax", &linear_argmax, "linear() and the first index of each output row's maximum");
  m.def("argmax_rows", &argmax_rows, "First index of each row's maximum (NaN first), as torch.max(dim=-1).indices");
  m.attr("tile_rows") = kTileRows;
}
