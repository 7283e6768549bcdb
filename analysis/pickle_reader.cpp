#include "analysis/pickle_reader.h"

#include <cstdint>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace harness::analysis {
namespace {

// Containers are shared: the memo may hand out a list that later opcodes still append to.
struct Node {
  enum class Kind { scalar, list, dict } kind = Kind::scalar;
  nlohmann::json scalar;
  std::vector<std::shared_ptr<Node>> items;                                   // list, tuple
  std::vector<std::pair<std::shared_ptr<Node>, std::shared_ptr<Node>>> pairs;  // dict
};
using NodePtr = std::shared_ptr<Node>;

NodePtr scalar(nlohmann::json value) {
  auto node = std::make_shared<Node>();
  node->scalar = std::move(value);
  return node;
}
NodePtr container(Node::Kind kind) {
  auto node = std::make_shared<Node>();
  node->kind = kind;
  return node;
}

// Deep enough for any snapshot (dict > list > dict > list of frames > dict); a self-containing
// list (possible through the memo) stops here instead of recursing forever.
constexpr int kMaxDepth = 64;

nlohmann::json to_json(const NodePtr& node, int depth) {
  if (depth > kMaxDepth) throw PickleError("pickle: values nested deeper than 64 levels (a self-referencing container?)");
  switch (node->kind) {
    case Node::Kind::scalar:
      return node->scalar;
    case Node::Kind::list: {
      nlohmann::json array = nlohmann::json::array();
      for (const auto& item : node->items) array.push_back(to_json(item, depth + 1));
      return array;
    }
    case Node::Kind::dict: {
      nlohmann::json object = nlohmann::json::object();
      for (const auto& [key, value] : node->pairs) {
        nlohmann::json k = to_json(key, depth + 1);
        object[k.is_string() ? k.get<std::string>() : k.dump()] = to_json(value, depth + 1);
      }
      return object;
    }
  }
  return nullptr;
}

class Reader {
 public:
  explicit Reader(const std::string& bytes) : bytes_(bytes) {}

  nlohmann::json run() {
    while (true) {
      const size_t at = position_;
      const auto opcode = static_cast<unsigned char>(take(1)[0]);
      switch (opcode) {
        case 0x80: take(1); break;                               // PROTO
        case 0x95: take(8); break;                               // FRAME: a length hint only
        case '.': {                                              // STOP
          if (stack_.empty()) throw error(at, "STOP with an empty stack");
          return to_json(stack_.back(), 0);
        }
        case '}': push(container(Node::Kind::dict)); break;      // EMPTY_DICT
        case ']': case ')': push(container(Node::Kind::list)); break;  // EMPTY_LIST, EMPTY_TUPLE
        case '(': marks_.push_back(stack_.size()); break;        // MARK
        case 's': {                                              // SETITEM
          NodePtr value = pop(at), key = pop(at);
          dict_at_top(at)->pairs.emplace_back(std::move(key), std::move(value));
          break;
        }
        case 'u': {                                              // SETITEMS
          auto items = pop_to_mark(at);
          if (items.size() % 2) throw error(at, "SETITEMS with an odd number of values");
          NodePtr dict = dict_at_top(at);
          for (size_t i = 0; i < items.size(); i += 2) dict->pairs.emplace_back(items[i], items[i + 1]);
          break;
        }
        case 'a': {                                              // APPEND
          NodePtr value = pop(at);
          list_at_top(at)->items.push_back(std::move(value));
          break;
        }
        case 'e': {                                              // APPENDS
          auto items = pop_to_mark(at);
          NodePtr list = list_at_top(at);
          list->items.insert(list->items.end(), items.begin(), items.end());
          break;
        }
        case 't': case 'l': {                                    // TUPLE, LIST
          auto node = container(Node::Kind::list);
          node->items = pop_to_mark(at);
          push(node);
          break;
        }
        case 0x85: case 0x86: case 0x87: {                       // TUPLE1..3
          auto node = container(Node::Kind::list);
          node->items.resize(opcode - 0x84);
          for (size_t i = node->items.size(); i-- > 0;) node->items[i] = pop(at);
          push(node);
          break;
        }
        case 'd': {                                              // DICT
          auto items = pop_to_mark(at);
          if (items.size() % 2) throw error(at, "DICT with an odd number of values");
          auto node = container(Node::Kind::dict);
          for (size_t i = 0; i < items.size(); i += 2) node->pairs.emplace_back(items[i], items[i + 1]);
          push(node);
          break;
        }
        case 'J': push(scalar(static_cast<int32_t>(little_endian(4)))); break;   // BININT
        case 'K': push(scalar(little_endian(1))); break;                         // BININT1
        case 'M': push(scalar(little_endian(2))); break;                         // BININT2
        case 0x8a: push(long_integer(little_endian(1))); break;                  // LONG1
        case 0x8b: push(long_integer(static_cast<int32_t>(little_endian(4)))); break;  // LONG4
        case 'G': {                                                              // BINFLOAT (big-endian)
          const std::string raw = take(8);
          uint64_t bits = 0;
          for (unsigned char c : raw) bits = (bits << 8) | c;
          double value;
          std::memcpy(&value, &bits, sizeof value);
          push(scalar(value));
          break;
        }
        case 'N': push(scalar(nullptr)); break;
        case 0x88: push(scalar(true)); break;
        case 0x89: push(scalar(false)); break;
        case 'X': case 'B': push(scalar(take(length(at, little_endian(4))))); break;      // BINUNICODE, BINBYTES
        case 0x8c: case 'C': push(scalar(take(little_endian(1)))); break;                // SHORT_BINUNICODE, SHORT_BINBYTES
        case 0x8d: case 0x8e: push(scalar(take(length(at, little_endian(8))))); break;   // BINUNICODE8, BINBYTES8
        case 'q': memo_[little_endian(1)] = top(at); break;                            // BINPUT
        case 'r': memo_[little_endian(4)] = top(at); break;                            // LONG_BINPUT
        case 0x94: memo_[memo_.size()] = top(at); break;                               // MEMOIZE
        case 'h': case 'j': {                                                          // BINGET, LONG_BINGET
          const uint64_t index = little_endian(opcode == 'h' ? 1 : 4);
          const auto found = memo_.find(index);
          if (found == memo_.end()) throw error(at, fmt::format("memo entry {} was never stored", index));
          push(found->second);
          break;
        }
        case '0': pop(at); break;                                                      // POP
        case '2': push(top(at)); break;                                                // DUP
        default:
          throw error(at, fmt::format("opcode 0x{:02x} ('{}') is outside the plain-data subset this reader accepts",
                                      opcode, opcode >= 0x20 && opcode < 0x7f ? std::string(1, static_cast<char>(opcode)) : "?"));
      }
    }
  }

 private:
  PickleError error(size_t at, const std::string& what) const {
    return PickleError(fmt::format("pickle: byte {}: {}", at, what));
  }

  std::string take(uint64_t count) {
    if (count > bytes_.size() - position_)
      throw PickleError(fmt::format("pickle: truncated: {} bytes wanted at byte {} of {}", count, position_, bytes_.size()));
    std::string part = bytes_.substr(position_, count);
    position_ += count;
    return part;
  }
  uint64_t little_endian(int count) {
    const std::string raw = take(static_cast<uint64_t>(count));
    uint64_t value = 0;
    for (int i = count - 1; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(raw[i]);
    return value;
  }
  uint64_t length(size_t at, uint64_t value) const {
    if (value > bytes_.size()) throw error(at, fmt::format("a length of {} bytes in a pickle of {}", value, bytes_.size()));
    return value;
  }
  // Two's complement, little-endian, of `count` bytes: exact up to 8 bytes, a double beyond.
  NodePtr long_integer(int64_t count) {
    if (count < 0) throw PickleError(fmt::format("pickle: negative LONG length at byte {}", position_));
    const std::string raw = take(static_cast<uint64_t>(count));
    if (count == 0) return scalar(0);
    const bool negative = static_cast<unsigned char>(raw.back()) & 0x80;
    if (count <= 8) {
      uint64_t value = negative ? ~uint64_t{0} : 0;
      for (int64_t i = count - 1; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(raw[static_cast<size_t>(i)]);
      if (negative) return scalar(static_cast<int64_t>(value));
      if (value > static_cast<uint64_t>(INT64_MAX)) return scalar(value);
      return scalar(static_cast<int64_t>(value));
    }
    double value = 0.0;
    for (int64_t i = count - 1; i >= 0; --i) value = value * 256.0 + static_cast<unsigned char>(raw[static_cast<size_t>(i)]);
    if (negative) value -= std::ldexp(1.0, static_cast<int>(8 * count));
    return scalar(value);
  }

  void push(NodePtr node) { stack_.push_back(std::move(node)); }
  NodePtr top(size_t at) const {
    if (stack_.empty() || (!marks_.empty() && marks_.back() == stack_.size())) throw error(at, "the stack is empty");
    return stack_.back();
  }
  NodePtr pop(size_t at) {
    NodePtr node = top(at);
    stack_.pop_back();
    return node;
  }
  std::vector<NodePtr> pop_to_mark(size_t at) {
    if (marks_.empty()) throw error(at, "no MARK to pop to");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<NodePtr> items(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return items;
  }
  NodePtr dict_at_top(size_t at) const {
    NodePtr node = top(at);
    if (node->kind != Node::Kind::dict) throw error(at, "SETITEM(S) on something that is not a dict");
    return node;
  }
  NodePtr list_at_top(size_t at) const {
    NodePtr node = top(at);
    if (node->kind != Node::Kind::list) throw error(at, "APPEND(S) on something that is not a list");
    return node;
  }

  const std::string& bytes_;
  size_t position_ = 0;
  std::vector<NodePtr> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, NodePtr> memo_;
};

}  // namespace

nlohmann::json read_pickle(const std::string& bytes) { return Reader(bytes).run(); }

}  // namespace harness::analysis
