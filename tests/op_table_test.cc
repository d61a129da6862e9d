// The op table is complete: every op has a CPU kernel (or is decomposed into ops that do), versions resolve as ONNX defines.
#include "graph/op_table.h"

#include "gtest/gtest.h"
#include "providers/cpu/cpu_provider.h"

namespace cleave::graph {
namespace {

TEST(OpTable, EveryOpHasACpuKernel) {
  providers::CpuExecutionProvider cpu(1);
  for (const OpDef& d : AllOps()) {
    if (d.decomposed)
      EXPECT_FALSE(cpu.registry().HasOp(d.domain, d.name)) << d.name << " is decomposed; a kernel would never run";
    else
      EXPECT_TRUE(cpu.registry().HasOp(d.domain, d.name)) << d.domain << "." << d.name << " has no CPU kernel";
  }
}

TEST(OpTable, VersionsAreSortedAndSupportedOneIsListed) {
  for (const OpDef& d : AllOps()) {
    EXPECT_TRUE(std::is_sorted(d.versions.begin(), d.versions.end())) << d.name;
    EXPECT_NE(std::find(d.versions.begin(), d.versions.end(), d.first_supported), d.versions.end())
        << d.name;
  }
}

TEST(OpTable, ResolvesTheNewestVersionNotAboveTheOpset) {
  const OpDef* add = FindOp("", "Add");
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(*ResolveVersion(*add, 13), 13);
  EXPECT_EQ(*ResolveVersion(*add, 17), 14);
  EXPECT_EQ(*ResolveVersion(*add, 8), 7);
  const OpDef* ln = FindOp("", "LayerNormalization");
  EXPECT_FALSE(ResolveVersion(*ln, 16).ok());  // LayerNormalization starts at 17
  EXPECT_EQ(*ResolveVersion(*ln, 21), 17);
  const OpDef* gelu = FindOp("", "Gelu");
  EXPECT_FALSE(ResolveVersion(*gelu, 17).ok());
  EXPECT_EQ(*ResolveVersion(*gelu, 20), 20);
  // A version older than cleave implements is refused with a reason.
  auto old = ResolveVersion(*FindOp("", "Reshape"), 4);
  ASSERT_FALSE(old.ok());
  EXPECT_NE(std::string(old.status().message()).find("version 1 "), std::string::npos) << old.status();
  EXPECT_FALSE(ResolveVersion(*add, kMaxKnownOpset + 1).ok());
}

TEST(OpTable, FindsCleaveDomainOps) {
  EXPECT_NE(FindOp("ai.cleave", "FusedMatMul"), nullptr);
  EXPECT_NE(FindOp("ai.onnx", "MatMul"), nullptr);
  EXPECT_EQ(FindOp("", "NoSuchOp"), nullptr);
}

}  // namespace
}  // namespace cleave::graph
