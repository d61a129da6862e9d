// Steady-state runs allocate nothing: after the first run with a set of input shapes has
// planned the arena, RunInto makes no heap allocation at all, in the session, the executor
// or any kernel. Counted by replacing global operator new in this test binary (kernels'
// buffers come from the arena or the executor's HeapBuffer, which RunStats counts).
#include <atomic>
#include <cstdlib>
#include <new>

#include "gtest/gtest.h"
#include "onnx_ext/onnx_io.h"
#include "runtime/inference_session.h"

namespace {
std::atomic<int64_t> g_news{0};
}

void* operator new(size_t n) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  g_news.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new[](size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(size_t n, std::align_val_t a) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  size_t align = static_cast<size_t>(a);
  if (void* p = std::aligned_alloc(align, (n + align - 1) / align * align)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n, std::align_val_t a) { return operator new(n, a); }
// Every form of delete frees what the matching new above took from malloc.
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }

namespace cleave {
namespace {

TEST(Allocation, SteadyStateRunIntoAllocatesNothing) {
  std::string dir = std::string(CLEAVE_SOURCE_DIR) + "/models/tiny_gpt";
  for (int threads : {1, 2}) {
    SessionOptions opts;
    opts.intra_op_threads = threads;
    auto s = InferenceSession::Load(dir + "/model.onnx", opts);
    ASSERT_TRUE(s.ok()) << s.status();
    auto in = onnx_ext::LoadTensorFile(dir + "/test_data_set_0/input_0.pb");
    ASSERT_TRUE(in.ok());
    Feeds feeds = {{"input_ids", in->second}};
    std::vector<Tensor> outs = {Tensor(DataType::kFloat32, {2, 64, 256})};
    ASSERT_TRUE((*s)->RunInto(feeds, outs).ok());  // plans the arena
    ASSERT_TRUE((*s)->RunInto(feeds, outs).ok());
    int64_t heap = (*s)->stats().heap_allocations;
    int64_t before = g_news.load();
    for (int i = 0; i < 3; ++i) ASSERT_TRUE((*s)->RunInto(feeds, outs).ok());
    EXPECT_EQ(g_news.load() - before, 0) << "operator new calls in 3 steady runs, " << threads
                                         << " thread(s)";
    EXPECT_EQ((*s)->stats().heap_allocations, heap);
  }
}

}  // namespace
}  // namespace cleave
