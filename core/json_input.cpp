#include "core/json_input.h"

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

OrderedJson parse_json_input(const std::string& text, const JsonLimits& limits) {
  if (text.size() > limits.max_bytes)
    throw JsonInputError(JsonInputError::Kind::too_large, "", "the text is " + std::to_string(text.size()) + " bytes; at most " +
                                 std::to_string(limits.max_bytes) + " are accepted");
  std::vector<OpenContainer> open;
  // A value ended: the next one is the array's next element, or the object's next member.
  const auto completed = [&open] {
    if (open.empty()) return;
    if (open.back().is_array) ++open.back().index;
    else open.back().key.clear();
  };
  const OrderedJson::parser_callback_t callback = [&](int depth, nlohmann::json::parse_event_t event,
                                                      OrderedJson& parsed) -> bool {
    using Event = nlohmann::json::parse_event_t;
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        if (depth + 1 > limits.max_depth)
          throw JsonInputError(JsonInputError::Kind::too_deep, path_of(open), "nested more than " + std::to_string(limits.max_depth) + " levels deep");
        open.push_back({event == Event::array_start, 0, "", {}});
        break;
      case Event::key: {
        OpenContainer& object = open.back();
        const auto& key = parsed.get_ref<const std::string&>();
        if (!object.keys.insert(key).second) {
          object.key = key;
          throw JsonInputError(JsonInputError::Kind::duplicate_key, path_of(open), "duplicate key \"" + clip_text(key, 60) +
                                                  "\" (JSON readers disagree on which one counts; write it once)");
        }
        object.key = key;
        break;
      }
      case Event::object_end:
      case Event::array_end:
        open.pop_back();
        completed();
        break;
      case Event::value:
        completed();
        break;
    }
    return true;
  };
  try {
    return OrderedJson::parse(text, callback, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::out_of_range& error) {
    // The only out_of_range the parser throws: a number beyond double's range (1e999).
    throw JsonInputError(JsonInputError::Kind::number_range, path_of(open), "number out of range (" + parse_error_text(error) + ")");
  } catch (const nlohmann::json::exception& error) {
    throw JsonInputError(JsonInputError::Kind::syntax, path_of(open), "invalid JSON: " + parse_error_text(error));
  }
}

}  // namespace harness
