// Precompiled header: the heavy LibTorch headers every lockstep source uses.
// Narrow on purpose: torch/torch.h (the whole C++ frontend) is not here.
#pragma once
#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>
#include <spdlog/spdlog.h>
#include <torch/nn/module.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>
