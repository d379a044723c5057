#include "format/route_trace.h"

#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "util/file.h"
#include "util/status.h"

namespace expertd {
namespace {

using Json = nlohmann::json;

// Accepts every event and keeps the parser's error text. Used only after a line failed to parse,
// to say why (parse() with allow_exceptions=false reports failure without a reason).
class ParseErrorCatcher final : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error_ = e.what();
    return false;
  }
  const std::string& error() const { return error_; }

 private:
  std::string error_ = "not valid JSON";
};

class RecordReader {
 public:
  RecordReader(const std::string& name, int line) : name_(name), line_(line) {}

  absl::StatusOr<RouteRecord> Read(std::string_view text) const;

 private:
  template <typename... Args>
  absl::Status Fail(const Args&... args) const {
    return InvalidError(ErrorKind::kBadRow, absl::StrCat(name_, ":", line_, ": ", args...));
  }

  // The first of `keys` present in `object`, or nullptr.
  static const Json* Find(const Json& object, std::initializer_list<const char*> keys) {
    for (const char* key : keys) {
      const auto it = object.find(key);
      if (it != object.end()) return &*it;
    }
    return nullptr;
  }

  // An integer in [lo, hi]; JSON floats (even 3.0) are not integers here.
  absl::StatusOr<int64_t> Integer(const Json& value, std::string_view what, int64_t lo,
                                  int64_t hi) const {
    if (value.is_number_unsigned()) {
      const uint64_t v = value.get<uint64_t>();
      if (v <= static_cast<uint64_t>(hi)) return static_cast<int64_t>(v);
    } else if (value.is_number_integer()) {
      const int64_t v = value.get<int64_t>();
      if (v >= lo && v <= hi) return v;
    } else {
      return Fail(AV(what), " is ", value.is_number() ? value.dump() : value.type_name(),
                  ", expected an integer");
    }
    return Fail(AV(what), " is ", value.dump(), ", expected an integer in [", lo, ", ", hi, "]");
  }

  const std::string& name_;
  const int line_;
};

absl::StatusOr<RouteRecord> RecordReader::Read(std::string_view text) const {
  constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
  constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
  constexpr int64_t kUint32Max = std::numeric_limits<uint32_t>::max();

  const Json object = Json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (object.is_discarded()) {
    ParseErrorCatcher catcher;
    Json::sax_parse(text, &catcher);
    return Fail("bad JSON: ", catcher.error());
  }
  if (!object.is_object()) return Fail("expected a JSON object, got ", object.type_name());

  RouteRecord record;
  record.line = line_;

  const Json* token = Find(object, {"token", "token_idx", "token_pos"});
  if (token == nullptr) return Fail("missing \"token\" (or \"token_idx\" / \"token_pos\")");
  ASSIGN_OR_RETURN(record.token, Integer(*token, "token", kInt64Min, kInt64Max));

  const Json* layer = Find(object, {"layer"});
  if (layer == nullptr) return Fail("missing \"layer\"");
  ASSIGN_OR_RETURN(const int64_t layer_value, Integer(*layer, "layer", 0, kUint32Max));
  record.layer = static_cast<uint32_t>(layer_value);

  const Json* experts = Find(object, {"experts"});
  if (experts == nullptr) return Fail("missing \"experts\"");
  if (!experts->is_array())
    return Fail("\"experts\" is ", experts->type_name(), ", expected an array");
  if (experts->empty()) return Fail("\"experts\" is empty");
  record.experts.reserve(experts->size());
  for (const Json& expert : *experts) {
    ASSIGN_OR_RETURN(const int64_t e, Integer(expert, "an expert", 0, kUint32Max));
    record.experts.push_back(static_cast<uint32_t>(e));
  }

  if (const Json* weights = Find(object, {"weights", "gating_probs"}); weights != nullptr) {
    if (!weights->is_array()) {
      return Fail("\"weights\" is ", weights->type_name(), ", expected an array");
    }
    if (weights->size() != experts->size()) {
      return Fail("\"weights\" has ", weights->size(), " entries, \"experts\" has ",
                  experts->size());
    }
    record.weights.reserve(weights->size());
    for (const Json& weight : *weights) {
      if (!weight.is_number())
        return Fail("a weight is ", weight.type_name(), ", expected a number");
      record.weights.push_back(weight.get<float>());
    }
  }

  if (const Json* problem = Find(object, {"problem_id"}); problem != nullptr) {
    ASSIGN_OR_RETURN(record.problem_id, Integer(*problem, "problem_id", kInt64Min, kInt64Max));
  }
  return record;
}

}  // namespace

absl::StatusOr<std::vector<RouteRecord>> ParseRouteTrace(std::string_view text,
                                                         const std::string& name) {
  std::vector<RouteRecord> records;
  int number = 0;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    ++number;
    if (absl::StripAsciiWhitespace(AV(line)).empty()) continue;
    ASSIGN_OR_RETURN(RouteRecord record, RecordReader(name, number).Read(line));
    records.push_back(std::move(record));
  }
  return records;
}

absl::StatusOr<std::vector<RouteRecord>> ReadRouteTrace(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path, "the route trace"));
  return ParseRouteTrace(text, path);
}

}  // namespace expertd
