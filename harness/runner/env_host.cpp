#include <sys/utsname.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "build_info.h"
#include "git_info.h"
#include "harness/runner/env.h"

namespace harness {

const std::vector<std::string>& recorded_env_vars() {
  // Each of these changes what runs or how memory behaves; a diff should show them.
  static const std::vector<std::string> names = {
      "CUDA_VISIBLE_DEVICES",   "CUDA_LAUNCH_BLOCKING",      "CUDA_MODULE_LOADING",
      "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",       "PYTORCH_NO_CUDA_MEMORY_CACHING",
      "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE",     "TORCH_CUDNN_V8_API_DISABLED",
      "OMP_NUM_THREADS",         "MKL_NUM_THREADS",          "TORCHINDUCTOR_CACHE_DIR",
      "TRITON_CACHE_DIR",        "HARNESS_AUTOTUNE_CACHE",   "LD_LIBRARY_PATH"};
  return names;
}

namespace {

std::string os_pretty_name() {
  std::ifstream file("/etc/os-release");
  std::string line;
  while (std::getline(file, line)) {
    if (line.rfind("PRETTY_NAME=", 0) == 0) {
      std::string value = line.substr(12);
      if (value.size() >= 2 && value.front() == '"') value = value.substr(1, value.size() - 2);
      return value;
    }
  }
  return "unknown";
}

}  // namespace

nlohmann::json host_fingerprint() {
  nlohmann::json env;
  utsname name{};
  uname(&name);
  env["os"] = os_pretty_name();
  env["kernel"] = std::string(name.sysname) + " " + name.release;
  env["arch"] = name.machine;
  env["host_compiler"] = HARNESS_CXX_COMPILER;
  env["build_type"] = HARNESS_BUILD_TYPE;
  env["harness_version"] = HARNESS_VERSION;
  env["git_commit"] = HARNESS_GIT_COMMIT;
  env["nvcc"] = std::string(HARNESS_NVCC_VERSION).empty() ? "none (CUDA kernels not built)" : HARNESS_NVCC_VERSION;
  env["cuda_archs"] = HARNESS_CUDA_ARCHS;
  env["sanitize"] = HARNESS_SANITIZE;
  nlohmann::json vars = nlohmann::json::object();
  for (const auto& var : recorded_env_vars()) {
    const char* value = std::getenv(var.c_str());
    if (value) vars[var] = value;
  }
  env["env_vars"] = vars;
  return env;
}

}  // namespace harness
