#include "metrics.h"

#include <cmath>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <cstring>

#include <spdlog/spdlog.h>

#include "lockstep/distributed/agree.h"
#include "lockstep/util/allocator.h"
#include "lockstep/util/error.h"
#include "lockstep/util/log.h"

namespace lockstep {

namespace {
// lockstep-run's progress pipe (Note [Progress line]); -1 when absent or not
// a pipe (a stray LOCKSTEP_PROGRESS_FD must not make us write into a file
// or a terminal).
int progress_pipe() {
  const char* text = std::getenv(kProgressFdEnv);
  if (text == nullptr || *text == '\0') return -1;
  char* end = nullptr;
  const long fd = std::strtol(text, &end, 10);
  struct stat st {};
  if (*end != '\0' || fd <= 2 || fd > 65535 || fstat(static_cast<int>(fd), &st) != 0 ||
      !S_ISFIFO(st.st_mode)) {
    spdlog::warn("{}={}: not a pipe of lockstep-run's; no progress records are sent",
                 kProgressFdEnv, text);
    return -1;
  }
  const int flags = fcntl(static_cast<int>(fd), F_GETFL);
  fcntl(static_cast<int>(fd), F_SETFL, flags | O_NONBLOCK);
  fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  return static_cast<int>(fd);
}
}  // namespace

Metrics::Metrics(const LogConfig& log, ProcessGroup& pg, const std::string& run_dir)
    : log_(log), pg_(pg) {
  if (pg_.rank() != 0) return;
  progress_fd_ = progress_pipe();
  if (bar() && isatty(STDERR_FILENO) != 0) log_clear_line_first();
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
  if (progress_fd_ >= 0 && log_.progress != Progress::kPlain) return false;  // the launcher draws
  return log_.progress == Progress::kBar ||
         (log_.progress == Progress::kAuto && isatty(STDOUT_FILENO) != 0);
}

void Metrics::step_done(const TrainerState& state, int64_t total_steps, double samples) {
  if (pg_.rank() != 0) return;
  units_ += samples * pg_.size() * (tokens_per_sample_ > 0 ? tokens_per_sample_ : 1);
  ProgressRecord r;
  r.step = state.step;
  r.total = std::max(total_steps, state.step);
  r.epoch = state.epoch + 1;
  r.loss = last_loss_;
  r.units = units_;
  r.tokens = tokens_per_sample_ > 0;
  if (progress_fd_ >= 0 && log_.progress != Progress::kPlain) {
    const std::string line = progress_record_line(r);
    // Non-blocking: a full pipe (a launcher not reading) drops the record.
    // SIGPIPE held back around the write: a launcher gone must not kill the
    // run; its pending signal is taken, and the pipe is left alone (open:
    // its number is not handed to anything else).
    sigset_t pipe_signal, before;
    sigemptyset(&pipe_signal);
    sigaddset(&pipe_signal, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_signal, &before);
    const ssize_t wrote = write(progress_fd_, line.data(), line.size());
    if (wrote < 0 && errno == EPIPE) {
      const timespec none{0, 0};
      while (sigtimedwait(&pipe_signal, nullptr, &none) == SIGPIPE) {
      }
      progress_fd_ = -1;
    }
    pthread_sigmask(SIG_SETMASK, &before, nullptr);
    return;
  }
  if (!bar()) return;
  const double now =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  view_.update(r, now);
  if (now - last_drawn_s_ < 0.1 && state.step < r.total) return;  // at most 10 redraws a second
  last_drawn_s_ = now;
  struct winsize size {};
  const int columns =
      ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0 ? size.ws_col : 80;
  std::printf("\r\033[K%s", view_.render(columns, now).c_str());
  std::fflush(stdout);
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
  clip_ms += step.clip_ms;
  optimizer_ms += step.optimizer_ms;
  check_ms += step.check_ms;
  lr = step.lr;
  if (step.grad_norm.defined()) grad_norm = step.grad_norm;
  scaling = step.scaling;
  loss_scale = step.loss_scale;
  skipped += step.skipped ? 1 : 0;
  ++steps;
}

// One figure of an interval (Note [Metric fields]).
struct MetricField {
  const char* key;  // in metrics.jsonl; "ms.forward" is "forward" inside "ms"; nullptr: not there
  double value;
  const char* json = "%.6g";          // its format in metrics.jsonl
  const char* tag = nullptr;          // its TensorBoard scalar; nullptr: none
  const char* console = nullptr;      // its printf on the progress line; nullptr: none
  double console_scale = 1;           // the progress line shows value x this
  bool console_nonzero_only = false;  // ... and only when it is not 0
};

// Note [Metric fields]
// ~~~~~~~~~~~~~~~~~~~~
// An interval's figures are one table (interval_fields): each names its key
// in metrics.jsonl, its TensorBoard tag and its place on the progress line
// once, and the three writers walk the table. A figure that is not finite
// is null in metrics.jsonl (JSON has no inf or NaN: fp16's skipped steps).
namespace {

std::string json_record(const std::vector<MetricField>& fields) {
  std::string out = "{";
  std::string group;  // the open nested object ("ms"), if any
  char number[64];
  for (const auto& f : fields) {
    if (f.key == nullptr) continue;
    const std::string key = f.key;
    const auto dot = key.find('.');
    const std::string in = dot == std::string::npos ? "" : key.substr(0, dot);
    if (in != group) {
      if (!group.empty()) out += "}";
      if (out.size() > 1) out += ", ";
      if (!in.empty()) out += "\"" + in + "\": {";
      group = in;
    } else if (out.back() != '{') {
      out += ", ";
    }
    if (std::isfinite(f.value)) {
      std::snprintf(number, sizeof number, f.json, f.value);
    } else {
      std::snprintf(number, sizeof number, "null");
    }
    out += "\"" + key.substr(dot == std::string::npos ? 0 : dot + 1) + "\": " + number;
  }
  if (!group.empty()) out += "}";
  return out + "}\n";
}

std::string console_line(const std::vector<MetricField>& fields) {
  std::string out;
  char text[96];
  for (const auto& f : fields) {
    if (f.console == nullptr || (f.console_nonzero_only && f.value == 0)) continue;
    std::snprintf(text, sizeof text, f.console, f.value * f.console_scale);
    out += (out.empty() ? "" : " ") + std::string(text);
  }
  return out;
}

}  // namespace

std::vector<MetricField> Metrics::interval_fields(const Interval& in, const TrainerState& state,
                                                  const IntervalSums& sums) const {
  const double n = static_cast<double>(std::max<int64_t>(in.steps, 1));
  const double loss = sums.loss / sums.samples;
  const bool language = tokens_per_sample_ > 0;
  const double per_s = sums.samples * (language ? tokens_per_sample_ : 1.0) / sums.seconds;
  const double ranks = pg_.size();
  const double step_ms = in.phases_ms();
  std::vector<MetricField> f;
  f.push_back({"step", static_cast<double>(state.step), "%.0f"});
  f.push_back({"epoch", static_cast<double>(state.epoch + 1), "%.0f"});
  f.push_back({"loss", loss, "%.8g", "train/loss"});
  if (language) {
    f.push_back({"perplexity", std::exp(loss), "%.6g", "train/perplexity", "ppl %.3f"});
  } else {
    f.push_back({"accuracy", sums.correct / sums.samples, "%.6f", "train/accuracy", "acc %.4f"});
  }
  f.push_back({"lr", in.lr, "%.6g", "train/lr", "lr %.4g"});
  if (in.scaling) {  // fp16: the scale after the interval's last step, the steps it skipped
    f.push_back({"loss_scale", in.loss_scale, "%.9g", "train/loss_scale"});
    f.push_back({"skipped_steps", static_cast<double>(in.skipped), "%.0f"});
  }
  if (in.grad_norm.defined())
    f.push_back({"grad_norm", in.grad_norm.item<double>(), "%.6g", "train/grad_norm"});
  // Rank 0's peak resident memory so far, its gradient exchange per step.
  f.push_back({"peak_rss_mib", static_cast<double>(process_resident_peak_kib()) / 1024.0, "%.1f"});
  f.push_back({"comm_bytes_per_step", in.comm_bytes / n, "%.0f", "train/comm_bytes_per_step"});
  f.push_back({nullptr, step_ms > 0 ? in.comm_ms / step_ms : 0.0, "", "train/comm_share"});
  if (language) {
    f.push_back({"tokens_per_s", per_s, "%.1f", "train/tokens_per_s", "%.0f tokens/s"});
    f.push_back({"tokens_per_s_per_rank", per_s / ranks, "%.1f", nullptr, "(%.0f per rank)"});
    f.push_back({"flops_per_s", per_s * flops_per_token_, "%.4g", nullptr, "%.2f GFLOP/s", 1e-9});
    if (peak_gflops_ > 0)  // per rank, over one core's measured peak
      f.push_back({"mfu", per_s * flops_per_token_ / ranks / (peak_gflops_ * 1e9), "%.4f",
                   "train/mfu", "MFU %.1f%%", 100});
  } else {
    f.push_back({"samples_per_s", per_s, "%.1f", "train/samples_per_s", "%.0f samples/s"});
    f.push_back({"samples_per_s_per_rank", per_s / ranks, "%.1f"});
  }
  if (in.scaling) {
    f.push_back({nullptr, in.loss_scale, "", nullptr, "scale %g"});
    f.push_back({nullptr, static_cast<double>(in.skipped), "", nullptr, "(%.0f skipped)", 1, true});
  }
  f.push_back({"ms.forward", in.forward_ms / n, "%.3f"});
  f.push_back({"ms.backward", in.backward_ms / n, "%.3f"});
  f.push_back({"ms.comm_wait", in.comm_ms / n, "%.3f"});
  f.push_back({"ms.clip", in.clip_ms / n, "%.3f"});
  f.push_back({"ms.optimizer", in.optimizer_ms / n, "%.3f"});
  f.push_back({"ms.check", in.check_ms / n, "%.3f"});
  return f;
}

void Metrics::warn_comm_share(const Interval& in) {
  const double n = static_cast<double>(std::max<int64_t>(in.steps, 1));
  const double step_ms = in.phases_ms();
  if (warned_comm_share_ || step_ms <= 0 || in.comm_ms / step_ms <= 0.2) return;
  warned_comm_share_ = true;
  spdlog::warn(
      "communication is {:.0f}% of step time ({:.2f} of {:.2f} ms per step waiting for "
      "gradients): consider a larger per-rank batch, gradient accumulation "
      "(train.accumulation_steps), ddp.comm_hook: fp16, or other bucket sizes (this warning "
      "is shown once)",
      100 * in.comm_ms / step_ms, in.comm_ms / n, step_ms / n);
}

double Metrics::end_interval(Interval& in, const TrainerState& state, int64_t total_steps) {
  const auto reduced =
      sum_over_ranks(pg_, {in.loss_sum.defined() ? in.loss_sum.item<double>() : 0.0,
                           in.correct.defined() ? in.correct.item<double>() : 0.0, in.samples});
  IntervalSums sums;
  sums.loss = reduced[0];
  sums.correct = reduced[1];
  sums.samples = reduced[2];
  sums.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - in.start).count();
  const double loss = sums.loss / sums.samples;
  warn_comm_share(in);
  if (pg_.rank() == 0) {
    const auto fields = interval_fields(in, state, sums);
    if (events_) {
      for (const auto& f : fields)
        if (f.tag != nullptr) events_->scalar(f.tag, f.value, state.step);
      events_->flush();
    }
    record("%s", json_record(fields).c_str());
    const std::string rest = console_line(fields);  // after step, epoch and loss
    last_loss_ = loss;
    if (!bar()) {
      spdlog::info("step {}/{} epoch {} loss {:.5f} {}", state.step, total_steps, state.epoch + 1,
                   loss, rest);
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
  if (bar()) {  // the log line takes the progress line's place
    std::printf("\r\033[K");
    std::fflush(stdout);
  }
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
