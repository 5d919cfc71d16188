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
// register tile (12 ymm accumulators, the BLIS-style AVX2 micro-kernel). bf16 -> fp32 is exact (a shift).
// x (bf16 or fp32) is widened to fp32 once per call. Each output is rounded to bf16 (nearest-even) once,
// after the bias is added in fp32: the same values F.linear computes up to the fp32 summation order.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cstdint>
#include <cstring>

namespace {

constexpr int NR = 16;  // output rows per panel
constexpr int MR = 6;   // input rows per register tile

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
// With 2 M independent FMA chains even M = 1 keeps ~4 weights per cycle in flight, above what one core
// can stream from memory.
template <int M>
inline void tile(const float* x, int64_t ldx, const uint16_t* w, int64_t K, float* out /* [M][16] */) {
  __m256 c0[M], c1[M];
  for (int m = 0; m < M; ++m) { c0[m] = _mm256_setzero_ps(); c1[m] = _mm256_setzero_ps(); }
  for (int64_t k = 0; k < K; ++k) {
    __m256 w0, w1;
    widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k * NR)), w0, w1);
    for (int m = 0; m < M; ++m) {
      __m256 xb = _mm256_broadcast_ss(x + m * ldx + k);
      c0[m] = _mm256_fmadd_ps(xb, w0, c0[m]);
      c1[m] = _mm256_fmadd_ps(xb, w1, c1[m]);
    }
  }
  for (int m = 0; m < M; ++m) {
    _mm256_storeu_ps(out + m * NR, c0[m]);
    _mm256_storeu_ps(out + m * NR + 8, c1[m]);
  }
}

inline void tile_any(int m, const float* x, int64_t ldx, const uint16_t* w, int64_t K, float* out) {
  switch (m) {
    case 6: tile<6>(x, ldx, w, K, out); break;
    case 5: tile<5>(x, ldx, w, K, out); break;
    case 4: tile<4>(x, ldx, w, K, out); break;
    case 3: tile<3>(x, ldx, w, K, out); break;
    case 2: tile<2>(x, ldx, w, K, out); break;
    default: tile<1>(x, ldx, w, K, out); break;
  }
}

inline uint16_t round_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
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
  at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
    alignas(32) float acc[MR * NR];
    for (int64_t p = p0; p < p1; ++p) {
      const uint16_t* w = wp + p * K * NR;
      const int64_t n0 = p * NR, nn = std::min<int64_t>(NR, N - n0);
      for (int64_t m0 = 0; m0 < M; m0 += MR) {
        const int mm = static_cast<int>(std::min<int64_t>(MR, M - m0));
        tile_any(mm, xp + m0 * K, K, w, K, acc);
        for (int m = 0; m < mm; ++m) {
          uint16_t* row = yp + (m0 + m) * N + n0;
          for (int64_t j = 0; j < nn; ++j) row[j] = round_bf16(acc[m * NR + j] + (has_bias ? bp[n0 + j] : 0.0f));
        }
      }
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_bf16", &linear_bf16, "y = x @ W^T (+ b), bf16 weights packed [N/16, K, 16], fp32 accumulation");
}
