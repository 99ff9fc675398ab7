#include "train/background_save.h"

#include <chrono>
#include <exception>

namespace kiln {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

BackgroundSave::BackgroundSave(SaveContents contents) : contents_(std::move(contents)) {
  thread_ = std::thread([this] {
    const auto t0 = Clock::now();
    try {
      contents_.writer->write_rank_files();
    } catch (const std::exception& e) {
      error_ = e.what();
      if (error_.empty()) error_ = "unknown error";
    }
    write_s_ = since(t0);
    finished_.store(true, std::memory_order_release);
  });
}

BackgroundSave::~BackgroundSave() {
  if (thread_.joinable()) thread_.join();
}

double BackgroundSave::wait() {
  const auto t0 = Clock::now();
  if (thread_.joinable()) thread_.join();
  return since(t0);
}

}  // namespace kiln
