#include "replay/capsule.h"

namespace harness::replay {
namespace {

const std::pair<at::ScalarType, const char*> kDtypes[] = {
    {at::kBFloat16, "bf16"}, {at::kHalf, "fp16"},   {at::kFloat, "fp32"}, {at::kDouble, "fp64"},
    {at::kInt, "int32"},     {at::kLong, "int64"},  {at::kByte, "uint8"}, {at::kBool, "bool"},
};

template <typename T>
std::vector<T> to_vector(const at::Tensor& tensor) {
  const at::Tensor contiguous = tensor.contiguous();
  const T* data = contiguous.data_ptr<T>();
  return std::vector<T>(data, data + contiguous.numel());
}

}  // namespace

std::string dtype_name(at::ScalarType type) {
  for (const auto& [scalar, name] : kDtypes)
    if (scalar == type) return name;
  throw CapsuleError(std::string("capsules cannot hold tensors of dtype ") + c10::toString(type));
}

at::ScalarType scalar_type(const std::string& dtype) {
  for (const auto& [scalar, name] : kDtypes)
    if (dtype == name) return scalar;
  throw CapsuleError("unknown capsule dtype '" + dtype + "'");
}

WrittenCapsule write_capsule(const std::string& dir, nlohmann::json header, const NamedTensors& tensors,
                             const std::string& extension) {
  // Keep the CPU copies alive until the file is written; the data pointers below point into them.
  std::vector<at::Tensor> host;
  std::vector<TensorData> data;
  for (const auto& [name, tensor] : tensors) {
    host.push_back(tensor.detach().to(at::kCPU).contiguous());
    const at::Tensor& cpu = host.back();
    data.push_back({name, dtype_name(cpu.scalar_type()), cpu.sizes().vec(), cpu.data_ptr(),
                    static_cast<int64_t>(cpu.nbytes())});
  }
  return write_capsule_file(dir, std::move(header), data, extension);
}

at::Tensor load_tensor(const CapsuleInfo& info, const TensorEntry& entry) {
  at::Tensor tensor = at::empty(entry.shape, at::TensorOptions().dtype(scalar_type(entry.dtype)));
  read_tensor_into(info, entry, tensor.data_ptr());
  return tensor;
}

StepTensors load_step(const CapsuleInfo& info, const spec::Spec& spec) {
  check_step_fits_spec(info, spec);
  StepTensors step;
  for (int64_t layer = 0; layer < spec.layers; ++layer) {
    step.q.push_back(load_tensor(info, *info.find(layer_tensor_name("q", layer))));
    step.k.push_back(load_tensor(info, *info.find(layer_tensor_name("k", layer))));
    step.v.push_back(load_tensor(info, *info.find(layer_tensor_name("v", layer))));
    step.grad_out.push_back(load_tensor(info, *info.find(layer_tensor_name("grad_out", layer))));
  }
  if (const TensorEntry* anchors = info.find("mask.anchors")) step.anchors = to_vector<int64_t>(load_tensor(info, *anchors));
  if (const TensorEntry* doc_id = info.find("mask.doc_id")) step.doc_id = to_vector<int32_t>(load_tensor(info, *doc_id));
  if (const TensorEntry* bits = info.find("mask.bits")) step.mask_bits = load_tensor(info, *bits);
  if (const TensorEntry* rng = info.find("rng.cpu")) step.cpu_rng_state = load_tensor(info, *rng);
  if (const TensorEntry* rng = info.find("rng.cuda")) step.cuda_rng_state = load_tensor(info, *rng);
  return step;
}

NamedTensors step_tensors(const StepTensors& step) {
  NamedTensors tensors;
  for (size_t layer = 0; layer < step.q.size(); ++layer) {
    const auto index = static_cast<int64_t>(layer);
    tensors.emplace_back(layer_tensor_name("q", index), step.q[layer]);
    tensors.emplace_back(layer_tensor_name("k", index), step.k[layer]);
    tensors.emplace_back(layer_tensor_name("v", index), step.v[layer]);
    tensors.emplace_back(layer_tensor_name("grad_out", index), step.grad_out[layer]);
  }
  if (step.anchors)
    tensors.emplace_back("mask.anchors", at::tensor(*step.anchors, at::TensorOptions().dtype(at::kLong)));
  if (step.doc_id) tensors.emplace_back("mask.doc_id", at::tensor(*step.doc_id, at::TensorOptions().dtype(at::kInt)));
  if (step.mask_bits.defined()) tensors.emplace_back("mask.bits", step.mask_bits);
  if (step.cpu_rng_state.defined()) tensors.emplace_back("rng.cpu", step.cpu_rng_state);
  if (step.cuda_rng_state.defined()) tensors.emplace_back("rng.cuda", step.cuda_rng_state);
  return tensors;
}

}  // namespace harness::replay
