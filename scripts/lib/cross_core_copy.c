/* Cross-core copy rates (docs/performance.md, "Where the private path's
 * slow mode comes from"): two processes on two cores, one 128 KiB slot
 * each in shared memory, as the shm backend's private-tensor path moves
 * its chunks. Each step a process copies its private buffer into its slot
 * (lines the other process read last: each store must take the line from
 * the other core's cache), waits, and copies the other's slot out (lines
 * the other core wrote). Four copy methods: glibc's memcpy, an AVX2 loop,
 * rep movsb, and an AVX2 loop with streaming stores into the slot (as the
 * shm backend may choose: Note [Streaming into the slots]; its copy out
 * of the other's slot is memcpy). Printed: GB/s of each, per process, and a one-process memcpy
 * of the same size for scale. Built and run by scripts/bench_cross_core.sh. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* 64 bytes a step with AVX2; `stream`: streaming stores, then a fence. */
static void avx2_copy(char* d, const char* s, size_t n, int stream) {
  for (size_t i = 0; i < n; i += 64) {
    __m256i a = _mm256_loadu_si256((const __m256i*)(s + i));
    __m256i b = _mm256_loadu_si256((const __m256i*)(s + i + 32));
    if (stream) {
      _mm256_stream_si256((__m256i*)(d + i), a);
      _mm256_stream_si256((__m256i*)(d + i + 32), b);
    } else {
      _mm256_storeu_si256((__m256i*)(d + i), a);
      _mm256_storeu_si256((__m256i*)(d + i + 32), b);
    }
  }
  if (stream) _mm_sfence();
}

static void movsb_copy(char* d, const char* s, size_t n) {
  __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n)::"memory");
}

static void copy(int method, char* d, const char* s, size_t n) {
  if (method == 0)
    memcpy(d, s, n);
  else if (method == 1 || method == 3)
    avx2_copy(d, s, n, method == 3);
  else
    movsb_copy(d, s, n);
}

typedef struct {
  _Atomic long arrived[2];
} Barrier;

static void barrier(Barrier* b, int me, long gen) {
  atomic_store(&b->arrived[me], gen);
  while (atomic_load(&b->arrived[1 - me]) < gen) _mm_pause();
}

int main(int argc, char** argv) {
  const size_t n = 128 * 1024;
  const int steps = argc > 1 ? atoi(argv[1]) : 4000;
  if (steps < 1) {
    fprintf(stderr, "cross_core_copy: steps must be >= 1\n");
    return 2;
  }
  const char* names[4] = {"memcpy", "avx2 loop", "rep movsb", "streaming"};
  char* seg = mmap(0, 4096 + 2 * n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  char* mine = aligned_alloc(4096, n);
  char* got = aligned_alloc(4096, n);
  if (seg == MAP_FAILED || !mine || !got) {
    perror("cross_core_copy");
    return 1;
  }
  memset(seg, 0, 4096 + 2 * n);
  Barrier* bar = (Barrier*)seg;
  char* slot[2] = {seg + 4096, seg + 4096 + n};
  double t = now();
  for (int s = 0; s < steps; ++s) memcpy(got, mine, n);
  printf("one process, memcpy of 128 KiB (cache to cache): %.2f GB/s\n",
         n * (double)steps / (now() - t) / 1e9);
  fflush(stdout);
  for (int method = 0; method < 4; ++method) {
    atomic_store(&bar->arrived[0], 0);
    atomic_store(&bar->arrived[1], 0);
    const pid_t pid = fork();
    if (pid < 0) {
      perror("cross_core_copy: fork");
      return 1;
    }
    const int me = pid == 0 ? 1 : 0;
    memset(mine, me + 1, n);
    double in = 0, out = 0;
    long gen = 0;
    for (int s = 0; s < steps; ++s) {
      t = now();
      copy(method, slot[me], mine, n);
      in += now() - t;
      barrier(bar, me, ++gen);
      t = now();
      copy(method == 3 ? 0 : method, got, slot[1 - me], n);
      out += now() - t;
      barrier(bar, me, ++gen);
    }
    if (me == 1) usleep(100000); /* rank 0 prints first */
    printf("%-9s process %d: into its slot %.2f GB/s, out of the other's slot %.2f GB/s\n",
           names[method], me, n * (double)steps / in / 1e9, n * (double)steps / out / 1e9);
    fflush(stdout);
    if (pid == 0) _exit(0);
    waitpid(pid, NULL, 0);
  }
  return 0;
}
