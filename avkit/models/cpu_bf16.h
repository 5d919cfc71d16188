// bf16 helpers shared by the CPU backend's kernels (cpu_linear.cpp, cpu_attention.cpp).
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

}  // namespace avkit
