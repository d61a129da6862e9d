// Trains one rank of a partitioned plan from an application of one's own, with cleave's
// libraries instead of the `cleave` command line:
//
//   cleave partition model.onnx --mesh tp=2 --batch 4 --seq 64 -o plan
//   mpirun -np 2 train_plan plan corpus.txt 20 checkpoints
//
// Each process opens its rank's part of the plan, trains STEPS steps on byte windows of the
// data file (the same windows on every rank; each rank feeds the rows of its data-parallel
// slice of every micro-batch) and saves its shard of the parameters and optimizer state.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "runtime/mpi_communicator.h"
#include "trainer/partition_plan.h"
#include "trainer/training_session.h"

namespace {

int Fail(cleave::runtime::MpiCommunicator* comm, const std::string& msg) {
  std::fprintf(stderr, "train_plan: rank %d: %s\n", comm ? comm->rank() : -1, msg.c_str());
  if (comm && comm->world_size() > 1) comm->Abort(1);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cleave;
  auto created = runtime::MpiCommunicator::Create(&argc, &argv, std::chrono::seconds(60));
  if (!created.ok()) return Fail(nullptr, std::string(created.status().message()));
  runtime::MpiCommunicator* comm = created->get();
  if (argc != 5) return Fail(comm, "usage: mpirun -np N train_plan PLAN_DIR DATA_FILE STEPS CHECKPOINT_DIR");
  const std::string plan_dir = argv[1], data_file = argv[2], ckpt_dir = argv[4];
  const int steps = std::atoi(argv[3]);
  const int rank = comm->rank();

  // This rank's graphs, parameter shards and schedule.
  auto run = trainer::LoadRankRun(plan_dir, rank);
  if (!run.ok()) return Fail(comm, std::string(run.status().message()));
  if (run->mesh.world_size() != comm->world_size())
    return Fail(comm, "the plan is for " + std::to_string(run->mesh.world_size()) + " ranks");
  const partition::Mesh mesh = run->mesh;
  const int64_t batch = run->batch, seq = run->seq;
  const int micro = run->microbatches;
  const int64_t rows = batch / micro / mesh.size("dp");
  const auto work = run->work;
  const auto data_inputs = run->artifacts.data_inputs;  // e.g. input_ids, labels

  trainer::TrainingSessionOptions options;
  options.communicator = comm;
  options.intra_op_threads = 1;
  auto session = trainer::TrainingSession::Create(std::move(run->artifacts), options);
  if (!session.ok()) return Fail(comm, std::string(session.status().message()));
  trainer::TrainingSession& s = **session;
  s.SetLearningRate(1e-3);

  std::ifstream in(data_file, std::ios::binary);
  const std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (static_cast<int64_t>(bytes.size()) < seq + 2) return Fail(comm, "the data file is shorter than one window");

  const std::vector<int> pp_group = mesh.Group(rank, "pp");
  for (int step = 0; step < steps; ++step) {
    // Global row g of this step reads the window at (step * batch + g) * seq.
    std::vector<Feeds> microbatches;
    for (int m = 0; m < micro; ++m) {
      Tensor ids(DataType::kInt64, {rows, seq}), labels(DataType::kInt64, {rows, seq});
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t g = m * (batch / micro) + mesh.Coord(rank, "dp") * rows + r;
        const int64_t o = ((step * batch + g) * seq) % (static_cast<int64_t>(bytes.size()) - seq - 1);
        for (int64_t t = 0; t < seq; ++t) {
          ids.data<int64_t>()[r * seq + t] = bytes[o + t];
          labels.data<int64_t>()[r * seq + t] = bytes[o + t + 1];
        }
      }
      Feeds f;
      for (const std::string& name : data_inputs) f.emplace_back(name, name == "labels" ? labels : ids);
      microbatches.push_back(std::move(f));
    }
    absl::StatusOr<float> loss;
    if (s.pipelined()) {
      loss = s.PipelineStep(work, microbatches);
    } else {
      s.LazyResetGrad();
      loss = s.TrainStep(microbatches[0]);
    }
    if (!loss.ok()) return Fail(comm, std::string(loss.status().message()));
    auto norm = s.OptimizerStep();
    if (!norm.ok()) return Fail(comm, std::string(norm.status().message()));
    // The last pipeline stage holds the loss; it tells the rest of its pipeline.
    Tensor l = Tensor::Scalar<float>(*loss);
    if (pp_group.size() > 1) {
      absl::Status b = comm->Broadcast(l.view(), pp_group.back(), pp_group);
      if (!b.ok()) return Fail(comm, std::string(b.message()));
    }
    if (rank == 0) std::printf("step %d: loss %.4f, grad norm %.3f\n", step + 1, *l.data<float>(), *norm);
  }
  std::filesystem::create_directories(ckpt_dir);
  const std::string path = ckpt_dir + "/rank_" + std::to_string(rank) + ".ckpt";
  absl::Status saved = s.SaveCheckpoint(path, {{"rank", std::to_string(rank)}});
  if (!saved.ok()) return Fail(comm, std::string(saved.message()));
  std::printf("rank %d saved %s\n", rank, path.c_str());
  return 0;
}
