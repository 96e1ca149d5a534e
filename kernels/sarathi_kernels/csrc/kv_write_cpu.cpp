// This step's keys and values into their paged cache slots on the CPU.
//
// Why: torch's index_copy_ of the strided key and value views (inside the fused qkv output) ran at
// 4-5 GB/s on cpu-small (180 us per layer for a 256-token chunk in bfloat16, 400 us for 512), where
// a copy of each token's contiguous row runs at memory speed (benchmarks/RESULTS.md).
#include <cstdint>
#include <cstring>

// key, value: token i's row of `row_bytes` at i * key_stride / i * value_stride (bytes); caches:
// slot s's row at s * row_bytes. Returns the first token whose slot is outside [0, slots), or -1
// (nothing is written then).
extern "C" int64_t kv_write(const char* key, int64_t key_stride, const char* value, int64_t value_stride,
                            char* k_cache, char* v_cache, const int64_t* slot_mapping, int64_t tokens,
                            int64_t row_bytes, int64_t slots, int threads) {
  for (int64_t i = 0; i < tokens; ++i)
    if (slot_mapping[i] < 0 || slot_mapping[i] >= slots) return i;
#pragma omp parallel for num_threads(threads) if (threads > 1 && tokens * row_bytes >= (1 << 16))
  for (int64_t i = 0; i < tokens; ++i) {
    std::memcpy(k_cache + slot_mapping[i] * row_bytes, key + i * key_stride, row_bytes);
    std::memcpy(v_cache + slot_mapping[i] * row_bytes, value + i * value_stride, row_bytes);
  }
  return -1;
}
