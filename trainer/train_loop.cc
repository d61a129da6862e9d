// The `cleave train` loop (trainer/): see train_loop.h.
#include "trainer/train_loop.h"


#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <thread>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "onnx_ext/onnx_io.h"
#include "runtime/profiler.h"
#include "trainer/checkpoint.h"
#include "trainer/partition_plan.h"
#include "trainer/training_session.h"

namespace cleave::trainer {

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The model's token input: its only non-parameter input, integer, [batch, seq].
}  // namespace

absl::StatusOr<const graph::Value*> TokenInput(const graph::Graph& g, const std::string& path) {
  std::vector<const graph::Value*> data;
  for (const graph::Value* v : g.inputs())
    if (!v->is_initializer()) data.push_back(v);
  if (data.size() != 1) {
    std::vector<std::string> names;
    for (const auto* v : data) names.push_back(v->name());
    return InvalidArgument(path, ": `cleave train` trains models with one token input [batch, seq]; this model has ",
                           data.size(), " inputs (", absl::StrJoin(names, ", "),
                           "); use the TrainingSession API for other models");
  }
  const graph::Value* v = data[0];
  if ((v->dtype() != DataType::kInt64 && v->dtype() != DataType::kInt32) || !v->shape().has_rank() ||
      v->shape().rank() != 2)
    return InvalidArgument(path, ": input '", v->name(), "' is ", DataTypeName(v->dtype()), v->shape().ToString(),
                           ", expected int64 or int32 [batch, seq] token ids");
  return v;
}

absl::Status FixTokenDims(const graph::Value& in, int64_t micro, int64_t seq, std::map<std::string, int64_t>* dims) {
  const int64_t want[2] = {micro, seq};
  const char* what[2] = {"batch (--batch / --grad-accum)", "sequence (--seq)"};
  for (int k = 0; k < 2; ++k) {
    const Dim& d = in.shape()[k];
    if (d.is_static()) {
      if (d.value != want[k])
        return InvalidArgument("input '", in.name(), "' has fixed ", what[k], " dim ", d.value, ", but the run asks for ",
                               want[k]);
    } else if (!d.symbol.empty()) {
      auto [it, fresh] = dims->emplace(d.symbol, want[k]);
      if (!fresh && it->second != want[k])
        return InvalidArgument("input '", in.name(), "' uses dim '", d.symbol, "' for both batch and sequence");
    } else {
      return InvalidArgument("input '", in.name(), "' has an unnamed dynamic dim ", k, "; name it in the export");
    }
  }
  return absl::OkStatus();
}

namespace {

// Rows [row0, row0 + rows) of step `step`'s global batch: inputs and labels.
struct Batch {
  Tensor inputs, labels;
};

void FillBatch(const std::vector<uint16_t>& tokens, bool shuffle, uint64_t seed, int64_t first_index, int64_t rows,
               int64_t seq, DataType id_type, LossKind loss, int64_t vocab, Batch* b) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = WindowOffset(shuffle, seed, first_index + r, seq, len);
    for (int64_t t = 0; t < seq; ++t) {
      const int64_t x = tokens[o + t], y = tokens[o + t + 1];
      if (id_type == DataType::kInt64) b->inputs.data<int64_t>()[r * seq + t] = x;
      else b->inputs.data<int32_t>()[r * seq + t] = static_cast<int32_t>(x);
      if (loss == LossKind::kMse) {
        float* row = b->labels.data<float>() + (r * seq + t) * vocab;
        std::fill(row, row + vocab, 0.0f);
        row[y] = 1.0f;
      } else {
        b->labels.data<int64_t>()[r * seq + t] = y;
      }
    }
  }
}

// Opens the JSONL metrics file, creating its folder; a resumed run appends.
absl::Status OpenMetrics(const std::string& path, bool append, std::ofstream* out) {
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  out->open(path, append ? std::ios::app : std::ios::trunc);
  if (!*out) return InvalidArgument("cannot write --metrics file '", path, "'");
  return absl::OkStatus();
}

// Whether step `step` (1-based) evaluates on the validation split.
bool EvalDue(const TrainConfig& c, int64_t step, bool last) {
  return last || (c.eval_every > 0 && step % c.eval_every == 0);
}

// Loss scaling's part of a progress line and of a metrics object; empty without scaling.
std::string LossScaleText(const TrainingSession& s, double used, bool skipped) {
  if (!s.loss_scaling()) return "";
  return absl::StrFormat(" | loss scale %g%s", used,
                         skipped ? absl::StrFormat(" (gradient overflow: update skipped, scale now %g)", s.loss_scale())
                                 : "");
}
std::string LossScaleJson(const TrainingSession& s, double used, bool skipped) {
  if (!s.loss_scaling()) return "";
  return absl::StrFormat(", \"loss_scale\": %.17g, \"skipped\": %s", used, skipped ? "true" : "false");
}

absl::Status CheckVocab(const std::vector<uint16_t>& tokens, int64_t offset, int64_t vocab, const std::string& path) {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] >= vocab)
      return InvalidArgument(path, ": token ", tokens[i], " at position ", offset + static_cast<int64_t>(i),
                             " is outside the model's vocabulary of ", vocab, " (logits last dim)");
  return absl::OkStatus();
}

std::string DefaultPlotPath(const TrainConfig& c) {
  if (!c.plot.empty()) return c.plot;
  if (!c.metrics.empty()) return std::filesystem::path(c.metrics).replace_extension(".png").string();
  if (!c.checkpoint_dir.empty()) return c.checkpoint_dir + "/loss.png";
  return "train_loss.png";
}

// Draws the loss curve with gnuplot. A missing gnuplot is a warning, not an error.
std::string WritePlot(const std::string& png, const std::vector<std::pair<int64_t, double>>& train,
                      const std::vector<std::pair<int64_t, double>>& val, std::ostream& log) {
  const std::string dat = png + ".dat";
  {
    std::ofstream f(dat);
    f << "# step train_loss\n";
    for (auto [s, l] : train) f << s << " " << absl::StrFormat("%.9g", l) << "\n";
    f << "\n\n# step val_loss\n";
    for (auto [s, l] : val) f << s << " " << absl::StrFormat("%.9g", l) << "\n";
  }
  std::string plot = absl::StrCat("plot '", dat, "' index 0 with lines lw 2 title 'train'");
  if (!val.empty()) absl::StrAppend(&plot, ", '", dat, "' index 1 with linespoints lw 2 title 'validation'");
  const std::string cmd = absl::StrCat(
      "gnuplot -e \"set terminal pngcairo size 900,540; set output '", png,
      "'; set xlabel 'step'; set ylabel 'loss'; set grid; set title 'cleave train: loss'; ", plot,
      "\" 2>&1");
  int rc = std::system(cmd.c_str());
  std::remove(dat.c_str());
  if (rc != 0) {
    log << "warning: could not draw the loss curve (gnuplot exit " << rc << "); is gnuplot installed?\n";
    return "";
  }
  return png;
}

// What both training loops keep of a finished step and write about it: its loss and gradient
// norm (in the result and the loss curve), the validation loss when one is due, and the parts
// of the progress line and the metrics object that every run shares.
class StepRecorder {
 public:
  // `has_val`: the run has a validation split.
  StepRecorder(const TrainConfig& c, bool has_val, TrainResult& result) : c_(c), has_val_(has_val), result_(result) {}

  // Records step `step` (1-based) and evaluates when the run has a validation split and it is
  // due; returns the validation loss, or -1 when none was taken.
  absl::StatusOr<double> Record(int64_t step, double loss, float norm, bool last,
                                absl::FunctionRef<absl::StatusOr<double>()> evaluate) {
    result_.losses.push_back(loss);
    result_.grad_norms.push_back(norm);
    curve_.emplace_back(step, loss);
    if (!has_val_ || !EvalDue(c_, step, last)) return -1.0;
    ASSIGN_OR_RETURN(const double val, evaluate());
    result_.val_loss = val;
    val_curve_.emplace_back(step, val);
    return val;
  }

  // Whether step `step` prints a progress line (every log_every steps, the last, and those
  // that evaluated).
  bool Logs(int64_t step, bool last, double val) const {
    return c_.log_every > 0 && (step % c_.log_every == 0 || last || val >= 0);
  }
  std::string ProgressHead(int64_t step, double loss, double lr, float norm, double ms, double tps) const {
    return absl::StrFormat("step %*d/%d | loss %.4f | lr %.3e | grad norm %.3f | %.1f ms/step | %.0f tok/s",
                           static_cast<int>(std::to_string(c_.steps).size()), step, c_.steps, loss, lr, norm, ms, tps);
  }
  static std::string ProgressTail(const TrainingSession& s, double scale_used, bool skipped, double val) {
    return absl::StrCat(LossScaleText(s, scale_used, skipped), val >= 0 ? absl::StrFormat(" | val loss %.4f", val) : "",
                        "\n");
  }
  static std::string MetricsTail(const TrainingSession& s, double scale_used, bool skipped, double val) {
    return absl::StrCat(LossScaleJson(s, scale_used, skipped),
                        val >= 0 ? absl::StrFormat(", \"val_loss\": %.9g", val) : "", "}\n");
  }

  // Draws the loss curve, when there is one and plotting is on.
  void Plot(std::ostream& log) {
    if (curve_.empty() || c_.plot == "none") return;
    result_.plot = WritePlot(DefaultPlotPath(c_), curve_, val_curve_, log);
    if (!result_.plot.empty()) log << "loss curve: " << result_.plot << "\n";
  }

 private:
  const TrainConfig& c_;
  const bool has_val_;
  TrainResult& result_;
  std::vector<std::pair<int64_t, double>> curve_, val_curve_;
};

}  // namespace

absl::StatusOr<TokenData> LoadTokens(const std::string& path, double val_fraction, int64_t seq) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound("cannot open data file '", path, "'");
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  TokenData d;
  std::vector<uint16_t> all;
  if (path.size() > 4 && path.substr(path.size() - 4) == ".bin") {
    if (bytes.size() % 2 != 0)
      return InvalidArgument("data file '", path, "' has ", bytes.size(),
                             " bytes; a .bin token file holds little-endian uint16 tokens (an even size)");
    all.resize(bytes.size() / 2);
    for (size_t i = 0; i < all.size(); ++i)
      all[i] = static_cast<uint16_t>(static_cast<unsigned char>(bytes[2 * i]) |
                                     (static_cast<unsigned char>(bytes[2 * i + 1]) << 8));
    d.vocab_hint = 65536;
  } else {
    all.assign(bytes.begin(), bytes.end());
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<unsigned char>(bytes[i]);
  }
  if (val_fraction < 0 || val_fraction >= 1)
    return InvalidArgument("--val-fraction must be in [0, 1), got ", val_fraction);
  const int64_t n = static_cast<int64_t>(all.size());
  const int64_t nval = static_cast<int64_t>(std::floor(static_cast<double>(n) * val_fraction));
  const int64_t window = seq + 2;
  if (n - nval < window)
    return InvalidArgument("data file '", path, "' has ", n, " tokens", nval ? absl::StrCat(" (", n - nval, " for training)") : "",
                           ", shorter than one training window of ", window, " tokens (seq + 2)");
  if (nval > 0 && nval < window)
    return InvalidArgument("the validation split of '", path, "' has ", nval, " tokens (--val-fraction ", val_fraction,
                           "), shorter than one window of ", window, " tokens; raise it or use --val-fraction 0");
  d.train.assign(all.begin(), all.end() - nval);
  d.val.assign(all.end() - nval, all.end());
  return d;
}

int64_t WindowOffset(bool shuffle, uint64_t seed, int64_t index, int64_t seq, int64_t len) {
  const uint64_t range = static_cast<uint64_t>(len - seq - 1);
  if (!shuffle) return static_cast<int64_t>((static_cast<uint64_t>(index) * static_cast<uint64_t>(seq)) % range);
  return static_cast<int64_t>(SplitMix64(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(index)) % range);
}

bool IsPlanDirectory(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec) && std::filesystem::exists(std::filesystem::path(path) / "plan.json", ec);
}

namespace {

std::string RankFile(const std::string& path, int rank, int world) {
  if (world == 1 || path.empty()) return path;
  std::filesystem::path p(path);
  return (p.parent_path() / (p.stem().string() + ".rank" + std::to_string(rank) + p.extension().string())).string();
}

// --profile: records steps [from, to) of a run that starts at `start` (two warm-up steps
// first, when the run has them) and writes the trace after the last of them.
class StepProfile {
 public:
  StepProfile(const TrainConfig& c, int rank, int world, int64_t start, TrainingSession& session) {
    if (c.profile.empty()) return;
    path_ = RankFile(c.profile, rank, world);
    profiler_ = std::make_unique<runtime::Profiler>(world > 1 ? absl::StrCat("rank ", rank) : "cleave train", rank);
    profiler_->set_enabled(false);
    const int64_t end = c.exit_at > 0 ? std::min(c.steps, c.exit_at) : c.steps;
    from_ = start + std::min<int64_t>(2, std::max<int64_t>(0, end - start - 1));
    to_ = std::min(end, from_ + std::max<int64_t>(1, c.profile_steps));
    session.set_profiler(profiler_.get());
    // A trace that cannot be written is an error before the first step, not after the run.
    const std::string probe = path_ + ".tmp";
    if (!std::ofstream(probe, std::ios::app)) {
      status_ = absl::PermissionDeniedError(absl::StrCat("cannot write the profile '", probe, "'"));
    } else {
      std::remove(probe.c_str());
    }
  }
  const absl::Status& status() const { return status_; }
  void Before(int64_t step) {
    if (profiler_) profiler_->set_enabled(step >= from_ && step < to_);
  }
  absl::Status After(int64_t step, bool last, bool report, std::ostream& log) {
    if (!profiler_ || written_ || (step + 1 < to_ && !last)) return absl::OkStatus();
    profiler_->set_enabled(false);
    written_ = true;
    RETURN_IF_ERROR(profiler_->WriteChromeTrace(path_));
    if (report)
      log << "profile of steps " << from_ + 1 << "-" << std::min(to_, step + 1) << ": " << path_ << "\n"
          << profiler_->Summary();
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<runtime::Profiler> profiler_;
  std::string path_;
  absl::Status status_;
  int64_t from_ = 0, to_ = 0;
  bool written_ = false;
};

}  // namespace

absl::StatusOr<TrainResult> RunTraining(const TrainConfig& c, std::ostream& log) {
  if (IsPlanDirectory(c.model)) return RunPlanTraining(c, log);
  if (c.batch < 1 || c.seq < 1 || c.steps < 1 || c.grad_accum < 1)
    return InvalidArgument("--batch, --seq, --steps and --grad-accum must be >= 1");
  if (c.batch % c.grad_accum != 0)
    return InvalidArgument("--batch ", c.batch, " (the global batch) is not divisible by --grad-accum ", c.grad_accum);
  if (c.lr <= 0) return InvalidArgument("--lr must be > 0, got ", c.lr);
  if (c.resume && c.checkpoint_dir.empty()) return InvalidArgument("--resume needs --checkpoint-dir");
  const int64_t micro = c.batch / c.grad_accum;

  ASSIGN_OR_RETURN(std::unique_ptr<graph::Graph> model, onnx_ext::LoadModel(c.model));
  ASSIGN_OR_RETURN(const graph::Value* token_in, TokenInput(*model, c.model));
  const std::string input_name = token_in->name();
  const DataType id_type = token_in->dtype();
  TrainingSpec spec;
  spec.loss.kind = c.loss;
  spec.optimizer = c.optimizer;
  spec.frozen = c.frozen;
  spec.recompute = c.recompute;
  // The device is resolved before the graph is built: whether attention fuses by default
  // depends on it, --device auto included. A provider the launcher made is used as it is.
  std::shared_ptr<providers::ExecutionProvider> device = c.device_provider;
  if (!device && c.device != DeviceChoice::kCpu) {
    std::string warning;
    ASSIGN_OR_RETURN(device, InferenceSession::MakeDeviceProvider(c.device, 0, &warning));
    if (!warning.empty()) std::fprintf(stderr, "cleave: warning: %s\n", warning.c_str());
  }
  spec.fuse_attention = c.fuse_attention.value_or(FusesAttentionByDefault(device != nullptr, c.precision));
  spec.precision = c.precision;
  RETURN_IF_ERROR(FixTokenDims(*token_in, micro, c.seq, &spec.dims));
  auto built = BuildTrainingArtifacts(*model, spec);
  if (!built.ok())
    return absl::Status(built.status().code(), absl::StrCat(c.model, ": ", built.status().message()));
  TrainingArtifacts artifacts = std::move(*built);
  // The vocabulary: the logits' last dim.
  const graph::Value* logits = artifacts.eval->outputs().size() > 1 ? artifacts.eval->outputs()[1] : nullptr;
  if (!logits || !logits->shape().is_static() || logits->shape().rank() != 3)
    return InvalidArgument(c.model, ": expected the first output to be logits [batch, seq, vocab], got ",
                           logits ? logits->shape().ToString() : "none");
  const int64_t vocab = logits->shape()[2].value;
  if (!c.artifacts_dir.empty()) RETURN_IF_ERROR(SaveArtifacts(artifacts, c.artifacts_dir));

  ASSIGN_OR_RETURN(TokenData data, LoadTokens(c.data, c.val_fraction, c.seq));
  RETURN_IF_ERROR(CheckVocab(data.train, 0, vocab, c.data));
  RETURN_IF_ERROR(CheckVocab(data.val, static_cast<int64_t>(data.train.size()), vocab, c.data));

  TrainingSessionOptions so;
  so.device = device ? c.device : DeviceChoice::kCpu;
  so.device_provider = device;
  so.intra_op_threads = c.threads;
  so.seed = c.seed;
  so.initial_loss_scale = c.loss_scale;
  so.loss_scale_growth_interval = c.loss_scale_window;
  ASSIGN_OR_RETURN(auto session, TrainingSession::Create(std::move(artifacts), so));
  LrSchedule schedule;
  schedule.kind = c.schedule;
  schedule.peak = c.lr;
  schedule.min_lr = c.min_lr >= 0 ? c.min_lr : c.lr / 10;
  schedule.warmup = c.warmup;
  schedule.total = c.steps;
  session->RegisterScheduler(schedule);

  // Resume: the newest checkpoint; its run settings must match this run's.
  TrainResult result;
  int64_t start = 0;
  const std::string signature = absl::StrCat("batch=", c.batch, " seq=", c.seq, " grad_accum=", c.grad_accum,
                                             " shuffle=", c.shuffle, " seed=", c.seed, " data=", data.train.size());
  if (!c.checkpoint_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(c.checkpoint_dir, ec);
    if (ec) return InvalidArgument("cannot create --checkpoint-dir '", c.checkpoint_dir, "': ", ec.message());
  }
  if (c.resume) {
    std::vector<std::string> ckpts = ListCheckpoints(c.checkpoint_dir);
    if (ckpts.empty()) return NotFound("--resume: no checkpoint (step_*.ckpt) in '", c.checkpoint_dir, "'");
    ASSIGN_OR_RETURN(auto props, session->LoadCheckpoint(ckpts.back()));
    if (props["run"] != signature)
      return InvalidArgument("--resume: checkpoint '", ckpts.back(), "' was written by a run with ", props["run"],
                             "; this run has ", signature);
    start = session->step();
    log << "resumed from " << ckpts.back() << " at step " << start << "\n";
  }
  result.first_step = start;

  std::ofstream metrics;
  if (!c.metrics.empty()) RETURN_IF_ERROR(OpenMetrics(c.metrics, c.resume, &metrics));
  Batch b{Tensor(id_type, {micro, c.seq}),
          c.loss == LossKind::kMse ? Tensor(DataType::kFloat32, {micro, c.seq, vocab})
                                   : Tensor(DataType::kInt64, {micro, c.seq})};
  const std::string labels_name = spec.loss.labels;
  auto evaluate = [&]() -> absl::StatusOr<double> {
    double sum = 0;
    for (int64_t k = 0; k < c.eval_batches; ++k) {
      FillBatch(data.val, false, 0, k * micro, micro, c.seq, id_type, c.loss, vocab, &b);
      ASSIGN_OR_RETURN(float l, session->EvalStep({{input_name, b.inputs}, {labels_name, b.labels}}));
      sum += l;
    }
    return sum / static_cast<double>(c.eval_batches);
  };
  auto save = [&](int64_t step) -> absl::Status {
    const std::string path = CheckpointPath(c.checkpoint_dir, step);
    RETURN_IF_ERROR(session->SaveCheckpoint(path, {{"run", signature}, {"data.next_step", absl::StrCat(step)}}));
    PruneCheckpoints(c.checkpoint_dir, c.keep_checkpoints);
    log << "saved checkpoint " << path << "\n";
    return absl::OkStatus();
  };

  StepRecorder recorder(c, !data.val.empty(), result);
  const double tokens_per_step = static_cast<double>(c.batch * c.seq);
  StepProfile profile(c, 0, 1, start, *session);
  RETURN_IF_ERROR(profile.status());
  for (int64_t s = start; s < c.steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    profile.Before(s);
    session->LazyResetGrad();
    double loss_sum = 0;
    for (int64_t k = 0; k < c.grad_accum; ++k) {
      FillBatch(data.train, c.shuffle, c.seed, s * c.batch + k * micro, micro, c.seq, id_type, c.loss, vocab, &b);
      Feeds feeds = {{input_name, b.inputs}, {labels_name, b.labels}};
      ASSIGN_OR_RETURN(float l, session->TrainStep(feeds, k + 1 == c.grad_accum));
      if (!std::isfinite(l)) {
        auto where = session->FirstNonFinite(feeds);
        return absl::OutOfRangeError(absl::StrCat("step ", s + 1, ": the loss is ", l, "; first non-finite tensor: ",
                                                  where.ok() ? *where : where.status().ToString(),
                                                  ". Stopped; the last checkpoint is untouched"));
      }
      loss_sum += l;
    }
    const double lr = schedule.At(s);
    const double scale_used = session->loss_scale();
    ASSIGN_OR_RETURN(float norm, session->OptimizerStep());
    const bool skipped = session->last_step_skipped();
    if (!std::isfinite(norm) && !skipped)
      return absl::OutOfRangeError(absl::StrCat("step ", s + 1, ": the gradient norm is ", norm,
                                                "; stopped; the last checkpoint is untouched"));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double loss = loss_sum / static_cast<double>(c.grad_accum);
    const bool last = s + 1 == c.steps || s + 1 == c.exit_at;
    ASSIGN_OR_RETURN(const double val, recorder.Record(s + 1, loss, norm, last, evaluate));
    const double tps = tokens_per_step / (ms / 1000.0);
    if (recorder.Logs(s + 1, last, val))
      log << recorder.ProgressHead(s + 1, loss, lr, norm, ms, tps)
          << StepRecorder::ProgressTail(*session, scale_used, skipped, val) << std::flush;
    if (metrics.is_open()) {
      metrics << absl::StrFormat("{\"step\": %d, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, \"ms\": %.3f, "
                                 "\"tokens_per_s\": %.1f",
                                 s + 1, loss, lr, std::isfinite(norm) ? norm : -1.0f, ms, tps)
              << StepRecorder::MetricsTail(*session, scale_used, skipped, val) << std::flush;
    }
    RETURN_IF_ERROR(profile.After(s, last, true, log));
    if (!c.checkpoint_dir.empty() && (last || (c.checkpoint_every > 0 && (s + 1) % c.checkpoint_every == 0)))
      RETURN_IF_ERROR(save(s + 1));
    if (s + 1 == c.exit_at) break;
  }
  if (!c.save_model.empty()) {
    RETURN_IF_ERROR(session->ExportModelForInferencing(c.save_model));
    log << "saved the trained model to " << c.save_model << "\n";
  }
  recorder.Plot(log);
  return result;
}

namespace {

// "rank:step" from the environment: a fault to inject at that step on that rank (tests).
bool FaultAt(const char* var, int rank, int64_t step) {
  const char* v = std::getenv(var);
  int r = -1;
  int64_t s = -1;
  return v && std::sscanf(v, "%d:%ld", &r, &s) == 2 && r == rank && s == step;
}


}  // namespace

absl::StatusOr<TrainResult> RunPlanTraining(const TrainConfig& c, std::ostream& log) {
  Communicator* comm = c.communicator;
  if (!comm)
    return absl::FailedPreconditionError(absl::StrCat(
        "'", c.model, "' is a plan directory: train it with one process per rank, as in mpirun -np N cleave train ",
        c.model, " --data ..."));
  const int rank = comm->rank(), world = comm->world_size();
  // Checks every rank can make alone come first; then the ranks agree before any step.
  auto run = LoadRankRun(c.model, rank < 0 ? 0 : rank);
  absl::Status local = run.status();
  if (local.ok() && run->mesh.world_size() != world)
    local = InvalidArgument("the plan '", c.model, "' is for mesh ", run->mesh.ToString(), " (", run->mesh.world_size(),
                            " ranks) and this launch has ", world, " (use mpirun -np ", run->mesh.world_size(), ")");
  if (local.ok() && ((c.batch && c.batch != run->batch) || (c.seq && c.seq != run->seq)))
    local = InvalidArgument("the plan was built for --batch ", run->batch, " --seq ", run->seq, ", this run asks for --batch ",
                            c.batch, " --seq ", c.seq, " (partition again to change them)");
  if (local.ok() && c.grad_accum != 1)
    local = InvalidArgument("--grad-accum does not apply to a plan: its micro-batches are set by cleave partition "
                            "--microbatches");
  if (local.ok() && !c.save_model.empty())
    local = Unimplemented("--save-model is not supported for a plan yet (each rank holds a shard)");
  // Every rank learns whether all passed their checks, and whether all run the same plan (the
  // hash's maximum and minimum over the world agree), before any of them goes on: errors found
  // here end every rank the same way (kAllRanksFailed), none waiting on another.
  {
    const int64_t h = local.ok() ? static_cast<int64_t>(run->plan_hash >> 2) : 0;
    Tensor t = Tensor::FromVector<int64_t>({h, -h, local.ok() ? 0 : 1}, {3});
    std::vector<int> everyone(world);
    for (int i = 0; i < world; ++i) everyone[i] = i;
    RETURN_IF_ERROR(comm->AllReduce(t.view(), t.view(), ReduceOp::kMax, everyone));
    absl::Status agreed = local.ok() ? absl::OkStatus()
                                     : absl::Status(local.code(), absl::StrCat("rank ", rank, ": ", local.message()));
    if (agreed.ok() && t.data<int64_t>()[2])
      agreed = absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank, ": another rank failed its start-up checks (see its message); nothing was trained"));
    if (agreed.ok() && t.data<int64_t>()[0] != -t.data<int64_t>()[1])
      agreed = InvalidArgument("rank ", rank, ": the ranks were started with different plans (plan.json differs); "
                               "start every rank with the same plan directory");
    if (!agreed.ok()) {
      agreed.SetPayload(kAllRanksFailed, absl::Cord("1"));
      return agreed;
    }
  }
  RankRun& r = *run;
  const partition::Mesh& mesh = r.mesh;
  const int dp = mesh.size("dp"), micro_n = r.microbatches;
  const int64_t batch = r.batch, seq = r.seq;
  const int64_t rows = batch / micro_n / dp;
  const LossKind loss_kind = r.loss == "mse" ? LossKind::kMse : LossKind::kCrossEntropy;
  const int64_t vocab = r.vocab > 0 ? r.vocab : 256;
  ASSIGN_OR_RETURN(TokenData data, LoadTokens(c.data, c.val_fraction, seq));
  RETURN_IF_ERROR(CheckVocab(data.train, 0, vocab, c.data));
  RETURN_IF_ERROR(CheckVocab(data.val, static_cast<int64_t>(data.train.size()), vocab, c.data));

  std::string input_name, labels_name = "labels";
  DataType id_type = DataType::kInt64;
  for (const std::string& d : r.artifacts.data_inputs)
    if (d != labels_name) input_name = d;
  {
    const graph::Graph* g = r.artifacts.training ? r.artifacts.training.get() : r.artifacts.stages[0].forward.get();
    for (const std::string& d : r.artifacts.data_inputs)
      if (const graph::Value* v = g->FindValue(d); v && d == input_name) id_type = v->dtype();
  }
  const std::vector<TrainingSession::PipelineWork> work = r.work;
  const std::vector<std::string> data_inputs = r.artifacts.data_inputs;
  TrainingSessionOptions so;
  so.device = c.device;
  so.device_provider = c.device_provider;
  so.device_communicator = c.device_communicator;
  so.intra_op_threads = c.threads;
  so.seed = c.seed;
  so.communicator = comm;
  so.initial_loss_scale = c.loss_scale;
  so.loss_scale_growth_interval = c.loss_scale_window;
  for (int i = 0; i < world; ++i) so.overflow_group.push_back(i);
  so.loss_scaling = r.precision == "fp16";
  so.overlap_grad_reduce = c.overlap_grad_reduce;
  so.overlap_collectives = c.overlap_collectives;
  ASSIGN_OR_RETURN(auto session, TrainingSession::Create(std::move(r.artifacts), so));
  LrSchedule schedule;
  schedule.kind = c.schedule;
  schedule.peak = c.lr;
  schedule.min_lr = c.min_lr >= 0 ? c.min_lr : c.lr / 10;
  schedule.warmup = c.warmup;
  schedule.total = c.steps;
  session->RegisterScheduler(schedule);

  std::vector<int> all(world);
  for (int i = 0; i < world; ++i) all[i] = i;
  const std::vector<int> pp_group = mesh.Group(rank, "pp");
  // The loss lives on the last pipeline stage; every rank learns it from there.
  auto share = [&](float value) -> absl::StatusOr<double> {
    if (pp_group.size() == 1) return value;
    Tensor t = Tensor::Scalar<float>(value);
    RETURN_IF_ERROR(comm->Broadcast(t.view(), pp_group.back(), pp_group));
    return *t.data<float>();
  };
  // Micro-batch m of global rows [first, first + batch): this rank's dp slice.
  auto micro_feeds = [&](const std::vector<uint16_t>& tokens, bool shuffle, int64_t first) {
    std::vector<Feeds> out;
    for (int m = 0; m < micro_n; ++m) {
      Batch b{Tensor(id_type, {rows, seq}), loss_kind == LossKind::kMse ? Tensor(DataType::kFloat32, {rows, seq, vocab})
                                                                        : Tensor(DataType::kInt64, {rows, seq})};
      const int64_t row0 = m * (batch / micro_n) + mesh.Coord(rank, "dp") * rows;
      FillBatch(tokens, shuffle, c.seed, first + row0, rows, seq, id_type, loss_kind, vocab, &b);
      Feeds f;
      for (const std::string& d : data_inputs) f.emplace_back(d, d == labels_name ? b.labels : b.inputs);
      out.push_back(std::move(f));
    }
    return out;
  };

  TrainResult result;
  int64_t start = 0;
  // What a resumed run must share with the one that saved (the mesh may differ).
  const std::string signature = absl::StrCat("batch=", batch, " seq=", seq, " shuffle=", c.shuffle, " seed=", c.seed,
                                             " data=", data.train.size());
  const std::string plan_id = absl::StrCat(r.plan_hash);
  const std::map<std::string, std::string> blocks = r.blocks;
  const std::filesystem::path ckdir = c.checkpoint_dir;
  const std::string my_dir = c.checkpoint_dir.empty() ? "" : (ckdir / ("rank_" + std::to_string(rank))).string();
  if (!my_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(my_dir, ec);
    if (ec) return InvalidArgument("rank ", rank, ": cannot create '", my_dir, "': ", ec.message());
  }
  if (c.resume) {
    if (c.checkpoint_dir.empty()) return InvalidArgument("--resume needs --checkpoint-dir");
    // The newest step with a manifest: every shard of it was written.
    int64_t newest = -1;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(ckdir, ec)) {
      const std::string f = e.path().filename().string();
      int64_t step;
      if (f.rfind("step_", 0) == 0 && f.ends_with(".manifest") && absl::SimpleAtoi(f.substr(5, f.size() - 14), &step))
        newest = std::max(newest, step);
    }
    absl::Status found = newest < 0 ? NotFound("--resume: no complete checkpoint (step_*.manifest) in '",
                                               c.checkpoint_dir, "'")
                                    : absl::OkStatus();
    std::map<std::string, std::string> props;
    bool resharded = false;
    if (found.ok()) {
      // Saved under this plan: this rank's own shard. Under another mesh: every old shard,
      // resharded onto this rank's blocks.
      const std::string mine = CheckpointPath(my_dir, newest);
      auto own = ReadCheckpoint(mine);
      if (own.ok() && own->properties["plan"] == plan_id) {
        auto loaded = session->LoadCheckpoint(mine);
        if (loaded.ok()) props = *loaded;
        else found = loaded.status();
      } else {
        const std::string manifest = onnx_ext::ReadFileOrEmpty(
            (ckdir / absl::StrFormat("step_%08d.manifest", newest)).string());
        int64_t old_ranks = 0;
        if (const size_t at = manifest.find("\"ranks\": "); at != std::string::npos)
          old_ranks = std::atoll(manifest.c_str() + at + 9);
        std::vector<Checkpoint> shards;
        for (int64_t i = 0; i < old_ranks && found.ok(); ++i) {
          auto shard = ReadCheckpoint(CheckpointPath((ckdir / ("rank_" + std::to_string(i))).string(), newest));
          if (shard.ok()) shards.push_back(std::move(*shard));
          else found = shard.status();
        }
        if (found.ok() && shards.empty()) found = absl::DataLossError(absl::StrCat("manifest of step ", newest, " lists no ranks"));
        if (found.ok()) {
          props = shards[0].properties;
          std::map<std::string, Tensor> targets;
          for (const std::string& p : session->parameter_names()) {
            targets[p] = *session->GetState(p);
            for (const std::string& suf : session->artifacts().state_suffixes) targets[p + suf] = *session->GetState(p + suf);
          }
          found = ReshardInto(shards, blocks, targets);
          for (const auto& [name, t] : targets)
            if (found.ok()) found = session->SetState(name, t);
          int64_t step = 0;
          if (found.ok() && !absl::SimpleAtoi(props["cleave.step"], &step))
            found = absl::DataLossError("the checkpoint has no step");
          if (found.ok()) session->SetStep(step);
          resharded = found.ok();
        }
      }
      if (found.ok() && props["run"] != signature)
        found = InvalidArgument("--resume: the checkpoint of step ", newest, " was written by a run with ", props["run"],
                                "; this run has ", signature);
    }
    // Every rank learns whether all shards loaded before any step.
    Tensor bad = Tensor::Scalar<int32_t>(found.ok() ? 0 : 1);
    RETURN_IF_ERROR(comm->AllReduce(bad.view(), bad.view(), ReduceOp::kMax, all));
    absl::Status agreed = found.ok() ? absl::OkStatus()
                                     : absl::Status(found.code(), absl::StrCat("rank ", rank, ": ", found.message()));
    if (agreed.ok() && *bad.data<int32_t>())
      agreed = absl::DataLossError(absl::StrCat("rank ", rank, ": another rank could not load its shard of step ",
                                                newest, "; nothing was trained"));
    if (!agreed.ok()) {
      agreed.SetPayload(kAllRanksFailed, absl::Cord("1"));
      return agreed;
    }
    start = session->step();
    if (rank == 0)
      log << "resumed from " << c.checkpoint_dir << " step " << start
          << (resharded ? " (saved under another mesh: resharded onto " + mesh.ToString() + ")" : "") << "\n";
  }
  result.first_step = start;
  std::ofstream metrics;
  const std::string metrics_path = RankFile(c.metrics, rank, world);
  if (!metrics_path.empty()) {
    absl::Status opened = OpenMetrics(metrics_path, c.resume, &metrics);
    if (!opened.ok()) return absl::Status(opened.code(), absl::StrCat("rank ", rank, ": ", opened.message()));
  }
  auto evaluate = [&]() -> absl::StatusOr<double> {
    double sum = 0;
    for (int64_t k = 0; k < c.eval_batches; ++k) {
      std::vector<Feeds> mb = micro_feeds(data.val, false, k * batch);
      float l;
      if (session->pipelined()) {
        ASSIGN_OR_RETURN(l, session->PipelineEval(mb));
      } else {
        ASSIGN_OR_RETURN(l, session->EvalStep(mb[0]));
      }
      ASSIGN_OR_RETURN(double shared, share(l));
      sum += shared;
    }
    return sum / static_cast<double>(c.eval_batches);
  };

  StepRecorder recorder(c, !data.val.empty(), result);
  const double tokens_per_step = static_cast<double>(batch * seq);
  StepProfile profile(c, rank, world, start, *session);
  if (!profile.status().ok())
    return absl::Status(profile.status().code(), absl::StrCat("rank ", rank, ": ", profile.status().message()));
  for (int64_t s = start; s < c.steps; ++s) {
    profile.Before(s);
    if (FaultAt("CLEAVE_FAULT_KILL", rank, s + 1)) std::raise(SIGKILL);
    if (FaultAt("CLEAVE_FAULT_HANG", rank, s + 1))
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    const auto t0 = std::chrono::steady_clock::now();
    const Communicator::CommTime before = comm->time_spent();
    const GradientReducer::Time reduce_before = session->reduction_time();
    std::vector<Feeds> mb = micro_feeds(data.train, c.shuffle, s * batch);
    float local_loss;
    const auto p0 = std::chrono::steady_clock::now();
    if (session->pipelined()) {
      ASSIGN_OR_RETURN(local_loss, session->PipelineStep(work, mb));
    } else {
      session->LazyResetGrad();
      ASSIGN_OR_RETURN(local_loss, session->TrainStep(mb[0]));
    }
    // Forward and backward of all micro-batches (the pipeline), without the optimizer; the
    // monotonic clock is the machine's, so ranks on one machine share its time line.
    const auto p1 = std::chrono::steady_clock::now();
    const double pipeline_ms = std::chrono::duration<double, std::milli>(p1 - p0).count();
    const auto since = [](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
    };
    const double lr = schedule.At(s);
    const double scale_used = session->loss_scale();
    ASSIGN_OR_RETURN(float norm, session->OptimizerStep());
    const bool skipped = session->last_step_skipped();
    ASSIGN_OR_RETURN(double loss, share(local_loss));
    if (!std::isfinite(loss) || (!std::isfinite(norm) && !skipped))
      return absl::OutOfRangeError(absl::StrCat("rank ", rank, ": step ", s + 1, ": loss ", loss, ", gradient norm ",
                                                norm, "; stopped, the last checkpoint is untouched"));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const Communicator::CommTime after = comm->time_spent();
    // Communication the step waited for (the graphs' collectives run in line, and what it
    // waited for of the overlapped reductions and asynchronous collectives), and their time
    // hidden behind compute.
    const GradientReducer::Time reduce_after = session->reduction_time();
    const double reduce_waited_ms = 1000 * (reduce_after.waited - reduce_before.waited);
    const double comm_ms = 1000 * (after.collective - before.collective) + reduce_waited_ms;
    const double overlapped_ms =
        std::max(0.0, 1000 * (reduce_after.busy - reduce_before.busy) - reduce_waited_ms);
    const double idle_ms = 1000 * (after.recv_wait - before.recv_wait);
    const double compute_ms = std::max(0.0, ms - comm_ms - idle_ms);
    const bool last = s + 1 == c.steps || s + 1 == c.exit_at;
    ASSIGN_OR_RETURN(const double val, recorder.Record(s + 1, loss, norm, last, evaluate));
    const double tps = tokens_per_step / (ms / 1000.0);
    if (rank == 0 && recorder.Logs(s + 1, last, val)) {
      log << recorder.ProgressHead(s + 1, loss, lr, norm, ms, tps)
          << absl::StrFormat(" | compute %.1f ms, comm %.1f ms, idle %.1f ms", compute_ms, comm_ms, idle_ms);
      if (overlapped_ms > 0) log << absl::StrFormat(" (+%.1f ms comm overlapped)", overlapped_ms);
      log << StepRecorder::ProgressTail(*session, scale_used, skipped, val) << std::flush;
    }
    if (metrics.is_open()) {
      metrics << absl::StrFormat("{\"step\": %d, \"rank\": %d, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
                                 "\"ms\": %.3f, \"tokens_per_s\": %.1f, \"compute_ms\": %.3f, \"comm_ms\": %.3f, "
                                 "\"idle_ms\": %.3f, \"pipeline_ms\": %.3f, \"pipeline_start_us\": %d, "
                                 "\"pipeline_end_us\": %d, \"overlapped_comm_ms\": %.3f",
                                 s + 1, rank, loss, lr, std::isfinite(norm) ? norm : -1.0f, ms, tps, compute_ms,
                                 comm_ms, idle_ms, pipeline_ms, since(p0), since(p1), overlapped_ms)
              << StepRecorder::MetricsTail(*session, scale_used, skipped, val) << std::flush;
    }
    RETURN_IF_ERROR(profile.After(s, last, rank == 0, log));
    if (!my_dir.empty() && (last || (c.checkpoint_every > 0 && (s + 1) % c.checkpoint_every == 0))) {
      RETURN_IF_ERROR(session->SaveCheckpoint(CheckpointPath(my_dir, s + 1),
                                              [&] {
                                                std::map<std::string, std::string> props = {
                                                    {"run", signature}, {"plan", plan_id},
                                                    {"rank", absl::StrCat(rank)}, {"mesh", mesh.ToString()}};
                                                for (const auto& [name, b] : blocks) props["block:" + name] = b;
                                                return props;
                                              }()));
      PruneCheckpoints(my_dir, c.keep_checkpoints);
      // The manifest marks the step complete once every shard is on disk.
      RETURN_IF_ERROR(comm->Barrier(all));
      if (rank == 0) {
        const std::string manifest = (ckdir / absl::StrFormat("step_%08d.manifest", s + 1)).string();
        RETURN_IF_ERROR(onnx_ext::WriteFileAtomic(
            manifest, absl::StrCat("{\"step\": ", s + 1, ", \"mesh\": \"", mesh.ToString(), "\", \"plan\": \"", c.model,
                                   "\", \"ranks\": ", world, ", \"shard\": \"rank_<r>/",
                                   std::filesystem::path(CheckpointPath(my_dir, s + 1)).filename().string(), "\"}\n")));
        log << "saved checkpoint " << manifest << " (" << world << " shards)\n";
      }
    }
    if (s + 1 == c.exit_at) break;
  }
  if (rank == 0) recorder.Plot(log);
  return result;
}

}  // namespace cleave::trainer
