// A linear map y = x W^T (+ bias) in bfloat16 for CPUs with AVX512-BF16, for the few rows of a decoding step.
//
// The weight W [N, K] is packed once (dpbf16.py, `pack`) as [N / 16, K / 2, 16, 2]: for each block of 16 output
// columns, the K / 2 pairs of consecutive weights along K, one 64-byte vector per pair, so a block streams from
// memory in order. Each vector meets the same pair of every row's inputs (broadcast) in one `vdpbf16ps`, which
// multiplies bfloat16 pairs and adds them into float32 lanes: a weight loaded once serves every row from a
// register. Every output sums its products in the same order (K pairs, one float32 lane from zero), whatever
// the number of rows, so a row's result does not depend on how many rows were fed with it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kColumns = 16;  // output columns per packed block (one float32 vector)
constexpr int kBlocks = 3;        // blocks a thread computes together: 8 rows x 3 blocks = 24 accumulators

// Software prefetch of the weights, per number of rows (index min(rows, kMaxRows)), set by `set_prefetch` from a
// calibration made on the machine (dpbf16.py): with a few rows, the CPU computes while memory idles unless asked
// for the next lines early; which request pays (if any) differs between CPUs. It never changes a result.
enum Prefetch : int { kNone = 0, kNear = 1, kAhead = 2 };
constexpr int64_t kMaxRows = 64;
constexpr int64_t kNearLines = 32;  // kNear: the line this many pairs further along the same block
int8_t prefetch_for_rows[kMaxRows + 1] = {};  // kAhead: the next group's line at the same place

// rows [0, R) of x (pairs of bfloat16 as uint32, `pairs` per row) times `B` blocks of the packed weight,
// written as bfloat16 to y (row stride ldy) from column `column`
template <int R, int B, int P>
inline void tile(const uint32_t* x, int64_t pairs, const uint16_t* w, const float* bias, at::BFloat16* y,
                 int64_t ldy, int64_t column, const uint16_t* ahead) {
  __m512 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  for (int64_t j = 0; j < pairs; ++j) {
    __m512i weights[B];
    for (int b = 0; b < B; ++b) weights[b] = _mm512_loadu_si512(w + (b * pairs + j) * 2 * kColumns);
    if (P == kNear)
      for (int b = 0; b < B; ++b)
        _mm_prefetch(reinterpret_cast<const char*>(w + (b * pairs + j + kNearLines) * 2 * kColumns), _MM_HINT_T0);
    if (P == kAhead && ahead != nullptr)
      for (int b = 0; b < B; ++b)
        _mm_prefetch(reinterpret_cast<const char*>(ahead + (b * pairs + j) * 2 * kColumns), _MM_HINT_T0);
    for (int r = 0; r < R; ++r) {
      const __m512i input = _mm512_set1_epi32(static_cast<int>(x[r * pairs + j]));
      for (int b = 0; b < B; ++b)
        acc[r][b] = _mm512_dpbf16_ps(acc[r][b], (__m512bh)input, (__m512bh)weights[b]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) {
      __m512 out = acc[r][b];
      if (bias != nullptr) out = _mm512_add_ps(out, _mm512_loadu_ps(bias + column + b * kColumns));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + r * ldy + column + b * kColumns),
                          (__m256i)_mm512_cvtneps_pbh(out));
    }
}

// all `rows` rows times `B` blocks starting at block `first`: tiles of 8, 4, 2 and 1 rows, the weights of the
// blocks read from memory by the first tile and from cache by the rest; `more`: the thread's next group follows
template <int B, int P>
void blocks(const uint32_t* x, int64_t rows, int64_t pairs, const uint16_t* packed, int64_t first,
            const float* bias, at::BFloat16* y, int64_t ldy, bool more) {
  const uint16_t* w = packed + first * pairs * 2 * kColumns;
  const uint16_t* ahead = more ? w + B * pairs * 2 * kColumns : nullptr;
  const int64_t column = first * kColumns;
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8) tile<8, B, P>(x + r * pairs, pairs, w, bias, y + r * ldy, ldy, column, ahead);
  for (; r + 4 <= rows; r += 4) tile<4, B, P>(x + r * pairs, pairs, w, bias, y + r * ldy, ldy, column, ahead);
  for (; r + 2 <= rows; r += 2) tile<2, B, P>(x + r * pairs, pairs, w, bias, y + r * ldy, ldy, column, ahead);
  for (; r < rows; ++r) tile<1, B, P>(x + r * pairs, pairs, w, bias, y + r * ldy, ldy, column, ahead);
}

template <int P>
void all_blocks(const uint32_t* x, int64_t rows, int64_t pairs, const uint16_t* packed, int64_t n_blocks,
                const float* bias, at::BFloat16* y, int64_t ldy) {
  const int64_t groups = n_blocks / kBlocks;
  at::parallel_for(0, groups, 1, [&](int64_t start, int64_t end) {
    for (int64_t g = start; g < end; ++g)
      blocks<kBlocks, P>(x, rows, pairs, packed, g * kBlocks, bias, y, ldy, g + 1 < end);
  });
  for (int64_t i = groups * kBlocks; i < n_blocks; ++i)
    blocks<1, kNone>(x, rows, pairs, packed, i, bias, y, ldy, false);
}

// the checks `linear` and `linear_tiles` share (`name`: the operator's, for the messages)
void check_product(const char* name, const at::Tensor& input, const at::Tensor& packed, int64_t out_features) {
  TORCH_CHECK(input.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16, name,
              " takes bfloat16 inputs and weights");
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kColumns && packed.size(3) == 2 && packed.is_contiguous(), name,
              ": the weight must be packed by multispec.models.dpbf16.pack");
  TORCH_CHECK(input.size(-1) == 2 * packed.size(1), name, ": the input has ", input.size(-1),
              " features, the packed weight ", 2 * packed.size(1));
  TORCH_CHECK(out_features <= packed.size(0) * kColumns, name, ": more outputs than the weight has");
}

// a bias as float32 over every column of the packed blocks (zeros past `out_features`), or undefined for none
at::Tensor widened_bias(const c10::optional<at::Tensor>& bias, int64_t width, int64_t out_features) {
  if (!bias.has_value() || !bias->defined()) return at::Tensor();
  at::Tensor b = at::zeros({width}, bias->options().dtype(at::kFloat));
  b.narrow(0, 0, out_features).copy_(*bias);
  return b;
}

// y [rows, blocks * 16] -> the input's shape with `out_features` last (the padding columns dropped)
at::Tensor shaped_output(at::Tensor y, const at::Tensor& input, int64_t out_features) {
  if (y.size(1) != out_features) y = y.narrow(1, 0, out_features).contiguous();
  auto sizes = input.sizes().vec();
  sizes.back() = out_features;
  return y.view(sizes);
}

at::Tensor linear(const at::Tensor& input, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                  int64_t out_features) {
  check_product("multispec_dpbf16::linear", input, packed, out_features);
  const int64_t in_features = input.size(-1);
  const int64_t n_blocks = packed.size(0);
  const at::Tensor x = input.reshape({-1, in_features}).contiguous();
  const int64_t rows = x.size(0);
  const int64_t width = n_blocks * kColumns;
  at::Tensor y = at::empty({rows, width}, x.options());
  const at::Tensor b = widened_bias(bias, width, out_features);
  const auto* xp = reinterpret_cast<const uint32_t*>(x.data_ptr());
  const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr());
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  auto* yp = y.data_ptr<at::BFloat16>();
  const int64_t pairs = in_features / 2;
  switch (prefetch_for_rows[std::min(rows, kMaxRows)]) {
    case kNear: all_blocks<kNear>(xp, rows, pairs, wp, n_blocks, bp, yp, width); break;
    case kAhead: all_blocks<kAhead>(xp, rows, pairs, wp, n_blocks, bp, yp, width); break;
    default: all_blocks<kNone>(xp, rows, pairs, wp, n_blocks, bp, yp, width);
  }
  return shaped_output(y, input, out_features);
}

// The same product on AMX tiles (CPUs with AMX-BF16), from the same packed weight: a block's 16 pairs of K make
// one B tile as they lie ([16 pairs][16 columns][2]); 16 rows of the input (padded with zero rows) one A tile.
// `_tile_dpbf16ps` adds each output's 16 pair products into its float32 sum, chunk after chunk of K, so a row's
// output does not depend on the other rows either (though its bits are not the vector kernel's). One tile op
// serves 16 rows at the cost of one, so up to 16 rows cost one pass over the weights.
constexpr int kTileBlocks = 4;  // output blocks a thread computes together: 4 accumulator tiles

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// whether this process may use the tiles (Linux grants them on request, once per process)
bool tiles_granted() {
  static const bool granted = [] {
    constexpr int kRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
    constexpr int kTileData = 18;               // XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return granted;
}

__attribute__((target("amx-tile,amx-bf16"))) void load_tile_config() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  // the compiler does not know that the instruction reads the whole struct (GCC 12 dropped the stores above)
  asm volatile("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
}

__attribute__((target("amx-tile"))) void release_tiles() { _tile_release(); }

// `B` blocks of outputs from block `first`, for every 16-row block of x [16 * m_blocks, K] (zero rows past `rows`)
template <int B>
__attribute__((target("amx-tile,amx-bf16,avx512f,avx512bf16"))) void tile_blocks(
    const at::BFloat16* x, int64_t m_blocks, int64_t rows, int64_t pairs, const uint16_t* packed, int64_t first,
    const float* bias, at::BFloat16* y, int64_t ldy) {
  alignas(64) float sums[kTileBlocks * 256];
  const uint16_t* w = packed + first * pairs * 2 * kColumns;
  const int64_t chunks = pairs / 16, block = pairs * 2 * kColumns, column = first * kColumns;
  for (int64_t m = 0; m < m_blocks; ++m) {
    _tile_zero(0);
    if (B > 1) _tile_zero(1);
    if (B > 2) _tile_zero(2);
    if (B > 3) _tile_zero(3);
    const at::BFloat16* a = x + m * 16 * pairs * 2;
    for (int64_t c = 0; c < chunks; ++c) {
      const uint16_t* chunk = w + c * 16 * 2 * kColumns;
      _tile_loadd(4, a + c * 32, pairs * 4);
      _tile_loadd(5, chunk, 64);
      _tile_dpbf16ps(0, 4, 5);
      if (B > 1) {
        _tile_loadd(6, chunk + block, 64);
        _tile_dpbf16ps(1, 4, 6);
      }
      if (B > 2) {
        _tile_loadd(7, chunk + 2 * block, 64);
        _tile_dpbf16ps(2, 4, 7);
      }
      if (B > 3) {
        _tile_loadd(5, chunk + 3 * block, 64);
        _tile_dpbf16ps(3, 4, 5);
      }
    }
    _tile_stored(0, sums, 64);
    if (B > 1) _tile_stored(1, sums + 256, 64);
    if (B > 2) _tile_stored(2, sums + 512, 64);
    if (B > 3) _tile_stored(3, sums + 768, 64);
    const int64_t count = std::min<int64_t>(16, rows - m * 16);
    for (int64_t r = 0; r < count; ++r)
      for (int b = 0; b < B; ++b) {
        __m512 out = _mm512_load_ps(sums + b * 256 + r * 16);
        if (bias != nullptr) out = _mm512_add_ps(out, _mm512_loadu_ps(bias + column + b * kColumns));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + (m * 16 + r) * ldy + column + b * kColumns),
                            (__m256i)_mm512_cvtneps_pbh(out));
      }
  }
}

at::Tensor linear_tiles(const at::Tensor& input, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                        int64_t out_features) {
  check_product("multispec_dpbf16::linear_tiles", input, packed, out_features);
  const int64_t in_features = input.size(-1);
  TORCH_CHECK(in_features % 32 == 0, "multispec_dpbf16::linear_tiles: inputs must come in multiples of 32");
  TORCH_CHECK(tiles_granted(), "multispec_dpbf16::linear_tiles: this process may not use AMX tiles");
  const int64_t n_blocks = packed.size(0);
  at::Tensor x = input.reshape({-1, in_features}).contiguous();
  const int64_t rows = x.size(0), m_blocks = (rows + 15) / 16;
  if (rows % 16 != 0) {  // zero rows up to a whole tile (plain copies: a padding operator cost 10 us a call)
    at::Tensor padded = at::empty({m_blocks * 16, in_features}, x.options());
    const size_t filled = rows * in_features * sizeof(at::BFloat16);
    std::memcpy(padded.data_ptr(), x.data_ptr(), filled);
    std::memset(static_cast<char*>(padded.data_ptr()) + filled, 0,
                (m_blocks * 16 - rows) * in_features * sizeof(at::BFloat16));
    x = padded;
  }
  const int64_t width = n_blocks * kColumns;
  at::Tensor y = at::empty({rows, width}, x.options());
  const at::Tensor b = widened_bias(bias, width, out_features);
  const auto* xp = x.data_ptr<at::BFloat16>();
  const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr());
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  auto* yp = y.data_ptr<at::BFloat16>();
  const int64_t pairs = in_features / 2, groups = (n_blocks + kTileBlocks - 1) / kTileBlocks;
  at::parallel_for(0, groups, 1, [&](int64_t start, int64_t end) {
    load_tile_config();
    for (int64_t g = start; g < end; ++g) {
      const int64_t first = g * kTileBlocks;
      switch (std::min<int64_t>(kTileBlocks, n_blocks - first)) {
        case 1: tile_blocks<1>(xp, m_blocks, rows, pairs, wp, first, bp, yp, width); break;
        case 2: tile_blocks<2>(xp, m_blocks, rows, pairs, wp, first, bp, yp, width); break;
        case 3: tile_blocks<3>(xp, m_blocks, rows, pairs, wp, first, bp, yp, width); break;
        default: tile_blocks<4>(xp, m_blocks, rows, pairs, wp, first, bp, yp, width);
      }
    }
    release_tiles();
  });
  return shaped_output(y, input, out_features);
}

bool tiles() { return tiles_granted(); }

// e^x for float32 lanes, x <= 0: 2^n e^r with n = round(x log2 e) and a degree-7 polynomial for e^r (Cephes'
// expf). Lanes below -87 give 0 exactly (a masked key, or one that weighs less than float32 can hold).
inline __m512 exp_nonpositive(__m512 x) {
  const __mmask16 zero = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~zero), p, n);
}

// Softmax attention of one query row against keys [K, d] (row stride ldk), values [K, dv] (ldv), in float32, each
// sum in one fixed order: a score sums its d products in lanes of 16 then across them; the weighted values and the
// normaliser add key after key from key 0, skipping keys of weight 0. So a row's output depends only on the keys
// it sees with a weight above 0 and their order in the buffer, not on how many rows, keys or masked slots
// (a tree's other branches) come with it: a tree node whose ancestors sit in the buffer in order gets the bits a
// chain step gets.
void attend_row(const float* q, const float* keys, int64_t ldk, const float* values, int64_t ldv,
                const float* mask, int64_t mask_stride, int64_t width, int64_t d, int64_t dv, float scaling,
                float* scores, float* out) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < width; ++j) {
    const float* k = keys + j * ldk;
    __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(k));
    for (int64_t i = 16; i < d; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + i), acc);
    const float s = _mm512_reduce_add_ps(acc) * scaling + (mask ? mask[j * mask_stride] : 0.0f);
    scores[j] = s;
    top = std::max(top, s);
  }
  int64_t j = 0;
  const __m512 shift = _mm512_set1_ps(top);
  for (; j + 16 <= width; j += 16)
    _mm512_storeu_ps(scores + j, exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(scores + j), shift)));
  if (j < width) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (width - j)) - 1);
    _mm512_mask_storeu_ps(scores + j, tail, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, scores + j), shift)));
  }
  constexpr int kMaxVectors = 16;  // dv up to 256
  __m512 acc[kMaxVectors];
  const int64_t vectors = dv / 16;
  for (int64_t v = 0; v < vectors; ++v) acc[v] = _mm512_setzero_ps();
  float total = 0.0f;
  for (j = 0; j < width; ++j) {
    const float w = scores[j];
    if (w == 0.0f) continue;
    total += w;
    const __m512 weight = _mm512_set1_ps(w);
    const float* value = values + j * ldv;
    for (int64_t v = 0; v < vectors; ++v) acc[v] = _mm512_fmadd_ps(weight, _mm512_loadu_ps(value + 16 * v), acc[v]);
  }
  const __m512 norm = _mm512_set1_ps(total);
  for (int64_t v = 0; v < vectors; ++v) _mm512_storeu_ps(out + 16 * v, _mm512_div_ps(acc[v], norm));
}

// 16 float32 lanes from a cache's entries: float32 as they are, bfloat16 widened (exactly)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// lane i: the sum of the 16 lanes of a[i], added in the order `_mm512_reduce_add_ps` adds one vector's lanes
// (the halves, then the quarters, then lanes (0, 2) and (1, 3), then those two), for 16 vectors at once
inline __m512 lane_sums(const __m512* a) {
  // the tree below leaves the sum of slot 4k + c in lane 4c + k: slot 4k + c takes vector 4c + k
  constexpr int slot[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
  __m512 halves[8], quarters[4], pairs[2];
  for (int m = 0; m < 8; ++m) {  // [8 lanes of slot 2m | of slot 2m + 1]: upper half + lower half
    const __m512 x = a[slot[2 * m]], y = a[slot[2 * m + 1]];
    halves[m] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0xEE), _mm512_shuffle_f32x4(x, y, 0x44));
  }
  for (int m = 0; m < 4; ++m) {  // 128-bit chunk c: 4 lanes of slot 4m + c: upper quarter + lower quarter
    const __m512 x = halves[2 * m], y = halves[2 * m + 1];
    quarters[m] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0xDD), _mm512_shuffle_f32x4(x, y, 0x88));
  }
  for (int m = 0; m < 2; ++m) {  // chunk c: lanes 0 + 2 and 1 + 3 of slots 8m + c and 8m + 4 + c
    const __m512 x = quarters[2 * m], y = quarters[2 * m + 1];
    pairs[m] = _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x44), _mm512_shuffle_ps(x, y, 0xEE));
  }
  // chunk c: the two lanes of slots c, 4 + c, 8 + c, 12 + c added
  return _mm512_add_ps(_mm512_shuffle_ps(pairs[0], pairs[1], 0x88), _mm512_shuffle_ps(pairs[0], pairs[1], 0xDD));
}

// `attend_row` for R query rows that read the same keys and values (the query heads of one key head, and their
// tokens), with d = dv = 16 V: a row's scores come 16 keys at a time (`lane_sums`), and each value vector is
// loaded once for the R rows. Each row's sums run in `attend_row`'s order, so a row gets the same bits in a block
// of any size. `scores` holds R rows of `width` rounded up to 16. Keys and values are float32 or bfloat16 (a cache
// of a bfloat16 model holds bfloat16 numbers: widened, they are the float32 ones); a block of 16 bfloat16 keys is
// widened once for the R rows.
template <int R, int V, typename T>
void attend_rows(const float* const* q, const T* keys, int64_t ldk, const T* values, int64_t ldv,
                 const float* const* mask, int64_t mask_stride, int64_t width, float scaling, float* scores,
                 float* const* out) {
  const int64_t padded = (width + 15) / 16 * 16;
  const __m512 scale = _mm512_set1_ps(scaling);
  __m512 top[R];
  for (int r = 0; r < R; ++r) top[r] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  // bfloat16 keys are widened once into `widened` for a block of 3 rows or more; fewer rows widen each as they read
  constexpr bool once = !std::is_same<T, float>::value && R >= 3;
  alignas(64) float widened[once ? 16 * 16 * V : 1];
  for (int64_t j = 0; j < width; j += 16) {
    const int64_t count = std::min<int64_t>(16, width - j);
    const __mmask16 valid = static_cast<__mmask16>(count == 16 ? 0xFFFF : (1u << count) - 1);
    if constexpr (once)
      for (int64_t i = 0; i < count; ++i)
        for (int v = 0; v < V; ++v) _mm512_store_ps(widened + i * 16 * V + 16 * v, load16(keys + (j + i) * ldk + 16 * v));
    for (int r = 0; r < R; ++r) {
      __m512 query[V];
      for (int v = 0; v < V; ++v) query[v] = _mm512_loadu_ps(q[r] + 16 * v);
      __m512 dots[16];
      for (int i = 0; i < 16; ++i) {
        if (i >= count) {
          dots[i] = _mm512_setzero_ps();
          continue;
        }
        __m512 acc;
        if constexpr (once) {
          const float* k = widened + i * 16 * V;
          acc = _mm512_mul_ps(query[0], _mm512_load_ps(k));
          for (int v = 1; v < V; ++v) acc = _mm512_fmadd_ps(query[v], _mm512_load_ps(k + 16 * v), acc);
        } else {
          const T* k = keys + (j + i) * ldk;
          acc = _mm512_mul_ps(query[0], load16(k));
          for (int v = 1; v < V; ++v) acc = _mm512_fmadd_ps(query[v], load16(k + 16 * v), acc);
        }
        dots[i] = acc;
      }
      __m512 added;
      if (mask_stride == 1) {
        added = _mm512_maskz_loadu_ps(valid, mask[r] + j);
      } else {
        alignas(64) float gathered[16] = {};
        for (int64_t i = 0; i < count; ++i) gathered[i] = mask[r][(j + i) * mask_stride];
        added = _mm512_load_ps(gathered);
      }
      // `attend_row`'s score: the sum times the scaling plus the mask, one rounding (the compiler fuses them there)
      const __m512 s = _mm512_fmadd_ps(lane_sums(dots), scale, added);
      _mm512_storeu_ps(scores + r * padded + j, s);
      top[r] = _mm512_mask_max_ps(top[r], valid, top[r], s);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* row = scores + r * padded;
    const __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(top[r]));
    int64_t j = 0;
    for (; j + 16 <= width; j += 16)
      _mm512_storeu_ps(row + j, exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row + j), shift)));
    if (j < width) {
      const __mmask16 tail = static_cast<__mmask16>((1u << (width - j)) - 1);
      _mm512_mask_storeu_ps(row + j, tail, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, row + j), shift)));
    }
  }
  __m512 acc[R][V];
  float total[R];
  for (int r = 0; r < R; ++r) {
    total[r] = 0.0f;
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < width; ++j) {
    const T* value = values + j * ldv;
    __m512 vector[V];
    for (int v = 0; v < V; ++v) vector[v] = load16(value + 16 * v);
    for (int r = 0; r < R; ++r) {
      const float w = scores[r * padded + j];
      if (w == 0.0f) continue;
      total[r] += w;
      const __m512 weight = _mm512_set1_ps(w);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(weight, vector[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m512 norm = _mm512_set1_ps(total[r]);
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(out[r] + 16 * v, _mm512_div_ps(acc[r][v], norm));
  }
}

// the most rows `attend_rows` takes at once for V value vectors (its accumulators and a value's vectors fill the
// 32 vector registers); 0: no blocked form (`attend_row` takes every row alone)
constexpr int64_t block_rows(int64_t vectors) { return vectors == 4 ? 6 : vectors == 8 ? 3 : 0; }

template <int V, typename T>
void attend_block(int64_t rows, const float* const* q, const T* keys, int64_t ldk, const T* values,
                  int64_t ldv, const float* const* mask, int64_t mask_stride, int64_t width, float scaling,
                  float* scores, float* const* out) {
  switch (rows) {
    case 1: attend_rows<1, V, T>(q, keys, ldk, values, ldv, mask, mask_stride, width, scaling, scores, out); break;
    case 2: attend_rows<2, V, T>(q, keys, ldk, values, ldv, mask, mask_stride, width, scaling, scores, out); break;
    case 3: attend_rows<3, V, T>(q, keys, ldk, values, ldv, mask, mask_stride, width, scaling, scores, out); break;
    case 4: attend_rows<4, V, T>(q, keys, ldk, values, ldv, mask, mask_stride, width, scaling, scores, out); break;
    case 5: attend_rows<5, V, T>(q, keys, ldk, values, ldv, mask, mask_stride, width, scaling, scores, out); break;
    default: attend_rows<6, V, T>(q, keys, ldk, values, ldv, mask, mask_stride, width, scaling, scores, out);
  }
}

// `attend`'s blocked form over keys and values of type T (see there): one item per block of the `group * n` rows
// (query head, token) that read one key head of one batch row, at least two blocks a thread where the rows allow,
// so that threads share the work evenly
template <typename T>
void attend_blocks(const float* qp, const T* kp, const at::Tensor& keys, const T* vp, const at::Tensor& values,
                   const float* mp, const at::Tensor& mask, float* op, int64_t b, int64_t hq, int64_t hk, int64_t n,
                   int64_t d, int64_t width, int64_t most, float scale) {
  const int64_t group = hq / hk, rows = group * n, heads = b * hk;
  const int64_t wanted = (2 * at::get_num_threads() + heads - 1) / heads;
  const int64_t blocks = std::min(rows, std::max((rows + most - 1) / most, wanted));
  const int64_t size = (rows + blocks - 1) / blocks;
  at::parallel_for(0, heads * blocks, 1, [&](int64_t start, int64_t end) {
    std::vector<float> scores(size * ((width + 15) / 16 * 16));
    const float* qs[6];
    const float* ms[6];
    float* os[6];
    for (int64_t item = start; item < end; ++item) {
      const int64_t head = item / blocks, first = (item % blocks) * size;
      const int64_t count = std::min(size, rows - first);
      if (count <= 0) continue;
      const int64_t r = head / hk, kh = head % hk;
      for (int64_t i = 0; i < count; ++i) {
        const int64_t h = kh * group + (first + i) / n, t = (first + i) % n;
        const int64_t index = (r * hq + h) * n + t;
        qs[i] = qp + index * d;
        ms[i] = mp + r * mask.stride(0) + t * mask.stride(2);
        os[i] = op + index * d;
      }
      const T* kb = kp + r * keys.stride(0) + kh * keys.stride(1);
      const T* vb = vp + r * values.stride(0) + kh * values.stride(1);
      if (d == 64)
        attend_block<4, T>(count, qs, kb, keys.stride(2), vb, values.stride(2), ms, mask.stride(3), width, scale,
                           scores.data(), os);
      else
        attend_block<8, T>(count, qs, kb, keys.stride(2), vb, values.stride(2), ms, mask.stride(3), width, scale,
                           scores.data(), os);
    }
  });
}

// query [B, Hq, n, d], float32 or bfloat16 keys [B, Hkv, >= K, d] and values [B, Hkv, >= K, >= dv] of one type (a
// cache's buffers: the first K slots are read, K = the mask's last size), additive float32 mask [B, 1, n, K] (may
// be broadcast), out [B, Hq, n, dv] in the query's type; query head h attends with key head h / (Hq / Hkv).
// bfloat16 keys and values are widened to float32 exactly: the same numbers held in float32 give the same bits.
at::Tensor attend(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values, const at::Tensor& mask,
                  int64_t dv, double scaling) {
  TORCH_CHECK(query.dim() == 4 && keys.dim() == 4 && values.dim() == 4 && mask.dim() == 4,
              "multispec_dpbf16::attend: 4-dimensional query, keys, values and mask");
  const auto type = keys.scalar_type();
  TORCH_CHECK((type == at::kFloat || type == at::kBFloat16) && values.scalar_type() == type &&
              mask.scalar_type() == at::kFloat,
              "multispec_dpbf16::attend: float32 or bfloat16 keys and values of one type, and a float32 mask");
  const int64_t b = query.size(0), hq = query.size(1), n = query.size(2), d = query.size(3);
  const int64_t hk = keys.size(1), width = mask.size(3);
  TORCH_CHECK(d % 16 == 0 && dv % 16 == 0 && dv <= 256 && keys.size(3) == d && values.size(3) >= dv,
              "multispec_dpbf16::attend: head sizes must be multiples of 16 (values up to 256)");
  TORCH_CHECK(hk > 0 && hq % hk == 0 && keys.size(2) >= width && values.size(2) >= width && mask.size(2) == n,
              "multispec_dpbf16::attend: shapes do not agree");
  TORCH_CHECK(keys.stride(3) == 1 && values.stride(3) == 1, "multispec_dpbf16::attend: keys and values must be "
              "contiguous in their last dimension");
  const at::Tensor q = query.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({b, hq, n, dv}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* mp = mask.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float scale = static_cast<float>(scaling);
  const int64_t most = d == dv ? block_rows(dv / 16) : 0;
  if (most > 0 && type == at::kBFloat16) {
    attend_blocks(qp, keys.data_ptr<at::BFloat16>(), keys, values.data_ptr<at::BFloat16>(), values, mp, mask, op, b,
                  hq, hk, n, d, width, most, scale);
  } else if (most > 0) {
    attend_blocks(qp, keys.data_ptr<float>(), keys, values.data_ptr<float>(), values, mp, mask, op, b, hq, hk, n, d,
                  width, most, scale);
  } else {  // one item per (batch row, query head, token), over float32 keys and values
    const at::Tensor k = type == at::kFloat ? keys : keys.narrow(2, 0, width).to(at::kFloat);
    const at::Tensor v = type == at::kFloat ? values : values.narrow(2, 0, width).to(at::kFloat);
    const int64_t group = hq / hk;
    const float* kp = k.data_ptr<float>();
    const float* vp = v.data_ptr<float>();
    at::parallel_for(0, b * hq * n, 1, [&](int64_t start, int64_t end) {
      std::vector<float> scores(width);
      for (int64_t item = start; item < end; ++item) {
        const int64_t t = item % n, h = (item / n) % hq, r = item / (n * hq);
        attend_row(qp + item * d, kp + r * k.stride(0) + (h / group) * k.stride(1), k.stride(2),
                   vp + r * v.stride(0) + (h / group) * v.stride(1), v.stride(2),
                   mp + r * mask.stride(0) + t * mask.stride(2), mask.stride(3), width, d, dv, scale,
                   scores.data(), op + item * dv);
      }
    });
  }
  return query.scalar_type() == at::kFloat ? out : out.to(query.scalar_type());
}

// `attend` for packed tokens of many sequences (a batched step, `static.attend_packed`): query [T, Hq, d], keys
// [R, Hkv, >= K, d] and values [R, Hkv, >= K, >= dv] of one type (a batch cache's buffers, one row per sequence),
// rows [T] (token t reads cache row rows[t]), additive float32 mask [T, K]; out [T, Hq, dv] in the query's type.
// One item per (token, key head): the group's query heads in one block, each in `attend_row`'s order, so a token
// gets the bits `attend` gives it alone, whatever else is packed with it and however wide the mask is padded.
at::Tensor attend_tokens(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                         const at::Tensor& rows, const at::Tensor& mask, int64_t dv, double scaling) {
  TORCH_CHECK(query.dim() == 3 && keys.dim() == 4 && values.dim() == 4 && rows.dim() == 1 && mask.dim() == 2,
              "multispec_dpbf16::attend_tokens: query [T, Hq, d], keys and values [R, Hkv, C, d], rows [T], mask [T, K]");
  const auto type = keys.scalar_type();
  TORCH_CHECK((type == at::kFloat || type == at::kBFloat16) && values.scalar_type() == type &&
              mask.scalar_type() == at::kFloat && rows.scalar_type() == at::kLong,
              "multispec_dpbf16::attend_tokens: float32 or bfloat16 keys and values of one type, a float32 mask and "
              "int64 rows");
  const int64_t t = query.size(0), hq = query.size(1), d = query.size(2);
  const int64_t hk = keys.size(1), width = mask.size(1), most = d == dv ? block_rows(dv / 16) : 0;
  TORCH_CHECK(most > 0 && keys.size(3) == d && values.size(3) >= dv,
              "multispec_dpbf16::attend_tokens: heads of 64 or 128 numbers, keys and values alike");
  TORCH_CHECK(hk > 0 && hq % hk == 0 && keys.size(2) >= width && values.size(2) >= width && mask.size(0) == t &&
              rows.size(0) == t, "multispec_dpbf16::attend_tokens: shapes do not agree");
  TORCH_CHECK(keys.stride(3) == 1 && values.stride(3) == 1 && mask.stride(1) == 1,
              "multispec_dpbf16::attend_tokens: keys, values and mask must be contiguous in their last dimension");
  const at::Tensor q = query.to(at::kFloat).contiguous();
  const at::Tensor r = rows.contiguous();
  at::Tensor out = at::empty({t, hq, dv}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* mp = mask.data_ptr<float>();
  const int64_t* rp = r.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const int64_t group = hq / hk, blocks = (group + most - 1) / most, size = (group + blocks - 1) / blocks;
  for (int64_t i = 0; i < t; ++i)
    TORCH_CHECK(rp[i] >= 0 && rp[i] < keys.size(0), "multispec_dpbf16::attend_tokens: a row out of range");
  const float scale = static_cast<float>(scaling);
  auto run = [&](auto kp, auto vp) {
    at::parallel_for(0, t * hk * blocks, 1, [&](int64_t start, int64_t end) {
      std::vector<float> scores(size * ((width + 15) / 16 * 16));
      const float* qs[6];
      const float* ms[6];
      float* os[6];
      for (int64_t item = start; item < end; ++item) {
        const int64_t token = item / (hk * blocks), kh = (item / blocks) % hk, first = (item % blocks) * size;
        const int64_t count = std::min(size, group - first);
        if (count <= 0) continue;
        for (int64_t i = 0; i < count; ++i) {
          const int64_t h = kh * group + first + i;
          qs[i] = qp + (token * hq + h) * d;
          ms[i] = mp + token * mask.stride(0);
          os[i] = op + (token * hq + h) * dv;
        }
        const auto kb = kp + rp[token] * keys.stride(0) + kh * keys.stride(1);
        const auto vb = vp + rp[token] * values.stride(0) + kh * values.stride(1);
        if (d == 64)
          attend_block<4>(count, qs, kb, keys.stride(2), vb, values.stride(2), ms, 1, width, scale, scores.data(), os);
        else
          attend_block<8>(count, qs, kb, keys.stride(2), vb, values.stride(2), ms, 1, width, scale, scores.data(), os);
      }
    });
  };
  if (type == at::kBFloat16)
    run(keys.data_ptr<at::BFloat16>(), values.data_ptr<at::BFloat16>());
  else
    run(keys.data_ptr<float>(), values.data_ptr<float>());
  return query.scalar_type() == at::kFloat ? out : out.to(query.scalar_type());
}

// -- a Llama decoder layer in one call, for eager steps (`models/hf/lean.py`) -------------------------------------
// Each part works token by token, its sums in one order, so a token's output does not depend on the other tokens
// of the step (batch invariance comes with it); the products are `linear` or `linear_tiles`, attention is
// `attend_tokens`. The roundings follow transformers' bfloat16 Llama (each part's result rounded to bfloat16),
// but the order of the sums is ours: the logits are close to transformers', not the same bits.

// 16 bfloat16 numbers, rounded to nearest even from float32 lanes
inline void store16(at::BFloat16* p, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
}
// the lanes of the 16 from `j` that lie before `n` (a width need not be a multiple of 16: the default draft's 198)
inline __mmask16 lanes(int64_t j, int64_t n) {
  return n - j >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - j)) - 1);
}
// load16 and store16 of those lanes only (the others load as 0 and are not written)
inline __m512 load16(const at::BFloat16* p, __mmask16 m) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
inline void store16(at::BFloat16* p, __m512 x, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
}
inline __m512 rounded(__m512 x) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
    reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x))), 16)); }

// RMSNorm of each row of x [T, H]: the mean square in float32 lanes of 16 (then `_mm512_reduce_add_ps`), the row
// times 1 / sqrt(mean + eps) rounded to bfloat16, times the weight, rounded again
at::Tensor norm_rows(const at::Tensor& x, const at::Tensor& weight, float eps) {
  const int64_t t = x.size(0), h = x.size(1);
  at::Tensor out = at::empty({t, h}, x.options());
  const at::BFloat16* xp = x.data_ptr<at::BFloat16>();
  const at::BFloat16* wp = weight.data_ptr<at::BFloat16>();
  at::BFloat16* op = out.data_ptr<at::BFloat16>();
  for (int64_t r = 0; r < t; ++r) {
    const at::BFloat16* row = xp + r * h;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < h; j += 16) {
      const __m512 v = load16(row + j, lanes(j, h));
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    const __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / static_cast<float>(h) + eps));
    for (int64_t j = 0; j < h; j += 16) {
      const __mmask16 m = lanes(j, h);
      store16(op + r * h + j, _mm512_mul_ps(load16(wp + j, m), rounded(_mm512_mul_ps(load16(row + j, m), scale))), m);
    }
  }
  return out;
}

// rotary embedding of one head of d numbers (transformers' `rotate_half` form), in float32, rounded once
inline void rotate(const at::BFloat16* x, const float* cos, const float* sin, int64_t d, at::BFloat16* out) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; i += 16) {
    const __m512 a = load16(x + i), b = load16(x + half + i);
    store16(out + i, _mm512_fnmadd_ps(b, _mm512_loadu_ps(sin + i), _mm512_mul_ps(a, _mm512_loadu_ps(cos + i))));
    store16(out + half + i,
            _mm512_fmadd_ps(a, _mm512_loadu_ps(sin + half + i), _mm512_mul_ps(b, _mm512_loadu_ps(cos + half + i))));
  }
}

// a + b rounded, or silu(a) (rounded) times b rounded, over n numbers
void add_rows(const at::BFloat16* a, const at::BFloat16* b, at::BFloat16* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(i, n);
    store16(out + i, _mm512_add_ps(load16(a + i, m), load16(b + i, m)), m);
  }
}
void silu_times(const at::BFloat16* a, const at::BFloat16* b, at::BFloat16* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(i, n);
    const __m512 x = load16(a + i, m);
    // sigmoid from e^-|x| (never overflows): 1 / (1 + e) for x >= 0, e / (1 + e) below
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
    const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 sigmoid = _mm512_div_ps(_mm512_mask_blend_ps(negative, one, e), _mm512_add_ps(one, e));
    store16(out + i, _mm512_mul_ps(rounded(_mm512_mul_ps(x, sigmoid)), load16(b + i, m)), m);
  }
}

// The part of a decoder layer after its input norm, over T packed tokens: x [T, W] the q, k and v maps' input
// (W = H for a Llama layer, 2H for a draft head's [embedding, feature]), residual [T, H] the stream the attention's
// output is added to; weights[1..8]: the packed q, k, v, o maps, the post-attention norm [H], the packed gate, up
// and down maps (weights[0], the input norm, is the caller's). The other arguments as `llama_layer`'s.
at::Tensor layer_after_norm(const at::Tensor& x, const at::Tensor& hidden, at::TensorList weights,
                            const at::Tensor& keys, const at::Tensor& values, const at::Tensor& cos,
                            const at::Tensor& sin, const at::Tensor& rows, const at::Tensor& slots,
                            const at::Tensor& mask, at::IntArrayRef fused, int64_t heads, int64_t kv_heads,
                            int64_t inter, double eps, double scaling, int64_t tiles) {
  const int64_t t = hidden.size(0), h = hidden.size(1), d = keys.size(3);
  TORCH_CHECK(hidden.dim() == 2 && hidden.scalar_type() == at::kBFloat16 && hidden.is_contiguous() && h % 2 == 0 &&
              x.dim() == 2 && x.size(0) == t && x.scalar_type() == at::kBFloat16 && x.is_contiguous() &&
              inter % 2 == 0 && d % 32 == 0 && cos.size(0) == t && cos.size(1) == d && sin.sizes() == cos.sizes() &&
              cos.scalar_type() == at::kFloat && cos.is_contiguous() && sin.is_contiguous() && rows.size(0) == t &&
              slots.size(0) == t && values.size(3) >= d && keys.size(1) == kv_heads,
              "multispec_dpbf16::llama_layer: shapes do not agree");
  TORCH_CHECK(fused.size() % 2 == 0, "multispec_dpbf16::llama_layer: fused spans as (start, count) pairs");
  auto product = [&](const at::Tensor& x, const at::Tensor& w, int64_t n, int map) {
    return (tiles >> map) & 1 ? linear_tiles(x, w, c10::nullopt, n) : linear(x, w, c10::nullopt, n);
  };
  const at::Tensor q = product(x, weights[1], heads * d, 0), k = product(x, weights[2], kv_heads * d, 1);
  const at::Tensor v = product(x, weights[3], kv_heads * d, 2);
  at::Tensor query = at::empty({t, heads, d}, hidden.options()), key = at::empty({t, kv_heads, d}, hidden.options());
  const at::Tensor r = rows.contiguous(), s = slots.contiguous();
  const int64_t* rp = r.data_ptr<int64_t>();
  const int64_t* sp = s.data_ptr<int64_t>();
  for (int64_t i = 0; i < t; ++i)
    TORCH_CHECK(rp[i] >= 0 && rp[i] < keys.size(0) && sp[i] >= 0 && sp[i] < keys.size(2) &&
                sp[i] < values.size(2), "multispec_dpbf16::llama_layer: a row or slot out of range");
  const float* cp = cos.data_ptr<float>();
  const float* np = sin.data_ptr<float>();
  const at::BFloat16* vp = v.data_ptr<at::BFloat16>();
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t head = 0; head < heads; ++head)
      rotate(q.data_ptr<at::BFloat16>() + (i * heads + head) * d, cp + i * d, np + i * d, d,
             query.data_ptr<at::BFloat16>() + (i * heads + head) * d);
    for (int64_t head = 0; head < kv_heads; ++head) {
      at::BFloat16* kh = key.data_ptr<at::BFloat16>() + (i * kv_heads + head) * d;
      rotate(k.data_ptr<at::BFloat16>() + (i * kv_heads + head) * d, cp + i * d, np + i * d, d, kh);
      const at::BFloat16* vh = vp + (i * kv_heads + head) * d;
      const int64_t at_k = rp[i] * keys.stride(0) + head * keys.stride(1) + sp[i] * keys.stride(2);
      const int64_t at_v = rp[i] * values.stride(0) + head * values.stride(1) + sp[i] * values.stride(2);
      if (keys.scalar_type() == at::kFloat) {  // bfloat16 numbers held exactly in float32
        float* kd = keys.data_ptr<float>() + at_k;
        float* vd = values.data_ptr<float>() + at_v;
        for (int64_t j = 0; j < d; ++j) kd[j] = static_cast<float>(kh[j]), vd[j] = static_cast<float>(vh[j]);
        for (int64_t j = d; j < values.size(3); ++j) vd[j] = 1.0f;
      } else {
        at::BFloat16* kd = keys.data_ptr<at::BFloat16>() + at_k;
        at::BFloat16* vd = values.data_ptr<at::BFloat16>() + at_v;
        std::memcpy(kd, kh, d * sizeof(at::BFloat16));
        std::memcpy(vd, vh, d * sizeof(at::BFloat16));
        for (int64_t j = d; j < values.size(3); ++j) vd[j] = at::BFloat16(1.0f);
      }
    }
  }
  at::Tensor attended = attend_tokens(query, keys, values, r, mask, d, scaling);
  for (size_t f = 0; f < fused.size(); f += 2) {  // a prompt's first tokens: as `static.attention` attends them
    const int64_t start = fused[f], count = fused[f + 1];
    auto span = [&](const at::Tensor& a, int64_t n) { return a.narrow(0, start, count).view({count, n, d}).transpose(0, 1).unsqueeze(0); };
    const at::Tensor head = at::scaled_dot_product_attention(span(query, heads), span(key, kv_heads), span(v, kv_heads),
                                                             c10::nullopt, 0.0, true, scaling, true);
    attended.narrow(0, start, count).copy_(head[0].transpose(0, 1));
  }
  at::Tensor out = product(attended.view({t, heads * d}), weights[4], h, 3);
  add_rows(hidden.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(), t * h);
  const at::Tensor y = norm_rows(out, weights[5], static_cast<float>(eps));
  at::Tensor gate = product(y, weights[6], inter, 4);
  const at::Tensor up = product(y, weights[7], inter, 5);
  silu_times(gate.data_ptr<at::BFloat16>(), up.data_ptr<at::BFloat16>(), gate.data_ptr<at::BFloat16>(), t * inter);
  at::Tensor down = product(gate, weights[8], h, 6);
  add_rows(out.data_ptr<at::BFloat16>(), down.data_ptr<at::BFloat16>(), down.data_ptr<at::BFloat16>(), t * h);
  return down;
}

// One decoder layer over T packed tokens. hidden [T, H] bfloat16; weights: the input norm [H], the packed q, k,
// v, o maps, the post-attention norm [H], the packed gate, up and down maps; keys [R, Hkv, C, d] and values
// [R, Hkv, C, >= d] (float32 or bfloat16: a cache's buffers; a value column past d is set to 1, `with_ones`); cos,
// sin [T, d] float32; token t writes its entry at row rows[t], slot slots[t], and attends with mask[t] [K]
// (additive float32) over its row; fused: (start, count) pairs, spans of a prompt's first tokens that attend
// causally among themselves through torch's fused attention instead (as a prompt alone does); tiles: bit i set,
// the i-th map of q, k, v, o, gate, up, down runs on AMX tiles (`linear_tiles`), else on `linear`. Returns the
// layer's output [T, H].
at::Tensor llama_layer(const at::Tensor& hidden, at::TensorList weights, const at::Tensor& keys,
                       const at::Tensor& values, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& rows,
                       const at::Tensor& slots, const at::Tensor& mask, at::IntArrayRef fused, int64_t heads,
                       int64_t kv_heads, int64_t inter, double eps, double scaling, int64_t tiles) {
  TORCH_CHECK(weights.size() == 9, "multispec_dpbf16::llama_layer: nine weights");
  TORCH_CHECK(hidden.dim() == 2 && hidden.scalar_type() == at::kBFloat16 && hidden.is_contiguous(),
              "multispec_dpbf16::llama_layer: hidden [T, H] bfloat16, contiguous");
  const at::Tensor x = norm_rows(hidden, weights[0], static_cast<float>(eps));
  return layer_after_norm(x, hidden, weights, keys, values, cos, sin, rows, slots, mask, fused, heads, kv_heads,
                          inter, eps, scaling, tiles);
}

// A feature-level draft head's decoder layer (EAGLE-3, `models/eagle.py`) over T packed tokens: attention over
// [normed embedding, normed feature] (2H wide), its output added to the normed feature (`normed_residual`) or to
// the feature itself, then the MLP as a Llama layer's. embeds, features [T, H] bfloat16; weights: `llama_layer`'s
// nine (the input norm is the embedding's; q, k, v read 2H), then the feature's norm [H]. The rest as
// `llama_layer`'s (no fused spans).
at::Tensor head_layer(const at::Tensor& embeds, const at::Tensor& features, at::TensorList weights,
                      const at::Tensor& keys, const at::Tensor& values, const at::Tensor& cos, const at::Tensor& sin,
                      const at::Tensor& rows, const at::Tensor& slots, const at::Tensor& mask, int64_t heads,
                      int64_t kv_heads, int64_t inter, double eps, double scaling, int64_t tiles,
                      bool normed_residual) {
  TORCH_CHECK(weights.size() == 10, "multispec_dpbf16::head_layer: ten weights");
  TORCH_CHECK(embeds.dim() == 2 && embeds.scalar_type() == at::kBFloat16 && embeds.is_contiguous() &&
              features.sizes() == embeds.sizes() && features.scalar_type() == at::kBFloat16 &&
              features.is_contiguous(), "multispec_dpbf16::head_layer: embeds and features [T, H] bfloat16");
  const at::Tensor normed = norm_rows(features, weights[9], static_cast<float>(eps));
  const at::Tensor x = at::cat({norm_rows(embeds, weights[0], static_cast<float>(eps)), normed}, 1);
  return layer_after_norm(x, normed_residual ? normed : features, weights, keys, values, cos, sin, rows, slots, mask,
                          {}, heads, kv_heads, inter, eps, scaling, tiles);
}

// RMSNorm of each row (`llama_layer`'s), for the final norm
at::Tensor norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous() &&
              weight.scalar_type() == at::kBFloat16 && weight.numel() == x.size(1),
              "multispec_dpbf16::norm: x [T, H] bfloat16 and a bfloat16 weight [H]");
  return norm_rows(x, weight.contiguous(), static_cast<float>(eps));
}

// modes[i]: the Prefetch of `linear` on i rows (i >= 1; the last entry stands for every larger number too)
void set_prefetch(at::IntArrayRef modes) {
  TORCH_CHECK(modes.size() >= 2, "multispec_dpbf16::set_prefetch: give a mode for 1 row at least");
  for (const int64_t mode : modes)
    TORCH_CHECK(mode == kNone || mode == kNear || mode == kAhead, "multispec_dpbf16::set_prefetch: no mode ", mode);
  for (int64_t rows = 0; rows <= kMaxRows; ++rows)
    prefetch_for_rows[rows] = static_cast<int8_t>(modes[std::min<int64_t>(rows, modes.size() - 1)]);
}

}  // namespace

TORCH_LIBRARY(multispec_dpbf16, m) {
  m.def("linear(Tensor input, Tensor packed, Tensor? bias, int out_features) -> Tensor");
  m.def("linear_tiles(Tensor input, Tensor packed, Tensor? bias, int out_features) -> Tensor");
  m.def("tiles() -> bool", &tiles);
  m.def("attend(Tensor query, Tensor keys, Tensor values, Tensor mask, int dv, float scaling) -> Tensor");
  m.def("attend_tokens(Tensor query, Tensor keys, Tensor values, Tensor rows, Tensor mask, int dv, float scaling) -> Tensor");
  m.def("set_prefetch(int[] modes) -> ()", &set_prefetch);
  m.def("llama_layer(Tensor hidden, Tensor[] weights, Tensor(a!) keys, Tensor(b!) values, Tensor cos, Tensor sin, "
        "Tensor rows, Tensor slots, Tensor mask, int[] fused, int heads, int kv_heads, int inter, float eps, "
        "float scaling, int tiles) -> Tensor");
  m.def("head_layer(Tensor embeds, Tensor features, Tensor[] weights, Tensor(a!) keys, Tensor(b!) values, Tensor cos, "
        "Tensor sin, Tensor rows, Tensor slots, Tensor mask, int heads, int kv_heads, int inter, float eps, "
        "float scaling, int tiles, bool normed_residual) -> Tensor");
  m.def("norm(Tensor x, Tensor weight, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(multispec_dpbf16, CPU, m) {
  m.impl("linear", &linear);
  m.impl("linear_tiles", &linear_tiles);
  m.impl("attend", &attend);
  m.impl("attend_tokens", &attend_tokens);
  m.impl("llama_layer", &llama_layer);
  m.impl("head_layer", &head_layer);
  m.impl("norm", &norm);
}
