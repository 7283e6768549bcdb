#pragma once
// Reading JSON that a user (or an attacker) wrote: specs, --set values, capsule headers, import
// metadata. Bounded (size and nesting depth), strict (duplicate keys are an error, not "last one
// wins"), and every error names the JSON path where it happened. Values quoted in messages are
// clipped, so a 10 MB string never ends up on the terminal. Torch-free.

#include <cstddef>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace harness {

//! What a JSON input may be.
struct JsonLimits {
  size_t max_bytes = size_t{16} << 20;  //!< a spec is a few KB; 16 MiB leaves room for params
  int max_depth = 64;                   //!< specs nest 4 deep; python params a little more
  //! Members of one object: a spec's objects have tens; the bound keeps every lookup in a member
  //! list (ordered_json searches it linearly) and every check over an object's members short.
  size_t max_object_members = 4096;
};

//! Why a JSON text was refused, and where: `path` is the JSON path ("dims.heads", "sweep.x.3"),
//! "" at the top level.
class JsonInputError : public std::runtime_error {
 public:
  //! syntax: not JSON at all; the others: JSON that breaks a rule of this reader.
  enum class Kind { syntax, too_large, too_deep, duplicate_key, number_range, unreadable };
  JsonInputError(Kind kind, std::string path, std::string message)
      : std::runtime_error(path.empty() ? message : path + ": " + message), kind_(kind), path_(std::move(path)),
        message_(std::move(message)) {}
  Kind kind() const { return kind_; }
  const std::string& path() const { return path_; }
  const std::string& message() const { return message_; }

 private:
  Kind kind_;
  std::string path_, message_;
};

//! Parses `text` (key order kept) in time linear in its length. Throws JsonInputError for invalid
//! JSON, a NUL byte, a number out of range, a duplicate key, nesting deeper than `limits.max_depth`,
//! an object of more than `limits.max_object_members` members or text longer than `limits.max_bytes`.
nlohmann::ordered_json parse_json_input(const std::string& text, const JsonLimits& limits = {});

//! The text of a JSON input file, read only when it can be accepted: a regular file (a FIFO or a
//! device such as /dev/zero would be read forever; opening does not wait for a FIFO's writer)
//! whose size, checked before reading, is at most `limits.max_bytes` (a file growing meanwhile is
//! read no further than that). Throws JsonInputError (too_large naming the size, or unreadable).
std::string read_json_input_file(const std::string& path, const JsonLimits& limits = {});

//! `text` itself when at most `max_bytes` long, else its start and "... (N bytes)"; cuts at a
//! UTF-8 character boundary.
std::string clip_text(const std::string& text, size_t max_bytes = 200);

//! A JSON value for a message: its compact text, clipped, without dumping more than needed.
std::string clip_json(const nlohmann::ordered_json& value, size_t max_bytes = 60);

}  // namespace harness
