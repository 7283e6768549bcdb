#include "replay/import.h"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/json_input.h"
#include "replay/capsule.h"
#include "replay/mask_fit.h"
#include "replay/mask_bits.h"

namespace harness::replay {
namespace {

namespace fs = std::filesystem;

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string sizes_text(at::IntArrayRef sizes) {
  std::string text = "[";
  for (size_t dim = 0; dim < sizes.size(); ++dim) text += (dim ? "," : "") + std::to_string(sizes[dim]);
  return text + "]";
}
std::string sizes_text(const at::Tensor& tensor) { return sizes_text(tensor.sizes()); }

// The key of a per-layer tensor in the file: "q" when the file has one unnumbered layer, else "q.0", ...
std::string file_key(const std::string& tensor, int64_t layer, bool indexed) {
  return indexed ? layer_tensor_name(tensor, layer) : tensor;
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw CapsuleError(path + ": cannot open the step file");
  const std::streamsize size = in.tellg();
  in.seekg(0);
  std::vector<char> bytes(static_cast<size_t>(size));
  if (!in.read(bytes.data(), size)) throw CapsuleError(path + ": cannot read the step file");
  return bytes;
}

// LibTorch's reader of an in-memory zip (the one torch::jit::pickle_load uses, VectorReader) copies
// what the zip's directory asks for without checking the end of the buffer: a file whose central
// directory points past its end made it read out of bounds (found by scripts/fuzz.sh, input in
// tests/fuzz/import/). This reader answers such a request with the bytes that exist, and the zip
// reader then reports a damaged file.
class BoundedReader final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BoundedReader(const std::vector<char>& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    const size_t available = std::min<uint64_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, available);
    return available;
  }

 private:
  const std::vector<char>& bytes_;
};

uint64_t little_endian(const char* bytes, size_t at, int count) {
  uint64_t value = 0;
  for (int i = count - 1; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(bytes[at + static_cast<size_t>(i)]);
  return value;
}

// LibTorch trusts the sizes a file declares: the zip directory's size of a record is allocated
// before the record is read, and so is the length of every string the pickle announces (found by
// scripts/fuzz.sh: a 9.6 KB file whose pickle announced a 3.59 GB string; input in
// tests/fuzz/import/). These two checks run first and refuse a file whose declared sizes exceed
// the file itself, so no allocation is larger than the file that asks for it.
//
// 1. Every entry of the zip's central directory: stored (torch.save does not compress), and its
//    size (zip64's when the 32-bit field says so) within the file.
void check_zip_sizes(const std::vector<char>& bytes, const std::string& where) {
  // The little-endian unsigned integer of `count` bytes at `at`.
  const auto uint_at = [&](size_t at, int count) { return little_endian(bytes.data(), at, count); };
  const size_t n = bytes.size();
  const auto refuse = [&](const std::string& what) {
    throw CapsuleError(where + ": not a torch.save file this reader trusts: " + what);
  };
  if (n < 22) refuse("shorter than a zip's end record");
  // The end-of-central-directory record: the last "PK\5\6" within the final 64 KiB + 22 bytes.
  size_t end = std::string::npos;
  for (size_t at = n - 22 + 1; at-- > 0 && n - at <= 65557;)
    if (uint_at(at, 4) == 0x06054b50) { end = at; break; }
  if (end == std::string::npos) refuse("no zip end-of-central-directory record");
  uint64_t entries = uint_at(end + 10, 2);
  uint64_t directory = uint_at(end + 16, 4);
  if (entries == 0xffff || directory == 0xffffffff) {  // zip64: its locator sits just before
    if (end < 20 || uint_at(end - 20, 4) != 0x07064b50) refuse("a zip64 archive without its locator");
    const uint64_t record = uint_at(end - 20 + 8, 8);
    if (record > n - 56 || n < 56 || uint_at(record, 4) != 0x06064b50) refuse("a damaged zip64 end record");
    entries = uint_at(record + 32, 8);
    directory = uint_at(record + 48, 8);
  }
  if (directory > n) refuse("the zip directory starts past the end of the file");
  if (entries > n / 46) refuse(std::to_string(entries) + " zip entries declared in a file of " + std::to_string(n) + " bytes");
  size_t at = directory;
  for (uint64_t entry = 0; entry < entries; ++entry) {
    if (at > n || n - at < 46 || uint_at(at, 4) != 0x02014b50) refuse("a damaged zip directory entry");
    const uint64_t method = uint_at(at + 10, 2);
    uint64_t compressed = uint_at(at + 20, 4), size = uint_at(at + 24, 4);
    const size_t name = uint_at(at + 28, 2), extra = uint_at(at + 30, 2),
                 comment = uint_at(at + 32, 2);
    if (n - at - 46 < name + extra + comment) refuse("a zip directory entry runs past the end of the file");
    const std::string entry_name(bytes.data() + at + 46, name);
    if (size == 0xffffffff || compressed == 0xffffffff) {  // zip64 extended information: 8-byte sizes
      for (size_t field = at + 46 + name; field + 4 <= at + 46 + name + extra;) {
        const uint64_t id = uint_at(field, 2), length = uint_at(field + 2, 2);
        if (field + 4 + length > at + 46 + name + extra) break;
        if (id == 0x0001) {
          size_t value = field + 4;
          if (size == 0xffffffff && value + 8 <= field + 4 + length) size = uint_at(value, 8), value += 8;
          if (compressed == 0xffffffff && value + 8 <= field + 4 + length) compressed = uint_at(value, 8);
        }
        field += 4 + length;
      }
    }
    if (method != 0) refuse("record '" + entry_name + "' is compressed (method " + std::to_string(method) + "); torch.save stores");
    if (size > n || compressed > n)
      refuse("record '" + entry_name + "' declares " + std::to_string(std::max(size, compressed)) + " bytes in a file of " +
             std::to_string(n));
    at += 46 + name + extra + comment;
  }
}

// 2. The pickle (data.pkl): walks its opcodes (the protocol-2 set torch.save writes and LibTorch's
//    unpickler reads) and checks each length it announces against the bytes that are left. An
//    opcode outside that set is refused here, as LibTorch's unpickler would refuse it.
void check_pickle_lengths(const char* data, size_t n, const std::string& where) {
  size_t at = 0;
  const auto need = [&](uint64_t count, size_t opcode_at, const char* what) {
    if (count > n - at)
      throw CapsuleError(where + ": data.pkl byte " + std::to_string(opcode_at) + ": " + what + " of " + std::to_string(count) +
                         " bytes, but only " + std::to_string(n - at) + " of " + std::to_string(n) + " are left");
    at += static_cast<size_t>(count);
  };
  const auto number = [&](int count, size_t opcode_at) {
    need(static_cast<uint64_t>(count), opcode_at, "an argument");
    return little_endian(data, at - static_cast<size_t>(count), count);
  };
  const auto line = [&](size_t opcode_at) {
    const void* newline = std::memchr(data + at, '\n', n - at);
    if (!newline) throw CapsuleError(where + ": data.pkl byte " + std::to_string(opcode_at) + ": a GLOBAL without its newline");
    at = static_cast<size_t>(static_cast<const char*>(newline) - data) + 1;
  };
  while (at < n) {
    const size_t opcode_at = at;
    const auto opcode = static_cast<unsigned char>(data[at++]);
    switch (opcode) {
      case '.': return;                                                        // STOP
      case 0x80: case 'K': case 'q': case 'h': need(1, opcode_at, "an argument"); break;
      case 'M': need(2, opcode_at, "an argument"); break;
      case 'J': need(4, opcode_at, "an argument"); break;
      case 'r': case 'j': {                                                     // LONG_BINPUT, LONG_BINGET
        // LibTorch sizes its memo table by the index (a 4-byte index of ~1.9e9 asked for 30 GB, found
        // by the import fuzzer); a pickler numbers memo entries from 0, one per opcode at most.
        const uint64_t index = number(4, opcode_at);
        if (index >= n)
          throw CapsuleError(where + ": data.pkl byte " + std::to_string(opcode_at) + ": a memo index of " +
                             std::to_string(index) + " in a pickle of " + std::to_string(n) + " bytes");
        break;
      }
      case 'G': need(8, opcode_at, "a float"); break;                           // BINFLOAT
      case 0x95: need(8, opcode_at, "a frame length"); break;                   // FRAME
      case 0x8a: need(number(1, opcode_at), opcode_at, "a LONG1 integer"); break;
      case 0x8b: need(number(4, opcode_at), opcode_at, "a LONG4 integer"); break;
      case 'X': need(number(4, opcode_at), opcode_at, "a string"); break;       // BINUNICODE
      case 'B': need(number(4, opcode_at), opcode_at, "a bytes value"); break;  // BINBYTES
      case 0x8c: case 'C': case 'U': need(number(1, opcode_at), opcode_at, "a short string"); break;
      case 'T': need(number(4, opcode_at), opcode_at, "a string"); break;       // BINSTRING
      case 0x8d: case 0x8e: case 0x96: need(number(8, opcode_at), opcode_at, "an 8-byte-length value"); break;
      case 'c': line(opcode_at); line(opcode_at); break;                         // GLOBAL module\nname\n
      case '}': case ']': case ')': case '(': case 's': case 'u': case 'a': case 'e': case 't': case 'l': case 'd':
      case 0x85: case 0x86: case 0x87: case 'N': case 0x88: case 0x89: case 'R': case 'b': case 'Q': case 0x81:
      case 0x94: case '0': case '2': case '1': case 0x8f: case 0x90: case 0x91: case 0x92: case 0x93:
        break;                                                                  // no argument
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", opcode);
        throw CapsuleError(where + ": data.pkl byte " + std::to_string(opcode_at) + ": opcode " + hex +
                           " is not one torch.save writes");
      }
    }
  }
  throw CapsuleError(where + ": data.pkl ends without STOP");
}

// What torch::jit::pickle_load does (a torch.save zip: its "data.pkl" and tensors), through the
// bounded reader, after the size checks above.
c10::IValue load_pickle(const std::vector<char>& bytes, const std::string& where) {
  check_zip_sizes(bytes, where);
  caffe2::serialize::PyTorchStreamReader reader(std::make_shared<BoundedReader>(bytes));
  std::string pickle;
  for (const std::string& record : reader.getAllRecords())
    if (record == "data.pkl") {
      const auto [data, size] = reader.getRecord(record);
      check_pickle_lengths(static_cast<const char*>(data.get()), size, where);
      pickle = "checked";
    }
  if (pickle.empty()) throw CapsuleError(where + ": a zip without data.pkl: not a torch.save file");
  return torch::jit::readArchiveAndTensors("data", "", "", std::nullopt, std::nullopt, std::nullopt, reader);
}

int64_t meta_int(const nlohmann::json& dims, const char* key, int64_t fallback, const std::string& where) {
  if (!dims.contains(key)) return fallback;
  if (!dims[key].is_number_integer()) throw CapsuleError(where + ": meta.dims." + key + " must be an integer");
  return dims[key].get<int64_t>();
}

//! The bytes a tensor's sizes, strides and storage offset reach must lie inside its storage.
//! LibTorch's unpickler sets them as the pickle says, unchecked, so a hostile file made the copy
//! below read past the storage (ASan: SEGV in the copy kernel; found by the import fuzzer,
//! tests/fuzz/import/regression-storage-bounds.pt). Checked in 128-bit arithmetic, stopping as soon as the reach
//! passes the storage's size, so no hostile size or stride can overflow it.
void check_within_storage(const at::Tensor& tensor, const std::string& key, const std::string& where) {
  if (tensor.layout() != at::kStrided || !tensor.has_storage())
    throw CapsuleError(where + ": entry '" + key + "' is not a dense tensor");
  const auto refuse = [&](const std::string& why) {
    throw CapsuleError(where + ": entry '" + key + "' " + why + " (sizes " + c10::str(tensor.sizes()) + ", strides " +
                       c10::str(tensor.strides()) + ", storage offset " + std::to_string(tensor.storage_offset()) + ")");
  };
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    if (tensor.size(d) < 0) refuse("has a negative size");
    if (tensor.size(d) == 0) return;  // no element: nothing is read
  }
  if (tensor.storage_offset() < 0) refuse("has a negative storage offset");
  // Whole elements the storage holds; the last element reached must be below that.
  const auto capacity = static_cast<__int128>(tensor.storage().nbytes() / tensor.element_size());
  __int128 last = tensor.storage_offset();  // < 2^63, and each step below adds < 2^126
  for (int64_t d = 0; d < tensor.dim() && last < capacity; ++d) {
    if (tensor.stride(d) < 0) refuse("has a negative stride");
    last += static_cast<__int128>(tensor.size(d) - 1) * tensor.stride(d);
  }
  if (last >= capacity)
    refuse("reaches past its storage of " + std::to_string(tensor.storage().nbytes()) + " bytes");
}

//! A tensor of the unpickled dict as a contiguous CPU tensor. Only the dtypes a step can hold
//! (floating point, integers, bool) are copied: LibTorch has no copy kernel for some others (a
//! UInt4 tensor made `.contiguous()` throw NotImplementedError, found by the import fuzzer), and
//! whatever else it refuses on a hostile tensor becomes a CapsuleError naming the entry.
at::Tensor imported_tensor(const at::Tensor& tensor, const std::string& key, const std::string& where) {
  const at::ScalarType type = tensor.scalar_type();
  if (!at::isFloatingType(type) && !at::isIntegralType(type, /*includeBool=*/true))
    throw CapsuleError(where + ": entry '" + key + "' is a " + c10::toString(type) +
                       " tensor; a step holds floating-point tensors (q, k, v, grad_out: bf16, fp16 or fp32)");
  check_within_storage(tensor, key, where);
  try {
    return tensor.detach().to(at::kCPU).contiguous();
  } catch (const c10::Error& error) {
    throw CapsuleError(where + ": entry '" + key + "' cannot be read as a tensor (" +
                       first_line(error.what_without_backtrace()) + ")");
  }
}


//! A step file's meta may carry what the capture saw and the kernels cannot run: a scale other than
//! 1/sqrt(head_dim), a score_mod, dropout, a mask no table describes. Each is refused by name.
void check_captured_call(const nlohmann::json& meta, int64_t head_dim, const std::string& where) {
  std::vector<std::string> problems;
  if (meta.contains("scale") && !meta["scale"].is_null()) {
    if (!meta["scale"].is_number()) {
      problems.push_back("meta.scale must be a number");
    } else {
      const double scale = meta["scale"].get<double>(), standard = 1.0 / std::sqrt(static_cast<double>(head_dim));
      if (std::abs(scale - standard) > 1e-6 * standard)
        problems.push_back("the call used scale " + std::to_string(scale) + "; a replay runs the default 1/sqrt(" +
                           std::to_string(head_dim) + ") = " + std::to_string(standard));
    }
  }
  if (meta.contains("score_mod") && !meta["score_mod"].is_null())
    problems.push_back("the call had a score_mod (" + meta["score_mod"].dump() + "), which the kernels do not run");
  if (meta.value("dropout_p", 0.0) > 0.0)
    problems.push_back("the call used dropout_p " + std::to_string(meta.value("dropout_p", 0.0)) + "; a replay has none");
  if (meta.contains("mask") && meta["mask"].is_object() && meta["mask"].value("type", "") == "unsupported")
    problems.push_back("the mask was not captured: " + meta["mask"].value("why", "no reason given"));
  if (!problems.empty()) {
    std::string message = where + ": the captured call cannot be replayed on the harness kernels:";
    for (const auto& problem : problems) message += "\n  " + problem;
    throw CapsuleError(message);
  }
}

//! A mask given as tables (meta.mask.type "blockmask", python/README.md "Mask tables"): matched to a
//! named kind (replay/mask_fit.h), whose description, dims and anchors/documents then stand in the
//! meta and the tensors as if the step had been saved with that mask, and the tables are dropped.
//! A mask no named kind reproduces stays a blockmask (its bits are replayed, replay/mask_bits.h); the
//! meta's `captured_mask_fit` says why no named kind fits. Returns whether a named kind fits.
bool fit_captured_mask(std::map<std::string, at::Tensor>& tensors, nlohmann::json& meta, std::set<std::string>& used,
                       int64_t q_len, int64_t kv_len, const std::string& where) {
  std::vector<std::pair<std::string, RawTable>> raw;
  for (const char* name : kMaskTableNames) {
    const auto found = tensors.find(name);
    if (found == tensors.end()) continue;
    used.insert(name);
    const at::Tensor table = found->second.contiguous();
    raw.emplace_back(name, RawTable{dtype_name(table.scalar_type()), table.sizes().vec(),
                                    std::string(static_cast<const char*>(table.data_ptr()), table.nbytes())});
  }
  std::vector<std::string> why_not;
  MaskTables tables;
  try {
    tables = mask_tables_from_raw(raw, q_len, kv_len, meta["mask"].value("block_size", nlohmann::json(128)), where);
  } catch (const CapsuleError& error) {
    // Tables the named kinds' reader does not take (per-head lists, other tiles): the bits' reader
    // (replay/mask_bits.h) reads them, or names what is wrong with them.
    meta["captured_mask_fit"] = std::vector<std::string>{error.what()};
    return false;
  }
  const std::optional<FittedMask> fitted = fit_named_mask(tables, why_not);
  if (!fitted) {
    meta["captured_mask_fit"] = why_not;
    return false;
  }
  for (const char* name : kMaskTableNames) tensors.erase(name);
  tensors.erase("mask.block_size");
  meta["captured_mask"] = meta["mask"];
  meta["mask"] = fitted->mask;
  nlohmann::json& dims = meta["dims"];
  if (!dims.is_object()) dims = nlohmann::json::object();
  dims["block_size"] = fitted->block_size;
  dims["anchors"] = fitted->anchors;
  dims["context"] = fitted->context;
  if (!fitted->anchor_positions.empty()) {
    tensors["anchors"] = at::tensor(fitted->anchor_positions, at::kLong);
    tensors["doc_id"] = at::tensor(fitted->doc_id, at::kInt);
  }
  return true;
}

}  // namespace

ImportedStep import_step_file(const std::string& step_path, const std::string& dir) {
  const std::string& where = step_path;
  std::map<std::string, at::Tensor> tensors;
  std::optional<std::string> meta_text;
  if (is_safetensors_file(step_path)) {
    // safetensors.torch.save_file(tensors, path, metadata={"meta": json.dumps(meta)})
    const CapsuleInfo file = read_safetensors(step_path);
    if (file.header.contains("capsule"))
      throw CapsuleError(where + ": is a harness capsule, not a step saved from Python: replay it with `harness replay` "
                         "from its run, or use it as --replay-capsule");
    for (const TensorEntry& entry : file.tensors) tensors[entry.name] = load_tensor(file, entry);
    if (file.header.contains("meta")) meta_text = file.header["meta"].get<std::string>();
  } else {
    c10::IValue value;
    try {
      value = load_pickle(read_bytes(step_path), where);  // bounds-checked: pickle_load reads past a hostile zip
    } catch (const CapsuleError&) {
      throw;
    } catch (const c10::Error& error) {
      throw CapsuleError(where + ": cannot read it as a torch.save or safetensors file (" +
                         first_line(error.what_without_backtrace()) + "); write it with replay/save_step.py");
    } catch (const std::exception& error) {
      throw CapsuleError(where + ": cannot read it as a torch.save or safetensors file (" + first_line(error.what()) + ")");
    }
    if (!value.isGenericDict())
      throw CapsuleError(where + ": holds a " + std::string(value.tagKind()) +
                         ", not a dict of named tensors with a 'meta' string");
    for (const auto& item : value.toGenericDict()) {
      if (!item.key().isString()) throw CapsuleError(where + ": a key of the dict is not a string");
      const std::string key = item.key().toStringRef();
      if (key == "meta") {
        if (!item.value().isString()) throw CapsuleError(where + ": 'meta' must be a JSON string (json.dumps(...))");
        meta_text = item.value().toStringRef();
      } else if (item.value().isTensor()) {
        tensors[key] = imported_tensor(item.value().toTensor(), key, where);
      } else {
        throw CapsuleError(where + ": entry '" + key + "' is a " + std::string(item.value().tagKind()) + ", not a tensor");
      }
    }
  }
  if (!meta_text)
    throw CapsuleError(where + ": no 'meta' entry (a JSON string with dims and mask; in a safetensors file, "
                       "metadata={\"meta\": json.dumps(meta)}; replay/README.md)");
  ImportedStep imported;
  try {
    imported.meta = nlohmann::json(parse_json_input(*meta_text));
  } catch (const JsonInputError& error) {
    throw CapsuleError(where + ": 'meta' is not valid JSON (" + std::string(error.what()) + ")");
  }
  if (!imported.meta.is_object()) throw CapsuleError(where + ": 'meta' is not a JSON object");
  const nlohmann::json& meta = imported.meta;
  std::set<std::string> used = {"meta"};

  // Layers: "q" alone, or "q.0" ... "q.N-1".
  const bool indexed = !tensors.count("q");
  int64_t layers = indexed ? 0 : 1;
  while (indexed && tensors.count(layer_tensor_name("q", layers))) ++layers;
  if (layers == 0) throw CapsuleError(where + ": no tensor 'q' (one layer) or 'q.0' (layers q.0, q.1, ...)");
  // A step captured before the backward reached it has no grad_out: one is drawn (seeded), as a
  // trial draws its inputs, so that the step still runs forward and backward.
  if (meta.value("grad_out", "") == "drawn") {
    at::Generator generator = at::detail::createCPUGenerator(/*seed_in=*/0);
    for (int64_t layer = 0; layer < layers; ++layer) {
      const std::string q_key = file_key("q", layer, indexed), key = file_key("grad_out", layer, indexed);
      if (!tensors.count(key) && tensors.count(q_key))
        tensors[key] = at::randn(tensors[q_key].sizes(), generator, at::TensorOptions().dtype(at::kFloat))
                           .to(tensors[q_key].scalar_type());
    }
  }

  std::vector<std::string> problems;
  std::map<std::string, std::vector<at::Tensor>> per_layer;
  for (const std::string name : {"q", "k", "v", "grad_out"}) {
    for (int64_t layer = 0; layer < layers; ++layer) {
      const std::string key = file_key(name, layer, indexed);
      const auto found = tensors.find(key);
      if (found == tensors.end()) {
        problems.push_back("tensor '" + key + "' is missing (the file has " + std::to_string(layers) + " layer" +
                           (layers == 1 ? "" : "s") + " of q)");
        continue;
      }
      used.insert(key);
      per_layer[name].push_back(found->second);
    }
  }
  if (!problems.empty()) {
    std::string message = where + ": the step is incomplete:";
    for (const auto& problem : problems) message += "\n  " + problem;
    throw CapsuleError(message);
  }
  const at::Tensor& q0 = per_layer["q"][0];
  const at::Tensor& k0 = per_layer["k"][0];
  if (q0.dim() != 4 || k0.dim() != 4)
    throw CapsuleError(where + ": q and k must be [batch, heads, length, head_dim]; q is " + sizes_text(q0) + ", k is " +
                       sizes_text(k0) + " (a [batch, length, heads, head_dim] tensor needs .transpose(1, 2))");
  const std::string dtype = dtype_name(q0.scalar_type());
  if (dtype != "bf16" && dtype != "fp16" && dtype != "fp32")
    throw CapsuleError(where + ": q is " + dtype + "; a step is bf16, fp16 or fp32");
  check_captured_call(meta, q0.size(3), where);
  if (meta.contains("mask") && meta["mask"].is_object() && meta["mask"].value("type", "") == "blockmask" &&
      tensors.count("mask.kv_num_blocks") && !tensors.count("mask.bits"))
    fit_captured_mask(tensors, imported.meta, used, q0.size(2), k0.size(2), where);

  const nlohmann::json dims = meta.value("dims", nlohmann::json::object());
  const int64_t q_len = q0.size(2), kv_len = k0.size(2);
  const at::Tensor& v0 = per_layer["v"][0];
  // block_size is the dflash draft block; for another mask only Q_LEN = anchors x block_size
  // matters, so a Q_LEN that 16 does not divide takes blocks of 1.
  const bool dflash_meta = meta.contains("mask") && meta["mask"].is_object() && meta["mask"].value("type", "") == "dflash";
  const int64_t block_size = meta_int(dims, "block_size", dflash_meta || q_len % 16 == 0 ? 16 : 1, where);
  if (block_size < 1 || q_len % block_size != 0)
    throw CapsuleError(where + ": Q_LEN " + std::to_string(q_len) + " (q.size(2)) is not a multiple of block_size " +
                       std::to_string(block_size));
  const int64_t anchors = meta_int(dims, "anchors", q_len / block_size, where);
  const int64_t context = meta_int(dims, "context", kv_len - q_len, where);
  const std::pair<const char*, int64_t> observed[] = {{"batch", q0.size(0)},    {"heads", q0.size(1)},
                                                      {"kv_heads", k0.size(1)},  {"head_dim", q0.size(3)},
                                                      {"v_head_dim", v0.dim() == 4 ? v0.size(3) : q0.size(3)}};
  for (const auto& [key, size] : observed)
    if (meta_int(dims, key, size, where) != size)
      problems.push_back(std::string("meta.dims.") + key + " = " + std::to_string(dims[key].get<int64_t>()) +
                         " but the tensors have " + std::to_string(size));
  if (anchors * block_size != q_len)
    problems.push_back("meta.dims.anchors x block_size = " + std::to_string(anchors * block_size) + " but Q_LEN is " +
                       std::to_string(q_len));
  if (context + q_len != kv_len)
    problems.push_back("meta.dims.context + Q_LEN = " + std::to_string(context + q_len) + " but KV_LEN (k.size(2)) is " +
                       std::to_string(kv_len));
  // v may have its own head dim (v_head_dim: DeepSeek's MLA has 192 / 128), and grad_out, shaped
  // like the output, has v's.
  const int64_t v_head_dim = v0.dim() == 4 ? v0.size(3) : q0.size(3);
  const std::vector<int64_t> expected_v = {k0.size(0), k0.size(1), k0.size(2), v_head_dim};
  const std::vector<int64_t> expected_grad = {q0.size(0), q0.size(1), q0.size(2), v_head_dim};
  for (const auto& [name, list] : per_layer) {
    const std::vector<int64_t> like = name == "k"          ? k0.sizes().vec()
                                      : name == "v"        ? expected_v
                                      : name == "grad_out" ? expected_grad
                                                           : q0.sizes().vec();
    for (size_t layer = 0; layer < list.size(); ++layer) {
      const std::string key = file_key(name, static_cast<int64_t>(layer), indexed);
      if (list[layer].sizes().vec() != like)
        problems.push_back("tensor '" + key + "' is " + sizes_text(list[layer]) + ", expected " +
                           sizes_text(like));
      if (list[layer].scalar_type() != q0.scalar_type())
        problems.push_back("tensor '" + key + "' is " + std::string(c10::toString(list[layer].scalar_type())) +
                           " but q is " + c10::toString(q0.scalar_type()));
    }
  }
  if (!meta.contains("mask") || !meta["mask"].is_object())
    problems.push_back("meta has no 'mask' object (e.g. {\"type\": \"dflash\", \"documents\": 4})");
  const bool blockmask = meta.contains("mask") && meta["mask"].is_object() && meta["mask"].value("type", "") == "blockmask";
  if (blockmask && !has_mask_tensors(tensors))
    problems.push_back("meta.mask is a blockmask but the file has no mask tensors (mask.bits, or a BlockMask's "
                       "mask.kv_num_blocks, mask.kv_indices, mask.partial_bits with mask.block_size)");
  if (!blockmask && has_mask_tensors(tensors))
    problems.push_back("the file has mask tensors (mask.bits or mask.kv_num_blocks) but meta.mask is not "
                       "{\"type\": \"blockmask\"}");
  if (!problems.empty()) {
    std::string message = where + ": the step does not fit together:";
    for (const auto& problem : problems) message += "\n  " + problem;
    throw CapsuleError(message);
  }

  nlohmann::json spec_json = {
      {"name", meta.value("name", "imported_step")},
      {"hypothesis", "Replay of a training step saved from Python (" + fs::path(step_path).filename().string() + ")"},
      {"kind", "attention_step"},
      {"dims",
       {{"batch", q0.size(0)},
        {"heads", q0.size(1)},
        {"kv_heads", k0.size(1)},
        {"head_dim", q0.size(3)},
        {"v_head_dim", v_head_dim},
        {"anchors", anchors},
        {"block_size", block_size},
        {"context", context},
        {"dtype", dtype},
        {"layers", layers}}},
      // A blockmask's bits go into the capsule (mask.bits); its spec says so instead of naming a file.
      {"mask", blockmask ? nlohmann::json{{"type", "blockmask"}, {"in_capsule", true}} : meta["mask"]},
      {"variants", {{"fused", {{"impl", "fused"}}}, {"dense", {{"impl", "dense"}}}}},
      {"variant_order", {"fused", "dense"}},
      {"measure", {"fwd_peak_bytes", "bwd_peak_bytes", "fwd_ms", "bwd_ms", "max_abs_err", "dispatch"}},
      {"repeats", 1},
      {"warmup", 0},
      {"check", {{"enabled", true}}},
      {"verdict", {{{"if", "fused.match"}, {"then", "MATCH"}}, {{"else", "MISMATCH"}}}}};
  if (meta.contains("block_mask")) spec_json["block_mask"] = meta["block_mask"];
  spec::Spec spec;
  try {
    spec = spec::parse_spec(spec_json, where + " (meta)");
  } catch (const spec::SpecError& error) {
    std::string message = where + ": the meta does not make a valid step:";
    for (const auto& issue : error.issues()) message += "\n  " + issue.path + ": " + issue.message;
    throw CapsuleError(message);
  }

  StepTensors step;
  step.q = per_layer["q"];
  step.k = per_layer["k"];
  step.v = per_layer["v"];
  step.grad_out = per_layer["grad_out"];
  for (const char* key : {"anchors", "mask.anchors"}) {
    if (!tensors.count(key)) continue;
    used.insert(key);
    const at::Tensor values = tensors[key].to(at::kLong).flatten();
    step.anchors = std::vector<int64_t>(values.data_ptr<int64_t>(), values.data_ptr<int64_t>() + values.numel());
  }
  for (const char* key : {"doc_id", "mask.doc_id"}) {
    if (!tensors.count(key)) continue;
    used.insert(key);
    const at::Tensor values = tensors[key].to(at::kInt).flatten();
    step.doc_id = std::vector<int32_t>(values.data_ptr<int32_t>(), values.data_ptr<int32_t>() + values.numel());
  }
  if (blockmask)
    step.mask_bits = mask_bits_tensor(
        mask_from_tensors(tensors, q_len, kv_len, where, &used, meta["mask"].value("block_size", nlohmann::json())));
  NamedTensors outputs;
  for (const std::string name : {"out", "dq", "dk", "dv"}) {
    for (int64_t layer = 0; layer < layers; ++layer) {
      const std::string key = file_key(name, layer, indexed);
      if (!tensors.count(key)) continue;
      used.insert(key);
      outputs.emplace_back(layer_tensor_name(name, layer), tensors[key]);
    }
  }
  for (const auto& [key, tensor] : tensors)
    if (!used.count(key))
      throw CapsuleError(where + ": unknown entry '" + key +
                         "' (known: q, k, v, grad_out, anchors, doc_id, out, dq, dk, dv, each also as NAME.LAYER, the "
                         "mask tensors mask.bits, mask.kv_num_blocks ... mask.partial_bits (with meta.mask.type blockmask), ... (replay/README.md), and meta)");

  const nlohmann::json header = {{"role", "step"},
                                 {"source", "import"},
                                 {"spec", spec.resolved},
                                 {"variant", ""},
                                 {"device", ""},
                                 {"env_id", ""},
                                 {"import", {{"file", fs::absolute(step_path).string()}, {"meta", meta}}}};
  imported.capsule = write_capsule(dir, header, step_tensors(step), kStepExtension);
  try {
    check_step_fits_spec(inspect_capsule(imported.capsule.path, /*verify_payload=*/false), spec);
  } catch (const CapsuleError& error) {
    if (imported.capsule.created) ::unlink(imported.capsule.path.c_str());
    std::string message = error.what();
    throw CapsuleError(where + message.substr(message.find(':')));
  }
  if (!outputs.empty())
    imported.outputs = write_capsule(dir, {{"role", "outputs"}, {"of", imported.capsule.sha256}, {"source", "import"}},
                                     outputs, kOutputsExtension);
  return imported;
}

}  // namespace harness::replay
