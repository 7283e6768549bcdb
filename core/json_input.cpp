#include "core/json_input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <unordered_set>
#include <vector>

namespace harness {
namespace {

using OrderedJson = nlohmann::ordered_json;

// One open container while parsing: where the parse is, for messages, and the keys seen so far.
struct OpenContainer {
  bool is_array = false;
  size_t index = 0;                     // array: elements completed so far (the current one's index)
  std::string key;                      // object: the current member's key
  std::unordered_set<std::string> keys;  // object: keys seen
};

std::string path_of(const std::vector<OpenContainer>& open) {
  std::string path;
  for (const OpenContainer& container : open) {
    const std::string part = container.is_array ? std::to_string(container.index) : container.key;
    if (!container.is_array && container.key.empty()) break;  // between members: the object itself
    path += (path.empty() ? "" : ".") + clip_text(part, 60);
  }
  return clip_text(path, 200);
}

// The message of a nlohmann parse error without its "[json.exception...]" prefix, clipped: the
// lexer quotes everything it read of the bad token, which may be megabytes.
std::string parse_error_text(const nlohmann::json::exception& error) {
  std::string text = error.what();
  if (text.rfind("[json.exception.", 0) == 0) {
    const auto end = text.find("] ");
    if (end != std::string::npos) text.erase(0, end + 2);
  }
  return clip_text(text, 300);
}

}  // namespace

std::string clip_text(const std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
  return text.substr(0, cut) + "... (" + std::to_string(text.size()) + " bytes)";
}

std::string clip_json(const OrderedJson& value, size_t max_bytes) {
  // A big string or container would be dumped whole only to be cut: summarize those instead.
  if (value.is_string()) {
    const auto& text = value.get_ref<const std::string&>();
    if (text.size() > max_bytes) return "\"" + clip_text(text, max_bytes) + "\"";
  } else if (value.is_structured() && value.size() > max_bytes) {
    return std::string(value.is_array() ? "an array of " : "an object of ") + std::to_string(value.size()) +
           (value.is_array() ? " elements" : " members");
  }
  const std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return text.size() > max_bytes ? text.substr(0, max_bytes - 3) + "..." : text;
}

namespace {

// Builds the document from the parser's events. nlohmann's own builder inserts each member with a
// lookup in the object (ordered_json keeps its members in a vector, so a lookup is linear and an
// object of n members costs n²/2 comparisons: 200 000 keys took 20 s); here a member is appended,
// duplicates having been refused by the hash set of the keys seen. Limits and the JSON path of
// every error are kept here too.
class DocumentBuilder {
 public:
  using number_integer_t = OrderedJson::number_integer_t;
  using number_unsigned_t = OrderedJson::number_unsigned_t;
  using number_float_t = OrderedJson::number_float_t;
  using string_t = OrderedJson::string_t;
  using binary_t = OrderedJson::binary_t;

  explicit DocumentBuilder(const JsonLimits& limits) : limits_(limits) {}

  bool null() { return put(nullptr) != nullptr; }
  bool boolean(bool value) { return put(value) != nullptr; }
  bool number_integer(number_integer_t value) { return put(value) != nullptr; }
  bool number_unsigned(number_unsigned_t value) { return put(value) != nullptr; }
  bool number_float(number_float_t value, const string_t&) { return put(value) != nullptr; }
  bool string(string_t& value) { return put(std::move(value)) != nullptr; }
  bool binary(binary_t& value) { return put(OrderedJson::binary(std::move(value))) != nullptr; }

  bool start_object(std::size_t) { return open(OrderedJson::value_t::object); }
  bool start_array(std::size_t) { return open(OrderedJson::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(string_t& key) {
    OpenContainer& object = open_.back();
    if (object.keys.size() >= limits_.max_object_members) {
      object.key.clear();
      throw JsonInputError(JsonInputError::Kind::too_large, path_of(open_),
                           "an object of more than " + std::to_string(limits_.max_object_members) +
                               " members; at most that many are accepted");
    }
    if (!object.keys.insert(key).second) {
      object.key = key;
      throw JsonInputError(JsonInputError::Kind::duplicate_key, path_of(open_),
                           "duplicate key \"" + clip_text(key, 60) +
                               "\" (JSON readers disagree on which one counts; write it once)");
    }
    object.key = key;
    // Appended without a lookup (the set above saw to duplicates).
    auto& members = static_cast<OrderedJson::object_t::Container&>(*containers_.back()->get_ptr<OrderedJson::object_t*>());
    members.emplace_back(std::move(key), nullptr);
    member_ = &members.back().second;
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& error) {
    // The only out_of_range the parser reports: a number beyond double's range (1e999).
    if (error.id == 406)
      throw JsonInputError(JsonInputError::Kind::number_range, path_of(open_), "number out of range (" + parse_error_text(error) + ")");
    throw JsonInputError(JsonInputError::Kind::syntax, path_of(open_), "invalid JSON: " + parse_error_text(error));
  }

  OrderedJson take() { return std::move(root_); }

 private:
  // Places a value where the parse is: the document, the array's next element or the member
  // whose key came last; returns where it went. A container counts as done when it closes.
  template <typename Value>
  OrderedJson* put(Value&& value, bool container = false) {
    OrderedJson* placed = nullptr;
    if (containers_.empty()) {
      root_ = OrderedJson(std::forward<Value>(value));
      placed = &root_;
    } else if (containers_.back()->is_array()) {
      auto& elements = *containers_.back()->get_ptr<OrderedJson::array_t*>();
      elements.emplace_back(std::forward<Value>(value));
      placed = &elements.back();
    } else {
      *member_ = OrderedJson(std::forward<Value>(value));
      placed = member_;
    }
    if (!container) completed();
    return placed;
  }

  bool open(OrderedJson::value_t type) {
    if (open_.size() + 1 > static_cast<size_t>(limits_.max_depth))
      throw JsonInputError(JsonInputError::Kind::too_deep, path_of(open_),
                           "nested more than " + std::to_string(limits_.max_depth) + " levels deep");
    containers_.push_back(put(type, /*container=*/true));
    open_.push_back({type == OrderedJson::value_t::array, 0, "", {}});
    return true;
  }

  bool close() {
    containers_.pop_back();
    open_.pop_back();
    completed();
    return true;
  }

  // A value ended: the next one is the array's next element, or the object's next member.
  void completed() {
    if (open_.empty()) return;
    if (open_.back().is_array) ++open_.back().index;
    else open_.back().key.clear();
  }

  const JsonLimits& limits_;
  OrderedJson root_;
  std::vector<OrderedJson*> containers_;  // the open containers, outermost first
  std::vector<OpenContainer> open_;       // the same, for messages
  OrderedJson* member_ = nullptr;         // the member whose key came last
};

}  // namespace

std::string read_json_input_file(const std::string& path, const JsonLimits& limits) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    throw JsonInputError(JsonInputError::Kind::unreadable, "", std::string("cannot open: ") + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat info {};
  if (::fstat(fd, &info) != 0)
    throw JsonInputError(JsonInputError::Kind::unreadable, "", std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(info.st_mode))
    throw JsonInputError(JsonInputError::Kind::unreadable, "",
                         std::string("not a regular file (") +
                             (S_ISFIFO(info.st_mode) ? "a FIFO" : S_ISDIR(info.st_mode) ? "a folder" : "a device or socket") +
                             "); a spec is read from a file");
  const auto too_large = [&](const std::string& size) {
    return JsonInputError(JsonInputError::Kind::too_large, "",
                          "the file is " + size + " bytes; at most " + std::to_string(limits.max_bytes) + " are accepted");
  };
  if (static_cast<uint64_t>(info.st_size) > limits.max_bytes) throw too_large(std::to_string(info.st_size));
  std::string text(static_cast<size_t>(info.st_size), '\0');
  size_t filled = 0;
  for (;;) {
    if (filled == text.size()) {
      if (text.size() > limits.max_bytes) throw too_large("more than " + std::to_string(limits.max_bytes));
      text.resize(std::min(limits.max_bytes + 1, text.size() + 65536));  // grown since fstat
    }
    const ssize_t got = ::read(fd, text.data() + filled, text.size() - filled);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      throw JsonInputError(JsonInputError::Kind::unreadable, "", std::string("cannot read: ") + std::strerror(errno));
    if (got == 0) break;
    filled += static_cast<size_t>(got);
  }
  text.resize(filled);
  return text;
}

OrderedJson parse_json_input(const std::string& text, const JsonLimits& limits) {
  if (text.size() > limits.max_bytes)
    throw JsonInputError(JsonInputError::Kind::too_large, "", "the text is " + std::to_string(text.size()) + " bytes; at most " +
                                 std::to_string(limits.max_bytes) + " are accepted");
  // nlohmann's lexer takes a NUL byte for the end of the input: `{...}\0garbage` would parse.
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    throw JsonInputError(JsonInputError::Kind::syntax, "",
                         "a NUL byte at offset " + std::to_string(nul) + " (JSON text has none; a binary file?)");
  DocumentBuilder builder(limits);
  try {
    OrderedJson::sax_parse(text, &builder, nlohmann::detail::input_format_t::json, /*strict=*/true,
                           /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception& error) {
    throw JsonInputError(JsonInputError::Kind::syntax, "", "invalid JSON: " + parse_error_text(error));
  }
  return builder.take();
}

}  // namespace harness
