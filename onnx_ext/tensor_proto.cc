// TensorProto decoding (typed fields, raw_data, external data via mmap) and encoding
// (always raw_data, little-endian as ONNX specifies) (onnx_ext/).
#include "onnx_ext/tensor_proto.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "base/shape.h"
#include "base/status.h"

namespace cleave::onnx_ext {

namespace {

// Maps [offset, offset+length) of a file read-only; the Tensor shares the mapping.
absl::StatusOr<Tensor> MapExternal(const onnx::TensorProto& p, DataType dtype,
                                   std::vector<int64_t> dims, const std::string& base_dir,
                                   const std::string& what) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& kv : p.external_data()) {
    if (kv.key() == "location") location = kv.value();
    else if (kv.key() == "offset") offset = std::stoll(kv.value());
    else if (kv.key() == "length") length = std::stoll(kv.value());
  }
  if (location.empty()) return InvalidArgument(what, ": external data has no 'location'");
  if (base_dir.empty())
    return InvalidArgument(what, ": external data '", location,
                           "' cannot be resolved for a model loaded from memory");
  std::filesystem::path path = std::filesystem::path(base_dir) / location;
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    return NotFound(what, ": external data file '", location, "' not found (looked for ",
                    path.string(), ")");
  struct stat st;
  ::fstat(fd, &st);
  size_t want = static_cast<size_t>(Product(dims)) * ElementSize(dtype);
  if (length >= 0 && static_cast<size_t>(length) != want) {
    ::close(fd);
    return InvalidArgument(what, ": external data length ", length, " does not match ", want,
                           " bytes for shape ", DimsToString(dims));
  }
  if (offset < 0 || static_cast<size_t>(offset) + want > static_cast<size_t>(st.st_size)) {
    ::close(fd);
    return InvalidArgument(what, ": external data file '", location, "' holds ", st.st_size,
                           " bytes, expected at least ", offset + static_cast<int64_t>(want),
                           " (offset ", offset, " + ", want, ")");
  }
  if (want == 0) {
    ::close(fd);
    return Tensor(dtype, dims);
  }
  // mmap needs a page-aligned offset: map from the page start and point inside it.
  long page = ::sysconf(_SC_PAGESIZE);
  int64_t aligned = offset / page * page;
  size_t map_len = want + static_cast<size_t>(offset - aligned);
  void* base = ::mmap(nullptr, map_len, PROT_READ, MAP_PRIVATE, fd, aligned);
  ::close(fd);
  if (base == MAP_FAILED) return Internal(what, ": cannot map external data ", path.string());
  std::shared_ptr<void> storage(base, [map_len](void* q) { ::munmap(q, map_len); });
  void* data = static_cast<char*>(base) + (offset - aligned);
  return Tensor(dtype, std::move(dims), std::move(storage), data);
}

template <typename Field, typename T>
absl::Status CopyTyped(const Field& f, Tensor& t, const std::string& what) {
  if (static_cast<int64_t>(f.size()) != t.numel())
    return InvalidArgument(what, ": holds ", f.size(), " values, expected ", t.numel(),
                           " for shape ", DimsToString(t.dims()));
  T* out = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = static_cast<T>(f.Get(static_cast<int>(i)));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Tensor> TensorFromProto(const onnx::TensorProto& p, const std::string& base_dir,
                                       const std::string& what) {
  DataType dtype = DataTypeFromInt(p.data_type());
  if (dtype == DataType::kUndefined || dtype == DataType::kString)
    return Unimplemented(what, ": tensor element type ", p.data_type(), " is not supported");
  std::vector<int64_t> dims(p.dims().begin(), p.dims().end());
  if (dims.size() > kMaxRank)
    return Unimplemented(what, ": rank ", dims.size(), " exceeds the maximum of ", kMaxRank);
  for (int64_t d : dims)
    if (d < 0) return InvalidArgument(what, ": negative dim in ", DimsToString(dims));
  if (p.data_location() == onnx::TensorProto::EXTERNAL)
    return MapExternal(p, dtype, std::move(dims), base_dir, what);
  Tensor t(dtype, dims);
  if (p.has_raw_data()) {
    if (p.raw_data().size() != t.nbytes())
      return InvalidArgument(what, ": raw_data holds ", p.raw_data().size(), " bytes, expected ",
                             t.nbytes(), " for ", DataTypeName(dtype), DimsToString(dims));
    if (t.nbytes()) std::memcpy(t.raw(), p.raw_data().data(), t.nbytes());
    return t;
  }
  if (t.numel() == 0) return t;
  switch (dtype) {
    case DataType::kFloat32: RETURN_IF_ERROR((CopyTyped<decltype(p.float_data()), float>(p.float_data(), t, what))); break;
    case DataType::kFloat64: RETURN_IF_ERROR((CopyTyped<decltype(p.double_data()), double>(p.double_data(), t, what))); break;
    case DataType::kInt64: RETURN_IF_ERROR((CopyTyped<decltype(p.int64_data()), int64_t>(p.int64_data(), t, what))); break;
    case DataType::kUInt64: RETURN_IF_ERROR((CopyTyped<decltype(p.uint64_data()), uint64_t>(p.uint64_data(), t, what))); break;
    case DataType::kUInt32: RETURN_IF_ERROR((CopyTyped<decltype(p.uint64_data()), uint32_t>(p.uint64_data(), t, what))); break;
    case DataType::kInt32: RETURN_IF_ERROR((CopyTyped<decltype(p.int32_data()), int32_t>(p.int32_data(), t, what))); break;
    case DataType::kInt16: RETURN_IF_ERROR((CopyTyped<decltype(p.int32_data()), int16_t>(p.int32_data(), t, what))); break;
    case DataType::kInt8: RETURN_IF_ERROR((CopyTyped<decltype(p.int32_data()), int8_t>(p.int32_data(), t, what))); break;
    case DataType::kUInt8: RETURN_IF_ERROR((CopyTyped<decltype(p.int32_data()), uint8_t>(p.int32_data(), t, what))); break;
    case DataType::kUInt16: case DataType::kFloat16: case DataType::kBFloat16:
      // 16-bit types keep their bit patterns in int32_data.
      RETURN_IF_ERROR((CopyTyped<decltype(p.int32_data()), uint16_t>(p.int32_data(), t, what)));
      break;
    case DataType::kBool: RETURN_IF_ERROR((CopyTyped<decltype(p.int32_data()), bool>(p.int32_data(), t, what))); break;
    default: return Unimplemented(what, ": cannot decode ", DataTypeName(dtype));
  }
  return t;
}

void TensorToProto(const Tensor& t, const std::string& name, onnx::TensorProto* p) {
  p->set_name(name);
  p->set_data_type(static_cast<int>(t.dtype()));
  for (int64_t d : t.dims()) p->add_dims(d);
  p->set_raw_data(std::string(static_cast<const char*>(t.raw()), t.nbytes()));
}

}  // namespace cleave::onnx_ext
