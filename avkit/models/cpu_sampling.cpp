// The CPU backend's passes over a vocabulary row (AVX2 + FMA): the sampling distribution and the draft features.
//
// Why: at T > 0 every draft pass and every verify turns [rows, 151,936] logits into a nucleus-truncated
// distribution, and every draft pass also into its lossless features. In torch that is a dozen full-width
// operations per row (a float copy, divide, softmax, topk for the nucleus, masked_fill, sum, divide; topk(2),
// exp, scatter, xlogy and sums for the features): on 2 cores at batch 16, K = 5, T = 1 they and the step's
// other work outside the forwards took 217 ms of a 2.7 s step, 84 ms with these passes (docs/runtime.md).
// Here each row is read a few times in one thread, rows in parallel.
//
// sampled_probs: softmax(x / T), the top-p cut and the renormalisation of runtime/sampling.py `_sampled_probs`
// (without top-k / min-p). The cut is decided exactly as `top_p_threshold` decides it on the same
// probabilities: the sorted top 64 (then 1024, 8192, all: the same ladder) with their running sums accumulated
// in double and rounded to float per element as torch's CPU cumsum does, "mass before" = sum - value in float,
// kept while that is < top_p; the threshold is the last kept value, and every token >= it is kept (ties
// included). The top k of a row are found without sorting it: a histogram of the probabilities' float bits
// (sign 0, exponent, 3 mantissa bits: bucket order is value order) says which buckets hold the top k, and only
// those candidates are sorted. In the engine's path (probs_row) the candidates are collected during the exp
// pass instead (every e >= 2^-24 of the top), and the histogram runs only where they cannot decide the cut.
// row_stats: per row of x / T the largest and second-largest values (m, m2: torch's topk(2) values), the mass
// of the others s_o = sum_{v != argmax} exp(x_v - m) and sum_{v != argmax} exp(x_v - m) (x_v - m), from which
// avkit/features.py computes the features with its own formulas.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include "cpu_simd.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <tuple>
#include <vector>

namespace {

using avkit::exp8;
using avkit::hsum;
using avkit::load8;

constexpr int64_t LADDER[] = {64, 1024, 8192};  // runtime/sampling.py _TOPK_LADDER
constexpr int SHIFT = 20;                         // a probability's bucket: its float bits >> SHIFT
constexpr int NBUCKETS = (0x3f800000 >> SHIFT) + 2;  // p in [0, 1]; the last bucket takes anything above
constexpr int64_t BLOCK = 1024;                   // elements summed in float lanes before a double add
constexpr float CUT = 0x1p-24f;                   // nucleus candidates: e = exp(x / T - m) >= CUT (the max has e = 1)

inline int bucket(float p) {
  uint32_t u;
  std::memcpy(&u, &p, 4);
  return static_cast<int>(std::min<uint32_t>(u >> SHIFT, NBUCKETS - 1));
}

// 8 inputs from element i of a row (fp32 or bf16), as fp32; `n` < 8 reads only n and fills the rest with `pad`.
template <typename T>
inline __m256 load_row(const T* x, int64_t i, int64_t n, float pad) {
  if (n == 8) {
    if constexpr (std::is_same_v<T, float>) return _mm256_loadu_ps(x + i);
    else return load8(reinterpret_cast<const uint16_t*>(x) + i);
  }
  alignas(32) float buf[8];
  for (int j = 0; j < 8; ++j) buf[j] = pad;
  for (int64_t j = 0; j < n; ++j) {
    if constexpr (std::is_same_v<T, float>) buf[j] = x[i + j];
    else {
      uint32_t u = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(x)[i + j]) << 16;
      std::memcpy(&buf[j], &u, 4);
    }
  }
  return _mm256_load_ps(buf);
}

inline float to_float(const float* x, int64_t i) { return x[i]; }
inline float to_float(const at::BFloat16* x, int64_t i) { return static_cast<float>(x[i]); }

template <typename T>
float row_max(const T* x, int64_t V) {
  __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < V; i += 8)
    m = _mm256_max_ps(m, load_row(x, i, std::min<int64_t>(8, V - i), -std::numeric_limits<float>::infinity()));
  alignas(32) float a[8];
  _mm256_store_ps(a, m);
  return *std::max_element(a, a + 8);
}

inline void store_row(float* y, int64_t i, int64_t n, __m256 v) {
  if (n == 8) { _mm256_storeu_ps(y + i, v); return; }
  alignas(32) float buf[8];
  _mm256_store_ps(buf, v);
  std::memcpy(y + i, buf, n * sizeof(float));
}

// The ladder's test on the first k of `sorted` (descending): how many are kept (the mass ranked before a token,
// its running sum accumulated in double and rounded to float as torch's CPU cumsum does minus itself in float,
// is < top_p) and whether the k-th is; -> (kept, float of the running sum after k).
std::pair<int64_t, float> kept_of(const std::vector<float>& sorted, int64_t k, float top_p, bool& last) {
  double run = 0.0;
  int64_t kept = 0;
  for (int64_t i = 0; i < k; ++i) {
    run += sorted[i];
    last = static_cast<float>(run) - sorted[i] < top_p;  // mass ranked strictly before token i
    kept += last;
  }
  return {kept, static_cast<float>(run)};
}

// The nucleus threshold of probabilities p [V] (top_p < 1) and the mass of what it keeps; `cand` is scratch.
std::pair<float, double> nucleus(const float* p, int64_t V, float top_p, std::vector<float>& cand) {
  std::vector<int64_t> count(NBUCKETS, 0);
  for (int64_t v = 0; v < V; ++v) ++count[bucket(p[v])];
  int b = NBUCKETS;  // candidates: the buckets >= b
  int64_t have = 0;
  std::vector<int64_t> rungs;
  for (int64_t k : LADDER) if (k < V) rungs.push_back(k);
  rungs.push_back(V);
  for (int64_t k : rungs) {
    while (have < k && b > 0) have += count[--b];
    cand.clear();
    for (int64_t v = 0; v < V; ++v) if (bucket(p[v]) >= b) cand.push_back(p[v]);
    std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), std::greater<float>());
    bool last = false;
    const int64_t kept = kept_of(cand, k, top_p, last).first;
    if (!last || k == V) {
      const float thresh = cand[std::max<int64_t>(kept, 1) - 1];
      double mass = 0.0;  // every token >= thresh is a candidate (its bucket is >= thresh's)
      for (float c : cand) if (c >= thresh) mass += c;
      return {thresh, mass};
    }
  }
  return {0.0f, 1.0};  // unreachable: the last rung is the whole row
}

// The nucleus from the candidates alone (cand: every p whose e passed the cut, any order; tail: a bound on every
// other p), as `nucleus` decides it over the whole row; false where the candidates cannot decide it.
bool nucleus_of_candidates(std::vector<float>& cand, int64_t V, float top_p, float tail, float& thresh, double& mass) {
  const int64_t n = static_cast<int64_t>(cand.size());
  for (int64_t k : LADDER) {  // the ladder's rungs the candidates hold
    if (k >= V || k > n) break;
    std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), std::greater<float>());
    bool last = false;
    const int64_t kept = kept_of(cand, k, top_p, last).first;
    if (!last) { thresh = cand[std::max<int64_t>(kept, 1) - 1]; break; }
  }
  if (thresh < 0.0f) {  // every rung up to the candidates' count kept its last token: all candidates, in order
    std::sort(cand.begin(), cand.end(), std::greater<float>());
    bool last = false;
    const auto [kept, run] = kept_of(cand, n, top_p, last);
    // Any other token j ranks after all candidates: its mass before is >= fl(run - tail) >= top_p, so it is
    // not kept, and every rung longer than the candidates ends with a token not kept (it is done).
    if (n == V || !(run - tail >= top_p) || kept == 0) return false;
    thresh = cand[kept - 1];
  }
  mass = 0.0;
  for (float c : cand) if (c >= thresh) mass += c;
  return true;
}

template <typename T>
void probs_row(const T* x, float t, float top_p, int64_t V, float* y, std::vector<float>& cand) {
  const float inv_t = 1.0f / t;
  const float m = row_max(x, V) * inv_t;  // max(x / T): rounding is monotone
  const __m256 it = _mm256_set1_ps(inv_t), mv = _mm256_set1_ps(m), cut = _mm256_set1_ps(CUT);
  const bool nucleus_cut = top_p < 1.0f;
  cand.clear();
  double sum = 0.0;
  for (int64_t b0 = 0; b0 < V; b0 += BLOCK) {  // e = exp(x / T - m) into y, summed; the candidates e >= CUT kept
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = b0; i < std::min(V, b0 + BLOCK); i += 8) {
      const int64_t n = std::min<int64_t>(8, V - i);
      const __m256 e = exp8(_mm256_sub_ps(_mm256_mul_ps(load_row(x, i, n, -std::numeric_limits<float>::infinity()), it), mv));
      acc = _mm256_add_ps(acc, e);  // padding lanes are exp(-inf) = 0
      store_row(y, i, n, e);
      if (nucleus_cut) {
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(e, cut, _CMP_GE_OQ));
        while (mask) {
          const int j = __builtin_ctz(mask);
          mask &= mask - 1;
          if (j < n) cand.push_back(y[i + j]);
        }
      }
    }
    sum += hsum(acc);
  }
  const float inv_s = 1.0f / static_cast<float>(sum);
  const __m256 is = _mm256_set1_ps(inv_s);
  float thresh = -1.0f;
  double mass = 1.0;
  if (nucleus_cut) {
    for (float& c : cand) c *= inv_s;  // p = e / sum, rounded as the pass below rounds it
    if (!nucleus_of_candidates(cand, V, top_p, CUT * inv_s, thresh, mass)) {
      for (int64_t i = 0; i < V; i += 8) {  // p of the whole row, then the histogram search
        const int64_t n = std::min<int64_t>(8, V - i);
        store_row(y, i, n, _mm256_mul_ps(load_row(y, i, n, 0.0f), is));
      }
      std::tie(thresh, mass) = nucleus(y, V, top_p, cand);
      const __m256 th = _mm256_set1_ps(thresh), ik = _mm256_set1_ps(static_cast<float>(1.0 / mass));
      for (int64_t i = 0; i < V; i += 8) {
        const int64_t n = std::min<int64_t>(8, V - i);
        const __m256 p = load_row(y, i, n, 0.0f);
        store_row(y, i, n, _mm256_and_ps(_mm256_cmp_ps(p, th, _CMP_GE_OQ), _mm256_mul_ps(p, ik)));
      }
      return;
    }
  }
  // p = e / sum; with a cut, p >= thresh kept and renormalised by the kept mass, the rest 0
  const __m256 th = _mm256_set1_ps(nucleus_cut ? thresh : 0.0f), ik = _mm256_set1_ps(static_cast<float>(1.0 / mass));
  for (int64_t i = 0; i < V; i += 8) {
    const int64_t n = std::min<int64_t>(8, V - i);
    const __m256 p = _mm256_mul_ps(load_row(y, i, n, 0.0f), is);
    store_row(y, i, n, nucleus_cut ? _mm256_and_ps(_mm256_cmp_ps(p, th, _CMP_GE_OQ), _mm256_mul_ps(p, ik)) : p);
  }
}

template <typename T>
void stats_row(const T* x, float t, int64_t V, float* out) {
  const float NEG = -std::numeric_limits<float>::infinity();
  __m256 a1 = _mm256_set1_ps(NEG), a2 = a1;  // per lane: the largest and second-largest x
  for (int64_t i = 0; i < V; i += 8) {
    const __m256 v = load_row(x, i, std::min<int64_t>(8, V - i), NEG);
    a2 = _mm256_max_ps(a2, _mm256_min_ps(a1, v));
    a1 = _mm256_max_ps(a1, v);
  }
  alignas(32) float top[16];
  _mm256_store_ps(top, a1);
  _mm256_store_ps(top + 8, a2);
  std::partial_sort(top, top + 2, top + 16, std::greater<float>());  // the row's top 2 (ties count twice)
  int64_t arg = 0;  // an index of the largest (which one of a tie does not matter: the others add exp(0))
  while (arg < V && !(to_float(x, arg) == top[0])) ++arg;
  const float m = top[0] / t, m2 = top[1] / t;  // top 2 of x / t: rounding is monotone
  const __m256 tv = _mm256_set1_ps(t), mv = _mm256_set1_ps(m), zero = _mm256_setzero_ps();
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  double s_o = 0.0, s_xe = 0.0;
  for (int64_t b0 = 0; b0 < V; b0 += BLOCK) {
    __m256 a = zero, c = zero;
    for (int64_t i = b0; i < std::min(V, b0 + BLOCK); i += 8) {
      const int64_t n = std::min<int64_t>(8, V - i);
      const __m256 d = _mm256_sub_ps(_mm256_div_ps(load_row(x, i, n, NEG), tv), mv);
      __m256 e = exp8(d);
      if (arg >= i && arg < i + 8)  // the argmax is not among the others
        e = _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(lane, _mm256_set1_epi32(static_cast<int>(arg - i)))), e);
      a = _mm256_add_ps(a, e);
      c = _mm256_add_ps(c, _mm256_and_ps(_mm256_cmp_ps(e, zero, _CMP_NEQ_OQ), _mm256_mul_ps(e, d)));  // 0 log 0 = 0
    }
    s_o += hsum(a);
    s_xe += hsum(c);
  }
  out[0] = m;
  out[1] = m2;
  out[2] = static_cast<float>(s_o);
  out[3] = static_cast<float>(s_xe);
}

void check_rows(const torch::Tensor& logits, const torch::Tensor& per_row, const char* name) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.device().is_cpu(),
              "logits must be a contiguous CPU [N, V] tensor");
  TORCH_CHECK(logits.scalar_type() == torch::kFloat || logits.scalar_type() == torch::kBFloat16,
              "logits must be float32 or bfloat16");
  TORCH_CHECK(per_row.dim() == 1 && per_row.size(0) == logits.size(0) && per_row.scalar_type() == torch::kFloat &&
              per_row.is_contiguous(), name, " must be a contiguous float32 [N] tensor");
}

}  // namespace

// logits [N, V] float32 or bf16, temperature [N] float32 > 0, top_p [N] float32 -> probabilities [N, V] float32.
torch::Tensor sampled_probs(torch::Tensor logits, torch::Tensor temperature, torch::Tensor top_p) {
  check_rows(logits, temperature, "temperature");
  check_rows(logits, top_p, "top_p");
  const int64_t N = logits.size(0), V = logits.size(1);
  auto out = torch::empty({N, V}, logits.options().dtype(torch::kFloat));
  const float *t = temperature.data_ptr<float>(), *tp = top_p.data_ptr<float>();
  float* y = out.data_ptr<float>();
  at::parallel_for(0, N, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> cand;
    for (int64_t r = r0; r < r1; ++r) {
      if (logits.scalar_type() == torch::kFloat) probs_row(logits.data_ptr<float>() + r * V, t[r], tp[r], V, y + r * V, cand);
      else probs_row(logits.data_ptr<at::BFloat16>() + r * V, t[r], tp[r], V, y + r * V, cand);
    }
  });
  return out;
}

// probs [N, V] float32, top_p [N] float32 -> [N] the nucleus threshold (0 where top_p >= 1): top_p_threshold's.
torch::Tensor nucleus_threshold(torch::Tensor probs, torch::Tensor top_p) {
  check_rows(probs, top_p, "top_p");
  TORCH_CHECK(probs.scalar_type() == torch::kFloat, "probs must be float32");
  const int64_t N = probs.size(0), V = probs.size(1);
  auto out = torch::zeros({N}, probs.options());
  const float* tp = top_p.data_ptr<float>();
  at::parallel_for(0, N, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> cand;
    for (int64_t r = r0; r < r1; ++r)
      if (tp[r] < 1.0f) out.data_ptr<float>()[r] = nucleus(probs.data_ptr<float>() + r * V, V, tp[r], cand).first;
  });
  return out;
}

// logits [N, V] float32 or bf16, temperature [N] float32 > 0 -> [N, 4]: m, m2, s_o, sum_others e (x / t - m).
torch::Tensor row_stats(torch::Tensor logits, torch::Tensor temperature) {
  check_rows(logits, temperature, "temperature");
  const int64_t N = logits.size(0), V = logits.size(1);
  auto out = torch::empty({N, 4}, logits.options().dtype(torch::kFloat));
  const float* t = temperature.data_ptr<float>();
  float* y = out.data_ptr<float>();
  at::parallel_for(0, N, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (logits.scalar_type() == torch::kFloat) stats_row(logits.data_ptr<float>() + r * V, t[r], V, y + 4 * r);
      else stats_row(logits.data_ptr<at::BFloat16>() + r * V, t[r], V, y + 4 * r);
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("sampled_probs", &sampled_probs, "softmax(x / T) cut to its top-p nucleus and renormalised, per row");
  m.def("nucleus_threshold", &nucleus_threshold, "the top-p nucleus threshold per row (top_p_threshold's)");
  m.def("row_stats", &row_stats, "m, m2, s_o and sum_others e (x/T - m) per row: the draft features' inputs");
}
