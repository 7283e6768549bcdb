#include "analysis/memory_snapshot.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "analysis/pickle_reader.h"
#include "analysis/svg_plot.h"
#include "core/byte_size.h"

namespace harness::analysis {
namespace {

using json = nlohmann::json;

int64_t integer(const json& object, std::initializer_list<const char*> keys, const std::string& where) {
  for (const char* key : keys) {
    const auto found = object.find(key);
    if (found != object.end() && found->is_number()) return found->get<int64_t>();
  }
  throw SnapshotError(fmt::format("{}: an entry lacks '{}' ({})", where, *keys.begin(), object.dump().substr(0, 120)));
}

std::vector<SnapshotBlock> sorted_blocks(const std::map<int64_t, int64_t>& live) {
  std::vector<SnapshotBlock> blocks;
  for (const auto& [address, bytes] : live) blocks.push_back({address, bytes, ""});
  std::stable_sort(blocks.begin(), blocks.end(), [](const SnapshotBlock& a, const SnapshotBlock& b) { return a.bytes > b.bytes; });
  return blocks;
}

// The active blocks of a segment by address. Blocks carry no address: they tile the segment in
// order from its start (as memory_viz reads them).
std::vector<std::pair<int64_t, int64_t>> active_blocks(const json& segment, const std::string& where) {
  std::vector<std::pair<int64_t, int64_t>> blocks;
  int64_t address = integer(segment, {"address"}, where);
  const json list = segment.value("blocks", json::array());
  if (!list.is_array()) throw SnapshotError(where + ": a segment's 'blocks' is not a list");
  for (const json& block : list) {
    if (!block.is_object()) throw SnapshotError(where + ": a block is not a dict");
    const int64_t bytes = integer(block, {"size"}, where);
    const std::string state = block.value("state", "");
    if (state == "active_allocated" || state == "active_pending_free") blocks.emplace_back(address, bytes);
    address += bytes;
  }
  return blocks;
}

// Undoes one trace event on a state that is after it (so walking from the snapshot's end state
// back through the trace gives the state after every earlier event, as memory_viz does).
void undo(const json& event, std::map<int64_t, int64_t>& live, int64_t& allocated, int64_t& reserved) {
  const std::string action = event.value("action", "");
  const int64_t size = event.value("size", int64_t{0});
  if (action == "alloc") {
    const int64_t address = event.value("addr", int64_t{0});
    live.erase(address);
    allocated -= size;
  } else if (action == "free_completed") {
    live[event.value("addr", int64_t{0})] = size;
    allocated += size;
  } else if (action == "segment_alloc" || action == "segment_map") {
    reserved -= size;
  } else if (action == "segment_free" || action == "segment_unmap") {
    reserved += size;
  }
}

std::string names_of(const memory_model::Prediction& prediction, int64_t bytes, bool as_request) {
  std::vector<std::string> names;
  for (const auto& a : prediction.allocations) {
    const int64_t size = as_request ? memory_model::cuda_request_bytes(a.bytes) : memory_model::allocated_bytes(a.bytes, "cuda");
    if (size == bytes && std::find(names.begin(), names.end(), a.tensor) == names.end()) names.push_back(a.tensor);
  }
  // At small dims many tensors share a size; three names and a count keep a bar's label readable.
  constexpr size_t kNamesShown = 3;
  std::string text;
  for (size_t i = 0; i < std::min(names.size(), kNamesShown); ++i) text += (text.empty() ? "" : " = ") + names[i];
  if (names.size() > kNamesShown) text += fmt::format(" (+{} more)", names.size() - kNamesShown);
  return text;
}

}  // namespace

SnapshotSummary summarize_snapshot(const json& snapshot, const std::string& where) {
  if (!snapshot.is_object() || !snapshot.contains("segments") || !snapshot["segments"].is_array())
    throw SnapshotError(where + ": not an allocator snapshot (no 'segments' list)");
  SnapshotSummary summary;
  const json traces = snapshot.value("device_traces", json::array());
  if (!traces.is_array()) throw SnapshotError(where + ": 'device_traces' is not a list");
  // The device with the longest trace (a trial uses one device).
  size_t device = 0;
  for (size_t d = 0; d < traces.size(); ++d)
    if (traces[d].is_array() && traces[d].size() > traces[device].size()) device = d;
  summary.device = static_cast<int>(device);
  const json events = device < traces.size() && traces[device].is_array() ? traces[device] : json::array();
  summary.trace_events = static_cast<int64_t>(events.size());

  // The end state: active blocks and segments of that device.
  std::map<int64_t, int64_t> live;
  for (const json& segment : snapshot["segments"]) {
    if (!segment.is_object()) throw SnapshotError(where + ": a segment is not a dict");
    if (segment.value("device", int64_t{0}) != static_cast<int64_t>(device)) continue;
    ++summary.segments;
    summary.reserved_at_end += integer(segment, {"total_size"}, where);
    for (const auto& [address, bytes] : active_blocks(segment, where)) {
      live[address] = bytes;
      summary.allocated_at_end += bytes;
    }
  }

  // Walk back from the end: the state after each event, the peak and the OOM.
  std::vector<SnapshotPoint> backwards;
  int64_t allocated = summary.allocated_at_end, reserved = summary.reserved_at_end;
  const double t0 = events.empty() ? 0.0 : events.front().value("time_us", 0.0);
  auto time_ms = [&](const json& event) { return (event.value("time_us", t0) - t0) / 1000.0; };
  size_t peak_after = events.size();  // events.size(): the end state
  summary.peak_allocated = allocated;
  for (const auto& [address, bytes] : live) summary.largest_block = std::max(summary.largest_block, bytes);
  std::optional<size_t> oom_index;
  for (size_t i = events.size(); i-- > 0;) {
    const json& event = events[i];
    if (!event.is_object()) throw SnapshotError(fmt::format("{}: trace event {} is not a dict", where, i));
    backwards.push_back({time_ms(event), allocated, reserved});  // after event i
    if (allocated > summary.peak_allocated) {
      summary.peak_allocated = allocated;
      peak_after = i;
    }
    if (event.value("action", "") == "alloc") summary.largest_block = std::max(summary.largest_block, event.value("size", int64_t{0}));
    if (event.value("action", "") == "oom" && !oom_index) oom_index = i;
    undo(event, live, allocated, reserved);
  }
  summary.timeline.assign(backwards.rbegin(), backwards.rend());

  // Replay back again to the two states worth listing (cheap: snapshots hold thousands of events).
  auto state_after = [&](size_t index) {
    std::map<int64_t, int64_t> state;
    int64_t a = 0, r = 0;
    for (const json& segment : snapshot["segments"]) {
      if (segment.value("device", int64_t{0}) != static_cast<int64_t>(device)) continue;
      for (const auto& [address, bytes] : active_blocks(segment, where)) state[address] = bytes;
    }
    for (size_t i = events.size(); i-- > index + 1;) undo(events[i], state, a, r);
    return state;
  };
  summary.at_peak = sorted_blocks(state_after(peak_after));
  if (peak_after < events.size()) summary.peak_time_ms = time_ms(events[peak_after]);
  else if (!events.empty()) summary.peak_time_ms = time_ms(events.back());
  if (oom_index) {
    const json& event = events[*oom_index];
    SnapshotOom oom;
    oom.requested_bytes = event.value("size", int64_t{0});
    oom.device_free_bytes = event.value("device_free", int64_t{0});
    oom.time_ms = time_ms(event);
    const SnapshotPoint& at = summary.timeline[*oom_index];
    oom.allocated = at.allocated;
    oom.reserved = at.reserved;
    oom.live = sorted_blocks(state_after(*oom_index));
    summary.oom = std::move(oom);
  }
  return summary;
}

SnapshotSummary read_snapshot(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw SnapshotError(path + ": cannot open the snapshot");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  json snapshot;
  try {
    snapshot = read_pickle(bytes.str());
  } catch (const PickleError& error) {
    throw SnapshotError(path + ": " + error.what());
  }
  return summarize_snapshot(snapshot, path);
}

void name_blocks(SnapshotSummary& summary, const memory_model::Prediction& prediction) {
  for (auto& block : summary.at_peak) block.name = names_of(prediction, block.bytes, false);
  if (summary.oom) {
    for (auto& block : summary.oom->live) block.name = names_of(prediction, block.bytes, false);
    summary.oom->name = names_of(prediction, summary.oom->requested_bytes, false);
    if (summary.oom->name.empty()) summary.oom->name = names_of(prediction, summary.oom->requested_bytes, true);
  }
}

std::string render_snapshot_timeline_svg(const SnapshotSummary& summary, const std::string& title) {
  Plot plot;
  plot.title = title;
  plot.x_label = "time since the first recorded event (ms)";
  plot.y_label = "bytes";
  plot.y_unit = "bytes";
  plot.x_scale = Scale::kLinear;
  plot.y_scale = Scale::kLinear;
  // At most ~600 points: each bucket keeps its largest value, so the peak stays visible.
  const size_t stride = std::max<size_t>(1, summary.timeline.size() / 600);
  PlotSeries allocated{"allocated", {}, 0, true, false, Marker::kCircle};
  PlotSeries reserved{"reserved (segments)", {}, 1, true, true, Marker::kCircle};
  for (size_t start = 0; start < summary.timeline.size(); start += stride) {
    SnapshotPoint high = summary.timeline[start];
    for (size_t i = start; i < std::min(summary.timeline.size(), start + stride); ++i) {
      if (summary.timeline[i].allocated > high.allocated) high = summary.timeline[i];
      high.reserved = std::max(high.reserved, summary.timeline[i].reserved);
    }
    allocated.points.push_back({high.time_ms, static_cast<double>(high.allocated), std::nullopt, std::nullopt});
    reserved.points.push_back({high.time_ms, static_cast<double>(high.reserved), std::nullopt, std::nullopt});
  }
  plot.series = {allocated, reserved};
  PlotSeries peak{"peak " + format_bytes(static_cast<double>(summary.peak_allocated)), {}, 2, false, false, Marker::kHollowCircle};
  peak.points.push_back({summary.peak_time_ms, static_cast<double>(summary.peak_allocated), std::nullopt, std::nullopt});
  plot.series.push_back(peak);
  if (summary.oom) {
    PlotSeries oom{"OOM: asked " + format_bytes(static_cast<double>(summary.oom->requested_bytes)), {}, 3, false, false, Marker::kCross};
    oom.points.push_back({summary.oom->time_ms, static_cast<double>(summary.oom->allocated + summary.oom->requested_bytes),
                          static_cast<double>(summary.oom->allocated), std::nullopt});
    plot.series.push_back(oom);
  }
  return render_svg(plot);
}

std::string render_snapshot_peak_svg(const SnapshotSummary& summary, size_t top, const std::string& title) {
  const std::vector<SnapshotBlock>& blocks = summary.oom ? summary.oom->live : summary.at_peak;
  std::vector<SnapshotBlock> rows(blocks.begin(), blocks.begin() + static_cast<std::ptrdiff_t>(std::min(top, blocks.size())));
  int64_t rest = 0;
  for (size_t i = rows.size(); i < blocks.size(); ++i) rest += blocks[i].bytes;
  if (summary.oom) rows.push_back({0, summary.oom->requested_bytes, "requested, failed" + (summary.oom->name.empty() ? "" : ": " + summary.oom->name)});
  int64_t largest = 1;
  for (const auto& row : rows) largest = std::max(largest, row.bytes);

  constexpr double kWidth = 720.0, kRow = 22.0, kTop = 40.0, kLabel = 90.0, kBarMax = 330.0;
  const double height = kTop + kRow * static_cast<double>(rows.size() + 1) + 16.0;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"12\" y=\"22\" font-size=\"14\" font-weight=\"bold\">{2}</text>\n",
      kWidth, height, xml_escape(title));
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    const bool failed = summary.oom && i + 1 == rows.size();
    const double y = kTop + kRow * static_cast<double>(i);
    const double width = std::max(1.0, kBarMax * static_cast<double>(row.bytes) / static_cast<double>(largest));
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", kLabel - 6.0, y + 14.0,
                       xml_escape(format_bytes(static_cast<double>(row.bytes))));
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"{}/>\n", kLabel, y + 3.0, width, kRow - 6.0,
                       failed ? "none" : series_color(row.name.empty() ? 7 : 0),
                       failed ? " stroke=\"#d62728\" stroke-width=\"2\" stroke-dasharray=\"4 3\"" : "");
    svg += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", kLabel + width + 6.0, y + 14.0,
                       xml_escape(row.name.empty() ? "(no predicted tensor of this size)" : row.name));
  }
  const double y = kTop + kRow * static_cast<double>(rows.size()) + 14.0;
  svg += fmt::format("<text x=\"12\" y=\"{}\" fill=\"#555\">{}</text>\n</svg>\n", y,
                     xml_escape(fmt::format("{} live allocation(s) at the {}{}", blocks.size(), summary.oom ? "OOM" : "peak",
                                            rest > 0 ? ", the rest " + format_bytes(static_cast<double>(rest)) : "")));
  return svg;
}

}  // namespace harness::analysis
