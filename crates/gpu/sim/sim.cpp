// The CUDA-on-CPU simulator (docs/gpu.md §3): runs a kernel's grid one block at a time, every
// thread of the block a fiber (started by ucontext, switched by _setjmp/_longjmp) on the
// calling OS thread. A fiber runs until it
// reaches a barrier (`__syncthreads`, `__syncwarp`, a shuffle) or returns; when no fiber can
// run, the scheduler releases every warp whose live threads all wait at a warp barrier, else
// the block barrier once every live thread waits at it, else reports a deadlock (threads of
// one warp or block waiting at different barriers: undefined behaviour on the device too).
#include "sim.h"

#include <setjmp.h>
#include <ucontext.h>

#include <cstdio>
#include <utility>
#include <cstdlib>
#include <string>
#include <vector>

namespace fnsim {
dim3 thread_idx, block_idx, block_dim, grid_dim;

namespace {
enum State { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Fiber {
    ucontext_t ctx;
    // After its first start a fiber is resumed by _longjmp: swapcontext saves and restores the
    // signal mask with a system call at every switch, which made the simulator 10x slower.
    jmp_buf jump;
    bool started = false;
    State state = kRunnable;
    dim3 tid{0, 0, 0};
    std::vector<char> stack;
};

constexpr size_t kStack = 256 * 1024;

std::vector<Fiber> fibers;
ucontext_t scheduler;
jmp_buf scheduler_jump;
size_t current = 0;
void (*kernel_call)(void**) = nullptr;
void** kernel_args = nullptr;
std::vector<unsigned char> shared_bytes;
std::vector<uint32_t> exchange_slots;
bool deadlocked = false;

void yield(State s) {
    fibers[current].state = s;
    if (_setjmp(fibers[current].jump) == 0) _longjmp(scheduler_jump, 1);
}

void entry() {
    kernel_call(kernel_args);
    fibers[current].state = kDone;
    _longjmp(scheduler_jump, 1);
}

// Runs fiber `i` until it yields or ends. Kept out of line so that no variable of the
// scheduler's loop lives across the _setjmp.
__attribute__((noinline)) void resume(unsigned i) {
    current = i;
    thread_idx = fibers[i].tid;
    if (_setjmp(scheduler_jump) != 0) return;
    if (fibers[i].started) {
        _longjmp(fibers[i].jump, 1);
    } else {
        fibers[i].started = true;
        swapcontext(&scheduler, &fibers[i].ctx);
    }
}

// Runs one block; false on a deadlock.
bool run_block(unsigned threads) {
    if (fibers.size() < threads) fibers.resize(threads);
    for (unsigned i = 0; i < threads; i++) {
        Fiber& f = fibers[i];
        if (f.stack.size() != kStack) f.stack.assign(kStack, 0);
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.data();
        f.ctx.uc_stack.ss_size = kStack;
        f.ctx.uc_link = &scheduler;
        makecontext(&f.ctx, entry, 0);
        f.started = false;
        f.state = kRunnable;
        f.tid = dim3{i % block_dim.x, i / block_dim.x % block_dim.y, i / (block_dim.x * block_dim.y)};
    }
    for (;;) {
        bool ran = false;
        for (unsigned i = 0; i < threads; i++) {
            if (fibers[i].state != kRunnable) continue;
            resume(i);
            ran = true;
        }
        if (ran) continue;
        bool all_done = true, released = false;
        for (unsigned w = 0; w * 32 < threads; w++) {
            unsigned lo = w * 32, hi = lo + 32 < threads ? lo + 32 : threads;
            bool waiting = true, any = false;
            for (unsigned i = lo; i < hi; i++) {
                State s = fibers[i].state;
                if (s != kDone) all_done = false;
                if (s == kAtWarpBarrier) any = true;
                else if (s != kDone) waiting = false;
            }
            if (waiting && any) {
                for (unsigned i = lo; i < hi; i++)
                    if (fibers[i].state == kAtWarpBarrier) fibers[i].state = kRunnable;
                released = true;
            }
        }
        if (all_done) return true;
        if (released) continue;
        bool block_wait = true;
        for (unsigned i = 0; i < threads; i++)
            if (fibers[i].state != kDone && fibers[i].state != kAtBlockBarrier) block_wait = false;
        if (!block_wait) return false;
        for (unsigned i = 0; i < threads; i++)
            if (fibers[i].state == kAtBlockBarrier) fibers[i].state = kRunnable;
    }
}
}  // namespace

void sync_threads() { yield(kAtBlockBarrier); }
void sync_warp() { yield(kAtWarpBarrier); }
unsigned lane() { return (unsigned)current % 32; }
uint32_t exchange(uint32_t v, int src) {
    size_t base = current / 32 * 32;
    exchange_slots[current] = v;
    yield(kAtWarpBarrier);
    uint32_t out = exchange_slots[base + (size_t)src];
    yield(kAtWarpBarrier);
    return out;
}
void* dynamic_shared() { return shared_bytes.data(); }

// Calls a kernel `void F(A...)` with its arguments from a `void**` array, as cuLaunchKernel does.
template <auto F>
struct Invoker;
template <typename... A, void (*F)(A...)>
struct Invoker<F> {
    template <size_t... I>
    static void call_with(void** args, std::index_sequence<I...>) {
        F(*static_cast<A*>(args[I])...);
    }
    static void call(void** args) { call_with(args, std::index_sequence_for<A...>{}); }
};
}  // namespace fnsim

// The kernels themselves, compiled for the host.
#include "sim_kernels.inc"

namespace {
struct Entry {
    const char* name;
    void (*call)(void**);
};
#define FNSIM_KERNEL(name) {#name, &fnsim::Invoker<name>::call},
const Entry kEntries[] = {
#include "sim_registry.inc"
};
}  // namespace

// 0: ran; 1: no such kernel; 2: deadlock; 3: a block of more than 1024 threads.
extern "C" int fnsim_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                            unsigned bz, unsigned shared, void** args) {
    using namespace fnsim;
    const Entry* e = nullptr;
    for (const Entry& k : kEntries)
        if (std::string(k.name) == name) e = &k;
    if (!e) return 1;
    unsigned threads = bx * by * bz;
    if (threads == 0 || threads > 1024) return 3;
    kernel_call = e->call;
    kernel_args = args;
    block_dim = dim3{bx, by, bz};
    grid_dim = dim3{gx, gy, gz};
    exchange_slots.assign(threads, 0);
    for (unsigned z = 0; z < gz; z++)
        for (unsigned y = 0; y < gy; y++)
            for (unsigned x = 0; x < gx; x++) {
                block_idx = dim3{x, y, z};
                // Uninitialised shared memory reads as NaN (0xFF bytes), as a bug would on the device.
                shared_bytes.assign(shared, 0xFF);
                if (!run_block(threads)) return 2;
            }
    return 0;
}

// The names of every kernel, newline-separated (for tests that every kernel is registered).
extern "C" const char* fnsim_kernel_names() {
    static std::string names;
    if (names.empty())
        for (const Entry& k : kEntries) names += std::string(k.name) + "\n";
    return names.c_str();
}
