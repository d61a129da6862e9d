// The profiler (runtime/profiler.h): its Chrome trace and its summary, on events placed by
// hand so the sums are known.
#include "runtime/profiler.h"

#include "gtest/gtest.h"

namespace cleave::runtime {
namespace {

Profiler::Event At(const char* name, const char* category, int track, int64_t start, int64_t duration) {
  Profiler::Event e;
  e.name = name;
  e.category = category;
  e.track = track;
  e.start_us = start;
  e.duration_us = duration;
  return e;
}

TEST(Profiler, SummaryAddsUpCategoriesTracksAndOverlap) {
  Profiler p("rank 0", 0);
  const int compute = p.Track("compute"), comm = p.Track("gradient reduction");
  p.Add(At("mm1", "MatMul", compute, 0, 100));
  p.Add(At("mm2", "MatMul", compute, 150, 50));
  p.Add(At("gelu", "Gelu", compute, 100, 10));
  // 50..170: overlaps compute over 50..110 and 150..170, 80 us of its 120.
  p.Add(At("bucket", "comm", comm, 50, 120));
  const std::string s = p.Summary();
  EXPECT_NE(s.find("MatMul"), std::string::npos) << s;
  // MatMul: 2 calls, 0.150 ms, 75 us each, 150 of compute's 160 busy us.
  EXPECT_NE(s.find("       2       0.150       75.0   93.8%"), std::string::npos) << s;
  EXPECT_NE(s.find("track compute              busy 0.160 ms\n"), std::string::npos) << s;
  EXPECT_NE(s.find("track gradient reduction   busy 0.120 ms, 0.080 ms of it (67%) while compute ran"),
            std::string::npos)
      << s;
  // The busiest category comes first.
  EXPECT_LT(s.find("MatMul"), s.find("Gelu")) << s;
}

TEST(Profiler, KeepsEventsOnlyWhileEnabled) {
  Profiler p;
  const int t = p.Track("compute");
  p.set_enabled(false);
  p.Add(At("a", "Add", t, 0, 1));
  p.set_enabled(true);
  p.Add(At("b", "Add", t, 5, 1));
  ASSERT_EQ(p.events().size(), 1u);
  EXPECT_EQ(p.events()[0].name, "b");
  const std::string trace = p.ToChromeTrace();
  EXPECT_NE(trace.find("{\"ph\": \"X\", \"name\": \"b\", \"cat\": \"Add\", \"pid\": 0, \"tid\": 0, \"ts\": 5, \"dur\": 1}"),
            std::string::npos)
      << trace;
  EXPECT_EQ(trace.find("\"name\": \"a\""), std::string::npos);
}

}  // namespace
}  // namespace cleave::runtime
