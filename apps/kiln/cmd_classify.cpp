// kiln classify: an image classifier's accuracy over a split of an image data set, per
// class, with the confusion matrix.
#include "apps/kiln/commands.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/file_util.h"
#include "core/error.h"
#include "data/image_dataset.h"
#include "models/registry.h"
#include "train/device.h"
#include "model_io/model_io.h"
#include "train/train_data.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>
#include <vector>

namespace kiln::app {

namespace {

// A kiln classify --json file, checked: per_class entries with images and an accuracy in
// [0, 1]. Throws kiln::Error naming the file.
nlohmann::json read_classify_json(const std::string& path) {
  nlohmann::json ref;
  try {
    ref = nlohmann::json::parse(checkpoint::detail::read_file(path));
    for (const auto& c : ref.at("per_class")) {
      const double acc = c.at("accuracy").get<double>();
      KILN_CHECK(acc >= 0.0 && acc <= 1.0 && c.at("images").get<int64_t>() >= 0,
                 "an accuracy outside [0, 1]");
    }
    KILN_CHECK(!ref["per_class"].empty(), "no classes");
  } catch (const std::exception& e) {
    KILN_FAIL("{}: not a kiln classify --json file ({})", path, e.what());
  }
  return ref;
}

// Each class's accuracy in `now` over its accuracy in `ref` (read from `path`; classes
// with images and a non-zero accuracy in both), and the smallest such ratio, stored in
// now too.
void print_relative(nlohmann::json& now, const nlohmann::json& ref, const std::string& path) {
  KILN_CHECK(ref["per_class"].size() == now["per_class"].size(), "{}: {} classes, this model has {}",
             path, ref["per_class"].size(), now["per_class"].size());
  fmt::print("relative to {}:\n{:>5}  {:<16} {:>9} {:>9} {:>7}\n", path, "class", "name", "accuracy",
             "reference", "ratio");
  double worst = std::numeric_limits<double>::infinity();
  for (size_t k = 0; k < now["per_class"].size(); ++k) {
    const auto& c = now["per_class"][k];
    const auto& r = ref["per_class"][k];
    if (c["images"].get<int64_t>() == 0 || r["images"].get<int64_t>() == 0) continue;
    const double acc = c["accuracy"], racc = r["accuracy"];
    if (racc <= 0) {
      fmt::print("{:>5}  {:<16} {:>8.2f}% {:>8.2f}% {:>7}\n", k, c["name"].get<std::string>(),
                 100 * acc, 100 * racc, "n/a");
      continue;
    }
    const double ratio = acc / racc;
    worst = std::min(worst, ratio);
    now["per_class"][k]["ratio"] = ratio;
    fmt::print("{:>5}  {:<16} {:>8.2f}% {:>8.2f}% {:>7.3f}\n", k, c["name"].get<std::string>(),
               100 * acc, 100 * racc, ratio);
  }
  now["min_ratio"] = worst;
  fmt::print("smallest ratio {:.3f}\n", worst);
}

}  // namespace

void register_classify(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "classify", "An image classifier's top-1 accuracy over a split, per class");
  struct Args {
    std::string checkpoint, data, split = "val", device = "cpu", json, relative_to;
    int batch = 250;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--checkpoint", a->checkpoint, "A checkpoint directory (ckpt/step_XXXXXXXX)")
      ->required();
  cmd->add_option("--data", a->data, "An image data set (kiln prepare --format idx|imagefolder)")
      ->required();
  cmd->add_option("--split", a->split, "The split to score")->check(CLI::IsMember({"train", "val"}));
  cmd->add_option("--device", a->device, "Where to run (as train.device): cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--batch", a->batch, "Images per forward pass")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--json", a->json, "Also write the figures to this JSON file");
  cmd->add_option("--relative-to", a->relative_to,
                  "A --json file of another run (e.g. on real test images): also print each "
                  "class's accuracy as a ratio of that file's, and the smallest ratio");
  cmd->callback([a] {
    const nlohmann::json reference =
        a->relative_to.empty() ? nlohmann::json() : read_classify_json(a->relative_to);
    const data::ImageDatasetMeta meta = data::read_image_meta(a->data);
    KILN_CHECK(meta.splits.count(a->split), "{}: no {} split", a->data, a->split);
    checkpoint::CheckpointReader reader(a->checkpoint);
    auto backend = make_device_backend(a->device);
    const auto model = make_model(checkpoint_model_options(reader), *backend);
    load_model_from_checkpoint(reader, *model, nullptr);
    ImageClassifier& classifier = as_image_classifier(*model, a->checkpoint);
    const int K = classifier.num_classes();
    KILN_CHECK(K == meta.classes, "{} classifies {} classes, {} has {}", a->checkpoint, K,
               a->data, meta.classes);
    const auto source = open_train_data(a->data, a->split, 0, 0, /*shuffle=*/false);
    const int64_t n = source->samples_per_epoch();
    std::vector<std::vector<int64_t>> confusion(K, std::vector<int64_t>(K, 0));
    // Buffers for the largest batch, allocated once; a shorter last batch uses their front.
    Backend& be = *backend;
    const int B_max = static_cast<int>(std::min<int64_t>(a->batch, n));
    const Shape image = classifier.image_shape();
    const Tensor images_buf = be.empty(batched(B_max, image), DType::F32, MemCategory::Activations);
    const Tensor logits_buf = be.empty(Shape{B_max, K}, DType::F32, MemCategory::Activations);
    std::vector<float> pixels(static_cast<size_t>(B_max * image.numel())),
        host(static_cast<size_t>(B_max) * K);
    std::vector<int32_t> labels(static_cast<size_t>(B_max));
    for (int64_t done = 0; done < n;) {
      const int B = static_cast<int>(std::min<int64_t>(B_max, n - done));
      source->next_batch(pixels.data(), labels.data(), B, 0, 1);
      const Tensor images = images_buf.view_at(0, batched(B, image));
      const Tensor logits = logits_buf.view_at(0, Shape{B, K});
      be.copy_from_host(be.default_stream(), images, pixels.data());
      classifier.classify(images, logits);
      be.copy_to_host(be.default_stream(), host.data(), logits);
      be.synchronize(be.default_stream());
      for (int b = 0; b < B; ++b) {
        const float* row = host.data() + static_cast<size_t>(b) * K;
        ++confusion[labels[b]][std::max_element(row, row + K) - row];
      }
      done += B;
    }
    nlohmann::json out = {{"checkpoint", a->checkpoint}, {"data", a->data}, {"split", a->split},
                          {"images", n}, {"confusion", confusion}};
    int64_t correct = 0;
    fmt::print("kiln classify: {} images of {} ({} split)\n", n, a->data, a->split);
    fmt::print("{:>5}  {:<16} {:>7} {:>9}\n", "class", "name", "images", "accuracy");
    for (int k = 0; k < K; ++k) {
      int64_t total = 0;
      for (int64_t c : confusion[k]) total += c;
      correct += confusion[k][k];
      const double acc = total ? static_cast<double>(confusion[k][k]) / total : 0.0;
      const std::string name = k < static_cast<int>(meta.class_names.size()) ? meta.class_names[k] : "";
      out["per_class"].push_back({{"class", k}, {"name", name}, {"images", total}, {"accuracy", acc}});
      fmt::print("{:>5}  {:<16} {:>7} {:>8.2f}%\n", k, name, total, 100.0 * acc);
    }
    out["accuracy"] = n ? static_cast<double>(correct) / n : 0.0;
    fmt::print("top-1 accuracy {:.2f}% ({} of {})\n", 100.0 * out["accuracy"].get<double>(),
               correct, n);
    if (!a->relative_to.empty()) print_relative(out, reference, a->relative_to);
    if (!a->json.empty()) checkpoint::detail::atomic_write_file(a->json, out.dump(1) + "\n");
  });
}

}  // namespace kiln::app
