// `lockstep train` as a library call, for a program that adds its own models:
//
//   int main(int argc, char** argv) {
//     lockstep::register_model("mynet", [](const lockstep::ModelConfig& c,
//                                          const std::vector<int64_t>& shape, int64_t classes) {
//       return std::make_shared<MyNet>(shape, classes);
//     });
//     return lockstep::train_main(argc, argv);   // --config run.yaml, model.name: mynet
//   }
//
// It takes `lockstep train`'s options (argv[0] is the program name), runs
// the whole trainer (DDP, checks, checkpoints, resume, metrics) and returns
// its exit code (util/exit_codes.h); exceptions do not escape.
#pragma once

namespace lockstep {

int train_main(int argc, char** argv);

}  // namespace lockstep
