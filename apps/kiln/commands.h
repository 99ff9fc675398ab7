// Sub-commands of the `kiln` executable. Each register_* adds one CLI11 sub-command
// whose callback does the work (and throws kiln::Error on bad input).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>

namespace kiln::app {

/// Bytes in a GiB, and bytes as GiB: the unit kiln memplan and kiln plan print.
inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
inline double gib(int64_t bytes) { return static_cast<double>(bytes) / kGiB; }

void register_prepare(CLI::App& app);  // kiln prepare: text -> token shards
void register_train(CLI::App& app);    // kiln train CONFIG.toml
void register_sample(CLI::App& app);   // kiln sample --checkpoint DIR
void register_export(CLI::App& app);   // kiln export --checkpoint DIR --format F --out FILE
void register_unigram(CLI::App& app);  // kiln unigram --data DIR
void register_bench(CLI::App& app);    // kiln bench CONFIG.toml | kiln bench --peak
void register_report(CLI::App& app);   // kiln report RUN_DIR
void register_memplan(CLI::App& app);  // kiln memplan CONFIG.toml --world-size N
void register_plan(CLI::App& app);     // kiln plan CONFIG.toml --world-size N --device-memory GiB
void register_pp_schedule(CLI::App& app);  // kiln pp-schedule --pp P --micro-batches M
void register_classify(CLI::App& app);  // kiln classify --checkpoint DIR --data DIR
void register_sample_images(CLI::App& app);  // kiln sample-images --checkpoint DIR --out FILE.png
void register_eval(CLI::App& app);     // kiln eval --model DIR [--data DIR] [--mc FILE]
void register_score_scenes(CLI::App& app);  // kiln score-scenes --model DIR --classifier DIR --scenes FILE
void register_scenes(CLI::App& app);   // kiln scenes --out DIR: LLaVA pairs of Fashion-MNIST scenes

}  // namespace kiln::app
