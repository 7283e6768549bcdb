// Profiles merged into the spec, a model's shape written into its dims, and --set overrides applied,
// each write remembered with its origin so that a problem names the profile or option behind it.

#include "experiments/spec_loader.h"

#include <algorithm>
#include <sstream>

#include "experiments/models.h"

namespace harness::spec::loader {
namespace {

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream stream(path);
  std::string part;
  while (std::getline(stream, part, '.')) parts.push_back(part);
  if (!path.empty() && path.back() == '.') parts.emplace_back();
  return parts;
}

std::optional<size_t> as_index(const std::string& text) {
  if (text.empty() || text.size() > 9 ||
      !std::all_of(text.begin(), text.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    return std::nullopt;
  }
  return static_cast<size_t>(std::stoul(text));
}

const std::vector<std::string> kModelDims = {"dims.heads", "dims.kv_heads", "dims.head_dim", "dims.v_head_dim"};

}  // namespace

void deep_merge(OrderedJson& target, const OrderedJson& patch) {
  if (!target.is_object() || !patch.is_object()) {
    target = patch;
    return;
  }
  for (const auto& [key, value] : patch.items()) {
    if (target.contains(key)) {
      deep_merge(target[key], value);
    } else {
      target[key] = value;
    }
  }
}

//! Paths of the values a profile writes (objects are merged, so their leaves are what changes).
void leaf_paths(const OrderedJson& value, const std::string& path, std::vector<std::string>& out) {
  if (value.is_object() && !value.empty()) {
    for (const auto& [key, member] : value.items()) leaf_paths(member, child(path, key), out);
  } else {
    out.push_back(path);
  }
}



//! The value of "--set path=value" as JSON; nullopt when it is not JSON (then it is meant as a
//! word: dims.dtype=fp16). JSON that breaks a limit (nesting, size, duplicate keys, a number out
//! of range) is an error, not a word: throws JsonInputError.
std::optional<OrderedJson> override_value(const std::string& text) {
  try {
    return parse_json_input(text);
  } catch (const JsonInputError& error) {
    if (error.kind() == JsonInputError::Kind::syntax) return std::nullopt;
    throw;
  }
}

//! Applies one "--set path=value"; on a problem reports it and leaves the document unchanged.
void apply_override(OrderedJson& doc, const std::string& argument, const std::string& source,
                    std::vector<SpecIssue>& issues, std::vector<Origin>& origins) {
  const std::string origin = source + " (--set " + argument + ")";
  const auto equals = argument.find('=');
  if (equals == std::string::npos || equals == 0) {
    issues.push_back({origin, "", "--set expects path=value, e.g. dims.anchors=256"});
    return;
  }
  const std::string path = argument.substr(0, equals);
  const std::string text = argument.substr(equals + 1);
  OrderedJson value;
  try {
    value = override_value(text).value_or(OrderedJson(text));
  } catch (const JsonInputError& error) {
    issues.push_back({origin, child(path, error.path()), error.message()});
    return;
  }
  const std::vector<std::string> parts = split_path(path);

  // The whole path must exist in the schema before the document is touched.
  std::vector<SchemaNode::Kind> containers;  // the kind of what parts[i] is looked up in
  const SchemaNode* node = schema().root.get();
  std::string walked;
  for (const std::string& part : parts) {
    const std::string here = child(walked, part);
    if (part.empty()) {
      issues.push_back({origin, path, "empty component in the path"});
      return;
    }
    containers.push_back(node->kind);
    switch (node->kind) {
      case SchemaNode::Kind::any:
        break;
      case SchemaNode::Kind::value:
        issues.push_back({origin, here, walked + " is a value and has no field \"" + part + "\""});
        return;
      case SchemaNode::Kind::object: {
        if (walked.empty() && (part == "profiles" || part == "profile")) {
          issues.push_back({origin, here, "profiles are applied before overrides; choose one with --profile"});
          return;
        }
        const SchemaNode* field = node->field(part);
        if (!field) {
          issues.push_back({origin, here,
                            "unknown field \"" + part + "\"; known fields" + (walked.empty() ? "" : " of " + walked) +
                                ": " + node->field_names()});
          return;
        }
        node = field;
        break;
      }
      case SchemaNode::Kind::map:
        node = node->element.get();
        break;
      case SchemaNode::Kind::array:
        if (!as_index(part)) {
          issues.push_back(
              {origin, here, walked + " is an array; expected an index (0, 1, ...), got \"" + part + "\""});
          return;
        }
        node = node->element.get();
        break;
    }
    walked = here;
  }

  // The document must have the shape the path walks through; absent objects are created.
  const OrderedJson* cursor = &doc;  // nullptr once the path leaves what the document has
  walked.clear();
  for (size_t i = 0; i < parts.size(); ++i) {
    if (containers[i] == SchemaNode::Kind::array) {
      if (!cursor || !cursor->is_array()) {
        issues.push_back({origin, walked,
                          "cannot set " + path + ": " + walked + " is " +
                              (cursor ? describe(*cursor) : std::string("absent")) + ", not an array"});
        return;
      }
      const size_t index = *as_index(parts[i]);
      if (index >= cursor->size()) {
        issues.push_back({origin, child(walked, parts[i]),
                          "index " + parts[i] + " is out of range: " + walked + " has " +
                              std::to_string(cursor->size()) + " entries"});
        return;
      }
      cursor = &(*cursor)[index];
    } else if (cursor && cursor->is_object()) {
      const auto found = cursor->find(parts[i]);
      cursor = found == cursor->end() ? nullptr : &*found;
    } else if (cursor && !cursor->is_null()) {
      issues.push_back(
          {origin, walked, "cannot set " + path + ": " + walked + " is " + describe(*cursor) + ", not an object"});
      return;
    } else {
      cursor = nullptr;
    }
    walked = child(walked, parts[i]);
  }
  OrderedJson* target = &doc;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (containers[i] == SchemaNode::Kind::array) {
      target = &(*target)[*as_index(parts[i])];
    } else {
      if (target->is_null()) *target = OrderedJson::object();
      target = &(*target)[parts[i]];
    }
  }
  *target = std::move(value);
  origins.push_back({path, origin});
}


bool is_model_dim(const std::string& path) { return contains(kModelDims, path); }

// The model (--model, --set model=NAME, or the spec's "model") written into dims: heads, kv_heads,
// head_dim, and v_head_dim where it differs from head_dim. An unknown name is left for validation
// to report with the known ones.
void apply_model(OrderedJson& resolved, const LoadOptions& options, const std::string& source,
                 std::vector<SpecIssue>& issues, std::vector<Origin>& origins) {
  std::string origin = source;
  if (!options.model.empty()) {
    resolved["model"] = options.model;
    origin = source + " (--model " + options.model + ")";
  }
  for (const std::string& argument : options.overrides) {
    if (argument.rfind("model=", 0) != 0) continue;
    resolved["model"] = argument.substr(6);
    origin = source + " (--set " + argument + ")";
  }
  const auto field = resolved.find("model");
  if (field == resolved.end()) return;
  if (!field->is_string()) {
    issues.push_back({origin, "model", "expected the name of a model (a string), got " + describe(*field)});
    resolved.erase("model");
    return;
  }
  const auto model = find_model(field->get<std::string>());
  if (!model) return;
  resolved["model"] = model->name;
  if (!resolved.contains("dims") || !resolved["dims"].is_object()) resolved["dims"] = OrderedJson::object();
  OrderedJson& dims = resolved["dims"];
  dims["heads"] = model->heads;
  dims["kv_heads"] = model->kv_heads;
  dims["head_dim"] = model->head_dim;
  if (model->v_head_dim != model->head_dim) {
    dims["v_head_dim"] = model->v_head_dim;
  } else {
    dims.erase("v_head_dim");
  }
  origins.push_back({"model", origin});
  for (const std::string& path : kModelDims) origins.push_back({path, origin + " (model " + model->name + ")"});
}


}  // namespace harness::spec::loader
