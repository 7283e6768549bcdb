#pragma once
// One benchmark case as harness_bench_attention and harness_mask_describe read it from the command
// line, and the resolved mask as JSON (what bench/attention_vs_flex.py rebuilds for every peer).
// Torch-free: harness_mask_describe resolves masks on a machine without CUDA.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>

#include "kernels/mask_desc.h"

namespace harness::bench {

struct CaseOptions {
  std::string mask = "dflash";
  std::string impl = "fused";
  std::string fwd_kernel, bwd_kernel;  // CudaKernelChoice: "" = autotuned
  int64_t anchors = 128, context = 8192, heads = 32, kv_heads = 8, head_dim = 128, documents = 4, batch = 1, window = 0;
  int64_t v_head_dim = 0;  // of v and the output; 0: head_dim
  int64_t value_head_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  int64_t deterministic = 0;
  uint64_t seed = 0;
  int reps = 20;
};

inline const char* kCaseUsage =
    " [--mask dflash|causal|document_causal|sliding_window|full] [--anchors N] [--context N] [--heads N]"
    " [--kv-heads N] [--head-dim N] [--v-head-dim N] [--documents N] [--window N] [--batch N] [--seed N]";

[[noreturn]] inline void case_usage(const char* program, const std::string& problem, const std::string& extra) {
  std::cerr << program << ": " << problem << "\nusage: " << program << kCaseUsage << extra << "\n";
  std::exit(2);
}

//! Parses the case flags; `more` handles the program's own flags (returns false when unknown).
template <typename More>
CaseOptions parse_case(int argc, char** argv, const char* program, const std::string& extra_usage, More more) {
  CaseOptions o;
  const std::map<std::string, int64_t*> integers = {
      {"--anchors", &o.anchors},   {"--context", &o.context},     {"--heads", &o.heads},
      {"--kv-heads", &o.kv_heads}, {"--head-dim", &o.head_dim},   {"--documents", &o.documents},
      {"--batch", &o.batch},       {"--window", &o.window},       {"--deterministic", &o.deterministic},
      {"--v-head-dim", &o.v_head_dim}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) case_usage(program, "missing value after " + flag, extra_usage);
    const std::string value = argv[++i];
    try {
      if (auto found = integers.find(flag); found != integers.end()) {
        std::size_t used = 0;
        *found->second = std::stoll(value, &used);
        if (used != value.size()) throw std::invalid_argument(value);
      } else if (flag == "--seed") {
        o.seed = std::stoull(value);
      } else if (flag == "--mask") {
        o.mask = value;
      } else if (!more(o, flag, value)) {
        case_usage(program, "unknown option " + flag, extra_usage);
      }
    } catch (const std::logic_error&) {
      case_usage(program, "bad value '" + value + "' for " + flag, extra_usage);
    }
  }
  if (!kernels::parse_mask_kind(o.mask)) case_usage(program, "unknown mask " + o.mask, extra_usage);
  if (o.deterministic != 0 && o.deterministic != 1) case_usage(program, "--deterministic must be 0 or 1", extra_usage);
  return o;
}

struct ResolvedCase {
  kernels::MaskDesc desc;
  kernels::AttentionGeometry geometry;
  kernels::ResolvedMask mask;
  int64_t pairs = 0;
};

//! Resolves the case's mask; throws std::invalid_argument naming the problem.
inline ResolvedCase resolve_case(const CaseOptions& o) {
  ResolvedCase r;
  r.desc.kind = *kernels::parse_mask_kind(o.mask);
  r.desc.documents = o.documents;
  r.desc.window = o.window;
  r.desc.seed = o.seed;
  r.geometry.batch = o.batch;
  r.geometry.heads = o.heads;
  r.geometry.kv_heads = o.kv_heads;
  r.geometry.head_dim = o.head_dim;
  r.geometry.v_head_dim = o.v_head_dim;
  r.geometry.anchors = o.anchors;
  r.geometry.context = o.context;
  r.mask = kernels::resolve_mask(r.desc, r.geometry);
  r.pairs = kernels::count_visible_pairs(r.mask);
  return r;
}

//! The case as JSON: mask (everything a peer needs to rebuild it), dims, pairs per head.
inline nlohmann::json describe_case(const CaseOptions& o, const ResolvedCase& r) {
  const auto& m = r.mask;
  const auto split = kernels::document_lengths(r.desc, r.desc.kind == kernels::MaskKind::dflash ? m.context : m.kv_len);
  return {{"mask",
           {{"kind", o.mask},
            {"q_len", m.q_len},
            {"kv_len", m.kv_len},
            {"context", m.context},
            {"block_size", m.block_size},
            {"window", m.window},
            {"context_rule", std::string(kernels::context_rule_name(m.context_rule))},
            {"in_block", std::string(kernels::in_block_name(m.in_block))},
            {"anchors", m.anchors},
            {"doc_lengths", split}}},
          {"dims",
           {{"batch", o.batch},
            {"heads", o.heads},
            {"kv_heads", o.kv_heads},
            {"head_dim", o.head_dim},
            {"v_head_dim", o.value_head_dim()},
            {"anchors", o.anchors}}},
          {"pairs_per_head", r.pairs}};
}

}  // namespace harness::bench
