// CUDA scaled dot-product attention (kernels/cuda/), flash-style: the [T, S] score matrix is
// never stored. One warp owns one row (a query row forward and for dq, a key row for dk and dv);
// a block of kWarps rows shares tiles of the other operand in shared memory. Each lane holds
// up to 8 of a row's D (or Dv) elements, so D, Dv <= 256. Scores, the running max and sum, and
// every accumulation are fp32 whatever the storage type. Operands are read and written in place
// through their strides (AttentionLayout, kernels.h), so q/k/v products laid out [B, T, H, D] or
// packed [B, T, 3, H, D] need no copies.
//
// Forward (online softmax): m_i = max_j s_ij, l_i = sum_j exp(s_ij - m_i), out_i = sum_j
// exp(s_ij - m_i) v_j / l_i, lse_i = m_i + log l_i, with s_ij = scale q_i . k_j (+ bias_ij).
// Backward: delta_i = dout_i . out_i, p_ij = exp(s_ij - lse_i), ds_ij = p_ij (dout_i . v_j -
// delta_i); dq_i = scale sum_j ds_ij k_j (per query row, which also writes ds_ij for a bias'
// gradient); dk_j = scale sum_i ds_ij q_i and dv_j = sum_i p_ij dout_i (per key row: no
// atomics, deterministic).
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels.h"

namespace cleave::kernels::cuda {
namespace {

constexpr int kWarps = 8;  // rows per block
constexpr int kTile = 32;  // rows of the other operand per shared-memory tile
constexpr int kPerLane = 8;

__host__ __device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int64_t Max64(int64_t a, int64_t b) { return a > b ? a : b; }

__device__ __forceinline__ float WarpAllSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__device__ __forceinline__ void LoadRow(const T* src, int n, float scale, float (&dst)[kPerLane], int lane) {
  for (int e = 0; e < kPerLane; ++e) {
    const int d = lane + 32 * e;
    dst[e] = d < n ? ToFloat(src[d]) * scale : 0.f;
  }
}

// Where slice b of an operand laid out as s starts (its row t then at + t * s.row).
__host__ __device__ __forceinline__ int64_t SliceAt(const AttentionStrides& s, int64_t heads, int64_t b) {
  return b / heads * s.batch + b % heads * s.head;
}

// Where row i of slice b of the bias starts (its key j then at + j * col).
__host__ __device__ __forceinline__ int64_t BiasAt(const AttentionBias& a, int64_t b, int64_t i) {
  return b / a.heads * a.batch + b % a.heads * a.head + i * a.row;
}

// bias_ij, or 0 without a bias (row points at row i of the slice's bias).
__device__ __forceinline__ float BiasOf(const float* row, int64_t col, int64_t j) { return row ? row[j * col] : 0.f; }

// rows [r0, r0 + kTile) of a slice's [rows, width] operand, `ld` elements apart, into shared
// memory as kTile x width (zeros past `rows`), each scaled by `scale`.
template <typename T>
__device__ __forceinline__ void LoadTile(const T* src, int64_t r0, int64_t rows, int width, int64_t ld, float* dst,
                                         float scale = 1.f) {
  for (int e = threadIdx.x; e < kTile * width; e += blockDim.x) {
    const int64_t r = r0 + e / width;
    dst[e] = r < rows ? ToFloat(src[r * ld + e % width]) * scale : 0.f;
  }
}

__device__ __forceinline__ float RowDot(const float (&a)[kPerLane], const float* b, int n, int lane) {
  float s = 0.f;
  for (int e = 0; e < kPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d < n) s += a[e] * b[d];
  }
  return WarpAllSum(s);
}

// Slices b0 + blockIdx.y; lse is contiguous [slices, Tq].
template <typename T>
__global__ void AttnForward(AttentionLayout L, int64_t b0, const T* q, const T* k, const T* v, T* out, float* lse,
                            int64_t Tq, int64_t S, int D, int Dv, float scale, bool causal) {
  extern __shared__ float smem[];
  float* ks = smem;
  float* vs = smem + kTile * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = b0 + blockIdx.y, first = static_cast<int64_t>(blockIdx.x) * kWarps, i = first + warp;
  const int64_t offset = S - Tq;
  const bool active = i < Tq;
  const T* kb = k + SliceAt(L.k, L.heads, bh);
  const T* vb = v + SliceAt(L.v, L.heads, bh);
  float qr[kPerLane], acc[kPerLane];
  LoadRow(q + SliceAt(L.q, L.heads, bh) + (active ? i : 0) * L.q.row, D, scale, qr, lane);
  for (int e = 0; e < kPerLane; ++e) acc[e] = 0.f;
  float m = -INFINITY, l = 0.f;
  const float* bias = L.bias.data && active ? L.bias.data + BiasAt(L.bias, bh, i) : nullptr;
  const int64_t visible = !active ? 0 : causal ? Max64(0, Min64(S, i + 1 + offset)) : S;
  const int64_t last_row = Min64(Tq - 1, first + kWarps - 1);
  const int64_t block_keys = causal ? Max64(0, Min64(S, last_row + 1 + offset)) : S;
  for (int64_t j0 = 0; j0 < block_keys; j0 += kTile) {
    __syncthreads();
    LoadTile(kb, j0, S, D, L.k.row, ks);
    LoadTile(vb, j0, S, Dv, L.v.row, vs);
    __syncthreads();
    for (int jj = 0; jj < kTile && j0 + jj < visible; ++jj) {
      const float s = RowDot(qr, ks + jj * D, D, lane) + BiasOf(bias, L.bias.col, j0 + jj);
      const float m_new = fmaxf(m, s);
      if (m_new == -INFINITY) continue;  // every score so far masked: nothing to add
      const float corr = expf(m - m_new), p = expf(s - m_new);
      l = l * corr + p;
      for (int e = 0; e < kPerLane; ++e) {
        const int d = lane + 32 * e;
        acc[e] = acc[e] * corr + (d < Dv ? p * vs[jj * Dv + d] : 0.f);
      }
      m = m_new;
    }
  }
  if (!active) return;
  T* o = out + SliceAt(L.o, L.heads, bh) + i * L.o.row;
  for (int e = 0; e < kPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d < Dv) o[d] = FromFloat<T>(l > 0.f ? acc[e] / l : 0.f);
  }
  if (lse && lane == 0) lse[bh * Tq + i] = l > 0.f ? m + logf(l) : -INFINITY;
}

// delta_i = dout_i . out_i (warp per row of the rows = slices x Tq, both laid out as o).
template <typename T>
__global__ void AttnDelta(AttentionLayout L, const T* dout, const T* out, float* delta, int64_t rows, int64_t Tq,
                          int Dv) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t at = SliceAt(L.o, L.heads, row / Tq) + row % Tq * L.o.row;
  float s = 0.f;
  for (int d = lane; d < Dv; d += 32) s += ToFloat(dout[at + d]) * ToFloat(out[at + d]);
  s = WarpAllSum(s);
  if (lane == 0) delta[row] = s;
}

// dq: warp per query row, tiles of k and v.
template <typename T>
__global__ void AttnBackwardQ(AttentionLayout L, int64_t b0, const T* dout, const T* q, const T* k, const T* v,
                              const float* lse, const float* delta, T* dq, int64_t Tq, int64_t S, int D, int Dv,
                              float scale, bool causal) {
  extern __shared__ float smem[];
  float* ks = smem;
  float* vs = smem + kTile * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = b0 + blockIdx.y, first = static_cast<int64_t>(blockIdx.x) * kWarps, i = first + warp;
  const int64_t offset = S - Tq;
  const bool active = i < Tq;
  const int64_t row = bh * Tq + (active ? i : 0);  // of lse and delta
  const int64_t q_at = SliceAt(L.q, L.heads, bh) + (active ? i : 0) * L.q.row;
  float qr[kPerLane], dor[kPerLane], acc[kPerLane];
  LoadRow(q + q_at, D, scale, qr, lane);
  LoadRow(dout + SliceAt(L.o, L.heads, bh) + (active ? i : 0) * L.o.row, Dv, 1.f, dor, lane);
  for (int e = 0; e < kPerLane; ++e) acc[e] = 0.f;
  const float li = active ? lse[row] : 0.f, di = active ? delta[row] : 0.f;
  const float* bias = L.bias.data && active ? L.bias.data + BiasAt(L.bias, bh, i) : nullptr;
  // A row that attended to nothing (lse -inf) has no probabilities.
  const int64_t visible = !active || li == -INFINITY ? 0 : causal ? Max64(0, Min64(S, i + 1 + offset)) : S;
  const int64_t last_row = Min64(Tq - 1, first + kWarps - 1);
  const int64_t block_keys = causal ? Max64(0, Min64(S, last_row + 1 + offset)) : S;
  const T* kb = k + SliceAt(L.k, L.heads, bh);
  const T* vb = v + SliceAt(L.v, L.heads, bh);
  for (int64_t j0 = 0; j0 < block_keys; j0 += kTile) {
    __syncthreads();
    LoadTile(kb, j0, S, D, L.k.row, ks);
    LoadTile(vb, j0, S, Dv, L.v.row, vs);
    __syncthreads();
    for (int jj = 0; jj < kTile && j0 + jj < visible; ++jj) {
      const float p = expf(RowDot(qr, ks + jj * D, D, lane) + BiasOf(bias, L.bias.col, j0 + jj) - li);
      const float ds = p * (RowDot(dor, vs + jj * Dv, Dv, lane) - di);
      if (L.dscores && lane == 0) L.dscores[row * S + j0 + jj] = ds;
      for (int e = 0; e < kPerLane; ++e) {
        const int d = lane + 32 * e;
        if (d < D) acc[e] += ds * ks[jj * D + d];
      }
    }
  }
  if (!active) return;
  for (int e = 0; e < kPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d < D) dq[q_at + d] = FromFloat<T>(scale * acc[e]);
  }
}

// dk, dv: warp per key row, tiles of q and dout (with their rows' lse and delta).
template <typename T>
__global__ void AttnBackwardKV(AttentionLayout L, int64_t b0, const T* dout, const T* q, const T* k, const T* v,
                               const float* lse, const float* delta, T* dk, T* dv, int64_t Tq, int64_t S, int D,
                               int Dv, float scale, bool causal) {
  extern __shared__ float smem[];
  float* qs = smem;                    // kTile x D (scaled)
  float* dos = smem + kTile * D;       // kTile x Dv
  float* stats = dos + kTile * Dv;     // kTile lse, then kTile delta
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = b0 + blockIdx.y, first = static_cast<int64_t>(blockIdx.x) * kWarps, j = first + warp;
  const int64_t offset = S - Tq;
  const bool active = j < S;
  const int64_t k_at = SliceAt(L.k, L.heads, bh) + (active ? j : 0) * L.k.row;
  const int64_t v_at = SliceAt(L.v, L.heads, bh) + (active ? j : 0) * L.v.row;
  float kr[kPerLane], vr[kPerLane], dk_acc[kPerLane], dv_acc[kPerLane];
  LoadRow(k + k_at, D, 1.f, kr, lane);
  LoadRow(v + v_at, Dv, 1.f, vr, lane);
  for (int e = 0; e < kPerLane; ++e) dk_acc[e] = dv_acc[e] = 0.f;
  // Query rows that see key j: i >= j - offset (all when not causal).
  const int64_t first_query = !active ? Tq : causal ? Max64(0, j - offset) : 0;
  const int64_t block_first = causal ? Max64(0, first - offset) : 0;
  const T* qb = q + SliceAt(L.q, L.heads, bh);
  const T* dob = dout + SliceAt(L.o, L.heads, bh);
  for (int64_t i0 = block_first - block_first % kTile; i0 < Tq; i0 += kTile) {
    __syncthreads();
    LoadTile(qb, i0, Tq, D, L.q.row, qs, scale);
    LoadTile(dob, i0, Tq, Dv, L.o.row, dos);
    for (int e = threadIdx.x; e < kTile; e += blockDim.x) {
      const int64_t r = i0 + e;
      stats[e] = r < Tq ? lse[bh * Tq + r] : 0.f;
      stats[kTile + e] = r < Tq ? delta[bh * Tq + r] : 0.f;
    }
    __syncthreads();
    for (int ii = 0; ii < kTile && i0 + ii < Tq; ++ii) {
      if (i0 + ii < first_query || stats[ii] == -INFINITY) continue;  // warp-uniform
      const float b = L.bias.data ? L.bias.data[BiasAt(L.bias, bh, i0 + ii) + j * L.bias.col] : 0.f;
      const float p = expf(RowDot(kr, qs + ii * D, D, lane) + b - stats[ii]);
      const float ds = p * (RowDot(vr, dos + ii * Dv, Dv, lane) - stats[kTile + ii]);
      for (int e = 0; e < kPerLane; ++e) {
        const int d = lane + 32 * e;
        if (d < D) dk_acc[e] += ds * qs[ii * D + d];  // qs holds scale * q
        if (d < Dv) dv_acc[e] += p * dos[ii * Dv + d];
      }
    }
  }
  if (!active) return;
  for (int e = 0; e < kPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d < D) dk[k_at + d] = FromFloat<T>(dk_acc[e]);
    if (d < Dv) dv[v_at + d] = FromFloat<T>(dv_acc[e]);
  }
}

dim3 Grid(int64_t rows, int64_t batch) {
  return dim3(static_cast<unsigned>((rows + kWarps - 1) / kWarps), static_cast<unsigned>(batch));
}

// The (batch x head) slices go in gridDim.y, at most 65535 a launch: more are launched in
// chunks, each kernel told its chunk's first slice.
constexpr int64_t kSlicesPerLaunch = 65535;

bool ValidLayout(const AttentionLayout& L) { return L.heads >= 1; }

}  // namespace

int AttentionForward(Dt dt, const AttentionLayout& layout, const void* q, const void* k, const void* v, void* out,
                     float* lse, int64_t batch, int64_t T, int64_t S, int D, int Dv, float scale, bool causal,
                     void* stream) {
  if (D > 32 * kPerLane || Dv > 32 * kPerLane || !ValidLayout(layout)) return static_cast<int>(cudaErrorInvalidValue);
  if (batch == 0 || T == 0) return 0;
  const size_t shared = sizeof(float) * kTile * (D + Dv);
  DISPATCH_DT(dt, Tp, {
    cudaFuncSetAttribute(AttnForward<Tp>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
    for (int64_t b0 = 0; b0 < batch; b0 += kSlicesPerLaunch) {
      const int64_t nb = batch - b0 < kSlicesPerLaunch ? batch - b0 : kSlicesPerLaunch;
      AttnForward<Tp><<<Grid(T, nb), kWarps * 32, shared, Stream(stream)>>>(
          layout, b0, static_cast<const Tp*>(q), static_cast<const Tp*>(k), static_cast<const Tp*>(v),
          static_cast<Tp*>(out), lse, T, S, D, Dv, scale, causal);
    }
  });
  return static_cast<int>(cudaGetLastError());
}

int AttentionBackward(Dt dt, const AttentionLayout& layout, const void* dout, const void* q, const void* k,
                      const void* v, const void* out, const float* lse, void* dq, void* dk, void* dv, float* delta,
                      int64_t batch, int64_t T, int64_t S, int D, int Dv, float scale, bool causal, void* stream) {
  if (D > 32 * kPerLane || Dv > 32 * kPerLane || !ValidLayout(layout)) return static_cast<int>(cudaErrorInvalidValue);
  if (batch == 0 || (T == 0 && S == 0)) return 0;
  cudaStream_t s = Stream(stream);
  DISPATCH_DT(dt, Tp, {
    const Tp* dO = static_cast<const Tp*>(dout);
    const Tp* qp = static_cast<const Tp*>(q);
    const Tp* kp = static_cast<const Tp*>(k);
    const Tp* vp = static_cast<const Tp*>(v);
    const int shared_q = static_cast<int>(sizeof(float) * kTile * (D + Dv));
    const int shared_kv = static_cast<int>(sizeof(float) * kTile * (D + Dv + 2));
    cudaFuncSetAttribute(AttnBackwardQ<Tp>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_q);
    cudaFuncSetAttribute(AttnBackwardKV<Tp>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_kv);
    if (layout.dscores && T > 0 && S > 0)  // the positions no query row sees stay zero
      cudaMemsetAsync(layout.dscores, 0, sizeof(float) * static_cast<size_t>(batch * T * S), s);
    if (T > 0)  // no query rows: no deltas (a zero-block launch would be an error)
      AttnDelta<Tp><<<static_cast<unsigned>((batch * T + kWarps - 1) / kWarps), kWarps * 32, 0, s>>>(
          layout, dO, static_cast<const Tp*>(out), delta, batch * T, T, Dv);
    for (int64_t b0 = 0; b0 < batch; b0 += kSlicesPerLaunch) {
      const int64_t nb = batch - b0 < kSlicesPerLaunch ? batch - b0 : kSlicesPerLaunch;
      if (T > 0)
        AttnBackwardQ<Tp><<<Grid(T, nb), kWarps * 32, shared_q, s>>>(layout, b0, dO, qp, kp, vp, lse, delta,
                                                                     static_cast<Tp*>(dq), T, S, D, Dv, scale, causal);
      if (S > 0)
        AttnBackwardKV<Tp><<<Grid(S, nb), kWarps * 32, shared_kv, s>>>(layout, b0, dO, qp, kp, vp, lse, delta,
                                                                       static_cast<Tp*>(dk), static_cast<Tp*>(dv), T,
                                                                       S, D, Dv, scale, causal);
    }
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace cleave::kernels::cuda
