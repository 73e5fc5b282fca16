// Your own model, loss, callback and comm hook inside lockstep's trainer:
// register them under names, then run `lockstep train` from your program.
// The config says model.name: tiny and train.loss: smoothed;
// --set ddp.comm_hook=counting picks the hook.
//   lockstep-run --nproc-per-node 2 build/custom_trainer --config tiny.yaml
#include <lockstep/cli/train_main.h>
#include <lockstep/ddp/comm_hooks.h>
#include <lockstep/model/models.h>
#include <lockstep/train/callbacks.h>
#include <torch/torch.h>

#include <cstdio>

// A Classifier maps [batch, ...example shape] to [batch, classes].
class Tiny : public lockstep::Classifier {
 public:
  Tiny(int64_t features, int64_t classes) {
    hidden_ = register_module("hidden", torch::nn::Linear(features, 32));
    out_ = register_module("out", torch::nn::Linear(32, classes));
  }
  at::Tensor forward(at::Tensor x) override {
    return out_->forward(torch::relu(hidden_->forward(x.flatten(1))));
  }

 private:
  torch::nn::Linear hidden_{nullptr}, out_{nullptr};
};

// Cross-entropy with label smoothing (eps spread over all classes).
at::Tensor smoothed_cross_entropy(const at::Tensor& logits, const at::Tensor& target) {
  static bool announced = false;  // a visible mark that train.loss picked it
  if (!announced) {
    announced = true;
    std::printf("[loss] label-smoothed cross-entropy\n");
  }
  const double eps = 0.1;
  const auto logp = torch::log_softmax(logits, 1);
  const auto nll = -logp.gather(1, target.unsqueeze(1)).squeeze(1);
  return ((1 - eps) * nll - eps * logp.mean(1)).mean();
}

// Runs on every rank; prints on rank 0 what it saw.
class Report : public lockstep::TrainerCallback {
 public:
  void on_train_start(const lockstep::CallbackContext& context,
                      const lockstep::TrainerState&) override {
    rank_ = context.rank;
  }
  void on_step_end(const lockstep::TrainerState&, const lockstep::StepStats&) override { ++steps_; }
  void on_evaluation_end(const lockstep::TrainerState& state,
                         const lockstep::TrainResult& result) override {
    if (rank_ == 0) {
      std::printf("[report] step %lld: val_loss %.4f val_accuracy %.4f\n",
                  static_cast<long long>(state.step), result.val_loss, result.val_accuracy);
    }
  }
  void on_checkpoint(const lockstep::TrainerState&, const std::string& folder) override {
    if (rank_ == 0) std::printf("[report] checkpoint %s\n", folder.c_str());
  }
  void on_train_end(const lockstep::TrainerState&, const lockstep::TrainResult&) override {
    if (rank_ == 0) std::printf("[report] %lld steps seen\n", static_cast<long long>(steps_));
  }

 private:
  int rank_ = 0;
  int64_t steps_ = 0;
};

// A comm hook: the plain SUM all-reduce of each bucket (already divided by
// the world size), announcing the buckets of its first iteration. A hook
// that needs each gradient's shape reads bucket.gradients the same way.
class Counting : public lockstep::CommHook {
 public:
  std::string name() const override { return "counting"; }
  lockstep::HookWork run_bucket(lockstep::ProcessGroup& pg, lockstep::GradBucket& bucket) override {
    if (!announced_) {
      std::printf("[hook] bucket %zu of %zu: %zu gradients, %lld bytes\n", bucket.index + 1,
                  bucket.count, bucket.gradients.size(),
                  static_cast<long long>(bucket.buffer.nbytes()));
      announced_ = bucket.is_last();
    }
    lockstep::HookWork work;
    work.work = pg.allreduce_async(bucket.buffer, lockstep::ReduceKind::kSum);
    work.bytes = static_cast<int64_t>(bucket.buffer.nbytes());
    return work;
  }

 private:
  bool announced_ = false;
};

int main(int argc, char** argv) {
  lockstep::register_comm_hook("counting", [] { return std::make_shared<Counting>(); });
  lockstep::register_loss("smoothed", smoothed_cross_entropy);
  lockstep::register_callback("report", [] { return std::make_shared<Report>(); });
  lockstep::register_model(
      "tiny", [](const lockstep::ModelConfig&, const std::vector<int64_t>& shape, int64_t classes) {
        int64_t features = 1;
        for (auto d : shape) features *= d;
        return std::make_shared<Tiny>(features, classes);
      });
  return lockstep::train_main(argc, argv);  // lockstep train's options; its exit codes
}
