// model.name: resnet (model/resnet.cpp): a BasicBlock ResNet.
#pragma once

#include <memory>
#include <vector>

#include "lockstep/model/model_config.h"
#include "lockstep/model/models.h"

namespace lockstep {

// image: {channels, height, width}; classes >= 1.
std::shared_ptr<Classifier> make_resnet(const ModelConfig& config,
                                        const std::vector<int64_t>& image, int64_t classes);

}  // namespace lockstep
