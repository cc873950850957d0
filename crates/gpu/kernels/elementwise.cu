// Element-wise steps of the decoder layers (docs/model.md §3): residual adds, SwiGLU, the
// attention output gate, q/gate splitting, biases. One thread an element, grid-stride loops.
#include "common.cuh"

// h[i] += u[i].
extern "C" __global__ void ew_add(float* __restrict__ h, const float* __restrict__ u, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) h[i] += u[i];
}

// g[i] = silu(g[i]) · u[i] (SwiGLU, in place over the gate projection).
extern "C" __global__ void ew_silu_mul(float* __restrict__ g, const float* __restrict__ u, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) g[i] = fn_silu(g[i]) * u[i];
}

// o[i] ·= sigmoid(gate[i]) (Qwen3.5's attention output gate).
extern "C" __global__ void ew_sigmoid_mul(float* __restrict__ o, const float* __restrict__ gate, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) o[i] *= fn_sigmoid(gate[i]);
}

// Rows of 2·dh values [query | gate] (Qwen3.5's q_proj, per head) split into q and gate rows
// of dh: `rows` = tokens · heads.
extern "C" __global__ void ew_split_halves(const float* __restrict__ qg, float* __restrict__ q, float* __restrict__ gate,
                                           int rows, int dh) {
    int n = rows * dh;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        int r = i / dh, c = i - r * dh;
        q[i] = qg[(fn_size)r * 2 * dh + c];
        gate[i] = qg[(fn_size)r * 2 * dh + dh + c];
    }
}

// x[r, c] += b[c] over rows of `width` (Qwen2's q/k/v biases).
extern "C" __global__ void ew_add_bias(float* __restrict__ x, const float* __restrict__ b, int rows, int width) {
    int n = rows * width;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] += b[i % width];
}

// dst[j, :] = src[rows[j], :] for `m` rows of `width` (the rows whose logits are wanted).
extern "C" __global__ void ew_gather_rows(const float* __restrict__ src, const int* __restrict__ rows,
                                          float* __restrict__ dst, int m, int width) {
    int n = m * width;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        int j = i / width, c = i - j * width;
        dst[i] = src[(fn_size)rows[j] * width + c];
    }
}
