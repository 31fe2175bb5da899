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

// Blocks of at least kHugeAlignFrom bytes may start on a 2 MiB boundary (HugeFrom, below).
constexpr std::size_t kHugePage = std::size_t(2) << 20;
constexpr std::size_t kHugeAlignFrom = std::size_t(4) << 20;

// Allocates on an Align-byte boundary; with HugeFrom, blocks of at least HugeFrom bytes on a 2 MiB
// one. Why: madvise(MADV_HUGEPAGE) (AdviseHugePages, huge_pages.h) can only back the whole 2 MiB
// pages inside a range with huge pages, and an 8 MiB key sketch starting 64 bytes past a boundary
// keeps a quarter of its rows on 4 KiB pages. Small blocks keep Align: a 2 MiB alignment costs
// address space and heap they would waste. The alignment follows from the size alone, so
// deallocate (given the same n) frees with the alignment allocate used.
template <typename T, std::size_t Align, std::size_t HugeFrom = 0>
struct AlignedAllocator {
  using value_type = T;
  template <typename U>
  struct rebind {
    using other = AlignedAllocator<U, Align, HugeFrom>;
  };
  AlignedAllocator() noexcept = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U, Align, HugeFrom>&) noexcept {}
  static std::align_val_t AlignFor(std::size_t n) {
    return std::align_val_t(HugeFrom > 0 && n * sizeof(T) >= HugeFrom ? kHugePage : Align);
  }
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), AlignFor(n))); }
  void deallocate(T* p, std::size_t n) noexcept { ::operator delete(p, AlignFor(n)); }
  template <typename U>
  bool operator==(const AlignedAllocator<U, Align, HugeFrom>&) const noexcept { return true; }
  template <typename U>
  bool operator!=(const AlignedAllocator<U, Align, HugeFrom>&) const noexcept { return false; }
};

// A std::vector whose elements start on a cache line.
template <typename T>
using LineVector = std::vector<T, AlignedAllocator<T, kCacheLine>>;

// A LineVector for large arrays read at random that are advised for huge pages: from 4 MiB on,
// its elements start on a 2 MiB boundary.
template <typename T>
using PageVector = std::vector<T, AlignedAllocator<T, kCacheLine, kHugeAlignFrom>>;

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
