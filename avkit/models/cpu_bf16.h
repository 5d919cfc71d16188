// bf16 helpers shared by the CPU backend's kernels (cpu_linear*.cpp, cpu_attention.cpp).
#pragma once
#include <cstdint>
#include <cstring>

namespace avkit {

inline uint16_t round_bf16(float f) {  // fp32 -> bf16, round to nearest even; NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// The linear kernels' last step: `pn` panels of 16 outputs from panel p0 on, their fp32 sums for `rows` rows
// (acc: panel j, row m at acc[j * lda + m * 16]), plus the bias in fp32, rounded once to bf16 into rows of y [., N].
inline void store_panels(const float* acc, int64_t lda, int64_t pn, int64_t rows, int64_t p0, int64_t N,
                         const float* bias, uint16_t* y) {
  for (int64_t j = 0; j < pn; ++j) {
    const int64_t n0 = (p0 + j) * 16, nn = N - n0 < 16 ? N - n0 : 16;
    for (int64_t m = 0; m < rows; ++m) {
      uint16_t* row = y + m * N + n0;
      const float* a = acc + j * lda + m * 16;
      for (int64_t jj = 0; jj < nn; ++jj) row[jj] = round_bf16(a[jj] + (bias ? bias[n0 + jj] : 0.0f));
    }
  }
}

}  // namespace avkit
