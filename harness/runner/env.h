#pragma once
// The toolchain fingerprint stored with every run: what built this binary, what it runs on,
// and the environment variables that change behaviour.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace harness {

//! Host part (torch-free): OS, host compiler, build type, git commit, harness version, the nvcc
//! that built the kernels, behaviour-changing environment variables.
nlohmann::json host_fingerprint();

//! Device part (LibTorch): LibTorch version, CUDA runtime and driver, cuDNN, and for a CUDA
//! device its name, capability, memory and SM count. Fills "device_error" instead of throwing
//! when the device cannot be queried; throws UsageError when `device` names no existing device.
nlohmann::json device_fingerprint(const std::string& device);

//! Both parts merged: the fingerprint `harness env` prints and runs store.
nlohmann::json full_fingerprint(const std::string& device);

//! The environment variables recorded (CUDA_VISIBLE_DEVICES, PYTORCH_CUDA_ALLOC_CONF, ...).
const std::vector<std::string>& recorded_env_vars();

}  // namespace harness
