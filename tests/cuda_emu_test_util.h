// Helpers of the CUDA kernel tests over the emulated device (tests/cuda_emu_*_test.cc): arrays
// in stand-in device memory that ends at an inaccessible page (a kernel reading or writing past
// one faults), values stored as float32, bf16 or fp16, comparisons with a storage type's
// rounding, and the fixture that runs each test under one of the emulation's thread orders.
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "kernels/cuda/kernels.h"
#include "cuda_emu.h"  // last: it defines threadIdx and friends as macros

namespace cleave::emu_testing {

namespace ck = kernels::cuda;
namespace emu = cuda_emu;
using ck::Dt;

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();

// Stand-in device memory of `bytes`, ending (to a 16-byte multiple) where an inaccessible page
// begins, with another before it.
class DeviceMemory {
 public:
  explicit DeviceMemory(size_t bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t rounded = (bytes + 15) / 16 * 16;
    span_ = (rounded + page - 1) / page * page + 2 * page;
    void* p = mmap(nullptr, span_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    base_ = static_cast<char*>(p);
    mprotect(base_, page, PROT_NONE);
    mprotect(base_ + span_ - page, page, PROT_NONE);
    data_ = base_ + span_ - page - rounded;
  }
  ~DeviceMemory() {
    if (base_) munmap(base_, span_);
  }
  DeviceMemory(DeviceMemory&& o) noexcept : base_(o.base_), data_(o.data_), span_(o.span_) {
    o.base_ = o.data_ = nullptr;
    o.span_ = 0;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* data() const { return data_; }

 private:
  char* base_ = nullptr;
  char* data_ = nullptr;
  size_t span_ = 0;
};

// An array of T in stand-in device memory, filled with `fill`.
template <typename T>
class Array {
 public:
  explicit Array(int64_t n, T fill = T{}) : n_(n), mem_(static_cast<size_t>(n) * sizeof(T)) {
    for (int64_t i = 0; i < n; ++i) data()[i] = fill;
  }
  Array(std::initializer_list<T> v) : Array(static_cast<int64_t>(v.size())) {
    int64_t i = 0;
    for (const T& x : v) data()[i++] = x;
  }
  Array(Array&&) = default;
  T* data() const { return static_cast<T*>(mem_.data()); }
  T& operator[](int64_t i) const { return data()[i]; }
  int64_t size() const { return n_; }

 private:
  int64_t n_;
  DeviceMemory mem_;
};

inline size_t Bytes(Dt dt) { return dt == Dt::kF32 ? 4 : 2; }
inline float Round(Dt dt, float v) {
  if (dt == Dt::kBf16) return BFloat16ToFloat(FloatToBFloat16(v));
  if (dt == Dt::kF16) return HalfToFloat(FloatToHalf(v));
  return v;
}
inline const char* Name(Dt dt) { return dt == Dt::kF32 ? "float32" : dt == Dt::kBf16 ? "bfloat16" : "float16"; }

// n values stored as dt in stand-in device memory; NaN until set.
class Values {
 public:
  Values(Dt dt, int64_t n) : dt_(dt), n_(n), mem_(static_cast<size_t>(n) * Bytes(dt)) {
    for (int64_t i = 0; i < n; ++i) Set(i, kNaN);
  }
  Values(Dt dt, const std::vector<float>& v) : Values(dt, static_cast<int64_t>(v.size())) {
    for (int64_t i = 0; i < n_; ++i) Set(i, v[static_cast<size_t>(i)]);
  }
  float operator[](int64_t i) const {
    if (dt_ == Dt::kF32) return static_cast<const float*>(mem_.data())[i];
    const uint16_t b = static_cast<const uint16_t*>(mem_.data())[i];
    return dt_ == Dt::kBf16 ? BFloat16ToFloat(b) : HalfToFloat(b);
  }
  void Set(int64_t i, float v) {
    if (dt_ == Dt::kF32) static_cast<float*>(mem_.data())[i] = v;
    else static_cast<uint16_t*>(mem_.data())[i] = dt_ == Dt::kBf16 ? FloatToBFloat16(v) : FloatToHalf(v);
  }
  void* data() const { return mem_.data(); }
  int64_t size() const { return n_; }
  Dt dt() const { return dt_; }
  std::vector<double> Wide() const {
    std::vector<double> w(static_cast<size_t>(n_));
    for (int64_t i = 0; i < n_; ++i) w[static_cast<size_t>(i)] = (*this)[i];
    return w;
  }

 private:
  Dt dt_;
  int64_t n_;
  DeviceMemory mem_;
};

inline std::vector<float> Uniform(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(gen);
  return v;
}

inline std::string Text(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

// got[i] within atol + rtol |want[i]| of want[i], where rtol grows by a rounding of got's
// storage type (a bf16 result may round the other way from a fp32 value that differs by ulps).
template <typename Got>
::testing::AssertionResult Near(const Got& got, Dt dt, const std::vector<double>& want, double rtol, double atol) {
  const double unit = dt == Dt::kF32 ? 0.0 : dt == Dt::kBf16 ? 1.0 / 128 : 1.0 / 1024;
  if (dt == Dt::kF16) atol += std::ldexp(1.0, -24);  // fp16's subnormal spacing
  int bad = 0;
  std::string text;
  if (static_cast<int64_t>(want.size()) != got.size())
    return ::testing::AssertionFailure() << got.size() << " values, want " << want.size();
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[static_cast<int64_t>(i)], w = want[i];
    const bool same_special = (std::isnan(g) && std::isnan(w)) || (std::isinf(w) && g == w);
    if (same_special || std::abs(g - w) <= atol + (rtol + unit) * std::abs(w)) continue;
    if (++bad <= 5) text += "\n  [" + std::to_string(i) + "] " + Text(g) + " want " + Text(w);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << want.size() << " values differ (" << Name(dt)
                                       << ", rtol " << rtol << ", atol " << atol << "):" << text;
}

inline ::testing::AssertionResult Ok(int status) {
  if (status == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "launcher returned " << status << ": " << emu::LastFault();
}

inline ::testing::AssertionResult Exact(const Values& got, const std::vector<float>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    const float g = got[static_cast<int64_t>(i)];
    if (g == want[i] || (std::isnan(g) && std::isnan(want[i]))) continue;
    return ::testing::AssertionFailure() << "[" << i << "] " << g << " want " << want[i] << " (" << Name(got.dt())
                                         << ")";
  }
  return ::testing::AssertionSuccess();
}

// Every CudaEmu test runs once per thread order (instantiated in cuda_emu_kernels_test.cc).
class CudaEmu : public ::testing::TestWithParam<emu::Order> {
 protected:
  void SetUp() override {
    emu::SetOrder(GetParam(), 20261201);
    emu::ClearFault();
  }
};

inline constexpr Dt kDts[] = {Dt::kF32, Dt::kBf16, Dt::kF16};

}  // namespace cleave::emu_testing
