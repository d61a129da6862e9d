// `cleave train`: train a causal language model on a token file (tools/). Parses the flags
// into a TrainConfig and hands it to trainer::RunTraining.
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tools/commands.h"
#include "runtime/mpi_communicator.h"
#ifdef CLEAVE_HAVE_NCCL
#include "providers/cuda/cuda_provider.h"
#include "runtime/nccl_communicator.h"
#endif
#include "tools/flags.h"
#include "trainer/train_loop.h"

namespace cleave::tools {

namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "cleave train: %s\n", msg.c_str());
  return 1;
}

}  // namespace

bool TrainingFlag(FlagReader& r, trainer::LossKind* loss, trainer::OptimizerConfig* optimizer,
                  std::vector<std::string>* frozen, trainer::RecomputeMode* recompute,
                  trainer::Precision* precision) {
  const std::string& a = r.flag();
  if (a == "--loss") {
    const std::string v = r.Value();
    if (v == "cross_entropy") *loss = trainer::LossKind::kCrossEntropy;
    else if (v == "mse") *loss = trainer::LossKind::kMse;
    else r.Fail(absl::StrCat("--loss expects cross_entropy or mse, got '", v, "'"));
  } else if (a == "--optimizer") {
    const std::string v = r.Value();
    if (v == "adamw") optimizer->kind = trainer::OptimizerConfig::Kind::kAdamW;
    else if (v == "sgd") optimizer->kind = trainer::OptimizerConfig::Kind::kSgd;
    else r.Fail(absl::StrCat("--optimizer expects adamw or sgd, got '", v, "'"));
  } else if (a == "--weight-decay") r.Number(&optimizer->weight_decay);
  else if (a == "--clip") r.Number(&optimizer->max_grad_norm);
  else if (a == "--beta1") r.Number(&optimizer->beta1);
  else if (a == "--beta2") r.Number(&optimizer->beta2);
  else if (a == "--eps") r.Number(&optimizer->epsilon);
  else if (a == "--momentum") r.Number(&optimizer->momentum);
  else if (a == "--nesterov") optimizer->nesterov = true;
  else if (a == "--freeze") {
    for (absl::string_view p : absl::StrSplit(r.Value(), ',', absl::SkipEmpty())) frozen->emplace_back(p);
  } else if (a == "--precision") {
    auto p = trainer::ParsePrecision(r.Value());
    if (p.ok()) *precision = *p;
    else r.Fail(std::string(p.status().message()));
  } else if (a == "--recompute") {
    auto m = trainer::ParseRecomputeMode(r.Value());
    if (m.ok()) *recompute = *m;
    else r.Fail(std::string(m.status().message()));
  } else {
    return false;
  }
  return true;
}

// `mpirun -np N cleave train PLAN_DIR ...`: this process is one rank of the plan.
int TrainPlan(trainer::TrainConfig c, bool batch_given, bool seq_given, double comm_timeout,
              const std::vector<std::string>& plan_fixed) {
  auto comm = runtime::MpiCommunicator::Create(nullptr, nullptr,
                                               std::chrono::milliseconds(static_cast<int64_t>(comm_timeout * 1000)));
  if (!comm.ok()) return Fail(std::string(comm.status().message()));
  const int rank = (*comm)->rank(), world = (*comm)->world_size();
  absl::Status status;
  if (!plan_fixed.empty())
    status = absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, ": ", absl::StrJoin(plan_fixed, ", "),
        " set what a plan fixes when it is made (the loss, optimizer, precision, recompute and attention fusion): ",
        "pass them to cleave partition"));
  // Every rank has the same flags, so every rank stops here alike.
  if (!status.ok()) status.SetPayload(trainer::kAllRanksFailed, absl::Cord("1"));
  if (!batch_given) c.batch = 0;
  if (!seq_given) c.seq = 0;
  c.communicator = comm->get();
  // --device cuda|auto: this rank's GPU is its local rank on the node; its collectives and
  // pipeline messages go over NCCL on that GPU.
#ifdef CLEAVE_HAVE_NCCL
  std::unique_ptr<runtime::NcclCommunicator> nccl;
#endif
  if (status.ok() && c.device != DeviceChoice::kCpu) {
    int local = 0;
    for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
      if (const char* e = std::getenv(v); e && absl::SimpleAtoi(e, &local)) break;
    std::string warning;
    auto device = InferenceSession::MakeDeviceProvider(c.device, local, &warning);
    if (!device.ok()) {
      status = absl::Status(device.status().code(), absl::StrCat("rank ", rank, ": ", device.status().message()));
    } else if (*device) {
      c.device_provider = *device;
#ifdef CLEAVE_HAVE_NCCL
      auto* cuda = static_cast<providers::CudaExecutionProvider*>(device->get());
      // NCCL work that times out and cannot be aborted leaves this rank stuck for good: the
      // rank stops with the reason, and mpirun takes the others down.
      auto stuck = [](const absl::Status& why) {
        std::fprintf(stderr, "cleave train: %s; the NCCL work could not be aborted, so this rank stops\n",
                     why.ToString().c_str());
        std::fflush(stderr);
        std::_Exit(1);
      };
      auto made = runtime::NcclCommunicator::Create(comm->get(), local, cuda->stream(),
                                                    std::chrono::milliseconds(static_cast<int64_t>(comm_timeout * 1000)),
                                                    stuck);
      if (!made.ok()) status = absl::Status(made.status().code(), absl::StrCat("rank ", rank, ": ", made.status().message()));
      else nccl = std::move(*made), c.device_communicator = nccl.get();
#else
      std::fprintf(stderr, "cleave train: rank %d: built without NCCL: collectives run on the host over MPI\n", rank);
#endif
    } else if (!warning.empty()) {
      std::fprintf(stderr, "cleave train: rank %d: %s\n", rank, warning.c_str());
      c.device = DeviceChoice::kCpu;  // said once
    }
  }
  if (status.ok()) {
    auto r = trainer::RunTraining(c, std::cout);
    status = r.status();
    if (r.ok() && rank == 0 && !r->losses.empty())
      std::printf("trained %zu steps on %d ranks: loss %.4f -> %.4f\n", r->losses.size(), world, r->losses.front(),
                  r->losses.back());
  }
  if (!status.ok()) {
    std::fprintf(stderr, "cleave train: %s\n", std::string(status.message()).c_str());
    std::fflush(stderr);
    std::fflush(stdout);
    // The other ranks may be waiting on this one: end the whole job (unless every rank failed
    // the same start-up checks together, so that none waits).
    if (world > 1 && !status.GetPayload(trainer::kAllRanksFailed)) (*comm)->Abort(1);
    return 1;
  }
  std::fflush(stdout);
  return 0;
}

int TrainCommand(const Args& args) {
  trainer::TrainConfig c;
  FlagReader flags(args);
  bool batch_given = false, seq_given = false;
  double comm_timeout = 60;
  std::vector<std::string> plan_fixed;  // flags whose settings a plan fixes at partition time
  while (flags.Next()) {
    const std::string& a = flags.flag();
    if (TrainingFlag(flags, &c.loss, &c.optimizer, &c.frozen, &c.recompute, &c.precision)) {
      plan_fixed.push_back(a);
      continue;
    }
    if (a == "--fuse-attention" || a == "--no-fuse-attention") {
      c.fuse_attention = a == "--fuse-attention";
      plan_fixed.push_back(a);  // a plan's graphs are fused or not when it is made
      continue;
    }
    if (a == "--comm-timeout") {
      flags.Number(&comm_timeout);
      continue;
    }
    if (a == "--loss-scale") {
      flags.Number(&c.loss_scale);
      continue;
    }
    if (a == "--loss-scale-window") {
      flags.Number(&c.loss_scale_window);
      continue;
    }
    if (a == "--batch") batch_given = true;
    if (a == "--seq") seq_given = true;
    if (a == "--data") c.data = flags.Value();
    else if (a == "--lr") flags.Number(&c.lr);
    else if (a == "--min-lr") flags.Number(&c.min_lr);
    else if (a == "--warmup") flags.Number(&c.warmup);
    else if (a == "--lr-schedule") {
      auto k = trainer::ParseLrScheduleKind(flags.Value());
      if (k.ok()) c.schedule = *k;
      else flags.Fail(std::string(k.status().message()));
    } else if (a == "--batch") flags.Number(&c.batch);
    else if (a == "--seq") flags.Number(&c.seq);
    else if (a == "--steps") flags.Number(&c.steps);
    else if (a == "--grad-accum") flags.Number(&c.grad_accum);
    else if (a == "--seed") flags.Number(&c.seed);
    else if (a == "--no-shuffle") c.shuffle = false;
    else if (a == "--val-fraction") flags.Number(&c.val_fraction);
    else if (a == "--eval-every") flags.Number(&c.eval_every);
    else if (a == "--eval-batches") flags.Number(&c.eval_batches);
    else if (a == "--metrics") c.metrics = flags.Value();
    else if (a == "--plot") c.plot = flags.Value();
    else if (a == "--checkpoint-dir") c.checkpoint_dir = flags.Value();
    else if (a == "--checkpoint-every") flags.Number(&c.checkpoint_every);
    else if (a == "--keep-checkpoints") flags.Number(&c.keep_checkpoints);
    else if (a == "--resume") c.resume = true;
    else if (a == "--save-model") c.save_model = flags.Value();
    else if (a == "--save-artifacts") c.artifacts_dir = flags.Value();
    else if (a == "--threads") flags.Number(&c.threads);
    else if (a == "--device") {
      const std::string d = flags.Value();
      if (d == "cpu") c.device = DeviceChoice::kCpu;
      else if (d == "cuda") c.device = DeviceChoice::kCuda;
      else if (d == "auto") c.device = DeviceChoice::kCudaIfAvailable;
      else flags.Fail(absl::StrCat("--device expects cpu, cuda or auto, got '", d, "'"));
    }
    else if (a == "--profile") c.profile = flags.Value();
    else if (a == "--profile-steps") flags.Number(&c.profile_steps);
    else if (a == "--no-overlap-grad-reduce") c.overlap_grad_reduce = false;
    else if (a == "--no-async-collectives") c.overlap_collectives = false;
    else if (a == "--log-every") flags.Number(&c.log_every);
    else if (a == "--exit-at") flags.Number(&c.exit_at);
    else if (c.model.empty() && !a.empty() && a[0] != '-') c.model = a;
    else flags.Fail(absl::StrCat("unknown argument '", a, "'"));
  }
  const std::string& error = flags.error();
  if (!error.empty()) return Fail(error);
  if (c.model.empty()) return Fail("no model given (cleave train MODEL.onnx --data FILE ...)");
  if (c.data.empty()) return Fail("no --data file given");
  if (trainer::IsPlanDirectory(c.model)) return TrainPlan(c, batch_given, seq_given, comm_timeout, plan_fixed);
  auto r = trainer::RunTraining(c, std::cout);
  if (!r.ok()) return Fail(std::string(r.status().message()));
  if (!r->losses.empty())
    std::printf("trained %zu steps: loss %.4f -> %.4f%s\n", r->losses.size(), r->losses.front(), r->losses.back(),
                r->val_loss >= 0 ? absl::StrCat(", val loss ", r->val_loss).c_str() : "");
  return 0;
}

}  // namespace cleave::tools
