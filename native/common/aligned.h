// Cache-line-aligned std::vector storage for arrays read a row or a tile at a time.
//
// Why: glibc serves large blocks from mmap with a 16-byte header, so a plain std::vector of a few
// MiB starts 16 bytes past a cache line. A 64-byte key-sketch row or centroid quad then straddles two
// lines (twice the lines read at random, and the second one missed by a prefetch of the row's
// start), and a 256-byte KV row five instead of four. LineVector's data() is 64-byte aligned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

namespace kvd {

constexpr std::size_t kCacheLine = 64;

template <typename T, std::size_t Align>
struct AlignedAllocator {
  using value_type = T;
  template <typename U>
  struct rebind {
    using other = AlignedAllocator<U, Align>;
  };
  AlignedAllocator() noexcept = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U, Align>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(Align))); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t(Align)); }
  template <typename U>
  bool operator==(const AlignedAllocator<U, Align>&) const noexcept { return true; }
  template <typename U>
  bool operator!=(const AlignedAllocator<U, Align>&) const noexcept { return false; }
};

// A std::vector whose elements start on a cache line.
template <typename T>
using LineVector = std::vector<T, AlignedAllocator<T, kCacheLine>>;

// A byte block on a cache line, uninitialised (its pages are faulted in as they are first written,
// as with new uint8_t[n]): for large arenas that must not be zeroed up front.
struct LineDelete {
  void operator()(uint8_t* p) const noexcept { ::operator delete[](p, std::align_val_t(kCacheLine)); }
};
using LineBytes = std::unique_ptr<uint8_t[], LineDelete>;
inline LineBytes NewLineBytes(std::size_t n) {
  return LineBytes(static_cast<uint8_t*>(::operator new[](n, std::align_val_t(kCacheLine))));
}

}  // namespace kvd
