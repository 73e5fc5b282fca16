// `lockstep tokenize INPUT... --out DIR`: text files (or folders of them)
// as GPT-2 BPE tokens in nanoGPT's train.bin/val.bin (uint16) or llm.c's
// header format, streamed (Note [Streamed tokenizing]) and on every core.
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
// (gpt2_safe_cut: before an ASCII space, tab or line end that follows a
// character other than a space, where GPT-2's pre-tokenizer starts afresh),
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
  TokenWriter(const std::string& path, bool llmc)
      : path_(path), tmp_(path + ".tmp"), llmc_(llmc), file_(tmp_) {
    if (llmc_) {
      const std::vector<char> header(256 * 4, 0);
      file_.append(header.data(), header.size());
    }
  }
  void append(const std::vector<int32_t>& ids) {
    buffer_.resize(ids.size() * 2);
    for (size_t k = 0; k < ids.size(); ++k) {
      buffer_[2 * k] = static_cast<char>(ids[k] & 0xFF);
      buffer_[2 * k + 1] = static_cast<char>((ids[k] >> 8) & 0xFF);
    }
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
    // llm.c's header: magic 20240520, version 1 (uint16 tokens), the count.
    const int32_t head[3] = {20240520, 1, static_cast<int32_t>(count_)};
    std::fstream f(tmp_, std::ios::in | std::ios::out | std::ios::binary);
    f.write(reinterpret_cast<const char*>(head), sizeof head);
    f.flush();
    if (!f) throw StorageError("cannot write the header of '" + path_ + "'");
  }
  int64_t count() const { return count_; }

 private:
  std::string path_, tmp_;
  bool llmc_;
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
int decode_file(const Gpt2Bpe& bpe, const std::string& path) {
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

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  return run_guarded("tokenize", [&] {
    cxxopts::Options options(
        "lockstep tokenize",
        "Tokenizes text files with GPT-2's byte-level BPE into nanoGPT's train.bin/val.bin "
        "(uint16) or llm.c's format.");
    // clang-format off
    options.add_options()
        ("inputs", "text files or folders (every file inside, in name order)", cxxopts::value<std::vector<std::string>>())
        ("out", "the folder to write train.bin and val.bin into", cxxopts::value<std::string>())
        ("vocab", "gpt2 (GPT-2's, installed by scripts/setup.sh; the default) or a folder with encoder.json and vocab.bpe", cxxopts::value<std::string>())
        ("val-fraction", "the input's last share of bytes that goes to val.bin", cxxopts::value<double>()->default_value("0.1"))
        ("format", "nanogpt: raw uint16; llmc: llm.c's 1 KiB header (magic 20240520, version 1), then uint16", cxxopts::value<std::string>()->default_value("nanogpt"))
        ("eot", "append <|endoftext|> after each file's tokens")
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
    const Gpt2Bpe bpe = Gpt2Bpe::load(vocab);
    if (args.count("decode") != 0) return decode_file(bpe, args["decode"].as<std::string>());
    if (args.count("inputs") == 0) throw ConfigError("no input: give text files or folders");
    if (args.count("out") == 0) throw ConfigError("--out FOLDER is required");
    const double val_fraction = args["val-fraction"].as<double>();
    if (!(val_fraction >= 0 && val_fraction < 1))
      throw ConfigError("--val-fraction " + std::to_string(val_fraction) + " is outside [0, 1)");
    const std::string format = args["format"].as<std::string>();
    if (format != "nanogpt" && format != "llmc")
      throw ConfigError("--format: '" + shown_name(format) + "' is not one of nanogpt, llmc");
    if (bpe.vocab_size() > 65536)
      throw ConfigError("the vocabulary has " + std::to_string(bpe.vocab_size()) +
                        " tokens: more than uint16 token files hold");
    const bool eot = args.count("eot") != 0;
    if (eot && bpe.end_of_text() < 0)
      throw ConfigError("--eot: the vocabulary has no <|endoftext|> token");
    int threads = args.count("threads") != 0
                      ? args["threads"].as<int>()
                      : static_cast<int>(std::thread::hardware_concurrency());
    if (args.count("threads") != 0 && (threads < 1 || threads > 1024))
      throw ConfigError("--threads " + std::to_string(threads) + " is outside [1, 1024]");
    threads = std::max(threads, 1);
    const auto files = input_files(args["inputs"].as<std::vector<std::string>>());
    uint64_t total = 0;
    for (const auto& f : files) total += std::filesystem::file_size(f);
    const std::string out = args["out"].as<std::string>();
    for (const char* name : {"train.bin", "val.bin"}) {
      if (path_exists(out + "/" + name))
        throw ConfigError("--out '" + out + "' already holds " + name +
                          ": give an empty or new folder (lockstep tokenize overwrites nothing)");
    }
    make_directories(out);
    const bool llmc = format == "llmc";
    TokenWriter train(out + "/train.bin", llmc), val(out + "/val.bin", llmc);
    const uint64_t split_at =
        static_cast<uint64_t>(static_cast<double>(total) * (1 - val_fraction));
    const bool tty = isatty(STDERR_FILENO) != 0;
    const auto start = std::chrono::steady_clock::now();
    auto last_shown = start;
    uint64_t done_bytes = 0;
    const auto seconds = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    const auto show = [&](bool final) {
      const double s = std::max(seconds(), 1e-9);
      const double mb = static_cast<double>(done_bytes) / 1e6;
      std::fprintf(
          stderr, "%stokenize: %.1f of %.1f MB (%.0f%%), %.1f MB/s, %s tokens%s", tty ? "\r" : "",
          mb, static_cast<double>(total) / 1e6,
          total > 0 ? 100.0 * static_cast<double>(done_bytes) / static_cast<double>(total) : 100.0,
          mb / s, with_commas(train.count() + val.count()).c_str(), final || !tty ? "\n" : "");
      std::fflush(stderr);
    };

    struct Pending {
      std::future<std::vector<int32_t>> ids;
      bool to_val;
      uint64_t bytes;
    };
    std::deque<Pending> pending;
    const auto drain_one = [&] {
      Pending p = std::move(pending.front());
      pending.pop_front();
      const auto ids = p.ids.get();
      (p.to_val ? val : train).append(ids);
      done_bytes += p.bytes;
      const auto now = std::chrono::steady_clock::now();
      if (now - last_shown > std::chrono::milliseconds(tty ? 250 : 10000)) {
        last_shown = now;
        show(false);
      }
    };
    // A pool of long-lived workers: each keeps its tokenizer cache warm.
    struct Task {
      std::string text;
      int32_t eot_id;
      std::promise<std::vector<int32_t>> done;
    };
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<Task> tasks;
    bool closing = false;
    std::vector<std::thread> workers;
    for (int w = 0; w < threads; ++w) {
      workers.emplace_back([&] {
        for (;;) {
          Task task;
          {
            std::unique_lock<std::mutex> lock(mutex);
            ready.wait(lock, [&] { return closing || !tasks.empty(); });
            if (tasks.empty()) return;
            task = std::move(tasks.front());
            tasks.pop_front();
          }
          try {
            std::vector<int32_t> ids = bpe.encode(task.text);
            if (task.eot_id >= 0) ids.push_back(task.eot_id);
            task.done.set_value(std::move(ids));
          } catch (...) {
            task.done.set_exception(std::current_exception());
          }
        }
      });
    }
    struct Joiner {
      std::mutex& m;
      std::condition_variable& cv;
      bool& closing;
      std::vector<std::thread>& workers;
      ~Joiner() {
        {
          std::lock_guard<std::mutex> lock(m);
          closing = true;
        }
        cv.notify_all();
        for (auto& t : workers) t.join();
      }
    } joiner{mutex, ready, closing, workers};
    const auto submit = [&](std::string text, bool to_val, bool end_of_file) {
      if (pending.size() >= static_cast<size_t>(2 * threads)) drain_one();
      const uint64_t bytes = text.size();
      Task task{std::move(text), eot && end_of_file ? bpe.end_of_text() : -1, {}};
      auto ids = task.done.get_future();
      {
        std::lock_guard<std::mutex> lock(mutex);
        tasks.push_back(std::move(task));
      }
      ready.notify_one();
      pending.push_back({std::move(ids), to_val, bytes});
    };

    uint64_t position = 0;  // bytes of the input before `buffer`
    bool in_val = val_fraction > 0 && split_at == 0;
    for (const auto& path : files) {
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
        // The next cut: the split when it falls here, else about a chunk on.
        size_t cut;
        bool split_here = false;
        if (!in_val && val_fraction > 0 && position + buffer.size() > split_at) {
          const size_t from = static_cast<size_t>(split_at > position ? split_at - position : 0);
          cut = gpt2_safe_cut(buffer, from);
          split_here = cut < buffer.size() || eof;
        } else {
          cut = gpt2_safe_cut(buffer, std::min(buffer.size(), kChunkBytes));
        }
        if (cut >= buffer.size() && !eof) {
          if (buffer.size() >= kMaxUncut)
            throw DataError(path + ": " + std::to_string(kMaxUncut >> 20) + " MiB from byte " +
                            std::to_string(position) +
                            " without a line ending or space after other text: lockstep "
                            "tokenize splits its input at such places");
          read_more();
          continue;
        }
        cut = std::min(cut, buffer.size());
        const bool last_of_file = eof && cut == buffer.size();
        submit(buffer.substr(0, cut), in_val, last_of_file);
        position += cut;
        buffer.erase(0, cut);
        if (split_here) in_val = true;
      }
    }
    while (!pending.empty()) drain_one();
    train.finish();
    val.finish();
    if (val_fraction > 0 && val.count() == 0)
      std::fprintf(stderr,
                   "tokenize: WARNING: no place to split in the input's last %.0f%% (no space or "
                   "line end after other text there): val.bin is empty\n",
                   100 * val_fraction);
    show(true);
    const double s = std::max(seconds(), 1e-9);
    std::fprintf(stderr,
                 "tokenize: %s bytes in %zu file(s) -> %s tokens (%s in %s/train.bin, %s in "
                 "%s/val.bin), %.2f s, %.1f MB/s on %d thread(s), %s format\n",
                 with_commas(static_cast<int64_t>(total)).c_str(), files.size(),
                 with_commas(train.count() + val.count()).c_str(),
                 with_commas(train.count()).c_str(), out.c_str(), with_commas(val.count()).c_str(),
                 out.c_str(), s, static_cast<double>(total) / 1e6 / s, threads, format.c_str());
    return kExitOk;
  });
}

}  // namespace lockstep::cli
