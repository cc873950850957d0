// The CUDA-on-CPU simulator's view of the CUDA language (docs/gpu.md §3).
//
// The kernels in ../kernels are CUDA C++ written to a small common subset. Compiled by NVRTC
// they run on the GPU; compiled by the host C++ compiler with this header first they run here,
// one block at a time, every CUDA thread a fiber of its own (sim.cpp): `__syncthreads()` and
// the warp shuffles switch fibers, so barriers, shared memory and warp reductions behave as on
// the device. What it cannot show: timing, coalescing, races between warps that a barrier
// would have hidden on real hardware (it runs the threads of a block in a fixed order).
#pragma once
#include <math.h>

#include <cmath>
#include <cstdint>
#include <cstring>

struct dim3 {
    unsigned x, y, z;
};

namespace fnsim {
extern dim3 thread_idx, block_idx, block_dim, grid_dim;
void sync_threads();
void sync_warp();
// Exchanges one 32-bit value within the warp: each lane offers `v`, and gets lane `src`'s.
uint32_t exchange(uint32_t v, int src);
void* dynamic_shared();
unsigned lane();
}  // namespace fnsim

#define threadIdx (fnsim::thread_idx)
#define blockIdx (fnsim::block_idx)
#define blockDim (fnsim::block_dim)
#define gridDim (fnsim::grid_dim)
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// One block runs at a time, so a function-level static is the block's shared memory.
#define __shared__ static
#define __restrict__ __restrict
#define __syncthreads() fnsim::sync_threads()
#define __syncwarp(...) fnsim::sync_warp()

template <typename T>
static inline T fnsim_shfl(T v, int src) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits = fnsim::exchange(bits, src & 31);
    T out;
    std::memcpy(&out, &bits, 4);
    return out;
}
template <typename T>
static inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
    unsigned l = fnsim::lane();
    return fnsim_shfl(v, (int)((l ^ (unsigned)mask) % (unsigned)width + l / width * width));
}
template <typename T>
static inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
    unsigned l = fnsim::lane();
    return fnsim_shfl(v, (int)(l / width * width + (unsigned)src % width));
}
template <typename T>
static inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
    unsigned l = fnsim::lane();
    unsigned base = l / width * width, off = l - base;
    return fnsim_shfl(v, (int)(off + delta < (unsigned)width ? l + delta : l));
}

static inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
static inline float __int_as_float(int u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline int __float_as_int(float f) {
    int u;
    std::memcpy(&u, &f, 4);
    return u;
}
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
// glibc declares __expf itself; the device intrinsic is exp here.
#define __expf(x) expf(x)
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float fmaf_(float a, float b, float c) { return std::fma(a, b, c); }
static inline float atomicAdd(float* p, float v) {
    float old = *p;
    *p = old + v;
    return old;
}
static inline int atomicAdd(int* p, int v) {
    int old = *p;
    *p = old + v;
    return old;
}
static inline unsigned atomicAdd(unsigned* p, unsigned v) {
    unsigned old = *p;
    *p = old + v;
    return old;
}
static inline float __ldg(const float* p) { return *p; }
