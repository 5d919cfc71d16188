// y = x @ W^T (+ b) with bfloat16 weights and inputs on an AVX512-BF16 CPU: fp32 accumulation, bf16 output.
//
// The AVX2 kernel (cpu_linear.cpp) widens every bf16 weight to fp32 and does one 8-wide FMA per 8 products;
// from ~4 rows on it is compute-bound (~35-90 GFLOP/s on 2 cores), which is what a verify forward of B x (1 + k)
// rows pays. VDPBF16PS multiplies 16 pairs of bf16 and adds both products to 16 fp32 sums in one instruction
// (4x the products per instruction, no widening), so 1-32 rows stay at memory bandwidth.
//
// Layout: W is pre-packed once into panels of 16 output rows holding k in pairs, [N/16][K/2][16][2] bf16 (N padded
// to 16, K to even with zeros), so one 64-byte load is the 16 outputs' weights for k and k + 1, and one 32-bit
// broadcast of x's (k, k + 1) pair feeds it. Per output the sum runs over the k pairs in order, each pair added by
// one VDPBF16PS (round to nearest even, denormals flushed), whatever M is or the tile a row falls in: a row's
// result does not depend on the other rows of the call (batch invariance, as in cpu_linear.cpp). Each output is
// rounded to bf16 once, after the bias is added in fp32.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include "cpu_bf16.h"
#include <cstdint>
#include <vector>
#include <algorithm>

namespace {

constexpr int NR = 16;   // output rows per panel
constexpr int MR = 12;   // input rows per register tile (2 panels x 12 rows = 24 zmm accumulators)
constexpr int64_t PF = 32;   // prefetch distance in k pairs (2 KiB of a panel)
constexpr int64_t KC = 128;  // k pairs per block: a panel block is 8 KiB

// M rows x NP panels over kn k-pairs, continuing the sums in acc ([NP][M][16] at stride lda per panel).
template <int M, int NP>
inline void tile(const uint32_t* x, int64_t ldx, const uint16_t* w, int64_t ldw, int64_t kn, float* acc, int64_t lda) {
  __m512 c[NP][M];
#pragma GCC unroll 16
  for (int j = 0; j < NP; ++j)
#pragma GCC unroll 16
    for (int i = 0; i < M; ++i) c[j][i] = _mm512_loadu_ps(acc + j * lda + i * NR);
  for (int64_t k = 0; k < kn; ++k) {
    __m512bh wv[NP];
#pragma GCC unroll 16
    for (int j = 0; j < NP; ++j) {
      const uint16_t* p = w + j * ldw + k * 2 * NR;
      _mm_prefetch(reinterpret_cast<const char*>(p + PF * 2 * NR), _MM_HINT_T0);
      wv[j] = (__m512bh)_mm512_loadu_si512(p);
    }
#pragma GCC unroll 16
    for (int i = 0; i < M; ++i) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[i * ldx + k]));
#pragma GCC unroll 16
      for (int j = 0; j < NP; ++j) c[j][i] = _mm512_dpbf16_ps(c[j][i], xb, wv[j]);
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < NP; ++j)
#pragma GCC unroll 16
    for (int i = 0; i < M; ++i) _mm512_storeu_ps(acc + j * lda + i * NR, c[j][i]);
}

// m (1..MR) rows x 2 panels (or 1 when only one is left)
template <int NP>
inline void tile_rows(int m, const uint32_t* x, int64_t ldx, const uint16_t* w, int64_t ldw, int64_t kn, float* acc,
                      int64_t lda) {
  switch (m) {
#define AVKIT_CASE(R) case R: tile<R, NP>(x, ldx, w, ldw, kn, acc, lda); break;
    AVKIT_CASE(12) AVKIT_CASE(11) AVKIT_CASE(10) AVKIT_CASE(9) AVKIT_CASE(8) AVKIT_CASE(7)
    AVKIT_CASE(6) AVKIT_CASE(5) AVKIT_CASE(4) AVKIT_CASE(3) AVKIT_CASE(2)
#undef AVKIT_CASE
    default: tile<1, NP>(x, ldx, w, ldw, kn, acc, lda); break;
  }
}

}  // namespace

// x [M, K2 * 2] bf16 contiguous (K padded to even); packed [P, K2, 16, 2] bf16; bias [N] or empty -> [M, N] bf16
torch::Tensor linear_bf16(torch::Tensor x, torch::Tensor packed, torch::Tensor bias, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 4 && packed.size(2) == NR && packed.size(3) == 2, "linear_bf16: shapes");
  TORCH_CHECK(packed.scalar_type() == torch::kBFloat16 && packed.is_contiguous(), "linear_bf16: packed weight");
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.is_contiguous(), "linear_bf16: x must be contiguous bf16");
  const int64_t M = x.size(0), K2 = packed.size(1), P = packed.size(0);
  TORCH_CHECK(x.size(1) == 2 * K2 && P * NR >= N, "linear_bf16: weight does not match x");
  auto y = torch::empty({M, N}, x.options());
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(x.data_ptr<at::BFloat16>());  // [M, K2] pairs
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  uint16_t* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  const bool has_bias = bias.numel() > 0;
  auto bf = has_bias ? bias.to(torch::kFloat32).contiguous() : bias;
  const float* bp = has_bias ? bf.data_ptr<float>() : nullptr;
  // Work unit: a group of np panels (8 at one row, so 8 weight streams and 8 independent chains are in flight;
  // 4 at two rows; 2 from three). Within it k runs in blocks of KC pairs, and within a block over row tiles, so
  // the panel block stays in L1 across the tiles. Rows split into ceil(M / 12) tiles of balanced size.
  const int np = M == 1 ? 8 : M == 2 ? 4 : 2;
  const int64_t groups = (P + np - 1) / np, tiles = (M + MR - 1) / MR;
  const int64_t ldw = K2 * 2 * NR;  // elements per panel
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    std::vector<float> acc(static_cast<size_t>(np * M) * NR);  // [np][M][16]
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t pf = g * np, pn = std::min<int64_t>(np, P - pf);
      const uint16_t* w = wp + pf * ldw;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k0 = 0; k0 < K2; k0 += KC) {
        const int64_t kn = std::min<int64_t>(KC, K2 - k0);
        const uint16_t* wk = w + k0 * 2 * NR;
        if (np == 8 && pn == 8) {
          tile<1, 8>(xp + k0, K2, wk, ldw, kn, acc.data(), M * NR);
        } else if (np == 4 && pn == 4) {
          tile<2, 4>(xp + k0, K2, wk, ldw, kn, acc.data(), M * NR);
        } else {
          for (int64_t j = 0; j < pn; j += 2) {
            const bool two = j + 1 < pn;
            for (int64_t t = 0, m0 = 0; t < tiles; ++t) {
              const int mm = static_cast<int>(M / tiles + (t < M % tiles));
              float* a = acc.data() + (j * M + m0) * NR;
              if (two) tile_rows<2>(mm, xp + m0 * K2 + k0, K2, wk + j * ldw, ldw, kn, a, M * NR);
              else tile_rows<1>(mm, xp + m0 * K2 + k0, K2, wk + j * ldw, ldw, kn, a, M * NR);
              m0 += mm;
            }
          }
        }
      }
      avkit::store_panels(acc.data(), M * NR, pn, M, pf, N, bp, yp);
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_bf16", &linear_bf16, "y = x @ W^T (+ b), bf16 weights packed [N/16, K/2, 16, 2], fp32 sums");
}
