// What every FrogNano kernel shares (docs/gpu.md §2). The kernels are CUDA C++ in a subset that
// compiles three ways: NVRTC at run time (the GPU path), nvcc --ptx (CI's syntax check), and
// the host C++ compiler with sim/sim.h (the CPU simulator the tests run them on). So: no CUDA
// headers (f16 conversions are PTX instructions on the device, bit arithmetic here), dynamic
// shared memory through FN_DYNAMIC_SHARED, every kernel `extern "C"` so it has a plain name.
// No <stdint.h> either (NVRTC compiles without the C headers: tests/nvrtc.rs holds that), so
// the fixed-width types are ours, and offsets are `fn_size` (64 bits on every side).
#pragma once

typedef unsigned long long fn_u64;
typedef unsigned long long fn_size;
typedef unsigned int fn_u32;
typedef unsigned short fn_u16;
typedef unsigned char fn_u8;
typedef signed char fn_i8;

#if defined(__CUDACC__)
#define FN_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
__device__ __forceinline__ float fn_h2f(fn_u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ fn_u16 fn_f2h(float f) {
    fn_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#else
#include "sim.h"
#define FN_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(fnsim::dynamic_shared())
// IEEE half to float, exactly.
static inline float fn_h2f(fn_u16 h) {
    unsigned sign = (unsigned)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
    if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        float f = (float)man * (1.0f / 16777216.0f);  // man · 2^-24
        return sign ? -f : f;
    }
    return __uint_as_float(sign | ((exp + 112) << 23) | (man << 13));
}
// Float to IEEE half, round to nearest even (as cvt.rn.f16.f32).
static inline fn_u16 fn_f2h(float f) {
    unsigned x = __float_as_uint(f), sign = (x >> 16) & 0x8000;
    unsigned ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (fn_u16)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (fn_u16)(sign | 0x7c00);  // rounds to infinity
    if (ax < 0x38800000u) {                                // subnormal half (or zero)
        float a = __uint_as_float(ax);
        float scaled = a * 16777216.0f;  // in units of 2^-24, exact
        float r = std::nearbyint(scaled);
        return (fn_u16)(sign | (unsigned)r);
    }
    unsigned exp = (ax >> 23) - 112, man = ax & 0x7fffff;
    unsigned h = (exp << 10) | (man >> 13), rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (fn_u16)(sign | h);
}
#endif

__device__ __forceinline__ float fn_bf2f(fn_u16 b) { return __uint_as_float(((fn_u32)b) << 16); }
__device__ __forceinline__ float fn_silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float fn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Sum over the 32 lanes of a warp (every lane gets it).
__device__ __forceinline__ float fn_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float fn_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets
// it. `scratch` is 32 floats of shared memory; the call is a barrier.
__device__ __forceinline__ float fn_block_sum(float v, float* scratch) {
    unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = fn_warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < warps ? scratch[lane] : 0.0f;
    return fn_warp_sum(t);
}
__device__ __forceinline__ float fn_block_max(float v, float* scratch) {
    unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = fn_warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < warps ? scratch[lane] : -3.402823466e38f;
    return fn_warp_max(t);
}
