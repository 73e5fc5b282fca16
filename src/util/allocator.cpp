#include "lockstep/util/allocator.h"

#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdio>

#include <cstdlib>
#include <cstring>
#include <mutex>

namespace lockstep {

// Note [Allocator tuning]
// ~~~~~~~~~~~~~~~~~~~~~~~
// LibTorch's CPU tensors come from malloc (posix_memalign). glibc serves a
// block over its mmap threshold (128 KiB at first, raised dynamically up
// to 32 MiB as such blocks are freed) with a fresh mmap and returns it with
// munmap, and it hands the top of the heap back to the kernel once more
// than the trim threshold is free there. A training step allocates and
// frees the same activations every step, so both return the memory just
// before the next step asks for it again: every page is faulted in and
// zeroed by the kernel anew. The GPT demo (1 rank, 2,048 tokens a step)
// took ~8,000 page faults a step, 381,681 in a 40-step run; with the
// thresholds below, 57,083 (the first steps' and the data's), 8% more
// tokens/s and 8 MiB more peak memory (tokens/s: `scripts/bench_gpt.sh`;
// docs/lab/gpt-demo.md, "Where the gap was"). A threshold set explicitly
// stops glibc's dynamic adjustment, so both are set: blocks up to 256 MiB
// come from the heap, and up to 512 MiB free at its
// top stay there for the next step. Larger blocks (a huge embedding, a
// checkpoint's buffers) are still mapped and unmapped whole, and after a
// one-off peak (a checkpoint's gathered state) release_free_memory() hands
// what is free back (malloc_trim).
namespace {
constexpr int kMmapThreshold = 256 << 20;
constexpr int kTrimThreshold = 512 << 20;
}  // namespace

std::string tune_allocator() {
  static std::once_flag once;
  static std::string outcome;
  std::call_once(once, [] {
    const char* off = std::getenv("LOCKSTEP_MALLOC_TUNING");
    const char* tunables = std::getenv("GLIBC_TUNABLES");
    if (off != nullptr && std::strcmp(off, "0") == 0) {
      outcome = "allocator: left as it is (LOCKSTEP_MALLOC_TUNING=0)";
    } else if ((tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) ||
               std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr ||
               std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr) {
      outcome = "allocator: left as the environment tunes it";
    } else if (mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&
               mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1) {
      outcome =
          "allocator: blocks up to 256 MiB from the heap, 512 MiB kept free at its top "
          "(LOCKSTEP_MALLOC_TUNING=0 leaves glibc's defaults)";
    } else {
      outcome = "allocator: mallopt refused the thresholds; glibc's defaults stay";
    }
  });
  return outcome;
}

void release_free_memory() {
  malloc_trim(0);
}

namespace {
std::atomic<long> peak_before_reset_kib{0};

// A "<key>: <n> kB" line of /proc/self/status (`format` its sscanf form).
long status_kib(const char* format) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  long kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, format, &kib) == 1) break;
  std::fclose(f);
  return kib;
}
}  // namespace

long resident_peak_kib() {
  return status_kib("VmHWM: %ld kB");
}

void reset_resident_peak() {
  const long now = resident_peak_kib();
  long before = peak_before_reset_kib.load();
  while (now > before && !peak_before_reset_kib.compare_exchange_weak(before, now)) {
  }
  if (std::FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", f);
    std::fclose(f);
  }
}

long resident_now_kib() {
  return status_kib("VmRSS: %ld kB");
}

long process_resident_peak_kib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return std::max({usage.ru_maxrss, resident_peak_kib(), peak_before_reset_kib.load()});
}

}  // namespace lockstep
