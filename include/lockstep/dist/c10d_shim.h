// The ONE place where LibTorch 1.13 and 2.x differ for lockstep.
//
// LibTorch 1.13: ProcessGroupGloo/NCCL derive from c10d::ProcessGroup.
// LibTorch 2.x:  they derive from c10d::Backend, and c10d::ProcessGroup became
//                a dispatcher that wraps backends.
// lockstep talks to the concrete backend object directly, so it names that
// base class `lockstep::C10dBackend`. c10d::Work (1.13 moved it out of
// ProcessGroup), TCPStoreOptions and ReduceOp::SUM/... read the same in both.
#pragma once

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

namespace lockstep {

#if TORCH_VERSION_MAJOR >= 2
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

using C10dWork = c10d::Work;

// For the rare test or message that must know the version; code paths that
// differ belong in this header, not behind this constant.
constexpr int kTorchVersionMajor = TORCH_VERSION_MAJOR;
using C10dStore = c10d::Store;

template <typename T>
using Ptr = c10::intrusive_ptr<T>;

}  // namespace lockstep
