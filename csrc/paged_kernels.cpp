// Paged attention on the CPU: decode and varlen prefill over block tables, GQA, float32 and bfloat16.
//
// Caches are [num_blocks, block_size, num_kv_heads, head_dim] (head_dim contiguous). Query token j of a
// sequence with q_len new tokens and seq_len cached tokens sits at position seq_len - q_len + j and attends
// to positions 0..that position. One work item is (sequence, kv head, tile of query tokens): every query
// head of the kv head's group and every token of the tile reads each K/V row once from memory; all
// arithmetic is float32. Decode is memory-bound, so an item first lists a pointer per position (no
// division per position) and prefetches rows 16 positions ahead (blocks are scattered, which defeats
// the hardware prefetcher). Scores are computed eight positions at a time (eight dot products reduced
// together: no horizontal sum per score); the weighted V sum also goes eight positions at a time. So a
// K or V row is loaded (and, for bf16, converted) once, then shared from L1 by every row of the item,
// the accumulators of a tile of rows and dims staying in registers. Items run in parallel with OpenMP
// (torch's own runtime when torch is loaded first: same soname), each thread reusing its buffers across
// calls. Hot loops are 8-lane GCC vectors; on x86 the item function is also built for x86-64-v3 (AVX2,
// FMA) and picked at load time by CPU features, so the binary stays portable.
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

inline float ld1(float x) { return x; }
inline float ld1(uint16_t x) { return bf16_to_float(x); }

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

// bf16 -> float32 (exact: the bits shifted up), 8 lanes: interleaved with zero low halves, which GCC
// lowers to a permute and an unpack (its vector conversion takes two extensions and an insert)
INLINE v8f ld(const float* p) { return load8(p); }
INLINE v8f ld(const uint16_t* p) {
  v8h h;
  std::memcpy(&h, p, sizeof h);
#if defined(__has_builtin) && __has_builtin(__builtin_shufflevector)
  typedef uint16_t v16h __attribute__((vector_size(32)));
  const v16h w = __builtin_shufflevector(h, v8h{}, 8, 0, 8, 1, 8, 2, 8, 3, 8, 4, 8, 5, 8, 6, 8, 7);
#else
  const v8u w = __builtin_convertvector(h, v8u) << 16;
#endif
  v8f f;
  std::memcpy(&f, &w, sizeof f);
  return f;
}

// float32 -> bf16, round to nearest even, NaN kept NaN, 8 lanes
INLINE void st(uint16_t* p, v8f x) {
  v8u b;
  std::memcpy(&b, &x, sizeof b);
  const v8u rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
  const v8u nan = (b >> 16) | 0x40u;
  const v8u r = (b & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
  const v8h h = __builtin_convertvector(r, v8h);
  std::memcpy(p, &h, sizeof h);
}
INLINE void st(float* p, v8f x) { store8(p, x); }

// lane j of the result = the sum of a_j's lanes (a transposing reduction: 14 shuffles, 7 adds)
INLINE v8f reduce8(v8f a0, v8f a1, v8f a2, v8f a3, v8f a4, v8f a5, v8f a6, v8f a7) {
  const v8i ev = {0, 8, 2, 10, 4, 12, 6, 14}, od = {1, 9, 3, 11, 5, 13, 7, 15};
  const v8f t0 = __builtin_shuffle(a0, a1, ev) + __builtin_shuffle(a0, a1, od);  // pairs of a0, a1
  const v8f t1 = __builtin_shuffle(a2, a3, ev) + __builtin_shuffle(a2, a3, od);
  const v8f t2 = __builtin_shuffle(a4, a5, ev) + __builtin_shuffle(a4, a5, od);
  const v8f t3 = __builtin_shuffle(a6, a7, ev) + __builtin_shuffle(a6, a7, od);
  const v8i lo = {0, 1, 8, 9, 4, 5, 12, 13}, hi = {2, 3, 10, 11, 6, 7, 14, 15};
  const v8f u0 = __builtin_shuffle(t0, t1, lo) + __builtin_shuffle(t0, t1, hi);  // quads of a0..a3
  const v8f u1 = __builtin_shuffle(t2, t3, lo) + __builtin_shuffle(t2, t3, hi);
  const v8i h0 = {0, 1, 2, 3, 8, 9, 10, 11}, h1 = {4, 5, 6, 7, 12, 13, 14, 15};
  return __builtin_shuffle(u0, u1, h0) + __builtin_shuffle(u0, u1, h1);
}

constexpr int kAhead = 16;  // positions prefetched ahead: blocks are scattered, so the hardware cannot

template <typename T>
INLINE void prefetch_row(const T* row, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(reinterpret_cast<const char*>(row) + b);
}

// The rows of one item. Row r = (token t, head g of the group), r = t * group + g, sees the positions
// < first + t + 1 (its causal limit); the rows that see one position are a suffix of the rows.
struct Rows {
  int rows, group;
  int32_t first, span;  // position of the item's first token; positions any row reads
  int64_t dp, sp;       // head_dim and span rounded up to the vector width
  int32_t limit(int r) const { return first + r / group + 1; }
};

// scores[r, pos] = q_r . K[pos] for the positions row r sees, -inf after them (to sp). Eight
// positions at a time: eight dot products reduced together, so no horizontal sum per score.
template <typename T>
INLINE void qk(const Rows& R, const float* q, const T* const* kp, int64_t row_bytes, float* scores, float* kbuf) {
  const int64_t dp = R.dp;
  for (int32_t p0 = 0; p0 < R.span; p0 += 8) {
    for (int j = 0; j < 8 && p0 + kAhead + j < R.span; ++j) prefetch_row(kp[p0 + kAhead + j], row_bytes);
    const float* k[8];
    for (int j = 0; j < 8; ++j) {
      if constexpr (sizeof(T) == sizeof(float)) {
        k[j] = reinterpret_cast<const float*>(kp[p0 + j]);
      } else {  // bf16: each chunk converted once, not once per row
        for (int64_t i = 0; i < dp; i += 8) store8(kbuf + j * dp + i, ld(kp[p0 + j] + i));
        k[j] = kbuf + j * dp;
      }
    }
    for (int r = p0 < R.first ? 0 : (p0 - R.first) * R.group; r < R.rows; ++r) {
      const float* qr = q + r * dp;
      v8f a0 = {}, a1 = {}, a2 = {}, a3 = {}, a4 = {}, a5 = {}, a6 = {}, a7 = {};
      for (int64_t i = 0; i < dp; i += 8) {
        const v8f x = load8(qr + i);
        a0 += x * load8(k[0] + i);
        a1 += x * load8(k[1] + i);
        a2 += x * load8(k[2] + i);
        a3 += x * load8(k[3] + i);
        a4 += x * load8(k[4] + i);
        a5 += x * load8(k[5] + i);
        a6 += x * load8(k[6] + i);
        a7 += x * load8(k[7] + i);
      }
      store8(scores + r * R.sp + p0, reduce8(a0, a1, a2, a3, a4, a5, a6, a7));
    }
  }
  for (int r = 0; r < R.rows; ++r)  // the causal mask, the padding, and chunks a row skipped
    std::fill(scores + r * R.sp + R.limit(r), scores + (r + 1) * R.sp, -std::numeric_limits<float>::infinity());
}

// softmax numerators in place (masked positions give exp(-inf) = 0); 1 / their sums into inv_sum
INLINE void softmax(const Rows& R, float* scores, float* inv_sum) {
  for (int r = 0; r < R.rows; ++r) {
    float* s = scores + r * R.sp;
    v8f m = splat(-std::numeric_limits<float>::infinity());
    for (int64_t p = 0; p < R.sp; p += 8) {
      const v8f x = load8(s + p);
      m = x > m ? x : m;
    }
    float mx = m[0];
    for (int l = 1; l < 8; ++l) mx = std::max(mx, m[l]);
    v8f sum = {};
    for (int64_t p = 0; p < R.sp; p += 8) {
      const v8f e = exp8(load8(s + p) - mx);
      store8(s + p, e);
      sum += e;
    }
    inv_sum[r] = 1.0f / hsum(sum);
  }
}

// o[r0..r0+NR, c0..c0+8*NC] += sum over the eight positions of the chunk of p * V[pos]
template <int NR, int NC>
INLINE void pv_tile(const Rows& R, const float* scores, const float* const* v, int32_t p0, int r0, int64_t c0,
                    float* o) {
  v8f acc[NR][NC];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = load8(o + (r0 + r) * R.dp + c0 + 8 * c);
  for (int j = 0; j < 8; ++j) {
    v8f x[NC];
    for (int c = 0; c < NC; ++c) x[c] = load8(v[j] + c0 + 8 * c);
    for (int r = 0; r < NR; ++r) {
      const v8f p = splat(scores[(r0 + r) * R.sp + p0 + j]);
      for (int c = 0; c < NC; ++c) acc[r][c] += p * x[c];
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) store8(o + (r0 + r) * R.dp + c0 + 8 * c, acc[r][c]);
}

template <int NR>
INLINE void pv_rows(const Rows& R, const float* scores, const float* const* v, int32_t p0, int r0, float* o) {
  for (int64_t c0 = 0; c0 < R.dp; c0 += 32) {  // 32 dims (4 vectors) per tile
    switch (std::min<int64_t>(4, (R.dp - c0) / 8)) {
      case 4: pv_tile<NR, 4>(R, scores, v, p0, r0, c0, o); break;
      case 3: pv_tile<NR, 3>(R, scores, v, p0, r0, c0, o); break;
      case 2: pv_tile<NR, 2>(R, scores, v, p0, r0, c0, o); break;
      default: pv_tile<NR, 1>(R, scores, v, p0, r0, c0, o); break;
    }
  }
}

// o [rows, dp] = sum over positions of p * V[pos], eight positions at a time: each V row is read from
// memory (and converted, for bf16) once, then used by every row from L1; masked positions have p = 0.
template <typename T>
INLINE void pv(const Rows& R, const float* scores, const T* const* vp, int64_t row_bytes, float* vbuf, float* o) {
  std::fill(o, o + R.rows * R.dp, 0.0f);
  const int32_t end = R.limit(R.rows - 1);
  for (int32_t p0 = 0; p0 < end; p0 += 8) {
    for (int j = 0; j < 8 && p0 + kAhead + j < end; ++j) prefetch_row(vp[p0 + kAhead + j], row_bytes);
    const float* v[8];
    for (int j = 0; j < 8; ++j) {
      if constexpr (sizeof(T) == sizeof(float)) {
        v[j] = reinterpret_cast<const float*>(vp[p0 + j]);
      } else {
        for (int64_t i = 0; i < R.dp; i += 8) store8(vbuf + j * R.dp + i, ld(vp[p0 + j] + i));
        v[j] = vbuf + j * R.dp;
      }
    }
    int r = p0 < R.first ? 0 : (p0 - R.first) * R.group;  // rows that see some position of the chunk
    for (; r + 2 <= R.rows; r += 2) pv_rows<2>(R, scores, v, p0, r, o);
    if (r < R.rows) pv_rows<1>(R, scores, v, p0, r, o);
  }
}

struct Scratch {
  std::vector<float> f;
  std::vector<const void*> p;
};

// One item over cache rows of type T (the cache's own rows, or float32 copies when head_dim is not a
// multiple of 8): kp/vp hold a pointer per position, the tail up to sp + 8 pointing at a zero row.
template <typename T>
INLINE void attend_rows(const Args& a, const Item& it, const Rows& R, const T* const* kp, const T* const* vp,
                        int64_t row_bytes, float* q, float* scores, float* o, float* kbuf) {
  float inv_sum[kMaxRows];
  for (int j = 0; j < kAhead && j < R.span; ++j) prefetch_row(kp[j], row_bytes);
  qk<T>(R, q, kp, row_bytes, scores, kbuf);
  for (int j = 0; j < kAhead && j < R.span; ++j) prefetch_row(vp[j], row_bytes);
  softmax(R, scores, inv_sum);
  pv<T>(R, scores, vp, row_bytes, kbuf, o);
  // o [rows, dp] -> the output, in its dtype
  const int64_t d = a.head_dim;
  const int32_t q_start = a.query_start_loc[it.seq];
  for (int r2 = 0; r2 < R.rows; ++r2) {
    const int64_t tok = q_start + it.tok_begin + r2 / R.group;
    const int64_t off = tok * a.o_stride_t + (it.kv_head * R.group + r2 % R.group) * a.o_stride_h;
    float* src = o + r2 * R.dp;
    for (int64_t i = 0; i < R.dp; i += 8) store8(src + i, load8(src + i) * inv_sum[r2]);
    if (a.dtype == kFloat32) {
      float* dst = static_cast<float*>(a.out) + off;
      if (d == R.dp) {
        for (int64_t i = 0; i < d; i += 8) st(dst + i, load8(src + i));
      } else {
        std::memcpy(dst, src, d * sizeof(float));
      }
    } else {
      uint16_t* dst = static_cast<uint16_t*>(a.out) + off;
      if (d == R.dp) {
        for (int64_t i = 0; i < d; i += 8) st(dst + i, load8(src + i));
      } else {
        for (int64_t i = 0; i < d; ++i) dst[i] = float_to_bf16(src[i]);
      }
    }
  }
}

template <typename T>
INLINE void attend_typed(const Args& a, const Item& it, Scratch& S) {
  const int64_t d = a.head_dim;
  Rows R;
  R.group = static_cast<int>(a.num_heads / a.num_kv_heads);
  const int32_t seq_len = a.seq_lens[it.seq];
  const int32_t q_start = a.query_start_loc[it.seq];
  const int32_t q_len = a.query_start_loc[it.seq + 1] - q_start;
  const int n_tok = it.tok_end - it.tok_begin;
  R.rows = n_tok * R.group;
  R.first = seq_len - q_len + it.tok_begin;
  R.span = R.first + n_tok;
  R.dp = (d + 7) / 8 * 8;
  R.sp = (R.span + 7) / 8 * 8;
  const bool staged = d != R.dp;  // rows copied to zero-padded float32 rows first
  const int64_t n_stage = staged ? 2 * R.span * R.dp : 0;

  const size_t need = static_cast<size_t>(R.rows) * (2 * R.dp + R.sp) + 9 * R.dp + n_stage;
  if (S.f.size() < need) S.f.resize(need);
  float* q = S.f.data();                                      // [rows, dp], scaled
  float* o = q + R.rows * R.dp;                               // [rows, dp]
  float* scores = o + R.rows * R.dp;                          // [rows, sp]
  float* zero = scores + static_cast<int64_t>(R.rows) * R.sp; // one zero row of dp floats
  float* kbuf = zero + R.dp;                                  // one chunk of K rows as float32, [8, dp]
  float* stage = kbuf + 8 * R.dp;                             // staged K then V rows, [2 * span, dp]
  std::fill(zero, zero + R.dp, 0.0f);
  const size_t n_ptr = 2 * static_cast<size_t>(R.sp + 8);
  if (S.p.size() < n_ptr) S.p.resize(n_ptr);
  const void** kp = S.p.data();
  const void** vp = kp + R.sp + 8;

  for (int t = 0; t < n_tok; ++t) {
    const int64_t tok = q_start + it.tok_begin + t;
    for (int g = 0; g < R.group; ++g) {
      float* qr = q + (t * R.group + g) * R.dp;
      const T* src = static_cast<const T*>(a.query) + tok * a.q_stride_t + (it.kv_head * R.group + g) * a.q_stride_h;
      if (!staged) {
        for (int64_t i = 0; i < d; i += 8) store8(qr + i, ld(src + i) * a.scale);
      } else {
        for (int64_t i = 0; i < R.dp; ++i) qr[i] = i < d ? a.scale * ld1(src[i]) : 0.0f;
      }
    }
  }
  // a pointer per position, block by block (no division per position)
  const int32_t* table = a.block_tables + static_cast<int64_t>(it.seq) * a.bt_stride;
  const T* kc = static_cast<const T*>(a.k_cache) + it.kv_head * a.c_stride_h;
  const T* vc = static_cast<const T*>(a.v_cache) + it.kv_head * a.c_stride_h;
  for (int32_t b0 = 0, blk = 0; b0 < R.span; b0 += static_cast<int32_t>(a.block_size), ++blk) {
    const int64_t base = table[blk] * a.c_stride_b;
    const int32_t b1 = static_cast<int32_t>(std::min<int64_t>(R.span, b0 + a.block_size));
    for (int32_t pos = b0; pos < b1; ++pos) {
      kp[pos] = kc + base + (pos - b0) * a.c_stride_s;
      vp[pos] = vc + base + (pos - b0) * a.c_stride_s;
    }
  }
  if (!staged) {
    for (int32_t pos = R.span; pos < R.sp + 8; ++pos) kp[pos] = vp[pos] = zero;  // zero bits: 0 in bf16 too
    attend_rows<T>(a, it, R, reinterpret_cast<const T* const*>(kp), reinterpret_cast<const T* const*>(vp),
                   d * static_cast<int64_t>(sizeof(T)), q, scores, o, kbuf);
    return;
  }
  for (int32_t pos = 0; pos < R.span; ++pos) {
    float* ks = stage + pos * R.dp;
    float* vs = stage + (R.span + pos) * R.dp;
    for (int64_t i = 0; i < R.dp; ++i) {
      ks[i] = i < d ? ld1(static_cast<const T*>(kp[pos])[i]) : 0.0f;
      vs[i] = i < d ? ld1(static_cast<const T*>(vp[pos])[i]) : 0.0f;
    }
    kp[pos] = ks;
    vp[pos] = vs;
  }
  for (int32_t pos = R.span; pos < R.sp + 8; ++pos) kp[pos] = vp[pos] = zero;
  attend_rows<float>(a, it, R, reinterpret_cast<const float* const*>(kp), reinterpret_cast<const float* const*>(vp),
                     R.dp * static_cast<int64_t>(sizeof(float)), q, scores, o, kbuf);
}

// One work item: (sequence, kv head, tile of query tokens). Built per CPU target (see SLOPILOT_CLONES).
SLOPILOT_CLONES
void attend_item(const Args& a, const Item& it, Scratch& s) {
  if (a.dtype == kFloat32) {
    attend_typed<float>(a, it, s);
  } else {
    attend_typed<uint16_t>(a, it, s);
  }
}

// per-thread buffers kept across calls (OpenMP's pool threads persist), so a call allocates nothing
Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
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
    Scratch& scratch = thread_scratch();
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) attend_item(a, items[i], scratch);
  }
#else
  (void)num_threads;
  Scratch& scratch = thread_scratch();
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
