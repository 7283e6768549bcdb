#pragma once
// Byte sizes, parsed and printed in one place: `--memory-limit 96GiB`, spec quantities
// ("fused.bwd_peak_bytes < 5GiB"), `explain-oom --bytes 16GiB`, the sizes in allocator OOM
// messages and every table that prints a size. Torch-free.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace harness {

//! How unit names are matched. CLI arguments and allocator messages are read case-insensitively
//! ("96gib", "15.09 GIB"); verdict rules keep exact case, where "ms" and "MS" could be confused.
enum class UnitCase { kInsensitive, kExact };

//! Bytes in one `unit`: B, byte, bytes, KiB, MiB, GiB, TiB (binary), KB, kB, MB, GB, TB (decimal).
//! nullopt for any other name.
std::optional<double> byte_unit_scale(std::string_view unit, UnitCase unit_case = UnitCase::kInsensitive);

//! The units byte_unit_scale knows, for messages: "B, KiB, MiB, GiB, TiB, KB, MB, GB, TB".
std::string_view byte_unit_list();

//! "96GiB", "512 MiB", "1.5gb", "17179869184", "3e9" -> bytes (rounded to the nearest byte).
//! nullopt for an empty text, a missing or unknown unit after a number, a negative, non-finite or
//! trailing-garbage value, or a size past INT64_MAX bytes.
std::optional<int64_t> parse_byte_size(std::string_view text, UnitCase unit_case = UnitCase::kInsensitive);

//! "1.50 GiB", "812 KiB", "17 B": three significant digits, binary units (tables, summaries).
std::string format_bytes(double bytes);
//! "16.00 GiB", "1.25 MiB", "17 B": two decimals, as PyTorch's OOM messages print sizes.
std::string format_bytes_as_pytorch(int64_t bytes);

}  // namespace harness
