// The PyTorch training goldens of models/train_variants (tests/): each model's loss, the parameters
// its loss does not reach, its golden batch and the losses and gradient norms of its 8 AdamW steps
// (golden/trajectory.json), as the CPU trajectory test and the CUDA provider's tests read them.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "onnx_ext/onnx_io.h"
#include "runtime/inference_session.h"
#include "trainer/training_graph.h"

namespace cleave::testing {

// Every number after "key": in the JSON text, in order.
inline std::vector<double> JsonNumbers(const std::string& text, const std::string& key) {
  std::vector<double> out;
  std::regex re("\"" + key + "\": (-?[0-9.eE+-]+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back(std::stod((*it)[1].str()));
  return out;
}

struct VariantGolden {
  std::string dir;                       // models/train_variants/<name>/
  trainer::TrainingSpec spec;            // the run's loss, dims (batch 2, seq 16) and AdamW settings
  std::vector<std::string> unreached;    // sorted by name
  Feeds feeds;                           // the golden batch, in file order
  std::vector<double> losses, norms;     // per step
};

// models/train_variants/<name>'s golden run; failures are reported as test failures.
inline VariantGolden LoadVariantGolden(const std::string& source_dir, const std::string& name) {
  VariantGolden g;
  g.dir = source_dir + "/models/train_variants/" + name + "/";
  std::ifstream f(g.dir + "golden/trajectory.json", std::ios::binary);
  const std::string traj((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(traj.empty()) << g.dir;
  std::smatch m;
  const bool has_loss = std::regex_search(traj, m, std::regex("\"loss\": \"([a-z_]+)\""));
  EXPECT_TRUE(has_loss) << name;
  g.spec.loss.kind = has_loss && m[1] == "mse" ? trainer::LossKind::kMse : trainer::LossKind::kCrossEntropy;
  const bool has_output = std::regex_search(traj, m, std::regex("\"output\": \"([a-z_]+)\""));
  EXPECT_TRUE(has_output) << name;
  if (has_output) g.spec.loss.output = m[1];
  g.spec.dims = {{"batch", 2}, {"seq", 16}};
  g.spec.optimizer.weight_decay = 0.1f;
  g.spec.optimizer.max_grad_norm = 1.0f;
  const size_t at = traj.find("\"unreached\"");
  if (at != std::string::npos) {
    const std::regex quoted("\"([^\"]+)\"");
    for (auto it = std::sregex_iterator(traj.begin() + at, traj.begin() + traj.find(']', at), quoted);
         it != std::sregex_iterator(); ++it)
      if ((*it)[1] != "unreached") g.unreached.push_back((*it)[1]);
  }
  std::sort(g.unreached.begin(), g.unreached.end());
  for (const auto& e : std::filesystem::directory_iterator(g.dir + "golden/inputs")) {
    auto t = onnx_ext::LoadTensorFile(e.path().string());
    EXPECT_TRUE(t.ok()) << t.status();
    if (t.ok()) g.feeds.push_back(*t);
  }
  g.losses = JsonNumbers(traj, "loss");
  g.norms = JsonNumbers(traj, "grad_norm");
  return g;
}

// `feeds` in the order of `names` (TrainStep takes the data inputs in the artifacts' order).
inline Feeds InOrder(const Feeds& feeds, const std::vector<std::string>& names) {
  Feeds ordered;
  for (const std::string& name : names)
    for (const auto& f : feeds)
      if (f.first == name) ordered.push_back(f);
  EXPECT_EQ(ordered.size(), feeds.size());
  return ordered;
}

}  // namespace cleave::testing
