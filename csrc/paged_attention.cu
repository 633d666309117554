// Paged decode attention (one new query token per sequence) for caches laid out
// [num_blocks, block_size, num_kv_heads, head_dim], read through int32 block tables.
//
// Split-K in two kernels: each (head, sequence, partition of PARTITION_SIZE tokens) computes a softmax
// partial in float32, then a reduce kernel merges the partials by their log-sum-exp. Inside a partition
// each warp walks its own tokens, UNROLL at a time so several K/V rows are in flight; a lane owns
// HEAD_DIM / 32 contiguous elements of q, K, V and the accumulator.
//
// The launcher is a plain C function taking raw device pointers and a stream, loaded with ctypes, so the
// file needs no torch headers and builds with nvcc alone.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

namespace {

constexpr int WARP_SIZE = 32;
constexpr int NUM_WARPS = 4;
constexpr int NUM_THREADS = WARP_SIZE * NUM_WARPS;
constexpr int PARTITION_SIZE = 256;
constexpr int UNROLL = 4;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

// VEC contiguous elements loaded in one aligned access (8 or 16 bytes for the head sizes we build)
template <typename T, int VEC> struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

template <typename T, int VEC>
__device__ __forceinline__ void load_vec(const T* __restrict__ p, float (&out)[VEC]) {
  const Vec<T, VEC> x = *reinterpret_cast<const Vec<T, VEC>*>(p);
#pragma unroll
  for (int i = 0; i < VEC; ++i) out[i] = to_float(x.v[i]);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffff, x, offset);
  return x;
}

struct Params {
  const int* block_tables;
  const int* seq_lens;
  float* part_out;  // [num_seqs, num_heads, max_parts, head_dim]
  float* part_lse;  // [num_seqs, num_heads, max_parts]
  int num_heads, num_kv_heads, block_size, max_blocks, max_parts;
  int64_t q_stride_t, q_stride_h, o_stride_t, o_stride_h;
  int64_t kv_stride_b, kv_stride_t, kv_stride_h;
  float scale;
};

template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(NUM_THREADS)
    partition_kernel(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                     Params p) {
  constexpr int VEC = HEAD_DIM / WARP_SIZE;
  const int head = blockIdx.x, seq = blockIdx.y, part = blockIdx.z;
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int seq_len = p.seq_lens[seq];
  const int start = part * PARTITION_SIZE;
  const int64_t row = (int64_t)seq * p.num_heads + head;
  if (start >= seq_len) return;  // the reduce kernel reads only the partitions that exist
  const int end = min(start + PARTITION_SIZE, seq_len);
  const int kv_head = head / (p.num_heads / p.num_kv_heads);
  const int* table = p.block_tables + (int64_t)seq * p.max_blocks;
  const int64_t head_off = (int64_t)kv_head * p.kv_stride_h + lane * VEC;

  float qv[VEC];
  load_vec<T, VEC>(q + seq * p.q_stride_t + head * p.q_stride_h + lane * VEC, qv);
#pragma unroll
  for (int i = 0; i < VEC; ++i) qv[i] *= p.scale;

  float m = -CUDART_INF_F, l = 0.f, acc[VEC] = {};
  for (int t0 = start + warp * UNROLL; t0 < end; t0 += NUM_WARPS * UNROLL) {
    int64_t off[UNROLL];
    float s[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int t = min(t0 + u, end - 1);  // clamp: the row is valid, its score is masked below
      off[u] = (int64_t)table[t / p.block_size] * p.kv_stride_b + (t % p.block_size) * p.kv_stride_t + head_off;
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float kv[VEC];
      load_vec<T, VEC>(k_cache + off[u], kv);
      float dot = 0.f;
#pragma unroll
      for (int i = 0; i < VEC; ++i) dot += qv[i] * kv[i];
      s[u] = dot;
    }
    float m_new = m;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      s[u] = t0 + u < end ? warp_sum(s[u]) : -CUDART_INF_F;
      m_new = fmaxf(m_new, s[u]);
    }
    const float alpha = __expf(m - m_new);
    l *= alpha;
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] *= alpha;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (t0 + u >= end) break;
      const float w = __expf(s[u] - m_new);
      float vv[VEC];
      load_vec<T, VEC>(v_cache + off[u], vv);
      l += w;
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[i] += w * vv[i];
    }
    m = m_new;
  }

  // merge the warps' partials; a warp that saw no token has m = -inf and weighs nothing
  __shared__ float sm_m[NUM_WARPS], sm_l[NUM_WARPS], sm_acc[NUM_WARPS][HEAD_DIM];
  if (lane == 0) {
    sm_m[warp] = m;
    sm_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i) sm_acc[warp][lane * VEC + i] = acc[i];
  __syncthreads();
  float m_all = -CUDART_INF_F;
#pragma unroll
  for (int w = 0; w < NUM_WARPS; ++w) m_all = fmaxf(m_all, sm_m[w]);
  float l_all = 0.f;
#pragma unroll
  for (int w = 0; w < NUM_WARPS; ++w) l_all += sm_m[w] == -CUDART_INF_F ? 0.f : sm_l[w] * __expf(sm_m[w] - m_all);
  for (int d = threadIdx.x; d < HEAD_DIM; d += NUM_THREADS) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w)
      if (sm_m[w] != -CUDART_INF_F) o += sm_acc[w][d] * __expf(sm_m[w] - m_all);
    p.part_out[(row * p.max_parts + part) * HEAD_DIM + d] = o / l_all;
  }
  if (threadIdx.x == 0) p.part_lse[row * p.max_parts + part] = m_all + __logf(l_all);
}

template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(NUM_THREADS) reduce_kernel(T* __restrict__ out, Params p) {
  const int head = blockIdx.x, seq = blockIdx.y;
  const int64_t row = (int64_t)seq * p.num_heads + head;
  const int num_parts = (p.seq_lens[seq] + PARTITION_SIZE - 1) / PARTITION_SIZE;
  const float* lse = p.part_lse + row * p.max_parts;
  float m = -CUDART_INF_F;
  for (int i = 0; i < num_parts; ++i) m = fmaxf(m, lse[i]);
  float total = 0.f;
  for (int i = 0; i < num_parts; ++i) total += __expf(lse[i] - m);
  for (int d = threadIdx.x; d < HEAD_DIM; d += NUM_THREADS) {
    float o = 0.f;
    for (int i = 0; i < num_parts; ++i) o += p.part_out[(row * p.max_parts + i) * HEAD_DIM + d] * __expf(lse[i] - m);
    out[seq * p.o_stride_t + head * p.o_stride_h + d] = from_float<T>(o / total);
  }
}

template <typename T, int HEAD_DIM>
cudaError_t launch(void* out, const void* q, const void* k_cache, const void* v_cache, const Params& p,
                   int num_seqs, cudaStream_t stream) {
  const dim3 part_grid(p.num_heads, num_seqs, p.max_parts);
  partition_kernel<T, HEAD_DIM><<<part_grid, NUM_THREADS, 0, stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k_cache), static_cast<const T*>(v_cache), p);
  reduce_kernel<T, HEAD_DIM><<<dim3(p.num_heads, num_seqs), NUM_THREADS, 0, stream>>>(static_cast<T*>(out), p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t dispatch_head_dim(int head_dim, void* out, const void* q, const void* k, const void* v,
                              const Params& p, int num_seqs, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return launch<T, 64>(out, q, k, v, p, num_seqs, stream);
    case 128: return launch<T, 128>(out, q, k, v, p, num_seqs, stream);
    case 256: return launch<T, 256>(out, q, k, v, p, num_seqs, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

extern "C" {

// Tokens per split-K partition: the caller sizes the float32 scratch buffers with it.
int slopilot_partition_size() { return PARTITION_SIZE; }

// dtype: 0 float32, 1 float16, 2 bfloat16. Returns a cudaError_t (0 = success); unsupported head
// sizes or dtypes return cudaErrorInvalidValue. Strides are in elements; head_dim must be contiguous.
int slopilot_paged_decode(void* out, const void* q, const void* k_cache, const void* v_cache,
                          const int* block_tables, const int* seq_lens, float* part_out, float* part_lse,
                          int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size,
                          int max_blocks, int max_parts, int64_t q_stride_t, int64_t q_stride_h,
                          int64_t o_stride_t, int64_t o_stride_h, int64_t kv_stride_b, int64_t kv_stride_t,
                          int64_t kv_stride_h, float scale, int dtype, void* stream) {
  if (num_seqs == 0) return 0;
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || max_parts <= 0) return cudaErrorInvalidValue;
  const Params p{block_tables, seq_lens, part_out, part_lse, num_heads, num_kv_heads, block_size, max_blocks,
                 max_parts, q_stride_t, q_stride_h, o_stride_t, o_stride_h, kv_stride_b, kv_stride_t,
                 kv_stride_h, scale};
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 0: return dispatch_head_dim<float>(head_dim, out, q, k_cache, v_cache, p, num_seqs, s);
    case 1: return dispatch_head_dim<__half>(head_dim, out, q, k_cache, v_cache, p, num_seqs, s);
    case 2: return dispatch_head_dim<__nv_bfloat16>(head_dim, out, q, k_cache, v_cache, p, num_seqs, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // extern "C"
