// PowerSGD as a comm hook: the algorithm is PyTorch's powerSGD_hook, step
// for step (ddp/powersgd.h), so that the same state and gradients give the
// same bits; the exchange is re-cut into two stages the Reducer orders.
#include "lockstep/ddp/powersgd.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>
#include <vector>

#include "lockstep/util/error.h"

namespace lockstep {
namespace {

// One compressed iteration of one bucket, alive until its finish().
struct Round {
  at::Tensor input;                      // the bucket
  at::Tensor input_cp;                   // with error feedback: the bucket after adding the error
  at::Tensor wire;                       // [uncompressed gradients | Ps]: the first all-reduce
  at::Tensor q_memory;                   // the Qs: the second all-reduce
  std::vector<at::Tensor> uncompressed;  // slots of `input`
  std::vector<at::Tensor> batches;       // [b, n, m]: views of `input` unless stacked
  std::vector<std::vector<at::Tensor>> originals;         // per batch: what was stacked
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (contiguous copy, its gradient)
  std::vector<at::Tensor> ps, qs;                         // [b, n, r] / [b, m, r]
  int64_t world = 1;
};

void gram_schmidt(at::Tensor& matrices, double epsilon) {
  const int64_t cols = matrices.size(2);
  for (int64_t i = 0; i < cols; ++i) {
    auto col = matrices.narrow(2, i, 1);
    const auto norm = at::norm(col, 2, {1}, /*keepdim=*/true);
    if (epsilon == 0) {
      col.div_(norm);
      // PyTorch means to recover zeros here (ddp/powersgd.h); a zero column
      // divided by its zero norm is NaN, which would reach the weights.
      col.masked_fill_(norm.eq(0), 0);
    } else {
      col.div_(norm + epsilon);
    }
    if (i + 1 < cols) {
      auto rest = matrices.narrow(2, i + 1, cols - i - 1);
      rest.sub_(at::sum(col * rest, {1}, /*keepdim=*/true) * col);
    }
  }
}

// `slot`, reallocated only when it does not fit `like` (numel elements;
// like's own when -1): per-bucket buffers are not allocated at every step
// (a fresh large allocation costs its page faults each time).
at::Tensor reuse(at::Tensor& slot, const at::Tensor& like, int64_t numel = -1) {
  if (numel < 0) numel = like.numel();
  if (!slot.defined() || slot.numel() != numel || slot.device() != like.device() ||
      slot.scalar_type() != like.scalar_type()) {
    slot = at::empty({numel}, like.options());
  }
  return slot;
}

// One pass and no temporary: a sum of float32 (or 16-bit) values in double
// cannot overflow, and carries any inf or NaN; float64 is checked elementwise.
bool all_finite(const at::Tensor& t) {
  if (t.numel() == 0) return true;
  if (t.scalar_type() == at::kDouble) return at::isfinite(t).all().item<bool>();
  return std::isfinite(t.sum(at::kDouble).item<double>());
}

std::string rng_text(const std::mt19937& engine) {
  std::ostringstream out;
  out << engine;
  return out.str();
}

at::Tensor text_tensor(const std::string& text) {
  auto t = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
  std::copy(text.begin(), text.end(), t.data_ptr<uint8_t>());
  return t;
}

// Which gradients to compress, grouped by shape in order of appearance
// (PyTorch's shape_to_tensors: the order Qs are drawn and laid out in), and
// the sizes of the two exchanges.
struct Compression {
  std::vector<std::pair<std::vector<int64_t>, std::vector<at::Tensor>>> groups;
  int64_t ps_size = 0, qs_size = 0, uncompressed_numel = 0;
};

// Splits the bucket's gradients into compressed (grouped by shape) and
// uncompressed ones (round.uncompressed), counting both in `stats`.
Compression group_gradients(const GradBucket& bucket, const PowerSgdOptions& o,
                            PowerSgdStats& stats, Round& round) {
  Compression c;
  const int64_t r_max = o.matrix_approximation_rank;
  for (size_t i = 0; i < bucket.gradients.size(); ++i) {
    const auto& g = bucket.gradients[i];
    const int64_t numel = g.numel();
    const int64_t n = g.dim() == 0 ? 1 : g.size(0);
    const int64_t m = n == 0 ? 0 : numel / n;
    auto slot = round.input.narrow(0, bucket.offsets[i], numel);
    const int64_t r = std::min({n, m, r_max});
    const int64_t compressed = (n + m) * r;
    stats.numel_before += numel;
    if (static_cast<double>(compressed) * o.min_compression_rate < static_cast<double>(numel)) {
      stats.numel_after += compressed;
      c.ps_size += n * r;
      c.qs_size += m * r;
      const std::vector<int64_t> shape{n, m};
      auto group = std::find_if(c.groups.begin(), c.groups.end(),
                                [&](const auto& entry) { return entry.first == shape; });
      if (group == c.groups.end()) {
        c.groups.push_back({shape, {}});
        group = std::prev(c.groups.end());
      }
      // Rows of the parameter's first dimension: the bucket slot where that
      // dimension is outermost in memory (contiguous, channels_last), else a
      // contiguous copy of the logical matrix (a transposed weight).
      if (g.dim() == 0 || g.stride(0) * n == numel || n == 1) {
        group->second.push_back(slot.view({n, m}));
      } else {
        auto copy = g.contiguous().view({n, m});
        round.copies.emplace_back(copy, g);
        group->second.push_back(copy);
      }
    } else {
      stats.numel_after += numel;
      round.uncompressed.push_back(slot);
      c.uncompressed_numel += numel;
    }
  }
  return c;
}

// The uncompressed gradients, back to back at the start of the first
// exchange's buffer (the Ps follow them).
void pack_uncompressed(Round& round) {
  int64_t at_u = 0;
  for (const auto& u : round.uncompressed) {
    round.wire.narrow(0, at_u, u.numel()).copy_(u);
    at_u += u.numel();
  }
}

// The batches [b, n, m] of each shape (all its matrices stacked with
// batch_tensors_with_same_shape, else one each) and their Ps and Qs: views
// of the first exchange's buffer and of the Q memory.
void lay_out_batches(Round& round, const Compression& c, const PowerSgdOptions& o) {
  auto p_memory = round.wire.narrow(0, c.uncompressed_numel, c.ps_size);
  const int64_t r_max = o.matrix_approximation_rank;
  int64_t p_at = 0, q_at = 0;
  for (const auto& [shape, matrices] : c.groups) {
    std::vector<at::Tensor> batch_list;
    if (o.batch_tensors_with_same_shape) {
      batch_list.push_back(matrices.size() == 1 ? matrices[0].unsqueeze(0) : at::stack(matrices));
      round.originals.push_back(matrices.size() == 1 ? std::vector<at::Tensor>{} : matrices);
    } else {
      for (const auto& matrix : matrices) {
        batch_list.push_back(matrix.unsqueeze(0));
        round.originals.emplace_back();
      }
    }
    for (auto& batch : batch_list) {
      const int64_t count = batch.size(0), n = batch.size(1), m = batch.size(2);
      const int64_t r = std::min({n, m, r_max});
      round.ps.push_back(p_memory.narrow(0, p_at, count * n * r).view({count, n, r}));
      round.qs.push_back(round.q_memory.narrow(0, q_at, count * m * r).view({count, m, r}));
      p_at += count * n * r;
      q_at += count * m * r;
      round.batches.push_back(batch);
    }
  }
}

// Between the exchanges: the uncompressed gradients back into the bucket, P
// orthogonalised, Q = M^T P.
void q_from_p(Round& round, double epsilon) {
  // The uncompressed gradients: summed, divided, back into the bucket.
  int64_t at = 0;
  for (auto& u : round.uncompressed) {
    u.copy_(round.wire.narrow(0, at, u.numel()).div_(round.world));
    at += u.numel();
  }
  for (auto& p : round.ps) powersgd_orthogonalize(p, epsilon);
  for (size_t k = 0; k < round.batches.size(); ++k) {
    at::bmm_out(round.qs[k], round.batches[k].transpose(1, 2), round.ps[k]);
  }
}

// After the second exchange: Q averaged, M = P Q^T back into the bucket (and
// into the stacked matrices and the copied gradients).
void decompress(Round& round) {
  round.q_memory.div_(round.world);
  for (size_t k = 0; k < round.batches.size(); ++k) {
    at::bmm_out(round.batches[k], round.ps[k], round.qs[k].transpose(1, 2));
    const auto& originals = round.originals[k];
    for (size_t i = 0; i < originals.size(); ++i) {
      originals[i].copy_(round.batches[k][static_cast<int64_t>(i)]);
    }
  }
  for (auto& [copy, gradient] : round.copies) gradient.copy_(copy.view(gradient.sizes()));
}

}  // namespace

void powersgd_orthogonalize(at::Tensor& matrices, double epsilon) {
  const auto type = matrices.scalar_type();
  if (matrices.size(2) <= 2 || type == at::kHalf || type == at::kBFloat16) {
    gram_schmidt(matrices, epsilon);
  } else {
    matrices.copy_(std::get<0>(at::linalg_qr(matrices)));
  }
}

void powersgd_validate(const PowerSgdOptions& o) {
  if (o.matrix_approximation_rank < 1) {
    throw ConfigError("ddp.powersgd.rank: must be at least 1, got " +
                      std::to_string(o.matrix_approximation_rank));
  }
  if (o.start_iter < 0) {
    throw ConfigError("ddp.powersgd.start_iter: must not be negative, got " +
                      std::to_string(o.start_iter));
  }
  if ((o.use_error_feedback || o.warm_start) && o.start_iter <= 1) {
    throw ConfigError(
        "ddp.powersgd.start_iter: must be at least 2 with error_feedback or warm_start, got " +
        std::to_string(o.start_iter) +
        " (the buckets are rebuilt after the first iteration, and that state is kept per "
        "bucket; PyTorch refuses it too)");
  }
  if (!(o.min_compression_rate >= 0)) {
    throw ConfigError("ddp.powersgd.min_compression_rate: must not be negative");
  }
  if (!(o.orthogonalization_epsilon >= 0)) {
    throw ConfigError("ddp.powersgd orthogonalization_epsilon: must not be negative");
  }
}

PowerSgdHook::PowerSgdHook(PowerSgdOptions options)
    : options_(options), engine_(options.random_seed) {
  powersgd_validate(options_);
}

PowerSgdStats PowerSgdHook::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

uint32_t numpy_randint_1e9(std::mt19937& engine) {
  // tests/ddp/test_powersgd.cpp holds numpy's first draws.
  uint32_t value = 0;
  do {
    value = static_cast<uint32_t>(engine()) & 0x3FFFFFFFu;
  } while (value > 999999999u);
  return value;
}

int64_t PowerSgdHook::next_seed() {
  return numpy_randint_1e9(engine_);
}

void PowerSgdHook::end_of_bucket(bool last) {
  if (last) {
    ++iter_;
    stats_.iter = iter_;
    if (iter_ == options_.start_iter) {
      spdlog::debug("powersgd: compression starts after {} iterations", iter_);
    }
  }
}

void PowerSgdHook::check_supported(ProcessGroup&) {
  std::lock_guard<std::mutex> lock(mu_);
  if (attached_) {
    throw UsageError(
        "comm hook 'powersgd' is already used by another DistributedDataParallel: its state is "
        "per bucket, so give each its own hook (comm_hook_create), and load_state_dict to carry "
        "state over");
  }
  attached_ = true;
}

HookWork PowerSgdHook::run_bucket(ProcessGroup& pg, GradBucket& bucket) {
  std::lock_guard<std::mutex> lock(mu_);
  if (iter_ < options_.start_iter) return run_plain(pg, bucket);
  return run_compressed(pg, bucket);
}

HookWork PowerSgdHook::run_plain(ProcessGroup& pg, GradBucket& bucket) {
  end_of_bucket(bucket.is_last());
  // PyTorch's _allreduce_fut: divide, then SUM.
  bucket.buffer.div_(pg.size());
  return {pg.allreduce_async(bucket.buffer, ReduceKind::kSum), nullptr, nullptr,
          static_cast<int64_t>(bucket.buffer.nbytes())};
}

// A bucket holding other parameters than its state was made for (a resumed
// DDP before its bucket rebuild) drops its error and Q.
void PowerSgdHook::match_layout(const GradBucket& bucket) {
  const size_t b = bucket.index;
  const auto layout = at::tensor(bucket.params, at::kLong);
  auto known = layout_.find(b);
  if (known == layout_.end() || !known->second.equal(layout)) {
    if (known != layout_.end() && layout_loaded_[b]) {
      spdlog::warn(
          "powersgd: bucket {} holds other parameters than its saved state: its error "
          "and Q start over",
          b);
    }
    error_.erase(b);
    q_.erase(b);
    layout_[b] = layout;
    layout_loaded_[b] = false;
  }
}

// Adds bucket b's error to `input` (zeros when it has none of its size) and
// returns a copy of the sum, kept for the next error.
at::Tensor PowerSgdHook::add_error(size_t b, const at::Tensor& input) {
  auto it = error_.find(b);
  if (it != error_.end() && it->second.sizes() == input.sizes()) {
    if (it->second.device() != input.device()) it->second = it->second.to(input.device());
    input.add_(it->second);
  } else {
    if (it != error_.end()) {
      spdlog::warn("powersgd: bucket {}'s saved error has {} elements, the bucket {}: restarted", b,
                   it->second.numel(), input.numel());
    }
    error_[b] = at::zeros_like(input);
  }
  at::Tensor input_cp = reuse(copy_[b], input);
  input_cp.copy_(input);
  return input_cp;
}

// q_[b] as this step's Q memory: the last step's with warm_start when it
// has `numel` elements, else new; returns whether it is new (to be drawn).
bool PowerSgdHook::claim_q(size_t b, int64_t numel, const at::Tensor& like) {
  auto q_it = q_.find(b);
  if (options_.warm_start && q_it != q_.end() && q_it->second.numel() == numel) {
    auto& q = q_it->second;  // restored from a checkpoint: on the CPU until now
    if (q.device() != like.device() || q.scalar_type() != like.scalar_type()) {
      q = q.to(like.options());
    }
    return false;
  }
  q_[b] = at::empty({numel}, like.options());
  return true;
}

// The Qs orthogonalised, drawn first when `randomize`.
void PowerSgdHook::start_qs(std::vector<at::Tensor>& qs, bool randomize, at::ScalarType type) {
  if (!randomize) {
    for (auto& q : qs) powersgd_orthogonalize(q, options_.orthogonalization_epsilon);
  } else {
    // PyTorch: torch.manual_seed(state.rng.randint(1e9)) in a forked RNG,
    // then torch.randn per Q on the CPU.
    auto generator = at::make_generator<at::CPUGeneratorImpl>(next_seed());
    for (auto& q : qs) {
      q.copy_(at::randn(q.sizes(), generator, at::TensorOptions(type)));
      powersgd_orthogonalize(q, options_.orthogonalization_epsilon);
    }
  }
}

// The state for bucket b's next step: its error (the bucket before
// compression less after) and Q; then the bucket counts as done.
void PowerSgdHook::keep_state(size_t b, const at::Tensor& input, const at::Tensor& input_cp,
                              bool q_finite, bool last) {
  std::lock_guard<std::mutex> lock(mu_);
  if (options_.use_error_feedback) {
    auto& error = error_[b];
    if (error.defined() && error.sizes() == input.sizes() && error.device() == input.device()) {
      at::sub_out(error, input_cp, input);
    } else {
      error = input_cp - input;
    }
    if (!all_finite(error)) error.zero_();
  }
  if (!options_.warm_start) {
    q_.clear();
  } else if (!q_finite) {
    q_.erase(b);
  }
  end_of_bucket(last);
}

HookWork PowerSgdHook::run_compressed(ProcessGroup& pg, GradBucket& bucket) {
  at::NoGradGuard no_grad;
  auto round = std::make_shared<Round>();
  round->input = bucket.buffer;
  round->world = pg.size();
  const at::Tensor& input = round->input;
  const size_t b = bucket.index;
  match_layout(bucket);
  if (options_.use_error_feedback) round->input_cp = add_error(b, input);
  const Compression c = group_gradients(bucket, options_, stats_, *round);
  const bool randomize = claim_q(b, c.qs_size, input);
  round->q_memory = q_[b];
  round->wire = reuse(wire_[b], input, c.uncompressed_numel + c.ps_size);
  pack_uncompressed(*round);
  lay_out_batches(*round, c, options_);
  start_qs(round->qs, randomize, input.scalar_type());
  for (size_t k = 0; k < round->batches.size(); ++k) {
    at::bmm_out(round->ps[k], round->batches[k], round->qs[k]);
  }

  HookWork out;
  out.work = pg.allreduce_async(round->wire, ReduceKind::kSum);
  out.bytes = static_cast<int64_t>(round->wire.nbytes());
  const double epsilon = options_.orthogonalization_epsilon;
  out.then = [this, round, epsilon, &pg, bucket_index = b, last = bucket.is_last()]() {
    at::NoGradGuard no_grad;
    q_from_p(*round, epsilon);
    HookWork second;
    second.work = pg.allreduce_async(round->q_memory, ReduceKind::kSum);
    second.bytes = static_cast<int64_t>(round->q_memory.nbytes());
    second.finish = [this, round, bucket_index, last]() {
      at::NoGradGuard no_grad;
      decompress(*round);
      // All-reduced: every rank sees the same and drops it alike.
      const bool q_finite = all_finite(round->q_memory);
      keep_state(bucket_index, round->input, round->input_cp, q_finite, last);
    };
    return second;
  };
  return out;
}

HookState PowerSgdHook::state_dict() const {
  std::lock_guard<std::mutex> lock(mu_);
  HookState state;
  state.emplace_back("iter", at::scalar_tensor(static_cast<int64_t>(iter_), at::kLong));
  state.emplace_back(
      "rank",
      at::scalar_tensor(static_cast<int64_t>(options_.matrix_approximation_rank), at::kLong));
  state.emplace_back("rng", text_tensor(rng_text(engine_)));
  for (const auto& [b, l] : layout_) state.emplace_back("layout." + std::to_string(b), l);
  // Copies: the live buffers change in place at every step.
  for (const auto& [b, e] : error_)
    state.emplace_back("error." + std::to_string(b), e.cpu().clone());
  for (const auto& [b, q] : q_) state.emplace_back("q." + std::to_string(b), q.cpu().clone());
  return state;
}

void PowerSgdHook::load_state_dict(const HookState& state, const std::string& source) {
  std::lock_guard<std::mutex> lock(mu_);
  auto bad = [&](const std::string& what) {
    return DataError(source + ": PowerSGD state: " + what);
  };
  int64_t iter = -1;
  std::mt19937 engine(options_.random_seed);
  bool has_rng = false;
  int64_t rank = -1;
  std::map<size_t, at::Tensor> error, q, layout;
  for (const auto& [key, t] : state) {
    if (key == "iter" || key == "rank") {
      if (t.numel() != 1 || t.scalar_type() != at::kLong)
        throw bad("'" + key + "' is not one int64");
      (key == "iter" ? iter : rank) = t.item<int64_t>();
    } else if (key == "rng") {
      if (t.dim() != 1 || t.scalar_type() != at::kByte || t.numel() > 16384) {
        throw bad("'rng' is not a byte string of at most 16 KiB");
      }
      const auto c = t.contiguous();
      std::istringstream in(std::string(c.data_ptr<uint8_t>(), c.data_ptr<uint8_t>() + c.numel()));
      in >> engine;
      if (in.fail()) throw bad("'rng' is not an MT19937 state");
      has_rng = true;
    } else if (key.rfind("error.", 0) == 0 || key.rfind("q.", 0) == 0 ||
               key.rfind("layout.", 0) == 0) {
      const std::string kind = key.substr(0, key.find('.'));
      const std::string digits = key.substr(kind.size() + 1);
      if (digits.empty() || digits.size() > 6 ||
          digits.find_first_not_of("0123456789") != std::string::npos) {
        throw bad("'" + key + "' does not name a bucket");
      }
      const bool is_layout = kind == "layout";
      if (t.dim() != 1 ||
          (is_layout ? t.scalar_type() != at::kLong : !at::isFloatingType(t.scalar_type()))) {
        throw bad("'" + key + "' is not a 1-D " + (is_layout ? "int64" : "floating-point") +
                  " tensor");
      }
      (kind == "error" ? error : kind == "q" ? q : layout)[std::stoul(digits)] = t;
    } else {
      throw bad("unexpected entry '" + key + "'");
    }
  }
  if (iter < 0 || !has_rng) throw bad("'iter' or 'rng' is missing");
  if (iter > static_cast<int64_t>(1e15)) throw bad("'iter' is over 1e15");
  if (rank != options_.matrix_approximation_rank) {
    spdlog::warn("{}: PowerSGD ran with rank {}, now {}: Q is drawn afresh", source, rank,
                 options_.matrix_approximation_rank);
    q.clear();
  }
  iter_ = iter;
  stats_.iter = iter;
  engine_ = engine;
  error_.clear();
  q_.clear();
  layout_.clear();
  layout_loaded_.clear();
  for (auto& [b, l] : layout) {
    layout_[b] = l.clone();
    layout_loaded_[b] = true;
  }
  // On the CPU until the first bucket: run_compressed moves them to its device.
  for (auto& [b, e] : error) error_[b] = e.clone();
  for (auto& [b, t] : q) q_[b] = t.clone();
}

}  // namespace lockstep
