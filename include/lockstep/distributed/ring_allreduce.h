// A ring all-reduce (SUM) built from point-to-point send/recv: the reference
// implementation `lockstep bench allreduce` runs beside the backend's.
//
// The tensor is cut into n chunks. Reduce-scatter: in step s (0..n-2) rank r
// sends chunk (r - s) mod n to its right neighbour and adds the chunk
// (r - s - 1) mod n received from its left into its own; after n-1 steps rank
// r holds the full sum of chunk (r + 1) mod n. All-gather: in step s rank r
// sends chunk (r + 1 - s) mod n to the right and stores chunk (r - s) mod n
// from the left; after n-1 more steps every rank holds every summed chunk.
// Each rank sends and receives 2(n-1)/n of the tensor: the bus-bandwidth
// optimum that nccl-tests' busbw factor 2(n-1)/n assumes.
// Sending and receiving of a step are posted together, so no rank waits for
// its right neighbour to be ready before the left one is.
#pragma once

#include <ATen/core/Tensor.h>

#include "lockstep/distributed/process_group.h"

namespace lockstep {

// In place, SUM. Collective: every rank calls it with the same numel.
void ring_allreduce(ProcessGroup& pg, at::Tensor& tensor);

}  // namespace lockstep
