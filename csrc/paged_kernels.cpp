// Paged attention on the CPU: decode and varlen prefill over block tables, GQA, float32 and bfloat16.
//
// Caches are [num_blocks, block_size, num_kv_heads, head_dim] (head_dim contiguous). Query token j of a
// sequence with q_len new tokens and seq_len cached tokens sits at position seq_len - q_len + j and attends
// to positions 0..that position. One work item is (sequence, kv head, tile of query tokens): every query
// head of the kv head's group and every token of the tile reads each K/V row once, converted to float32.
// Items run in parallel with OpenMP (torch's own runtime when torch is loaded first: same soname).
// Hot loops use fixed-width lane arrays the compiler vectorizes without reassociating floats; on x86 they
// are also built for AVX2+FMA and picked at load time, so the binary stays portable.
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
#define SLOPILOT_CLONES __attribute__((target_clones("arch=haswell", "default")))
#else
#define SLOPILOT_CLONES
#endif

namespace {

constexpr int kLanes = 16;
constexpr int kMaxRows = 32;  // query rows (tokens x group heads) of one work item

enum Dtype { kFloat32 = 0, kBFloat16 = 1 };

__attribute__((always_inline)) inline float bf16_to_float(uint16_t x) {
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

__attribute__((always_inline)) inline void load_row(float* dst, const void* base, int64_t offset, int64_t n, int dtype) {
  if (dtype == kFloat32) {
    std::memcpy(dst, static_cast<const float*>(base) + offset, n * sizeof(float));
  } else {
    const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
  }
}

// GCC vector extensions: 8 floats, lowered to whatever the target (clone) has
typedef float v8f __attribute__((vector_size(32)));

__attribute__((always_inline)) inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

__attribute__((always_inline)) inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }

// a . b over n floats, n a multiple of kLanes (rows are zero-padded to that width)
__attribute__((always_inline)) inline float dot(const float* a, const float* b, int64_t n) {
  v8f acc0 = {0}, acc1 = {0};
  for (int64_t i = 0; i < n; i += kLanes) {
    acc0 += load8(a + i) * load8(b + i);
    acc1 += load8(a + i + 8) * load8(b + i + 8);
  }
  acc0 += acc1;
  float s = 0;
  for (int l = 0; l < 8; ++l) s += acc0[l];
  return s;
}

// o += p * x over n floats, n a multiple of kLanes
__attribute__((always_inline)) inline void axpy(float* o, float p, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) store8(o + i, load8(o + i) + p * load8(x + i));
}

// One work item: rows r = (token, head in group); scores per row, softmax, weighted sum of V.
SLOPILOT_CLONES
void attend_item(const Args& a, const Item& it, std::vector<float>& scratch) {
  const int64_t d = a.head_dim;
  const int64_t dp = (d + kLanes - 1) / kLanes * kLanes;
  const int64_t group = a.num_heads / a.num_kv_heads;
  const int32_t seq_len = a.seq_lens[it.seq];
  const int32_t q_start = a.query_start_loc[it.seq];
  const int32_t q_len = a.query_start_loc[it.seq + 1] - q_start;
  const int32_t first_pos = seq_len - q_len;
  const int n_tok = it.tok_end - it.tok_begin;
  const int rows = static_cast<int>(n_tok * group);
  const int32_t span = first_pos + it.tok_end;  // positions any row of the item reads
  const int32_t* table = a.block_tables + static_cast<int64_t>(it.seq) * a.bt_stride;

  scratch.assign(static_cast<size_t>(rows) * (dp * 2 + span) + dp, 0.0f);
  float* q = scratch.data();               // [rows, dp], scaled
  float* acc = q + rows * dp;              // [rows, dp]
  float* scores = acc + rows * dp;         // [rows, span]
  float* kv = scores + static_cast<int64_t>(rows) * span;  // one K or V row, [dp]
  int32_t limit[kMaxRows];                 // row r reads positions < limit[r]
  for (int t = 0; t < n_tok; ++t) {
    const int64_t tok = q_start + it.tok_begin + t;
    for (int64_t g = 0; g < group; ++g) {
      const int r = static_cast<int>(t * group + g);
      const int64_t head = it.kv_head * group + g;
      load_row(q + r * dp, a.query, tok * a.q_stride_t + head * a.q_stride_h, d, a.dtype);
      for (int64_t i = 0; i < d; ++i) q[r * dp + i] *= a.scale;
      limit[r] = first_pos + it.tok_begin + t + 1;
    }
  }
  // scores: each K row once, against every row that sees it
  for (int32_t pos = 0; pos < span; ++pos) {
    const int64_t base = table[pos / a.block_size] * a.c_stride_b + (pos % a.block_size) * a.c_stride_s +
                         it.kv_head * a.c_stride_h;
    load_row(kv, a.k_cache, base, d, a.dtype);
    for (int r = 0; r < rows; ++r)
      if (pos < limit[r]) scores[static_cast<int64_t>(r) * span + pos] = dot(q + r * dp, kv, dp);
  }
  float inv_sum[kMaxRows];
  for (int r = 0; r < rows; ++r) {
    float* s = scores + static_cast<int64_t>(r) * span;
    float m = -std::numeric_limits<float>::infinity();
    for (int32_t p = 0; p < limit[r]; ++p) m = std::max(m, s[p]);
    float sum = 0;
    for (int32_t p = 0; p < limit[r]; ++p) {
      s[p] = std::exp(s[p] - m);
      sum += s[p];
    }
    inv_sum[r] = 1.0f / sum;
  }
  // weighted sum: each V row once
  for (int32_t pos = 0; pos < span; ++pos) {
    const int64_t base = table[pos / a.block_size] * a.c_stride_b + (pos % a.block_size) * a.c_stride_s +
                         it.kv_head * a.c_stride_h;
    load_row(kv, a.v_cache, base, d, a.dtype);
    for (int r = 0; r < rows; ++r) {
      if (pos >= limit[r]) continue;
      const float p = scores[static_cast<int64_t>(r) * span + pos];
      axpy(acc + r * dp, p, kv, dp);
    }
  }
  for (int t = 0; t < n_tok; ++t) {
    const int64_t tok = q_start + it.tok_begin + t;
    for (int64_t g = 0; g < group; ++g) {
      const int r = static_cast<int>(t * group + g);
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
