// The random stream every data set draws from: splitmix64 (Steele, Lea,
// Flood 2014), written out rather than taken from <random> because std::
// distributions are implementation-defined, and every rank on any platform
// must draw the very same samples. A sample's stream is seeded from a hash of
// (seed, ..., index), so samples are a pure function of their coordinates.
#pragma once

#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

namespace ptrain::datasets {

inline constexpr uint64_t kSplitMixGolden = 0x9E3779B97F4A7C15ULL;

// splitmix64's output function: a bijective mix with full avalanche, so
// nearby coordinates give unrelated streams.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// A hash `h` extended by one more coordinate.
inline uint64_t combine(uint64_t h, uint64_t value) { return mix64(h ^ mix64(value + kSplitMixGolden)); }

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() { return mix64(state_ += kSplitMixGolden); }
  // Uniform in [0, n), n > 0, without modulo bias (rejects the short tail).
  uint64_t below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    for (;;) {
      const uint64_t r = next();
      if (r >= threshold) return r % n;
    }
  }
  // Uniform in [0, 1) on the 53-bit grid of doubles.
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

// Epoch `epoch`'s order of n records (a file source shuffled per epoch): a
// permutation of 0..n-1 by Fisher-Yates from the stream of hash(seed, epoch),
// the same on every rank. O(n) time and memory.
inline std::vector<int64_t> epochPermutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  SplitMix64 rng(combine(mix64(seed + kSplitMixGolden), static_cast<uint64_t>(epoch)));
  for (int64_t i = n - 1; i > 0; --i) {
    std::swap(order[static_cast<size_t>(i)], order[rng.below(static_cast<uint64_t>(i + 1))]);
  }
  return order;
}

}  // namespace ptrain::datasets
