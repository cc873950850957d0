// Causal grouped-query attention with a KV cache (src/attention.rs): RoPE from a table of
// (cos, sin) the host computes per position (so every model's RoPE variant stays on the host),
// the cache append (f32 or f16 rows, or ggml Q8_0/Q4_0 blocks quantized as frognano-model's
// KvRows::push does), split-K flash decoding (keys in chunks across blocks,
// then a combine kernel) for one or a few new tokens, and a tiled flash-attention prefill
// (a tile of query rows per block, online softmax over key tiles in shared memory).
// Everything accumulates in f32; f16 keys and values are converted on read, Q8_0/Q4_0 ones
// dequantized on read (ggml's float operations).
#include "common.cuh"

// "Minus infinity" of the online softmaxes: finite, so that differences of two of them stay
// finite (exp(NEG − NEG) = 1, never NaN) and exp(NEG − m) is 0 for any real m.
#define ATTN_NEG (-3.0e38f)
// Largest head_dim the kernels take.
#define ATTN_MAX_DIM 256
// Split-K decoding: threads per block, keys per shared-memory tile, query heads per block (at
// most), chunks per row (at most, the combine kernel's table).
#define ATTN_DEC_THREADS 128
#define ATTN_DEC_TILE 128
#define ATTN_DEC_HEADS 8
#define ATTN_MAX_CHUNKS 256
// Tiled prefill: threads per block, query rows per block (ATTN_PF_THREADS / ATTN_PF_ROWS = 8
// threads share one output row, each 1/8 of its dims).
#define ATTN_PF_THREADS 128
#define ATTN_PF_ROWS 16

#if defined(__CUDACC__)
#define ATTN_UNROLL _Pragma("unroll")
#else
#define ATTN_UNROLL
#endif

__device__ __forceinline__ int attn_min(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ float attn_ld(const float* p, fn_size i) { return p[i]; }
__device__ __forceinline__ float attn_ld(const fn_u16* p, fn_size i) { return fn_h2f(p[i]); }
__device__ __forceinline__ void attn_st(float* p, fn_size i, float v) { p[i] = v; }
__device__ __forceinline__ void attn_st(fn_u16* p, fn_size i, float v) { p[i] = fn_f2h(v); }

// Q8_0 and Q4_0 caches: ggml blocks of 32 values (an f16 scale d, little-endian, then the
// quants: 32 int8 q, x = q·d; or 16 bytes, element j in the low nibble of byte j and element
// j + 16 in its high nibble, x = (q − 8)·d), rows of width / 32 blocks (width a multiple of 32),
// so element i of the flat [capacity, width] array is element i % 32 of block i / 32. The
// kernels take the blocks as bytes and view them through these tag types, so that attn_ld's
// overloads (by element index) pick the dequantization.
struct attn_q8_0 {
    fn_u8 byte;
};
struct attn_q4_0 {
    fn_u8 byte;
};
#define ATTN_Q8_0_BYTES 34
#define ATTN_Q4_0_BYTES 18
__device__ __forceinline__ float attn_scale(const fn_u8* blk) { return fn_h2f((fn_u16)(blk[0] | (blk[1] << 8))); }
__device__ __forceinline__ float attn_ld(const attn_q8_0* p, fn_size i) {
    const fn_u8* blk = reinterpret_cast<const fn_u8*>(p) + (i >> 5) * ATTN_Q8_0_BYTES;
    return (float)(int)(fn_i8)blk[2 + (i & 31)] * attn_scale(blk);
}
__device__ __forceinline__ float attn_ld(const attn_q4_0* p, fn_size i) {
    const fn_u8* blk = reinterpret_cast<const fn_u8*>(p) + (i >> 5) * ATTN_Q4_0_BYTES;
    const int j = (int)(i & 31);
    const int q = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
    return (float)(q - 8) * attn_scale(blk);
}

// ---- RoPE

// x [rows, heads, head_dim] in place; cos_sin [rows, rot_dim/2, 2]. Pair i < rot_dim/2 is dims
// (i, i + rot_dim/2) when `halves`, else (2i, 2i+1); dims ≥ rot_dim are untouched. The products
// are fused as llama.rs (ggml) does: x0·c − x1·s = fma(x0, c, −(x1·s)), x0·s + x1·c =
// fma(x0, s, x1·c). One block a row, threads over (head, pair).
extern "C" __global__ void attn_rope(float* __restrict__ x, const float* __restrict__ cos_sin, int heads, int head_dim,
                                     int rot_dim, int halves) {
    const int half = rot_dim / 2;
    float* xr = x + (fn_size)blockIdx.x * heads * head_dim;
    const float* cs = cos_sin + (fn_size)blockIdx.x * half * 2;
    for (int p = threadIdx.x; p < heads * half; p += blockDim.x) {
        const int h = p / half, i = p - h * half;
        const float c = cs[2 * i], s = cs[2 * i + 1];
        float* xh = xr + (fn_size)h * head_dim;
        const int a = halves ? i : 2 * i, b = halves ? i + half : 2 * i + 1;
        const float x0 = xh[a], x1 = xh[b];
        xh[a] = fmaf(x0, c, -(x1 * s));
        xh[b] = fmaf(x0, s, x1 * c);
    }
}

// ---- KV cache append

template <typename T>
__device__ __forceinline__ void attn_append(T* kc, T* vc, const float* k, const float* v, fn_size base, int n) {
    const fn_size i = (fn_size)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (fn_size)n) {
        attn_st(kc, base + i, k[i]);
        attn_st(vc, base + i, v[i]);
    }
}

// kc/vc [capacity, width] f32; rows [n / width, width] of k and v written from row pos0 on.
extern "C" __global__ void attn_kv_append_f32(float* __restrict__ kc, float* __restrict__ vc, const float* __restrict__ k,
                                              const float* __restrict__ v, int pos0, int width, int n) {
    attn_append(kc, vc, k, v, (fn_size)pos0 * width, n);
}

// The same into an f16 cache (round to nearest even).
extern "C" __global__ void attn_kv_append_f16(fn_u16* __restrict__ kc, fn_u16* __restrict__ vc,
                                              const float* __restrict__ k, const float* __restrict__ v, int pos0,
                                              int width, int n) {
    attn_append(kc, vc, k, v, (fn_size)pos0 * width, n);
}

// f32 products and sums rounded once each, never fused into an fma (the device compiles with
// --fmad=true): the quantizers must repeat the CPU's float operations exactly. On the host the
// product is exact in double, then rounded once to f32.
#if defined(__CUDACC__)
#define ATTN_MUL_RN(a, b) __fmul_rn(a, b)
#define ATTN_ADD_RN(a, b) __fadd_rn(a, b)
#else
#define ATTN_MUL_RN(a, b) ((float)((double)(a) * (double)(b)))
#define ATTN_ADD_RN(a, b) ((float)((double)(a) + (double)(b)))
#endif

// Rust's `f as i8` of an f32: toward zero, saturating, NaN to 0.
__device__ __forceinline__ int attn_f2i8(float f) {
    if (!(f == f)) return 0;
    if (f <= -128.0f) return -128;
    if (f >= 127.0f) return 127;
    return (int)f;
}

__device__ __forceinline__ void attn_put_scale(fn_u8* blk, float d) {
    const fn_u16 h = fn_f2h(d);
    blk[0] = (fn_u8)(h & 0xff);
    blk[1] = (fn_u8)(h >> 8);
}

// One Q8_0 block from the warp's 32 values (lane l holds element l), as KvRows::push
// (ggml's quantize_row_q8_0_ref): amax = max |x| (NaN ignored), d = amax / 127, id = 1/d (0 when
// d is 0), q = round(x·id) (half away from zero), the scale stored as f16 (nearest even).
// Every lane of the warp calls it.
__device__ __forceinline__ void attn_quant_q8_0(fn_u8* blk, float x, int lane) {
    const float amax = fmaxf(0.0f, fn_warp_max(fabsf(x)));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (lane == 0) attn_put_scale(blk, d);
    blk[2 + lane] = (fn_u8)(fn_i8)attn_f2i8(roundf(ATTN_MUL_RN(x, id)));
}

// One Q4_0 block (ggml's quantize_row_q4_0_ref, as KvRows::push): max = the value of largest
// magnitude (the first of equal ones; NaN never; +0 when none is above 0), d = max / −8,
// id = 1/d (0 when d is 0), q = min(15, (i8)(x·id + 8.5)); element j in the low nibble of byte
// j, element j + 16 in its high nibble. Every lane of the warp calls it.
__device__ __forceinline__ void attn_quant_q4_0(fn_u8* blk, float x, int lane) {
    const float a = fabsf(x);
    float key = a > 0.0f ? a : -1.0f, val = x;
    int idx = lane;
    for (int o = 16; o > 0; o >>= 1) {
        const float ok = __shfl_xor_sync(0xffffffffu, key, o), ov = __shfl_xor_sync(0xffffffffu, val, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ok > key || (ok == key && oi < idx)) {
            key = ok;
            val = ov;
            idx = oi;
        }
    }
    const float mx = key > 0.0f ? val : 0.0f;
    const float d = mx / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (lane == 0) attn_put_scale(blk, d);
    int q = attn_f2i8(ATTN_ADD_RN(ATTN_MUL_RN(x, id), 8.5f));
    q = (q < 15 ? q : 15) & 0xff;
    const int hi = __shfl_down_sync(0xffffffffu, q, 16);
    if (lane < 16) blk[2 + lane] = (fn_u8)((q | (hi << 4)) & 0xff);
}

// kc/vc rows of width / 32 Q8_0 blocks; the nb = rows·width / 32 blocks of k and of v
// ([rows, width] f32) written from row pos0 on. One warp a block (of k and of v): grid
// ceil(nb / 8) of 256 threads.
extern "C" __global__ void attn_kv_append_q8_0(fn_u8* __restrict__ kc, fn_u8* __restrict__ vc,
                                               const float* __restrict__ k, const float* __restrict__ v, int pos0,
                                               int width, int nb) {
    const int lane = threadIdx.x % 32;
    const fn_size b = (fn_size)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (b >= (fn_size)nb) return;  // whole warps
    const fn_size dst = ((fn_size)pos0 * (width / 32) + b) * ATTN_Q8_0_BYTES;
    attn_quant_q8_0(kc + dst, k[b * 32 + lane], lane);
    attn_quant_q8_0(vc + dst, v[b * 32 + lane], lane);
}

// The same into a Q4_0 cache.
extern "C" __global__ void attn_kv_append_q4_0(fn_u8* __restrict__ kc, fn_u8* __restrict__ vc,
                                               const float* __restrict__ k, const float* __restrict__ v, int pos0,
                                               int width, int nb) {
    const int lane = threadIdx.x % 32;
    const fn_size b = (fn_size)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (b >= (fn_size)nb) return;  // whole warps
    const fn_size dst = ((fn_size)pos0 * (width / 32) + b) * ATTN_Q4_0_BYTES;
    attn_quant_q4_0(kc + dst, k[b * 32 + lane], lane);
    attn_quant_q4_0(vc + dst, v[b * 32 + lane], lane);
}

// ---- Split-K flash decoding

// Block (chunk c, head group y, query row z) of ATTN_DEC_THREADS threads: query heads
// h0 = y·hb .. h0+hb (all of one KV head) of row z against the keys [c·chunk, (c+1)·chunk) ∩
// [0, pos0 + z] in tiles of ATTN_DEC_TILE keys. Scores: one warp a key, the key row read once
// (coalesced across the lanes) for all hb heads, warp sums; online softmax: one warp a head;
// value sums: threads over dims, every value row read once for all hb heads. Writes the
// chunk's running max m, sum l and unnormalised accumulator to pm/pl [rows·heads, chunks] and
// pacc [rows·heads, chunks, head_dim]; an empty chunk writes (ATTN_NEG, 0, 0).
template <typename T>
__device__ __forceinline__ void attn_decode_core(const float* q, const T* kc, const T* vc, float* pm, float* pl,
                                                 float* pacc, int pos0, int heads, int kv_heads, int head_dim, int hb,
                                                 int chunk, float scale) {
    __shared__ float q_s[ATTN_DEC_HEADS * ATTN_MAX_DIM];
    __shared__ float p_s[ATTN_DEC_HEADS * ATTN_DEC_TILE];
    __shared__ float m_s[ATTN_DEC_HEADS], l_s[ATTN_DEC_HEADS], a_s[ATTN_DEC_HEADS];
    const int chunks = gridDim.x, c = blockIdx.x, row = blockIdx.z;
    const int h0 = blockIdx.y * hb, group = heads / kv_heads, kvh = h0 / group;
    const fn_size width = (fn_size)kv_heads * head_dim, koff = (fn_size)kvh * head_dim;
    const int n = pos0 + row + 1;
    const int start = c * chunk, end = attn_min(start + chunk, n);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, warps = blockDim.x / 32;
    const fn_size rh0 = (fn_size)row * heads + h0;  // (row, head) index of the block's first head
    for (int e = tid; e < hb * head_dim; e += blockDim.x) q_s[e] = q[rh0 * head_dim + e];
    if (tid < hb) {
        m_s[tid] = ATTN_NEG;
        l_s[tid] = 0.0f;
    }
    float acc[ATTN_DEC_HEADS][ATTN_MAX_DIM / ATTN_DEC_THREADS];
    ATTN_UNROLL
    for (int hh = 0; hh < ATTN_DEC_HEADS; hh++) {
        ATTN_UNROLL
        for (int k = 0; k < ATTN_MAX_DIM / ATTN_DEC_THREADS; k++) acc[hh][k] = 0.0f;
    }
    __syncthreads();
    for (int t0 = start; t0 < end; t0 += ATTN_DEC_TILE) {
        const int cnt = attn_min(ATTN_DEC_TILE, end - t0);
        // Scores of the tile, scaled, into p_s[hh][jj].
        for (int jj = warp; jj < cnt; jj += warps) {
            const fn_size kr = (fn_size)(t0 + jj) * width + koff;
            float kreg[ATTN_MAX_DIM / 32];
            ATTN_UNROLL
            for (int s = 0; s < ATTN_MAX_DIM / 32; s++) {
                const int d = lane + 32 * s;
                kreg[s] = d < head_dim ? attn_ld(kc, kr + d) : 0.0f;
            }
            for (int hh = 0; hh < hb; hh++) {
                float part = 0.0f;
                ATTN_UNROLL
                for (int s = 0; s < ATTN_MAX_DIM / 32; s++) {
                    const int d = lane + 32 * s;
                    if (d < head_dim) part = fmaf(q_s[hh * head_dim + d], kreg[s], part);
                }
                part = fn_warp_sum(part);
                if (lane == 0) p_s[hh * ATTN_DEC_TILE + jj] = part * scale;
            }
        }
        __syncthreads();
        // Online softmax: the tile's max and exponentials, the rescale of what came before.
        for (int hh = warp; hh < hb; hh += warps) {
            float* ps = p_s + hh * ATTN_DEC_TILE;
            float mx = ATTN_NEG;
            for (int jj = lane; jj < cnt; jj += 32) mx = fmaxf(mx, ps[jj]);
            mx = fn_warp_max(mx);
            const float m_old = m_s[hh], m_new = fmaxf(m_old, mx);
            float sum = 0.0f;
            for (int jj = lane; jj < cnt; jj += 32) {
                const float p = expf(ps[jj] - m_new);
                ps[jj] = p;
                sum += p;
            }
            sum = fn_warp_sum(sum);
            if (lane == 0) {
                const float a = expf(m_old - m_new);
                a_s[hh] = a;
                l_s[hh] = l_s[hh] * a + sum;
                m_s[hh] = m_new;
            }
        }
        __syncthreads();
        // Value sums: thread tid owns dims tid, tid + ATTN_DEC_THREADS of every head.
        ATTN_UNROLL
        for (int hh = 0; hh < ATTN_DEC_HEADS; hh++) {
            if (hh < hb) {
                const float a = a_s[hh];
                ATTN_UNROLL
                for (int k = 0; k < ATTN_MAX_DIM / ATTN_DEC_THREADS; k++) acc[hh][k] *= a;
            }
        }
        for (int jj = 0; jj < cnt; jj++) {
            const fn_size vr = (fn_size)(t0 + jj) * width + koff;
            float vv[ATTN_MAX_DIM / ATTN_DEC_THREADS];
            ATTN_UNROLL
            for (int k = 0; k < ATTN_MAX_DIM / ATTN_DEC_THREADS; k++) {
                const int d = tid + ATTN_DEC_THREADS * k;
                vv[k] = d < head_dim ? attn_ld(vc, vr + d) : 0.0f;
            }
            ATTN_UNROLL
            for (int hh = 0; hh < ATTN_DEC_HEADS; hh++) {
                if (hh < hb) {
                    const float p = p_s[hh * ATTN_DEC_TILE + jj];
                    ATTN_UNROLL
                    for (int k = 0; k < ATTN_MAX_DIM / ATTN_DEC_THREADS; k++) acc[hh][k] = fmaf(p, vv[k], acc[hh][k]);
                }
            }
        }
        __syncthreads();
    }
    if (tid < hb) {
        pm[(rh0 + tid) * chunks + c] = m_s[tid];
        pl[(rh0 + tid) * chunks + c] = l_s[tid];
    }
    ATTN_UNROLL
    for (int hh = 0; hh < ATTN_DEC_HEADS; hh++) {
        if (hh < hb) {
            float* dst = pacc + ((rh0 + hh) * chunks + c) * head_dim;
            ATTN_UNROLL
            for (int k = 0; k < ATTN_MAX_DIM / ATTN_DEC_THREADS; k++) {
                const int d = tid + ATTN_DEC_THREADS * k;
                if (d < head_dim) dst[d] = acc[hh][k];
            }
        }
    }
}

// Split-K partials on an f32 cache: grid (chunks, heads / hb, rows), ATTN_DEC_THREADS threads.
// q [rows, heads, head_dim]; kc/vc [capacity, kv_heads·head_dim].
extern "C" __global__ void attn_decode_partial_f32(const float* __restrict__ q, const float* __restrict__ kc,
                                                   const float* __restrict__ vc, float* __restrict__ pm,
                                                   float* __restrict__ pl, float* __restrict__ pacc, int pos0,
                                                   int heads, int kv_heads, int head_dim, int hb, int chunk,
                                                   float scale) {
    attn_decode_core(q, kc, vc, pm, pl, pacc, pos0, heads, kv_heads, head_dim, hb, chunk, scale);
}

// The same on an f16 cache.
extern "C" __global__ void attn_decode_partial_f16(const float* __restrict__ q, const fn_u16* __restrict__ kc,
                                                   const fn_u16* __restrict__ vc, float* __restrict__ pm,
                                                   float* __restrict__ pl, float* __restrict__ pacc, int pos0,
                                                   int heads, int kv_heads, int head_dim, int hb, int chunk,
                                                   float scale) {
    attn_decode_core(q, kc, vc, pm, pl, pacc, pos0, heads, kv_heads, head_dim, hb, chunk, scale);
}

// The same on a Q8_0 cache (kc/vc the blocks' bytes).
extern "C" __global__ void attn_decode_partial_q8_0(const float* __restrict__ q, const fn_u8* __restrict__ kc,
                                                    const fn_u8* __restrict__ vc, float* __restrict__ pm,
                                                    float* __restrict__ pl, float* __restrict__ pacc, int pos0,
                                                    int heads, int kv_heads, int head_dim, int hb, int chunk,
                                                    float scale) {
    attn_decode_core(q, reinterpret_cast<const attn_q8_0*>(kc), reinterpret_cast<const attn_q8_0*>(vc), pm, pl, pacc,
                     pos0, heads, kv_heads, head_dim, hb, chunk, scale);
}

// The same on a Q4_0 cache.
extern "C" __global__ void attn_decode_partial_q4_0(const float* __restrict__ q, const fn_u8* __restrict__ kc,
                                                    const fn_u8* __restrict__ vc, float* __restrict__ pm,
                                                    float* __restrict__ pl, float* __restrict__ pacc, int pos0,
                                                    int heads, int kv_heads, int head_dim, int hb, int chunk,
                                                    float scale) {
    attn_decode_core(q, reinterpret_cast<const attn_q4_0*>(kc), reinterpret_cast<const attn_q4_0*>(vc), pm, pl, pacc,
                     pos0, heads, kv_heads, head_dim, hb, chunk, scale);
}

// out[rh, :] = Σ_c e^(m_c − M)·acc_c / Σ_c e^(m_c − M)·l_c over the chunks of the partials, for
// every (row, head) rh: one block each, threads over dims. chunks ≤ ATTN_MAX_CHUNKS.
extern "C" __global__ void attn_decode_combine(const float* __restrict__ pm, const float* __restrict__ pl,
                                               const float* __restrict__ pacc, float* __restrict__ out, int chunks,
                                               int head_dim) {
    __shared__ float w_s[ATTN_MAX_CHUNKS];
    const fn_size rh = blockIdx.x;
    const float* m = pm + rh * chunks;
    const float* l = pl + rh * chunks;
    float mx = ATTN_NEG;
    for (int c = 0; c < chunks; c++) mx = fmaxf(mx, m[c]);
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) w_s[c] = expf(m[c] - mx);
    __syncthreads();
    float den = 0.0f;
    for (int c = 0; c < chunks; c++) den = fmaf(w_s[c], l[c], den);
    const float inv = 1.0f / den;
    const float* acc = pacc + rh * chunks * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float s = 0.0f;
        for (int c = 0; c < chunks; c++) s = fmaf(w_s[c], acc[(fn_size)c * head_dim + d], s);
        out[rh * head_dim + d] = s * inv;
    }
}

// ---- Tiled flash-attention prefill

// Block (query tile x, head y) of ATTN_PF_THREADS threads: query rows x·ATTN_PF_ROWS.. of head
// y against keys 0 ..= pos0 + (its last row), in tiles of bk keys. Shared (dynamic, `sh`):
// Q [ATTN_PF_ROWS, head_dim+1], one K-then-V tile [bk, head_dim+1] (rows padded by one float
// against bank conflicts), scores/probabilities [ATTN_PF_ROWS, bk]. Per key tile: K tile
// loaded, scores (threads over (row, key)) with the causal mask, then the V tile loaded over
// the K tile while one warp a row runs the online softmax, then the value sums (8 threads a
// row, each every 8th dim, accumulators in registers).
template <typename T>
__device__ __forceinline__ void attn_prefill_core(float* sh, const float* q, const T* kc, const T* vc, float* out, int t,
                                                  int pos0, int heads, int kv_heads, int head_dim, int bk,
                                                  float scale) {
    __shared__ float m_s[ATTN_PF_ROWS], l_s[ATTN_PF_ROWS], a_s[ATTN_PF_ROWS];
    const int ld = head_dim + 1;
    float* q_s = sh;
    float* kv_s = q_s + ATTN_PF_ROWS * ld;
    float* s_s = kv_s + bk * ld;
    const int q0 = blockIdx.x * ATTN_PF_ROWS, h = blockIdx.y;
    const int group = heads / kv_heads, kvh = h / group;
    const fn_size width = (fn_size)kv_heads * head_dim, koff = (fn_size)kvh * head_dim;
    const int rows = attn_min(ATTN_PF_ROWS, t - q0);
    const int kend = pos0 + q0 + rows;  // keys 0..kend-1 are seen by some row of the tile
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, warps = blockDim.x / 32;
    for (int e = tid; e < ATTN_PF_ROWS * head_dim; e += blockDim.x) {
        const int r = e / head_dim, d = e - r * head_dim;
        q_s[r * ld + d] = r < rows ? q[((fn_size)(q0 + r) * heads + h) * head_dim + d] : 0.0f;
    }
    if (tid < ATTN_PF_ROWS) {
        m_s[tid] = ATTN_NEG;
        l_s[tid] = 0.0f;
    }
    const int ro = tid / 8, dl = tid % 8;  // this thread's output row and first dim
    float acc[ATTN_MAX_DIM / 8];
    ATTN_UNROLL
    for (int k = 0; k < ATTN_MAX_DIM / 8; k++) acc[k] = 0.0f;
    __syncthreads();
    for (int k0 = 0; k0 < kend; k0 += bk) {
        const int cnt = attn_min(bk, kend - k0);
        for (int e = tid; e < bk * head_dim; e += blockDim.x) {
            const int j = e / head_dim, d = e - j * head_dim;
            kv_s[j * ld + d] = j < cnt ? attn_ld(kc, (fn_size)(k0 + j) * width + koff + d) : 0.0f;
        }
        __syncthreads();
        for (int e = tid; e < ATTN_PF_ROWS * bk; e += blockDim.x) {
            const int r = e / bk, j = e - r * bk;
            float s = ATTN_NEG;
            if (r < rows && j < cnt && k0 + j <= pos0 + q0 + r) {
                const float* qr = q_s + r * ld;
                const float* kr = kv_s + j * ld;
                float dot = 0.0f;
                for (int d = 0; d < head_dim; d++) dot = fmaf(qr[d], kr[d], dot);
                s = dot * scale;
            }
            s_s[r * bk + j] = s;
        }
        __syncthreads();
        for (int e = tid; e < bk * head_dim; e += blockDim.x) {
            const int j = e / head_dim, d = e - j * head_dim;
            kv_s[j * ld + d] = j < cnt ? attn_ld(vc, (fn_size)(k0 + j) * width + koff + d) : 0.0f;
        }
        for (int r = warp; r < ATTN_PF_ROWS; r += warps) {
            float* sr = s_s + r * bk;
            float mx = ATTN_NEG;
            for (int j = lane; j < bk; j += 32) mx = fmaxf(mx, sr[j]);
            mx = fn_warp_max(mx);
            const float m_old = m_s[r], m_new = fmaxf(m_old, mx);
            float sum = 0.0f;
            for (int j = lane; j < bk; j += 32) {
                const float sv = sr[j];
                const float p = sv > 0.5f * ATTN_NEG ? expf(sv - m_new) : 0.0f;
                sr[j] = p;
                sum += p;
            }
            sum = fn_warp_sum(sum);
            if (lane == 0) {
                const float a = expf(m_old - m_new);
                a_s[r] = a;
                l_s[r] = l_s[r] * a + sum;
                m_s[r] = m_new;
            }
        }
        __syncthreads();
        const float a = a_s[ro];
        ATTN_UNROLL
        for (int k = 0; k < ATTN_MAX_DIM / 8; k++) acc[k] *= a;
        const float* pr = s_s + ro * bk;
        for (int j = 0; j < cnt; j++) {
            const float p = pr[j];
            const float* vr = kv_s + j * ld + dl;
            ATTN_UNROLL
            for (int k = 0; k < ATTN_MAX_DIM / 8; k++) {
                if (dl + 8 * k < head_dim) acc[k] = fmaf(p, vr[8 * k], acc[k]);
            }
        }
        __syncthreads();
    }
    if (ro < rows) {
        const float inv = 1.0f / l_s[ro];
        float* dst = out + ((fn_size)(q0 + ro) * heads + h) * head_dim;
        ATTN_UNROLL
        for (int k = 0; k < ATTN_MAX_DIM / 8; k++) {
            const int d = dl + 8 * k;
            if (d < head_dim) dst[d] = acc[k] * inv;
        }
    }
}

// Prefill on an f32 cache: grid (ceil(t / ATTN_PF_ROWS), heads), ATTN_PF_THREADS threads,
// (ATTN_PF_ROWS + bk)·(head_dim + 1)·4 + ATTN_PF_ROWS·bk·4 bytes of dynamic shared memory.
// q/out [t, heads, head_dim]; query row i at position pos0 + i.
extern "C" __global__ void attn_prefill_f32(const float* __restrict__ q, const float* __restrict__ kc,
                                            const float* __restrict__ vc, float* __restrict__ out, int t, int pos0,
                                            int heads, int kv_heads, int head_dim, int bk, float scale) {
    FN_DYNAMIC_SHARED(float, sh);
    attn_prefill_core(sh, q, kc, vc, out, t, pos0, heads, kv_heads, head_dim, bk, scale);
}

// The same on an f16 cache.
extern "C" __global__ void attn_prefill_f16(const float* __restrict__ q, const fn_u16* __restrict__ kc,
                                            const fn_u16* __restrict__ vc, float* __restrict__ out, int t, int pos0,
                                            int heads, int kv_heads, int head_dim, int bk, float scale) {
    FN_DYNAMIC_SHARED(float, sh);
    attn_prefill_core(sh, q, kc, vc, out, t, pos0, heads, kv_heads, head_dim, bk, scale);
}

// The same on a Q8_0 cache (kc/vc the blocks' bytes).
extern "C" __global__ void attn_prefill_q8_0(const float* __restrict__ q, const fn_u8* __restrict__ kc,
                                             const fn_u8* __restrict__ vc, float* __restrict__ out, int t, int pos0,
                                             int heads, int kv_heads, int head_dim, int bk, float scale) {
    FN_DYNAMIC_SHARED(float, sh);
    attn_prefill_core(sh, q, reinterpret_cast<const attn_q8_0*>(kc), reinterpret_cast<const attn_q8_0*>(vc), out, t,
                      pos0, heads, kv_heads, head_dim, bk, scale);
}

// The same on a Q4_0 cache.
extern "C" __global__ void attn_prefill_q4_0(const float* __restrict__ q, const fn_u8* __restrict__ kc,
                                             const fn_u8* __restrict__ vc, float* __restrict__ out, int t, int pos0,
                                             int heads, int kv_heads, int head_dim, int bk, float scale) {
    FN_DYNAMIC_SHARED(float, sh);
    attn_prefill_core(sh, q, reinterpret_cast<const attn_q4_0*>(kc), reinterpret_cast<const attn_q4_0*>(vc), out, t,
                      pos0, heads, kv_heads, head_dim, bk, scale);
}
