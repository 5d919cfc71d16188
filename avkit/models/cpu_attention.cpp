// Causal attention over a slot-based KV cache, one query row at a time, for the CPU backend (AVX2 + FMA).
//
// Why: batch invariance. A query's output must not depend on how many other queries share the forward (1 in a
// decode step, 1 + k in a verify, other requests of other lengths in the batch). torch's SDPA blocks queries
// and keys by the shapes of the call and takes a different path with a mask than without, so a token's
// attention output, and after 28 layers and an argmax its greedy token, changes with the batch in bf16.
// Here every query row (b, s, h) is computed alone over exactly its own keys [0, ends[b, s]) of slot
// slots[b], in an order fixed by that span: scores in fp32 (q . k summed over d in 8 lanes, the lanes then
// added in a fixed tree), scale, max, exp (exp8 below, the same instructions for every key), the sum of the
// exps (8 lanes in key order, then a fixed tree), the values weighted in key order in fp32, one division, one
// rounding to bf16. That is the same maths as
// SDPA's (fp32 softmax, bf16 in and out) up to the summation order. Keys are read in place from the cache:
// no gather of the batch's slots and no [B, 1, G*S, span] mask.
//
// Work unit: one (row b, query s, kv head) with its G query heads (in blocks of up to 8), which share each key
// and value load; units run in parallel, and each is computed the same way on whatever thread runs it.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include "cpu_bf16.h"
#include "cpu_simd.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using avkit::exp8;
using avkit::hsum;
using avkit::load8;
using avkit::round_bf16;

constexpr int GMAX = 16;  // query heads per kv head the kernel takes (cpu_attention.MAX_GROUP)

// GB query rows q [GB][D] (fp32) against n keys / values [n][D] (bf16) -> out [GB][D] (bf16); scores [GB][n]
// scratch. The GB rows share each key and value load; their accumulators stay in registers (GB <= 8).
template <int GB>
void attend_rows(const float* q, int64_t D, const uint16_t* k, const uint16_t* v, int64_t n, float scale,
                 float* scores, uint16_t* out, int64_t out_stride) {
  const int64_t nd = D / 8, np = (n + 7) / 8 * 8;  // scores rows padded to 8 with -inf (exp -> 0)
  for (int64_t t = 0; t < n; ++t) {  // scores: q . k_t, 8 lanes over d in order, then a fixed tree
    const uint16_t* kt = k + t * D;
    __m256 a[GB];
#pragma GCC unroll 8
    for (int g = 0; g < GB; ++g) a[g] = _mm256_setzero_ps();
    for (int64_t c = 0; c < nd; ++c) {
      const __m256 kc = load8(kt + 8 * c);
#pragma GCC unroll 8
      for (int g = 0; g < GB; ++g) a[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * D + 8 * c), kc, a[g]);
    }
#pragma GCC unroll 8
    for (int g = 0; g < GB; ++g) scores[g * np + t] = hsum(a[g]) * scale;
  }
  float den[GB];
  for (int g = 0; g < GB; ++g) {  // softmax numerators in place; their sum in 8 lanes in key order, a fixed tree
    float* sg = scores + g * np;
    for (int64_t t = n; t < np; ++t) sg[t] = -std::numeric_limits<float>::infinity();
    __m256 m8 = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t t = 0; t < np; t += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(sg + t));
    alignas(32) float mm[8];
    _mm256_store_ps(mm, m8);
    const __m256 m = _mm256_set1_ps(*std::max_element(mm, mm + 8));
    __m256 l8 = _mm256_setzero_ps();
    for (int64_t t = 0; t < np; t += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + t), m));
      _mm256_storeu_ps(sg + t, e);
      l8 = _mm256_add_ps(l8, e);
    }
    den[g] = hsum(l8);
  }
  for (int64_t c = 0; c < nd; ++c) {  // 8 output dims at a time: sum_t p_t v_t in key order, then / l
    __m256 acc[GB];
#pragma GCC unroll 8
    for (int g = 0; g < GB; ++g) acc[g] = _mm256_setzero_ps();
    for (int64_t t = 0; t < n; ++t) {
      const __m256 vc = load8(v + t * D + 8 * c);
#pragma GCC unroll 8
      for (int g = 0; g < GB; ++g) acc[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(scores + g * np + t), vc, acc[g]);
    }
    for (int g = 0; g < GB; ++g) {
      alignas(32) float r[8];
      _mm256_store_ps(r, acc[g]);
      uint16_t* og = out + g * out_stride + 8 * c;
      for (int j = 0; j < 8; ++j) og[j] = round_bf16(r[j] / den[g]);
    }
  }
}

// G query heads of one kv head, in blocks of up to 8
void attend_group(const float* q, int G, int64_t D, const uint16_t* k, const uint16_t* v, int64_t n, float scale,
                  float* scores, uint16_t* out) {
  for (int g0 = 0; g0 < G; g0 += 8) {
    const int gb = std::min(8, G - g0);
    const float* qb = q + g0 * D;
    uint16_t* ob = out + g0 * D;
    switch (gb) {
      case 8: attend_rows<8>(qb, D, k, v, n, scale, scores, ob, D); break;
      case 7: attend_rows<7>(qb, D, k, v, n, scale, scores, ob, D); break;
      case 6: attend_rows<6>(qb, D, k, v, n, scale, scores, ob, D); break;
      case 5: attend_rows<5>(qb, D, k, v, n, scale, scores, ob, D); break;
      case 4: attend_rows<4>(qb, D, k, v, n, scale, scores, ob, D); break;
      case 3: attend_rows<3>(qb, D, k, v, n, scale, scores, ob, D); break;
      case 2: attend_rows<2>(qb, D, k, v, n, scale, scores, ob, D); break;
      default: attend_rows<1>(qb, D, k, v, n, scale, scores, ob, D); break;
    }
  }
}

}  // namespace

// q [B, S, H, D] bf16 contiguous; k, v: one layer of the cache [max_batch, H_kv, T, D] bf16 contiguous;
// slots [B] int64; ends [B, S] int64 in [0, T] (query (b, s) sees keys [0, ends[b, s]) of slot slots[b]; 0: a pad,
// zeros out);
// -> [B, S, H, D] bf16
torch::Tensor attention_bf16(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor slots,
                             torch::Tensor ends, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes(), "attention_bf16: bad shapes");
  TORCH_CHECK(q.scalar_type() == torch::kBFloat16 && k.scalar_type() == torch::kBFloat16 &&
              v.scalar_type() == torch::kBFloat16, "attention_bf16: q, k, v must be bf16");
  TORCH_CHECK(k.is_contiguous() && v.is_contiguous(), "attention_bf16: the cache layer must be contiguous");
  const int64_t B = q.size(0), S = q.size(1), H = q.size(2), D = q.size(3);
  const int64_t NB = k.size(0), HKV = k.size(1), T = k.size(2);
  TORCH_CHECK(k.size(3) == D && D % 8 == 0 && H % HKV == 0 && H / HKV <= GMAX, "attention_bf16: head shapes");
  TORCH_CHECK(slots.numel() == B && ends.size(0) == B && ends.size(1) == S, "attention_bf16: slots / ends");
  const int G = static_cast<int>(H / HKV);
  auto qc = q.contiguous();
  auto sl = slots.to(torch::kInt64).contiguous();
  auto en = ends.to(torch::kInt64).contiguous();
  const int64_t* slp = sl.data_ptr<int64_t>();
  const int64_t* enp = en.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) TORCH_CHECK(slp[b] >= 0 && slp[b] < NB, "attention_bf16: slot out of range");
  for (int64_t i = 0; i < B * S; ++i) TORCH_CHECK(enp[i] >= 0 && enp[i] <= T, "attention_bf16: end out of range");
  auto out = torch::empty({B, S, H, D}, q.options());
  const uint16_t* qp = reinterpret_cast<const uint16_t*>(qc.data_ptr<at::BFloat16>());
  const uint16_t* kp = reinterpret_cast<const uint16_t*>(k.data_ptr<at::BFloat16>());
  const uint16_t* vp = reinterpret_cast<const uint16_t*>(v.data_ptr<at::BFloat16>());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const float fscale = static_cast<float>(scale);
  at::parallel_for(0, B * S * HKV, 1, [&](int64_t u0, int64_t u1) {
    std::vector<float> qf(static_cast<size_t>(G * D)), scores;
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / (S * HKV), s = (u / HKV) % S, h = u % HKV;
      const int64_t n = enp[b * S + s];
      const int64_t row = (b * S + s) * H + h * G;  // first of the G query heads of kv head h
      if (n == 0) {  // a pad: nothing attended, zeros out
        std::memset(op + row * D, 0, sizeof(uint16_t) * G * D);
        continue;
      }
      for (int64_t i = 0; i < G * D; ++i) {
        const uint32_t bits = static_cast<uint32_t>(qp[row * D + i]) << 16;
        std::memcpy(&qf[i], &bits, 4);
      }
      scores.resize(static_cast<size_t>(std::min(G, 8) * ((n + 7) / 8 * 8)));
      const int64_t kv = (slp[b] * HKV + h) * T * D;
      attend_group(qf.data(), G, D, kp + kv, vp + kv, n, fscale, scores.data(), op + row * D);
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attention_bf16", &attention_bf16, "causal attention per query row over a slot KV cache, fp32 softmax");
}
