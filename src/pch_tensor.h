// Precompiled header of the data layer: tensors, no c10d (the layers that
// talk to other ranks use src/pch.h).
#pragma once
#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <string>
#include <vector>
