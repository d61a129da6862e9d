// Megatron tensor-parallel seeds found by graph structure (partition/): the column-parallel
// layers are the matrix products whose weight is a 2-D parameter (read directly or through a
// transpose) and whose activation input is a normalised residual stream (a
// LayerNormalization output, or an RMSNorm-style product with a 1-D parameter). Their
// weights are split over tp along the output features; propagation then finds the
// row-parallel layers (their contracting dim arrives sharded) and everything between.
// Nothing here looks at tensor names.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "partition/mesh.h"

namespace cleave::partition {

struct MegatronSeed {
  std::string param;   // the weight
  int dim;             // its output-feature dim
  std::string reader;  // the matrix product that made it a seed
};

// `params`: names of the trainable parameters. Fails naming the weight and dim when tp does
// not divide an output-feature dim.
absl::StatusOr<std::vector<MegatronSeed>> FindMegatronSeeds(const graph::Graph& g, const std::vector<std::string>& params,
                                                            const Mesh& mesh);

std::map<std::string, Sharding> SeedShardings(const graph::Graph& g, const std::vector<MegatronSeed>& seeds);

// A part of a fused projection weight: rows (or columns) [offset, offset + size) along `axis`
// of `source`.
struct WeightPart {
  std::string source;
  int axis = 0;
  int64_t offset = 0;
  std::vector<int64_t> source_dims;
};

// Fused projections (a GPT's c_attn: one matrix product and bias whose output a Split cuts
// into q, k and v) become one product per part, each with its own slice of the weight and
// bias as a new initializer "<name>.part<i>", so that Megatron can split each part over tp
// by heads (a contiguous split of the fused weight would give a rank parts of different
// projections). Found by structure in a forward model: MatMul of a 2-D float initializer
// (read directly or through Transpose [1, 0]), an optional Add of a 1-D initializer, and a
// Split of the last axis into equal parts that is the only reader. Returns the new
// initializers' places in the weights they came from.
absl::StatusOr<std::map<std::string, WeightPart>> SplitFusedProjections(graph::Graph& model);

// Sequence parallelism (Megatron-SP): the residual stream's first value (the activation input
// of the first normalisation) gets its sequence dim split over tp; propagation carries that
// along the residual path, so each column-parallel layer's input is all-gathered over the
// sequence and each row-parallel output reduce-scattered back. Returns the value's name and
// sharding.
absl::StatusOr<std::pair<std::string, Sharding>> FindSequenceParallelSeed(const graph::Graph& g,
                                                                          const std::vector<std::string>& params,
                                                                          const Mesh& mesh);


}  // namespace cleave::partition
