// Training checkpoints (trainer/): named tensors plus string properties in one file.
//
// Layout (little-endian): "CLEAVECK" | u32 version | u32 property count | per property:
// u32 key length, key, u32 value length, value | u32 tensor count | per tensor: u32 name
// length, name, i32 dtype (ONNX numbering), u32 rank, i64 dims[rank], u64 byte count, data |
// "CKEND" u8[3] pad | u32 CRC-32 of every byte before it.
//
// Writes are atomic: the file is written to `<path>.tmp.<pid>`, fsync'd, renamed over `path`
// and the directory fsync'd, so a crash at any point leaves either the old file or the new
// one. Reads check the size, the trailer and the checksum before parsing, and report what
// was expected and what was found.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/tensor.h"

namespace cleave::trainer {

struct Checkpoint {
  std::map<std::string, std::string> properties;
  std::vector<std::pair<std::string, Tensor>> tensors;

  const Tensor* Find(const std::string& name) const;
};

absl::Status WriteCheckpoint(const std::string& path, const Checkpoint& c);
absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path);

// Checkpoint files of a directory, named step_<8 digits>.ckpt, oldest first.
std::vector<std::string> ListCheckpoints(const std::string& dir);
std::string CheckpointPath(const std::string& dir, int64_t step);
// Deletes all but the newest `keep` checkpoints (and stale temporary files) in `dir`.
void PruneCheckpoints(const std::string& dir, int keep);

}  // namespace cleave::trainer
