// Training metrics: one JSON object per logged step in RUN_DIR/metrics.jsonl (its records
// and the console's progress line: train/metrics_record.h), and durations as people read
// them.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace kiln {

class MetricsLog {
 public:
  /// Opens RUN_DIR/metrics.jsonl for appending. When resuming at `resume_step` > 0,
  /// records of later steps (written by the interrupted run after its checkpoint) are
  /// dropped first, so the file reads as one continuous run. Throws kiln::Error when
  /// the file cannot be written.
  MetricsLog(const std::filesystem::path& run_dir, int64_t resume_step);
  /// Appends one record (flushed at once, so a crash loses nothing already logged);
  /// invalid UTF-8 in its strings is written as U+FFFD.
  void write(const nlohmann::json& record);

 private:
  std::filesystem::path path_;
  std::ofstream out_;
};

/// "12.3s", "4m05s", "1h02m".
std::string format_duration(double seconds);

}  // namespace kiln
