// Where LibTorch 1.13 and 2.x differ for process groups and stores: the
// c10d half of lockstep's one compatibility layer (the tensor, autograd and
// optimizer half is util/torch_compat.h, included here). Nothing else in the
// tree tests TORCH_VERSION. (docs/compatibility.md has the table.)
//
// Process groups. 1.13: ProcessGroupGloo/NCCL/MPI derive from
//   c10d::ProcessGroup. 2.x: they derive from c10d::Backend, and
//   c10d::ProcessGroup became a dispatcher that wraps backends. lockstep
//   talks to the concrete backend object directly, so it names that base
//   class `C10dBackend`. c10d::Work (Work.hpp in both), its future,
//   c10d::Store, TCPStoreOptions, PrefixStore/HashStore and
//   ReduceOp::SUM/... read the same in both (2.x's ReduceOp is a struct
//   that converts from the enum).
// TCPStore. 2.4+ picks the libuv server by default (useLibUV), and a
//   LibTorch built without libuv (Debian 13's 2.6) then refuses to start
//   the store at all; tcp_store_options() asks for the classic server, which
//   every build has and which speaks the same protocol to clients.
// Backend shutdown. ProcessGroupNCCL gained shutdown() in 2.x.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <type_traits>

#include "lockstep/util/torch_compat.h"

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
using C10dStore = c10d::Store;

namespace compat_detail {
template <typename T, typename = void>
struct HasUseLibUV : std::false_type {};
template <typename T>
struct HasUseLibUV<T, std::void_t<decltype(std::declval<T&>().useLibUV)>> : std::true_type {};
template <typename Options>
void use_classic_store_server(Options& options) {
  if constexpr (HasUseLibUV<Options>::value) options.useLibUV = false;
}

template <typename T, typename = void>
struct HasShutdown : std::false_type {};
template <typename T>
struct HasShutdown<T, std::void_t<decltype(std::declval<T&>().shutdown())>> : std::true_type {};
}  // namespace compat_detail

// Backends that own device resources (ProcessGroupNCCL) gained shutdown() in
// 2.x; 1.13's release them in their destructor.
template <typename Backend>
void shutdown_if_supported(Backend& backend) {
  if constexpr (compat_detail::HasShutdown<Backend>::value) backend.shutdown();
}

// TCPStoreOptions with the defaults every LibTorch build can serve.
inline c10d::TCPStoreOptions tcp_store_options() {
  c10d::TCPStoreOptions options;
  compat_detail::use_classic_store_server(options);
  return options;
}

}  // namespace lockstep
