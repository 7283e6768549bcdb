#include "replay/capsule_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "core/errors.h"
#include "core/files.h"
#include "core/json_input.h"
#include "db/store.h"

namespace harness::replay {
namespace {

namespace fs = std::filesystem;

// The preamble line is short; a file whose first line is longer is not a capsule.
constexpr size_t kMaxPreambleBytes = 128;

// A file descriptor closed on scope exit.
class File {
 public:
  File(const std::string& path, int flags, mode_t mode = 0) : path_(path), fd_(::open(path.c_str(), flags, mode)) {}
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  int fd() const { return fd_; }
  bool ok() const { return fd_ >= 0; }

  // Reads exactly `bytes` at `offset`; false when the file ends first.
  bool read_at(void* out, size_t bytes, int64_t offset) const {
    auto* cursor = static_cast<char*>(out);
    while (bytes > 0) {
      const ssize_t got = ::pread(fd_, cursor, bytes, offset);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
      cursor += got;
      bytes -= static_cast<size_t>(got);
      offset += got;
    }
    return true;
  }

 private:
  std::string path_;
  int fd_;
};

int64_t align_up(int64_t value) { return (value + kCapsuleAlignment - 1) / kCapsuleAlignment * kCapsuleAlignment; }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
  return text + "]";
}

// Elements of a shape; nullopt when a dimension is negative or the count overflows int64 (a
// damaged or hostile header).
std::optional<int64_t> numel(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t extent : shape) {
    if (extent < 0 || __builtin_mul_overflow(count, extent, &count)) return std::nullopt;
  }
  return count;
}

bool is_sha256_hex(const std::string& text) {
  return text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// safetensors' dtype name of a capsule dtype.
std::optional<std::string> safetensors_dtype(const std::string& dtype) {
  static const std::pair<const char*, const char*> kNames[] = {{"bf16", "BF16"},   {"fp16", "F16"}, {"fp32", "F32"},
                                                               {"fp64", "F64"},    {"int32", "I32"}, {"int64", "I64"},
                                                               {"uint8", "U8"},    {"bool", "BOOL"}};
  for (const auto& [ours, theirs] : kNames)
    if (dtype == ours) return std::string(theirs);
  return std::nullopt;
}

// The legacy (version 1) layout: "harness-capsule 1 <header bytes> <payload offset>\n", the
// header, zeros up to the payload. Sets the header text and payload offset.
std::string read_legacy_header(const File& in, CapsuleInfo& info, const std::string& first) {
  const std::string& path = info.path;
  const size_t line_end = first.find('\n');
  if (line_end == std::string::npos)
    throw CapsuleError(path + ": truncated or corrupt: the preamble line has no end (" + std::to_string(info.file_bytes) +
                       " bytes)");
  std::istringstream preamble(first.substr(std::strlen(kCapsuleMagic), line_end - std::strlen(kCapsuleMagic)));
  int version = 0;
  int64_t header_bytes = -1;
  preamble >> version >> header_bytes >> info.payload_offset;
  if (!preamble || header_bytes < 2 || info.payload_offset < static_cast<int64_t>(line_end + 1) + header_bytes)
    throw CapsuleError(path + ": corrupt preamble '" + first.substr(0, line_end) + "'");
  if (version != kLegacyCapsuleVersion)
    throw CapsuleError(path + ": capsule format version " + std::to_string(version) + "; this harness reads versions " +
                       std::to_string(kLegacyCapsuleVersion) + " and " + std::to_string(kCapsuleVersion));
  const int64_t header_start = static_cast<int64_t>(line_end) + 1;
  if (info.file_bytes < header_start + header_bytes)
    throw CapsuleError(path + ": truncated: " + std::to_string(info.file_bytes) + " bytes, but the header alone ends at byte " +
                       std::to_string(header_start + header_bytes));
  std::string header_text(static_cast<size_t>(header_bytes), '\0');
  if (!in.read_at(header_text.data(), header_text.size(), header_start))
    throw CapsuleError(path + ": cannot read the header");
  return header_text;
}

// A safetensors file's JSON header (u64 little-endian length, then that much JSON); sets the
// payload offset. Throws CapsuleError naming the file.
nlohmann::json read_safetensors_layout(const File& in, CapsuleInfo& info) {
  const std::string& path = info.path;
  unsigned char length_bytes[8];
  if (info.file_bytes < 8 || !in.read_at(length_bytes, 8, 0)) throw CapsuleError(path + ": truncated: shorter than 8 bytes");
  uint64_t layout_bytes = 0;
  for (int byte = 7; byte >= 0; --byte) layout_bytes = (layout_bytes << 8) | length_bytes[byte];
  if (layout_bytes < 2 || layout_bytes > kMaxSafetensorsHeaderBytes)
    throw CapsuleError(path + ": not a safetensors file (its first 8 bytes are no plausible header length)");
  if (static_cast<uint64_t>(info.file_bytes) < 8 + layout_bytes)
    throw CapsuleError(path + ": truncated: " + std::to_string(info.file_bytes) + " bytes, but the safetensors header alone ends at byte " +
                       std::to_string(8 + layout_bytes));
  std::string layout_text(static_cast<size_t>(layout_bytes), '\0');
  if (!in.read_at(layout_text.data(), layout_text.size(), 8)) throw CapsuleError(path + ": cannot read the safetensors header");
  auto layout = nlohmann::json::parse(layout_text, nullptr, false);
  if (layout.is_discarded() || !layout.is_object())
    throw CapsuleError(path + ": not a safetensors file (the bytes after the first 8 are not a JSON object)");
  info.payload_offset = 8 + static_cast<int64_t>(layout_bytes);
  return layout;
}

// The capsule layout (version 2): a safetensors file whose __metadata__ carries the capsule
// header as a string. Checks that safetensors' own entries say what the capsule header says.
// Returns the header text.
std::string read_safetensors_header(const File& in, CapsuleInfo& info) {
  const std::string& path = info.path;
  const nlohmann::json layout = read_safetensors_layout(in, info);
  const auto metadata = layout.find(kSafetensorsMetadataKey);
  if (metadata == layout.end() || !metadata->is_object() || !metadata->contains("capsule") || !(*metadata)["capsule"].is_string())
    throw CapsuleError(path + ": a safetensors file without a harness capsule header (no __metadata__.capsule); a step saved "
                       "from Python replays with `harness replay --import " + path + "`");
  if (metadata->value("format", "") != kCapsuleMagic || metadata->value("version", "") != std::to_string(kCapsuleVersion))
    throw CapsuleError(path + ": capsule format '" + metadata->value("format", "") + "' version '" + metadata->value("version", "") +
                       "'; this harness reads " + kCapsuleMagic + " versions " + std::to_string(kLegacyCapsuleVersion) +
                       " and " + std::to_string(kCapsuleVersion));
  std::string header_text = (*metadata)["capsule"].get<std::string>();
  const auto header = nlohmann::json::parse(header_text, nullptr, false);
  if (header.is_discarded() || !header.is_object() || !header.contains("tensors") || !header["tensors"].is_array())
    throw CapsuleError(path + ": corrupt header: __metadata__.capsule is not a capsule header with a tensor list");
  // Every tensor safetensors would load is one the capsule lists, at the same place.
  size_t listed = 0;
  for (const auto& item : layout.items()) {
    // Named, not structured bindings: clang 14 (the sanitizer build) cannot capture those in a lambda.
    const std::string& name = item.key();
    const nlohmann::json& entry = item.value();
    if (name == kSafetensorsMetadataKey) continue;
    ++listed;
    const auto ours = std::find_if(header["tensors"].begin(), header["tensors"].end(),
                                   [&](const nlohmann::json& t) { return t.value("name", "") == name; });
    if (ours == header["tensors"].end())
      throw CapsuleError(path + ": tensor " + name + " is in the safetensors header but not in the capsule header");
    const int64_t offset = ours->value("offset", int64_t{-1}), bytes = ours->value("bytes", int64_t{-1});
    const auto dtype = safetensors_dtype(ours->value("dtype", ""));
    if (!entry.is_object() || !dtype || entry.value("dtype", "") != *dtype || entry.value("shape", nlohmann::json()) != (*ours)["shape"] ||
        entry.value("data_offsets", nlohmann::json()) != nlohmann::json{offset, offset + bytes})
      throw CapsuleError(path + ": tensor " + name + ": the safetensors header (" + entry.dump() +
                         ") disagrees with the capsule header");
  }
  if (listed != header["tensors"].size())
    throw CapsuleError(path + ": the capsule header lists " + std::to_string(header["tensors"].size()) +
                       " tensors, the safetensors header " + std::to_string(listed));
  return header_text;
}

// An integer field of a header entry; floats and out-of-range numbers are damage, not sizes.
int64_t header_integer(const nlohmann::json& json, const char* key) {
  const nlohmann::json& value = json.at(key);
  if (!value.is_number_integer() || (value.is_number_unsigned() && value.get<uint64_t>() > INT64_MAX))
    throw CapsuleError(std::string("'") + key + "' is not an integer in range");
  return value.get<int64_t>();
}

TensorEntry parse_entry(const nlohmann::json& json, const std::string& where) {
  TensorEntry entry;
  try {
    entry.name = json.at("name").get<std::string>();
    entry.dtype = json.at("dtype").get<std::string>();
    const nlohmann::json& shape = json.at("shape");
    if (!shape.is_array() || shape.size() > 16) throw CapsuleError("'shape' is not a list of at most 16 sizes");
    for (const auto& extent : shape) {
      if (!extent.is_number_integer() || (extent.is_number_unsigned() && extent.get<uint64_t>() > INT64_MAX))
        throw CapsuleError("'shape' holds " + clip_json(nlohmann::ordered_json(extent)));
      entry.shape.push_back(extent.get<int64_t>());
    }
    entry.offset = header_integer(json, "offset");
    entry.bytes = header_integer(json, "bytes");
    entry.sha256 = json.at("sha256").get<std::string>();
    if (entry.name.size() > 256 || entry.dtype.size() > 16 || entry.sha256.size() > 64)
      throw CapsuleError("a name, dtype or sha256 is too long");
  } catch (const nlohmann::json::exception& error) {
    throw CapsuleError(where + ": corrupt header: a tensor entry is malformed (" + clip_text(error.what(), 200) + ")");
  } catch (const CapsuleError& error) {
    throw CapsuleError(where + ": corrupt header: a tensor entry is malformed (" + error.what() + ")");
  }
  return entry;
}

// Decodes element i of a little-endian buffer of `dtype` into a double.
double element(const std::string& bytes, const std::string& dtype, int64_t i) {
  const char* at = bytes.data();
  if (dtype == "bf16") {
    uint16_t half;
    std::memcpy(&half, at + 2 * i, 2);
    const uint32_t bits = static_cast<uint32_t>(half) << 16;
    float value;
    std::memcpy(&value, &bits, 4);
    return value;
  }
  if (dtype == "fp16") {
    uint16_t half;
    std::memcpy(&half, at + 2 * i, 2);
    const int sign = (half >> 15) ? -1 : 1;
    const int exponent = (half >> 10) & 0x1f;
    const int mantissa = half & 0x3ff;
    if (exponent == 0) return sign * std::ldexp(mantissa, -24);
    if (exponent == 31) return mantissa ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
    return sign * std::ldexp(mantissa + 1024, exponent - 25);
  }
  if (dtype == "fp32") {
    float value;
    std::memcpy(&value, at + 4 * i, 4);
    return value;
  }
  if (dtype == "fp64") {
    double value;
    std::memcpy(&value, at + 8 * i, 8);
    return value;
  }
  if (dtype == "int32") {
    int32_t value;
    std::memcpy(&value, at + 4 * i, 4);
    return value;
  }
  if (dtype == "int64") {
    int64_t value;
    std::memcpy(&value, at + 8 * i, 8);
    return static_cast<double>(value);
  }
  if (dtype == "uint8" || dtype == "bool") return static_cast<unsigned char>(at[i]);
  throw CapsuleError("cannot compare tensors of dtype " + dtype);
}

template <typename T>
std::vector<T> integers(const std::string& bytes) {
  std::vector<T> values(bytes.size() / sizeof(T));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  return values;
}

}  // namespace

const TensorEntry* CapsuleInfo::find(const std::string& name) const {
  for (const auto& entry : tensors)
    if (entry.name == name) return &entry;
  return nullptr;
}

std::optional<int64_t> dtype_bytes(const std::string& dtype) {
  if (dtype == "bf16" || dtype == "fp16") return 2;
  if (dtype == "fp32" || dtype == "int32") return 4;
  if (dtype == "fp64" || dtype == "int64") return 8;
  if (dtype == "uint8" || dtype == "bool") return 1;
  return std::nullopt;
}

std::string layer_tensor_name(const std::string& tensor, int64_t layer) { return tensor + "." + std::to_string(layer); }

std::string sha256_of(const void* data, size_t bytes) {
  return db::sha256_hex(std::string(static_cast<const char*>(data), bytes));
}

std::vector<std::string> sha256_parallel(const std::vector<std::pair<const void*, size_t>>& ranges) {
  std::vector<std::string> hashes(ranges.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < ranges.size(); i = next++) hashes[i] = sha256_of(ranges[i].first, ranges[i].second);
  };
  const size_t threads = std::min<size_t>(ranges.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& thread : pool) thread.join();
  return hashes;
}

WrittenCapsule write_capsule_file(const std::string& dir, nlohmann::json header, const std::vector<TensorData>& tensors,
                                  const std::string& extension) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) throw CapsuleError("cannot create the artifact folder " + dir + ": " + error.message());

  std::vector<std::pair<const void*, size_t>> ranges;
  for (const auto& tensor : tensors) ranges.emplace_back(tensor.data, static_cast<size_t>(tensor.bytes));
  const std::vector<std::string> hashes = sha256_parallel(ranges);

  // safetensors wants the tensors back to back, covering the data exactly (no padding between
  // them). Widest elements first, so that with the data starting at a multiple of 64 every
  // tensor starts at a multiple of its element size.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_bytes(tensors[a].dtype).value_or(1) > dtype_bytes(tensors[b].dtype).value_or(1);
  });
  nlohmann::json entries = nlohmann::json::array();
  nlohmann::json layout = nlohmann::json::object();
  int64_t payload_bytes = 0;
  for (const size_t i : order) {
    const auto& tensor = tensors[i];
    const auto st_dtype = safetensors_dtype(tensor.dtype);
    if (!st_dtype) throw CapsuleError("cannot store tensor " + tensor.name + " of dtype " + tensor.dtype + " in a capsule");
    if (tensor.name == kSafetensorsMetadataKey) throw CapsuleError("a tensor cannot be named " + std::string(kSafetensorsMetadataKey));
    entries.push_back({{"name", tensor.name}, {"dtype", tensor.dtype}, {"shape", tensor.shape},
                       {"offset", payload_bytes}, {"bytes", tensor.bytes}, {"sha256", hashes[i]}});
    layout[tensor.name] = {{"dtype", *st_dtype}, {"shape", tensor.shape}, {"data_offsets", {payload_bytes, payload_bytes + tensor.bytes}}};
    payload_bytes += tensor.bytes;
  }
  header["format"] = kCapsuleMagic;
  header["version"] = kCapsuleVersion;
  header["tensors"] = entries;
  header["payload_bytes"] = payload_bytes;
  // The capsule header travels as one string of safetensors' metadata (a map of strings); its
  // SHA-256, over the text exactly as stored, is the capsule's id.
  const std::string header_text = header.dump();
  const std::string sha = db::sha256_hex(header_text);
  layout[kSafetensorsMetadataKey] = {{"format", kCapsuleMagic}, {"version", std::to_string(kCapsuleVersion)},
                                     {"capsule", header_text}};
  std::string layout_text = layout.dump();
  // Spaces after the JSON (still valid JSON) so that the data starts at a multiple of 64.
  layout_text.append(static_cast<size_t>(align_up(8 + static_cast<int64_t>(layout_text.size())) - 8) - layout_text.size(), ' ');
  const int64_t payload_offset = 8 + static_cast<int64_t>(layout_text.size());
  std::string preamble(8, '\0');
  uint64_t layout_bytes = layout_text.size();
  for (int byte = 0; byte < 8; ++byte) preamble[byte] = static_cast<char>((layout_bytes >> (8 * byte)) & 0xff);

  WrittenCapsule written;
  written.sha256 = sha;
  written.path = fs::absolute(fs::path(dir) / (sha + extension)).string();
  written.bytes = payload_offset + payload_bytes;
  if (fs::exists(written.path)) return written;  // same name, same content: recorded before

  try {
    AtomicFile out(written.path);
    out.write(preamble.data(), preamble.size());
    out.write(layout_text.data(), layout_text.size());
    for (const size_t i : order) out.write(tensors[i].data, static_cast<size_t>(tensors[i].bytes));
    // Content-addressed: when another trial stored the same capsule meanwhile, theirs stays.
    written.created = out.commit(AtomicFile::Existing::kKeep);
  } catch (const InfraError& error) {
    throw CapsuleError(error.what());
  }
  return written;
}

bool is_safetensors_file(const std::string& path) {
  File in(path, O_RDONLY);
  char start[9];
  return in.ok() && in.read_at(start, sizeof start, 0) && start[8] == '{';
}

CapsuleInfo read_safetensors(const std::string& path) {
  File in(path, O_RDONLY);
  if (!in.ok()) throw CapsuleError(path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat status {};
  if (::fstat(in.fd(), &status) != 0) throw CapsuleError(path + ": cannot stat");
  CapsuleInfo info;
  info.path = path;
  info.file_bytes = status.st_size;
  const nlohmann::json layout = read_safetensors_layout(in, info);
  info.header = nlohmann::json::object();
  int64_t data_end = 0;
  for (const auto& [name, entry] : layout.items()) {
    if (name == kSafetensorsMetadataKey) {
      if (!entry.is_object()) throw CapsuleError(path + ": __metadata__ is not a map of strings");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) throw CapsuleError(path + ": __metadata__." + key + " is not a string");
        info.header[key] = value;
      }
      continue;
    }
    TensorEntry tensor;
    tensor.name = name;
    try {
      const std::string st_dtype = entry.at("dtype").get<std::string>();
      for (const char* ours : {"bf16", "fp16", "fp32", "fp64", "int32", "int64", "uint8", "bool"})
        if (safetensors_dtype(ours) == st_dtype) tensor.dtype = ours;
      if (tensor.dtype.empty()) throw CapsuleError(path + ": tensor " + name + " has dtype " + st_dtype + ", which a step cannot hold");
      tensor.shape = entry.at("shape").get<std::vector<int64_t>>();
      const auto offsets = entry.at("data_offsets").get<std::vector<int64_t>>();
      if (offsets.size() != 2 || offsets[0] < 0 || offsets[1] < offsets[0]) throw CapsuleError(path + ": tensor " + name + " has bad data_offsets");
      tensor.offset = offsets[0];
      tensor.bytes = offsets[1] - offsets[0];
    } catch (const nlohmann::json::exception& error) {
      throw CapsuleError(path + ": tensor " + name + ": malformed safetensors entry (" + error.what() + ")");
    }
    const std::optional<int64_t> elements = numel(tensor.shape);  // nullopt: a negative extent or overflow
    if (!elements || *elements > std::numeric_limits<int64_t>::max() / *dtype_bytes(tensor.dtype) ||
        *elements * *dtype_bytes(tensor.dtype) != tensor.bytes)
      throw CapsuleError(path + ": tensor " + name + ": " + std::to_string(tensor.bytes) + " bytes do not fit shape " +
                         shape_text(tensor.shape) + " of " + tensor.dtype);
    data_end = std::max(data_end, tensor.offset + tensor.bytes);
    info.tensors.push_back(std::move(tensor));
  }
  if (info.payload_offset + data_end > info.file_bytes)
    throw CapsuleError(path + ": truncated: the tensors end at byte " + std::to_string(info.payload_offset + data_end) + " of " +
                       std::to_string(info.file_bytes));
  return info;
}

CapsuleInfo inspect_capsule(const std::string& path, bool verify_payload, const std::optional<std::string>& expected_sha256,
                            const std::string& expected_from) {
  File in(path, O_RDONLY);
  if (!in.ok()) throw CapsuleError(path + ": cannot open the capsule (" + std::strerror(errno) + ")");
  struct stat status {};
  if (::fstat(in.fd(), &status) != 0) throw CapsuleError(path + ": cannot stat the capsule");
  CapsuleInfo info;
  info.path = path;
  info.file_bytes = status.st_size;

  std::string first(std::min<size_t>(kMaxPreambleBytes, static_cast<size_t>(info.file_bytes)), '\0');
  if (!in.read_at(first.data(), first.size(), 0)) throw CapsuleError(path + ": cannot read the capsule");
  std::string header_text;
  if (first.rfind(kCapsuleMagic, 0) == 0) {
    header_text = read_legacy_header(in, info, first);
    info.version = kLegacyCapsuleVersion;
  } else if (first.size() > 8 && first[8] == '{') {
    header_text = read_safetensors_header(in, info);
    info.version = kCapsuleVersion;
  } else {
    const bool zip = first.rfind("PK", 0) == 0;
    throw CapsuleError(path + ": not a harness capsule (neither a safetensors file nor one starting with '" + kCapsuleMagic + "')" +
                       (zip ? "; it looks like a torch.save file: bring it in with `harness replay --import`" : ""));
  }
  info.sha256 = db::sha256_hex(header_text);
  try {
    info.header = nlohmann::json(parse_json_input(header_text));
  } catch (const JsonInputError& error) {
    throw CapsuleError(path + ": corrupt header: " + error.what());
  }
  if (!info.header.is_object() || !info.header.contains("tensors") || !info.header["tensors"].is_array() ||
      !info.header.contains("payload_bytes") || !info.header["payload_bytes"].is_number_integer() ||
      info.header["payload_bytes"].get<int64_t>() < 0)
    throw CapsuleError(path + ": corrupt header: it lacks the tensor list or the payload size");

  if (expected_sha256 && *expected_sha256 != info.sha256)
    throw CapsuleError(path + ": hash mismatch: the capsule's header hashes to " + info.sha256 + " but " +
                       (expected_from.empty() ? std::string("the caller") : expected_from) + " records " +
                       *expected_sha256);
  const std::string stem = fs::path(path).stem().string();
  if (is_sha256_hex(stem) && stem != info.sha256)
    throw CapsuleError(path + ": hash mismatch: the file is named for " + stem + " but its header hashes to " +
                       info.sha256 + " (the header was changed)");

  const int64_t payload_bytes = info.header["payload_bytes"].get<int64_t>();
  int64_t expected_size = 0;
  if (__builtin_add_overflow(info.payload_offset, payload_bytes, &expected_size))
    throw CapsuleError(path + ": corrupt header: payload size " + std::to_string(payload_bytes) + " is out of range");
  if (info.file_bytes < expected_size)
    throw CapsuleError(path + ": truncated: " + std::to_string(info.file_bytes) + " bytes, the header describes " +
                       std::to_string(expected_size) + " (" + std::to_string(expected_size - info.file_bytes) +
                       " missing)");
  if (info.file_bytes > expected_size)
    throw CapsuleError(path + ": corrupt: " + std::to_string(info.file_bytes - expected_size) +
                       " bytes after the payload the header describes");

  for (const auto& json : info.header["tensors"]) {
    TensorEntry entry = parse_entry(json, path);
    const auto element_bytes = dtype_bytes(entry.dtype);
    if (!element_bytes) throw CapsuleError(path + ": tensor " + entry.name + " has unknown dtype '" + entry.dtype + "'");
    const auto elements = numel(entry.shape);
    int64_t shape_bytes = 0;
    if (!elements || __builtin_mul_overflow(*elements, *element_bytes, &shape_bytes) || shape_bytes != entry.bytes)
      throw CapsuleError(path + ": tensor " + entry.name + ": " + std::to_string(entry.bytes) + " bytes do not fit shape " +
                         shape_text(entry.shape) + " of " + entry.dtype);
    if (entry.offset < 0 || entry.bytes < 0 || entry.offset > payload_bytes || entry.bytes > payload_bytes - entry.offset)
      throw CapsuleError(path + ": tensor " + entry.name + " lies outside the payload");
    if (info.find(entry.name)) throw CapsuleError(path + ": tensor " + entry.name + " is listed twice");
    info.tensors.push_back(std::move(entry));
  }

  if (verify_payload) {
    std::vector<std::string> problems(info.tensors.size());
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i = next++; i < info.tensors.size(); i = next++) {
        const auto& entry = info.tensors[i];
        std::string bytes(static_cast<size_t>(entry.bytes), '\0');
        if (!in.read_at(bytes.data(), bytes.size(), info.payload_offset + entry.offset))
          problems[i] = "tensor " + entry.name + ": cannot read its bytes";
        else if (db::sha256_hex(bytes) != entry.sha256)
          problems[i] = "tensor " + entry.name + ": its bytes do not match their sha256 (the payload is corrupted)";
      }
    };
    const size_t threads = std::min<size_t>(info.tensors.size(), std::max(1u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& thread : pool) thread.join();
    for (const auto& problem : problems)
      if (!problem.empty()) throw CapsuleError(path + ": " + problem);
  }
  return info;
}

void read_tensor_into(const CapsuleInfo& info, const TensorEntry& entry, void* out) {
  File in(info.path, O_RDONLY);
  if (!in.ok()) throw CapsuleError(info.path + ": cannot open the capsule (" + std::strerror(errno) + ")");
  if (!in.read_at(out, static_cast<size_t>(entry.bytes), info.payload_offset + entry.offset))
    throw CapsuleError(info.path + ": truncated: cannot read tensor " + entry.name);
}

std::string read_tensor_bytes(const CapsuleInfo& info, const TensorEntry& entry) {
  std::string bytes(static_cast<size_t>(entry.bytes), '\0');
  read_tensor_into(info, entry, bytes.data());
  return bytes;
}

void check_step_fits_spec(const CapsuleInfo& info, const spec::Spec& spec) {
  std::vector<std::string> problems;
  const auto role_field = info.header.find("role");
  const std::string role = role_field != info.header.end() && role_field->is_string() ? role_field->get<std::string>() : "";
  if (role != "step") problems.push_back("it is a '" + role + "' file, not a step capsule");
  if (spec.kind != "attention_step") problems.push_back("its spec is of kind " + spec.kind + ", not attention_step");
  const auto& d = spec.dims;
  const std::vector<int64_t> q_shape = {d.batch, d.heads, d.q_len(), d.head_dim};
  const std::vector<int64_t> k_shape = {d.batch, d.kv_heads, d.kv_len(), d.head_dim};
  const std::vector<int64_t> v_shape = {d.batch, d.kv_heads, d.kv_len(), d.value_head_dim()};
  const std::vector<int64_t> grad_out_shape = {d.batch, d.heads, d.q_len(), d.value_head_dim()};
  const char* const kLayerTensors[] = {"q", "k", "v", "grad_out"};
  for (int64_t layer = 0; layer < spec.layers; ++layer) {
    for (const std::string tensor : kLayerTensors) {
      const std::string name = layer_tensor_name(tensor, layer);
      const TensorEntry* entry = info.find(name);
      const auto& shape = tensor == "q" ? q_shape : tensor == "k" ? k_shape : tensor == "v" ? v_shape : grad_out_shape;
      if (!entry) {
        problems.push_back("tensor " + name + " is missing (the spec has " + std::to_string(spec.layers) + " layer" +
                           (spec.layers == 1 ? "" : "s") + ")");
        continue;
      }
      if (entry->dtype != spec.dtype)
        problems.push_back("tensor " + name + " is " + entry->dtype + " but the spec's dtype is " + spec.dtype);
      if (entry->shape != shape)
        problems.push_back("tensor " + name + " has shape " + shape_text(entry->shape) + " but the spec needs " +
                           shape_text(shape) + " ([batch, " + (tensor == "k" || tensor == "v" ? "kv_heads, KV_LEN" : "heads, Q_LEN") +
                           (tensor == "v" || tensor == "grad_out" ? ", v_head_dim]" : ", head_dim]") + " with Q_LEN = anchors x block_size = " + std::to_string(d.q_len()) +
                           ", KV_LEN = context + Q_LEN = " + std::to_string(d.kv_len()) + ")");
    }
  }
  for (const auto& entry : info.tensors) {
    const auto dot = entry.name.rfind('.');
    if (dot == std::string::npos) continue;
    const std::string base = entry.name.substr(0, dot);
    if (std::find(std::begin(kLayerTensors), std::end(kLayerTensors), base) == std::end(kLayerTensors)) continue;
    const std::string index = entry.name.substr(dot + 1);
    // Compared as digits: an index too long for int64 is a layer the spec does not have either.
    const bool digits = !index.empty() && std::all_of(index.begin(), index.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits && (index.size() > 18 || std::stoll(index) >= spec.layers))
      problems.push_back("tensor " + entry.name + " belongs to a layer the spec does not have (layers = " +
                         std::to_string(spec.layers) + ")");
  }

  const bool dflash = spec.mask.kind == kernels::MaskKind::dflash;
  if (const TensorEntry* anchors = info.find("mask.anchors")) {
    if (!dflash) {
      problems.push_back("mask.anchors is given but the spec's mask is not dflash");
    } else if (anchors->dtype != "int64" || anchors->shape != std::vector<int64_t>{d.anchors}) {
      problems.push_back("mask.anchors is " + anchors->dtype + " " + shape_text(anchors->shape) + " but the spec needs int64 [" +
                         std::to_string(d.anchors) + "] (dims.anchors)");
    } else {
      const auto values = integers<int64_t>(read_tensor_bytes(info, *anchors));
      for (size_t block = 0; block < values.size(); ++block) {
        if (values[block] < 0 || values[block] >= d.context) {
          problems.push_back("mask.anchors[" + std::to_string(block) + "] = " + std::to_string(values[block]) +
                             " lies outside the context [0, " + std::to_string(d.context) + ")");
          break;
        }
      }
    }
  }
  const bool blockmask = spec.mask.kind == kernels::MaskKind::blockmask;
  if (const TensorEntry* bits = info.find("mask.bits")) {
    const int64_t words = kernels::blockmask_words(d.kv_len());
    const auto& shape = bits->shape;
    if (!blockmask) {
      problems.push_back("mask.bits is given but the spec's mask is not blockmask");
    } else if (bits->dtype != "int32" || shape.size() != 4 || (shape[0] != 1 && shape[0] != d.batch) ||
               (shape[1] != 1 && shape[1] != d.heads) || shape[2] != d.q_len() || shape[3] != words) {
      problems.push_back("mask.bits is " + bits->dtype + " " + shape_text(shape) + " but the spec needs int32 [1 or " +
                         std::to_string(d.batch) + ", 1 or " + std::to_string(d.heads) + ", " + std::to_string(d.q_len()) +
                         ", " + std::to_string(words) + "] (batch, heads, Q_LEN, ceil(KV_LEN / 32))");
    }
  } else if (blockmask && spec.mask.in_capsule) {
    problems.push_back("the spec's blockmask travels in the capsule (mask.in_capsule) but it has no mask.bits");
  }
  if (const TensorEntry* doc_id = info.find("mask.doc_id")) {
    const int64_t length = dflash ? d.context : d.kv_len();
    if (doc_id->dtype != "int32" || doc_id->shape != std::vector<int64_t>{length}) {
      problems.push_back("mask.doc_id is " + doc_id->dtype + " " + shape_text(doc_id->shape) + " but the spec needs int32 [" +
                         std::to_string(length) + "] (" + (dflash ? "context" : "KV_LEN") + ")");
    } else {
      const auto values = integers<int32_t>(read_tensor_bytes(info, *doc_id));
      if (std::any_of(values.begin(), values.end(), [](int32_t id) { return id < 0; }))
        problems.push_back("mask.doc_id has negative document ids");
    }
  }
  if (problems.empty()) return;
  std::string message = info.path + ": the capsule's tensors do not fit its spec:";
  for (const auto& problem : problems) message += "\n  " + problem;
  throw CapsuleError(message);
}

std::vector<TensorComparison> compare_outputs(const CapsuleInfo& original, const CapsuleInfo& replay) {
  std::vector<TensorComparison> comparisons;
  for (const auto& before : original.tensors) {
    TensorComparison comparison;
    comparison.name = before.name;
    const TensorEntry* after = replay.find(before.name);
    if (!after) {
      comparison.note = "missing in the replay";
    } else if (after->dtype != before.dtype || after->shape != before.shape) {
      comparison.note = "differs in dtype or shape: " + before.dtype + " " + shape_text(before.shape) + " vs " +
                        after->dtype + " " + shape_text(after->shape);
    } else if (after->sha256 == before.sha256) {
      comparison.bitwise_equal = true;
    } else {
      const std::string a = read_tensor_bytes(original, before);
      const std::string b = read_tensor_bytes(replay, *after);
      double max_original = 0.0;
      const int64_t count = numel(before.shape).value_or(0);  // checked by inspect_capsule
      for (int64_t i = 0; i < count; ++i) {
        const double x = element(a, before.dtype, i), y = element(b, before.dtype, i);
        if (std::isfinite(x) && std::isfinite(y)) {
          comparison.max_abs_err = std::max(comparison.max_abs_err, std::abs(y - x));
          max_original = std::max(max_original, std::abs(x));
        } else if (!(std::isnan(x) && std::isnan(y)) && x != y) {
          ++comparison.nonfinite_mismatches;
        }
      }
      comparison.max_rel_err = max_original > 0.0 ? comparison.max_abs_err / max_original : 0.0;
    }
    comparisons.push_back(std::move(comparison));
  }
  for (const auto& after : replay.tensors)
    if (!original.find(after.name)) comparisons.push_back({after.name, false, 0.0, 0.0, 0, "missing in the original"});
  return comparisons;
}

nlohmann::json to_json(const std::vector<TensorComparison>& comparisons) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& c : comparisons) {
    nlohmann::json row = {{"tensor", c.name}, {"bitwise_equal", c.bitwise_equal}};
    if (!c.bitwise_equal && c.note.empty()) {
      row["max_abs_err"] = c.max_abs_err;
      row["max_rel_err"] = c.max_rel_err;
      row["nonfinite_mismatches"] = c.nonfinite_mismatches;
    }
    if (!c.note.empty()) row["note"] = c.note;
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string capsule_sidecar_path(const std::string& result_path) { return result_path + ".capsule"; }

std::optional<kinds::ArtifactRef> read_capsule_sidecar(const std::string& result_path) {
  std::ifstream in(capsule_sidecar_path(result_path));
  if (!in) return std::nullopt;
  const auto json = nlohmann::json::parse(in, nullptr, false);
  if (json.is_discarded() || !json.is_object()) return std::nullopt;
  kinds::ArtifactRef ref{json.value("kind", ""), json.value("sha256", ""), json.value("path", ""),
                         json.value("bytes", int64_t{0})};
  std::error_code error;
  if (ref.path.empty() || !fs::exists(ref.path, error)) return std::nullopt;
  return ref;
}

}  // namespace harness::replay
