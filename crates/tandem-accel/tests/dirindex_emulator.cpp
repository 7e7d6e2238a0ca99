// The directory kernel's own source (src/dirindex/dirindex.cu) compiled for the host, so CI
// can run it without a GPU. CUDA's intrinsics become GCC atomics (DIRINDEX_HOST_EMULATION
// swaps the one inline-PTX load). Two ways to run it: command by command on host threads
// (dirindex_emulator_command: a command's threads are host threads, so concurrent inserts
// really race for slots; the warp writer runs lane by lane), or the persistent serving loop
// itself as one block of 32 host threads polling a ring the Rust side writes
// (dirindex_emulator_serve). Built and driven by tests/dirindex_differential.rs.

#define DIRINDEX_HOST_EMULATION 1
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
// Block-shared memory becomes a static shared by every emulated block. That is harmless for
// the one thing the kernel keeps there, its copy of the current command: every block copies
// the same command, and the next is copied only after every block has finished with this one.
#define __shared__ static

struct Dimension {
    unsigned int x, y, z;
};
static thread_local Dimension threadIdx;
static thread_local Dimension blockIdx;
static Dimension blockDim = {32, 1, 1};
static Dimension gridDim = {1, 1, 1};
#define MAXIMUM_EMULATED_BLOCKS 4u

// __syncthreads for the one emulated block.
struct BlockBarrier {
    std::mutex mutex;
    std::condition_variable changed;
    unsigned int arrived = 0;
    unsigned long long generation = 0;
    void wait() {
        std::unique_lock<std::mutex> lock(mutex);
        const unsigned long long mine = generation;
        if (++arrived == blockDim.x) {
            arrived = 0;
            ++generation;
            changed.notify_all();
        } else {
            changed.wait(lock, [&] { return generation != mine; });
        }
    }
};
static BlockBarrier block_barriers[MAXIMUM_EMULATED_BLOCKS];
static inline void __syncthreads() { block_barriers[blockIdx.x].wait(); }
static inline void __nanosleep(unsigned int) { std::this_thread::yield(); }

static inline unsigned int __ldcg(const unsigned int* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline unsigned long long __ldcg(const unsigned long long* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline unsigned int atomicCAS(unsigned int* p, unsigned int expected, unsigned int desired) {
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expected;
}
static inline unsigned int atomicExch(unsigned int* p, unsigned int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
static inline unsigned int atomicAnd(unsigned int* p, unsigned int v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned int atomicOr(unsigned int* p, unsigned int v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned int atomicMax(unsigned int* p, unsigned int v) {
    unsigned int old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// The warp writer runs lane by lane: each lane's two shuffles (status, then attributes) read
// the values every lane of the warp put in before.
// Lane by lane (command mode), or through the block barrier when the 32 threads of the
// serving loop run for real (serving mode).
static thread_local unsigned long long warp_values[2][32];
static thread_local unsigned int shuffle_calls;
static thread_local bool serving_mode = false;
static unsigned long long shuffle_exchange[MAXIMUM_EMULATED_BLOCKS][32];
static inline unsigned long long __shfl_sync(unsigned int, unsigned long long value, int lane) {
    if (!serving_mode) return warp_values[(shuffle_calls++) & 1][lane];
    // A block is one warp here (blockDim.x == 32), so the block barrier is the warp's.
    shuffle_exchange[blockIdx.x][threadIdx.x] = value;
    __syncthreads();
    const unsigned long long result = shuffle_exchange[blockIdx.x][lane];
    __syncthreads();
    return result;
}
// A warp barrier: in the serving loop block 0's one warp is the whole emulated block; the
// command mode never runs the express path, which is the only caller.
static inline void __syncwarp(unsigned int = 0xFFFFFFFFu) {
    if (serving_mode) __syncthreads();
}
static inline bool __any_sync(unsigned int, bool predicate) {
    if (!serving_mode) return predicate;
    shuffle_exchange[blockIdx.x][threadIdx.x] = predicate ? 1 : 0;
    __syncthreads();
    bool any = false;
    for (unsigned int lane = 0; lane < 32; ++lane) any = any || shuffle_exchange[blockIdx.x][lane] != 0;
    __syncthreads();
    return any;
}
static inline unsigned long long emulated_clock_ns() {
    return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}
struct ulonglong2 {
    unsigned long long x, y;
};
static inline ulonglong2 make_ulonglong2(unsigned long long x, unsigned long long y) { return ulonglong2{x, y}; }

#include "dirindex.cu"

namespace {

struct Emulator {
    std::vector<u32> entry_state, entry_hash, inode_state, inode_flags;
    std::vector<u64> entry_parent, entry_child, entry_name, inode_key, arena;
    std::vector<IndexAttributes> inode_attributes;
    Control control;
    Tables tables;
};

// Answers warp by warp, as serve_query does: 32 lanes answer, then the kernel's own warp
// writer runs for each lane.
void serve_query_as_warps(const Tables& t, const Command& c, u64 thread, u64 threads) {
    for (u64 base = thread * 32; base < c.count; base += threads * 32) {
        u32 status[32];
        const IndexAttributes* attributes[32];
        for (u32 lane = 0; lane < 32; ++lane) {
            const u64 index = base + lane;
            status[lane] = 0;
            attributes[lane] = nullptr;
            if (index >= c.count) continue;
            status[lane] = c.opcode == COMMAND_LOOKUP    ? answer_lookup(t, c, index, &attributes[lane])
                           : c.opcode == COMMAND_RESOLVE ? answer_resolve(t, c, index, &attributes[lane])
                                                         : answer_stat(t, c, index, &attributes[lane]);
            warp_values[0][lane] = status[lane];
            warp_values[1][lane] = (u64)attributes[lane];
        }
        for (u32 lane = 0; lane < 32; ++lane) {
            threadIdx.x = lane;
            shuffle_calls = 0;
            write_answers_of_warp((u8*)c.answers, base, c.count, status[lane], attributes[lane]);
        }
    }
}

// One host thread's share of a command, as one GPU thread's would be.
void serve(const Tables& t, const Command& c, u64 thread, u64 threads) {
    switch (c.opcode) {
        case COMMAND_APPLY: serve_apply(t, c, thread, threads); break;
        case COMMAND_DROP: serve_drop(t, c, thread, threads); break;
        case COMMAND_LIST: serve_list(t, c, thread, threads); break;
        case COMMAND_CREATE: serve_create(t, c, thread, threads); break;
        case COMMAND_SETTLE: serve_settle(t, c, thread, threads); break;
        case COMMAND_LOOKUP:
        case COMMAND_RESOLVE:
        case COMMAND_STAT: serve_query_as_warps(t, c, thread, threads); break;
        default: fail(t, ERROR_BAD_OPCODE); break;
    }
}

}  // namespace

extern "C" void* dirindex_emulator_open(u64 entry_slots, u64 inode_slots, u64 arena_words, u64 root) {
    Emulator* e = new Emulator();
    e->entry_state.assign(entry_slots, 0);
    e->entry_hash.assign(entry_slots, 0);
    e->entry_parent.assign(entry_slots, 0);
    e->entry_child.assign(entry_slots, 0);
    e->entry_name.assign(entry_slots, 0);
    e->inode_state.assign(inode_slots, 0);
    e->inode_flags.assign(inode_slots, 0);
    e->inode_key.assign(inode_slots, 0);
    e->inode_attributes.assign(inode_slots, IndexAttributes{});
    e->arena.assign(arena_words, 0);
    std::memset(&e->control, 0, sizeof(Control));
    Tables& t = e->tables;
    t.entry_state = e->entry_state.data();
    t.entry_hash = e->entry_hash.data();
    t.entry_parent = e->entry_parent.data();
    t.entry_child = e->entry_child.data();
    t.entry_name = e->entry_name.data();
    t.entry_mask = entry_slots - 1;
    t.inode_state = e->inode_state.data();
    t.inode_flags = e->inode_flags.data();
    t.inode_key = e->inode_key.data();
    t.inode_attributes = e->inode_attributes.data();
    t.inode_mask = inode_slots - 1;
    t.arena = e->arena.data();
    t.arena_words = arena_words;
    t.ring = nullptr;
    t.ring_slots = 0;
    t.control = &e->control;
    t.root = root;
    return e;
}

extern "C" void dirindex_emulator_close(void* emulator) { delete (Emulator*)emulator; }

// Serves one command on `threads` host threads; returns the kernel's error code.
extern "C" u32 dirindex_emulator_command(void* emulator, u32 opcode, u32 count, const u8* requests, u64 request_bytes,
                                         u8* answers, u64 answer_bytes, u64 argument0, u64 argument1, u64 argument2,
                                         u32 threads, u64* result0, u64* result1) {
    Emulator* e = (Emulator*)emulator;
    Command c;
    std::memset(&c, 0, sizeof(c));
    c.opcode = opcode;
    c.count = count;
    c.requests = (u64)requests;
    c.request_bytes = request_bytes;
    c.answers = (u64)answers;
    c.answer_bytes = answer_bytes;
    c.argument0 = argument0;
    c.argument1 = argument1;
    c.argument2 = argument2;
    e->control.list_bytes = 0;
    e->control.overflows = 0;
    e->control.error = ERROR_NONE;
    // The command's threads start together (a thread start costs tens of µs, a request about
    // one): so requests really run at once, and creates of one name race for its slot.
    std::atomic<u32> started{0};
    const auto together = [&started, threads] {
        started.fetch_add(1);
        while (started.load() < threads) std::this_thread::yield();
    };
    std::vector<std::thread> workers;
    for (u32 thread = 1; thread < threads; ++thread) {
        workers.emplace_back([e, &c, thread, threads, &together] {
            together();
            serve(e->tables, c, thread, threads);
        });
    }
    together();
    serve(e->tables, c, 0, threads);
    for (auto& worker : workers) worker.join();
    command_results(e->tables, c, result0, result1);
    return e->control.error;
}

// Runs the persistent serving loop (dirindex_serve_kernel) as `blocks` blocks of 32 host
// threads over `ring` (RING_MEMORY_BYTES: the slots and their express areas, written by the
// Rust side's Ring) until the stop command.
// One serving loop per process at a time (the barriers and the grid size are shared).
extern "C" void dirindex_emulator_serve(void* emulator, u8* ring, u64 ring_slots, u32 blocks) {
    Emulator* e = (Emulator*)emulator;
    if (blocks == 0 || blocks > MAXIMUM_EMULATED_BLOCKS) return;
    std::memset(&e->control, 0, sizeof(Control));
    e->tables.ring = (RingSlot*)ring;
    e->tables.ring_slots = ring_slots;
    gridDim.x = blocks;
    std::vector<std::thread> threads;
    for (unsigned int block = 0; block < blocks; ++block) {
        for (unsigned int thread = 0; thread < blockDim.x; ++thread) {
            threads.emplace_back([e, block, thread] {
                serving_mode = true;
                threadIdx = Dimension{thread, 0, 0};
                blockIdx = Dimension{block, 0, 0};
                dirindex_serve_kernel(e->tables);
            });
        }
    }
    for (auto& thread : threads) thread.join();
}

// Commands the serving loop served by block 0 alone, by the whole grid and by warp 0's express
// path (since the last dirindex_emulator_serve began), and the arena words names took.
extern "C" void dirindex_emulator_counts(void* emulator, u64* alone, u64* grid, u64* express, u64* arena_words) {
    Emulator* e = (Emulator*)emulator;
    *arena_words = __atomic_load_n(&e->control.arena_top, __ATOMIC_SEQ_CST);
    *alone = __atomic_load_n(&e->control.alone_commands, __ATOMIC_SEQ_CST);
    *grid = __atomic_load_n(&e->control.grid_commands, __ATOMIC_SEQ_CST);
    *express = __atomic_load_n(&e->control.express_commands, __ATOMIC_SEQ_CST);
}
