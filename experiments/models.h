#pragma once
// The attention shapes of open models, so that an experiment runs at a real model's shape with
// `--model NAME` (or a spec's "model" field) instead of hand-set dims. Torch-free.
//
// A model fills dims.heads, dims.kv_heads, dims.head_dim and, where the value head dim differs
// (multi-head latent attention), dims.v_head_dim. The other dims (anchors, context, block size,
// layers) stay the experiment's: they describe the drafter's step, not the model.

#include <optional>
#include <string>
#include <vector>

namespace harness::spec {

//! One model's attention shape, from its published config (config.json on the Hugging Face hub).
struct ModelShape {
  std::string name;       //!< as --model takes it, e.g. "Qwen2.5-7B"
  int heads = 0;          //!< num_attention_heads
  int kv_heads = 0;       //!< num_key_value_heads (1: multi-query attention)
  int head_dim = 0;       //!< q·k head dim
  int v_head_dim = 0;     //!< value head dim (= head_dim except for latent attention)
  int hidden = 0;         //!< hidden_size
  int layers = 0;         //!< num_hidden_layers
  std::string note;       //!< what is special about it (MQA, latent attention, ...)
};

//! Every model of the table, in the order `harness list --models` prints them.
const std::vector<ModelShape>& known_models();

//! The model of that name (exact, or ignoring case); nullopt when unknown.
std::optional<ModelShape> find_model(const std::string& name);

//! The names of known_models(), comma-separated (for error messages).
std::string known_model_names();

}  // namespace harness::spec
