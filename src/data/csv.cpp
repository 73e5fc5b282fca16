// CSV reader: numeric features plus one label column; header optional.
// Every error names the source and, for row problems, the 1-based line.
#include <ATen/ATen.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "lockstep/data/dataset.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"

namespace lockstep {
namespace {

std::vector<std::string> split_fields(const std::string& line, char delimiter) {
  std::vector<std::string> fields;
  size_t start = 0;
  while (true) {
    const size_t end = line.find(delimiter, start);
    std::string field =
        line.substr(start, end == std::string::npos ? std::string::npos : end - start);
    const size_t first = field.find_first_not_of(" \t");
    const size_t last = field.find_last_not_of(" \t");
    fields.push_back(first == std::string::npos ? "" : field.substr(first, last - first + 1));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return fields;
}

bool parse_number(const std::string& field, double& value) {
  if (field.empty()) return false;
  errno = 0;
  char* end = nullptr;
  value = std::strtod(field.c_str(), &end);
  return *end == '\0' && errno != ERANGE && std::isfinite(value);
}

bool all_numeric(const std::vector<std::string>& fields) {
  double ignored;
  for (const auto& f : fields) {
    if (!parse_number(f, ignored)) return false;
  }
  return true;
}

size_t resolve_label_column(const std::string& spec, const std::vector<std::string>& header,
                            size_t columns, const std::string& source) {
  char* end = nullptr;
  const long index = std::strtol(spec.c_str(), &end, 10);
  if (!spec.empty() && *end == '\0') {
    const long resolved = index < 0 ? static_cast<long>(columns) + index : index;
    if (resolved < 0 || resolved >= static_cast<long>(columns)) {
      throw DataError(source + ": label column " + spec + " is outside the " +
                      std::to_string(columns) + " columns");
    }
    return static_cast<size_t>(resolved);
  }
  for (size_t c = 0; c < header.size(); ++c) {
    if (header[c] == spec) return c;
  }
  std::string names;
  for (const auto& h : header) names += (names.empty() ? "" : ", ") + h;
  throw DataError(source + ": no column named '" + spec + "'" +
                  (header.empty() ? " (the file has no header: give the label column's index)"
                                  : " (columns: " + names + ")"));
}

}  // namespace

TensorDataset dataset_csv_text(const std::string& text, const std::string& source,
                               const CsvOptions& options) {
  std::istringstream in(text);
  std::string line;
  size_t line_number = 0;
  std::vector<std::string> header;
  size_t columns = 0;
  size_t label = 0;
  bool first = true;
  std::vector<float> features;
  std::vector<double> labels;
  std::vector<size_t> label_lines;
  while (std::getline(in, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find('\0') != std::string::npos) {
      throw DataError(source + ":" + std::to_string(line_number) + ": a NUL byte at column " +
                      std::to_string(line.find('\0') + 1) + " (a binary file, not CSV?)");
    }
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    auto fields = split_fields(line, options.delimiter);
    if (first) {
      first = false;
      columns = fields.size();
      if (columns < 2) {
        throw DataError(source + ":" + std::to_string(line_number) +
                        ": need at least 2 columns (features and a label), found " +
                        std::to_string(columns));
      }
      const bool is_header = options.header == CsvOptions::Header::kYes ||
                             (options.header == CsvOptions::Header::kAuto && !all_numeric(fields));
      if (is_header) header = fields;
      label = resolve_label_column(options.label_column, header, columns, source);
      if (is_header) continue;
    }
    const std::string where = source + ":" + std::to_string(line_number);
    if (fields.size() != columns) {
      throw DataError(where + ": expected " + std::to_string(columns) + " fields, found " +
                      std::to_string(fields.size()));
    }
    for (size_t c = 0; c < columns; ++c) {
      double value = 0;
      if (!parse_number(fields[c], value)) {
        throw DataError(where + ": field " + std::to_string(c + 1) + " ('" + fields[c] +
                        "') is not a number");
      }
      if (c == label) {
        labels.push_back(value);
        label_lines.push_back(line_number);
      } else {
        features.push_back(static_cast<float>(value));
      }
    }
  }
  if (labels.empty()) throw DataError(source + ": no data rows");

  TensorDataset data;
  data.name = source;
  const auto rows = static_cast<int64_t>(labels.size());
  data.features =
      at::tensor(features, at::kFloat).reshape({rows, static_cast<int64_t>(columns - 1)});
  if (options.regression) {
    std::vector<float> y(labels.begin(), labels.end());
    data.targets = at::tensor(y, at::kFloat);
    return data;
  }
  std::vector<int64_t> y;
  int64_t largest = 0;
  for (size_t r = 0; r < labels.size(); ++r) {
    const double v = labels[r];
    if (v != std::floor(v) || v < 0 ||
        (options.num_classes > 0 && v >= static_cast<double>(options.num_classes))) {
      std::ostringstream shown;
      shown << v;
      throw DataError(source + ":" + std::to_string(label_lines[r]) + ": label " + shown.str() +
                      " (column " + std::to_string(label + 1) + ") is not a class in [0, " +
                      (options.num_classes > 0 ? std::to_string(options.num_classes) : "inf") +
                      ")");
    }
    if (options.num_classes == 0 && v >= static_cast<double>(options.max_classes)) {
      // One label would size the model's head: refused before anything grows.
      std::ostringstream shown;
      shown << v;
      throw DataError(source + ":" + std::to_string(label_lines[r]) + ": label " + shown.str() +
                      " would make a model of more than " + std::to_string(options.max_classes) +
                      " classes (data.max_classes; a typo, or a regression target?)");
    }
    y.push_back(static_cast<int64_t>(v));
    largest = std::max(largest, y.back());
  }
  data.targets = at::tensor(y, at::kLong);
  data.num_classes = options.num_classes > 0 ? options.num_classes : largest + 1;
  return data;
}

TensorDataset dataset_csv(const std::string& path, const CsvOptions& options) {
  return dataset_csv_text(read_regular_file(path), path, options);
}

}  // namespace lockstep
