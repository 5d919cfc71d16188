// y = x @ W^T (+ b) with bfloat16 weights on an AVX2 + FMA CPU: fp32 accumulation, bf16 output.
//
// Why: on x86 CPUs without AVX512-BF16 / AMX, PyTorch's bf16 matmul with more than one row falls back to
// a scalar gemm (~10x below memory bandwidth at 4 rows, ~70x at 96), and oneDNN refuses bf16 there.
// Decoding reads every weight once per forward, so the kernel must stream the weights at memory
// bandwidth for a few rows (decode, verify) and stay compute-bound-efficient for many (prefill).
//
// Layout: W is pre-packed once into panels of 16 output rows, [N/16][K][16] bf16 (N padded to 16; the 16
// columns of each k in the order widen() needs), so
// the inner loop reads 32 contiguous bytes per k and does an outer-product update of a 6 x 16 fp32
// register tile (12 ymm accumulators, the BLIS-style AVX2 micro-kernel), or 1 x 64 / 2 x 32 at one or two
// rows. k is blocked (KC) so a panel block stays in L1 across row tiles, and weights are prefetched ahead.
// bf16 -> fp32 is exact (a shift). Measured on a 2-core AVX2 Zen 3 (bench/results/cpu_linear.md): 1.2-1.5x the
// unblocked 6 x 16 kernel at 1-64 rows; 1-4 rows run at memory bandwidth, 8+ rows at ~90 GFLOP/s.
// x (bf16 or fp32) is widened to fp32 once per call. Each output is rounded to bf16 (nearest-even) once,
// after the bias is added in fp32: the same values F.linear computes up to the fp32 summation order.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include "cpu_bf16.h"
#include <cstdint>
#include <cstring>
#include <vector>
#include <algorithm>

namespace {

constexpr int NR = 16;  // output rows per panel
constexpr int MR = 6;   // input rows per register tile
constexpr int64_t PF_K = 64;  // software prefetch distance in k (2 KiB of a panel)
constexpr int64_t KC = 256;  // k per block: a panel block is KC x 32 B = 8 KiB, a tile's x block 6 KiB

// 16 bf16 -> two 8 x fp32 (exact: a bf16 is the high half of an fp32). unpack{lo,hi} interleave within
// 128-bit lanes, so pack() stores each k's 16 values as columns (0-3, 8-11, 4-7, 12-15): lo -> 0-7, hi -> 8-15.
inline void widen(__m256i v, __m256& lo, __m256& hi) {
  const __m256i zero = _mm256_setzero_si256();
  lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
  hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
}

// One fp32 accumulator per output, summed over k in order whatever M is: a row's result does not depend on
// which other rows share the call (batch invariance: a verify forward of 1 + k tokens gives the same
// logits a one-token decode would, so greedy speculative output equals greedy target-only output).
// A tile covers M rows x NP panels and continues the sums already in `acc` (k-blocking reloads them), which
// keeps that order. At M = 1 and 2 it spans 4 and 2 panels, so 8 independent FMA chains and 4 or 2 weight
// streams are in flight (2 chains alone are latency-bound below memory bandwidth). The loops are fully
// unrolled so GCC keeps the accumulators in registers (without it, it stored all 12 to the stack on every k).
template <int M, int NP>
inline void tile(const float* x, int64_t ldx, const uint16_t* w, int64_t ldw, int64_t kn, float* acc, int64_t lda) {
  __m256 c[NP][M][2];
#pragma GCC unroll 8
  for (int j = 0; j < NP; ++j)
#pragma GCC unroll 8
    for (int i = 0; i < M; ++i) {
      c[j][i][0] = _mm256_loadu_ps(acc + j * lda + i * NR);
      c[j][i][1] = _mm256_loadu_ps(acc + j * lda + i * NR + 8);
    }
  for (int64_t k = 0; k < kn; ++k) {
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) {
      // one line (2 k) per 2 k, PF_K ahead: the next block and panel are contiguous, so this runs ahead of the
      // stream into whatever comes next (measured: 1 stream alone reached ~10 GB/s, 4 with prefetch ~34)
      if ((k & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(w + j * ldw + (k + PF_K) * NR), _MM_HINT_T0);
      __m256 w0, w1;
      widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j * ldw + k * NR)), w0, w1);
#pragma GCC unroll 8
      for (int i = 0; i < M; ++i) {
        const __m256 xb = _mm256_broadcast_ss(x + i * ldx + k);
        c[j][i][0] = _mm256_fmadd_ps(xb, w0, c[j][i][0]);
        c[j][i][1] = _mm256_fmadd_ps(xb, w1, c[j][i][1]);
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NP; ++j)
#pragma GCC unroll 8
    for (int i = 0; i < M; ++i) {
      _mm256_storeu_ps(acc + j * lda + i * NR, c[j][i][0]);
      _mm256_storeu_ps(acc + j * lda + i * NR + 8, c[j][i][1]);
    }
}

// m (1..6) rows x one panel
inline void tile_rows(int m, const float* x, int64_t ldx, const uint16_t* w, int64_t kn, float* acc) {
  switch (m) {
    case 6: tile<6, 1>(x, ldx, w, 0, kn, acc, 0); break;
    case 5: tile<5, 1>(x, ldx, w, 0, kn, acc, 0); break;
    case 4: tile<4, 1>(x, ldx, w, 0, kn, acc, 0); break;
    case 3: tile<3, 1>(x, ldx, w, 0, kn, acc, 0); break;
    case 2: tile<2, 1>(x, ldx, w, 0, kn, acc, 0); break;
    default: tile<1, 1>(x, ldx, w, 0, kn, acc, 0); break;
  }
}

}  // namespace

// x [M, K] bf16 or fp32 contiguous; packed [P, K, 16] bf16 (P = ceil(N / 16)); bias [N] or empty -> [M, N] bf16
torch::Tensor linear_bf16(torch::Tensor x, torch::Tensor packed, torch::Tensor bias, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.size(2) == NR, "linear_bf16: bad shapes");
  TORCH_CHECK(packed.scalar_type() == torch::kBFloat16 && packed.is_contiguous(), "linear_bf16: packed weight");
  const int64_t M = x.size(0), K = x.size(1), P = packed.size(0);
  TORCH_CHECK(packed.size(1) == K && P * NR >= N, "linear_bf16: weight does not match x");
  auto xf = x.to(torch::kFloat32).contiguous();  // [M, K]
  auto y = torch::empty({M, N}, x.options().dtype(torch::kBFloat16));
  const float* xp = xf.data_ptr<float>();
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  uint16_t* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  const bool has_bias = bias.numel() > 0;
  auto bf = has_bias ? bias.to(torch::kFloat32).contiguous() : bias;
  const float* bp = has_bias ? bf.data_ptr<float>() : nullptr;
  // Work unit: a group of NP panels (NP = 4 at one row, 2 at two, else 1). Within it k runs in blocks of KC,
  // and within a block over row tiles, so the panel block (KC x 32 B) stays in L1 across the tiles and a tile's
  // x rows (<= 6 x KC x 4 B) come from L1/L2; without blocking a tile swept all of K for x and w, past L1.
  // Rows split into ceil(M / 6) tiles of balanced size (8 -> 4 + 4, not 6 + 2).
  const int np = M == 1 ? 4 : M == 2 ? 2 : 1;
  const int64_t groups = (P + np - 1) / np, tiles = (M + MR - 1) / MR;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    std::vector<float> acc(static_cast<size_t>(np * M) * NR);  // [np][M][16]: the group's fp32 sums
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t pf = g * np, pn = std::min<int64_t>(np, P - pf);
      const uint16_t* w = wp + pf * K * NR;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kn = std::min<int64_t>(KC, K - k0);
        if (np == 4 && pn == 4) {
          tile<1, 4>(xp + k0, K, w + k0 * NR, K * NR, kn, acc.data(), M * NR);
        } else if (np == 2 && pn == 2) {
          tile<2, 2>(xp + k0, K, w + k0 * NR, K * NR, kn, acc.data(), M * NR);
        } else {
          for (int64_t j = 0; j < pn; ++j) {
            for (int64_t t = 0, m0 = 0; t < tiles; ++t) {
              const int mm = static_cast<int>(M / tiles + (t < M % tiles));
              tile_rows(mm, xp + m0 * K + k0, K, w + j * K * NR + k0 * NR, kn, acc.data() + (j * M + m0) * NR);
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
  m.def("linear_bf16", &linear_bf16, "y = x @ W^T (+ b), bf16 weights packed [N/16, K, 16], fp32 accumulation");
}
