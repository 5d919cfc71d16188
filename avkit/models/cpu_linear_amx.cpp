// y = x @ W^T (+ b) with bfloat16 weights and inputs on a CPU with AMX: fp32 accumulation, bf16 output.
//
// Verify forwards multiply B x (1 + k) rows by each weight; from ~8 rows on the AVX2 and AVX512-BF16 kernels are
// compute-bound (~100 GFLOP/s on 2 cores), while one AMX TDPBF16PS multiplies a 16 x 32 tile of x by a 32 x 16 tile
// of W. Here every call runs on AMX tiles, so 1-64 rows cost about what reading the weight costs.
//
// Layout: W packed as for the AVX512-BF16 kernel, [N/16][K/2][16][2] bf16 (K padded to a multiple of 32): 16 k-pairs
// of one panel are one 16-row x 64-byte B tile. x is read in blocks of 16 rows; the last block's A and C tiles are
// configured with only its rows. Per output the sum runs over k in blocks of 32, one TDPBF16PS per block, in order,
// and TDPBF16PS computes each row of C from that row of A alone: a row's result does not depend on the other rows
// of the call, nor on the block or tile height it falls in (batch invariance, as in cpu_linear.cpp). Each output
// is rounded to bf16 once, after the bias is added in fp32.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "cpu_bf16.h"
#include <cstdint>
#include <cstring>
#include <vector>
#include <algorithm>

namespace {

constexpr int NR = 16;  // outputs per panel = columns of a C tile
constexpr int MB = 16;  // rows of x per block = rows of an A / C tile
constexpr int KB = 32;  // k per TDPBF16PS (16 pairs)
constexpr int NP = 4;   // panels per work unit: C tiles 0-3, A tile 4, B tiles 5-7
constexpr int PF_STEPS = 4;  // prefetch distance in k-steps of 32 (4 KiB of a panel)

struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

bool request_amx() {  // Linux: a process must ask for the AMX tile state once (ARCH_REQ_XCOMP_PERM, XTILEDATA)
  return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

void configure(int rows) {  // C tiles 0-3 and the A tile 4 hold `rows` rows of x; B tiles 5-7 16 k-pairs
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = t < 5 ? rows : 16;
    cfg.colsb[t] = 64;  // C: 16 fp32; A: 32 bf16; B: 16 pairs of bf16
  }
  _tile_loadconfig(&cfg);
}

// C tile j (j < np) of one row block over all of K: A from x (stride ldx bytes), B from panel j (stride 64 bytes).
template <int NPT>
inline void block(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t ldw, int64_t K, float* out) {
  _tile_zero(0);
  if (NPT > 1) _tile_zero(1);
  if (NPT > 2) _tile_zero(2);
  if (NPT > 3) _tile_zero(3);
  for (int64_t k = 0; k < K; k += KB) {
    _tile_loadd(4, x + k, ldx);
    const uint16_t* b = w + k * NR;  // [K/2][16][2]: k-pair k/2 starts at element k * 16
    // tile loads from memory stall without help: prefetch each panel's B tile PF_STEPS k-steps ahead (16 lines of
    // 64 bytes each); past K this runs into the next panel or group, which comes next anyway
#pragma GCC unroll 4
    for (int j = 0; j < NPT; ++j) {
      const char* pf = reinterpret_cast<const char*>(b + j * ldw + PF_STEPS * KB * NR);
#pragma GCC unroll 16
      for (int l = 0; l < 16; ++l) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);
    }
    _tile_loadd(5, b, 64);
    _tile_dpbf16ps(0, 4, 5);
    if (NPT > 1) { _tile_loadd(6, b + ldw, 64); _tile_dpbf16ps(1, 4, 6); }
    if (NPT > 2) { _tile_loadd(7, b + 2 * ldw, 64); _tile_dpbf16ps(2, 4, 7); }
    if (NPT > 3) { _tile_loadd(5, b + 3 * ldw, 64); _tile_dpbf16ps(3, 4, 5); }
  }
  _tile_stored(0, out, NR * 4);
  if (NPT > 1) _tile_stored(1, out + MB * NR, NR * 4);
  if (NPT > 2) _tile_stored(2, out + 2 * MB * NR, NR * 4);
  if (NPT > 3) _tile_stored(3, out + 3 * MB * NR, NR * 4);
}

}  // namespace

bool available() { return request_amx(); }

// x [M, K] bf16 contiguous (K a multiple of 32); packed [P, K/2, 16, 2] bf16; bias [N] or empty -> [M, N] bf16
torch::Tensor linear_bf16(torch::Tensor x, torch::Tensor packed, torch::Tensor bias, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 4 && packed.size(2) == NR && packed.size(3) == 2, "linear_bf16: shapes");
  TORCH_CHECK(packed.scalar_type() == torch::kBFloat16 && packed.is_contiguous(), "linear_bf16: packed weight");
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.is_contiguous(), "linear_bf16: x must be contiguous bf16");
  const int64_t M = x.size(0), K = x.size(1), P = packed.size(0);
  TORCH_CHECK(K == 2 * packed.size(1) && K % KB == 0 && P * NR >= N, "linear_bf16: weight does not match x");
  TORCH_CHECK(request_amx(), "linear_bf16: the OS refused the AMX tile state");
  const int64_t blocks = (M + MB - 1) / MB;
  auto y = torch::empty({M, N}, x.options());
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  uint16_t* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  const bool has_bias = bias.numel() > 0;
  auto bf = has_bias ? bias.to(torch::kFloat32).contiguous() : bias;
  const float* bp = has_bias ? bf.data_ptr<float>() : nullptr;
  const int64_t ldw = K * NR;  // elements per panel
  const int64_t groups = (P + NP - 1) / NP;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    int configured = 0;  // tile state is per thread
    alignas(64) float acc[NP * MB * NR];
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t pf = g * NP, pn = std::min<int64_t>(NP, P - pf);
      const uint16_t* w = wp + pf * ldw;
      for (int64_t r = 0; r < blocks; ++r) {  // the group's panels stay in L2 across row blocks
        const int rows = static_cast<int>(std::min<int64_t>(MB, M - r * MB));
        if (rows != configured) configure(configured = rows);
        const uint16_t* xb = xp + r * MB * K;
        switch (pn) {
          case 4: block<4>(xb, K * 2, w, ldw, K, acc); break;
          case 3: block<3>(xb, K * 2, w, ldw, K, acc); break;
          case 2: block<2>(xb, K * 2, w, ldw, K, acc); break;
          default: block<1>(xb, K * 2, w, ldw, K, acc); break;
        }
        avkit::store_panels(acc, MB * NR, pn, rows, pf, N, bp, yp + r * MB * N);
      }
    }
    _tile_release();
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("available", &available, "the OS grants this process the AMX tile state");
  m.def("linear_bf16", &linear_bf16, "y = x @ W^T (+ b) on AMX, bf16 weights packed [N/16, K/2, 16, 2], fp32 sums");
}
