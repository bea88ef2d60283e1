// y = bf16(x) bf16(W)^T (+ b), products accumulated in float32, for the rows of a tree forward.
//
// Why: a one-token forward streams every weight once, and in bf16 that stream is half the bytes
// of float32; the few rows of a tree then cost little more than one row, because the bf16 dot
// products of AMX tiles (TDPBF16PS) or AVX512_BF16 (VDPBF16PS) do twice the multiply-adds of a
// float32 FMA per instruction.
//
// The weight is packed once into panels of 16 output columns, K padded to a multiple of 32 with
// zeros and laid out [panel][k/2][16 columns][2 consecutive k] ("VNNI" order): 64 bytes per
// pair of k for one panel, which is one AVX-512 weight vector and one row of an AMX B tile, so
// both paths read the same packing. Panels are padded to a multiple of kGroup (zero columns).
//
// Row invariance: every output element has exactly one float32 accumulator that starts at zero
// and takes the k pairs in ascending order, one dot-product instruction per pair (AVX-512) or
// per 16 pairs (AMX, which runs them in ascending order inside the instruction); the bias is
// added last. How rows and panels are blocked into registers or tiles never changes that order,
// so a row's result is bitwise the same whatever rows share the call. The two paths may differ
// from each other in the last bit (the instructions order the two products of a pair
// differently); a process uses one path for every call.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace {

constexpr int64_t kLanes = 16;   // output columns per panel
constexpr int64_t kKBlock = 32;  // k per AMX tile row (64 bytes of bf16): K is padded to it
constexpr int64_t kGroup = 4;    // panels per work item (4 accumulators / C tiles)
constexpr int kAvxRows = 6;      // rows per AVX-512 register block: 24 accumulators

// float32 -> bf16, round to nearest even (what torch's .to(torch.bfloat16) does); NaN stays NaN.
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// --------------------------------------------------------------------------- CPU features
bool cpu_avx512_bf16() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & (1u << 16))) return false;  // AVX512F
  if (!(b & (1u << 30))) return false;                                            // AVX512BW
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return false;  // AVX512_BF16
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0xe6u) == 0xe6u;  // the OS saves SSE, AVX, opmask and ZMM state
}

bool cpu_amx_bf16() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (d & (1u << 22)) && (d & (1u << 24));  // AMX-BF16, AMX-TILE
}

// Linux hands out the 8 KiB of tile data state only on request (kernel 5.16+); without it the
// first tile instruction faults. The permission is process-wide, so one request covers the
// OpenMP threads too.
std::atomic<bool> amx_granted{false};

bool request_amx() {
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  if (!amx_granted && cpu_amx_bf16() && syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0)
    amx_granted = true;
  return amx_granted;
}

// --------------------------------------------------------------------------- packing
at::Tensor pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat, "pack: a 2-D float32 weight");
  const auto w = weight.contiguous();
  const int64_t n_out = w.size(0), k_in = w.size(1);
  const int64_t k_pad = (k_in + kKBlock - 1) / kKBlock * kKBlock;
  const int64_t panels = ((n_out + kLanes - 1) / kLanes + kGroup - 1) / kGroup * kGroup;
  auto packed = at::zeros({panels, k_pad / 2, kLanes, 2}, w.options().dtype(at::kBFloat16));
  const float* src = w.data_ptr<float>();
  auto* dst = reinterpret_cast<uint16_t*>(packed.data_ptr());
  for (int64_t n = 0; n < n_out; ++n)
    for (int64_t k = 0; k < k_in; ++k)
      dst[(((n / kLanes) * (k_pad / 2) + k / 2) * kLanes + n % kLanes) * 2 + k % 2] = to_bf16(src[n * k_in + k]);
  return packed;
}

// x rounded to bf16, rows padded to a multiple of 16 and k to the packing's, zeros elsewhere.
at::Tensor round_input(const at::Tensor& x, int64_t k_pad) {
  const auto xc = x.contiguous();
  const int64_t rows = xc.size(0), k_in = xc.size(1), rows_pad = (rows + 15) / 16 * 16;
  auto xb = at::zeros({rows_pad, k_pad}, xc.options().dtype(at::kBFloat16));
  const float* src = xc.data_ptr<float>();
  auto* dst = reinterpret_cast<uint16_t*>(xb.data_ptr());
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t k = 0; k < k_in; ++k) dst[m * k_pad + k] = to_bf16(src[m * k_in + k]);
  return xb;
}

inline void write_out(const float* acc, int64_t m, int64_t col, int64_t n_out, const float* bias, float* y) {
  const int64_t width = std::min(kLanes, n_out - col);
  float* out = y + m * n_out + col;
  for (int64_t j = 0; j < width; ++j) out[j] = acc[j] + (bias ? bias[col + j] : 0.0f);
}

// --------------------------------------------------------------------------- AVX512_BF16
// R rows x kGroup panels: one accumulator per (row, panel), k pairs in ascending order.
template <int R>
__attribute__((target("avx512f,avx512bw,avx512bf16")))
void avx_block(const uint16_t* xb, int64_t k_pad, const uint16_t* group, int64_t pairs, int64_t m0, int64_t rows,
               int64_t col0, int64_t n_out, const float* bias, float* y, bool prefetch) {
  __m512 acc[R][kGroup];
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < kGroup; ++q) acc[r][q] = _mm512_setzero_ps();
  const int64_t panel_stride = pairs * kLanes * 2;  // uint16 per panel
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh w[kGroup];
    for (int q = 0; q < kGroup; ++q) {
      const uint16_t* at = group + q * panel_stride + p * kLanes * 2;
      if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(at + 64 * kLanes * 2), _MM_HINT_T1);
      w[q] = (__m512bh)_mm512_loadu_si512(at);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, xb + (m0 + r) * k_pad + 2 * p, 4);
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      for (int q = 0; q < kGroup; ++q) acc[r][q] = _mm512_dpbf16_ps(acc[r][q], xv, w[q]);
    }
  }
  alignas(64) float buf[kLanes];
  for (int r = 0; r < R && m0 + r < rows; ++r)
    for (int q = 0; q < kGroup; ++q) {
      const int64_t col = col0 + q * kLanes;
      if (col >= n_out) break;
      _mm512_store_ps(buf, acc[r][q]);
      write_out(buf, m0 + r, col, n_out, bias, y);
    }
}

using AvxFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, int64_t, int64_t, int64_t,
                       const float*, float*, bool);
constexpr AvxFn kAvx[kAvxRows] = {&avx_block<1>, &avx_block<2>, &avx_block<3>,
                                  &avx_block<4>, &avx_block<5>, &avx_block<6>};

void avx_group(const uint16_t* xb, int64_t k_pad, int64_t rows, const uint16_t* group, int64_t pairs,
               int64_t col0, int64_t n_out, const float* bias, float* y) {
  for (int64_t m = 0; m < rows; m += kAvxRows) {
    const int64_t r = std::min<int64_t>(kAvxRows, rows - m);
    // Later row blocks find the group in cache; only the first streams it.
    kAvx[r - 1](xb, k_pad, group, pairs, m, rows, col0, n_out, bias, y, m == 0);
  }
}

// --------------------------------------------------------------------------- AMX
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: C (16 rows x 16 float32) of the group's four panels; 4: A (16 rows x 32 bf16 of x);
// 5-7: B (16 k pairs x 16 columns x 2), loaded in turn.
__attribute__((target("amx-tile,amx-bf16,avx512f")))
void amx_group(const uint16_t* xb, int64_t k_pad, int64_t rows, const uint16_t* group, int64_t pairs,
               int64_t col0, int64_t n_out, const float* bias, float* y) {
  const int64_t panel_stride = pairs * kLanes * 2;
  const int64_t blocks = k_pad / kKBlock;
  const int64_t rows_pad = (rows + 15) / 16 * 16;
  alignas(64) float c[kGroup][16][kLanes];
  for (int64_t m0 = 0; m0 < rows_pad; m0 += 16) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const uint16_t* a = xb + m0 * k_pad;
    for (int64_t kb = 0; kb < blocks; ++kb) {
      // One B tile is 16 pairs of one panel: 1 KiB, rows 64 bytes apart.
      const uint16_t* b = group + kb * 16 * kLanes * 2;
      _tile_loadd(4, a + kb * kKBlock, k_pad * 2);
      _tile_loadd(5, b, 64);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(6, b + panel_stride, 64);
      _tile_dpbf16ps(1, 4, 6);
      _tile_loadd(7, b + 2 * panel_stride, 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_loadd(5, b + 3 * panel_stride, 64);
      _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, c[0], 64);
    _tile_stored(1, c[1], 64);
    _tile_stored(2, c[2], 64);
    _tile_stored(3, c[3], 64);
    for (int64_t r = 0; r < 16 && m0 + r < rows; ++r)
      for (int q = 0; q < kGroup; ++q) {
        const int64_t col = col0 + q * kLanes;
        if (col < n_out) write_out(c[q][r], m0 + r, col, n_out, bias, y);
      }
  }
}

__attribute__((target("amx-tile")))
void amx_configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

__attribute__((target("amx-tile")))
void amx_release() { _tile_release(); }

// --------------------------------------------------------------------------- the call
enum Path : int64_t { kAvx512 = 0, kAmx = 1 };

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t n_out, const std::optional<at::Tensor>& bias,
                  int64_t path) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "linear: a 2-D float32 input");
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == at::kBFloat16, "linear: a packed bf16 weight");
  const int64_t rows = x.size(0), k_in = x.size(1), panels = packed.size(0), pairs = packed.size(1);
  const int64_t k_pad = pairs * 2;
  TORCH_CHECK(k_in <= k_pad && k_pad - k_in < kKBlock && panels * kLanes >= n_out,
              "linear: the weight does not match the input");
  TORCH_CHECK(path == kAvx512 ? cpu_avx512_bf16() : path == kAmx && amx_granted,
              "linear: this CPU lacks the instructions of the path asked for (AMX: call request_amx first)");
  auto y = at::empty({rows, n_out}, x.options());
  if (rows == 0) return y;
  const auto xb = round_input(x, k_pad);
  at::Tensor b;
  if (bias && bias->defined()) b = bias->contiguous();
  const auto* xb_p = reinterpret_cast<const uint16_t*>(xb.data_ptr());
  const auto* w_p = reinterpret_cast<const uint16_t*>(packed.data_ptr());
  const float* b_p = b.defined() ? b.data_ptr<float>() : nullptr;
  float* y_p = y.data_ptr<float>();
  const int64_t groups = panels / kGroup, group_stride = kGroup * pairs * kLanes * 2;
  at::parallel_for(0, groups, 1, [&](int64_t first, int64_t last) {
    if (path == kAmx) amx_configure();  // tile configuration is per thread
    for (int64_t g = first; g < last; ++g) {
      const int64_t col0 = g * kGroup * kLanes;
      if (col0 >= n_out) break;
      const uint16_t* group = w_p + g * group_stride;
      if (path == kAmx)
        amx_group(xb_p, k_pad, rows, group, pairs, col0, n_out, b_p, y_p);
      else
        avx_group(xb_p, k_pad, rows, group, pairs, col0, n_out, b_p, y_p);
    }
    if (path == kAmx) amx_release();
  });
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "Pack a [out, in] float32 weight into bf16 [panel][in/2][16][2] panels");
  m.def("linear", &linear, "bf16(x) @ bf16(W)^T (+ bias) in float32 against a packed weight; path 0 AVX512_BF16, 1 AMX");
  m.def("has_avx512_bf16", &cpu_avx512_bf16, "Whether this CPU and OS run AVX512_BF16");
  m.def("has_amx_bf16", &cpu_amx_bf16, "Whether this CPU has AMX-BF16 tiles");
  m.def("request_amx", &request_amx, "Ask Linux for tile data permission; whether AMX can run now");
  m.attr("group_panels") = kGroup;
}
