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

#include <algorithm>
#include <cstdint>

namespace {

constexpr int64_t kColumns = 16;  // output columns per packed block (one float32 vector)
constexpr int kBlocks = 3;        // blocks a thread computes together: 8 rows x 3 blocks = 24 accumulators

// rows [0, R) of x (pairs of bfloat16 as uint32, `pairs` per row) times `B` blocks of the packed weight,
// written as bfloat16 to y (row stride ldy) from column `column`
template <int R, int B>
inline void tile(const uint32_t* x, int64_t pairs, const uint16_t* w, const float* bias, at::BFloat16* y,
                 int64_t ldy, int64_t column) {
  __m512 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  for (int64_t j = 0; j < pairs; ++j) {
    __m512i weights[B];
    for (int b = 0; b < B; ++b) weights[b] = _mm512_loadu_si512(w + (b * pairs + j) * 2 * kColumns);
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
// blocks read from memory by the first tile and from cache by the rest
template <int B>
void blocks(const uint32_t* x, int64_t rows, int64_t pairs, const uint16_t* packed, int64_t first,
            const float* bias, at::BFloat16* y, int64_t ldy) {
  const uint16_t* w = packed + first * pairs * 2 * kColumns;
  const int64_t column = first * kColumns;
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8) tile<8, B>(x + r * pairs, pairs, w, bias, y + r * ldy, ldy, column);
  for (; r + 4 <= rows; r += 4) tile<4, B>(x + r * pairs, pairs, w, bias, y + r * ldy, ldy, column);
  for (; r + 2 <= rows; r += 2) tile<2, B>(x + r * pairs, pairs, w, bias, y + r * ldy, ldy, column);
  for (; r < rows; ++r) tile<1, B>(x + r * pairs, pairs, w, bias, y + r * ldy, ldy, column);
}

at::Tensor linear(const at::Tensor& input, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                  int64_t out_features) {
  TORCH_CHECK(input.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16,
              "multispec_dpbf16::linear takes bfloat16 inputs and weights");
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kColumns && packed.size(3) == 2 && packed.is_contiguous(),
              "multispec_dpbf16::linear: the weight must be packed by multispec.models.dpbf16.pack");
  const int64_t in_features = input.size(-1);
  TORCH_CHECK(in_features == 2 * packed.size(1), "multispec_dpbf16::linear: the input has ", in_features,
              " features, the packed weight ", 2 * packed.size(1));
  const int64_t n_blocks = packed.size(0);
  TORCH_CHECK(out_features <= n_blocks * kColumns, "multispec_dpbf16::linear: more outputs than the weight has");
  const at::Tensor x = input.reshape({-1, in_features}).contiguous();
  const int64_t rows = x.size(0);
  const int64_t width = n_blocks * kColumns;
  at::Tensor y = at::empty({rows, width}, x.options());
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = at::zeros({width}, x.options().dtype(at::kFloat));
    b.narrow(0, 0, out_features).copy_(*bias);
  }
  const auto* xp = reinterpret_cast<const uint32_t*>(x.data_ptr());
  const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr());
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  auto* yp = y.data_ptr<at::BFloat16>();
  const int64_t pairs = in_features / 2;
  const int64_t groups = n_blocks / kBlocks;
  at::parallel_for(0, groups, 1, [&](int64_t start, int64_t end) {
    for (int64_t g = start; g < end; ++g) blocks<kBlocks>(xp, rows, pairs, wp, g * kBlocks, bp, yp, width);
  });
  for (int64_t i = groups * kBlocks; i < n_blocks; ++i) blocks<1>(xp, rows, pairs, wp, i, bp, yp, width);
  if (width != out_features) y = y.narrow(1, 0, out_features).contiguous();
  auto sizes = input.sizes().vec();
  sizes.back() = out_features;
  return y.view(sizes);
}

}  // namespace

TORCH_LIBRARY(multispec_dpbf16, m) {
  m.def("linear(Tensor input, Tensor packed, Tensor? bias, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(multispec_dpbf16, CPU, m) { m.impl("linear", &linear); }
