// common/counter_hash.h: stateless hashing for reproducible "random" values.
//
// A value drawn as splitmix64(seed ^ splitmix64(name ^ splitmix64(index))) depends only on its
// inputs, never on the order of draws, so initial weights and synthetic data are identical however
// a tensor is sharded, however many threads run, and after a resume.
//
// Example:
//   double u = uniform01(splitmix64(seed ^ fnv1a("layer/mlp/wo") ^ splitmix64(index)));
#pragma once

#include <cstdint>
#include <string_view>

namespace tpusim {

// The splitmix64 finalizer (Steele, Lea, Flood 2014): a bijective 64-bit mix.
inline uint64_t splitmix64(uint64_t value) {
  value += 0x9e3779b97f4a7c15ULL;
  value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ULL;
  value = (value ^ (value >> 27)) * 0x94d049bb133111ebULL;
  return value ^ (value >> 31);
}

// 64-bit FNV-1a of a string.
inline uint64_t fnv1a(std::string_view text) {
  uint64_t hash = 1469598103934665603ULL;
  for (const char character : text) {
    hash = (hash ^ static_cast<unsigned char>(character)) * 1099511628211ULL;
  }
  return hash;
}

}  // namespace tpusim
