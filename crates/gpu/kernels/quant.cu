// Weight matrices in their stored formats (F32, F16, BF16 and ggml's block formats, laid out
// exactly as in a GGUF file: row-major, each row a whole number of blocks). One templated block
// decoder per format turns 8 consecutive elements of a block into f32; the GEMVs (y = x·Wᵀ for
// up to 8 rows of x, and the batched one for up to 32), the dequantize-to-f16 kernel (the GEMM
// path) and the row gather (embedding lookup) all use it, so they agree on every format. The float operations follow
// frognano-model's `quant::dequantize` (ggml's `dequantize_row_*`).
#include "common.cuh"

// Format tags of the templates below.
#define QUANT_F32 0
#define QUANT_F16 1
#define QUANT_BF16 2
#define QUANT_Q4_0 3
#define QUANT_Q4_1 4
#define QUANT_Q5_0 5
#define QUANT_Q5_1 6
#define QUANT_Q8_0 7
#define QUANT_Q2_K 8
#define QUANT_Q3_K 9
#define QUANT_Q4_K 10
#define QUANT_Q5_K 11
#define QUANT_Q6_K 12
#define QUANT_IQ4_NL 13
#define QUANT_IQ4_XS 14

// Most rows of x one quant_gemv_<type> launch takes (quant_gemv32_<type> takes up to 32).
#define QUANT_GEMV_MAX_N 8

// ggml's kvalues_iq4nl.
__device__ const fn_i8 quant_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                  1,    13,   25,  38,  53,  69,  89,  113};

// Elements and bytes per block. The float formats are read as blocks of 8 elements by the
// block-wise kernels (only when the width is a multiple of 8); the GEMV and gather kernels
// read them element by element instead.
template <int T>
struct quant_traits;
template <>
struct quant_traits<QUANT_F32> {
    enum { QK = 8, BYTES = 32 };
};
template <>
struct quant_traits<QUANT_F16> {
    enum { QK = 8, BYTES = 16 };
};
template <>
struct quant_traits<QUANT_BF16> {
    enum { QK = 8, BYTES = 16 };
};
template <>
struct quant_traits<QUANT_Q4_0> {
    enum { QK = 32, BYTES = 18 };
};
template <>
struct quant_traits<QUANT_Q4_1> {
    enum { QK = 32, BYTES = 20 };
};
template <>
struct quant_traits<QUANT_Q5_0> {
    enum { QK = 32, BYTES = 22 };
};
template <>
struct quant_traits<QUANT_Q5_1> {
    enum { QK = 32, BYTES = 24 };
};
template <>
struct quant_traits<QUANT_Q8_0> {
    enum { QK = 32, BYTES = 34 };
};
template <>
struct quant_traits<QUANT_Q2_K> {
    enum { QK = 256, BYTES = 84 };
};
template <>
struct quant_traits<QUANT_Q3_K> {
    enum { QK = 256, BYTES = 110 };
};
template <>
struct quant_traits<QUANT_Q4_K> {
    enum { QK = 256, BYTES = 144 };
};
template <>
struct quant_traits<QUANT_Q5_K> {
    enum { QK = 256, BYTES = 176 };
};
template <>
struct quant_traits<QUANT_Q6_K> {
    enum { QK = 256, BYTES = 210 };
};
template <>
struct quant_traits<QUANT_IQ4_NL> {
    enum { QK = 32, BYTES = 18 };
};
template <>
struct quant_traits<QUANT_IQ4_XS> {
    enum { QK = 256, BYTES = 136 };
};

// The f16 at byte `off` of a block (every block size and f16 field offset is even, so the read
// is aligned).
__device__ __forceinline__ float quant_half(const fn_u8* b, int off) { return fn_h2f(*(const fn_u16*)(b + off)); }

// One element of a float-format row.
template <int T>
__device__ __forceinline__ float quant_load(const void* row, int k);
template <>
__device__ __forceinline__ float quant_load<QUANT_F32>(const void* row, int k) {
    return ((const float*)row)[k];
}
template <>
__device__ __forceinline__ float quant_load<QUANT_F16>(const void* row, int k) {
    return fn_h2f(((const fn_u16*)row)[k]);
}
template <>
__device__ __forceinline__ float quant_load<QUANT_BF16>(const void* row, int k) {
    return fn_bf2f(((const fn_u16*)row)[k]);
}

// Elements e0 .. e0+7 of block `b` (e0 a multiple of 8) into v.
template <int T>
__device__ __forceinline__ void quant_decode8(const fn_u8* b, int e0, float* v);

template <>
__device__ __forceinline__ void quant_decode8<QUANT_F32>(const fn_u8* b, int e0, float* v) {
    for (int i = 0; i < 8; i++) v[i] = ((const float*)b)[e0 + i];
}
template <>
__device__ __forceinline__ void quant_decode8<QUANT_F16>(const fn_u8* b, int e0, float* v) {
    for (int i = 0; i < 8; i++) v[i] = fn_h2f(((const fn_u16*)b)[e0 + i]);
}
template <>
__device__ __forceinline__ void quant_decode8<QUANT_BF16>(const fn_u8* b, int e0, float* v) {
    for (int i = 0; i < 8; i++) v[i] = fn_bf2f(((const fn_u16*)b)[e0 + i]);
}

// Q4_0: d f16, qs[16]; element j < 16 is the low nibble of qs[j], j ≥ 16 the high nibble of
// qs[j − 16]; value d·(q − 8).
template <>
__device__ __forceinline__ void quant_decode8<QUANT_Q4_0>(const fn_u8* b, int e0, float* v) {
    float d = quant_half(b, 0);
    const fn_u8* qs = b + 2 + (e0 & 15);
    int sh = e0 >= 16 ? 4 : 0;
    for (int i = 0; i < 8; i++) v[i] = (float)(((qs[i] >> sh) & 15) - 8) * d;
}
// Q4_1: d, m f16, qs[16]; value d·q + m.
template <>
__device__ __forceinline__ void quant_decode8<QUANT_Q4_1>(const fn_u8* b, int e0, float* v) {
    float d = quant_half(b, 0), m = quant_half(b, 2);
    const fn_u8* qs = b + 4 + (e0 & 15);
    int sh = e0 >= 16 ? 4 : 0;
    for (int i = 0; i < 8; i++) v[i] = (float)((qs[i] >> sh) & 15) * d + m;
}
// Q5_0: d f16, qh[4] (bit e the fifth bit of element e), qs[16] as Q4_0; value d·(q − 16).
template <>
__device__ __forceinline__ void quant_decode8<QUANT_Q5_0>(const fn_u8* b, int e0, float* v) {
    float d = quant_half(b, 0);
    unsigned qh = b[2 + (e0 >> 3)];  // the byte of qh holding bits e0 .. e0+7
    const fn_u8* qs = b + 6 + (e0 & 15);
    int sh = e0 >= 16 ? 4 : 0;
    for (int i = 0; i < 8; i++) {
        int q = ((qs[i] >> sh) & 15) | (((qh >> i) & 1) << 4);
        v[i] = (float)(q - 16) * d;
    }
}
// Q5_1: d, m f16, qh[4], qs[16]; value d·q + m.
template <>
__device__ __forceinline__ void quant_decode8<QUANT_Q5_1>(const fn_u8* b, int e0, float* v) {
    float d = quant_half(b, 0), m = quant_half(b, 2);
    unsigned qh = b[4 + (e0 >> 3)];
    const fn_u8* qs = b + 8 + (e0 & 15);
    int sh = e0 >= 16 ? 4 : 0;
    for (int i = 0; i < 8; i++) {
        int q = ((qs[i] >> sh) & 15) | (((qh >> i) & 1) << 4);
        v[i] = (float)q * d + m;
    }
}
// Q8_0: d f16, qs[32] int8; value d·q.
template <>
__device__ __forceinline__ void quant_decode8<QUANT_Q8_0>(const fn_u8* b, int e0, float* v) {
    float d = quant_half(b, 0);
    const fn_i8* qs = (const fn_i8*)(b + 2 + e0);
    for (int i = 0; i < 8; i++) v[i] = (float)qs[i] * d;
}
// IQ4_NL: d f16, qs[16] as Q4_0 but indices into kvalues; value d·K[q].
template <>
__device__ __forceinline__ void quant_decode8<QUANT_IQ4_NL>(const fn_u8* b, int e0, float* v) {
    float d = quant_half(b, 0);
    const fn_u8* qs = b + 2 + (e0 & 15);
    int sh = e0 >= 16 ? 4 : 0;
    for (int i = 0; i < 8; i++) v[i] = d * (float)quant_kvalues_iq4nl[(qs[i] >> sh) & 15];
}
// Q2_K: scales[16] (low nibble scale, high nibble minimum, per 16), qs[64], d, dmin f16.
// Element e: half h = e/128, j = e%128/32, l = e%32: (qs[32h + l] >> 2j) & 3;
// value d·s·q − dmin·m.
template <>
__device__ __forceinline__ void quant_decode8<QUANT_Q2_K>(const fn_u8* b, int e0, float* v) {
    float d = quant_half(b, 80), dmin = quant_half(b, 82);
    unsigned s = b[e0 >> 4];
    float dl = d * (float)(s & 15), ml = dmin * (float)(s >> 4);
    int h = e0 >> 7, j = (e0 >> 5) & 3, l = e0 & 31;
    const fn_u8* qs = b + 16 + 32 * h + l;
    for (int i = 0; i < 8; i++) v[i] = dl * (float)((qs[i] >> (2 * j)) & 3) - ml;
}
// Q3_K: hmask[32], qs[64] (low 2 bits as Q2_K), scales[12] (sixteen 6-bit scales, offset 32),
// d f16. The high bit of element e is hmask[l] bit 4h + j, set meaning no −4; value d·s·q.
template <>
__device__ __forceinline__ void quant_decode8<QUANT_Q3_K>(const fn_u8* b, int e0, float* v) {
    float d = quant_half(b, 108);
    const fn_u8* sc = b + 96;
    int g = e0 >> 4;
    int low = g < 8 ? (sc[g] & 15) : (sc[g - 8] >> 4);
    int high = (sc[8 + (g & 3)] >> (2 * (g >> 2))) & 3;
    float dl = d * (float)((low | (high << 4)) - 32);
    int h = e0 >> 7, j = (e0 >> 5) & 3, l = e0 & 31;
    const fn_u8* qs = b + 32 + 32 * h + l;
    const fn_u8* hm = b + l;
    int bit = 4 * h + j;
    for (int i = 0; i < 8; i++) {
        int q = ((qs[i] >> (2 * j)) & 3) - (((hm[i] >> bit) & 1) ? 0 : 4);
        v[i] = dl * (float)q;
    }
}
// The 6-bit scale and minimum of sub-block j (0..8) of a Q4_K/Q5_K scales[12] field.
__device__ __forceinline__ void quant_scale_min_k4(int j, const fn_u8* s, float* sc, float* m) {
    if (j < 4) {
        *sc = (float)(s[j] & 63);
        *m = (float)(s[j + 4] & 63);
    } else {
        *sc = (float)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        *m = (float)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}
// Q4_K: d, dmin f16, scales[12], qs[128]. Element e: chunk c = e/64, l = e%64: qs[32c + l%32],
// low nibble for l < 32; sub-block e/32; value d·s·q − dmin·m.
template <>
__device__ __forceinline__ void quant_decode8<QUANT_Q4_K>(const fn_u8* b, int e0, float* v) {
    float d = quant_half(b, 0), dmin = quant_half(b, 2), sc, m;
    quant_scale_min_k4(e0 >> 5, b + 4, &sc, &m);
    float dl = d * sc, ml = dmin * m;
    int l = e0 & 63;
    // Q4_K blocks are 144 bytes and these 8 bytes start at a multiple of 8 in the block: two
    // aligned 32-bit loads (the buffer is 256-byte aligned, every row a whole number of blocks).
    const fn_u32* qs = (const fn_u32*)(b + 16 + 32 * (e0 >> 6) + (l & 31));
    int sh = l >= 32 ? 4 : 0;
    fn_u32 q0 = qs[0] >> sh, q1 = qs[1] >> sh;
    for (int i = 0; i < 4; i++) v[i] = dl * (float)((q0 >> (8 * i)) & 15) - ml;
    for (int i = 0; i < 4; i++) v[4 + i] = dl * (float)((q1 >> (8 * i)) & 15) - ml;
}
// Q5_K: as Q4_K with qh[32] before qs: the fifth bit of element e is qh[e%32] bit e/32.
template <>
__device__ __forceinline__ void quant_decode8<QUANT_Q5_K>(const fn_u8* b, int e0, float* v) {
    float d = quant_half(b, 0), dmin = quant_half(b, 2), sc, m;
    quant_scale_min_k4(e0 >> 5, b + 4, &sc, &m);
    float dl = d * sc, ml = dmin * m;
    int l = e0 & 63, bit = e0 >> 5;
    // 176-byte blocks; qh and qs reads start at multiples of 8 in the block (as Q4_K's).
    const fn_u32* qh = (const fn_u32*)(b + 16 + (e0 & 31));
    const fn_u32* qs = (const fn_u32*)(b + 48 + 32 * (e0 >> 6) + (l & 31));
    int sh = l >= 32 ? 4 : 0;
    for (int h = 0; h < 2; h++) {
        fn_u32 q = qs[h] >> sh, hb = qh[h] >> bit;
        for (int i = 0; i < 4; i++)
            v[4 * h + i] = dl * (float)(((q >> (8 * i)) & 15) | (((hb >> (8 * i)) & 1) << 4)) - ml;
    }
}
// Q6_K: ql[128], qh[64], scales[16] int8, d f16. Element e: n = e/128, quarter t = e%128/32,
// l = e%32: low 4 bits from ql[64n + 32(t&1) + l] (high nibble for t ≥ 2), high 2 bits
// (qh[32n + l] >> 2t) & 3; value d·s·(q − 32).
template <>
__device__ __forceinline__ void quant_decode8<QUANT_Q6_K>(const fn_u8* b, int e0, float* v) {
    float d = quant_half(b, 208);
    float dl = d * (float)(fn_i8)b[192 + (e0 >> 4)];
    int n = e0 >> 7, t = (e0 >> 5) & 3, l = e0 & 31;
    const fn_u8* ql = b + 64 * n + 32 * (t & 1) + l;
    const fn_u8* qh = b + 128 + 32 * n + l;
    int sh = (t >> 1) * 4;
    for (int i = 0; i < 8; i++) {
        int q = ((ql[i] >> sh) & 15) | (((qh[i] >> (2 * t)) & 3) << 4);
        v[i] = dl * (float)(q - 32);
    }
}
// IQ4_XS: d f16, scales_h u16, scales_l[4], qs[128]. Sub-block sb = e/32 has the 6-bit scale
// (scales_l nibble sb) | (scales_h bits 2sb..2sb+1) << 4, offset 32, and its 32 indices in
// qs[16sb ..] as Q4_0's; value d·s·K[q].
template <>
__device__ __forceinline__ void quant_decode8<QUANT_IQ4_XS>(const fn_u8* b, int e0, float* v) {
    float d = quant_half(b, 0);
    int sb = e0 >> 5;
    unsigned sh_all = *(const fn_u16*)(b + 2);
    int low = (b[4 + (sb >> 1)] >> (4 * (sb & 1))) & 15;
    int high = (sh_all >> (2 * sb)) & 3;
    float dl = d * (float)((low | (high << 4)) - 32);
    int w = e0 & 31;
    const fn_u8* qs = b + 8 + 16 * sb + (w & 15);
    int sh = w >= 16 ? 4 : 0;
    for (int i = 0; i < 8; i++) v[i] = dl * (float)quant_kvalues_iq4nl[(qs[i] >> sh) & 15];
}

// ---- GEMV: y[j, r] = Σ_k x[j, k]·W[r, k] for j < n ≤ 8 (more rows: quant_gemv32 below).
// One warp per output row (blocks of 128 threads, 4 rows a block). The row is cut into chunks of
// 8 elements; lane l takes chunks l, l + 32, …, so a warp's 32 lanes read 256 consecutive
// elements (one k-quant super-block, or 8 small blocks with 4 lanes each) at a time, decode
// them once in registers and use them for all n rows of x.
template <int T>
__device__ __forceinline__ void quant_gemv_blocks(const void* w, const float* __restrict__ x, float* __restrict__ y,
                                                  int rows, int cols, int n) {
    const int QK = quant_traits<T>::QK, BYTES = quant_traits<T>::BYTES;
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;  // the whole warp
    int nb = cols / QK;
    const fn_u8* wr = (const fn_u8*)w + (fn_size)row * nb * BYTES;
    float acc[QUANT_GEMV_MAX_N];
    for (int j = 0; j < QUANT_GEMV_MAX_N; j++) acc[j] = 0.0f;
    int chunks = cols / 8;
    for (int c = lane; c < chunks; c += 32) {
        int blk = c / (QK / 8), e0 = (c % (QK / 8)) * 8;
        float v[8];
        quant_decode8<T>(wr + (fn_size)blk * BYTES, e0, v);
        const float* xc = x + (fn_size)c * 8;
        for (int j = 0; j < QUANT_GEMV_MAX_N; j++) {
            if (j < n) {
                const float* xj = xc + (fn_size)j * cols;
                float s = acc[j];
                for (int i = 0; i < 8; i++) s = fmaf(v[i], xj[i], s);
                acc[j] = s;
            }
        }
    }
    for (int j = 0; j < QUANT_GEMV_MAX_N; j++) {
        if (j < n) {
            float s = fn_warp_sum(acc[j]);
            if (lane == 0) y[(fn_size)j * rows + row] = s;
        }
    }
}

// The float formats at any width: lane l takes elements l, l + 32, … (coalesced).
template <int T>
__device__ __forceinline__ void quant_gemv_floats(const void* w, const float* __restrict__ x, float* __restrict__ y,
                                                  int rows, int cols, int n) {
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;
    const fn_u8* wr = (const fn_u8*)w + (fn_size)row * cols * (T == QUANT_F32 ? 4 : 2);
    float acc[QUANT_GEMV_MAX_N];
    for (int j = 0; j < QUANT_GEMV_MAX_N; j++) acc[j] = 0.0f;
    for (int k = lane; k < cols; k += 32) {
        float wk = quant_load<T>(wr, k);
        for (int j = 0; j < QUANT_GEMV_MAX_N; j++)
            if (j < n) acc[j] = fmaf(wk, x[(fn_size)j * cols + k], acc[j]);
    }
    for (int j = 0; j < QUANT_GEMV_MAX_N; j++) {
        if (j < n) {
            float s = fn_warp_sum(acc[j]);
            if (lane == 0) y[(fn_size)j * rows + row] = s;
        }
    }
}

extern "C" __global__ void quant_gemv_f32(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv_floats<QUANT_F32>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv_f16(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv_floats<QUANT_F16>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv_bf16(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv_floats<QUANT_BF16>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv_q4_0(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv_blocks<QUANT_Q4_0>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv_q4_1(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv_blocks<QUANT_Q4_1>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv_q5_0(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv_blocks<QUANT_Q5_0>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv_q5_1(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv_blocks<QUANT_Q5_1>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv_q8_0(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv_blocks<QUANT_Q8_0>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv_q2_k(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv_blocks<QUANT_Q2_K>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv_q3_k(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv_blocks<QUANT_Q3_K>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv_q4_k(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv_blocks<QUANT_Q4_K>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv_q5_k(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv_blocks<QUANT_Q5_K>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv_q6_k(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv_blocks<QUANT_Q6_K>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv_iq4_nl(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv_blocks<QUANT_IQ4_NL>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv_iq4_xs(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv_blocks<QUANT_IQ4_XS>(w, x, y, rows, cols, n);
}

// ---- Batched GEMV: y[j, r] = Σ_k x[j, k]·W[r, k] for j < n ≤ 32 (DeviceMatrix::matmul takes
// it for 8 < n ≤ 32). Every row of y gets the bits quant_gemv_<type> gives it: each lane sums
// the same chunks of 8 elements (block formats) or the same elements (float formats) in the
// same order with the same fmaf, and the warp reduces with fn_warp_sum, so a row's result does
// not depend on n, nor on which of the two kernels ran. The work is laid out differently:
// blocks of 256 threads (8 warps), each warp owning QUANT_GEMV32_ROWS_PER_WARP rows of W (16
// rows a block); x goes through dynamic shared memory a tile of QUANT_GEMV32_TILE columns at a
// time ([n][256] f32, n KiB, 32 KiB at n = 32), and each lane decodes its 8 weights of each of
// its rows once per tile and uses them for all n rows of x (2·n accumulators a lane).
#define QUANT_GEMV32_MAX_N 32
#define QUANT_GEMV32_TILE 256
#define QUANT_GEMV32_ROWS_PER_WARP 2

// `#pragma unroll` for nvcc and NVRTC (the accumulators must stay in registers); the host
// compiler of the simulator has no such pragma.
#if defined(__CUDACC__)
#define QUANT_UNROLL _Pragma("unroll")
#else
#define QUANT_UNROLL
#endif

// Where element e (< 256) of a tile row of x lives in shared memory for the block formats:
// lane c reads its chunk c = e/8 element by element (i = e%8), so element i of every lane's
// chunk is one 32-float row, permuted by c ^ 4i. Both the reads (lane c, fixed i) and the
// coalesced stores (thread e) then touch 32 different banks.
__device__ __forceinline__ int quant_gemv32_slot(int e) {
    int c = e >> 3, i = e & 7;
    return i * 32 + (c ^ (4 * i));
}

template <int T, bool BLOCKS>
__device__ __forceinline__ void quant_gemv32(const void* w, const float* __restrict__ x, float* __restrict__ y,
                                             int rows, int cols, int n) {
    FN_DYNAMIC_SHARED(float, xs);  // [n][QUANT_GEMV32_TILE]
    const int QK = quant_traits<T>::QK, BYTES = quant_traits<T>::BYTES;
    const int R = QUANT_GEMV32_ROWS_PER_WARP, TILE = QUANT_GEMV32_TILE;
    int lane = threadIdx.x & 31;
    int row0 = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * R;
    bool active = row0 < rows;  // the whole warp; it still takes part in the block's barriers
    fn_size row_bytes = BLOCKS ? (fn_size)(cols / QK) * BYTES : (fn_size)cols * (T == QUANT_F32 ? 4 : 2);
    const fn_u8* wr[R];
    bool valid[R];
    QUANT_UNROLL
    for (int r = 0; r < R; r++) {
        valid[r] = row0 + r < rows;
        wr[r] = (const fn_u8*)w + (fn_size)(valid[r] ? row0 + r : 0) * row_bytes;
    }
    float acc[R][QUANT_GEMV32_MAX_N];
    QUANT_UNROLL
    for (int r = 0; r < R; r++) {
        QUANT_UNROLL
        for (int j = 0; j < QUANT_GEMV32_MAX_N; j++) acc[r][j] = 0.0f;
    }
    for (int k0 = 0; k0 < cols; k0 += TILE) {
        int width = cols - k0 < TILE ? cols - k0 : TILE;
        __syncthreads();  // every warp is done with the previous tile
        for (int idx = threadIdx.x; idx < n * TILE; idx += blockDim.x) {
            int j = idx / TILE, e = idx % TILE;
            float v = e < width ? x[(fn_size)j * cols + k0 + e] : 0.0f;
            xs[j * TILE + (BLOCKS ? quant_gemv32_slot(e) : e)] = v;
        }
        __syncthreads();
        if (!active) continue;
        if constexpr (BLOCKS) {
            // Lane l: chunk l of the tile, i.e. chunk k0/8 + l of the row (as quant_gemv_blocks'
            // c = lane, lane + 32, …).
            if (lane * 8 < width) {
                int c = k0 / 8 + lane;
                int blk = c / (QK / 8), e0 = (c % (QK / 8)) * 8;
                float v[R][8];
                QUANT_UNROLL
                for (int r = 0; r < R; r++) {
                    if (valid[r]) {
                        quant_decode8<T>(wr[r] + (fn_size)blk * BYTES, e0, v[r]);
                    } else {
                        QUANT_UNROLL
                        for (int i = 0; i < 8; i++) v[r][i] = 0.0f;
                    }
                }
                QUANT_UNROLL
                for (int j = 0; j < QUANT_GEMV32_MAX_N; j++) {
                    if (j < n) {
                        const float* xj = xs + j * TILE;
                        QUANT_UNROLL
                        for (int i = 0; i < 8; i++) {
                            float xv = xj[i * 32 + (lane ^ (4 * i))];
                            QUANT_UNROLL
                            for (int r = 0; r < R; r++) acc[r][j] = fmaf(v[r][i], xv, acc[r][j]);
                        }
                    }
                }
            }
        } else {
            // Lane l: elements l, l + 32, … of the tile (as quant_gemv_floats' k = lane, lane + 32, …).
            for (int m = 0; m < TILE / 32; m++) {
                int e = m * 32 + lane;
                if (e < width) {
                    float wk[R];
                    QUANT_UNROLL
                    for (int r = 0; r < R; r++) wk[r] = valid[r] ? quant_load<T>(wr[r], k0 + e) : 0.0f;
                    QUANT_UNROLL
                    for (int j = 0; j < QUANT_GEMV32_MAX_N; j++) {
                        if (j < n) {
                            float xv = xs[j * TILE + e];
                            QUANT_UNROLL
                            for (int r = 0; r < R; r++) acc[r][j] = fmaf(wk[r], xv, acc[r][j]);
                        }
                    }
                }
            }
        }
    }
    if (!active) return;
    QUANT_UNROLL
    for (int r = 0; r < R; r++) {
        QUANT_UNROLL
        for (int j = 0; j < QUANT_GEMV32_MAX_N; j++) {
            if (j < n) {
                float s = fn_warp_sum(acc[r][j]);
                if (lane == 0 && valid[r]) y[(fn_size)j * rows + row0 + r] = s;
            }
        }
    }
}

extern "C" __global__ void quant_gemv32_f32(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv32<QUANT_F32, false>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv32_f16(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv32<QUANT_F16, false>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv32_bf16(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv32<QUANT_BF16, false>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv32_q4_0(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv32<QUANT_Q4_0, true>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv32_q4_1(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv32<QUANT_Q4_1, true>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv32_q5_0(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv32<QUANT_Q5_0, true>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv32_q5_1(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv32<QUANT_Q5_1, true>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv32_q8_0(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv32<QUANT_Q8_0, true>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv32_q2_k(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv32<QUANT_Q2_K, true>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv32_q3_k(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv32<QUANT_Q3_K, true>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv32_q4_k(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv32<QUANT_Q4_K, true>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv32_q5_k(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv32<QUANT_Q5_K, true>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv32_q6_k(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv32<QUANT_Q6_K, true>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv32_iq4_nl(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv32<QUANT_IQ4_NL, true>(w, x, y, rows, cols, n);
}
extern "C" __global__ void quant_gemv32_iq4_xs(const void* w, const float* x, float* y, int rows, int cols, int n) {
    quant_gemv32<QUANT_IQ4_XS, true>(w, x, y, rows, cols, n);
}

// ---- Dequantize to f16: out[r, :] = W[r, :] rounded to f16 (row-major [rows, cols]). One
// thread per chunk of 8 elements, consecutive threads on consecutive chunks (16-byte stores).
template <int T>
__device__ __forceinline__ void quant_dequant_f16(const void* w, fn_u16* __restrict__ out, int rows, int cols) {
    const int QK = quant_traits<T>::QK, BYTES = quant_traits<T>::BYTES;
    fn_size c = (fn_size)blockIdx.x * blockDim.x + threadIdx.x;
    fn_size per_row = (fn_size)cols / 8;
    if (c >= (fn_size)rows * per_row) return;
    fn_size row = c / per_row, rc = c % per_row;
    const fn_u8* blk = (const fn_u8*)w + (row * (cols / QK) + rc / (QK / 8)) * BYTES;
    float v[8];
    quant_decode8<T>(blk, (int)(rc % (QK / 8)) * 8, v);
    fn_u16* o = out + c * 8;
    for (int i = 0; i < 8; i++) o[i] = fn_f2h(v[i]);
}

extern "C" __global__ void quant_dequant_q4_0_f16(const void* w, fn_u16* out, int rows, int cols) {
    quant_dequant_f16<QUANT_Q4_0>(w, out, rows, cols);
}
extern "C" __global__ void quant_dequant_q4_1_f16(const void* w, fn_u16* out, int rows, int cols) {
    quant_dequant_f16<QUANT_Q4_1>(w, out, rows, cols);
}
extern "C" __global__ void quant_dequant_q5_0_f16(const void* w, fn_u16* out, int rows, int cols) {
    quant_dequant_f16<QUANT_Q5_0>(w, out, rows, cols);
}
extern "C" __global__ void quant_dequant_q5_1_f16(const void* w, fn_u16* out, int rows, int cols) {
    quant_dequant_f16<QUANT_Q5_1>(w, out, rows, cols);
}
extern "C" __global__ void quant_dequant_q8_0_f16(const void* w, fn_u16* out, int rows, int cols) {
    quant_dequant_f16<QUANT_Q8_0>(w, out, rows, cols);
}
extern "C" __global__ void quant_dequant_q2_k_f16(const void* w, fn_u16* out, int rows, int cols) {
    quant_dequant_f16<QUANT_Q2_K>(w, out, rows, cols);
}
extern "C" __global__ void quant_dequant_q3_k_f16(const void* w, fn_u16* out, int rows, int cols) {
    quant_dequant_f16<QUANT_Q3_K>(w, out, rows, cols);
}
extern "C" __global__ void quant_dequant_q4_k_f16(const void* w, fn_u16* out, int rows, int cols) {
    quant_dequant_f16<QUANT_Q4_K>(w, out, rows, cols);
}
extern "C" __global__ void quant_dequant_q5_k_f16(const void* w, fn_u16* out, int rows, int cols) {
    quant_dequant_f16<QUANT_Q5_K>(w, out, rows, cols);
}
extern "C" __global__ void quant_dequant_q6_k_f16(const void* w, fn_u16* out, int rows, int cols) {
    quant_dequant_f16<QUANT_Q6_K>(w, out, rows, cols);
}
extern "C" __global__ void quant_dequant_iq4_nl_f16(const void* w, fn_u16* out, int rows, int cols) {
    quant_dequant_f16<QUANT_IQ4_NL>(w, out, rows, cols);
}
extern "C" __global__ void quant_dequant_iq4_xs_f16(const void* w, fn_u16* out, int rows, int cols) {
    quant_dequant_f16<QUANT_IQ4_XS>(w, out, rows, cols);
}

// ---- Gather rows: out[i, :] = W[ids[i], :] as f32. Grid (chunks of the row, n); block-format
// rows one thread per chunk of 8 elements, float rows one thread per element.
template <int T>
__device__ __forceinline__ void quant_gather_blocks(const void* w, const int* __restrict__ ids, float* __restrict__ out,
                                                    int cols) {
    const int QK = quant_traits<T>::QK, BYTES = quant_traits<T>::BYTES;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols / 8) return;
    fn_size row = (fn_size)ids[blockIdx.y];
    const fn_u8* blk = (const fn_u8*)w + (row * (cols / QK) + c / (QK / 8)) * BYTES;
    float v[8];
    quant_decode8<T>(blk, (c % (QK / 8)) * 8, v);
    float* o = out + (fn_size)blockIdx.y * cols + (fn_size)c * 8;
    for (int i = 0; i < 8; i++) o[i] = v[i];
}
template <int T>
__device__ __forceinline__ void quant_gather_floats(const void* w, const int* __restrict__ ids, float* __restrict__ out,
                                                    int cols) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= cols) return;
    fn_size row = (fn_size)ids[blockIdx.y];
    const fn_u8* wr = (const fn_u8*)w + row * cols * (T == QUANT_F32 ? 4 : 2);
    out[(fn_size)blockIdx.y * cols + k] = quant_load<T>(wr, k);
}

extern "C" __global__ void quant_gather_f32(const void* w, const int* ids, float* out, int cols) {
    quant_gather_floats<QUANT_F32>(w, ids, out, cols);
}
extern "C" __global__ void quant_gather_f16(const void* w, const int* ids, float* out, int cols) {
    quant_gather_floats<QUANT_F16>(w, ids, out, cols);
}
extern "C" __global__ void quant_gather_bf16(const void* w, const int* ids, float* out, int cols) {
    quant_gather_floats<QUANT_BF16>(w, ids, out, cols);
}
extern "C" __global__ void quant_gather_q4_0(const void* w, const int* ids, float* out, int cols) {
    quant_gather_blocks<QUANT_Q4_0>(w, ids, out, cols);
}
extern "C" __global__ void quant_gather_q4_1(const void* w, const int* ids, float* out, int cols) {
    quant_gather_blocks<QUANT_Q4_1>(w, ids, out, cols);
}
extern "C" __global__ void quant_gather_q5_0(const void* w, const int* ids, float* out, int cols) {
    quant_gather_blocks<QUANT_Q5_0>(w, ids, out, cols);
}
extern "C" __global__ void quant_gather_q5_1(const void* w, const int* ids, float* out, int cols) {
    quant_gather_blocks<QUANT_Q5_1>(w, ids, out, cols);
}
extern "C" __global__ void quant_gather_q8_0(const void* w, const int* ids, float* out, int cols) {
    quant_gather_blocks<QUANT_Q8_0>(w, ids, out, cols);
}
extern "C" __global__ void quant_gather_q2_k(const void* w, const int* ids, float* out, int cols) {
    quant_gather_blocks<QUANT_Q2_K>(w, ids, out, cols);
}
extern "C" __global__ void quant_gather_q3_k(const void* w, const int* ids, float* out, int cols) {
    quant_gather_blocks<QUANT_Q3_K>(w, ids, out, cols);
}
extern "C" __global__ void quant_gather_q4_k(const void* w, const int* ids, float* out, int cols) {
    quant_gather_blocks<QUANT_Q4_K>(w, ids, out, cols);
}
extern "C" __global__ void quant_gather_q5_k(const void* w, const int* ids, float* out, int cols) {
    quant_gather_blocks<QUANT_Q5_K>(w, ids, out, cols);
}
extern "C" __global__ void quant_gather_q6_k(const void* w, const int* ids, float* out, int cols) {
    quant_gather_blocks<QUANT_Q6_K>(w, ids, out, cols);
}
extern "C" __global__ void quant_gather_iq4_nl(const void* w, const int* ids, float* out, int cols) {
    quant_gather_blocks<QUANT_IQ4_NL>(w, ids, out, cols);
}
extern "C" __global__ void quant_gather_iq4_xs(const void* w, const int* ids, float* out, int cols) {
    quant_gather_blocks<QUANT_IQ4_XS>(w, ids, out, cols);
}

// ---- Activations for the GEMM path: out[i] = x[i] rounded to f16 / bf16 (round to nearest
// even), for `count` elements; one thread per element.
extern "C" __global__ void quant_f32_to_f16(const float* x, fn_u16* out, unsigned count) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) out[i] = fn_f2h(x[i]);
}
extern "C" __global__ void quant_f32_to_bf16(const float* x, fn_u16* out, unsigned count) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) {
        unsigned u = __float_as_uint(x[i]);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            out[i] = (fn_u16)((u >> 16) | 0x40);  // NaN stays a (quiet) NaN
        else
            out[i] = (fn_u16)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
    }
}

// ---- dst[j, r0 + r] = src[j, r] for j < n, r < cols: a GEMM of a chunk of rows of W, written
// into its columns of the full [n, ld] output. One thread per element.
extern "C" __global__ void quant_scatter_cols(const float* src, float* dst, int n, int cols, int ld, int r0) {
    fn_size i = (fn_size)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (fn_size)n * cols) return;
    fn_size j = i / cols, r = i % cols;
    dst[j * ld + r0 + r] = src[i];
}
