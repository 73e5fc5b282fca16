// The C library's allocator, set for training (Note [Allocator tuning],
// allocator.cpp): a step's activations reuse the memory freed by the step
// before instead of being mapped afresh, and page-faulted, every step.
#pragma once

#include <string>

namespace lockstep {

// Sets glibc's mmap and trim thresholds (once per process; later calls do
// nothing), unless the environment already tunes malloc (GLIBC_TUNABLES
// naming glibc.malloc, MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) or
// LOCKSTEP_MALLOC_TUNING=0. Returns what it did, one line, for the log.
// lockstep's programs call it first thing; a program of yours that trains
// with lockstep calls it before building the model.
std::string tune_allocator();

// Hands the heap's free memory back to the kernel (malloc_trim), after a
// one-off peak such as a checkpoint's gathered state: with the thresholds
// above it would otherwise stay resident for the rest of the run.
void release_free_memory();

// Resident memory peaks (Linux: VmHWM, reset through /proc/self/clear_refs):
// the peak since the last reset_resident_peak() (the process's start if
// none), and the process's whole peak, resets or not. A checkpoint resets
// it to measure its own peak; metrics and the closing "memory:" line read
// process_resident_peak_kib(). 0 where /proc cannot be read.
void reset_resident_peak();
long resident_peak_kib();
long process_resident_peak_kib();
long resident_now_kib();  // VmRSS

}  // namespace lockstep
