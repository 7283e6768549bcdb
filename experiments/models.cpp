#include "experiments/models.h"

#include <algorithm>
#include <cctype>

namespace harness::spec {

const std::vector<ModelShape>& known_models() {
  // Values from each model's config.json (num_attention_heads, num_key_value_heads, head_dim or
  // hidden_size / heads, hidden_size, num_hidden_layers). DeepSeek-V2-Lite's latent attention
  // expands its compressed KV into 16 heads of q·k dim 192 (128 + 64 rotary) and value dim 128.
  static const std::vector<ModelShape> models = {
      {"Llama-3.1-8B", 32, 8, 128, 128, 4096, 32, "GQA 4:1"},
      {"Llama-3.1-70B", 64, 8, 128, 128, 8192, 80, "GQA 8:1"},
      {"Qwen2.5-7B", 28, 4, 128, 128, 3584, 28, "GQA 7:1"},
      {"Qwen2.5-0.5B", 14, 2, 64, 64, 896, 24, "GQA 7:1, head_dim 64"},
      {"Qwen3-8B", 32, 8, 128, 128, 4096, 36, "GQA 4:1"},
      {"Mistral-7B", 32, 8, 128, 128, 4096, 32, "GQA 4:1"},
      {"Gemma-2-9B", 16, 8, 256, 256, 3584, 42, "GQA 2:1, head_dim 256"},
      {"Phi-3-mini", 32, 32, 96, 96, 3072, 32, "MHA, head_dim 96"},
      {"Falcon-7B", 71, 1, 64, 64, 4544, 32, "MQA (one KV head)"},
      {"DeepSeek-V2-Lite", 16, 16, 192, 128, 2048, 27, "latent attention: q·k dim 192, v dim 128"},
  };
  return models;
}

namespace {
std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}
}  // namespace

std::optional<ModelShape> find_model(const std::string& name) {
  for (const ModelShape& model : known_models())
    if (model.name == name || lower(model.name) == lower(name)) return model;
  return std::nullopt;
}

std::string known_model_names() {
  std::string names;
  for (const ModelShape& model : known_models()) names += (names.empty() ? "" : ", ") + model.name;
  return names;
}

}  // namespace harness::spec
