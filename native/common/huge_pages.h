// Transparent huge pages for large, randomly read buffers: madvise(MADV_HUGEPAGE) over the whole
// 2 MiB pages inside [p, p + bytes). A hint only: a kernel without THP (or with it off) ignores it
// and the memory keeps 4 KiB pages, same contents. Pages already touched keep their size until
// khugepaged collapses them, so advise a fresh (untouched) block before its first writes.
#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

namespace kvd {

// Bytes advised (0 when the range holds no whole 2 MiB page or madvise refused).
inline size_t AdviseHugePages(const void* p, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end <= begin || ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE) != 0) return 0;
  return end - begin;
}

}  // namespace kvd
