// The WorldInfo of rank `rank` of a two-rank job on this host, as torchrun
// describes it, with rank 0's store at 127.0.0.1:`port`.
#pragma once

#include <string>

#include "lockstep/distributed/world.h"

namespace lockstep::testing {

inline WorldInfo two_local_ranks(int rank, int port, const std::string& secret = "") {
  WorldInfo w;
  w.rank = rank;
  w.world_size = 2;
  w.local_world_size = 2;
  w.local_rank = rank;
  w.master_addr = "127.0.0.1";
  w.master_port = port;
  w.store_secret = secret;
  w.source = WorldSource::kTorchrun;
  return w;
}

}  // namespace lockstep::testing
