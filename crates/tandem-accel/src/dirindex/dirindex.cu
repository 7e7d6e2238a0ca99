// tandemfs directory index on the GPU (issue 9): one persistent kernel per index serves a
// command ring in pinned, mapped host memory. Compiled at run time by NVRTC (no host headers).
// docs/GPUDIR.md describes the tables, the ring protocol and every answer; the host side is
// src/dirindex/gpu.rs, the byte layouts src/dirindex/wire.rs, and the answers must equal the
// CPU twin's (src/dirindex/cpu.rs and resolve_walk in src/dirindex/mod.rs).
//
// Memory ordering. Host-written ring words are read with volatile loads followed by
// __threadfence_system(); answers are written, then every thread that wrote any fences
// system-wide (the others at device scope) before its block reports; whoever completes a
// command (block 0 for a command it served alone, else the last block to finish) writes
// `done` last. Data that other SMs changed in earlier commands (tables, arena, staging) is
// read with ld.global.cg / volatile loads (never through a possibly stale L1), and every
// thread fences after it sees a new command.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;
typedef unsigned char u8;

// Must equal wire.rs.
#define COMMAND_STOP 1u
#define COMMAND_APPLY 2u
#define COMMAND_DROP 3u
#define COMMAND_LOOKUP 4u
#define COMMAND_RESOLVE 5u
#define COMMAND_STAT 6u
#define COMMAND_LIST 7u
#define COMMAND_NOP 8u
#define COMMAND_CREATE 9u
// With COMMAND_EXPRESS: the polling warp times a chain of dependent table loads (twice) and of
// dependent multiplies on both clocks, for the benchmark (see serve_probe).
#define COMMAND_PROBE 10u
// Settles the pending claims of a create batch (argument0: SETTLE_COMMIT or SETTLE_ABORT); its
// requests are create records (docs/GPUDIR.md, "Tentative creates").
#define COMMAND_SETTLE 11u
// argument0 of a create: 0 places entries (full), CREATE_PENDING claims them (pending).
#define CREATE_PENDING 1u
#define SETTLE_COMMIT 1u
#define SETTLE_ABORT 2u
// Flag on a lookup, resolve or stat: the requests are in the slot's express area and block 0's
// warp 0 answers them there (see "the express path" below). Must equal ring.rs.
#define COMMAND_EXPRESS 0x100u
#define EXPRESS_SLOT_BYTES 8192u
#define EXPRESS_REQUEST_BYTES 4096u
#define EXPRESS_REQUEST_WORDS (EXPRESS_REQUEST_BYTES / 8u)
#define EXPRESS_MAXIMUM_REQUESTS 32u
#define EXPRESS_ANSWERS_OFFSET EXPRESS_REQUEST_BYTES

#define UPDATE_INSERT 1u
#define UPDATE_REMOVE 2u
#define UPDATE_SET_ATTRIBUTES 3u
#define UPDATE_REMOVE_INODE 4u
#define UPDATE_MARK_COMPLETE 5u
#define UPDATE_MARK_INCOMPLETE 6u

#define STATUS_FOUND 1u
#define STATUS_NOT_FOUND 2u
#define STATUS_UNKNOWN 3u
#define STATUS_NOT_DIRECTORY 4u
#define STATUS_PERMISSION_DENIED 5u
#define STATUS_NAME_TOO_LONG 6u
#define STATUS_NEEDS_CPU 7u
#define STATUS_CREATED 8u
#define STATUS_EXISTS 9u
// Settle answers: the claim was pending and is settled now; no such claim was pending.
#define STATUS_SETTLED 10u
#define STATUS_NOT_PENDING 11u

// Command errors (`Completion.status`), reported to the host, which fails the index.
#define ERROR_NONE 0u
#define ERROR_BAD_OPCODE 1u
#define ERROR_BAD_REQUEST 2u
// A create waited past its bound for a slot another request of its command was filling.
#define ERROR_STUCK 3u

#define KIND_DIRECTORY 2u
#define KIND_SYMLINK 3u

#define MAXIMUM_NAME_BYTES 255u
#define MAXIMUM_NAME_WORDS 32u
#define MAXIMUM_PATH_BYTES 4096u
#define ANSWER_BYTES 112u
#define ATTRIBUTES_WORDS 13u
#define LIST_RECORD_HEADER_BYTES 16u
#define CREATE_RECORD_BYTES 24u
#define CREATE_ANSWER_BYTES 16u
#define EXPRESS_STAMPS_OFFSET (EXPRESS_ANSWERS_OFFSET + EXPRESS_MAXIMUM_REQUESTS * ANSWER_BYTES)
// The express stamps, words of the area at EXPRESS_STAMPS_OFFSET (must equal ring.rs): seen,
// staged and answered (ns, %globaltimer), walked (the answer function returned), the walk's
// first two directories checked (a resolve's rounds 1 and 2; 0 when not reached), and the SM's
// cycle counter (clock64) at staged and at answered, which with the ns span gives the SM clock.
#define EXPRESS_STAMP_WORDS 8u
#define WALK_STEP_STAMPS 2u
static_assert(EXPRESS_STAMPS_OFFSET + 8 * EXPRESS_STAMP_WORDS <= EXPRESS_SLOT_BYTES, "express stamps fit the area");
static_assert(EXPRESS_STAMPS_OFFSET % 16 == 0 && EXPRESS_SLOT_BYTES % 16 == 0,
              "express stamps are stored 16 bytes at a time");

// Slot states of both hash tables.
#define SLOT_EMPTY 0u
#define SLOT_BUSY 1u
#define SLOT_TOMBSTONE 2u
#define SLOT_FULL 3u
// Entry slots only: a tentative create's claim (fields filled, name in place). Queries and
// creates of other keys pass over it as over a busy slot; a create of its key answers Exists
// (the claim is the first create of that name, as an earlier request of a batch is); an apply
// of its key makes it full (insert) or a tombstone (remove); a settle command makes it full
// with its child's attributes (commit) or a tombstone (abort).
#define SLOT_PENDING 4u
// Inode slot flags.
#define FLAG_ATTRIBUTES 1u
#define FLAG_COMPLETE 2u

// Every probe sequence stops after this many slots (a lookup that reaches it answers Unknown,
// an insert counts an overflow).
#define MAXIMUM_PROBES 1024u

// The attribute record: 104 bytes, the layout of IndexAttributes in mod.rs.
struct IndexAttributes {
    u64 inode, generation, size_bytes, blocks_512;
    i64 atime_ns, mtime_ns, ctime_ns, btime_ns;
    u64 rdev, parent;
    u32 kind, permissions, uid, gid, link_count, reserved;
};
static_assert(sizeof(IndexAttributes) == 104, "IndexAttributes is 104 bytes");

// One ring slot: the host writes the first 128 bytes and `sequence` last; the kernel writes
// the completion (the second 128 bytes) and `done` last. Must equal gpu.rs.
struct Command {
    u64 sequence;
    u32 opcode;
    u32 count;
    u64 requests;
    u64 request_bytes;
    u64 answers;
    u64 answer_bytes;
    u64 argument0;
    u64 argument1;
    u64 argument2;
    u64 host_reserved[7];
};
struct Completion {
    u64 done;
    u32 status;
    u32 zero;
    u64 result0;
    u64 result1;
    u64 device_reserved[12];
};
struct RingSlot {
    Command command;
    Completion completion;
};
static_assert(sizeof(Command) == 128, "Command is 128 bytes");
static_assert(sizeof(RingSlot) == 256, "RingSlot is 256 bytes");
// The express path stores status with its zero word as one word, and both results as 16 bytes:
// the completion is the slot's second half (offset 128), status at 8 and result0 at 16 of it,
// where ring.rs reads them (COMPLETION_OFFSET + 8, + 16, + 24; the status word whole). No
// offsetof assertion: NVRTC has no <cstddef>, and the H100 host's NVRTC (CUDA 13) refuses
// __builtin_offsetof, which NVRTC 13.5 on the VM accepted.

// Device-memory state of the serving grid (zeroed before launch).
struct Control {
    u64 announced;      // sequence of the grid command every block is to serve
    u64 finished;       // blocks that finished the current grid command (reset when announced)
    u64 list_bytes;     // list output cursor of the current command
    u64 overflows;      // overflows of the current command
    u64 arena_top;      // bytes of the name arena in use
    u64 completed;      // sequence of the last command whose completion is written
    u64 alone_commands; // commands block 0 served alone, and commands the grid served (tests)
    u64 grid_commands;
    u64 express_commands; // express commands warp 0 of block 0 served (tests)
    u32 overflowed;     // sticky: some insert found no room; no negative answers any more
    u32 error;          // error of the current command
    Command current;    // the command being served, copied from the ring
};

static_assert(sizeof(Control) <= 512, "Control fits CONTROL_BYTES of gpu.rs");

// Kernel parameter: where everything is. Must equal `TablePointers` in gpu.rs.
struct Tables {
    u32* entry_state;
    u32* entry_hash;
    u64* entry_parent;
    u64* entry_child;
    u64* entry_name;    // arena offset << 8 | length, or a short name's bytes << 8 | length

    u64 entry_mask;     // capacity - 1 (capacity a power of two)
    u32* inode_state;
    u32* inode_flags;
    u64* inode_key;
    IndexAttributes* inode_attributes;
    u64 inode_mask;
    u64* arena;         // names, 8-byte aligned, zero-padded, as words
    u64 arena_words;
    RingSlot* ring;     // device address of the mapped host ring
    u64 ring_slots;
    Control* control;
    u64 root;
};

// ---------------------------------------------------------------- loads and stores

__device__ __forceinline__ u64 load_volatile_u64(const u64* address) { return *(const volatile u64*)address; }
__device__ __forceinline__ u32 load_volatile_u32(const u32* address) { return *(const volatile u32*)address; }
__device__ __forceinline__ void store_volatile_u64(u64* address, u64 value) { *(volatile u64*)address = value; }
__device__ __forceinline__ void store_volatile_u32(u32* address, u32 value) { *(volatile u32*)address = value; }
// Slot states: acquire at GPU scope, so the fields published before a state (fence, then the
// state's exchange) are seen with it, also by threads of the same apply command.
__device__ __forceinline__ u32 load_state(const u32* address) {
#ifdef DIRINDEX_HOST_EMULATION
    return __atomic_load_n(address, __ATOMIC_ACQUIRE);
#else
    u32 value;
    asm volatile("ld.acquire.gpu.b32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
    return value;
#endif
}
// The doorbell: acquire at system scope, so the loads after it (of the command and the express
// area, which the host wrote before the doorbell) see what the host wrote, without a
// system-wide fence.
__device__ __forceinline__ u64 load_acquire_system_u64(const u64* address) {
#ifdef DIRINDEX_HOST_EMULATION
    return __atomic_load_n(address, __ATOMIC_ACQUIRE);
#else
    u64 value;
    asm volatile("ld.acquire.sys.b64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
    return value;
#endif
}
// `done` of an express command: a release store at system scope. The host reads `done` with
// acquire, and everything it then reads (the answers, the status, the stamps) was stored
// before it: by this lane (program order), or by the warp's other lanes before the __syncwarp
// that precedes this store (a barrier orders the participants' memory operations, and a
// release is cumulative: it publishes what happens before it, not only this thread's own
// stores, as thread 0's fence after __syncthreads does in a cooperative grid barrier). Nothing
// after `done` needs ordering against the answers, and no later load of this warp must wait
// for them, so the sequentially consistent system fence (fence.sc.sys, which also orders this
// warp's later loads behind every earlier store) is more than the round trip needs.
__device__ __forceinline__ void store_release_system_u64(u64* address, u64 value) {
#ifdef DIRINDEX_HOST_EMULATION
    __atomic_store_n(address, value, __ATOMIC_RELEASE);
#else
    asm volatile("st.release.sys.u64 [%0], %1;" : : "l"(address), "l"(value) : "memory");
#endif
}
// The GPU's global timer in ns (its resolution varies: 32 ns to 1 µs), for the express stamps.
__device__ __forceinline__ u64 clock_ns() {
#ifdef DIRINDEX_HOST_EMULATION
    return emulated_clock_ns();
#else
    u64 value;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(value));
    return value;
#endif
}
// The SM's cycle counter, for the express stamps: beside %globaltimer it says the SM clock
// during the span (a walk that is slow in ns but short in cycles ran at a low clock).
__device__ __forceinline__ u64 clock_cycles() {
#ifdef DIRINDEX_HOST_EMULATION
    return emulated_clock_ns();
#else
    return (u64)clock64();
#endif
}
// Asks L2 for the line holding `address` without waiting for it (no register is written): the
// walk's record loads come first, the answer writer's loads of the whole record later.
__device__ __forceinline__ void prefetch_l2(const void* address) {
#ifndef DIRINDEX_HOST_EMULATION
    asm volatile("prefetch.global.L2 [%0];" : : "l"(address));
#endif
}
// Table data written by other SMs in earlier commands: cached in L2 only.
__device__ __forceinline__ u64 load_table_u64(const u64* address) { return __ldcg(address); }
__device__ __forceinline__ u32 load_table_u32(const u32* address) { return __ldcg(address); }

__device__ __forceinline__ u64 mix(u64 value) {
    value ^= value >> 30;
    value *= 0xBF58476D1CE4E5B9ull;
    value ^= value >> 27;
    value *= 0x94D049BB133111EBull;
    value ^= value >> 31;
    return value;
}

// Words of a name with the bytes past `length` cleared (padding is never trusted).
__device__ __forceinline__ u64 masked_word(u64 word, u32 index, u32 length) {
    const u32 valid = length - index * 8;
    return valid >= 8 ? word : (word & ((1ull << (8 * valid)) - 1));
}

// The hash of an entry key (parent, name) comes in two parts: the name's own (its words and
// length), which the walk computes as it parses a component, off the chain of its dependent
// loads, and the parent's, mixed in once the parent is known: two mixes after a directory's
// inode arrives, where a chain over the parent first and then the name's words took one mix
// more a word. The tables are the GPU's own (nothing on disk or on the CPU hashes this way).
// The loop is not unrolled: each word's mix waits for the last, so copies would only make the
// code longer (and the one lane of an express command pays for code size).
__device__ u64 name_hash_of(u64 first_word, const u64* words, u32 length) {
    u64 hash = mix(mix(length ^ 0xA4093822299F31D0ull) ^ first_word);
    const u32 count = (length + 7) / 8;
#pragma unroll 1
    for (u32 index = 1; index < count; ++index) hash = mix(hash ^ words[index]);
    return hash;
}

__device__ __forceinline__ u64 entry_hash_from(u64 parent, u64 name_hash) {
    return mix(mix(parent ^ 0x243F6A8885A308D3ull) ^ name_hash);
}

// The hash of (parent, name) for a name of at least one byte (`words` masked).
__device__ u64 entry_hash_of(u64 parent, const u64* words, u32 length) {
    return entry_hash_from(parent, name_hash_of(words[0], words, length));
}

__device__ __forceinline__ u64 inode_hash_of(u64 inode) { return mix(inode ^ 0x13198A2E03707344ull); }

// ---------------------------------------------------------------- inode table

// Slot of `inode` or -1 (read-only commands and apply threads alike).
__device__ long long inode_find(const Tables& t, u64 inode) {
    u64 slot = inode_hash_of(inode) & t.inode_mask;
    for (u32 probe = 0; probe < MAXIMUM_PROBES && probe <= t.inode_mask; ++probe) {
        const u32 state = load_state(&t.inode_state[slot]);
        if (state == SLOT_EMPTY) return -1;
        if (state == SLOT_FULL && load_table_u64(&t.inode_key[slot]) == inode) return (long long)slot;
        slot = (slot + 1) & t.inode_mask;
    }
    return -1;
}

// Finds or claims the slot of `inode`; -1 when there is no room. Within one apply command no
// two threads touch the same inode (the host cuts batches so), so a claim needs only to win
// its slot against claims for other keys.
__device__ long long inode_claim(const Tables& t, u64 inode) {
    u64 slot = inode_hash_of(inode) & t.inode_mask;
    long long reusable = -1;
    for (u32 probe = 0; probe < MAXIMUM_PROBES && probe <= t.inode_mask; ++probe) {
        const u32 state = load_state(&t.inode_state[slot]);
        if (state == SLOT_FULL && load_table_u64(&t.inode_key[slot]) == inode) return (long long)slot;
        if (state == SLOT_TOMBSTONE && reusable < 0) reusable = (long long)slot;
        if (state == SLOT_EMPTY) {
            if (reusable >= 0 && atomicCAS(&t.inode_state[reusable], SLOT_TOMBSTONE, SLOT_BUSY) == SLOT_TOMBSTONE) {
                slot = (u64)reusable;
            } else if (atomicCAS(&t.inode_state[slot], SLOT_EMPTY, SLOT_BUSY) != SLOT_EMPTY) {
                reusable = -1;  // lost both: keep walking the chain
                slot = (slot + 1) & t.inode_mask;
                continue;
            }
            t.inode_key[slot] = inode;
            t.inode_flags[slot] = 0;
            __threadfence();
            atomicExch(&t.inode_state[slot], SLOT_FULL);
            return (long long)slot;
        }
        slot = (slot + 1) & t.inode_mask;
    }
    if (reusable >= 0 && atomicCAS(&t.inode_state[reusable], SLOT_TOMBSTONE, SLOT_BUSY) == SLOT_TOMBSTONE) {
        t.inode_key[reusable] = inode;
        t.inode_flags[reusable] = 0;
        __threadfence();
        atomicExch(&t.inode_state[reusable], SLOT_FULL);
        return reusable;
    }
    return -1;
}

// Clears flags; a slot left with none is a tombstone.
__device__ void inode_clear_flags(const Tables& t, u64 slot, u32 flags) {
    const u32 left = atomicAnd(&t.inode_flags[slot], ~flags) & ~flags;
    if (left == 0) atomicExch(&t.inode_state[slot], SLOT_TOMBSTONE);
}

__device__ __forceinline__ u32 inode_flags_of(const Tables& t, long long slot) {
    return slot < 0 ? 0u : load_volatile_u32(&t.inode_flags[slot]);
}


// ---------------------------------------------------------------- entry table

#define PROBE_HIT 0
#define PROBE_MISS 1
#define PROBE_LIMIT 2

// A name of at most this many bytes lives in its slot's name word (bytes << 8 | length), not in
// the arena: comparing it costs no memory round trip after the probe's own loads (the arena
// word was one more dependent load, on every step of a walk).
#define INLINE_NAME_BYTES 7u
// Arena words of a long name loaded together before they are compared.
#define NAME_WORDS_AT_ONCE 4u

__device__ __forceinline__ bool name_is_inline(u32 length) { return length <= INLINE_NAME_BYTES; }

// Word `index` of the name in slot word `packed` (its length known to be `length`).
__device__ __forceinline__ u64 stored_name_word(const Tables& t, u64 packed, u32 length, u32 index) {
    return name_is_inline(length) ? (packed >> 8) : load_table_u64(&t.arena[(packed >> 8) / 8 + index]);
}

// Whether slot word `packed` names `words` (masked, `length` bytes, at least one; `first` is
// words[0], which a short name is compared by, from a register). A long name's arena words
// are loaded NAME_WORDS_AT_ONCE at a time before any is compared, so a name of up to 32 bytes
// costs one round trip, not one per word.
__device__ bool arena_name_equals(const Tables& t, u64 packed, u64 first_word, const u64* words, u32 length) {
    if ((u32)(packed & 0xFF) != length) return false;
    if (name_is_inline(length)) return (packed >> 8) == first_word;
    const u64* stored = &t.arena[(packed >> 8) / 8];
    const u32 count = (length + 7) / 8;
    for (u32 first = 0; first < count; first += NAME_WORDS_AT_ONCE) {
        u64 loaded[NAME_WORDS_AT_ONCE];
#pragma unroll
        for (u32 index = 0; index < NAME_WORDS_AT_ONCE; ++index) {
            loaded[index] = first + index < count ? load_table_u64(stored + first + index) : 0ull;
        }
        bool same = true;
#pragma unroll
        for (u32 index = 0; index < NAME_WORDS_AT_ONCE; ++index) {
            same = same && (first + index >= count || loaded[index] == words[first + index]);
        }
        if (!same) return false;
    }
    return true;
}

// The slot holding (parent, name), full or pending (*held says which), for an apply.
__device__ int entry_find(const Tables& t, u64 parent, const u64* words, u32 length, u64 hash, u64* found, u32* held) {
    const u32 tag = (u32)(hash >> 32);
    u64 slot = hash & t.entry_mask;
    for (u32 probe = 0; probe < MAXIMUM_PROBES && probe <= t.entry_mask; ++probe) {
        const u32 state = load_state(&t.entry_state[slot]);
        if (state == SLOT_EMPTY) return PROBE_MISS;
        if ((state == SLOT_FULL || state == SLOT_PENDING) && load_table_u32(&t.entry_hash[slot]) == tag &&
            load_table_u64(&t.entry_parent[slot]) == parent &&
            arena_name_equals(t, load_table_u64(&t.entry_name[slot]), words[0], words, length)) {
            *found = slot;
            *held = state;
            return PROBE_HIT;
        }
        slot = (slot + 1) & t.entry_mask;
    }
    return PROBE_LIMIT;
}

// Writes a claimed entry slot and publishes it as `published` (full, or pending for a tentative
// create). false when the arena is full. A short name goes into the slot's name word (`words`
// is masked, so its top byte is zero), a long one into the arena.
__device__ bool entry_fill(const Tables& t, u64 slot, u64 parent, const u64* words, u32 length, u64 hash, u64 child,
                           u32 published) {
    u64 packed = (words[0] << 8) | length;
    if (!name_is_inline(length)) {
        const u32 count = (length + 7) / 8;
        const u64 offset_words = atomicAdd(&t.control->arena_top, (u64)count);
        if (offset_words + count > t.arena_words) {
            atomicExch(&t.entry_state[slot], SLOT_TOMBSTONE);
            return false;
        }
        for (u32 index = 0; index < count; ++index) t.arena[offset_words + index] = words[index];
        packed = ((offset_words * 8) << 8) | length;
    }
    t.entry_hash[slot] = (u32)(hash >> 32);
    t.entry_parent[slot] = parent;
    t.entry_child[slot] = child;
    t.entry_name[slot] = packed;
    __threadfence();
    atomicExch(&t.entry_state[slot], published);
    return true;
}

// Inserts or replaces; false when there is no room (probe bound or arena).
__device__ bool entry_upsert(const Tables& t, u64 parent, const u64* words, u32 length, u64 child) {
    const u64 hash = entry_hash_of(parent, words, length);
    u64 found = 0;
    u32 held = SLOT_FULL;
    const int probe_result = entry_find(t, parent, words, length, hash, &found, &held);
    if (probe_result == PROBE_HIT) {
        t.entry_child[found] = child;
        __threadfence();
        // A pending claim of this key: a create batch whose record was applied (and fed here)
        // before the batch settled its claims. The applied record is the authority: the entry
        // is full now, and the settle finds nothing pending.
        if (held == SLOT_PENDING) atomicExch(&t.entry_state[found], SLOT_FULL);
        return true;
    }
    // Absent (no other thread of this command inserts the same key): claim the first
    // tombstone or empty slot of the chain, walking on past slots other keys win meanwhile.
    u64 slot = hash & t.entry_mask;
    for (u32 probe = 0; probe < MAXIMUM_PROBES && probe <= t.entry_mask; ++probe) {
        const u32 state = load_state(&t.entry_state[slot]);
        if ((state == SLOT_TOMBSTONE || state == SLOT_EMPTY) && atomicCAS(&t.entry_state[slot], state, SLOT_BUSY) == state) {
            return entry_fill(t, slot, parent, words, length, hash, child, SLOT_FULL);
        }
        slot = (slot + 1) & t.entry_mask;
    }
    return false;
}

__device__ void entry_remove(const Tables& t, u64 parent, const u64* words, u32 length) {
    const u64 hash = entry_hash_of(parent, words, length);
    u64 found = 0;
    u32 held = SLOT_FULL;
    // A pending claim of the key goes too (its settle then finds nothing pending).
    if (entry_find(t, parent, words, length, hash, &found, &held) == PROBE_HIT) {
        atomicExch(&t.entry_state[found], SLOT_TOMBSTONE);
    }
}

// ---------------------------------------------------------------- reads of query commands

// A query command never runs beside a command that changes the tables: commands are served
// one at a time, and every change was fenced before its command completed. So a query reads
// all the fields of a slot at once with relaxed L2 loads, instead of the state first (acquire)
// and then each field after the one before: the loads of a probe overlap, which more than
// halves the dependent memory round trips of a lookup and of each step of a walk.

// Slot of `inode` and its flags (0 when absent), or -1.
__device__ long long inode_find_stable(const Tables& t, u64 inode, u32* flags) {
    u64 slot = inode_hash_of(inode) & t.inode_mask;
    for (u32 probe = 0; probe < MAXIMUM_PROBES && probe <= t.inode_mask; ++probe) {
        const u32 state = load_table_u32(&t.inode_state[slot]);
        const u64 key = load_table_u64(&t.inode_key[slot]);
        const u32 slot_flags = load_table_u32(&t.inode_flags[slot]);
        if (state == SLOT_EMPTY) break;
        if (state == SLOT_FULL && key == inode) {
            *flags = slot_flags;
            return (long long)slot;
        }
        slot = (slot + 1) & t.inode_mask;
    }
    *flags = 0;
    return -1;
}

// The attributes of `inode`, or null when the index has none.
__device__ const IndexAttributes* attributes_stable(const Tables& t, u64 inode) {
    u32 flags = 0;
    const long long slot = inode_find_stable(t, inode, &flags);
    return (slot >= 0 && (flags & FLAG_ATTRIBUTES)) ? &t.inode_attributes[slot] : nullptr;
}

// The fields of one entry slot a query compares, loaded together.
struct EntrySlotFields {
    u32 state, tag;
    u64 parent, packed, child;
};

__device__ __forceinline__ EntrySlotFields load_entry_slot(const Tables& t, u64 slot) {
    EntrySlotFields f;
    f.state = load_table_u32(&t.entry_state[slot]);
    f.tag = load_table_u32(&t.entry_hash[slot]);
    f.parent = load_table_u64(&t.entry_parent[slot]);
    f.packed = load_table_u64(&t.entry_name[slot]);
    f.child = load_table_u64(&t.entry_child[slot]);
    return f;
}

#define PROBE_GO_ON 3

// What one probed slot says: PROBE_HIT (*child set), PROBE_MISS, or PROBE_GO_ON to the next.
__device__ __forceinline__ int entry_slot_says(const Tables& t, const EntrySlotFields& f, u32 tag, u64 parent,
                                               u64 first, const u64* words, u32 length, u64* child) {
    if (f.state == SLOT_EMPTY) return PROBE_MISS;
    if (f.state == SLOT_FULL && f.tag == tag && f.parent == parent &&
        arena_name_equals(t, f.packed, first, words, length)) {
        *child = f.child;
        return PROBE_HIT;
    }
    return PROBE_GO_ON;
}

// entry_find for queries from probe number `first_probe` at `slot` on: PROBE_HIT with *child
// set, PROBE_MISS or PROBE_LIMIT.
__device__ int entry_find_stable_from(const Tables& t, u64 parent, u64 first, const u64* words, u32 length, u32 tag,
                                      u64 slot, u32 first_probe, u64* child) {
    for (u32 probe = first_probe; probe < MAXIMUM_PROBES && probe <= t.entry_mask; ++probe) {
        const int says = entry_slot_says(t, load_entry_slot(t, slot), tag, parent, first, words, length, child);
        if (says != PROBE_GO_ON) return says;
        slot = (slot + 1) & t.entry_mask;
    }
    return PROBE_LIMIT;
}

// entry_find for queries: PROBE_HIT with *child set, PROBE_MISS or PROBE_LIMIT.
__device__ int entry_find_stable(const Tables& t, u64 parent, u64 first, const u64* words, u32 length, u64 hash,
                                 u64* child) {
    return entry_find_stable_from(t, parent, first, words, length, (u32)(hash >> 32), hash & t.entry_mask, 0, child);
}

// ---------------------------------------------------------------- answers

#define FULL_WARP 0xFFFFFFFFu
#define ANSWER_CHUNKS 7u  // 16-byte pieces of one answer: (status, attributes word 0), then pairs

// The warp writes the answers of requests first..first+31 (lane L holds request first+L's
// status and attributes) as contiguous 16-byte stores, so each store instruction of the warp
// covers 512 consecutive bytes: over PCIe (answers in mapped host memory) that is a few full
// writes instead of 32 scattered 8-byte ones. Every lane of the warp must call it.
__device__ void write_answers_of_warp(u8* answers, u64 first, u64 count, u32 status, const IndexAttributes* attributes) {
    const u32 lane = threadIdx.x & 31;
    const u64 mine = (u64)attributes;
    // Every load of the lane's 7 pieces is issued before any store: a store waits for its
    // loads, so loads and stores in turn would cost 7 memory round trips instead of one.
    u64 low[ANSWER_CHUNKS], high[ANSWER_CHUNKS];
    u64 target_offset[ANSWER_CHUNKS];
    bool present[ANSWER_CHUNKS];
#pragma unroll
    for (u32 round = 0; round < ANSWER_CHUNKS; ++round) {
        const u32 chunk = lane + 32 * round;
        const u32 owner = chunk / ANSWER_CHUNKS;
        const u32 part = chunk % ANSWER_CHUNKS;
        const u64 owner_status = __shfl_sync(FULL_WARP, (u64)status, owner);
        const u64* words = (const u64*)__shfl_sync(FULL_WARP, mine, owner);
        present[round] = first + owner < count;
        target_offset[round] = (first + owner) * ANSWER_BYTES + 16 * part;
        if (part == 0) {
            low[round] = owner_status;
            high[round] = (present[round] && words) ? load_table_u64(words) : 0ull;
        } else {
            low[round] = (present[round] && words) ? load_table_u64(words + 2 * part - 1) : 0ull;
            high[round] = (present[round] && words) ? load_table_u64(words + 2 * part) : 0ull;
        }
    }
#pragma unroll
    for (u32 round = 0; round < ANSWER_CHUNKS; ++round) {
        if (!present[round]) continue;
        *(ulonglong2*)(answers + target_offset[round]) = make_ulonglong2(low[round], high[round]);
    }
}

// The express path's writer (at most 32 requests, one a lane): lane L stores request L's whole
// answer itself, its record's 13 words loaded together first (one round trip; the walk
// prefetched them into L2) and then 7 stores of 16 bytes (112 is a multiple of 16). No
// shuffles and no lane waits for another: for one request, the warp writer ran all 7 of its
// rounds (28 shuffles, 14 loads and 7 stores under divergence guards) in lanes that mostly had
// nothing to do, and cost 4.6 µs on the H100 host, a quarter of the round trip. For a large
// batch the warp writer stays the better shape (each store instruction 512 consecutive bytes
// of PCIe writes); an express command is at most 32 answers, 3.5 KiB.
__device__ __forceinline__ void write_own_answer(u8* answers, u64 index, u32 status, const IndexAttributes* attributes) {
    u64 words[ATTRIBUTES_WORDS];
    if (attributes) {
        const u64* source = (const u64*)attributes;
#pragma unroll
        for (u32 word = 0; word < ATTRIBUTES_WORDS; ++word) words[word] = load_table_u64(source + word);
    } else {
#pragma unroll
        for (u32 word = 0; word < ATTRIBUTES_WORDS; ++word) words[word] = 0ull;
    }
    ulonglong2* target = (ulonglong2*)(answers + index * ANSWER_BYTES);
    target[0] = make_ulonglong2((u64)status, words[0]);
#pragma unroll
    for (u32 part = 1; part < ANSWER_CHUNKS; ++part) target[part] = make_ulonglong2(words[2 * part - 1], words[2 * part]);
}
static_assert(ANSWER_BYTES == 16 * ANSWER_CHUNKS && ATTRIBUTES_WORDS == 2 * ANSWER_CHUNKS - 1,
              "an answer is 7 pieces of 16 bytes");

__device__ __forceinline__ bool overflowed(const Tables& t) { return load_volatile_u32(&t.control->overflowed) != 0; }

// The lookup rule of the CPU twin (State::lookup_one), for query commands (stable reads).
// *attributes is set when Found.
__device__ u32 lookup_one(const Tables& t, u64 parent, const u64* words, u32 length, const IndexAttributes** attributes) {
    const u64 hash = entry_hash_of(parent, words, length);
    u64 child = 0;
    const int probe_result = entry_find_stable(t, parent, words[0], words, length, hash, &child);
    if (probe_result == PROBE_HIT) {
        *attributes = attributes_stable(t, child);
        return *attributes ? STATUS_FOUND : STATUS_UNKNOWN;
    }
    if (probe_result == PROBE_LIMIT) return STATUS_UNKNOWN;
    u32 parent_flags = 0;
    const long long parent_slot = inode_find_stable(t, parent, &parent_flags);
    if (parent_slot >= 0 && (parent_flags & FLAG_ATTRIBUTES) &&
        load_table_u32(&t.inode_attributes[parent_slot].kind) != KIND_DIRECTORY) {
        return STATUS_NOT_DIRECTORY;
    }
    if ((parent_flags & FLAG_COMPLETE) && !overflowed(t)) return STATUS_NOT_FOUND;
    return STATUS_UNKNOWN;
}

// Reads a name of `length` bytes at byte `offset` of the requests into words (masked).
__device__ bool read_name(const Command& c, u64 offset, u32 length, u64* words) {
    if (length == 0 || length > MAXIMUM_NAME_BYTES || (offset & 7) != 0 || offset + length > c.request_bytes) {
        return false;
    }
    const u64* source = (const u64*)(c.requests + offset);
    const u32 count = (length + 7) / 8;
    for (u32 index = 0; index < count; ++index) words[index] = masked_word(load_volatile_u64(source + index), index, length);
    return true;
}

__device__ void fail(const Tables& t, u32 error) { atomicMax(&t.control->error, error); }

// ---------------------------------------------------------------- commands

// Request `index` of a lookup command: its status, and its attributes when Found.
__device__ u32 answer_lookup(const Tables& t, const Command& c, u64 index, const IndexAttributes** attributes) {
    u64 words[MAXIMUM_NAME_WORDS];
    const u64* record = (const u64*)(c.requests + index * 16);
    const u64 parent = load_volatile_u64(record);
    const u64 packed = load_volatile_u64(record + 1);
    const u64 offset = packed & 0xFFFFFFFFull;
    const u32 length = (u32)(packed >> 32);
    if (!read_name(c, offset, length, words)) {
        fail(t, ERROR_BAD_REQUEST);
        return 0;
    }
    const u32 status = lookup_one(t, parent, words, length, attributes);
    if (status != STATUS_FOUND) *attributes = nullptr;
    return status;
}

__device__ u32 answer_stat(const Tables& t, const Command& c, u64 index, const IndexAttributes** attributes) {
    *attributes = attributes_stable(t, load_volatile_u64((const u64*)c.requests + index));
    return *attributes ? STATUS_FOUND : STATUS_UNKNOWN;
}

// search permission: the rule of may_search in mod.rs, on fields already loaded.
__device__ __forceinline__ bool may_search(u32 owner, u32 group, u32 permissions, u32 uid, u32 gid) {
    if (uid == 0) return true;
    const u32 bit = uid == owner ? 0100u : (gid == group ? 0010u : 0001u);
    return (permissions & bit) != 0;
}

// Where the walk stands: the record of `inode` (null when the index holds no attributes for
// it) and every field a step reads, loaded together with the probe that found it.
struct WalkRecord {
    const IndexAttributes* record;
    u64 parent;
    u32 kind, owner, group, permissions;
    bool complete;
};

// The fields of one inode slot the walk reads, and its record's, loaded together.
struct InodeSlotFields {
    u32 state, flags, kind, owner, group, permissions;
    u64 key, parent;
};

__device__ __forceinline__ InodeSlotFields load_inode_slot(const Tables& t, u64 slot) {
    const IndexAttributes* record = &t.inode_attributes[slot];
    InodeSlotFields f;
    f.state = load_table_u32(&t.inode_state[slot]);
    f.key = load_table_u64(&t.inode_key[slot]);
    f.flags = load_table_u32(&t.inode_flags[slot]);
    f.kind = load_table_u32(&record->kind);
    f.owner = load_table_u32(&record->uid);
    f.group = load_table_u32(&record->gid);
    f.permissions = load_table_u32(&record->permissions);
    f.parent = load_table_u64(&record->parent);
    return f;
}

// The record of `inode` for the walk, from the fields of its home slot `slot` (loaded by the
// caller, who may do other work while they arrive) and of the slots after it as needed. Each
// probe has the slot's state, key and flags and the record's kind, uid, gid, permissions and
// parent at once (the record of a slot that turns out not to be the inode's is read and
// dropped): one dependent round trip when the inode sits in its home slot, where finding the
// slot and then reading the fields took two.
__device__ WalkRecord settle_walk_record(const Tables& t, u64 inode, u64 slot, InodeSlotFields f) {
    WalkRecord found = {nullptr, 0, 0, 0, 0, 0, false};
    for (u32 probe = 0; probe < MAXIMUM_PROBES && probe <= t.inode_mask; ++probe) {
        if (probe != 0) f = load_inode_slot(t, slot);
        if (f.state == SLOT_EMPTY) break;
        if (f.state == SLOT_FULL && f.key == inode) {
            found.complete = (f.flags & FLAG_COMPLETE) != 0;
            if (f.flags & FLAG_ATTRIBUTES) {
                const IndexAttributes* record = &t.inode_attributes[slot];
                // The sectors of the 104-byte record the fields above did not bring: if the
                // walk ends here, the answer writer reads them from L2, not from memory.
                prefetch_l2(record);
                prefetch_l2((const u8*)record + 32);
                prefetch_l2((const u8*)record + 64);
                prefetch_l2((const u8*)record + sizeof(IndexAttributes) - 1);
                found.record = record;
                found.parent = f.parent;
                found.kind = f.kind;
                found.owner = f.owner;
                found.group = f.group;
                found.permissions = f.permissions;
            }
            break;
        }
        slot = (slot + 1) & t.inode_mask;
    }
    return found;
}

// The lookup of the next component, begun early: its home entry slot's fields were loaded
// together with the record of the directory it is looked up in (`begin_step`), so the
// directory's record and the entry's first slot cost one round trip, not two in turn.
struct EntryProbe {
    bool begun;
    u32 tag;
    u64 parent, slot;
    EntrySlotFields home;
};

// A component of the path a walk reads: its first 255 bytes as words (a local-memory array,
// masked), the first of them again in a register (so that a name of up to 8 bytes is told
// from `.` and `..` and compared with a slot's short name without a local-memory load), its
// name hash (name_hash_of, computed as it is parsed; 0 for a name over 255 bytes, which is
// never looked up), and its whole length.
struct Component {
    u64* words;
    u64 first;
    u64 hash;
    u32 length;
};

// Whether a component is looked up in its directory (not `.`, `..` or too long to name).
__device__ __forceinline__ bool looked_up(u64 first, u32 length) {
    if (length > MAXIMUM_NAME_BYTES) return false;
    if (length == 1 && (first & 0xFF) == '.') return false;
    return !(length == 2 && (first & 0xFFFF) == 0x2E2E);
}

// The loads of where the walk stands next, issued, not yet waited for: the home slot of
// `inode` and its record's fields (settle_walk_record decides from them) and, when `name` (the
// component after it; `named` says there is one) is looked up there, that lookup's home entry
// slot. The walk parses the component after that one while they arrive. Nothing is decided
// from the entry's fields before the record's checks: loading them early changes no answer.
struct PendingStep {
    u64 inode, slot;
    InodeSlotFields home;
};

__device__ __forceinline__ PendingStep begin_step(const Tables& t, u64 inode, bool named, const Component& name,
                                                  EntryProbe* probe) {
    probe->begun = named && looked_up(name.first, name.length);
    if (probe->begun) {
        const u64 hash = entry_hash_from(inode, name.hash);
        probe->tag = (u32)(hash >> 32);
        probe->parent = inode;
        probe->slot = hash & t.entry_mask;
        probe->home = load_entry_slot(t, probe->slot);
    }
    PendingStep step;
    step.inode = inode;
    step.slot = inode_hash_of(inode) & t.inode_mask;
    step.home = load_inode_slot(t, step.slot);
    return step;
}

__device__ __forceinline__ WalkRecord settle_step(const Tables& t, const PendingStep& step) {
    return settle_walk_record(t, step.inode, step.slot, step.home);
}

// The lookup of `name` in `parent`: from the home slot begun with it, else from scratch.
__device__ int finish_lookup(const Tables& t, const EntryProbe& probe, u64 parent, const Component& name, u64* child) {
    const u64 first = name.first;
    const u64* words = name.words;
    const u32 length = name.length;
    if (!probe.begun) {
        return entry_find_stable(t, parent, first, words, length, entry_hash_from(parent, name.hash), child);
    }
    const int says = entry_slot_says(t, probe.home, probe.tag, parent, first, words, length, child);
    if (says != PROBE_GO_ON) return says;
    return entry_find_stable_from(t, parent, first, words, length, probe.tag, (probe.slot + 1) & t.entry_mask, 1, child);
}

// Reads a path front to back: its first PATH_HEAD_WORDS words loaded together before the walk
// starts (from mapped host memory each is a PCIe read of about 1 µs, so a path of up to 32
// bytes costs one round trip, not one per word; the express path reads them from shared
// memory), the rest a word at a time as reached.
#define PATH_HEAD_WORDS 4u
struct PathCursor {
    const u64* source;
    u64 head0, head1, head2, head3;
    u32 length, position;
    // Whether the last byte read is '/' (at the end of the walk: whether the path ends with one).
    bool slash_last;
    // The last word past the head loaded (index ~0u: none), which the next component's first
    // bytes usually share with the slash that ended the last one.
    u32 word_index;
    u64 word;
};

__device__ __forceinline__ u64 path_word(PathCursor* p, u32 index) {
    if (index < PATH_HEAD_WORDS) {
        return index == 0 ? p->head0 : index == 1 ? p->head1 : index == 2 ? p->head2 : p->head3;
    }
    if (index != p->word_index) {
        p->word = load_volatile_u64(p->source + index);
        p->word_index = index;
    }
    return p->word;
}

#define BYTE_TOPS 0x8080808080808080ull
// The top bit of every byte of `word` that is '/', and no other bit. Exact for each byte (the
// shorter zero-byte test borrows across bytes and can flag a byte after a match).
__device__ __forceinline__ u64 slash_flags(u64 word) {
    const u64 x = word ^ 0x2F2F2F2F2F2F2F2Full;
    const u64 nonzero = ((x & 0x7F7F7F7F7F7F7F7Full) + 0x7F7F7F7F7F7F7F7Full) | x;
    return ~nonzero & BYTE_TOPS;
}
// The low `bytes` (0..8) bytes of a word.
__device__ __forceinline__ u64 low_bytes(u32 bytes) { return bytes >= 8 ? ~0ull : ((1ull << (8 * bytes)) - 1); }
// The byte index of the lowest flag of `flags` (not zero).
__device__ __forceinline__ u32 first_flagged_byte(u64 flags) {
#ifdef DIRINDEX_HOST_EMULATION
    return (u32)__builtin_ctzll(flags) / 8;
#else
    return (u32)(__ffsll((long long)flags) - 1) / 8;
#endif
}
__device__ __forceinline__ u32 smaller(u32 a, u32 b) { return a < b ? a : b; }

// The next non-empty component into `name`: its first 255 bytes into its words (masked: bytes
// past it in its last word are zero), the first word also into `first`, its name hash, its
// whole length; false at the end of the path. The walk calls it between a step's loads and
// their first use, so the parse and the name's hash run while the loads arrive. The path is
// read 8 bytes at a time: the slashes before the component are skipped a word at a time, and
// each pass of the gather takes the component's next 8 bytes (a funnel of the path word at the
// cursor and the one after it) and finds a '/' among them with one word test, so a component
// costs a pass per 8 bytes, not a loop pass (and its branches) per byte, which on the single
// lane of the express walk was most of a round. Each path word is loaded once. Bounded by the
// path's length (every pass moves the cursor or ends).
__device__ bool next_component(PathCursor* p, Component* name) {
    u64* words = name->words;
    const u32 end = p->length;
    u32 at = p->position;
    u64 low = 0;
    for (;;) {
        if (at >= end) {
            if (at != p->position) p->slash_last = true;
            p->position = end;
            return false;
        }
        const u32 offset = at & 7;
        const u32 bytes = smaller(8 - offset, end - at);
        low = path_word(p, at / 8);
        const u64 others = ~slash_flags(low >> (8 * offset)) & BYTE_TOPS & low_bytes(bytes);
        if (others) {
            at += first_flagged_byte(others);
            break;
        }
        at += bytes;
    }
    // `at` is the component's first byte, `low` the path word holding it. While the component
    // goes on, the cursor moves 8 bytes a pass, so its offset in a word stays the same.
    const u32 offset = at & 7;
    u32 index = at / 8;
    u32 count = 0;
    for (;;) {
        const bool high_needed = offset != 0 && (index + 1) * 8 < end;
        const u64 high = high_needed ? path_word(p, index + 1) : 0ull;
        const u64 chunk = offset == 0 ? low : ((low >> (8 * offset)) | (high << (64 - 8 * offset)));
        const u32 chunk_bytes = smaller(8, end - at);
        const u64 slashes = slash_flags(chunk) & low_bytes(chunk_bytes);
        const u32 taken = slashes ? first_flagged_byte(slashes) : chunk_bytes;
        const u64 kept = chunk & low_bytes(smaller(taken, MAXIMUM_NAME_BYTES - count));
        if (count == 0) name->first = kept;
        if (count < MAXIMUM_NAME_BYTES) words[count / 8] = kept;
        count += taken;
        at += taken;
        if (taken < 8 || at >= end) {
            p->slash_last = slashes != 0;
            break;
        }
        ++index;
        low = high_needed ? high : path_word(p, index);
    }
    p->position = at;
    name->length = count;
    name->hash = count <= MAXIMUM_NAME_BYTES ? name_hash_of(name->first, words, count) : 0ull;
    return true;
}

// The walk (resolve_walk in mod.rs, step for step) with one component of look-ahead: when the
// walk reaches a directory, the lookup of the component after it starts with the directory's
// own record (begin_step), so a step of a path waits for about two dependent round trips
// in all (the entry's home slot with the directory's record, then the child's record with the
// next entry's home slot): /dA/fB is three where it was six.
//
// The walk carries `here` from one step to the next instead of looking `current` up again:
// the child's record found by the lookup is the record of the inode the walk goes to, because
// a record is stored under its own inode (apply and create refuse or never make a record whose
// inode is not its key), exactly as the twin keys its map by `attributes.inode`; so the child's
// inode is the entry's child, not a load from the record. A lookup's miss is decided from the
// directory the walk stands in (a directory with attributes): NotFound when it is complete and
// nothing overflowed, else Unknown (lookup_one's rule without probing for the directory again).
//
// `step_ns` (null but on the express path) gets the GPU clock when each of the walk's first
// WALK_STEP_STAMPS directories has passed its checks: its record's loads have arrived then
// (the checks branch on them), so the stamps split the walk into its dependent rounds.
__device__ u32 resolve_one(const Tables& t, const u64* source, u32 length, u32 uid, u32 gid,
                           const IndexAttributes** result, u64* step_ns) {
    if (length > MAXIMUM_PATH_BYTES) return STATUS_NAME_TOO_LONG;
    if (length == 0) return STATUS_NOT_FOUND;
    const u32 path_words = (length + 7) / 8;
    PathCursor path;
    path.source = source;
    path.head0 = load_volatile_u64(source);
    path.head1 = path_words > 1 ? load_volatile_u64(source + 1) : 0ull;
    path.head2 = path_words > 2 ? load_volatile_u64(source + 2) : 0ull;
    path.head3 = path_words > 3 ? load_volatile_u64(source + 3) : 0ull;
    path.length = length;
    path.position = 0;
    path.slash_last = false;
    path.word_index = ~0u;
    path.word = 0;
    // This component, the next one and the one after it; the words of two arrays, swapped as
    // the walk goes (the one after the next is parsed into this one's once it is walked).
    u64 first_words[MAXIMUM_NAME_WORDS], second_words[MAXIMUM_NAME_WORDS];
    Component name = {first_words, 0, 0, 0};
    Component next = {second_words, 0, 0, 0};
    bool more = next_component(&path, &name);
    u64 current = t.root;
    EntryProbe probe;
    PendingStep pending = begin_step(t, current, more, name, &probe);
    // The component after this one, parsed while the root's loads arrive.
    bool more_after = more && next_component(&path, &next);
    WalkRecord here = settle_step(t, pending);
    u32 steps = 0;
    // Each pass walks one component of at least one byte: at most 4096. Each pass parses the
    // component after `next` into this one's words once they are done with (the same calls in
    // the same order as parsing each at the top of its pass): where the pass loads a record,
    // between its loads and their first use, so the parse runs while they arrive instead of on
    // the walk's dependent chain.
    while (more) {
        if (!here.record) return STATUS_NEEDS_CPU;
        if (here.kind != KIND_DIRECTORY) return STATUS_NOT_DIRECTORY;
        if (!may_search(here.owner, here.group, here.permissions, uid, gid)) return STATUS_PERMISSION_DENIED;
        if (name.length > MAXIMUM_NAME_BYTES) return STATUS_NAME_TOO_LONG;
        if (step_ns && steps < WALK_STEP_STAMPS) step_ns[steps++] = clock_ns();
        // Where the pass goes: stays (`.`, or `..` at the root), to the parent (`..`), or to the
        // child the lookup finds. One begin, one parse and one settle below serve both moves, so
        // the walk's code holds one copy of each (a lone lane pays for its code's size too).
        bool moves = true;
        bool looked_up_child = false;
        u64 target = 0;
        if (name.length == 1 && (name.first & 0xFF) == '.') {
            // Stays: the next lookup is begun in the same directory when it is reached.
            moves = false;
        } else if (name.length == 2 && (name.first & 0xFFFF) == 0x2E2E) {
            moves = current != t.root;
            target = here.parent;
        } else {
            const int found = finish_lookup(t, probe, current, name, &target);
            if (found == PROBE_MISS) return (here.complete && !overflowed(t)) ? STATUS_NOT_FOUND : STATUS_NEEDS_CPU;
            if (found != PROBE_HIT) return STATUS_NEEDS_CPU;
            looked_up_child = true;
        }
        if (moves) {
            pending = begin_step(t, target, more_after, next, &probe);
        } else {
            probe.begun = false;
        }
        Component later = {name.words, 0, 0, 0};
        const bool more_later = more_after && next_component(&path, &later);
        if (moves) {
            const WalkRecord reached = settle_step(t, pending);
            if (looked_up_child && (!reached.record || reached.kind == KIND_SYMLINK)) return STATUS_NEEDS_CPU;
            current = target;
            here = reached;
        }
        name = next;
        next = later;
        more = more_after;
        more_after = more_later;
    }
    if (!here.record) return STATUS_NEEDS_CPU;
    if (path.slash_last && here.kind != KIND_DIRECTORY) return STATUS_NOT_DIRECTORY;
    *result = here.record;
    return STATUS_FOUND;
}

// answer_resolve with the walk's step stamps (`step_ns`: null, or WALK_STEP_STAMPS words).
__device__ u32 answer_resolve_stamped(const Tables& t, const Command& c, u64 index, const IndexAttributes** attributes,
                                      u64* step_ns) {
    const u64 packed = load_volatile_u64((const u64*)(c.requests + index * 8));
    const u64 offset = packed & 0xFFFFFFFFull;
    const u32 length = (u32)(packed >> 32);
    if ((offset & 7) != 0 || offset + length > c.request_bytes) {
        fail(t, ERROR_BAD_REQUEST);
        return 0;
    }
    const u32 status =
        resolve_one(t, (const u64*)(c.requests + offset), length, (u32)c.argument0, (u32)c.argument1, attributes, step_ns);
    if (status != STATUS_FOUND) *attributes = nullptr;
    return status;
}

__device__ u32 answer_resolve(const Tables& t, const Command& c, u64 index, const IndexAttributes** attributes) {
    return answer_resolve_stamped(t, c, index, attributes, nullptr);
}

// Query commands go a warp at a time: lane L answers request base+L, then the warp writes
// its 32 answers together. `base` is the same for every lane, so whole warps loop together.
typedef u32 (*AnswerFunction)(const Tables&, const Command&, u64, const IndexAttributes**);

__device__ __forceinline__ void serve_query(const Tables& t, const Command& c, u64 thread, u64 threads, AnswerFunction answer) {
    for (u64 base = thread & ~31ull; base < c.count; base += threads) {
        const u64 index = base + (threadIdx.x & 31);
        u32 status = 0;
        const IndexAttributes* attributes = nullptr;
        if (index < c.count) status = answer(t, c, index, &attributes);
        write_answers_of_warp((u8*)c.answers, base, c.count, status, attributes);
    }
}

__device__ void count_overflow(const Tables& t) {
    atomicAdd(&t.control->overflows, 1ull);
    atomicExch(&t.control->overflowed, 1u);
}

// Update `index` of an apply command.
__device__ void apply_update(const Tables& t, const Command& c, u64 index) {
    u64 words[MAXIMUM_NAME_WORDS];
    {
        const u64* record = (const u64*)(c.requests + index * 32);
        const u64 head = load_volatile_u64(record);
        const u32 code = (u32)head;
        const u32 length = (u32)(head >> 32);
        const u64 key = load_volatile_u64(record + 1);
        const u64 value = load_volatile_u64(record + 2);
        const u64 offset = load_volatile_u64(record + 3);
        if (code == UPDATE_INSERT || code == UPDATE_REMOVE) {
            if (!read_name(c, offset, length, words)) {
                fail(t, ERROR_BAD_REQUEST);
                return;
            }
            if (code == UPDATE_REMOVE) {
                entry_remove(t, key, words, length);
            } else if (!entry_upsert(t, key, words, length, value)) {
                count_overflow(t);
            }
        } else if (code == UPDATE_SET_ATTRIBUTES) {
            if ((offset & 7) != 0 || offset + 104 > c.request_bytes) {
                fail(t, ERROR_BAD_REQUEST);
                return;
            }
            const u64* source = (const u64*)(c.requests + offset);
            // A record is stored under its own inode (the walk relies on it).
            if (load_volatile_u64(source) != key) {
                fail(t, ERROR_BAD_REQUEST);
                return;
            }
            const long long slot = inode_claim(t, key);
            if (slot < 0) {
                count_overflow(t);
                return;
            }
            u64* target = (u64*)&t.inode_attributes[slot];
            for (u32 word = 0; word < ATTRIBUTES_WORDS; ++word) target[word] = load_volatile_u64(source + word);
            __threadfence();
            atomicOr(&t.inode_flags[slot], FLAG_ATTRIBUTES);
        } else if (code == UPDATE_MARK_COMPLETE) {
            const long long slot = inode_claim(t, key);
            if (slot < 0) {
                count_overflow(t);
                return;
            }
            atomicOr(&t.inode_flags[slot], FLAG_COMPLETE);
        } else if (code == UPDATE_REMOVE_INODE || code == UPDATE_MARK_INCOMPLETE) {
            const long long slot = inode_find(t, key);
            if (slot >= 0) inode_clear_flags(t, (u64)slot, code == UPDATE_REMOVE_INODE ? FLAG_ATTRIBUTES : FLAG_COMPLETE);
        } else {
            fail(t, ERROR_BAD_REQUEST);
        }
    }
}

// ---------------------------------------------------------------- creates

#define CLAIM_CLAIMED 0
#define CLAIM_EXISTS 1
#define CLAIM_ABSENT 2
#define CLAIM_LIMIT 3
#define CLAIM_STUCK 4
// Polls of a slot another request of the command is filling (busy) before the create gives
// up and fails the command: a filler needs a few memory round trips, so this is far beyond.
#define MAXIMUM_BUSY_POLLS (1u << 22)

// Finds the entry (parent, name) or, with `claim`, claims the slot it will take, safe against
// any number of threads creating in the same directory, the same name included:
// * slots never become empty again (removes leave tombstones), so an entry sits before the
//   first empty slot of its chain;
// * a create claims only an empty slot, never a tombstone: every thread creating the same key
//   walks the same chain in the same order and reaches the same first empty slot, where one
//   CAS wins; the others look at that slot again, wait while it is busy, and find the key
//   there (CLAIM_EXISTS) or, if the winner gave it up (a tombstone), walk on.
// CLAIM_CLAIMED leaves the slot busy in *result for entry_fill; CLAIM_EXISTS puts the child
// in *result.
__device__ int entry_claim(const Tables& t, u64 parent, const u64* words, u32 length, u64 hash, bool claim,
                           u64* result) {
    const u32 tag = (u32)(hash >> 32);
    u64 slot = hash & t.entry_mask;
    u32 probe = 0;
    u32 busy_polls = 0;
    while (probe < MAXIMUM_PROBES && probe <= t.entry_mask) {
        const u32 state = load_state(&t.entry_state[slot]);
        if (state == SLOT_EMPTY) {
            if (!claim) return CLAIM_ABSENT;
            if (atomicCAS(&t.entry_state[slot], SLOT_EMPTY, SLOT_BUSY) == SLOT_EMPTY) {
                *result = slot;
                return CLAIM_CLAIMED;
            }
            continue;  // taken meanwhile: look at the same slot again
        }
        if (state == SLOT_BUSY) {
            if (++busy_polls > MAXIMUM_BUSY_POLLS) return CLAIM_STUCK;
            __nanosleep(64);
            continue;
        }
        // A pending claim of the key is the first create of the name: Exists, as for a full
        // entry (waiting would never end: its settle is a later command of the same ring).
        if ((state == SLOT_FULL || state == SLOT_PENDING) && load_table_u32(&t.entry_hash[slot]) == tag &&
            load_table_u64(&t.entry_parent[slot]) == parent &&
            arena_name_equals(t, load_table_u64(&t.entry_name[slot]), words[0], words, length)) {
            *result = load_table_u64(&t.entry_child[slot]);
            return CLAIM_EXISTS;
        }
        slot = (slot + 1) & t.entry_mask;
        ++probe;
    }
    return CLAIM_LIMIT;
}

// Reads create record `index` (of a create or a settle command): its parent, its name into
// `words`, and where its attribute record lies. false when the record points outside the
// requests.
__device__ bool read_create_record(const Command& c, u64 index, u64* words, u64* parent, u32* length,
                                   const u64** attributes) {
    const u64* record = (const u64*)(c.requests + index * CREATE_RECORD_BYTES);
    *parent = load_volatile_u64(record);
    const u64 packed = load_volatile_u64(record + 1);
    const u64 attributes_offset = load_volatile_u64(record + 2);
    *length = (u32)(packed >> 32);
    if (!read_name(c, packed & 0xFFFFFFFFull, *length, words) || (attributes_offset & 7) != 0 ||
        attributes_offset + sizeof(IndexAttributes) > c.request_bytes) {
        return false;
    }
    *attributes = (const u64*)(c.requests + attributes_offset);
    return true;
}

// Request `index` of a create command (the create rule of the twin, State::create_one):
// the entry exists → EXISTS; the parent is known and not a directory → NOT_DIRECTORY; the
// parent is complete → the entry's slot claimed, the child's attributes stored (complete if a
// directory: it is empty), then the entry published → CREATED; else UNKNOWN. The host cuts
// batches so that no request of a command creates another's parent or shares its key or its
// new inode; the claim is safe without that all the same (see entry_claim).
// With argument0 CREATE_PENDING (a tentative create) a free name's slot is claimed pending
// instead: the entry's fields are placed, the child's attributes are not (they come with the
// settle's commit), so nothing of the create is visible to any query until it is committed.
__device__ void create_request(const Tables& t, const Command& c, u64 index) {
    u64 words[MAXIMUM_NAME_WORDS];
    const u64* source = nullptr;
    u64 parent = 0;
    u32 length = 0;
    if (!read_create_record(c, index, words, &parent, &length, &source) || c.argument0 > CREATE_PENDING) {
        fail(t, ERROR_BAD_REQUEST);
        return;
    }
    const bool tentative = c.argument0 == CREATE_PENDING;
    const u64 child = load_volatile_u64(source);
    const u32 child_kind = (u32)load_volatile_u64(source + 10);  // kind: bytes 80..84
    const long long parent_slot = inode_find(t, parent);
    const u32 parent_flags = inode_flags_of(t, parent_slot);
    const bool not_directory = (parent_flags & FLAG_ATTRIBUTES) &&
                               load_table_u32(&t.inode_attributes[parent_slot].kind) != KIND_DIRECTORY;
    const bool complete = (parent_flags & FLAG_COMPLETE) && !overflowed(t);
    const u64 hash = entry_hash_of(parent, words, length);
    u64 found = 0;
    const int claimed = entry_claim(t, parent, words, length, hash, complete && !not_directory, &found);
    u32 status = STATUS_UNKNOWN;
    u64 existing = 0;
    if (claimed == CLAIM_EXISTS) {
        status = STATUS_EXISTS;
        existing = found;
    } else if (not_directory) {
        status = STATUS_NOT_DIRECTORY;
    } else if (claimed == CLAIM_STUCK) {
        fail(t, ERROR_STUCK);
    } else if (claimed == CLAIM_LIMIT && complete) {
        count_overflow(t);
    } else if (claimed == CLAIM_CLAIMED && tentative) {
        if (entry_fill(t, found, parent, words, length, hash, child, SLOT_PENDING)) {
            status = STATUS_CREATED;
        } else {
            count_overflow(t);
        }
    } else if (claimed == CLAIM_CLAIMED) {
        // The attributes first, so that the entry is never seen without them.
        const long long slot = inode_claim(t, child);
        if (slot < 0) {
            atomicExch(&t.entry_state[found], SLOT_TOMBSTONE);
            count_overflow(t);
        } else {
            u64* target = (u64*)&t.inode_attributes[slot];
            for (u32 word = 0; word < ATTRIBUTES_WORDS; ++word) target[word] = load_volatile_u64(source + word);
            __threadfence();
            atomicOr(&t.inode_flags[slot], FLAG_ATTRIBUTES | (child_kind == KIND_DIRECTORY ? FLAG_COMPLETE : 0u));
            if (entry_fill(t, found, parent, words, length, hash, child, SLOT_FULL)) {
                status = STATUS_CREATED;
            } else {
                count_overflow(t);
            }
        }
    }
    u64* answer = (u64*)(c.answers + index * CREATE_ANSWER_BYTES);
    answer[0] = (u64)status;
    answer[1] = existing;
}

__device__ void serve_create(const Tables& t, const Command& c, u64 thread, u64 threads) {
    for (u64 index = thread; index < c.count; index += threads) create_request(t, c, index);
}

// The slot of the pending claim (parent, name) for `child`, or -1 (an apply may have made it
// full or removed it since, or it was never claimed). Pending slots sit before the first empty
// slot of their chain, like full ones.
__device__ long long pending_slot(const Tables& t, u64 parent, const u64* words, u32 length, u64 hash, u64 child) {
    const u32 tag = (u32)(hash >> 32);
    u64 slot = hash & t.entry_mask;
    for (u32 probe = 0; probe < MAXIMUM_PROBES && probe <= t.entry_mask; ++probe) {
        const u32 state = load_state(&t.entry_state[slot]);
        if (state == SLOT_EMPTY) return -1;
        if (state == SLOT_PENDING && load_table_u32(&t.entry_hash[slot]) == tag &&
            load_table_u64(&t.entry_parent[slot]) == parent && load_table_u64(&t.entry_child[slot]) == child &&
            arena_name_equals(t, load_table_u64(&t.entry_name[slot]), words[0], words, length)) {
            return (long long)slot;
        }
        slot = (slot + 1) & t.entry_mask;
    }
    return -1;
}

// Request `index` of a settle command (the twin's State::settle_one): the pending claim of
// (parent, name) for the record's inode → committed (the child's attributes stored, complete
// if a directory, then the entry made full: nobody sees the entry without them) or aborted
// (the slot a tombstone) → SETTLED; no such claim → NOT_PENDING, nothing changes. The host
// cuts batches as for creates, so no two requests of a command share a key or a child.
__device__ void settle_request(const Tables& t, const Command& c, u64 index) {
    u64 words[MAXIMUM_NAME_WORDS];
    const u64* source = nullptr;
    u64 parent = 0;
    u32 length = 0;
    if (!read_create_record(c, index, words, &parent, &length, &source) ||
        (c.argument0 != SETTLE_COMMIT && c.argument0 != SETTLE_ABORT)) {
        fail(t, ERROR_BAD_REQUEST);
        return;
    }
    const u64 child = load_volatile_u64(source);
    const u32 child_kind = (u32)load_volatile_u64(source + 10);  // kind: bytes 80..84
    const long long slot = pending_slot(t, parent, words, length, entry_hash_of(parent, words, length), child);
    u32 status = STATUS_NOT_PENDING;
    if (slot >= 0 && c.argument0 == SETTLE_ABORT) {
        atomicExch(&t.entry_state[slot], SLOT_TOMBSTONE);
        status = STATUS_SETTLED;
    } else if (slot >= 0) {
        const long long inode_slot = inode_claim(t, child);
        if (inode_slot < 0) {
            // No room for the attributes: the claim goes, and the index gives no negative
            // answer any more (as for a create that finds no room).
            atomicExch(&t.entry_state[slot], SLOT_TOMBSTONE);
            count_overflow(t);
        } else {
            u64* target = (u64*)&t.inode_attributes[inode_slot];
            for (u32 word = 0; word < ATTRIBUTES_WORDS; ++word) target[word] = load_volatile_u64(source + word);
            __threadfence();
            atomicOr(&t.inode_flags[inode_slot], FLAG_ATTRIBUTES | (child_kind == KIND_DIRECTORY ? FLAG_COMPLETE : 0u));
            __threadfence();
            atomicExch(&t.entry_state[slot], SLOT_FULL);
        }
        status = STATUS_SETTLED;
    }
    u64* answer = (u64*)(c.answers + index * CREATE_ANSWER_BYTES);
    answer[0] = (u64)status;
    answer[1] = 0;
}

__device__ void serve_settle(const Tables& t, const Command& c, u64 thread, u64 threads) {
    for (u64 index = thread; index < c.count; index += threads) settle_request(t, c, index);
}

__device__ void serve_apply(const Tables& t, const Command& c, u64 thread, u64 threads) {
    for (u64 index = thread; index < c.count; index += threads) apply_update(t, c, index);
}

__device__ void drop_completeness(const Tables& t, u64 directory) {
    const long long slot = inode_find(t, directory);
    if (slot >= 0 && (inode_flags_of(t, slot) & FLAG_COMPLETE)) inode_clear_flags(t, (u64)slot, FLAG_COMPLETE);
}

// Forgets every entry of directory argument0 and its completeness (a scan of the table).
__device__ void serve_drop(const Tables& t, const Command& c, u64 thread, u64 threads) {
    const u64 directory = c.argument0;
    for (u64 slot = thread; slot <= t.entry_mask; slot += threads) {
        if (load_state(&t.entry_state[slot]) == SLOT_FULL && load_table_u64(&t.entry_parent[slot]) == directory) {
            atomicExch(&t.entry_state[slot], SLOT_TOMBSTONE);
        }
    }
    if (thread == 0) drop_completeness(t, directory);
}

// Entries of directory argument0 in entry slots [argument1, argument2): records appended at
// an atomic cursor; those that do not fit `answer_bytes` are counted, not written.
__device__ void serve_list(const Tables& t, const Command& c, u64 thread, u64 threads) {
    const u64 directory = c.argument0;
    const u64 end = c.argument2 <= t.entry_mask + 1 ? c.argument2 : t.entry_mask + 1;
    for (u64 slot = c.argument1 + thread; slot < end; slot += threads) {
        if (load_state(&t.entry_state[slot]) != SLOT_FULL || load_table_u64(&t.entry_parent[slot]) != directory) {
            continue;
        }
        const u64 packed = load_table_u64(&t.entry_name[slot]);
        const u32 length = (u32)(packed & 0xFF);
        const u32 count = (length + 7) / 8;
        const u64 bytes = LIST_RECORD_HEADER_BYTES + 8ull * count;
        const u64 at = atomicAdd(&t.control->list_bytes, bytes);
        if (at + bytes > c.answer_bytes) continue;
        u64* record = (u64*)(c.answers + at);
        record[0] = load_table_u64(&t.entry_child[slot]);
        record[1] = (u64)length;
        for (u32 index = 0; index < count; ++index) record[2 + index] = stored_name_word(t, packed, length, index);
    }
}

// What a command's completion reports: overflows of an apply; bytes needed and completeness
// of a list.
__device__ void command_results(const Tables& t, const Command& c, u64* result0, u64* result1) {
    *result0 = 0;
    *result1 = 0;
    if (c.opcode == COMMAND_APPLY || c.opcode == COMMAND_CREATE || c.opcode == COMMAND_SETTLE) {
        *result0 = load_volatile_u64(&t.control->overflows);
    } else if (c.opcode == COMMAND_LIST) {
        *result0 = load_volatile_u64(&t.control->list_bytes);
        const long long slot = inode_find(t, c.argument0);
        *result1 = ((inode_flags_of(t, slot) & FLAG_COMPLETE) && !overflowed(t)) ? 1 : 0;
    }
}

// ---------------------------------------------------------------- the serving loop

// Words of a Command that carry anything (sequence .. argument2).
#define COMMAND_WORDS 9u

// Every load is issued before any store, so the loads overlap: from mapped host memory each
// is a PCIe round trip (about 1 µs), and nine of them in a row would cost the latency budget.
__device__ void copy_command(Command* target, const Command* source) {
    const u64* from = (const u64*)source;
    u64* to = (u64*)target;
    u64 words[COMMAND_WORDS];
#pragma unroll
    for (u32 word = 0; word < COMMAND_WORDS; ++word) words[word] = load_volatile_u64(from + word);
#pragma unroll
    for (u32 word = 0; word < COMMAND_WORDS; ++word) to[word] = words[word];
}

// How long block 0 sleeps at most between two polls of the doorbell. A poll is a read over
// PCIe (about 1 µs); a pause of a few hundred ns keeps the read rate at about a million a
// second while adding little to the round trip.
#define MAXIMUM_POLL_PAUSE_NS 256u

// Commands block 0 serves alone: queries and applies of at most one request per thread of a
// block. They skip the announcement to the other blocks, the finished count and the last
// block's completion, so a single request answers in the time of the doorbell, its own work
// and the completion. Lists and drops scan the whole entry table, and the stop command must
// reach every block, so they always go to the whole grid. Either way commands are served one
// at a time in sequence order: block 0 takes the next only once the last is completed.
__device__ __forceinline__ bool served_alone(const Command& c) {
    const bool small = c.count <= blockDim.x;
    return small && (c.opcode == COMMAND_LOOKUP || c.opcode == COMMAND_RESOLVE || c.opcode == COMMAND_STAT ||
                     c.opcode == COMMAND_APPLY || c.opcode == COMMAND_CREATE || c.opcode == COMMAND_SETTLE);
}

// Block 0, lane 0 of warp 0, once a command that is not express is in `command`: resets the
// counters (the last command is completed, so its completion has read them) and, for a
// command of the grid, copies it to device memory and announces it. Returns whether block 0
// serves it alone.
__device__ bool begin_command(const Tables& t, const Command* command) {
    Control* control = t.control;
    store_volatile_u64(&control->list_bytes, 0);
    store_volatile_u64(&control->overflows, 0);
    store_volatile_u32(&control->error, ERROR_NONE);
    if (served_alone(*command)) {
        __threadfence();
        return true;
    }
    copy_command(&control->current, command);
    // Every block added its share of the last grid command before it was completed.
    store_volatile_u64(&control->finished, 0);
    __threadfence();
    store_volatile_u64(&control->announced, command->sequence);
    return false;
}

// ---------------------------------------------------------------- the express path

// The express area of ring slot `slot`: behind the ring's slots in the same mapped memory.
__device__ __forceinline__ u8* express_area(const Tables& t, u64 slot) {
    return (u8*)t.ring + t.ring_slots * sizeof(RingSlot) + slot * EXPRESS_SLOT_BYTES;
}

// Words of the express area loaded with every command, whether express or not (one PCIe round
// trip with the command's own words: 1 KiB holds a single path of up to about 1000 bytes).
#define EXPRESS_PREFETCH_WORDS 128u
#define EXPRESS_PREFETCH_ROUNDS (EXPRESS_PREFETCH_WORDS / 32u)
#define EXPRESS_REST_ROUNDS ((EXPRESS_REQUEST_WORDS - EXPRESS_PREFETCH_WORDS) / 32u)

__device__ __forceinline__ bool express_opcode(u32 opcode) {
    const u32 base = opcode & ~COMMAND_EXPRESS;
    return (opcode & COMMAND_EXPRESS) != 0 &&
           (base == COMMAND_LOOKUP || base == COMMAND_RESOLVE || base == COMMAND_STAT);
}

// Loads the words of a long express request past the prefetch into `words` (shared): every
// lane issues its loads before its first store, so this is one more round trip, not twelve.
__device__ void stage_express_rest(const u64* area, u64 request_bytes, u64* words) {
    const u32 lane = threadIdx.x & 31;
    const u64 needed = (request_bytes + 7) / 8;
    u64 rest[EXPRESS_REST_ROUNDS];
#pragma unroll
    for (u32 round = 0; round < EXPRESS_REST_ROUNDS; ++round) {
        const u64 word = EXPRESS_PREFETCH_WORDS + 32 * round + lane;
        rest[round] = word < needed ? load_volatile_u64(area + word) : 0ull;
    }
#pragma unroll
    for (u32 round = 0; round < EXPRESS_REST_ROUNDS; ++round) {
        const u64 word = EXPRESS_PREFETCH_WORDS + 32 * round + lane;
        if (word < needed) words[word] = rest[round];
    }
}

// Serves express command `host` (taken from ring slot `slot`, its request words already in
// `words`, shared memory) with the 32 lanes of warp 0, answers into the slot's area, and
// completes it. The answer functions are the batch path's; they read the requests from shared
// memory. A bad request (status 0 from an answer function) or a malformed command fails it.
__device__ void serve_express(const Tables& t, const Command& host, u64 slot, u64* words, u64 seen_ns) {
    const u32 lane = threadIdx.x & 31;
    u8* area = express_area(t, slot);
    const u32 opcode = host.opcode & ~COMMAND_EXPRESS;
    const bool valid = host.count <= EXPRESS_MAXIMUM_REQUESTS && host.request_bytes <= EXPRESS_REQUEST_BYTES;
    if (valid && host.request_bytes > EXPRESS_PREFETCH_WORDS * 8) stage_express_rest((const u64*)area, host.request_bytes, words);
    __syncwarp();
    const u64 staged_ns = clock_ns();
    const u64 staged_cycles = clock_cycles();
    Command c = host;
    c.opcode = opcode;
    c.requests = (u64)words;
    c.answers = (u64)(area + EXPRESS_ANSWERS_OFFSET);
    c.answer_bytes = (u64)EXPRESS_MAXIMUM_REQUESTS * ANSWER_BYTES;
    u32 status = 0;
    const IndexAttributes* attributes = nullptr;
    u64 step_ns[WALK_STEP_STAMPS] = {0, 0};
    if (valid && lane < c.count) {
        status = opcode == COMMAND_LOOKUP    ? answer_lookup(t, c, lane, &attributes)
                 : opcode == COMMAND_RESOLVE ? answer_resolve_stamped(t, c, lane, &attributes, step_ns)
                                             : answer_stat(t, c, lane, &attributes);
    }
    // Lane 0's walk is over here (the status is decided); each lane writes its own answer.
    const u64 walked_ns = clock_ns();
    if (valid && lane < c.count) write_own_answer((u8*)c.answers, lane, status, attributes);
    // Every answer function returns a status of 1..7 unless the request was bad.
    const bool bad = !valid || __any_sync(FULL_WARP, lane < c.count && status == 0);
    if (lane == 0) {
        const u64 answered_ns = clock_ns();
        const u64 answered_cycles = clock_cycles();
        // Four 16-byte stores of stamps and two of the completion's words (status with its zero
        // word, the two results) instead of eleven of 8 bytes: fewer writes over PCIe for the
        // release of `done` to wait for. Plain stores: that release publishes them.
        ulonglong2* stamps = (ulonglong2*)(area + EXPRESS_STAMPS_OFFSET);
        stamps[0] = make_ulonglong2(seen_ns, staged_ns);
        stamps[1] = make_ulonglong2(answered_ns, walked_ns);
        stamps[2] = make_ulonglong2(step_ns[0], step_ns[1]);
        stamps[3] = make_ulonglong2(staged_cycles, answered_cycles);
        Completion* completion = &t.ring[slot].completion;
        *(u64*)&completion->status = (u64)(bad ? ERROR_BAD_REQUEST : ERROR_NONE);
        *(ulonglong2*)&completion->result0 = make_ulonglong2(0ull, 0ull);
    }
    // The lanes' answers, then lane 0's stamps and status, are published by lane 0's release
    // of `done` after the barrier (store_release_system_u64 says why that is enough): no
    // system fence of its own on the round trip. `completed` (device memory, read by this
    // warp's lane 0 only before the next command) needs no order of its own.
    __syncwarp();
    if (lane == 0) {
        store_release_system_u64(&t.ring[slot].completion.done, host.sequence);
        store_volatile_u64(&t.control->completed, host.sequence);
        atomicAdd(&t.control->express_commands, 1ull);
    }
}

// The latency probe (benchmark): how long one dependent load of table memory takes from the
// polling warp of the live kernel, in ns and in SM cycles, and what the SM clock is. Lane 0
// walks a chain of `argument0` loads (at most PROBE_MAXIMUM_LOADS) of inode keys, each slot
// chosen from the key loaded before it (so each load waits for the last, as the walk's rounds
// do), from `argument1` as the seed; then walks the same chain again (its lines now in L2 and
// its pages in the TLB); then PROBE_MULTIPLIES dependent 32-bit multiply-adds (one IMAD each). Stamps, words
// of the area at EXPRESS_STAMPS_OFFSET: ns at the start and after each part (4), the SM's
// cycles at the same points (4), then the chain's and the multiplies' results (so that
// nothing is optimized away). Changes nothing; fenced like an express answer.
#define PROBE_MAXIMUM_LOADS 256u
#define PROBE_MULTIPLIES 1024u
#define PROBE_STAMP_WORDS 10u
static_assert(EXPRESS_STAMPS_OFFSET + 8 * PROBE_STAMP_WORDS <= EXPRESS_SLOT_BYTES, "probe stamps fit the area");

__device__ u64 probe_chain(const Tables& t, u64 seed, u32 loads) {
    u64 slot = mix(seed) & t.inode_mask;
    u64 carried = 0;
    for (u32 index = 0; index < loads; ++index) {
        const u64 key = load_table_u64(&t.inode_key[slot]);
        carried += key;
        // One multiply-add of 32 bits and a mask between two loads: the next address waits
        // for this key.
        slot = (u64)((u32)slot * 2654435761u + (u32)key + index + 1u) & t.inode_mask;
    }
    return carried + slot;
}

__device__ u32 probe_multiplies(u32 value) {
#pragma unroll 1
    for (u32 index = 0; index < PROBE_MULTIPLIES / 4; ++index) {
        // A square each (the compiler cannot fold a chain of them into one multiply).
        value = value * value + index;
        value = value * value + index;
        value = value * value + index;
        value = value * value + index;
    }
    return value;
}

__device__ void serve_probe(const Tables& t, const Command& c, u64 slot) {
    const u32 lane = threadIdx.x & 31;
    if (lane == 0) {
        const u32 loads = c.argument0 < PROBE_MAXIMUM_LOADS ? (u32)c.argument0 : PROBE_MAXIMUM_LOADS;
        u64 ns[4], cycles[4];
        ns[0] = clock_ns();
        cycles[0] = clock_cycles();
        const u64 first = probe_chain(t, c.argument1, loads);
        ns[1] = clock_ns();
        cycles[1] = clock_cycles();
        const u64 second = probe_chain(t, c.argument1, loads);
        ns[2] = clock_ns();
        cycles[2] = clock_cycles();
        const u32 product = probe_multiplies((u32)(first ^ second ^ c.argument1));
        ns[3] = clock_ns();
        cycles[3] = clock_cycles();
        u64* stamps = (u64*)(express_area(t, slot) + EXPRESS_STAMPS_OFFSET);
        for (u32 index = 0; index < 4; ++index) {
            store_volatile_u64(stamps + index, ns[index]);
            store_volatile_u64(stamps + 4 + index, cycles[index]);
        }
        store_volatile_u64(stamps + 8, first ^ second);
        store_volatile_u64(stamps + 9, product);
        Completion* completion = &t.ring[slot].completion;
        store_volatile_u32(&completion->status, ERROR_NONE);
        store_volatile_u64(&completion->result0, 0);
        store_volatile_u64(&completion->result1, 0);
    }
    __threadfence_system();
    __syncwarp();
    if (lane == 0) {
        store_volatile_u64(&t.ring[slot].completion.done, c.sequence);
        store_volatile_u64(&t.control->completed, c.sequence);
    }
}

// Block 0, warp 0: takes commands in sequence order. Lane 0 waits until command `*taken` is
// completed (its completion reads the command's counters), then polls the next slot's
// doorbell (acquire at system scope); the warp then loads the command and the first KiB of
// the slot's express area together. An express command or a NOP it serves itself and goes on
// to the next; any other command is left in `command` (block 0's shared copy) for the block
// or the grid, and the return says whether block 0 serves it alone (lane 0's answer counts).
// Bounded like the serving loop: it returns at the latest with the stop command.
__device__ bool take_next(const Tables& t, u64* taken, Command* command, u64* words) {
    const u32 lane = threadIdx.x & 31;
    Control* control = t.control;
    for (;;) {
        const u64 expected = *taken + 1;
        if (lane == 0) {
            while (load_volatile_u64(&control->completed) < *taken) __nanosleep(32);
        }
        const u64 slot_index = *taken % t.ring_slots;
        RingSlot* slot = &t.ring[slot_index];
        u32 pause_ns = 0;
        for (;;) {
            u64 seen = 0;
            if (lane == 0) seen = load_acquire_system_u64(&slot->command.sequence);
            seen = __shfl_sync(FULL_WARP, seen, 0);
            if (seen == expected) break;
            if (pause_ns) __nanosleep(pause_ns);
            pause_ns = pause_ns < MAXIMUM_POLL_PAUSE_NS ? pause_ns + 32 : MAXIMUM_POLL_PAUSE_NS;
        }
        // Lane 0's acquire reaches the other lanes through the barrier.
        __syncwarp();
        const u64 seen_ns = clock_ns();
        const u64* area = (const u64*)express_area(t, slot_index);
        const u64 command_word = lane < COMMAND_WORDS ? load_volatile_u64((const u64*)&slot->command + lane) : 0ull;
        u64 prefetched[EXPRESS_PREFETCH_ROUNDS];
#pragma unroll
        for (u32 round = 0; round < EXPRESS_PREFETCH_ROUNDS; ++round) prefetched[round] = load_volatile_u64(area + 32 * round + lane);
        if (lane < COMMAND_WORDS) ((u64*)command)[lane] = command_word;
#pragma unroll
        for (u32 round = 0; round < EXPRESS_PREFETCH_ROUNDS; ++round) words[32 * round + lane] = prefetched[round];
        __syncwarp();
        const Command c = *command;
        *taken = expected;
        if (c.opcode == COMMAND_NOP) {
            // No data to order before `done`: the completion alone.
            if (lane == 0) {
                store_volatile_u32(&slot->completion.status, ERROR_NONE);
                store_volatile_u64(&slot->completion.done, expected);
                store_volatile_u64(&control->completed, expected);
            }
            continue;
        }
        if (express_opcode(c.opcode)) {
            serve_express(t, c, slot_index, words, seen_ns);
            continue;
        }
        if (c.opcode == (COMMAND_PROBE | COMMAND_EXPRESS)) {
            serve_probe(t, c, slot_index);
            continue;
        }
        bool alone = false;
        if (lane == 0) alone = begin_command(t, command);
        return alone;
    }
}

// Thread 0 of a block other than 0: waits for block 0 to announce a grid command after `seen`
// and copies it into the block's shared `command`.
__device__ void wait_announced(const Tables& t, u64 seen, Command* command) {
    while (load_volatile_u64(&t.control->announced) == seen) __nanosleep(64);
    __threadfence();
    copy_command(command, &t.control->current);
}

// Writes the completion of command `c` into the ring, `done` last, then marks the command
// completed for block 0. Called by thread 0 of block 0 for a command it served alone, else by
// thread 0 of the block that finished the grid command last.
__device__ void complete(const Tables& t, const Command& c) {
    Control* control = t.control;
    __threadfence();
    const u32 error = load_volatile_u32(&control->error);
    u64 result0 = 0, result1 = 0;
    command_results(t, c, &result0, &result1);
    Completion* completion = &t.ring[(c.sequence - 1) % t.ring_slots].completion;
    store_volatile_u32(&completion->status, error);
    store_volatile_u64(&completion->result0, result0);
    store_volatile_u64(&completion->result1, result1);
    __threadfence_system();
    store_volatile_u64(&completion->done, c.sequence);
    // The counters were read above; only now may block 0 reset them for the next command.
    __threadfence();
    store_volatile_u64(&control->completed, c.sequence);
}

// Whether this thread stored into the command's answers (host memory, or the staging copy in
// device memory): a query warp with at least one request, any thread of a list.
__device__ __forceinline__ bool wrote_answers(const Command& c, u64 thread) {
    switch (c.opcode) {
        case COMMAND_LOOKUP:
        case COMMAND_RESOLVE:
        case COMMAND_STAT: return (thread & ~31ull) < c.count;
        case COMMAND_CREATE:
        case COMMAND_SETTLE: return thread < c.count;
        case COMMAND_LIST: return true;
        default: return false;
    }
}

// At least two blocks of 256 a multiprocessor: ptxas may then use up to 128 registers a thread.
// With the bound at 256 threads alone it chose 80 registers and spilled (40 bytes stored, 196
// loaded, in session 11 with the express path and creates added); now 123, no spills. The
// default grid is one block a multiprocessor, and two still fit.
extern "C" __global__ void __launch_bounds__(256, 2) dirindex_serve_kernel(Tables t) {
    __shared__ Command command;
    // Written by block 0 only (the host build shares it between its emulated blocks).
    __shared__ u32 block_zero_alone;
    // Block 0's copy of an express command's requests (4 KiB).
    __shared__ u64 express_words[EXPRESS_REQUEST_WORDS];
    const u64 grid_thread = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 grid_threads = (u64)gridDim.x * blockDim.x;
    // The sequence of the last command taken (block 0's warp 0) or grid command served
    // (thread 0 of the other blocks).
    u64 taken = 0;
    // One command per pass; the loop ends with the stop command (the host's only way out).
    for (;;) {
        if (blockIdx.x == 0) {
            // Warp 0 serves express commands by itself and comes back with the next command
            // for the block or the grid; the other warps wait at the barrier meanwhile.
            if (threadIdx.x < 32) {
                const bool alone = take_next(t, &taken, &command, express_words);
                if (threadIdx.x == 0) block_zero_alone = alone ? 1u : 0u;
            }
        } else if (threadIdx.x == 0) {
            wait_announced(t, taken, &command);
            taken = command.sequence;
        }
        __syncthreads();
        // Thread 0 saw the command after its fence; every thread fences too, so that its own
        // reads of what earlier commands wrote come after the command's publication.
        __threadfence();
        const Command c = command;
        const bool alone = blockIdx.x == 0 && block_zero_alone != 0;
        const u64 thread = alone ? threadIdx.x : grid_thread;
        const u64 threads = alone ? blockDim.x : grid_threads;
        switch (c.opcode) {
            case COMMAND_STOP: break;
            case COMMAND_APPLY: serve_apply(t, c, thread, threads); break;
            case COMMAND_DROP: serve_drop(t, c, thread, threads); break;
            case COMMAND_LOOKUP: serve_query(t, c, thread, threads, answer_lookup); break;
            case COMMAND_RESOLVE: serve_query(t, c, thread, threads, answer_resolve); break;
            case COMMAND_STAT: serve_query(t, c, thread, threads, answer_stat); break;
            case COMMAND_LIST: serve_list(t, c, thread, threads); break;
            case COMMAND_CREATE: serve_create(t, c, thread, threads); break;
            case COMMAND_SETTLE: serve_settle(t, c, thread, threads); break;
            default:
                if (thread == 0) fail(t, ERROR_BAD_OPCODE);
                break;
        }
        // Answers reach memory the host (and the copy engines) see before the completion: the
        // threads that stored any fence system-wide (over PCIe a fence costs a microsecond or
        // more, so the others skip it); table changes are fenced at device scope.
        if (wrote_answers(c, thread)) {
            __threadfence_system();
        } else {
            __threadfence();
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            // The counters (for the tests) are added after the completion, off the round trip;
            // an atomic whose result is unused is a reduction the thread does not wait for.
            if (alone) {
                complete(t, c);
                atomicAdd(&t.control->alone_commands, 1ull);
            } else if (atomicAdd(&t.control->finished, 1ull) + 1 == gridDim.x) {
                complete(t, c);
                atomicAdd(&t.control->grid_commands, 1ull);
            }
        }
        if (c.opcode == COMMAND_STOP) return;
    }
}
