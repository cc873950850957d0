// The Gated DeltaNet mixer of Qwen3.5 (docs/model.md §3.4–3.5), all f32, in the order a layer
// runs them: the causal depthwise conv with SiLU (carrying the conv state), the q/k/v split
// with l2 norms, the gates, the gated delta rule (recurrent for a few tokens, chunked WY form
// for a prefill) and the gated RMSNorm. The math is frognano-model's CPU code
// (kernels/conv.rs, kernels/delta_rule.rs, qwen35.rs `GatedDeltaNet::step`).
#include "common.cuh"

// `#pragma unroll` for nvcc and NVRTC; the host compiler of the simulator has no such pragma.
#if defined(__CUDACC__)
#define DELTA_UNROLL _Pragma("unroll")
#else
#define DELTA_UNROLL
#endif

// Largest conv kernel width the conv keeps in registers.
#define DELTA_CONV_MAXK 8
// Tokens one conv thread walks (≥ DELTA_CONV_MAXK - 1, so only the first token tile reads the
// carried state and may rewrite it).
#define DELTA_CONV_TOKENS 16
// Chunk length of the WY form (delta_rule::CHUNK).
#define DELTA_CHUNK 64
// State columns (value dims) one chunked block owns.
#define DELTA_BV 32
// Largest key dim of the chunked form (its state slice lives in shared memory).
#define DELTA_MAX_DK 128
// Key dims staged through shared memory at a time in the chunked form's K·Kᵀ and Q·Kᵀ.
#define DELTA_KT 16
// Threads of a chunked block (8 warps).
#define DELTA_CHUNK_THREADS 256

// exp of a log decay (≤ 0), flushed to zero below e^-60 (delta_rule::decay_exp).
__device__ __forceinline__ float delta_decay_exp(float x) { return x < -60.0f ? 0.0f : expf(x); }

// Row r of [state ; x] for channel c: the carried state (K-1 rows, oldest first), then x.
__device__ __forceinline__ float delta_conv_ext(const float* state, const float* x, int r, int c, int channels,
                                                int k) {
    return r < k - 1 ? state[(fn_size)r * channels + c] : x[(fn_size)(r - (k - 1)) * channels + c];
}

// y[i, c] = silu(Σ_j w[c, j] · ext[i + j, c]) with ext = [state ; x] ([K-1 + t, C]); then the
// state becomes ext's last K-1 rows. One thread per channel and DELTA_CONV_TOKENS tokens:
// grid (ceil(C / blockDim.x), ceil(t / DELTA_CONV_TOKENS)); the taps and the sliding window
// stay in registers, and neighbouring threads read neighbouring channels (coalesced). Only
// the blocks of the first token tile read the old state, and each of their threads rewrites
// its own channel's state after reading it, so the update needs no second pass.
extern "C" __global__ void delta_conv1d_silu(const float* __restrict__ x, float* __restrict__ state,
                                             const float* __restrict__ w, float* __restrict__ y, int t,
                                             int channels, int k) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    const int t0 = blockIdx.y * DELTA_CONV_TOKENS;
    const int t1 = t0 + DELTA_CONV_TOKENS < t ? t0 + DELTA_CONV_TOKENS : t;
    float wr[DELTA_CONV_MAXK], win[DELTA_CONV_MAXK];
    DELTA_UNROLL
    for (int j = 0; j < DELTA_CONV_MAXK; j++) wr[j] = j < k ? w[(fn_size)c * k + j] : 0.0f;
    const float wlast = w[(fn_size)c * k + k - 1];
    win[DELTA_CONV_MAXK - 1] = 0.0f;
    // win[j] = ext[i + j] for the taps before the current token (j < K-1).
    DELTA_UNROLL
    for (int j = 0; j < DELTA_CONV_MAXK - 1; j++) win[j] = j < k - 1 ? delta_conv_ext(state, x, t0 + j, c, channels, k) : 0.0f;
    for (int i = t0; i < t1; i++) {
        const float cur = x[(fn_size)i * channels + c];
        float acc = 0.0f;
        DELTA_UNROLL
        for (int j = 0; j < DELTA_CONV_MAXK - 1; j++)
            if (j < k - 1) acc += wr[j] * win[j];
        acc += wlast * cur;
        y[(fn_size)i * channels + c] = fn_silu(acc);
        DELTA_UNROLL
        for (int j = 0; j < DELTA_CONV_MAXK - 1; j++) win[j] = j == k - 2 ? cur : (j < k - 2 ? win[j + 1] : win[j]);
    }
    if (blockIdx.y == 0) {
        float keep[DELTA_CONV_MAXK - 1];
        DELTA_UNROLL
        for (int r = 0; r < DELTA_CONV_MAXK - 1; r++) keep[r] = r < k - 1 ? delta_conv_ext(state, x, t + r, c, channels, k) : 0.0f;
        DELTA_UNROLL
        for (int r = 0; r < DELTA_CONV_MAXK - 1; r++)
            if (r < k - 1) state[(fn_size)r * channels + c] = keep[r];
    }
}

// From the conv output y [t, 2·hk·dk + hv·dv] (q | k | v): q [t, hk, dk] = l2norm(q) · q_scale,
// k [t, hk, dk] = l2norm(k), v [t, hv, dv] copied; l2norm(x) = x / sqrt(Σx² + 1e-6). One warp
// per head vector (2·hk + hv of them a token); grid ceil(t·(2hk+hv) / warps a block).
extern "C" __global__ void delta_split_qkv(const float* __restrict__ y, float* __restrict__ q, float* __restrict__ k,
                                           float* __restrict__ v, int t, int hk, int hv, int dk, int dv,
                                           float q_scale) {
    const int lane = threadIdx.x % 32;
    const int per = 2 * hk + hv;
    const int vec = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (vec >= t * per) return;  // warp-uniform
    const int tok = vec / per, j = vec % per;
    const float* src = y + (fn_size)tok * (2 * hk * dk + hv * dv);
    if (j < 2 * hk) {
        src += (fn_size)j * dk;
        float s = 0.0f;
        for (int d = lane; d < dk; d += 32) s += src[d] * src[d];
        s = fn_warp_sum(s);
        const float inv = 1.0f / sqrtf(s + 1e-6f);
        float* dst = j < hk ? q + ((fn_size)tok * hk + j) * dk : k + ((fn_size)tok * hk + (j - hk)) * dk;
        if (j < hk) {
            for (int d = lane; d < dk; d += 32) dst[d] = src[d] * inv * q_scale;
        } else {
            for (int d = lane; d < dk; d += 32) dst[d] = src[d] * inv;
        }
    } else {
        src += (fn_size)2 * hk * dk + (fn_size)(j - 2 * hk) * dv;
        float* dst = v + ((fn_size)tok * hv + (j - 2 * hk)) * dv;
        for (int d = lane; d < dv; d += 32) dst[d] = src[d];
    }
}

// beta[i] = sigmoid(b[i]); g[i] = neg_a[h] · softplus(a[i] + dt_bias[h]) with h = i % hv over
// [t, hv]; softplus linear above 20 (PyTorch's threshold). One thread an element.
extern "C" __global__ void delta_gates(const float* __restrict__ b, const float* __restrict__ a,
                                       const float* __restrict__ neg_a, const float* __restrict__ dt_bias,
                                       float* __restrict__ beta, float* __restrict__ g, int n, int hv) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int h = i % hv;
    beta[i] = fn_sigmoid(b[i]);
    const float x = a[i] + dt_bias[h];
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    g[i] = neg_a[h] * sp;
}

// The gated delta rule step by step (delta_rule::recurrent), for a few tokens. Block (h, col
// slice): grid (hv, ceil(dv / 32)), dk threads (dk a multiple of 32): lane ↔ state column
// j = 32·blockIdx.y + lane, warp w ↔ key rows [32w, 32w + 32), its 32 state entries in
// registers. Per token: S ← αS; d = β(v − kᵀS); S += k ⊗ d; o = qᵀS — the two reductions over
// the key dim are in-thread sums, then one across warps through shared memory (a barrier each).
extern "C" __global__ void delta_rule_recurrent(const float* __restrict__ q, const float* __restrict__ k,
                                                const float* __restrict__ v, const float* __restrict__ g,
                                                const float* __restrict__ beta, float* __restrict__ state,
                                                float* __restrict__ out, const int* __restrict__ key_head, int t,
                                                int hk, int hv, int dk, int dv) {
    __shared__ float red_k[32][32];
    __shared__ float red_o[32][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int h = blockIdx.x, kh = key_head[h];
    const int j = blockIdx.y * 32 + lane;
    const bool col = j < dv;
    const int a0 = warp * 32;
    float* st = state + (fn_size)h * dk * dv;
    float s[32];
    DELTA_UNROLL
    for (int r = 0; r < 32; r++) s[r] = col ? st[(fn_size)(a0 + r) * dv + j] : 0.0f;
    for (int i = 0; i < t; i++) {
        // Every lane of a warp reads the same key and query entries: broadcast loads.
        const float* kr = k + ((fn_size)i * hk + kh) * dk + a0;
        const float* qr = q + ((fn_size)i * hk + kh) * dk + a0;
        const float alpha = delta_decay_exp(g[(fn_size)i * hv + h]);
        const float b = beta[(fn_size)i * hv + h];
        float part = 0.0f;
        DELTA_UNROLL
        for (int r = 0; r < 32; r++) {
            s[r] *= alpha;
            part += kr[r] * s[r];
        }
        red_k[warp][lane] = part;
        __syncthreads();
        float ks = 0.0f;
        for (int w = 0; w < warps; w++) ks += red_k[w][lane];
        const float vv = col ? v[((fn_size)i * hv + h) * dv + j] : 0.0f;
        const float d = (vv - ks) * b;
        part = 0.0f;
        DELTA_UNROLL
        for (int r = 0; r < 32; r++) {
            s[r] += kr[r] * d;
            part += qr[r] * s[r];
        }
        red_o[warp][lane] = part;
        __syncthreads();
        if (warp == 0 && col) {
            float o = 0.0f;
            for (int w = 0; w < warps; w++) o += red_o[w][lane];
            out[((fn_size)i * hv + h) * dv + j] = o;
        }
    }
    DELTA_UNROLL
    for (int r = 0; r < 32; r++)
        if (col) st[(fn_size)(a0 + r) * dv + j] = s[r];
}

// Copies K[n0 + i, a0 .. a0 + DELTA_KT) of key head kh into tile[i][·] for the chunk's c rows
// (zeros below), DELTA_CHUNK × DELTA_KT values over the block's DELTA_CHUNK_THREADS threads.
__device__ __forceinline__ void delta_stage_k(float (*tile)[DELTA_KT + 1], const float* __restrict__ k, int n0,
                                              int c, int hk, int kh, int dk, int a0) {
    DELTA_UNROLL
    for (int e = 0; e < DELTA_CHUNK * DELTA_KT / DELTA_CHUNK_THREADS; e++) {
        const int idx = threadIdx.x + e * DELTA_CHUNK_THREADS;
        const int i = idx / DELTA_KT, aa = idx % DELTA_KT;
        tile[i][aa] = i < c ? k[((fn_size)(n0 + i) * hk + kh) * dk + a0 + aa] : 0.0f;
    }
}

// The gated delta rule in the chunked WY form (delta_rule::chunked), chunk 64. The columns of
// the state evolve independently, so block (h, col slice) owns value head h's state columns
// [32·blockIdx.y, +32) in shared memory and walks the chunks in order: grid (hv, ceil(dv/32)),
// DELTA_CHUNK_THREADS threads; dk ≤ 128 and a multiple of 16. Per chunk of c tokens with
// cumulative log decay γ (D[i][j] = exp(γi − γj)):
//   A = strictly_lower(diag(β) K Kᵀ ⊙ D)
//   X = diag(β) (V − diag(exp γ) K S)             (this slice's columns)
//   (I + A) Vnew = X                               (forward substitution)
//   O = diag(exp γ) Q S + lower_incl(Q Kᵀ ⊙ D) Vnew
//   S ← exp(γlast) S + (diag(exp(γlast − γ)) K)ᵀ Vnew
// — delta_rule's U − W·S with U, W solved from the same (I + A), folded into one solve. Lane ↔
// state column throughout; warp w ↔ chunk rows w, w + 8, … (8 of them) or key rows (16). The
// K·Kᵀ / Q·Kᵀ products stage K through shared memory DELTA_KT key dims at a time.
extern "C" __global__ void delta_rule_chunked(const float* __restrict__ q, const float* __restrict__ k,
                                              const float* __restrict__ v, const float* __restrict__ g,
                                              const float* __restrict__ beta, float* __restrict__ state,
                                              float* __restrict__ out, const int* __restrict__ key_head, int t,
                                              int hk, int hv, int dk, int dv) {
    __shared__ float sh_s[DELTA_MAX_DK][DELTA_BV];        // the state slice
    __shared__ float sh_m[DELTA_CHUNK][DELTA_CHUNK];      // A, then Q Kᵀ ⊙ D
    __shared__ float sh_x[DELTA_CHUNK][DELTA_BV];         // X, solved in place into Vnew
    __shared__ float sh_tile[DELTA_CHUNK][DELTA_KT + 1];  // a staged slice of K
    __shared__ float sh_cum[DELTA_CHUNK], sh_ecum[DELTA_CHUNK], sh_beta[DELTA_CHUNK], sh_f[DELTA_CHUNK];
    constexpr int WARPS = DELTA_CHUNK_THREADS / 32;
    constexpr int RPW = DELTA_CHUNK / WARPS;  // chunk rows a warp
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int h = blockIdx.x, kh = key_head[h];
    const int j = blockIdx.y * DELTA_BV + lane;
    const bool col = j < dv;
    float* st = state + (fn_size)h * dk * dv;
    for (int a = warp; a < DELTA_MAX_DK; a += WARPS) sh_s[a][lane] = a < dk && col ? st[(fn_size)a * dv + j] : 0.0f;
    for (int n0 = 0; n0 < t; n0 += DELTA_CHUNK) {
        const int c = t - n0 < DELTA_CHUNK ? t - n0 : DELTA_CHUNK;
        if (threadIdx.x < DELTA_CHUNK) {
            const int i = threadIdx.x;
            sh_beta[i] = i < c ? beta[(fn_size)(n0 + i) * hv + h] : 0.0f;
        }
        if (threadIdx.x == 0) {
            // In order, as the CPU's scan.
            float acc = 0.0f;
            for (int i = 0; i < c; i++) {
                acc += g[(fn_size)(n0 + i) * hv + h];
                sh_cum[i] = acc;
                sh_ecum[i] = delta_decay_exp(acc);
            }
        }
        __syncthreads();
        const float last = sh_cum[c - 1];
        if ((int)threadIdx.x < c) sh_f[threadIdx.x] = delta_decay_exp(last - sh_cum[threadIdx.x]);

        // A = strictly_lower(diag(β) K Kᵀ ⊙ D) with rows warp + 8r, columns lane and lane + 32,
        // and in the same pass over staged K the slice K S (rows warp + 8r, column lane).
        float acc[RPW][2], xs[RPW];
        DELTA_UNROLL
        for (int r = 0; r < RPW; r++) acc[r][0] = acc[r][1] = xs[r] = 0.0f;
        for (int a0 = 0; a0 < dk; a0 += DELTA_KT) {
            delta_stage_k(sh_tile, k, n0, c, hk, kh, dk, a0);
            __syncthreads();
            DELTA_UNROLL
            for (int aa = 0; aa < DELTA_KT; aa++) {
                const float k0 = sh_tile[lane][aa], k1 = sh_tile[lane + 32][aa];
                const float sa = sh_s[a0 + aa][lane];
                DELTA_UNROLL
                for (int r = 0; r < RPW; r++) {
                    const float ki = sh_tile[warp + WARPS * r][aa];
                    acc[r][0] += ki * k0;
                    acc[r][1] += ki * k1;
                    xs[r] += ki * sa;
                }
            }
            __syncthreads();
        }
        DELTA_UNROLL
        for (int r = 0; r < RPW; r++) {
            const int i = warp + WARPS * r;
            DELTA_UNROLL
            for (int s2 = 0; s2 < 2; s2++) {
                const int m = lane + 32 * s2;
                float e = 0.0f;
                if (m < i && i < c) e = sh_beta[i] * acc[r][s2] * delta_decay_exp(sh_cum[i] - sh_cum[m]);
                sh_m[i][m] = e;
            }
            // X = β (v − exp(γ) K S) for this slice's columns.
            if (i < c) {
                const float vv = col ? v[((fn_size)(n0 + i) * hv + h) * dv + j] : 0.0f;
                sh_x[i][lane] = sh_beta[i] * (vv - sh_ecum[i] * xs[r]);
            }
        }

        // (I + A) Vnew = X by forward substitution, lane ↔ column, in blocks of 8 rows: the 8
        // warps subtract the solved rows above a block from its rows (one row a warp), then
        // warp 0 solves the 8 × 8 diagonal block.
        for (int b0 = 0; b0 < c; b0 += WARPS) {
            __syncthreads();
            const int i = b0 + warp;
            if (b0 > 0 && i < c) {
                float e = sh_x[i][lane];
                for (int m = 0; m < b0; m++) e -= sh_m[i][m] * sh_x[m][lane];
                sh_x[i][lane] = e;
            }
            __syncthreads();
            if (warp == 0) {
                const int b1 = b0 + WARPS < c ? b0 + WARPS : c;
                for (int ii = b0 + 1; ii < b1; ii++) {
                    float e = sh_x[ii][lane];
                    for (int m = b0; m < ii; m++) e -= sh_m[ii][m] * sh_x[m][lane];
                    sh_x[ii][lane] = e;
                }
            }
        }
        __syncthreads();

        // M = lower_incl(Q Kᵀ ⊙ D) with Q rows from global (every lane of a warp reads the same
        // entry: broadcasts) and K staged, and in the same pass the slice Q S.
        const float* qrow[RPW];
        DELTA_UNROLL
        for (int r = 0; r < RPW; r++) {
            const int i = warp + WARPS * r;
            qrow[r] = q + (((fn_size)n0 + (i < c ? i : 0)) * hk + kh) * dk;
        }
        DELTA_UNROLL
        for (int r = 0; r < RPW; r++) acc[r][0] = acc[r][1] = xs[r] = 0.0f;
        for (int a0 = 0; a0 < dk; a0 += DELTA_KT) {
            delta_stage_k(sh_tile, k, n0, c, hk, kh, dk, a0);
            __syncthreads();
            DELTA_UNROLL
            for (int aa = 0; aa < DELTA_KT; aa++) {
                const float k0 = sh_tile[lane][aa], k1 = sh_tile[lane + 32][aa];
                const float sa = sh_s[a0 + aa][lane];
                DELTA_UNROLL
                for (int r = 0; r < RPW; r++) {
                    const float qi = qrow[r][a0 + aa];
                    acc[r][0] += qi * k0;
                    acc[r][1] += qi * k1;
                    xs[r] += qi * sa;
                }
            }
            __syncthreads();
        }
        DELTA_UNROLL
        for (int r = 0; r < RPW; r++) {
            const int i = warp + WARPS * r;
            DELTA_UNROLL
            for (int s2 = 0; s2 < 2; s2++) {
                const int m = lane + 32 * s2;
                float e = 0.0f;
                if (m <= i && i < c) e = acc[r][s2] * delta_decay_exp(sh_cum[i] - sh_cum[m]);
                sh_m[i][m] = e;
            }
        }
        __syncthreads();

        // O = exp(γ) Q S + M Vnew.
        DELTA_UNROLL
        for (int r = 0; r < RPW; r++) {
            const int i = warp + WARPS * r;
            if (i < c) {
                float o = xs[r] * sh_ecum[i];
                for (int m = 0; m <= i; m++) o += sh_m[i][m] * sh_x[m][lane];
                if (col) out[((fn_size)(n0 + i) * hv + h) * dv + j] = o;
            }
        }
        __syncthreads();

        // S ← exp(γlast) S + (diag(exp(γlast − γ)) K)ᵀ Vnew: key rows warp + 8r.
        const float el = delta_decay_exp(last);
        constexpr int APW = DELTA_MAX_DK / WARPS;  // key rows a warp
        float sn[APW];
        DELTA_UNROLL
        for (int r = 0; r < APW; r++) sn[r] = sh_s[warp + WARPS * r][lane] * el;
        for (int m = 0; m < c; m++) {
            const float* km = k + ((fn_size)(n0 + m) * hk + kh) * dk;
            const float fx = sh_f[m] * sh_x[m][lane];
            DELTA_UNROLL
            for (int r = 0; r < APW; r++) {
                const int a = warp + WARPS * r;
                if (a < dk) sn[r] += km[a] * fx;
            }
        }
        DELTA_UNROLL
        for (int r = 0; r < APW; r++) sh_s[warp + WARPS * r][lane] = sn[r];
        __syncthreads();
    }
    for (int a = warp; a < dk; a += WARPS)
        if (col) st[(fn_size)a * dv + j] = sh_s[a][lane];
}

// In place over o [rows, dv] with z [rows, dv]: o = (o / sqrt(mean(o²) + eps)) · w · silu(z),
// w [dv]. One warp a row; grid ceil(rows / warps a block).
extern "C" __global__ void delta_gated_rms_norm(float* __restrict__ o, const float* __restrict__ z,
                                                const float* __restrict__ w, int rows, int dv, float eps) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;  // warp-uniform
    float* orow = o + (fn_size)row * dv;
    const float* zrow = z + (fn_size)row * dv;
    float s = 0.0f;
    for (int d = lane; d < dv; d += 32) s += orow[d] * orow[d];
    s = fn_warp_sum(s);
    const float inv = 1.0f / sqrtf(s / (float)dv + eps);
    for (int d = lane; d < dv; d += 32) orow[d] = orow[d] * inv * w[d] * fn_silu(zrow[d]);
}
