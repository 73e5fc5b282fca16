// Dataset readers on good and bad input, the embedded digits, the split, and
// the batch loader.
#include <ATen/ATen.h>
#include "support/catch.h"
#include "support/temp_dir.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <fstream>

#include "lockstep/data/bpe.h"
#include "lockstep/data/dataset.h"
#include "lockstep/data/loader.h"
#include "lockstep/util/error.h"

using namespace lockstep;
using lockstep::testing::Contains;
using lockstep::testing::TempDir;

namespace {

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

}  // namespace

TEST_CASE("synthetic datasets are seeded and sized", "[datasets]") {
  const auto a = dataset_synthetic_classification(50, 6, 3, 1);
  const auto b = dataset_synthetic_classification(50, 6, 3, 1);
  const auto c = dataset_synthetic_classification(50, 6, 3, 2);
  CHECK(a.size() == 50);
  CHECK(a.features.sizes() == at::IntArrayRef{50, 6});
  CHECK(a.num_classes == 3);
  CHECK(at::equal(a.features, b.features));
  CHECK(at::equal(a.targets, b.targets));
  CHECK_FALSE(at::equal(a.features, c.features));
  CHECK(a.targets.min().item<int64_t>() >= 0);
  CHECK(a.targets.max().item<int64_t>() < 3);
  const auto r = dataset_synthetic_regression(20, 4, 1);
  CHECK(r.targets.scalar_type() == at::kFloat);
  CHECK(r.num_classes == 0);
  REQUIRE_THROWS_WITH(dataset_synthetic_classification(0, 6, 3, 1),
                      Contains("size=0 must be >= 1"));
}

TEST_CASE("CSV with a header and a named label column", "[datasets]") {
  TempDir dir;
  const auto path = dir.write("good.csv", "a,label,b\r\n1,0,2\n3,2,4\n\n5,1,6\n");
  CsvOptions options;
  options.label_column = "label";
  const auto data = dataset_csv(path, options);
  CHECK(data.size() == 3);
  CHECK(at::equal(data.features, at::tensor({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}).reshape({3, 2})));
  CHECK(at::equal(data.targets, at::tensor({0, 2, 1}, at::kLong)));
  CHECK(data.num_classes == 3);
}

TEST_CASE("CSV without a header, label by index, regression", "[datasets]") {
  TempDir dir;
  const auto path = dir.write("plain.csv", "0.5,1.5,7\n2.5,3.5,8\n");
  CsvOptions options;
  options.label_column = "0";
  options.regression = true;
  const auto data = dataset_csv(path, options);
  CHECK(at::equal(data.targets, at::tensor({0.5f, 2.5f})));
  CHECK(at::equal(data.features, at::tensor({1.5f, 7.f, 3.5f, 8.f}).reshape({2, 2})));
}

TEST_CASE("CSV errors name the file and the line", "[datasets]") {
  TempDir dir;
  REQUIRE_THROWS_WITH(dataset_csv(dir.path + "/missing.csv"),
                      Contains("cannot open '" + dir.path + "/missing.csv': No such file"));
  const auto short_row = dir.write("short.csv", "1,2,0\n3,4,1\n5,1\n");
  REQUIRE_THROWS_WITH(dataset_csv(short_row),
                      Contains(short_row + ":3: expected 3 fields, found 2"));
  const auto word = dir.write("word.csv", "x,y\n1,0\nabc,1\n");
  REQUIRE_THROWS_WITH(dataset_csv(word), Contains(word + ":3: field 1 ('abc') is not a number"));
  const auto range = dir.write("range.csv", "1,0\n2,12\n");
  CsvOptions ten;
  ten.num_classes = 10;
  REQUIRE_THROWS_WITH(dataset_csv(range, ten),
                      Contains(range + ":2: label 12 (column 2) is not a class in [0, 10)"));
  const auto fraction = dir.write("fraction.csv", "1,0.5\n");
  REQUIRE_THROWS_WITH(dataset_csv(fraction), Contains("label 0.5"));
  const auto empty = dir.write("empty.csv", "a,b\n");
  REQUIRE_THROWS_WITH(dataset_csv(empty), Contains(empty + ": no data rows"));
  CsvOptions named;
  named.label_column = "target";
  REQUIRE_THROWS_WITH(dataset_csv(word, named),
                      Contains("no column named 'target' (columns: x, y)"));
  REQUIRE_THROWS_AS(dataset_csv(empty), DataError);
  // One label must not size the model (issue 16: a 10^7-class head).
  const auto huge = dir.write("huge.csv", "1,0\n2,10000000\n");
  REQUIRE_THROWS_WITH(dataset_csv(huge),
                      Contains(huge + ":2: label 1e+07 would make a model of more than 100000 "
                                      "classes (data.max_classes"));
  CsvOptions roomy;
  roomy.max_classes = 20000000;
  CHECK(dataset_csv(huge, roomy).num_classes == 10000001);
  // A NUL byte in a field (a binary file) is not cut short into a number.
  const auto nul = dir.write("nul.csv", std::string("1,0\n2\0\x01,1\n", 10));
  REQUIRE_THROWS_WITH(dataset_csv(nul), Contains(nul + ":2: a NUL byte at column 2"));
  // Not a regular file: refused before a byte is read.
  REQUIRE_THROWS_WITH(dataset_csv("/dev/zero"), Contains("'/dev/zero' is not a regular file"));
  REQUIRE_THROWS_WITH(dataset_csv(dir.path), Contains("is not a regular file"));
}

TEST_CASE("MNIST idx files: read, and bad files named", "[datasets]") {
  TempDir dir;
  std::string images = be32(2051) + be32(2) + be32(28) + be32(28);
  for (int i = 0; i < 2 * 28 * 28; ++i) images.push_back(static_cast<char>(i % 256));
  const std::string labels = be32(2049) + be32(2) + std::string{7, 3};
  dir.write("train-images-idx3-ubyte", images);
  dir.write("train-labels-idx1-ubyte", labels);
  const auto data = dataset_mnist(dir.path, true);
  CHECK(data.features.sizes() == at::IntArrayRef{2, 1, 28, 28});
  CHECK(at::equal(data.targets, at::tensor({7, 3}, at::kLong)));
  CHECK(data.features.max().item<float>() == 1.0f);
  REQUIRE_THROWS_WITH(dataset_mnist(dir.path, false), Contains("t10k-images-idx3-ubyte"));

  dir.write("t10k-images-idx3-ubyte", be32(2049) + be32(0) + be32(28) + be32(28));
  dir.write("t10k-labels-idx1-ubyte", labels);
  REQUIRE_THROWS_WITH(dataset_mnist(dir.path, false), Contains("magic number 2049 is not 2051"));
  dir.write("t10k-images-idx3-ubyte", images);
  dir.write("t10k-labels-idx1-ubyte", be32(2049) + be32(3) + std::string{1, 2, 3});
  REQUIRE_THROWS_WITH(dataset_mnist(dir.path, false), Contains("has 2 images but"));
  dir.write("t10k-labels-idx1-ubyte", be32(2049) + be32(3) + std::string{1, 2});
  REQUIRE_THROWS_WITH(dataset_mnist(dir.path, false),
                      Contains("holds 2 data bytes, its header promises 3"));
  // Headers whose dimensions overflow, or are zero (zero-width images).
  dir.write("t10k-labels-idx1-ubyte", labels);
  dir.write("t10k-images-idx3-ubyte",
            be32(2051) + be32(0xFFFFFFFF) + be32(0xFFFFFFFF) + be32(0xFFFFFFFF));
  REQUIRE_THROWS_WITH(dataset_mnist(dir.path, false), Contains("(sizes overflow)"));
  dir.write("t10k-images-idx3-ubyte", be32(2051) + be32(2) + be32(0) + be32(28));
  REQUIRE_THROWS_WITH(dataset_mnist(dir.path, false),
                      Contains("header dimension 1 is 0 (empty images or no examples)"));
}

namespace {
void write_gz(const std::string& path, const std::string& bytes, size_t cut = std::string::npos) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  gzclose(f);
  if (cut != std::string::npos) REQUIRE(::truncate(path.c_str(), static_cast<off_t>(cut)) == 0);
}
}  // namespace

TEST_CASE("MNIST idx files gzipped: read as they are, hostile ones bounded", "[datasets]") {
  TempDir dir;
  std::string images = be32(2051) + be32(2) + be32(28) + be32(28);
  for (int i = 0; i < 2 * 28 * 28; ++i) images.push_back(static_cast<char>(i % 251));
  const std::string labels = be32(2049) + be32(2) + std::string{4, 9};
  write_gz(dir.path + "/train-images-idx3-ubyte.gz", images);
  write_gz(dir.path + "/train-labels-idx1-ubyte.gz", labels);
  const auto data = dataset_mnist(dir.path, true);
  CHECK(data.features.sizes() == at::IntArrayRef{2, 1, 28, 28});
  CHECK(data.features[1][0][0][0].item<float>() == Approx(((28 * 28) % 251) / 255.0));
  CHECK(at::equal(data.targets, at::tensor({4, 9}, at::kLong)));
  // A bomb: 64 MiB of zeros behind a header that promises 1,568 bytes.
  // Reading stops a piece past the promise, and the excess is named.
  std::string bomb = images + std::string(64 << 20, '\0');
  write_gz(dir.path + "/t10k-images-idx3-ubyte.gz", bomb);
  write_gz(dir.path + "/t10k-labels-idx1-ubyte.gz", labels);
  REQUIRE_THROWS_WITH(dataset_mnist(dir.path, false), Contains("its header promises 1568"));
  // A header promising more than deflate can expand this file to: refused unread.
  write_gz(dir.path + "/t10k-images-idx3-ubyte.gz",
           be32(2051) + be32(1 << 20) + be32(100) + be32(100) + std::string(4096, '\0'));
  REQUIRE_THROWS_WITH(dataset_mnist(dir.path, false), Contains("more than a gzip file of"));
  // Cut short, and not gzip at all.
  write_gz(dir.path + "/t10k-images-idx3-ubyte.gz", images, 200);
  REQUIRE_THROWS_WITH(dataset_mnist(dir.path, false),
                      Contains("t10k-images-idx3-ubyte.gz: not a readable gzip file"));
  dir.write("t10k-images-idx3-ubyte.gz",
            std::string("\x1f\x8b\x08\x00garbage", 12) + std::string(64, 'x'));
  REQUIRE_THROWS_WITH(dataset_mnist(dir.path, false), Contains("not a readable gzip file"));
  // The plain file wins where both are there.
  dir.write("t10k-images-idx3-ubyte", images);
  CHECK(dataset_mnist(dir.path, false).size() == 2);
}

TEST_CASE("Fashion-MNIST from Debian's dataset-fashion-mnist", "[datasets]") {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  struct stat st {};
  if (::stat((dir + "/train-images-idx3-ubyte.gz").c_str(), &st) != 0) {
    WARN("dataset-fashion-mnist is not installed (scripts/setup.sh installs it)");
    return;
  }
  const auto train = dataset_mnist(dir, true), test = dataset_mnist(dir, false);
  CHECK(train.features.sizes() == at::IntArrayRef{60000, 1, 28, 28});
  CHECK(test.features.sizes() == at::IntArrayRef{10000, 1, 28, 28});
  // Balanced: 6,000 and 1,000 of each of the 10 classes.
  CHECK(at::equal(at::bincount(train.targets), at::full({10}, 6000, at::kLong)));
  CHECK(at::equal(at::bincount(test.targets), at::full({10}, 1000, at::kLong)));
}

namespace {

std::vector<std::string> pieces_of(const std::string& text, BpePattern pattern) {
  std::vector<std::string> out;
  size_t start = 0;
  for (const size_t end : bpe_pieces(text, pattern)) {
    out.push_back(text.substr(start, end - start));
    start = end;
  }
  return out;
}

std::string base64_of(const std::string& in) {
  static const char* table = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t v = static_cast<unsigned char>(in[i]) << 16;
    if (i + 1 < in.size()) v |= static_cast<unsigned char>(in[i + 1]) << 8;
    if (i + 2 < in.size()) v |= static_cast<unsigned char>(in[i + 2]);
    out += table[(v >> 18) & 63];
    out += table[(v >> 12) & 63];
    out += i + 1 < in.size() ? table[(v >> 6) & 63] : '=';
    out += i + 2 < in.size() ? table[v & 63] : '=';
  }
  return out;
}

}  // namespace

TEST_CASE("a large rank file lockstep does not know is refused, not split with GPT-2's pattern",
          "[datasets]") {
  // 100,000 ranks, the size of cl100k_base's file, whose special tokens
  // lockstep does not know (Llama 3's file is recognised by its SHA-256).
  std::string text;
  for (uint32_t r = 0; r < 100000; ++r) {
    std::string token = r < 256 ? std::string(1, static_cast<char>(r))
                                : std::string(reinterpret_cast<const char*>(&r), 4);
    text += base64_of(token) + " " + std::to_string(r) + "\n";
  }
  TempDir dir;
  const std::string path = dir.write("big.tiktoken", text);
  CHECK_THROWS_WITH(BpeTokenizer::load(path),
                    Contains("100000 ranks, and not Llama 3's tokenizer.model"));
}

TEST_CASE("Llama 3's pattern cuts text as the regular expression does", "[bpe]") {
  // Expected: Python's regex module 2026.12 running Meta's pat_str
  // (tokenizer.py) on the same strings (regex.findall).
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"Hello world", {"Hello", " world"}},
      {"It's 'SOUND' we'LL", {"It", "'s", " '", "SOUND", "'", " we", "'LL"}},
      {"'\xC5\xBF x", {"'\xC5\xBF", " x"}},  // 'ſ: (?i) folds ſ to s
      {"12345 6", {"123", "45", " ", "6"}},
      {"  two spaces", {" ", " two", " spaces"}},
      {"a \n b", {"a", " \n", " b"}},
      {"\n\n\tx", {"\n\n", "\tx"}},
      {"(word ((word", {"(word", " ((", "word"}},
      {" ...\n\nnext", {" ...\n\n", "next"}},
      {"x.\r\ny", {"x", ".\r\n", "y"}},
      {"tab\tword\t\t!", {"tab", "\tword", "\t", "\t", "!"}},
      {"end   ", {"end", "   "}},
      {"\xC3\x9Cn \xE5\x8C\x97\xE4\xBA\xAC \xD9\xA1\xD9\xA2\xD9\xA3\xD9\xA4",
       {"\xC3\x9Cn", " \xE5\x8C\x97\xE4\xBA\xAC", " ", "\xD9\xA1\xD9\xA2\xD9\xA3", "\xD9\xA4"}},
      {"a\xC2\xA0"
       "b\xE3\x80\x80"
       "c",
       {"a",
        "\xC2\xA0"
        "b",
        "\xE3\x80\x80"
        "c"}},
      {"x\xC2\x85y", {"x", "\xC2\x85y"}},  // U+0085 is White_Space, not a line end
      {"emoji \xF0\x9F\x98\x80\xF0\x9F\x98\x80 ok",
       {"emoji", " \xF0\x9F\x98\x80\xF0\x9F\x98\x80", " ok"}},
      {"$100.50!", {"$", "100", ".", "50", "!"}},
      {"line\n", {"line", "\n"}},
      {"  \n  \n x", {"  \n  \n", " x"}},
      // U+11DE1, a digit first assigned in Unicode 17.0: "other" to the
      // references (Unicode 16.0), so it leads the letters after it.
      {"\xF0\x91\xB7\xA1ng", {"\xF0\x91\xB7\xA1ng"}},
  };
  for (const auto& [text, expected] : cases) {
    INFO("text: " << text);
    CHECK(pieces_of(text, BpePattern::kLlama3) == expected);
  }
  // GPT-2's pattern on the same text differs where the patterns do.
  CHECK(pieces_of("12345 6", BpePattern::kGpt2) == std::vector<std::string>{"12345", " 6"});
}

TEST_CASE("a safe cut leaves the pieces as the whole text has them", "[bpe]") {
  // Random text of the characters where the patterns differ: any cut
  // bpe_safe_cut offers must give the two parts the whole text's pieces.
  const std::vector<std::string> alphabet = {
      "a",   "Z",  "1", "'", "s",        " ",        "\t",
      "\n",  "\r", ".", "(", "\xC2\xA0", "\xC3\xA9", "\xE5\x8C\x97",
      "\xFF"};
  uint64_t state = 12345;
  const auto next = [&] {
    return (state = state * 6364136223846793005ULL + 1442695040888963407ULL) >> 33;
  };
  for (const BpePattern pattern : {BpePattern::kGpt2, BpePattern::kLlama3}) {
    int cuts = 0;
    for (int round = 0; round < 300; ++round) {
      std::string text;
      for (int k = 0; k < 40; ++k) text += alphabet[next() % alphabet.size()];
      const auto whole = pieces_of(text, pattern);
      for (size_t from = 0; from < text.size(); ++from) {
        const size_t cut = bpe_safe_cut(text, from, pattern);
        if (cut >= text.size()) break;
        auto parts = pieces_of(text.substr(0, cut), pattern);
        const auto right = pieces_of(text.substr(cut), pattern);
        parts.insert(parts.end(), right.begin(), right.end());
        ++cuts;
        if (parts != whole) FAIL("a cut at " << cut << " of '" << text << "' changes the pieces");
      }
    }
    CHECK(cuts > 1000);
  }
  // Not before a line end after punctuation: Llama 3's ".\n" is one piece.
  // After it, before other text, both patterns start afresh.
  CHECK(bpe_safe_cut("a.\nb c", 0, BpePattern::kLlama3) == 3);
  CHECK(bpe_safe_cut("a.\nb c", 0, BpePattern::kGpt2) == 2);
  CHECK(bpe_safe_cut("\xE4\xB8\x80\xE3\x80\x82\r\n\xE4\xB8\x80", 1, BpePattern::kLlama3) == 8);
}

TEST_CASE("a rank file merges as tiktoken does: the join of lowest rank, whole pieces first",
          "[bpe]") {
  // ":." ranks below ".:", so ".:.:" cannot be reached by merging (Llama 3's
  // file has 678 such tokens) but is one token as a whole piece; "aaa"
  // splits two ways. Expected: tiktoken 0.14's Encoding on the same ranks.
  std::string text;
  for (int b = 0; b < 256; ++b)
    text += base64_of(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  int rank = 256;
  for (const char* token : {":.", ".:", ".:.:", "aa", "aaa"})
    text += base64_of(token) + " " + std::to_string(rank++) + "\n";
  TempDir dir;
  const BpeTokenizer bpe = BpeTokenizer::load(dir.write("tiny.tiktoken", text));
  CHECK(bpe.encode(".:.:") == std::vector<int32_t>{258});
  CHECK(bpe.encode("-.:.:") == std::vector<int32_t>{45, 46, 256, 58});
  CHECK(bpe.encode("aaaa") == std::vector<int32_t>{259, 259});
  CHECK(bpe.encode("aaa") == std::vector<int32_t>{260});
  CHECK(bpe.encode("aaaaa") == std::vector<int32_t>{259, 260});
  CHECK(bpe.pattern() == BpePattern::kGpt2);
  CHECK(bpe.end_of_text() == -1);
  // CRLF lines, as tiktoken reads them.
  std::string crlf;
  for (const char c : text) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  CHECK(BpeTokenizer::load(dir.write("crlf.tiktoken", crlf)).encode("-.:.:") ==
        std::vector<int32_t>{45, 46, 256, 58});
  CHECK_THROWS_WITH(BpeTokenizer::load("/dev/null"), Contains("neither a file nor a folder"));
  // A token that is no join of two tokens: not a BPE rank file.
  const std::string bad = text + base64_of("xyz") + " 261\n";
  CHECK_THROWS_WITH(BpeTokenizer::load(dir.write("bad.tiktoken", bad)),
                    Contains("the token of rank 261 is not the join of two tokens"));
  // Llama 2's and Mistral's tokenizer.model are SentencePiece protobufs.
  CHECK_THROWS_WITH(
      BpeTokenizer::load(dir.write("tokenizer.model", std::string("\x0a\x0b<unk>\x15\x00", 8))),
      Contains("a SentencePiece model"));
}

TEST_CASE("the embedded digits: 1,797 images of 64 pixels, 10 classes", "[datasets]") {
  const auto data = dataset_digits();
  CHECK(data.size() == 1797);
  CHECK(data.features.sizes() == at::IntArrayRef{1797, 64});
  CHECK(data.num_classes == 10);
  CHECK(data.features.min().item<float>() == 0.0f);
  CHECK(data.features.max().item<float>() == 1.0f);
  CHECK(data.targets[0].item<int64_t>() == 0);  // the first row is a zero
  const auto counts = at::bincount(data.targets);
  CHECK(counts.min().item<int64_t>() >= 170);  // every digit about 180 times
}

TEST_CASE("train/validation split is deterministic and partitions the data", "[datasets]") {
  const auto data = dataset_synthetic_classification(100, 3, 2, 5);
  const auto a = dataset_split(data, 0.2, 9);
  const auto b = dataset_split(data, 0.2, 9);
  CHECK(a.train.size() == 80);
  CHECK(a.validation.size() == 20);
  CHECK(at::equal(a.train.features, b.train.features));
  const auto all = at::cat({a.train.features, a.validation.features}).sum(0);
  CHECK(at::allclose(all, data.features.sum(0), 1e-5, 1e-4));
  REQUIRE_THROWS_WITH(dataset_split(data, 1.0, 9), Contains("must be in [0, 1)"));
}

TEST_CASE("batches follow the indices - prefetch changes nothing", "[loader]") {
  const auto data = dataset_synthetic_classification(10, 2, 2, 3);
  const std::vector<int64_t> order{9, 0, 4, 4, 7, 1, 2};
  for (bool prefetch : {false, true}) {
    BatchLoader loader(data, order, LoaderOptions{3, false, prefetch});
    CHECK(loader.num_batches() == 3);
    std::vector<at::Tensor> xs;
    while (auto batch = loader.next()) xs.push_back(batch->x);
    REQUIRE(xs.size() == 3);
    CHECK(xs[2].size(0) == 1);
    CHECK(at::equal(at::cat(xs), data.features.index_select(0, at::tensor(order, at::kLong))));
  }
  BatchLoader dropping(data, order, LoaderOptions{3, true, true});
  CHECK(dropping.num_batches() == 2);
  REQUIRE_THROWS_WITH(BatchLoader(data, order, LoaderOptions{0, false, true}),
                      Contains("batch size 0 must be >= 1"));
  REQUIRE_THROWS_WITH(BatchLoader(data, {10}, LoaderOptions{1, false, true}),
                      Contains("index 10 is outside dataset"));
  TensorDataset empty;
  empty.name = "nothing";
  REQUIRE_THROWS_WITH(BatchLoader(empty, std::vector<int64_t>{}, LoaderOptions{1, false, true}),
                      Contains("dataset 'nothing' is empty"));
}

namespace {
// A dataset of one's own: example i is x = [i, 2i], y = i % 3.
class Counting : public lockstep::Dataset {
 public:
  int64_t size() const override { return 11; }
  lockstep::Example get(int64_t i) const override {
    return {at::tensor({static_cast<float>(i), 2.0f * i}), at::tensor(i % 3, at::kLong)};
  }
};
}  // namespace

TEST_CASE("a loader over a sampler reshuffles per epoch, range-for, any dataset", "[loader]") {
  auto data = std::make_shared<Counting>();
  SamplerOptions shard{2, 1, true, 4, false};
  for (bool prefetch : {false, true}) {
    for (bool through_sampler : {false, true}) {
      auto sampler = std::make_shared<DistributedSampler>(data->size(), shard);
      BatchLoader loader(data, sampler, {4, false, prefetch});
      for (int64_t epoch : {0, 1, 0, 2}) {
        // PyTorch's habit (the sampler's own set_epoch) or the loader's.
        if (through_sampler) {
          sampler->set_epoch(epoch);
        } else {
          loader.set_epoch(epoch);
        }
        DistributedSampler reference(data->size(), shard);
        reference.set_epoch(epoch);
        std::vector<int64_t> seen;
        for (const Batch& batch : loader) {
          for (int64_t k = 0; k < batch.x.size(0); ++k) {
            const auto i = batch.x[k][0].item<int64_t>();
            CHECK(batch.x[k][1].item<float>() == 2.0f * i);
            CHECK(batch.y[k].item<int64_t>() == i % 3);
            seen.push_back(i);
          }
        }
        CHECK(seen == reference.indices());  // the sampler's order for this epoch
        std::vector<int64_t> again;          // a second pass: the same epoch again
        for (const Batch& batch : loader) {
          for (int64_t k = 0; k < batch.x.size(0); ++k)
            again.push_back(batch.x[k][0].item<int64_t>());
        }
        CHECK(again == seen);
      }
    }
  }
  DistributedSampler e0(11, shard), e1(11, shard);
  e1.set_epoch(1);
  CHECK(e0.indices() != e1.indices());  // epochs differ, so the test above can fail
}

TEST_CASE("a loader shares its dataset: it lives as long as the loader", "[loader]") {
  // BatchLoader once held a const& to its dataset: a temporary dangled.
  auto data = std::make_shared<Counting>();
  std::weak_ptr<Counting> watch = data;
  {
    BatchLoader loader(std::move(data), std::vector<int64_t>{8, 1, 3},
                       LoaderOptions{2, false, false});
    CHECK_FALSE(watch.expired());  // the loader holds it; the caller's handle is gone
    auto first = loader.next();
    auto second = loader.next();
    REQUIRE(first);
    REQUIRE(second);
    CHECK(first->x[0][0].item<float>() == 8);
    CHECK(second->x[0][0].item<float>() == 3);
    REQUIRE_THROWS_WITH(loader.set_epoch(1), Contains("fixed list of indices"));
  }
  CHECK(watch.expired());  // released with the loader
}
