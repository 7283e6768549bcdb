// The spec's schema (which fields exist where) and the helpers every step of loading shares.

#include "experiments/spec_loader.h"

#include <algorithm>

namespace harness::spec::loader {
namespace {

SchemaPtr value_node() { return std::make_shared<SchemaNode>(); }
SchemaPtr object_node(std::vector<std::pair<std::string, SchemaPtr>> fields) {
  auto node = std::make_shared<SchemaNode>();
  node->kind = SchemaNode::Kind::object;
  node->fields = std::move(fields);
  return node;
}
SchemaPtr container_node(SchemaNode::Kind kind, SchemaPtr element) {
  auto node = std::make_shared<SchemaNode>();
  node->kind = kind;
  node->element = std::move(element);
  return node;
}

}  // namespace

const Schema& schema() {
  static const Schema built = [] {
    const auto v = value_node;
    auto dims = object_node({{"batch", v()},
                             {"heads", v()},
                             {"kv_heads", v()},
                             {"head_dim", v()},
                             {"v_head_dim", v()},
                             {"anchors", v()},
                             {"block_size", v()},
                             {"context", v()},
                             {"dtype", v()},
                             {"layers", v()}});
    auto mask = object_node({{"type", v()},
                             {"context_rule", v()},
                             {"in_block", v()},
                             {"documents", v()},
                             {"doc_lengths", container_node(SchemaNode::Kind::array, v())},
                             {"window", v()},
                             {"seed", v()},
                             {"file", v()},
                             {"in_capsule", v()}});
    auto variant = object_node(
        {{"impl", v()}, {"fault", v()}, {"kernel", object_node({{"fwd", v()}, {"bwd", v()}})}, {"deterministic", v()}});
    auto clause = object_node({{"if", v()}, {"then", v()}, {"else", v()}});
    auto any = std::make_shared<SchemaNode>();
    any->kind = SchemaNode::Kind::any;
    std::vector<std::pair<std::string, SchemaPtr>> fields = {
        {"name", v()},
        {"hypothesis", v()},
        {"kind", v()},
        {"dims", dims},
        {"mask", mask},
        {"block_mask", object_node({{"block_size", v()}})},
        {"variants", container_node(SchemaNode::Kind::map, variant)},
        {"variant_order", container_node(SchemaNode::Kind::array, v())},
        {"measure", container_node(SchemaNode::Kind::array, v())},
        {"repeats", v()},
        {"warmup", v()},
        {"timeout_s", v()},
        {"seed", v()},
        {"check", object_node({{"enabled", v()}, {"factor", v()}, {"mean_factor", v()}, {"atol", v()}, {"rtol", v()}})},
        {"verdict", container_node(SchemaNode::Kind::array, clause)},
        {"params", any},
        {"sweep", container_node(SchemaNode::Kind::map, container_node(SchemaNode::Kind::array, v()))},
        {"sweep_order", container_node(SchemaNode::Kind::array, v())},
        {"scaling", object_node({{"metric", v()}, {"models", container_node(SchemaNode::Kind::array, v())}})},
    };
    Schema schema;
    schema.profile = object_node(fields);
    fields.emplace_back("profile", v());
    fields.emplace_back("model", v());
    fields.emplace_back("profiles", container_node(SchemaNode::Kind::map, schema.profile));
    schema.root = object_node(std::move(fields));
    return schema;
  }();
  return built;
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
  return out;
}


bool is_identifier(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

std::string child(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

//! `"abc" (string)`, `0 (number)`, `null`: what was found, for messages.
std::string describe(const OrderedJson& value) {
  if (value.is_null()) return "null";
  return clip_json(value, 60) + " (" + value.type_name() + ")";
}

std::optional<int64_t> as_integer(const OrderedJson& value) {
  if (value.is_number_unsigned()) {
    const auto u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    // 1e3 is a float in JSON; accept it where an integer is meant, exactly representable only.
    const double d = value.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::abs(d) <= 9007199254740992.0) return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

//! Reports fields the schema does not know, anywhere below `path`.
void check_known_fields(const OrderedJson& value, const SchemaNode& node, const std::string& path, Checker& checker) {
  switch (node.kind) {
    case SchemaNode::Kind::value:
    case SchemaNode::Kind::any:
      return;
    case SchemaNode::Kind::object:
      if (!value.is_object()) return;
      for (const auto& [key, member] : value.items()) {
        if (const SchemaNode* field = node.field(key)) {
          check_known_fields(member, *field, child(path, key), checker);
        } else {
          checker.issue(child(path, key), "unknown field \"" + key + "\"; known fields" +
                                              (path.empty() ? "" : " of " + path) + ": " + node.field_names());
        }
      }
      return;
    case SchemaNode::Kind::map:
      if (!value.is_object()) return;
      for (const auto& [key, member] : value.items())
        check_known_fields(member, *node.element, child(path, key), checker);
      return;
    case SchemaNode::Kind::array:
      if (!value.is_array()) return;
      for (size_t i = 0; i < value.size(); ++i)
        check_known_fields(value[i], *node.element, child(path, std::to_string(i)), checker);
      return;
  }
}

//! Why `path` cannot be swept, or "" when it can: it must name a field of dims, mask, block_mask,
//! check, params or a top-level number such as repeats, never the experiment's identity, variants
//! or rule.
std::string sweep_path_problem(const std::string& path) {
  static const std::vector<std::string> fixed = {"name",    "hypothesis", "kind",    "profile", "profiles", "variants",
                                                 "variant_order", "measure", "verdict", "sweep",   "sweep_order",
                                                 "scaling", "model"};
  const SchemaNode* node = schema().root.get();
  std::string walked;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty()) return "empty component in the path \"" + path + "\"";
    if (walked.empty() && contains(fixed, part)) return "\"" + part + "\" cannot be swept; sweep fields of dims, mask or params";
    if (node->kind == SchemaNode::Kind::any) return "";
    if (node->kind != SchemaNode::Kind::object) return walked + " is not an object of fields; a sweep path names fields";
    node = node->field(part);
    if (!node) return "unknown field \"" + part + "\" in the sweep path \"" + path + "\"";
    walked = child(walked, part);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (node->kind == SchemaNode::Kind::object || node->kind == SchemaNode::Kind::map)
    return path + " is an object; sweep one of its fields";
  return "";
}

//! Whether `path` names an array-valued field (such as mask.doc_lengths), which an array sets
//! rather than sweeps.
bool is_array_field(const std::string& path) {
  const SchemaNode* node = schema().root.get();
  size_t start = 0;
  while (node && node->kind == SchemaNode::Kind::object) {
    const size_t dot = path.find('.', start);
    node = node->field(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return node && (node->kind == SchemaNode::Kind::array || node->kind == SchemaNode::Kind::any);
}


}  // namespace harness::spec::loader
