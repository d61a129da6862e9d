// Training checkpoints (trainer/): see checkpoint.h.
#include "trainer/checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/shape.h"
#include "base/status.h"

namespace cleave::trainer {

namespace {

constexpr char kMagic[8] = {'C', 'L', 'E', 'A', 'V', 'E', 'C', 'K'};
constexpr char kEnd[8] = {'C', 'K', 'E', 'N', 'D', 0, 0, 0};
constexpr uint32_t kVersion = 1;

class Writer {
 public:
  explicit Writer(int fd) : fd_(fd) {}
  bool Put(const void* p, size_t n) {
    crc_ = crc32_z(crc_, static_cast<const Bytef*>(p), n);
    return Raw(p, n);
  }
  bool Raw(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = ::write(fd_, c, std::min<size_t>(n, size_t{1} << 30));
      if (w <= 0) return false;
      c += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }
  template <typename T>
  bool Pod(T v) { return Put(&v, sizeof(v)); }
  bool Str(const std::string& s) { return Pod<uint32_t>(static_cast<uint32_t>(s.size())) && Put(s.data(), s.size()); }
  uLong crc() const { return crc_; }

 private:
  int fd_;
  uLong crc_ = crc32_z(0L, Z_NULL, 0);
};

class Reader {
 public:
  Reader(const char* p, size_t n, const std::string& path) : p_(p), n_(n), path_(path) {}
  template <typename T>
  absl::Status Pod(T* v, const char* what) {
    if (n_ - off_ < sizeof(T)) return Truncated(what);
    std::memcpy(v, p_ + off_, sizeof(T));
    off_ += sizeof(T);
    return absl::OkStatus();
  }
  absl::Status Str(std::string* s, const char* what) {
    uint32_t len = 0;
    RETURN_IF_ERROR(Pod(&len, what));
    if (n_ - off_ < len) return Truncated(what);
    s->assign(p_ + off_, len);
    off_ += len;
    return absl::OkStatus();
  }
  absl::Status Bytes(void* dst, uint64_t len, const char* what) {
    if (n_ - off_ < len) return Truncated(what);
    std::memcpy(dst, p_ + off_, len);
    off_ += len;
    return absl::OkStatus();
  }
  size_t offset() const { return off_; }

 private:
  absl::Status Truncated(const char* what) const {
    return absl::DataLossError(absl::StrCat("checkpoint '", path_, "' is malformed: ", what,
                                            " runs past the end of the data at byte ", off_));
  }
  const char* p_;
  size_t n_;
  size_t off_ = 0;
  const std::string& path_;
};

}  // namespace

const Tensor* Checkpoint::Find(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

absl::Status WriteCheckpoint(const std::string& path, const Checkpoint& c) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    return absl::PermissionDeniedError(absl::StrCat("cannot create '", tmp, "': ", std::strerror(errno)));
  Writer w(fd);
  bool ok = w.Put(kMagic, sizeof(kMagic)) && w.Pod<uint32_t>(kVersion) &&
            w.Pod<uint32_t>(static_cast<uint32_t>(c.properties.size()));
  for (const auto& [k, v] : c.properties) ok = ok && w.Str(k) && w.Str(v);
  ok = ok && w.Pod<uint32_t>(static_cast<uint32_t>(c.tensors.size()));
  // Fault injection for crash-safety tests: pause halfway through the tensors so a test can
  // kill the process in the middle of a write.
  const char* pause = std::getenv("CLEAVE_FAULT_CHECKPOINT_PAUSE_MS");
  size_t written = 0;
  for (const auto& [name, t] : c.tensors) {
    if (pause && written++ == c.tensors.size() / 2) ::usleep(static_cast<useconds_t>(std::atoi(pause)) * 1000);
    ok = ok && w.Str(name) && w.Pod<int32_t>(static_cast<int32_t>(t.dtype())) &&
         w.Pod<uint32_t>(static_cast<uint32_t>(t.rank()));
    for (int64_t d : t.dims()) ok = ok && w.Pod<int64_t>(d);
    ok = ok && w.Pod<uint64_t>(t.nbytes()) && w.Put(t.data<char>(), t.nbytes());
  }
  ok = ok && w.Put(kEnd, sizeof(kEnd));
  const uint32_t crc = static_cast<uint32_t>(w.crc());
  ok = ok && w.Raw(&crc, sizeof(crc));
  if (!ok || ::fsync(fd) != 0) {
    const std::string err = std::strerror(errno);
    ::close(fd);
    std::remove(tmp.c_str());
    return absl::DataLossError(absl::StrCat("cannot write checkpoint '", tmp, "': ", err));
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::DataLossError(absl::StrCat("cannot rename '", tmp, "' to '", path, "'"));
  }
  // Make the rename itself durable.
  std::string dir = std::filesystem::path(path).parent_path().string();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return NotFound("cannot open checkpoint '", path, "': ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat("cannot stat checkpoint '", path, "'"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  const size_t min_size = sizeof(kMagic) + 12 + sizeof(kEnd) + 4;
  if (size < min_size) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat("checkpoint '", path, "' is truncated: ", size,
                                            " bytes, a checkpoint has at least ", min_size));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return absl::DataLossError(absl::StrCat("cannot map checkpoint '", path, "'"));
  std::shared_ptr<void> guard(map, [size](void* p) { ::munmap(p, size); });
  const char* p = static_cast<const char*>(map);
  if (std::memcmp(p, kMagic, sizeof(kMagic)) != 0)
    return absl::DataLossError(absl::StrCat("'", path, "' is not a cleave checkpoint (bad magic)"));
  if (std::memcmp(p + size - 4 - sizeof(kEnd), kEnd, sizeof(kEnd)) != 0)
    return absl::DataLossError(absl::StrCat("checkpoint '", path, "' is truncated (", size,
                                            " bytes, no end marker): it was not completely written"));
  uint32_t stored;
  std::memcpy(&stored, p + size - 4, 4);
  const uint32_t actual = static_cast<uint32_t>(
      crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(p), size - 4));
  if (stored != actual)
    return absl::DataLossError(absl::StrFormat(
        "checkpoint '%s' is corrupt: checksum mismatch (stored CRC-32 %08x, computed %08x)", path,
        stored, actual));
  Reader r(p, size - 4 - sizeof(kEnd), path);
  char magic[8];
  RETURN_IF_ERROR(r.Bytes(magic, 8, "magic"));
  uint32_t version = 0, nprops = 0, ntensors = 0;
  RETURN_IF_ERROR(r.Pod(&version, "version"));
  if (version != kVersion)
    return absl::DataLossError(absl::StrCat("checkpoint '", path, "' has format version ", version,
                                            ", expected ", kVersion));
  Checkpoint c;
  RETURN_IF_ERROR(r.Pod(&nprops, "property count"));
  for (uint32_t i = 0; i < nprops; ++i) {
    std::string k, v;
    RETURN_IF_ERROR(r.Str(&k, "property key"));
    RETURN_IF_ERROR(r.Str(&v, "property value"));
    c.properties[k] = v;
  }
  RETURN_IF_ERROR(r.Pod(&ntensors, "tensor count"));
  for (uint32_t i = 0; i < ntensors; ++i) {
    std::string name;
    int32_t dtype;
    uint32_t rank;
    RETURN_IF_ERROR(r.Str(&name, "tensor name"));
    RETURN_IF_ERROR(r.Pod(&dtype, "tensor dtype"));
    RETURN_IF_ERROR(r.Pod(&rank, "tensor rank"));
    if (rank > static_cast<uint32_t>(kMaxRank))
      return absl::DataLossError(absl::StrCat("checkpoint '", path, "': tensor '", name, "' has rank ",
                                              rank, ", at most ", kMaxRank, " is supported"));
    std::vector<int64_t> dims(rank);
    for (auto& d : dims) RETURN_IF_ERROR(r.Pod(&d, "tensor dims"));
    uint64_t nbytes = 0;
    RETURN_IF_ERROR(r.Pod(&nbytes, "tensor size"));
    const DataType t = static_cast<DataType>(dtype);
    const size_t esize = ElementSize(t);
    int64_t numel = 1;
    for (int64_t d : dims) numel = d < 0 ? -1 : numel * d;
    if (esize == 0 || numel < 0 || nbytes != static_cast<uint64_t>(numel) * esize)
      return absl::DataLossError(absl::StrCat("checkpoint '", path, "': tensor '", name, "' declares ",
                                              nbytes, " bytes for dtype ", dtype, " and ",
                                              DimsToString(dims)));
    Tensor tensor = Tensor::Uninitialized(t, dims);
    RETURN_IF_ERROR(r.Bytes(tensor.data<char>(), nbytes, "tensor data"));
    c.tensors.emplace_back(std::move(name), std::move(tensor));
  }
  return c;
}

std::string CheckpointPath(const std::string& dir, int64_t step) {
  return absl::StrFormat("%s/step_%08d.ckpt", dir, step);
}

std::vector<std::string> ListCheckpoints(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() == 18 && name.rfind("step_", 0) == 0 && name.substr(13) == ".ckpt")
      out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void PruneCheckpoints(const std::string& dir, int keep) {
  std::vector<std::string> all = ListCheckpoints(dir);
  for (size_t i = 0; keep >= 0 && i + static_cast<size_t>(keep) < all.size(); ++i)
    std::filesystem::remove(all[i]);
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0 && name.find(".ckpt.tmp.") != std::string::npos)
      std::filesystem::remove(e.path());
  }
}

}  // namespace cleave::trainer
