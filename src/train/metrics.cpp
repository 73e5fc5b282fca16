#include "metrics.h"

#include <cmath>

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstring>

#include <spdlog/spdlog.h>

#include "lockstep/distributed/agree.h"
#include "lockstep/util/error.h"

namespace lockstep {

Metrics::Metrics(const LogConfig& log, ProcessGroup& pg, const std::string& run_dir)
    : log_(log), pg_(pg) {
  if (pg_.rank() != 0) return;
  const std::string path = run_dir + "/metrics.jsonl";
  file_ = std::fopen(path.c_str(), "a");
  if (file_ == nullptr) throw ConfigError("cannot open " + path + ": " + std::strerror(errno));
  std::setvbuf(file_, nullptr, _IONBF, 0);  // one write per record: see record()
  if (log_.tensorboard) {
    events_ = std::make_unique<EventWriter>(run_dir);
    spdlog::info("log.tensorboard: {} (tensorboard --logdir {})", events_->path(), run_dir);
  }
}

void Metrics::config_text(const std::string& yaml) {
  if (events_) events_->text("config", "```\n" + yaml + "```", 0);
}

void Metrics::note(const std::string& json_fields) {
  record("{%s}\n", json_fields.c_str());
}

Metrics::~Metrics() {
  if (file_ != nullptr) std::fclose(file_);
}

void Metrics::record(const char* format, ...) {
  if (file_ == nullptr) return;
  char line[1024];
  va_list args;
  va_start(args, format);
  const int length = std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  if (length < 0 || static_cast<size_t>(length) >= sizeof line) return;
  const long before = std::ftell(file_);
  if (std::fwrite(line, 1, static_cast<size_t>(length), file_) == static_cast<size_t>(length))
    return;
  const int err = errno;
  std::clearerr(file_);
  if (before >= 0) (void)ftruncate(fileno(file_), before);
  if (!failed_) {
    failed_ = true;
    spdlog::warn(
        "metrics.jsonl: a record could not be written ({}); records are dropped while "
        "writes fail, and the file holds only complete records (reported once)",
        std::strerror(err));
  }
}

bool Metrics::bar() const {
  return log_.progress == Progress::kBar ||
         (log_.progress == Progress::kAuto && isatty(STDOUT_FILENO) != 0);
}

void Interval::add(const StepStats& step) {
  if (step.loss_sum.defined())
    loss_sum = loss_sum.defined() ? loss_sum + step.loss_sum : step.loss_sum;
  if (step.correct.defined()) correct = correct.defined() ? correct + step.correct : step.correct;
  samples += step.samples;
  forward_ms += step.forward_ms;
  backward_ms += step.backward_ms;
  comm_ms += step.comm_ms;
  comm_bytes += step.comm_bytes;
  optimizer_ms += step.optimizer_ms;
  check_ms += step.check_ms;
  lr = step.lr;
  if (step.grad_norm.defined()) grad_norm = step.grad_norm;
  scaling = step.scaling;
  loss_scale = step.loss_scale;
  skipped += step.skipped ? 1 : 0;
  ++steps;
}

double Metrics::end_interval(Interval& in, const TrainerState& state, int64_t total_steps) {
  const double lr = in.lr;
  const auto sums =
      sum_over_ranks(pg_, {in.loss_sum.defined() ? in.loss_sum.item<double>() : 0.0,
                           in.correct.defined() ? in.correct.item<double>() : 0.0, in.samples});
  const double samples = sums[2];
  const double loss = sums[0] / samples;
  const double accuracy = sums[1] / samples;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - in.start).count();
  const double n = std::max<int64_t>(in.steps, 1);
  const double step_ms =
      in.forward_ms + in.backward_ms + in.comm_ms + in.optimizer_ms + in.check_ms;
  if (!warned_comm_share_ && step_ms > 0 && in.comm_ms / step_ms > 0.2) {
    warned_comm_share_ = true;
    spdlog::warn(
        "communication is {:.0f}% of step time ({:.2f} of {:.2f} ms per step waiting for "
        "gradients): consider a larger per-rank batch, gradient accumulation "
        "(train.accumulation_steps), ddp.comm_hook: fp16, or other bucket sizes (this warning "
        "is shown once)",
        100 * in.comm_ms / step_ms, in.comm_ms / n, step_ms / n);
  }
  // fp16: the scale after the interval's last step, and the steps skipped in
  // it; then rank 0's peak resident memory so far.
  char extra[256] = "";
  int used = 0;
  if (in.scaling) {
    used = std::snprintf(extra, sizeof extra, "\"loss_scale\": %.9g, \"skipped_steps\": %lld, ",
                         in.loss_scale, static_cast<long long>(in.skipped));
  }
  const double grad_norm = in.grad_norm.defined() ? in.grad_norm.item<double>() : 0.0;
  if (in.grad_norm.defined()) {  // JSON has no inf or NaN (fp16's skipped steps): null
    used +=
        std::isfinite(grad_norm)
            ? std::snprintf(extra + used, sizeof extra - used, "\"grad_norm\": %.6g, ", grad_norm)
            : std::snprintf(extra + used, sizeof extra - used, "\"grad_norm\": null, ");
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  // Rank 0's gradient exchange per optimizer step (every rank sends as much).
  std::snprintf(extra + used, sizeof extra - used,
                "\"peak_rss_mib\": %.1f, \"comm_bytes_per_step\": %.0f, ",
                static_cast<double>(usage.ru_maxrss) / 1024.0, in.comm_bytes / n);
  const bool language = tokens_per_sample_ > 0;
  const double tokens_per_s = samples * tokens_per_sample_ / seconds;
  const double flops = tokens_per_s * flops_per_token_;
  if (pg_.rank() == 0 && events_) {
    const int64_t step = state.step;
    events_->scalar("train/loss", loss, step);
    events_->scalar("train/lr", lr, step);
    if (in.grad_norm.defined()) events_->scalar("train/grad_norm", grad_norm, step);
    if (language) {
      events_->scalar("train/perplexity", std::exp(loss), step);
      events_->scalar("train/tokens_per_s", tokens_per_s, step);
    } else {
      events_->scalar("train/accuracy", accuracy, step);
      events_->scalar("train/samples_per_s", samples / seconds, step);
    }
    events_->scalar("train/comm_share", step_ms > 0 ? in.comm_ms / step_ms : 0.0, step);
    events_->scalar("train/comm_bytes_per_step", in.comm_bytes / n, step);
    if (in.scaling) events_->scalar("train/loss_scale", in.loss_scale, step);
    events_->flush();
  }
  if (pg_.rank() == 0) {
    if (language) {
      record(
          "{\"step\": %lld, \"epoch\": %lld, \"loss\": %.8g, \"perplexity\": %.6g, "
          "\"lr\": %.6g, %s\"tokens_per_s\": %.1f, \"tokens_per_s_per_rank\": %.1f, "
          "\"flops_per_s\": %.4g, \"ms\": {\"forward\": %.3f, \"backward\": %.3f, "
          "\"comm_wait\": %.3f, \"optimizer\": %.3f, \"check\": %.3f}}\n",
          static_cast<long long>(state.step), static_cast<long long>(state.epoch + 1), loss,
          std::exp(loss), lr, extra, tokens_per_s, tokens_per_s / pg_.size(), flops,
          in.forward_ms / n, in.backward_ms / n, in.comm_ms / n, in.optimizer_ms / n,
          in.check_ms / n);
    } else {
      record(
          "{\"step\": %lld, \"epoch\": %lld, \"loss\": %.8g, \"accuracy\": %.6f, "
          "\"lr\": %.6g, %s\"samples_per_s\": %.1f, \"samples_per_s_per_rank\": %.1f, "
          "\"ms\": {\"forward\": %.3f, "
          "\"backward\": %.3f, \"comm_wait\": %.3f, \"optimizer\": %.3f, \"check\": %.3f}}\n",
          static_cast<long long>(state.step), static_cast<long long>(state.epoch + 1), loss,
          accuracy, lr, extra, samples / seconds, samples / seconds / pg_.size(), in.forward_ms / n,
          in.backward_ms / n, in.comm_ms / n, in.optimizer_ms / n, in.check_ms / n);
    }
    // What the line says after the loss: ppl and tokens/s, or accuracy and samples/s.
    char rate[160];
    if (language) {
      std::snprintf(rate, sizeof rate,
                    "ppl %.3f lr %.4g %.0f tokens/s (%.0f per rank) %.2f GFLOP/s", std::exp(loss),
                    lr, tokens_per_s, tokens_per_s / pg_.size(), flops / 1e9);
    } else {
      std::snprintf(rate, sizeof rate, "acc %.4f lr %.4g %.0f samples/s", accuracy, lr,
                    samples / seconds);
    }
    if (in.scaling) {
      const size_t used = std::strlen(rate);
      std::snprintf(
          rate + used, sizeof rate - used, " scale %g%s", in.loss_scale,
          in.skipped > 0 ? (" (" + std::to_string(in.skipped) + " skipped)").c_str() : "");
    }
    if (bar()) {
      const int width = 30;
      const int filled = static_cast<int>(width * state.step / std::max<int64_t>(total_steps, 1));
      std::printf("\r[%s%s] step %lld/%lld epoch %lld loss %.4f %s",
                  std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                  static_cast<long long>(state.step), static_cast<long long>(total_steps),
                  static_cast<long long>(state.epoch + 1), loss, rate);
      std::fflush(stdout);
    } else {
      spdlog::info("step {}/{} epoch {} loss {:.5f} {}", state.step, total_steps, state.epoch + 1,
                   loss, rate);
    }
  }
  in = Interval{};
  return loss;
}

void Metrics::validation(const TrainerState& state, double loss, double accuracy, int64_t examples,
                         EvalAt at) {
  if (pg_.rank() != 0) return;
  if (events_) {
    events_->scalar("val/loss", loss, state.step);
    events_->scalar("val/accuracy", accuracy, state.step);
    if (tokens_per_sample_ > 0) events_->scalar("val/perplexity", std::exp(loss), state.step);
    events_->flush();
  }
  const char* where = at == EvalAt::kEpochEnd ? ""
                      : at == EvalAt::kStop   ? " (partial, at the stop)"
                                              : " (step, train.eval_every)";
  const char* field = at == EvalAt::kEpochEnd ? ""
                      : at == EvalAt::kStop   ? ", \"partial\": true"
                                              : ", \"at\": \"eval_every\"";
  if (bar()) std::printf("\n");
  if (tokens_per_sample_ > 0) {
    spdlog::info(
        "epoch {}{} validation: loss {:.5f} perplexity {:.3f} next-token accuracy {:.4f} ({} "
        "windows, step {})",
        state.epoch + 1, where, loss, std::exp(loss), accuracy, examples, state.step);
    record(
        "{\"step\": %lld, \"epoch\": %lld, \"val_loss\": %.8g, \"val_perplexity\": %.6g, "
        "\"val_accuracy\": %.6f%s}\n",
        static_cast<long long>(state.step), static_cast<long long>(state.epoch + 1), loss,
        std::exp(loss), accuracy, field);
    return;
  }
  spdlog::info("epoch {}{} validation: loss {:.5f} accuracy {:.4f} ({} examples, step {})",
               state.epoch + 1, where, loss, accuracy, examples, state.step);
  record("{\"step\": %lld, \"epoch\": %lld, \"val_loss\": %.8g, \"val_accuracy\": %.6f%s}\n",
         static_cast<long long>(state.step), static_cast<long long>(state.epoch + 1), loss,
         accuracy, field);
}

}  // namespace lockstep
