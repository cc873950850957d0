// Row norms (docs/model.md §3.1). Scales arrive as the factor multiplied (`1 + w` for Qwen3.5's
// zero-centred norms, made at load), so one kernel serves every model.
#include "common.cuh"

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) · w. One block of 256 threads a row.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                                    int width, float eps) {
    __shared__ float scratch[32];
    const float* xr = x + (fn_size)blockIdx.x * width;
    float* yr = y + (fn_size)blockIdx.x * width;
    float s = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) s += xr[i] * xr[i];
    s = fn_block_sum(s, scratch);
    float inv = 1.0f / sqrtf(s / (float)width + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
}
