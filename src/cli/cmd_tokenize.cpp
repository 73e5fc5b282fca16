// `lockstep tokenize INPUT... --out DIR`: text files (or folders of them)
// as byte-level BPE tokens (GPT-2's, Llama 3's) in nanoGPT's train.bin/
// val.bin (uint16) or llm.c's header format (uint16, or uint32 for Llama 3),
// streamed (Note [Streamed tokenizing]) and on every core.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "common.h"
#include "lockstep/data/bpe.h"
#include "lockstep/data/tokens.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"

// Note [Streamed tokenizing]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The input is read in chunks of about 1 MiB, each ending at a safe cut
// (bpe_safe_cut: before an ASCII space or tab, and for GPT-2's pattern a
// line end, that follows a character other than a space, or for Llama 3's
// after a line end that a character other than a space follows: where the pre-tokenizer
// starts afresh; when no cut comes after a chunk's worth, the last one
// before it),
// so that chunks encode
// independently, on as many threads as --threads, and are written in
// order. At most 2 x threads chunks are in memory: memory does not grow with
// the input, only with its longest stretch without a safe cut (refused past
// 8 MiB). Files end chunks too (with --eot, each file's tokens are followed
// by <|endoftext|>, as nanoGPT's prepare.py does per document). The split:
// the input's last --val-fraction of bytes, from the first safe cut there,
// go to val.bin.

namespace lockstep::cli {
namespace {

constexpr size_t kChunkBytes = size_t{1} << 20;
constexpr size_t kMaxUncut = size_t{8}
                             << 20;  // bounds the longest piece (~45 bytes of work memory per byte)

std::vector<std::string> input_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    struct stat info {};
    if (stat(in.c_str(), &info) != 0) throw ConfigError("input '" + in + "' does not exist");
    if (S_ISDIR(info.st_mode)) {
      std::vector<std::string> inside;
      for (const auto& entry : std::filesystem::recursive_directory_iterator(in)) {
        if (entry.is_regular_file()) inside.push_back(entry.path().string());
      }
      std::sort(inside.begin(), inside.end());
      if (inside.empty()) throw ConfigError("input folder '" + in + "' holds no files");
      files.insert(files.end(), inside.begin(), inside.end());
    } else if (S_ISREG(info.st_mode)) {
      files.push_back(in);
    } else {
      throw ConfigError("input '" + in + "' is neither a file nor a folder");
    }
  }
  return files;
}

class TokenWriter {
 public:
  // Written as PATH.tmp and renamed by finish(): a failed run leaves no
  // train.bin or val.bin behind (nor anything a rerun would refuse).
  // `wide`: uint32 tokens under llm.c's Llama 3 header, else uint16.
  TokenWriter(const std::string& path, bool llmc, bool wide)
      : path_(path), tmp_(path + ".tmp"), llmc_(llmc), width_(wide ? 4 : 2), file_(tmp_) {
    if (llmc_) {
      const std::vector<char> header(256 * 4, 0);
      file_.append(header.data(), header.size());
    }
  }
  void append(const std::vector<int32_t>& ids) {
    buffer_.resize(ids.size() * width_);
    for (size_t k = 0; k < ids.size(); ++k)
      for (size_t b = 0; b < width_; ++b)
        buffer_[width_ * k + b] =
            static_cast<char>((static_cast<uint32_t>(ids[k]) >> (8 * b)) & 0xFF);
    file_.append(buffer_.data(), buffer_.size());
    count_ += static_cast<int64_t>(ids.size());
  }
  ~TokenWriter() {
    if (!renamed_) std::remove(tmp_.c_str());
  }
  void finish() {
    file_.finish();
    write_header();
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
      throw StorageError("cannot rename '" + tmp_ + "' to '" + path_ + "'");
    renamed_ = true;
  }
  void write_header() {
    if (!llmc_) return;
    if (count_ > INT32_MAX)
      throw ConfigError(path_ + ": " + std::to_string(count_) +
                        " tokens, more than llm.c's header can count (2^31 - 1)");
    // llm.c's header: magic 20240520, version 1 (uint16 tokens, GPT-2's) or
    // magic 20240801, version 7 (uint32 tokens, Llama 3's), the count.
    const int32_t head[3] = {width_ == 2 ? 20240520 : 20240801, width_ == 2 ? 1 : 7,
                             static_cast<int32_t>(count_)};
    std::fstream f(tmp_, std::ios::in | std::ios::out | std::ios::binary);
    f.write(reinterpret_cast<const char*>(head), sizeof head);
    f.flush();
    if (!f) throw StorageError("cannot write the header of '" + path_ + "'");
  }
  int64_t count() const { return count_; }

 private:
  std::string path_, tmp_;
  bool llmc_;
  size_t width_;  // bytes a token
  bool renamed_ = false;
  FileWriter file_;
  std::vector<char> buffer_;
  int64_t count_ = 0;
};

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

// The ids of a token file as text. The file is read as training reads it
// (data/tokens.h: nanoGPT's headerless uint16, or either llm.c header, its
// count checked), in pieces: memory stays flat whatever the file's size. An
// empty file (tokenize's val.bin at --val-fraction 0) is no tokens.
int decode_file(const BpeTokenizer& bpe, const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0) return kExitOk;
  const auto file = TokenFile::open(path, TokenFormat::kUint16);
  constexpr int64_t kPiece = 65536;
  std::vector<int64_t> piece(kPiece);
  std::vector<int32_t> ids;
  for (int64_t at = 0; at < file->size(); at += kPiece) {
    const int64_t n = std::min(kPiece, file->size() - at);
    file->read(at, n, piece.data());
    for (int64_t k = 0; k < n; ++k)  // before narrowing: uint32 files hold any id
      if (piece[static_cast<size_t>(k)] < 0 || piece[static_cast<size_t>(k)] >= bpe.vocab_size())
        throw DataError(file->described() + ": token " + std::to_string(at + k) + " is id " +
                        std::to_string(piece[static_cast<size_t>(k)]) +
                        ", outside the vocabulary's " + std::to_string(bpe.vocab_size()));
    ids.assign(piece.begin(), piece.begin() + n);
    const std::string out = bpe.decode(ids);
    if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size()) break;
  }
  if (std::fflush(stdout) != 0 || std::ferror(stdout))
    throw StorageError(std::string("cannot write the decoded text to standard output: ") +
                       std::strerror(errno));
  return kExitOk;
}

// --special: the input is cut only where no name can span the cut (Note
// [Streamed tokenizing]), which holds for names without whitespace.
void check_specials(const BpeTokenizer& bpe) {
  const auto names = bpe.special_names();
  if (names.empty()) throw ConfigError("--special: the vocabulary has no special tokens");
  for (const auto& name : names)
    if (name.find_first_of(" \t\n\r\v\f") != std::string::npos)
      throw ConfigError("--special: the special token '" + shown_name(name) +
                        "' holds whitespace, where lockstep tokenize may cut its input; "
                        "leave --special out (its name is then text)");
}

// What the command line asked for, checked before any file is written.
struct Job {
  std::vector<std::string> files;
  uint64_t total = 0;  // the files' bytes
  std::string out, format;
  double val_fraction = 0;
  bool eot = false;
  bool specials = false;  // --special
  int threads = 1;
};

Job job_from_args(const cxxopts::ParseResult& args, const BpeTokenizer& bpe) {
  Job job;
  if (args.count("inputs") == 0) throw ConfigError("no input: give text files or folders");
  if (args.count("out") == 0) throw ConfigError("--out FOLDER is required");
  job.val_fraction = args["val-fraction"].as<double>();
  if (!(job.val_fraction >= 0 && job.val_fraction < 1))
    throw ConfigError("--val-fraction " + std::to_string(job.val_fraction) + " is outside [0, 1)");
  job.format = args["format"].as<std::string>();
  if (job.format != "nanogpt" && job.format != "llmc")
    throw ConfigError("--format: '" + shown_name(job.format) + "' is not one of nanogpt, llmc");
  if (bpe.vocab_size() > 65536 && job.format != "llmc")
    throw ConfigError("the vocabulary has " + std::to_string(bpe.vocab_size()) +
                      " tokens: more than nanoGPT's uint16 files hold; give --format llmc "
                      "(llm.c's uint32 layout, as for Llama 3)");
  job.eot = args.count("eot") != 0;
  if (job.eot && bpe.end_of_text() < 0)
    throw ConfigError("--eot: the vocabulary has no <|endoftext|> or <|end_of_text|> token");
  job.specials = args.count("special") != 0;
  if (job.specials) check_specials(bpe);
  job.threads = args.count("threads") != 0 ? args["threads"].as<int>()
                                           : static_cast<int>(std::thread::hardware_concurrency());
  if (args.count("threads") != 0 && (job.threads < 1 || job.threads > 1024))
    throw ConfigError("--threads " + std::to_string(job.threads) + " is outside [1, 1024]");
  job.threads = std::max(job.threads, 1);
  job.files = input_files(args["inputs"].as<std::vector<std::string>>());
  for (const auto& f : job.files) job.total += std::filesystem::file_size(f);
  job.out = args["out"].as<std::string>();
  for (const char* name : {"train.bin", "val.bin"}) {
    if (path_exists(job.out + "/" + name))
      throw ConfigError("--out '" + job.out + "' already holds " + name +
                        ": give an empty or new folder (lockstep tokenize overwrites nothing)");
  }
  return job;
}

// Long-lived encoding workers: each keeps its tokenizer's piece cache warm.
// The destructor lets them finish what was submitted, then joins them.
class EncoderPool {
 public:
  // `specials`: special tokens' names in the text become their ids.
  EncoderPool(const BpeTokenizer& bpe, int threads, bool specials)
      : bpe_(bpe), specials_(specials) {
    try {
      for (int w = 0; w < threads; ++w) workers_.emplace_back([this] { work(); });
    } catch (...) {
      close();
      throw;
    }
  }
  ~EncoderPool() { close(); }
  EncoderPool(const EncoderPool&) = delete;
  EncoderPool& operator=(const EncoderPool&) = delete;

  // The ids of `text`, and `eot_id` after them unless it is negative.
  std::future<std::vector<int32_t>> submit(std::string text, int32_t eot_id) {
    Task task{std::move(text), eot_id, {}};
    auto ids = task.done.get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    ready_.notify_one();
    return ids;
  }

 private:
  struct Task {
    std::string text;
    int32_t eot_id;
    std::promise<std::vector<int32_t>> done;
  };

  void work() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [&] { return closing_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      try {
        std::vector<int32_t> ids =
            specials_ ? bpe_.encode_with_specials(task.text) : bpe_.encode(task.text);
        if (task.eot_id >= 0) ids.push_back(task.eot_id);
        task.done.set_value(std::move(ids));
      } catch (...) {
        task.done.set_exception(std::current_exception());
      }
    }
  }

  void close() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closing_ = true;
    }
    ready_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  const BpeTokenizer& bpe_;
  const bool specials_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Task> tasks_;
  bool closing_ = false;
  std::vector<std::thread> workers_;
};

// The encoded chunks written in the order they were cut, at most `window`
// of them in memory, and the progress line on stderr (redrawn on a
// terminal every 250 ms, else a line every 10 s).
class OrderedOutput {
 public:
  OrderedOutput(TokenWriter& train, TokenWriter& val, uint64_t total, size_t window)
      : train_(train), val_(val), total_(total), window_(window) {}

  // Before a chunk is submitted: the oldest is written if the window is full.
  void make_room() {
    if (pending_.size() >= window_) write_oldest();
  }
  void push(std::future<std::vector<int32_t>> ids, bool to_val, uint64_t bytes) {
    pending_.push_back({std::move(ids), to_val, bytes});
  }
  void finish() {
    while (!pending_.empty()) write_oldest();
  }
  double seconds() const {
    return std::max(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(), 1e-9);
  }
  void show(bool final) const {
    const double mb = static_cast<double>(done_bytes_) / 1e6;
    const double share =
        total_ > 0 ? 100.0 * static_cast<double>(done_bytes_) / static_cast<double>(total_) : 100.0;
    std::fprintf(stderr, "%stokenize: %.1f of %.1f MB (%.0f%%), %.1f MB/s, %s tokens%s",
                 tty_ ? "\r" : "", mb, static_cast<double>(total_) / 1e6, share, mb / seconds(),
                 with_commas(train_.count() + val_.count()).c_str(), final || !tty_ ? "\n" : "");
    std::fflush(stderr);
  }

 private:
  struct Pending {
    std::future<std::vector<int32_t>> ids;
    bool to_val;
    uint64_t bytes;
  };

  void write_oldest() {
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    (p.to_val ? val_ : train_).append(p.ids.get());
    done_bytes_ += p.bytes;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_shown_ > std::chrono::milliseconds(tty_ ? 250 : 10000)) {
      last_shown_ = now;
      show(false);
    }
  }

  TokenWriter& train_;
  TokenWriter& val_;
  const uint64_t total_;
  const size_t window_;
  const bool tty_ = isatty(STDERR_FILENO) != 0;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_shown_ = start_;
  uint64_t done_bytes_ = 0;
  std::deque<Pending> pending_;
};

// Cuts the input, file after file, into chunks at safe places (Note
// [Streamed tokenizing]): about kChunkBytes each; a file's end ends a chunk;
// the split to val.bin falls on the first safe cut at or after byte
// `split_at` of the whole input.
class Cutter {
 public:
  using Emit = std::function<void(std::string text, bool to_val, bool end_of_file)>;
  Cutter(const BpeTokenizer& bpe, uint64_t split_at, double val_fraction)
      : bpe_(bpe),
        split_at_(split_at),
        val_fraction_(val_fraction),
        in_val_(val_fraction > 0 && split_at == 0) {}

  void file(const std::string& path, const Emit& emit) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw DataError("cannot read '" + path + "'");
    std::string buffer;
    bool eof = false;
    const auto read_more = [&] {  // up to another chunk's bytes onto the buffer
      const size_t have = buffer.size();
      buffer.resize(have + kChunkBytes);
      in.read(buffer.data() + have, static_cast<std::streamsize>(kChunkBytes));
      buffer.resize(have + static_cast<size_t>(in.gcount()));
      if (in.bad()) throw DataError("cannot read '" + path + "'");
      eof = in.eof();
    };
    while (!eof || !buffer.empty()) {
      if (!eof && buffer.size() < kChunkBytes) {
        read_more();
        if (!eof) continue;
      }
      bool split_here = false;
      size_t cut = next_cut(buffer, eof, split_here);
      if (cut >= buffer.size() && !eof) {
        if (buffer.size() >= kMaxUncut)
          throw DataError(path + ": " + std::to_string(kMaxUncut >> 20) + " MiB from byte " +
                          std::to_string(position_) +
                          " without a space, tab or line end next to other text: lockstep "
                          "tokenize splits its input at such places");
        read_more();
        continue;
      }
      cut = std::min(cut, buffer.size());
      emit(buffer.substr(0, cut), in_val_, eof && cut == buffer.size());
      position_ += cut;
      buffer.erase(0, cut);
      if (split_here) in_val_ = true;
    }
  }

 private:
  // The next cut in `buffer`: the split when it falls here, else about a
  // chunk on; when there is none from there on (yet), the last one before,
  // so that what the buffer keeps is one stretch without a cut; 0 or
  // buffer.size() when there is no safe place at all.
  size_t next_cut(const std::string& buffer, bool eof, bool& split_here) const {
    const bool splitting = !in_val_ && val_fraction_ > 0 && position_ + buffer.size() > split_at_;
    const size_t from = splitting
                            ? static_cast<size_t>(split_at_ > position_ ? split_at_ - position_ : 0)
                            : std::min(buffer.size(), kChunkBytes);
    const size_t cut = bpe_.safe_cut(buffer, from);
    if (cut < buffer.size() || eof) {
      split_here = splitting;
      return cut;
    }
    size_t last = 0;
    for (size_t p = bpe_.safe_cut(buffer, 1); p < from; p = bpe_.safe_cut(buffer, p + 1)) last = p;
    return last > 0 ? last : buffer.size();
  }

  const BpeTokenizer& bpe_;
  const uint64_t split_at_;
  const double val_fraction_;
  bool in_val_;
  uint64_t position_ = 0;  // bytes of the input before the buffer
};

int tokenize(const Job& job, const BpeTokenizer& bpe) {
  make_directories(job.out);
  const bool llmc = job.format == "llmc";
  const bool wide = bpe.vocab_size() > 65536;
  TokenWriter train(job.out + "/train.bin", llmc, wide), val(job.out + "/val.bin", llmc, wide);
  OrderedOutput output(train, val, job.total, static_cast<size_t>(2 * job.threads));
  {
    EncoderPool pool(bpe, job.threads, job.specials);  // joined before the output goes
    Cutter cutter(bpe,
                  static_cast<uint64_t>(static_cast<double>(job.total) * (1 - job.val_fraction)),
                  job.val_fraction);
    const int32_t eot_id = job.eot ? bpe.end_of_text() : -1;
    const auto emit = [&](std::string text, bool to_val, bool end_of_file) {
      output.make_room();
      const uint64_t bytes = text.size();
      output.push(pool.submit(std::move(text), end_of_file ? eot_id : -1), to_val, bytes);
    };
    for (const auto& path : job.files) cutter.file(path, emit);
    output.finish();
  }
  train.finish();
  val.finish();
  if (job.val_fraction > 0 && val.count() == 0)
    std::fprintf(stderr,
                 "tokenize: WARNING: no place to split in the input's last %.0f%% (no space or "
                 "line end after other text there): val.bin is empty\n",
                 100 * job.val_fraction);
  output.show(true);
  const double s = output.seconds();
  std::fprintf(stderr,
               "tokenize: %s bytes in %zu file(s) -> %s tokens (%s in %s/train.bin, %s in "
               "%s/val.bin), %.2f s, %.1f MB/s on %d thread(s), %s format\n",
               with_commas(static_cast<int64_t>(job.total)).c_str(), job.files.size(),
               with_commas(train.count() + val.count()).c_str(), with_commas(train.count()).c_str(),
               job.out.c_str(), with_commas(val.count()).c_str(), job.out.c_str(), s,
               static_cast<double>(job.total) / 1e6 / s, job.threads, job.format.c_str());
  return kExitOk;
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  return run_guarded("tokenize", [&] {
    cxxopts::Options options(
        "lockstep tokenize",
        "Tokenizes text files with a byte-level BPE (GPT-2's, Llama 3's) into nanoGPT's "
        "train.bin/val.bin (uint16) or llm.c's format (uint16, or uint32 for vocabularies over "
        "65,536 tokens).");
    // clang-format off
    options.add_options()
        ("inputs", "text files or folders (every file inside, in name order)", cxxopts::value<std::vector<std::string>>())
        ("out", "the folder to write train.bin and val.bin into", cxxopts::value<std::string>())
        ("vocab", "gpt2 (GPT-2's, installed by scripts/setup.sh; the default), a tokenizer.json, a rank file (.tiktoken, Llama 3's tokenizer.model) or a folder with one of these or encoder.json and vocab.bpe", cxxopts::value<std::string>())
        ("val-fraction", "the input's last share of bytes that goes to val.bin", cxxopts::value<double>()->default_value("0.1"))
        ("format", "nanogpt: raw uint16; llmc: llm.c's 1 KiB header (magic 20240520, version 1), then uint16; over 65,536 tokens magic 20240801, version 7, then uint32", cxxopts::value<std::string>()->default_value("nanogpt"))
        ("eot", "append <|endoftext|> (Llama 3: <|end_of_text|>) after each file's tokens")
        ("special", "read special tokens' names in the text as their ids (chat templates: <|start_header_id|>...); without it they are text")
        ("threads", "encoding threads (default: every core)", cxxopts::value<int>())
        ("decode", "print the text of a .bin file of token ids instead", cxxopts::value<std::string>());
    // clang-format on
    options.parse_positional({"inputs"});
    options.positional_help("INPUT...");
    const auto parsed = parse_command_line(options, argc, argv);
    if (!parsed) return kExitOk;
    const cxxopts::ParseResult& args = *parsed;
    const std::string vocab =
        bpe_vocab_folder(args.count("vocab") != 0 ? args["vocab"].as<std::string>() : "gpt2");
    const BpeTokenizer bpe = BpeTokenizer::load(vocab);
    if (args.count("decode") != 0) return decode_file(bpe, args["decode"].as<std::string>());
    return tokenize(job_from_args(args, bpe), bpe);
  });
}

}  // namespace lockstep::cli
