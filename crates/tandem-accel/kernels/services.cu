// tandemfs storage services on the GPU: CRC32C of 4 KiB blocks, AES-256-XTS of 4 KiB sectors,
// Reed-Solomon matrix application over GF(2^8) (polynomial 0x11D).
// Compiled at run time by NVRTC; every kernel must give the CPU engine's bytes exactly.
// Kernels use grid-stride loops so the host can size grids to the device, and each block
// builds its lookup tables in shared memory once.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned char u8;

#define CRC_POLYNOMIAL_REFLECTED 0x82F63B78u

// ---------------------------------------------------------------- CRC32C
// Reflected-domain product a*b mod P (bit 31 stands for x^0).
__device__ __forceinline__ u32 crc_multiply(u32 a, u32 b) {
    u32 product = 0;
    for (int bit = 0; bit < 32; ++bit) {
        if (b & (0x80000000u >> bit)) product ^= a;
        a = (a & 1) ? (a >> 1) ^ CRC_POLYNOMIAL_REFLECTED : a >> 1;
    }
    return product;
}

// x^(8*bytes) mod P by square-and-multiply.
__device__ u32 crc_shift_constant(u64 bytes) {
    u32 result = 0x80000000u;  // x^0
    u32 power = 0x00800000u;   // x^8
    while (bytes) {
        if (bytes & 1) result = crc_multiply(result, power);
        power = crc_multiply(power, power);
        bytes >>= 1;
    }
    return result;
}

__device__ __forceinline__ u32 crc_word(const u32* table, u32 crc, u32 low, u32 high) {
    low ^= crc;
    return table[7 * 256 + (low & 0xFF)] ^ table[6 * 256 + ((low >> 8) & 0xFF)] ^
           table[5 * 256 + ((low >> 16) & 0xFF)] ^ table[4 * 256 + (low >> 24)] ^
           table[3 * 256 + (high & 0xFF)] ^ table[2 * 256 + ((high >> 8) & 0xFF)] ^
           table[1 * 256 + ((high >> 16) & 0xFF)] ^ table[0 * 256 + (high >> 24)];
}

// One warp per block: lane L takes the L-th 1/32 of the block, computes its raw CRC from zero
// with slicing-by-8, shifts it over the bytes after it, and the warp XORs the pieces.
// block_bytes must be a multiple of 512.
extern "C" __global__ void __launch_bounds__(256) crc32c_blocks_kernel(
    const u32* __restrict__ slicing_tables, const u8* __restrict__ data, u32* __restrict__ checksums,
    u64 block_count, u64 block_bytes) {
    __shared__ u32 table[8 * 256];
    __shared__ u32 lane_shift[32];
    __shared__ u32 initial_shift;
    for (int index = threadIdx.x; index < 8 * 256; index += blockDim.x) table[index] = slicing_tables[index];
    const u64 slice_bytes = block_bytes / 32;
    if (threadIdx.x < 32) lane_shift[threadIdx.x] = crc_shift_constant(slice_bytes * (31 - threadIdx.x));
    if (threadIdx.x == 32) initial_shift = crc_multiply(0xFFFFFFFFu, crc_shift_constant(block_bytes));
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const u64 warps = (u64)gridDim.x * (blockDim.x / 32);
    for (u64 block = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32; block < block_count; block += warps) {
        const uint4* slice = (const uint4*)(data + block * block_bytes + lane * slice_bytes);
        u32 crc = 0;
        for (u64 vector = 0; vector < slice_bytes / 16; ++vector) {
            uint4 value = slice[vector];
            crc = crc_word(table, crc, value.x, value.y);
            crc = crc_word(table, crc, value.z, value.w);
        }
        crc = crc_multiply(crc, lane_shift[lane]);
        for (int offset = 16; offset > 0; offset >>= 1) crc ^= __shfl_xor_sync(0xFFFFFFFFu, crc, offset);
        if (lane == 0) checksums[block] = ~(crc ^ initial_shift);
    }
}

// ---------------------------------------------------------------- AES-256-XTS
struct XtsKeys {
    u32 data[60];   // encryption keys, or equivalent-inverse-cipher keys when decrypting
    u32 tweak[60];  // encryption keys of the tweak key
};

#define BYTE0(w) ((w) & 0xFF)
#define BYTE1(w) (((w) >> 8) & 0xFF)
#define BYTE2(w) (((w) >> 16) & 0xFF)
#define BYTE3(w) ((w) >> 24)

// table: 4×256 round-table words then 256 S-box words. Rows ride in bits 8r of each column.
__device__ __forceinline__ void aes_encrypt(const u32* table, const u32* keys, u32& s0, u32& s1, u32& s2, u32& s3) {
    s0 ^= keys[0]; s1 ^= keys[1]; s2 ^= keys[2]; s3 ^= keys[3];
#pragma unroll
    for (int round = 1; round < 14; ++round) {
        u32 t0 = table[BYTE0(s0)] ^ table[256 + BYTE1(s1)] ^ table[512 + BYTE2(s2)] ^ table[768 + BYTE3(s3)] ^ keys[4 * round];
        u32 t1 = table[BYTE0(s1)] ^ table[256 + BYTE1(s2)] ^ table[512 + BYTE2(s3)] ^ table[768 + BYTE3(s0)] ^ keys[4 * round + 1];
        u32 t2 = table[BYTE0(s2)] ^ table[256 + BYTE1(s3)] ^ table[512 + BYTE2(s0)] ^ table[768 + BYTE3(s1)] ^ keys[4 * round + 2];
        u32 t3 = table[BYTE0(s3)] ^ table[256 + BYTE1(s0)] ^ table[512 + BYTE2(s1)] ^ table[768 + BYTE3(s2)] ^ keys[4 * round + 3];
        s0 = t0; s1 = t1; s2 = t2; s3 = t3;
    }
    const u32* box = table + 1024;
    u32 t0 = box[BYTE0(s0)] | box[BYTE1(s1)] << 8 | box[BYTE2(s2)] << 16 | box[BYTE3(s3)] << 24;
    u32 t1 = box[BYTE0(s1)] | box[BYTE1(s2)] << 8 | box[BYTE2(s3)] << 16 | box[BYTE3(s0)] << 24;
    u32 t2 = box[BYTE0(s2)] | box[BYTE1(s3)] << 8 | box[BYTE2(s0)] << 16 | box[BYTE3(s1)] << 24;
    u32 t3 = box[BYTE0(s3)] | box[BYTE1(s0)] << 8 | box[BYTE2(s1)] << 16 | box[BYTE3(s2)] << 24;
    s0 = t0 ^ keys[56]; s1 = t1 ^ keys[57]; s2 = t2 ^ keys[58]; s3 = t3 ^ keys[59];
}

// Tweak times x in GF(2^128), little-endian words w0 (low) .. w3 (high).
__device__ __forceinline__ void tweak_double(u32& w0, u32& w1, u32& w2, u32& w3) {
    u32 carry = w3 >> 31;
    w3 = (w3 << 1) | (w2 >> 31);
    w2 = (w2 << 1) | (w1 >> 31);
    w1 = (w1 << 1) | (w0 >> 31);
    w0 = (w0 << 1) ^ (carry * 0x87u);
}

// Tweak times x^32: shift one word up and fold the word that leaves through 0x87
// (x^7 + x^2 + x + 1, so the fold is the word times that polynomial, carry-less).
__device__ __forceinline__ void tweak_times_x32(u32& w0, u32& w1, u32& w2, u32& w3) {
    u64 high = w3;
    u64 folded = high ^ (high << 1) ^ (high << 2) ^ (high << 7);
    w3 = w2;
    w2 = w1;
    w1 = w0 ^ (u32)(folded >> 32);
    w0 = (u32)folded;
}

#define XTS_SECTORS_PER_WARP 4
// Blocks of one lane processed together (independent AES chains for the scheduler to overlap);
// set by the host through -DXTS_BLOCK_UNROLL so variants can be timed without editing this file.
// On an H200 (2026-11-22) unroll 1 gave 345/348 GB/s encrypt/decrypt, 2 gave 334/344 and
// 4 gave 293/282: more blocks in flight only cost registers and occupancy.
#ifndef XTS_BLOCK_UNROLL
#define XTS_BLOCK_UNROLL 1
#endif
#define TANDEM_PRAGMA(text) _Pragma(#text)
#define TANDEM_UNROLL_(count) TANDEM_PRAGMA(unroll count)
#define TANDEM_UNROLL(count) TANDEM_UNROLL_(count)
#define XTS_BLOCKS_PER_SECTOR 256

// The bulk rounds read one round table replicated 32 times, entry e of lane L at word
// 32e + L: every lane reads its own bank, so table lookups never conflict (a shared table
// costs about 3.5-way conflicts on random indices and capped the kernel near 170 GB/s).
// The other three round tables are rotations of the first.
// `lane_table` is the table already offset by the lane, so a lookup is one byte extraction
// (PRMT) and one scaled add (LEA): the SASS of the first version spent four integer
// instructions per lookup and the kernel is bound by integer issue.
// `lane_table` is the 32-bit shared-memory address of the lane's copy; entries are 128 bytes
// apart, so the address is one shift-and-add of the extracted byte.
__device__ __forceinline__ u32 lane_lookup(u32 lane_table, u32 word, u32 byte_selector) {
    u32 value;
    asm("ld.shared.u32 %0, [%1];" : "=r"(value) : "r"(lane_table + (__byte_perm(word, 0, byte_selector) << 7)));
    return value;
}

// Round table r is the first one rotated left by 8r bits.
__device__ __forceinline__ u32 rotated_lookup(u32 lane_table, u32 word, u32 byte_selector, int bits) {
    u32 value = lane_lookup(lane_table, word, byte_selector);
    return __funnelshift_l(value, value, bits);
}

template <bool Decrypt>
__device__ __forceinline__ void aes_bulk(const u32* table, const u32* last_box, u32 lane, const u32* keys,
                                         u32& s0, u32& s1, u32& s2, u32& s3) {
    const u32 lane_table = (u32)__cvta_generic_to_shared(table + lane);
    s0 ^= keys[0]; s1 ^= keys[1]; s2 ^= keys[2]; s3 ^= keys[3];
#pragma unroll
    for (int round = 1; round < 14; ++round) {
        // Encryption takes row r of column c from column c+r; decryption from column c−r.
        u32 a0 = Decrypt ? s0 : s0, a1 = Decrypt ? s3 : s1, a2 = s2, a3 = Decrypt ? s1 : s3;
        u32 b0 = Decrypt ? s1 : s1, b1 = Decrypt ? s0 : s2, b2 = s3, b3 = Decrypt ? s2 : s0;
        u32 c0 = s2, c1 = Decrypt ? s1 : s3, c2 = s0, c3 = Decrypt ? s3 : s1;
        u32 d0 = s3, d1 = Decrypt ? s2 : s0, d2 = s1, d3 = Decrypt ? s0 : s2;
#define COLUMN(w0, w1, w2, w3, k)                                                                \
    (lane_lookup(lane_table, w0, 0x4440) ^ rotated_lookup(lane_table, w1, 0x4441, 8) ^          \
     rotated_lookup(lane_table, w2, 0x4442, 16) ^ rotated_lookup(lane_table, w3, 0x4443, 24) ^ (k))
        u32 t0 = COLUMN(a0, a1, a2, a3, keys[4 * round]);
        u32 t1 = COLUMN(b0, b1, b2, b3, keys[4 * round + 1]);
        u32 t2 = COLUMN(c0, c1, c2, c3, keys[4 * round + 2]);
        u32 t3 = COLUMN(d0, d1, d2, d3, keys[4 * round + 3]);
#undef COLUMN
        s0 = t0; s1 = t1; s2 = t2; s3 = t3;
    }
    u32 a0 = s0, a1 = Decrypt ? s3 : s1, a2 = s2, a3 = Decrypt ? s1 : s3;
    u32 b0 = s1, b1 = Decrypt ? s0 : s2, b2 = s3, b3 = Decrypt ? s2 : s0;
    u32 c0 = s2, c1 = Decrypt ? s1 : s3, c2 = s0, c3 = Decrypt ? s3 : s1;
    u32 d0 = s3, d1 = Decrypt ? s2 : s0, d2 = s1, d3 = Decrypt ? s0 : s2;
    // Encryption's S-box is byte 1 of the first round table; decryption keeps its own.
#define BOX(x) (Decrypt ? last_box[(x)] : (table[((x) << 5) + lane] >> 8) & 0xFF)
#define LAST(w0, w1, w2, w3, k) ((BOX(BYTE0(w0)) | BOX(BYTE1(w1)) << 8 | BOX(BYTE2(w2)) << 16 | BOX(BYTE3(w3)) << 24) ^ (k))
    u32 t0 = LAST(a0, a1, a2, a3, keys[56]);
    u32 t1 = LAST(b0, b1, b2, b3, keys[57]);
    u32 t2 = LAST(c0, c1, c2, c3, keys[58]);
    u32 t3 = LAST(d0, d1, d2, d3, keys[59]);
#undef LAST
#undef BOX
    s0 = t0; s1 = t1; s2 = t2; s3 = t3;
}

// One warp handles XTS_SECTORS_PER_WARP sectors of 4 KiB; lane L handles blocks L, L+32, ...
// of each sector so every load and store of the warp is one contiguous 512-byte run.
// Lanes 0..3 encrypt the sector numbers into the starting tweaks (one AES per sector).
// sector_list may be null: then sector i is first_sector + i.
template <bool Decrypt>
__device__ void xts_body(const u32* __restrict__ tables, const XtsKeys& keys, u64 first_sector,
                         const u64* __restrict__ sector_list, uint4* data, u64 sector_count) {
    __shared__ u32 replicated[256 * 32];
    __shared__ u32 last_box[256];
    __shared__ u32 tweak_table[1024 + 256];
    const u32* cipher_source = tables + (Decrypt ? 1280 : 0);
    for (int index = threadIdx.x; index < 256 * 32; index += blockDim.x) replicated[index] = cipher_source[index >> 5];
    for (int index = threadIdx.x; index < 256; index += blockDim.x) last_box[index] = cipher_source[1024 + index];
    for (int index = threadIdx.x; index < 1280; index += blockDim.x) tweak_table[index] = tables[index];
    __syncthreads();
    const u32 lane = threadIdx.x & 31;
    const u64 warps = (u64)gridDim.x * (blockDim.x / 32);
    for (u64 group = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
         group * XTS_SECTORS_PER_WARP < sector_count; group += warps) {
        const u64 base = group * XTS_SECTORS_PER_WARP;
        u32 t0 = 0, t1 = 0, t2 = 0, t3 = 0;
        if (lane < XTS_SECTORS_PER_WARP && base + lane < sector_count) {
            u64 sector = sector_list ? sector_list[base + lane] : first_sector + base + lane;
            t0 = (u32)sector;
            t1 = (u32)(sector >> 32);
            aes_encrypt(tweak_table, keys.tweak, t0, t1, t2, t3);
        }
        for (int slot = 0; slot < XTS_SECTORS_PER_WARP; ++slot) {
            if (base + slot >= sector_count) break;
            u32 w0 = __shfl_sync(0xFFFFFFFFu, t0, slot);
            u32 w1 = __shfl_sync(0xFFFFFFFFu, t1, slot);
            u32 w2 = __shfl_sync(0xFFFFFFFFu, t2, slot);
            u32 w3 = __shfl_sync(0xFFFFFFFFu, t3, slot);
            for (u32 step = 0; step < lane; ++step) tweak_double(w0, w1, w2, w3);
            uint4* sector_data = data + (base + slot) * XTS_BLOCKS_PER_SECTOR;
            TANDEM_UNROLL(XTS_BLOCK_UNROLL)
            for (int block = lane; block < XTS_BLOCKS_PER_SECTOR; block += 32) {
                uint4 value = sector_data[block];
                u32 s0 = value.x ^ w0, s1 = value.y ^ w1, s2 = value.z ^ w2, s3 = value.w ^ w3;
                aes_bulk<Decrypt>(replicated, last_box, lane, keys.data, s0, s1, s2, s3);
                sector_data[block] = make_uint4(s0 ^ w0, s1 ^ w1, s2 ^ w2, s3 ^ w3);
                tweak_times_x32(w0, w1, w2, w3);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) xts_encrypt_kernel(
    const u32* __restrict__ tables, const __grid_constant__ XtsKeys keys, u64 first_sector,
    const u64* __restrict__ sector_list, uint4* data, u64 sector_count) {
    xts_body<false>(tables, keys, first_sector, sector_list, data, sector_count);
}

extern "C" __global__ void __launch_bounds__(256) xts_decrypt_kernel(
    const u32* __restrict__ tables, const __grid_constant__ XtsKeys keys, u64 first_sector,
    const u64* __restrict__ sector_list, uint4* data, u64 sector_count) {
    xts_body<true>(tables, keys, first_sector, sector_list, data, sector_count);
}

// ---------------------------------------------------------------- Reed-Solomon
#define RS_MAXIMUM_ROWS 4
#define RS_MAXIMUM_COLUMNS 32

__device__ __forceinline__ u8 gf_multiply(u8 a, u8 b) {
    u32 product = 0, x = a;
    for (int bit = 0; bit < 8; ++bit) {
        if (b & (1 << bit)) product ^= x;
        x <<= 1;
        if (x & 0x100) x ^= 0x11D;
    }
    return (u8)product;
}

__device__ __forceinline__ u32 lookup_word(const u8* table, u32 word) {
    return (u32)table[word & 0xFF] | (u32)table[(word >> 8) & 0xFF] << 8 |
           (u32)table[(word >> 16) & 0xFF] << 16 | (u32)table[word >> 24] << 24;
}

// outputs[r] = sum over c of matrix[r][c] * inputs[c], 16 bytes per thread per step.
// Shards are laid out one after another, `stride_vectors` 16-byte vectors apart.
extern "C" __global__ void __launch_bounds__(256) reed_solomon_kernel(
    const u8* __restrict__ matrix, int rows, int columns,
    const uint4* __restrict__ inputs, u64 input_stride_vectors,
    uint4* __restrict__ outputs, u64 output_stride_vectors, u64 vectors_per_shard) {
    __shared__ u8 products[RS_MAXIMUM_ROWS * RS_MAXIMUM_COLUMNS * 256];
    for (int index = threadIdx.x; index < rows * columns * 256; index += blockDim.x) {
        products[index] = gf_multiply(matrix[index >> 8], (u8)(index & 0xFF));
    }
    __syncthreads();
    const u64 threads = (u64)gridDim.x * blockDim.x;
    for (u64 vector = (u64)blockIdx.x * blockDim.x + threadIdx.x; vector < vectors_per_shard; vector += threads) {
        uint4 sum[RS_MAXIMUM_ROWS];
#pragma unroll
        for (int row = 0; row < RS_MAXIMUM_ROWS; ++row) sum[row] = make_uint4(0, 0, 0, 0);
        for (int column = 0; column < columns; ++column) {
            uint4 value = inputs[column * input_stride_vectors + vector];
#pragma unroll
            for (int row = 0; row < RS_MAXIMUM_ROWS; ++row) {
                if (row < rows) {
                    const u8* table = products + (row * columns + column) * 256;
                    sum[row].x ^= lookup_word(table, value.x);
                    sum[row].y ^= lookup_word(table, value.y);
                    sum[row].z ^= lookup_word(table, value.z);
                    sum[row].w ^= lookup_word(table, value.w);
                }
            }
        }
#pragma unroll
        for (int row = 0; row < RS_MAXIMUM_ROWS; ++row) {
            if (row < rows) outputs[row * output_stride_vectors + vector] = sum[row];
        }
    }
}
