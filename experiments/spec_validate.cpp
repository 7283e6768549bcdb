// The resolved spec checked section by section (dims, mask, variants, measurements, verdict,
// check, params by the kind), every problem collected with the source that wrote its path; a
// sweep checked axis by axis and then point by point, each point kept resolved (Spec::points).

#include "experiments/spec_loader.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <set>

#include "experiments/kinds/python_kind_info.h"
#include "experiments/kinds/registry.h"
#include "experiments/models.h"
#include "experiments/sweep.h"
#include "experiments/verdict.h"
#include "kernels/cuda/attention_config.h"

namespace harness::spec::loader {
namespace {

// ------------------------------------------------------------------------------------------------
// Known values.

const std::vector<std::string> kFaults = {"segfault", "abort", "throw", "hang", "oom", "nan", "wrong_dq", "wrong_dk_block"};
const std::vector<std::string> kScalingModels = {"q_kv", "q_plus_kv", "layers_q_kv", "layers_q_plus_kv"};
const std::vector<std::string> kDtypes = {"bf16", "fp16", "fp32"};
// FlashAttention-3's head dims. The CPU kernel runs each; the CUDA kernels say at run time which
// they have (a trial they cannot run is recorded `unsupported`, verdict INVALID).
const std::vector<int64_t> kHeadDims = {64, 96, 128, 192, 256};
const std::string kHeadDimsText =
    "supported: 64, 96, 128, 192, 256 (on the CPU every one, fp32, bf16 and fp16; on CUDA bf16 and fp16, with "
    "v_head_dim = head_dim or 192/128: other trials there are recorded unsupported, naming what runs)";
// Outcomes that are not rule results; a rule may not produce them itself.
const std::vector<std::string> kReservedVerdicts = {"INVALID", "INCONCLUSIVE"};
constexpr std::array<kernels::MaskKind, 6> kMaskKinds = {kernels::MaskKind::dflash, kernels::MaskKind::causal,
                                                         kernels::MaskKind::document_causal,
                                                         kernels::MaskKind::sliding_window, kernels::MaskKind::full,
                                                         kernels::MaskKind::blockmask};
// Counts that are only counted (documents); the dims' own bounds are in spec.h.
constexpr int64_t kMaxSize = int64_t{1} << 30;
// A run's points are planned, validated and stored up front; the sweeps that settled the founding
// case had 3 to 10 points. Far beyond that is a generated mistake (and quadratic to check).
constexpr size_t kMaxSweepPoints = 4096;
// Each point of a sweep is a whole resolved spec that is validated, planned, kept for the run and
// handed to its trial: the points times the spec's size are bounded before any of that is done.
constexpr size_t kMaxSweepBytes = size_t{32} << 20;
// Experiment and variant names appear in commands, tables and file names.
constexpr size_t kMaxNameLength = 100;

std::string mask_kind_list() {
  std::vector<std::string> names;
  for (kernels::MaskKind kind : kMaskKinds) names.emplace_back(kernels::mask_kind_name(kind));
  return join(names);
}

// ------------------------------------------------------------------------------------------------
// Validation of the resolved document.

//! Reads dims into spec; whether they are all valid (the mask checks that need them run only then).
bool check_dims(const OrderedJson& doc, Checker& c, Spec& spec) {
  const size_t before = c.count();
  const OrderedJson* dims = c.object(doc, "", "dims", true);
  if (!dims) return false;
  const std::string p = "dims";
  const std::string positive = "a positive integer";
  auto& g = spec.dims;
  g.batch = c.integer(*dims, p, "batch", false, 1, positive, kMaxBatch).value_or(1);
  const auto heads = c.integer(*dims, p, "heads", true, 1, positive, kMaxHeads);
  const auto kv_heads = c.integer(*dims, p, "kv_heads", true, 1, positive, kMaxHeads);
  const auto head_dim = c.integer(*dims, p, "head_dim", true, 1, positive, kMaxHeadDim);
  const auto v_head_dim = c.integer(*dims, p, "v_head_dim", false, 1, positive, kMaxHeadDim);
  const auto anchors = c.integer(*dims, p, "anchors", true, 1, positive, kMaxPositions);
  const auto block_size = c.integer(*dims, p, "block_size", false, 1, positive, kMaxBlockSize);
  g.block_size = block_size.value_or(16);
  const auto context = c.integer(*dims, p, "context", true, 0, "a non-negative integer", kMaxPositions);
  spec.dtype = c.choice(*dims, p, "dtype", false, "dtype", join(kDtypes), [](const std::string& s) {
                  return contains(kDtypes, s);
                }).value_or("bf16");
  spec.layers = c.integer(*dims, p, "layers", false, 1, positive, kMaxLayers).value_or(1);
  if (heads) g.heads = *heads;
  if (kv_heads) g.kv_heads = *kv_heads;
  if (anchors) g.anchors = *anchors;
  if (context) g.context = *context;
  if (head_dim) {
    g.head_dim = *head_dim;
    if (!contains(kHeadDims, *head_dim)) {
      c.issue("dims.head_dim", "unsupported head_dim " + std::to_string(*head_dim) + "; " + kHeadDimsText);
    }
  }
  if (v_head_dim) {
    g.v_head_dim = *v_head_dim;
    if (!contains(kHeadDims, *v_head_dim)) {
      c.issue("dims.v_head_dim", "unsupported v_head_dim " + std::to_string(*v_head_dim) + " (the head dim of v and the "
                                 "output; default head_dim); " + kHeadDimsText);
    }
  }
  if (heads && kv_heads && *heads % *kv_heads != 0) {
    c.issue("dims.heads",
            "heads (" + std::to_string(*heads) + ") must be a multiple of kv_heads (" + std::to_string(*kv_heads) +
                ") so that each KV head serves the same number of query heads",
            {"dims.kv_heads"});
  }
  if (c.count() != before || !heads || !anchors || !context) return false;
  if (const std::string problem = dims_product_problem(g); !problem.empty())
    c.issue(g.q_len() > kMaxPositions ? "dims.anchors" : "dims", problem,
            {"dims.batch", "dims.heads", "dims.anchors", "dims.block_size", "dims.context", "dims.head_dim"});
  return c.count() == before;
}

//! A blockmask's bits come from "file" (a safetensors file; a relative path is taken from the spec
//! file's folder and made absolute) or, with "in_capsule": true, from the capsule being replayed.
void check_blockmask_source(const OrderedJson& mask, Checker& c, Spec& spec) {
  const auto file = c.string(mask, "mask", "file", false);
  const bool in_capsule = c.boolean(mask, "mask", "in_capsule").value_or(false);
  if (file && in_capsule) {
    c.issue("mask.file", "give either file or in_capsule: true, not both", {"mask.in_capsule"});
    return;
  }
  if (!file && !in_capsule) {
    c.issue("mask.file", "required field is missing: a blockmask needs the file of its bits (a safetensors file with "
                         "mask.bits, or a BlockMask's mask.kv_num_blocks, mask.kv_indices, ...: experiments/README.md), "
                         "or in_capsule: true when a replayed capsule carries them",
            {"mask.type"});
  }
  spec.mask.in_capsule = in_capsule;
  if (!file) return;
  std::filesystem::path path(*file);
  if (path.is_relative()) path = std::filesystem::path(spec.source).parent_path() / path;
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(path, error).lexically_normal();
  if (file->empty() || error || !std::filesystem::is_regular_file(absolute, error)) {
    c.issue("mask.file", "no such file: " + (file->empty() ? std::string("\"\"") : absolute.string()) +
                             " (a relative path is taken from the spec file's folder)");
    return;
  }
  spec.mask.file = absolute.string();
}

void check_mask(const OrderedJson& doc, Checker& c, Spec& spec, bool dims_ok) {
  const size_t before = c.count();
  const OrderedJson* mask = c.object(doc, "", "mask", true);
  if (!mask) return;
  const std::string p = "mask";
  auto& m = spec.mask;
  const auto type = c.choice(*mask, p, "type", true, "mask type", mask_kind_list(),
                             [](const std::string& s) { return kernels::parse_mask_kind(s).has_value(); });
  if (type) m.kind = *kernels::parse_mask_kind(*type);
  const bool dflash = type && m.kind == kernels::MaskKind::dflash;
  for (const std::string key : {"context_rule", "in_block"}) {
    if (type && !dflash && mask->contains(key)) {
      c.issue(child(p, key), key + " applies only to dflash masks, not " + *type, {"mask.type"});
    }
  }
  const auto rule = c.choice(*mask, p, "context_rule", false, "context_rule", "before_anchor, through_anchor",
                             [](const std::string& s) { return kernels::parse_context_rule(s).has_value(); });
  if (rule) m.context_rule = *kernels::parse_context_rule(*rule);
  const auto in_block = c.choice(*mask, p, "in_block", false, "in_block", "bidirectional, causal",
                                 [](const std::string& s) { return kernels::parse_in_block(s).has_value(); });
  if (in_block) m.in_block = *kernels::parse_in_block(*in_block);

  const auto window = c.integer(*mask, p, "window", false, 1, "a positive integer (positions, the query included)",
                                2 * kMaxPositions);
  if (type && m.kind == kernels::MaskKind::sliding_window) {
    if (!mask->contains("window"))
      c.issue("mask.window", "required field is missing: sliding_window needs a window of at least 1", {"mask.type"});
    if (window) m.window = *window;
  } else if (type && mask->contains("window")) {
    c.issue("mask.window", "window applies only to sliding_window masks, not " + *type, {"mask.type"});
  }
  if (const auto seed = c.seed(*mask, p, "seed")) m.seed = *seed;
  const bool blockmask = type && m.kind == kernels::MaskKind::blockmask;
  for (const std::string key : {"file", "in_capsule"}) {
    if (type && !blockmask && mask->contains(key))
      c.issue(child(p, key), key + " applies only to blockmask masks, not " + *type, {"mask.type"});
  }
  if (blockmask) {
    check_blockmask_source(*mask, c, spec);
    for (const std::string key : {"documents", "doc_lengths"}) {
      if (mask->contains(key)) c.issue(child(p, key), key + " does not apply to blockmask masks (their bits say it all)");
    }
    return;
  }

  const auto documents = c.integer(*mask, p, "documents", false, 1, "a positive integer", kMaxSize);
  if (documents) m.documents = *documents;
  bool lengths_ok = true;
  if (const OrderedJson* lengths = c.member(*mask, p, "doc_lengths", false)) {
    if (!lengths->is_array() || lengths->empty()) {
      c.issue("mask.doc_lengths", "expected a non-empty array of positive integers, got " + describe(*lengths));
      lengths_ok = false;
    } else {
      for (size_t i = 0; i < lengths->size(); ++i) {
        const auto length = as_integer((*lengths)[i]);
        if (!length || *length < 1 || *length > kMaxSize) {
          c.issue("mask.doc_lengths." + std::to_string(i),
                  "expected a positive document length, got " + describe((*lengths)[i]));
          lengths_ok = false;
        } else {
          m.doc_lengths.push_back(*length);
        }
      }
      if (documents && *documents != static_cast<int64_t>(lengths->size())) {
        c.issue("mask.documents",
                "documents is " + std::to_string(*documents) + " but doc_lengths lists " +
                    std::to_string(lengths->size()) + " documents",
                {"mask.doc_lengths"});
      }
      if (lengths_ok) m.documents = static_cast<int64_t>(m.doc_lengths.size());
    }
  }
  if (!type || !dims_ok || c.count() != before) return;

  // Documents split the context for dflash, the whole KV sequence for the others.
  const auto& g = spec.dims;
  const int64_t split = dflash ? g.context : g.kv_len();
  const std::string split_name =
      dflash ? "the context of " + std::to_string(split) + " positions"
             : "the " + std::to_string(split) + " KV positions (context + anchors * block_size)";
  if (!m.doc_lengths.empty()) {
    int64_t sum = 0;
    for (int64_t length : m.doc_lengths) sum += length;
    if (sum != split) {
      c.issue("mask.doc_lengths", "doc_lengths sum to " + std::to_string(sum) + " but must split " + split_name,
              {"dims.context", "dims.anchors", "dims.block_size"});
      return;
    }
  } else if (m.documents > split) {
    c.issue(
        "mask.documents",
        std::to_string(m.documents) + " documents do not fit in " + split_name + "; each needs at least one position",
        {"dims.context", "dims.anchors", "dims.block_size"});
    return;
  }
  if (dflash) {
    const int64_t valid = kernels::count_valid_anchor_positions(m, g.context, g.block_size);
    if (g.anchors > valid) {
      c.issue("dims.anchors",
              std::to_string(g.anchors) + " anchors, but the dflash mask has only " + std::to_string(valid) +
                  " valid anchor positions (" + std::to_string(m.documents) + " document(s) in " + split_name +
                  "; an anchor needs one earlier position and block_size " + std::to_string(g.block_size) +
                  " positions after it in its document)",
              {"dims.context", "dims.block_size", "mask.documents", "mask.doc_lengths"});
    }
  }
}

// A variant's CUDA kernel choice: "kernel": {"fwd": NAME, "bwd": NAME} and "deterministic": bool,
// for attention_step variants that run the fused kernels (a dense variant runs none of them).
void check_kernel_choice(const OrderedJson& body, const std::string& p, Checker& c, Variant& variant,
                         const kinds::KindInfo* kind) {
  const OrderedJson* kernel = c.member(body, p, "kernel", false);
  const OrderedJson* deterministic = c.member(body, p, "deterministic", false);
  if (!kernel && !deterministic) return;
  variant.sets_kernel_choice = true;
  if (kind && !kind->attention) {
    for (const char* key : {"kernel", "deterministic"}) {
      if (body.contains(key)) c.issue(child(p, key), std::string(key) + " exists only for attention_step specs");
    }
    return;
  }
  const bool fused = variant.impl.empty() || variant.impl == "fused";  // impl errors are reported already
  if (deterministic) {
    if (const auto value = c.boolean(body, p, "deterministic")) {
      if (*value && !fused) {
        c.issue(child(p, "deterministic"), "deterministic applies to the fused CUDA kernels; impl \"" + variant.impl +
                                               "\" runs none (drop it or use impl \"fused\")");
      } else {
        variant.deterministic = *value;
      }
    }
  }
  if (!kernel) return;
  const std::string kp = child(p, "kernel");
  if (!kernel->is_object() || kernel->empty()) {
    c.issue(kp, "expected an object such as {\"fwd\": \"wgmma_m64_n64\", \"bwd\": \"wgmma\"}, got " + describe(*kernel));
    return;
  }
  if (!fused) {
    c.issue(kp, "a kernel choice applies to the fused CUDA kernels; impl \"" + variant.impl + "\" runs none");
    return;
  }
  const std::vector<std::string> fwd = known_fwd_kernels(), bwd = known_bwd_kernels();
  for (const auto& [key, known, out] : {std::tuple{"fwd", &fwd, &variant.fwd_kernel},
                                        std::tuple{"bwd", &bwd, &variant.bwd_kernel}}) {
    if (const auto name = c.string(*kernel, kp, key, false)) {
      if (contains(*known, *name)) {
        *out = *name;
      } else {
        c.issue(child(kp, key), std::string("unknown ") + key + " kernel \"" + *name + "\"; known: " + join(*known));
      }
    }
  }
}

void check_variants(const OrderedJson& doc, Checker& c, Spec& spec, bool allow_faults, const kinds::KindInfo* kind) {
  const OrderedJson* variants = c.object(doc, "", "variants", true);
  if (!variants) return;
  if (variants->empty()) {
    c.issue("variants", "expected at least one variant");
    return;
  }
  std::vector<std::string> written;
  for (const auto& [name, body] : variants->items()) {
    written.push_back(name);
    const std::string p = child("variants", name);
    if (name.size() > kMaxNameLength) {
      c.issue(p, "variant name of " + std::to_string(name.size()) + " characters; at most " +
                     std::to_string(kMaxNameLength));
    } else if (!is_identifier(name)) {
      c.issue(p, "variant name \"" + name + "\" must match [a-z0-9_]+ (verdict rules read variant.metric)");
    }
    if (!body.is_object()) {
      c.issue(p, "expected an object such as {\"impl\": \"fused\"}, got " + describe(body));
      continue;
    }
    Variant variant;
    variant.name = name;
    if (const auto impl = c.string(body, p, "impl", true); impl && kind) {
      if (contains(kind->impls, *impl)) {
        variant.impl = *impl;
      } else {
        c.issue(child(p, "impl"), "unknown impl \"" + *impl + "\" for kind " + kind->name + "; known: " + join(kind->impls));
      }
    }
    if (const OrderedJson* fault = c.member(body, p, "fault", false)) {
      if (kind && !kind->attention) {
        c.issue(child(p, "fault"), "fault injection exists only for attention_step specs");
      } else if (!allow_faults) {
        c.issue(child(p, "fault"), "fault injection is for tests only and is rejected unless the loader allows faults");
      } else if (!fault->is_string() || !contains(kFaults, fault->get<std::string>())) {
        c.issue(child(p, "fault"), "unknown fault " + describe(*fault) + "; known: " + join(kFaults));
      } else {
        variant.fault = fault->get<std::string>();
      }
    }
    check_kernel_choice(body, p, c, variant, kind);
    spec.variants.push_back(std::move(variant));
  }
  // The resolved JSON of the db sorts keys; variant_order keeps the order the file was written in.
  if (const OrderedJson* order = c.member(doc, "", "variant_order", false)) {
    std::vector<std::string> listed;
    if (order->is_array()) {
      for (const auto& name : *order) {
        if (name.is_string()) listed.push_back(name.get<std::string>());
      }
    }
    std::vector<std::string> sorted_listed = listed, sorted_written = written;
    std::sort(sorted_listed.begin(), sorted_listed.end());
    std::sort(sorted_written.begin(), sorted_written.end());
    if (!order->is_array() || listed.size() != order->size() || sorted_listed != sorted_written) {
      c.issue("variant_order", "expected each variant name once (" + join(written) + "), got " + describe(*order),
              {"variants"});
      return;
    }
    std::vector<Variant> ordered;
    for (const std::string& name : listed) {
      ordered.push_back(
          *std::find_if(spec.variants.begin(), spec.variants.end(), [&](const Variant& v) { return v.name == name; }));
    }
    spec.variants = std::move(ordered);
  }
}

void check_measure(const OrderedJson& doc, Checker& c, Spec& spec, const kinds::KindInfo& kind) {
  const std::vector<std::string>& kMeasures = kind.measures;
  const OrderedJson* measure = c.member(doc, "", "measure", false);
  if (!measure) {
    spec.measure = kind.default_measures;
    return;
  }
  if (!measure->is_array()) {
    c.issue("measure", "expected an array of measurement names, got " + describe(*measure));
    return;
  }
  for (size_t i = 0; i < measure->size(); ++i) {
    const OrderedJson& entry = (*measure)[i];
    const std::string p = "measure." + std::to_string(i);
    if (!entry.is_string() || !contains(kMeasures, entry.get<std::string>())) {
      c.issue(p, "unknown measurement " + describe(entry) + "; known: " + join(kMeasures));
    } else if (contains(spec.measure, entry.get<std::string>())) {
      c.issue(p, "\"" + entry.get<std::string>() + "\" is listed twice");
    } else {
      spec.measure.push_back(entry.get<std::string>());
    }
  }
}

void check_verdict(const OrderedJson& doc, Checker& c, Spec& spec, bool variants_ok) {
  const OrderedJson* verdict = c.member(doc, "", "verdict", true);
  if (!verdict) return;
  if (!verdict->is_array() || verdict->empty()) {
    c.issue("verdict",
            "expected a non-empty array of clauses such as {\"if\": \"fused.match\", \"then\": \"OK\"} "
            "ending in {\"else\": \"...\"}, got " +
                describe(*verdict));
    return;
  }
  const size_t issues_before = c.count();
  std::vector<std::string> variant_names;
  for (const Variant& v : spec.variants) variant_names.push_back(v.name);
  ConditionVocabulary vocabulary = vocabulary_for(spec.kind, spec.scaling);
  // A python spec's metrics are its script's: params.metrics declares which the rule may read.
  if (spec.kind == "python") {
    for (const std::string& name : kinds::python_verdict_metrics(spec.params)) vocabulary.numbers.push_back(name);
  }
  for (size_t i = 0; i < verdict->size(); ++i) {
    const OrderedJson& clause = (*verdict)[i];
    const std::string p = "verdict." + std::to_string(i);
    if (!clause.is_object()) {
      c.issue(p, "expected {\"if\": ..., \"then\": ...} or {\"else\": ...}, got " + describe(clause));
      continue;
    }
    VerdictClause parsed;
    if (clause.contains("else")) {
      if (clause.contains("if") || clause.contains("then")) {
        c.issue(p, "a clause has either \"if\" and \"then\" or only \"else\"");
      }
      if (i + 1 != verdict->size()) {
        c.issue(p, "the else clause must be the last one; the clauses after it would never apply");
      }
      parsed.then = c.string(clause, p, "else", true).value_or("");
    } else {
      const auto condition = c.string(clause, p, "if", true);
      parsed.then = c.string(clause, p, "then", true).value_or("");
      if (condition) {
        parsed.condition = *condition;
        // Unknown variants are only worth naming once the variants themselves are valid.
        const auto problems = check_verdict_condition(
            *condition, variants_ok ? variant_names : std::vector<std::string>{}, vocabulary);
        for (const std::string& problem : problems) {
          if (variants_ok || problem.find("unknown variant") == std::string::npos) c.issue(child(p, "if"), problem);
        }
        if (problems.empty()) {
          for (const auto& [variant, metric] : verdict_condition_reads(*condition)) {
            const bool measured_metric = (metric.ends_with("_bytes") || metric.ends_with("_ms")) &&
                                         kinds::find_kind(spec.kind) && kinds::find_kind(spec.kind)->attention;
            if (measured_metric && !contains(spec.measure, metric)) {
              c.issue(child(p, "if"), "reads " + variant + "." + metric + " but \"measure\" does not list " + metric,
                      {"measure"});
            } else if ((metric == "match" || metric.ends_with("_err")) && !spec.check) {
              c.issue(child(p, "if"), "reads " + variant + "." + metric + " but check.enabled is false",
                      {"check.enabled"});
            }
          }
        }
      }
    }
    if (contains(kReservedVerdicts, parsed.then)) {
      c.issue(child(p, clause.contains("else") ? "else" : "then"),
              "\"" + parsed.then + "\" is reserved for outcomes the rule cannot decide; choose another word");
    }
    spec.verdict.push_back(std::move(parsed));
  }
  if (!verdict->back().is_object() || !verdict->back().contains("else")) {
    c.issue("verdict", "the rule has no final {\"else\": ...} clause, so some outcomes would have no verdict");
  }
  // A failed correctness check must not fall through to a hypothesis verdict (experiments/verdict.h).
  if (spec.check && c.count() == issues_before)
    for (const auto& [index, problem] : failed_check_problems(spec.verdict))
      c.issue("verdict." + std::to_string(index), problem);
}

//! Profiles: an object of objects whose fields the schema knows. `skip` is the applied profile,
//! which is validated in full after merging.
}  // namespace

void check_profiles(const OrderedJson& doc, const std::string& skip, Checker& checker) {
  const auto profiles = doc.find("profiles");
  if (profiles == doc.end()) return;
  if (!profiles->is_object()) {
    checker.issue("profiles", "expected an object of named profiles, got " + describe(*profiles));
    return;
  }
  for (const auto& [name, body] : profiles->items()) {
    if (name == skip) continue;
    if (!body.is_object()) {
      checker.issue(child("profiles", name), "expected an object, got " + describe(body));
    } else {
      check_known_fields(body, *schema().profile, child("profiles", name), checker);
    }
  }
}

namespace {

Spec validate_point(const OrderedJson& doc, const std::string& source, std::vector<Origin> origins, bool allow_faults,
                    std::vector<SpecIssue> earlier_issues, size_t earlier_more = 0) {
  Checker c(source, std::move(origins), std::move(earlier_issues), earlier_more);
  Spec spec;
  spec.source = source;
  if (!doc.is_object()) {
    c.issue("", "expected a JSON object at the top level, got " + describe(doc));
    throw c.error();
  }
  OrderedJson without_profiles = doc;
  without_profiles.erase("profiles");
  check_known_fields(without_profiles, *schema().root, "", c);
  check_profiles(doc, "", c);

  if (const auto name = c.string(doc, "", "name", true)) {
    spec.name = *name;
    if (name->size() > kMaxNameLength) {
      c.issue("name", "a name of " + std::to_string(name->size()) + " characters; at most " +
                          std::to_string(kMaxNameLength) + " (it names the experiment on the command line and in the db)");
    } else if (!is_identifier(*name)) {
      c.issue("name", "name \"" + *name +
                          "\" must match [a-z0-9_]+ (it names the experiment on the command line "
                          "and in the db)");
    }
  }
  spec.hypothesis = c.string(doc, "", "hypothesis", true).value_or("");
  const kinds::KindInfo* kind = nullptr;
  if (const auto name = c.string(doc, "", "kind", true)) {
    kind = kinds::find_kind(*name);
    if (kind) {
      spec.kind = *name;
    } else {
      std::vector<std::string> known;
      for (const kinds::KindInfo& info : kinds::all_kinds()) known.push_back(info.name);
      c.issue("kind", "unknown kind \"" + *name + "\"; known: " + join(known));
    }
  }
  // Without a kind the spec is read as attention_step's (the default kind), so that its missing
  // fields are reported together.
  const bool attention = (kind && kind->attention) || !doc.contains("kind");
  if (attention) {
    const bool dims_ok = check_dims(doc, c, spec);
    check_mask(doc, c, spec, dims_ok);
  } else if (kind) {
    for (const std::string field : {"dims", "mask", "block_mask", "check"}) {
      if (doc.contains(field)) c.issue(field, "kind " + kind->name + " has no " + field + " (only attention_step has)");
    }
  }
  if (const OrderedJson* params = c.member(doc, "", "params", false)) {
    if (!params->is_object()) {
      c.issue("params", "expected an object of the kind's parameters, got " + describe(*params));
    } else {
      spec.params = nlohmann::json::parse(params->dump());
    }
  }
  if (kind && spec.params.is_object()) {
    kinds::ParamIssues problems;
    kind->check_params(spec.params, problems);
    for (auto& [path, message] : problems) c.issue(path, std::move(message));
  }
  if (const OrderedJson* scaling = c.object(doc, "", "scaling", false)) {
    Scaling parsed;
    if (!attention) c.issue("scaling", "scaling fits are defined for attention_step specs only");
    if (const auto metric = c.string(*scaling, "scaling", "metric", true)) {
      parsed.metric = *metric;
      if (kind && (!contains(kind->measures, *metric) || !(metric->ends_with("_bytes") || metric->ends_with("_ms"))))
        c.issue("scaling.metric", "expected a measured size or duration (e.g. bwd_peak_bytes), got \"" + *metric + "\"");
    }
    const OrderedJson* models = c.member(*scaling, "scaling", "models", true);
    if (models && (!models->is_array() || models->empty())) {
      c.issue("scaling.models", "expected a non-empty array of models (" + join(kScalingModels) + "), got " + describe(*models));
    } else if (models) {
      for (size_t i = 0; i < models->size(); ++i) {
        const OrderedJson& model = (*models)[i];
        if (!model.is_string() || !contains(kScalingModels, model.get<std::string>())) {
          c.issue("scaling.models." + std::to_string(i), "unknown model " + describe(model) + "; known: " + join(kScalingModels));
        } else {
          parsed.models.push_back(model.get<std::string>());
        }
      }
    }
    spec.scaling = std::move(parsed);
  }
  if (const OrderedJson* block_mask = attention ? c.object(doc, "", "block_mask", false) : nullptr) {
    spec.mask_block = c.integer(*block_mask, "block_mask", "block_size", false, 16,
                                "a positive multiple of 16 (the kernels' tile granularity)", kMaxMaskBlock)
                          .value_or(128);
    if (spec.mask_block % 16 != 0) {
      c.issue("block_mask.block_size", "expected a positive multiple of 16 (the kernels' tile granularity), got " +
                                           std::to_string(spec.mask_block));
    }
  }
  const size_t before_variants = c.count();
  check_variants(doc, c, spec, allow_faults, kind);
  const bool variants_ok = c.count() == before_variants;
  if (kind) check_measure(doc, c, spec, *kind);
  spec.repeats = static_cast<int>(c.integer(doc, "", "repeats", false, 1, "a positive integer", 1000000).value_or(3));
  spec.warmup = static_cast<int>(c.integer(doc, "", "warmup", false, 0, "a non-negative integer", 1000000).value_or(1));
  spec.timeout_s = c.number(doc, "", "timeout_s", 0.0, false, "a positive number of seconds").value_or(600.0);
  if (spec.timeout_s > kMaxTimeoutS) {
    c.issue("timeout_s", "expected at most " + std::to_string(static_cast<int64_t>(kMaxTimeoutS)) +
                             " seconds (7 days) for one trial, got " + describe(doc["timeout_s"]));
    spec.timeout_s = 600.0;
  }
  if (const auto seed = c.seed(doc, "", "seed")) spec.seed = *seed;
  if (const OrderedJson* check = attention ? c.object(doc, "", "check", false) : nullptr) {
    spec.check = c.boolean(*check, "check", "enabled").value_or(true);
    spec.tolerance.factor = c.number(*check, "check", "factor", 0.0, false, "a positive number").value_or(2.0);
    spec.tolerance.mean_factor =
        c.number(*check, "check", "mean_factor", 0.0, false, "a positive number").value_or(spec.tolerance.mean_factor);
    spec.tolerance.atol = c.number(*check, "check", "atol", 0.0, true, "a non-negative number").value_or(0.0);
    spec.tolerance.rtol = c.number(*check, "check", "rtol", 0.0, true, "a non-negative number");
  }
  check_verdict(doc, c, spec, variants_ok);
  if (const auto model = c.string(doc, "", "model", false)) {
    if (!find_model(*model)) {
      c.issue("model", "unknown model \"" + *model + "\"; known models: " + known_model_names() +
                           " (harness list --models)");
    } else if (!attention) {
      c.issue("model", "a model sets dims (heads, kv_heads, head_dim), which only attention specs have; this spec's kind is " +
                           spec.kind);
    } else {
      spec.model = find_model(*model)->name;
    }
  }
  if (const OrderedJson* profile = c.member(doc, "", "profile", false)) {
    if (profile->is_string()) {
      spec.profile = profile->get<std::string>();
    } else {
      c.issue("profile", "expected the name of the applied profile (a string), got " + describe(*profile));
    }
  }
  if (c.count() > 0) throw c.error();

  OrderedJson resolved = doc;
  resolved.erase("profiles");
  // The trial child and a replay read the mask file from the resolved spec, wherever they run from.
  if (!spec.mask.file.empty()) resolved["mask"]["file"] = spec.mask.file;
  resolved["profile"] = spec.profile;
  resolved["variant_order"] = OrderedJson::array();
  for (const Variant& v : spec.variants) resolved["variant_order"].push_back(v.name);
  spec.resolved = nlohmann::json::parse(resolved.dump());
  return spec;
}

}  // namespace


//! The whole spec: the sweep's axes checked, then every point validated as its own spec; the
//! returned spec is the first point's, with the sweep and the unswept resolved JSON.
Spec validate(const OrderedJson& doc, const std::string& source, std::vector<Origin> origins, bool allow_faults,
              std::vector<SpecIssue> earlier_issues, size_t earlier_more) {
  if (!doc.is_object() || !doc.contains("sweep"))
    return validate_point(doc, source, std::move(origins), allow_faults, std::move(earlier_issues), earlier_more);
  Checker c(source, origins, std::move(earlier_issues), earlier_more);
  const OrderedJson& sweep = doc["sweep"];
  std::vector<SweepAxis> axes;
  if (!sweep.is_object() || sweep.empty()) {
    c.issue("sweep", "expected an object of field paths and value lists, e.g. {\"dims.anchors\": [128, 256, 512]}, got " +
                         describe(sweep));
  } else {
    for (const auto& [path, values] : sweep.items()) {
      const std::string p = "sweep." + path;
      if (const std::string problem = sweep_path_problem(path); !problem.empty()) {
        c.issue(p, problem);
        continue;
      }
      if (!values.is_array() || values.empty()) {
        c.issue(p, "expected a non-empty array of values to sweep, got " + describe(values));
        continue;
      }
      if (values.size() > kMaxSweepPoints) {
        c.issue(p, "lists " + std::to_string(values.size()) + " values; a run sweeps at most " +
                       std::to_string(kMaxSweepPoints) + " points (split it into several runs)");
        continue;
      }
      SweepAxis axis{path, {}};
      for (size_t i = 0; i < values.size(); ++i) {
        const nlohmann::json value = nlohmann::json::parse(values[i].dump());
        if (std::find(axis.values.begin(), axis.values.end(), value) != axis.values.end()) {
          c.issue(p + "." + std::to_string(i), "the value " + describe(values[i]) + " is listed twice");
        }
        axis.values.push_back(value);
      }
      axes.push_back(std::move(axis));
    }
  }
  // A spec read back from the db has its keys sorted; sweep_order keeps the written axis order.
  if (const auto order = doc.find("sweep_order"); order != doc.end() && order->is_array() && order->size() == axes.size()) {
    std::vector<SweepAxis> ordered;
    for (const auto& path : *order) {
      const auto found = std::find_if(axes.begin(), axes.end(), [&](const SweepAxis& axis) { return path == axis.path; });
      if (found == axes.end()) break;
      ordered.push_back(*found);
    }
    if (ordered.size() == axes.size()) axes = std::move(ordered);
  }
  size_t point_count = 1;
  for (const SweepAxis& axis : axes) point_count = std::min(point_count * axis.values.size(), kMaxSweepPoints + 1);
  if (point_count > kMaxSweepPoints)
    c.issue("sweep", "the axes cross into more than " + std::to_string(kMaxSweepPoints) +
                         " points; a run sweeps at most that many (split it into several runs)");
  if (c.count() > 0) throw c.error();
  // Every point below is a copy of the whole spec, validated, planned and kept: bounded first.
  if (const size_t bytes = doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).size();
      point_count > 1 && bytes > kMaxSweepBytes / point_count) {
    c.issue("sweep", "a spec of " + std::to_string(bytes) + " bytes swept over " + std::to_string(point_count) +
                         " points makes " + std::to_string(bytes * point_count) + " bytes of resolved specs; at most " +
                         std::to_string(kMaxSweepBytes) + " (fewer points, or a smaller spec)");
    throw c.error();
  }

  // Every point is validated; a problem shared by several points is reported once, at the first.
  // Past kMaxIssuesKept problems the later points are not validated (their problems would only be
  // counted, and remembering which were seen would grow with every point).
  const std::vector<nlohmann::json> points = cross_points(axes);
  std::vector<ResolvedPoint> resolved_points;
  std::set<std::pair<std::string, std::string>> seen;
  for (size_t index = 0; index < points.size(); ++index) {
    if (c.issues().size() >= kMaxIssuesKept) {
      c.note({source, "sweep", "the points from " + point_label(points[index]) + " on were not validated (too many problems)"});
      break;
    }
    OrderedJson at_point = doc;
    at_point.erase("sweep");
    at_point.erase("sweep_order");
    // set_path's nlohmann::json would sort the fields; the ordered document keeps the written order.
    for (const auto& [path, value] : points[index].items()) {
      OrderedJson* target = &at_point;
      size_t start = 0;
      while (true) {
        const size_t dot = path.find('.', start);
        const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        if (!target->is_object()) *target = OrderedJson::object();
        target = &(*target)[part];
        if (dot == std::string::npos) break;
        start = dot + 1;
      }
      *target = OrderedJson::parse(value.dump());
    }
    try {
      resolved_points.push_back(
          {points[index], std::make_shared<const Spec>(validate_point(at_point, source, origins, allow_faults, {}))});
    } catch (const SpecError& error) {
      for (SpecIssue issue : error.issues()) {
        bool on_axis = false;
        for (const SweepAxis& axis : axes) {
          if (path_overlaps(issue.path, axis.path)) {
            on_axis = true;
            const auto at = std::find(axis.values.begin(), axis.values.end(), points[index].at(axis.path));
            issue.path = "sweep." + axis.path + "." + std::to_string(at - axis.values.begin());
            issue.source = source;
            for (auto origin = origins.rbegin(); origin != origins.rend(); ++origin) {
              if (path_overlaps(origin->path, "sweep") || origin->path == axis.path) {
                issue.source = origin->source;
                break;
              }
            }
          }
        }
        if (!seen.insert({issue.path, issue.message}).second) continue;
        // A problem of the first point that is not about a swept field is the spec's own.
        if (points.size() > 1 && (on_axis || index > 0))
          issue.message = "at " + point_label(points[index]) + ": " + issue.message;
        c.add(std::move(issue));
      }
      c.count_more(error.more());
    }
  }
  if (c.count() > 0) throw c.error();
  Spec spec = *resolved_points.front().spec;
  spec.sweep = std::move(axes);
  spec.points = std::move(resolved_points);
  nlohmann::json resolved = spec.resolved;
  resolved["sweep"] = nlohmann::json::parse(sweep.dump());
  resolved["sweep_order"] = nlohmann::json::array();
  for (const SweepAxis& axis : spec.sweep) resolved["sweep_order"].push_back(axis.path);
  spec.resolved = std::move(resolved);
  return spec;
}

}  // namespace harness::spec::loader
