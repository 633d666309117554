// Paged attention on the CPU: decode and varlen prefill over block tables, GQA, float32 and bfloat16.
//
// Caches are [num_blocks, block_size, num_kv_heads, head_dim] (head_dim contiguous). Query token j of a
// sequence with q_len new tokens and seq_len cached tokens sits at position seq_len - q_len + j and attends
// to positions 0..that position. One work item is (sequence, kv head, tile of query tokens): every query
// head of the kv head's group and every token of the tile reads each K/V row once (bf16 rows converted
// to float32; all arithmetic is float32). Items run in parallel with OpenMP (torch's own runtime when
// torch is loaded first: same soname). Hot loops are 8-lane GCC vectors; on x86 the item function is also
// built for x86-64-v3 (AVX2, FMA) and picked at load time by CPU features, so the binary stays portable.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace py = pybind11;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SLOPILOT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define SLOPILOT_CLONES
#endif

namespace {

constexpr int kMaxRows = 32;  // query rows (tokens x group heads) of one work item

enum Dtype { kFloat32 = 0, kBFloat16 = 1 };

inline float bf16_to_float(uint16_t x) {
  uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t float_to_bf16(float f) {  // round to nearest even, NaN kept NaN
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

struct Args {
  void* out;
  const void* query;
  const void* k_cache;
  const void* v_cache;
  const int32_t* block_tables;
  const int32_t* seq_lens;
  const int32_t* query_start_loc;
  int64_t num_heads, num_kv_heads, head_dim, block_size, bt_stride;
  int64_t q_stride_t, q_stride_h, o_stride_t, o_stride_h;
  int64_t c_stride_b, c_stride_s, c_stride_h;
  float scale;
  int dtype;
};

struct Item {
  int32_t seq, kv_head, tok_begin, tok_end;
};

#define INLINE __attribute__((always_inline)) inline

// GCC vector extensions: 8 lanes, lowered to whatever the target (clone) has
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint32_t v8u __attribute__((vector_size(32)));

INLINE v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

INLINE void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }

INLINE v8f splat(float x) { return v8f{} + x; }

INLINE float hsum(v8f v) {
  float s = 0;
  for (int l = 0; l < 8; ++l) s += v[l];
  return s;
}

// n bfloat16 -> float32, n a multiple of 8
INLINE void bf16_row(float* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    v8h h;
    std::memcpy(&h, src + i, sizeof h);
    v8u w = __builtin_convertvector(h, v8u) << 16;
    std::memcpy(dst + i, &w, sizeof w);
  }
}

// exp of x <= 0 (softmax inputs after subtracting the max): 2^n * e^r with |r| <= ln2/2, Taylor to r^7
// (relative error below float epsilon); x < -87 (and -inf) gives 0.
INLINE v8f exp8(v8f x) {
  const v8i under = x < splat(-87.0f);
  x = under ? splat(-87.0f) : x;
  const v8i n = __builtin_convertvector(x * 1.44269504f - 0.5f, v8i);  // round to nearest for x <= 0
  const v8f nf = __builtin_convertvector(n, v8f);
  const v8f r = x - nf * 0.693359375f - nf * -2.12194440e-4f;
  v8f p = splat(1.0f / 5040);
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const v8i bits = (n + 127) << 23;
  v8f two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return under ? splat(0.0f) : p * two_n;
}

// One work item: rows r = (token t, head g of the group), r = t * group + g. Row r sees positions
// < limit(t); for one position the rows that see it are a suffix, so the loops need no masks.
SLOPILOT_CLONES
void attend_item(const Args& a, const Item& it, std::vector<float>& scratch) {
  const int64_t d = a.head_dim;
  const int64_t dp = (d + 7) / 8 * 8;
  const bool direct = a.dtype == kFloat32 && d == dp;  // cache rows read in place, else converted
  const int group = static_cast<int>(a.num_heads / a.num_kv_heads);
  const int32_t seq_len = a.seq_lens[it.seq];
  const int32_t q_start = a.query_start_loc[it.seq];
  const int32_t q_len = a.query_start_loc[it.seq + 1] - q_start;
  const int32_t first = seq_len - q_len + it.tok_begin;  // position of the item's first token
  const int n_tok = it.tok_end - it.tok_begin;
  const int rows = n_tok * group;
  const int32_t span = first + n_tok;  // positions any row of the item reads
  const int64_t sp = (span + 7) / 8 * 8;
  const int32_t* table = a.block_tables + static_cast<int64_t>(it.seq) * a.bt_stride;
  const int64_t bs = a.block_size;
  const int64_t head_off = it.kv_head * a.c_stride_h;

  const size_t need = static_cast<size_t>(rows) * (2 * dp + sp) + dp;
  if (scratch.size() < need) scratch.resize(need);
  float* q = scratch.data();                               // [rows, dp], scaled
  float* acc = q + rows * dp;                              // [rows, dp]
  float* scores = acc + rows * dp;                         // [rows, sp]
  float* buf = scores + static_cast<int64_t>(rows) * sp;   // one converted K or V row, [dp]
  std::fill(q, scores, 0.0f);
  std::fill(scores, buf, -std::numeric_limits<float>::infinity());
  std::fill(buf, buf + dp, 0.0f);
  for (int t = 0; t < n_tok; ++t) {
    const int64_t tok = q_start + it.tok_begin + t;
    for (int g = 0; g < group; ++g) {
      float* qr = q + (t * group + g) * dp;
      const int64_t off = tok * a.q_stride_t + (it.kv_head * group + g) * a.q_stride_h;
      for (int64_t i = 0; i < d; ++i)
        qr[i] = a.scale * (a.dtype == kFloat32 ? static_cast<const float*>(a.query)[off + i]
                                                : bf16_to_float(static_cast<const uint16_t*>(a.query)[off + i]));
    }
  }
  // a cache row at element offset off, as float32: in place, or converted into buf
  auto row = [&](const void* cache, int64_t off) -> const float* {
    if (direct) return static_cast<const float*>(cache) + off;
    if (a.dtype == kFloat32) {
      std::memcpy(buf, static_cast<const float*>(cache) + off, d * sizeof(float));
    } else if (d == dp) {
      bf16_row(buf, static_cast<const uint16_t*>(cache) + off, d);
    } else {
      for (int64_t i = 0; i < d; ++i) buf[i] = bf16_to_float(static_cast<const uint16_t*>(cache)[off + i]);
    }
    return buf;
  };
  // scores: each K row once, against the rows that see it, four rows at a time
  for (int32_t b0 = 0; b0 < span; b0 += bs) {  // block by block: no division per position
   const int64_t base = table[b0 / bs] * a.c_stride_b + head_off;
   const int32_t b1 = static_cast<int32_t>(std::min<int64_t>(span, b0 + bs));
   for (int32_t pos = b0; pos < b1; ++pos) {
    const float* k = row(a.k_cache, base + (pos - b0) * a.c_stride_s);
    int r = pos < first ? 0 : (pos - first) * group;
    for (; r + 4 <= rows; r += 4) {
      v8f s0 = {}, s1 = {}, s2 = {}, s3 = {};
      const float* q0 = q + r * dp;
      for (int64_t i = 0; i < dp; i += 8) {
        const v8f kv = load8(k + i);
        s0 += load8(q0 + i) * kv;
        s1 += load8(q0 + dp + i) * kv;
        s2 += load8(q0 + 2 * dp + i) * kv;
        s3 += load8(q0 + 3 * dp + i) * kv;
      }
      scores[r * sp + pos] = hsum(s0);
      scores[(r + 1) * sp + pos] = hsum(s1);
      scores[(r + 2) * sp + pos] = hsum(s2);
      scores[(r + 3) * sp + pos] = hsum(s3);
    }
    for (; r < rows; ++r) {
      v8f s0 = {};
      for (int64_t i = 0; i < dp; i += 8) s0 += load8(q + r * dp + i) * load8(k + i);
      scores[r * sp + pos] = hsum(s0);
    }
   }
  }
  // softmax numerators in place (positions a row does not see hold -inf, so exp gives 0)
  float inv_sum[kMaxRows];
  for (int r = 0; r < rows; ++r) {
    float* s = scores + r * sp;
    v8f m = splat(-std::numeric_limits<float>::infinity());
    for (int64_t p = 0; p < sp; p += 8) {
      const v8f x = load8(s + p);
      m = x > m ? x : m;
    }
    float mx = m[0];
    for (int l = 1; l < 8; ++l) mx = std::max(mx, m[l]);
    v8f sum = {};
    for (int64_t p = 0; p < sp; p += 8) {
      const v8f e = exp8(load8(s + p) - mx);
      store8(s + p, e);
      sum += e;
    }
    inv_sum[r] = 1.0f / hsum(sum);
  }
  // weighted sum: each V row once
  for (int32_t b0 = 0; b0 < span; b0 += bs) {
   const int64_t base = table[b0 / bs] * a.c_stride_b + head_off;
   const int32_t b1 = static_cast<int32_t>(std::min<int64_t>(span, b0 + bs));
   for (int32_t pos = b0; pos < b1; ++pos) {
    const float* v = row(a.v_cache, base + (pos - b0) * a.c_stride_s);
    for (int r = pos < first ? 0 : (pos - first) * group; r < rows; ++r) {
      const v8f p = splat(scores[r * sp + pos]);
      float* o = acc + r * dp;
      for (int64_t i = 0; i < dp; i += 8) store8(o + i, load8(o + i) + p * load8(v + i));
    }
   }
  }
  for (int t = 0; t < n_tok; ++t) {
    const int64_t tok = q_start + it.tok_begin + t;
    for (int g = 0; g < group; ++g) {
      const int r = t * group + g;
      const int64_t off = tok * a.o_stride_t + (it.kv_head * group + g) * a.o_stride_h;
      const float* o = acc + r * dp;
      if (a.dtype == kFloat32) {
        float* dst = static_cast<float*>(a.out) + off;
        for (int64_t i = 0; i < d; ++i) dst[i] = o[i] * inv_sum[r];
      } else {
        uint16_t* dst = static_cast<uint16_t*>(a.out) + off;
        for (int64_t i = 0; i < d; ++i) dst[i] = float_to_bf16(o[i] * inv_sum[r]);
      }
    }
  }
}

void paged_attention(uintptr_t out, uintptr_t query, uintptr_t k_cache, uintptr_t v_cache,
                     uintptr_t block_tables, uintptr_t seq_lens, uintptr_t query_start_loc, int64_t num_seqs,
                     int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                     int64_t bt_stride, int64_t q_stride_t, int64_t q_stride_h, int64_t o_stride_t,
                     int64_t o_stride_h, int64_t c_stride_b, int64_t c_stride_s, int64_t c_stride_h, float scale,
                     int dtype, int num_threads) {
  if (num_kv_heads < 1 || num_heads % num_kv_heads) throw std::invalid_argument("num_heads must be a multiple of num_kv_heads");
  const int64_t group = num_heads / num_kv_heads;
  if (group > kMaxRows) throw std::invalid_argument("more than " + std::to_string(kMaxRows) + " query heads per kv head");
  if (dtype != kFloat32 && dtype != kBFloat16) throw std::invalid_argument("dtype code must be 0 (float32) or 1 (bfloat16)");
  if (head_dim < 1 || block_size < 1) throw std::invalid_argument("head_dim and block_size must be >= 1");
  Args a{reinterpret_cast<void*>(out), reinterpret_cast<const void*>(query),
         reinterpret_cast<const void*>(k_cache), reinterpret_cast<const void*>(v_cache),
         reinterpret_cast<const int32_t*>(block_tables), reinterpret_cast<const int32_t*>(seq_lens),
         reinterpret_cast<const int32_t*>(query_start_loc), num_heads, num_kv_heads, head_dim, block_size,
         bt_stride, q_stride_t, q_stride_h, o_stride_t, o_stride_h, c_stride_b, c_stride_s, c_stride_h, scale,
         dtype};
  const int tile = static_cast<int>(std::max<int64_t>(1, kMaxRows / group));
  std::vector<Item> items;
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int32_t q_len = a.query_start_loc[s + 1] - a.query_start_loc[s];
    if (q_len < 1 || q_len > a.seq_lens[s]) throw std::invalid_argument("query length must be in 1..seq_len");
    for (int32_t b = 0; b < q_len; b += tile)
      for (int32_t h = 0; h < num_kv_heads; ++h) items.push_back({s, h, b, std::min(q_len, b + tile)});
  }
  // longest spans first, so the dynamic schedule does not end on one long item
  std::stable_sort(items.begin(), items.end(), [&](const Item& x, const Item& y) {
    auto span = [&](const Item& i) { return a.seq_lens[i.seq] - (a.query_start_loc[i.seq + 1] - a.query_start_loc[i.seq]) + i.tok_end; };
    return span(x) > span(y);
  });
  const int64_t n = static_cast<int64_t>(items.size());
#ifdef _OPENMP
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads, n)));
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) attend_item(a, items[i], scratch);
  }
#else
  (void)num_threads;
  std::vector<float> scratch;
  for (int64_t i = 0; i < n; ++i) attend_item(a, items[i], scratch);
#endif
}

bool has_openmp() {
#ifdef _OPENMP
  return true;
#else
  return false;
#endif
}

}  // namespace

PYBIND11_MODULE(_paged_kernels, m) {
  m.doc() = "CPU paged attention over block tables (see engine/attention/cpu_backend.py for the checks)";
  m.def("paged_attention", &paged_attention, py::call_guard<py::gil_scoped_release>(),
        "Raw-pointer paged attention; the Python wrapper validates shapes, dtypes and strides.");
  m.def("has_openmp", &has_openmp);
}
