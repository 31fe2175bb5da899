// Transparent huge pages for large buffers read at random or streamed (KV arenas and caches, weights).
#pragma once
#include <cstddef>

namespace kvd {

// Asks the kernel to back [p, p + bytes) with 2 MiB pages where it can (madvise MADV_HUGEPAGE on
// the 2 MiB-aligned part inside the range; the unaligned ends keep 4 KiB pages). Effective only for
// pages not touched yet, so call it right after allocating. Returns the bytes advised: 0 where the
// range holds no aligned 2 MiB page, on a non-Linux build, or when the kernel refuses (THP
// disabled, "never"). Never fails otherwise: it is a hint, and the memory works the same without it.
size_t AdviseHugePages(void* p, size_t bytes);

}  // namespace kvd
