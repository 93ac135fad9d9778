// The scheduler's graphs of the backward's dK/dV kernels (scheduler/graphs/sm90_bwd_d*.graph)
// describe the kernels' shared memory as it is: each buffer's slot is the bytes the kernel's
// layout (WgSmem, WgSmem256 in src/sm90/bwd_dkdv_wgmma.cuh, shipped configuration) gives it, the capacity is what a
// block may use less the base's alignment slack, and the buffers at the kernel's own depths add up
// to the kernel's allocation. A change to either that the other does not follow fails here.
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "sm90/bwd_dkdv_wgmma.cuh"

namespace {

namespace bwd = fa4::sm90::bwd;

struct SmemModel {
  int64_t capacity = -1;
  std::map<std::string, int64_t> slot;  // buffer name -> slot bytes
};

// The `capacity smem` and `buffer NAME smem BYTES` lines of a graph.
SmemModel read_model(const std::string& graph) {
  const std::string path = std::string(FA4_SOURCE_DIR) + "/scheduler/graphs/" + graph + ".graph";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  SmemModel m;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key, name, pool;
    int64_t bytes = 0;
    ls >> key;
    if (key == "capacity" && (ls >> name >> bytes) && name == "smem") m.capacity = bytes;
    if (key == "buffer" && (ls >> name >> pool >> bytes) && pool == "smem") m.slot[name] = bytes;
  }
  return m;
}

constexpr int64_t kSlack = 1024;                        // the base moved up to 1024 bytes
constexpr int64_t kStepRows = 2 * bwd::kBlock * 4 + 16;  // LSE and D rows, the two mbarriers

template <int kD>
void expect_wg_model(const std::string& graph) {
  using L = bwd::WgSmem<bwd::BwdConfig<kD, true>>;  // the shipped configuration
  const SmemModel m = read_model(graph);
  EXPECT_EQ(m.capacity, 227 * 1024 - kSlack);
  EXPECT_EQ(m.slot.at("KV"), 2 * L::kKVBytes);
  EXPECT_EQ(m.slot.at("Ring"), 2 * L::kQBytes + kStepRows);
  EXPECT_EQ(m.slot.at("DsT"), L::kDsBytes);
  EXPECT_EQ(m.slot.at("Stage0"), bwd::kBlock * 64 * 4);
  EXPECT_EQ(m.slot.at("Stage1"), bwd::kBlock * 64 * 4);
  EXPECT_EQ(m.slot.at("KV") + L::kBufs * m.slot.at("Ring") + L::kDsBufs * m.slot.at("DsT") + 2 * m.slot.at("Stage0"),
            L::kBytes - kSlack);
}

TEST(BackwardModel, D64GraphHoldsTheKernelsSharedMemory) { expect_wg_model<64>("sm90_bwd_d64"); }
TEST(BackwardModel, D128GraphHoldsTheKernelsSharedMemory) { expect_wg_model<128>("sm90_bwd_d128"); }

TEST(BackwardModel, D256GraphHoldsTheKernelsSharedMemory) {
  using L = bwd::WgSmem256<bwd::BwdConfig<256, true>>;
  const SmemModel m = read_model("sm90_bwd_d256");
  EXPECT_EQ(m.capacity, 227 * 1024 - kSlack);
  EXPECT_EQ(m.slot.at("KV"), 2 * L::kTile);
  EXPECT_EQ(m.slot.at("Ring"), 2 * L::kQBytes + kStepRows);
  EXPECT_EQ(m.slot.at("PT"), L::kPBytes);
  EXPECT_EQ(m.slot.at("DsT"), L::kPBytes);
  // P^T and dS^T have two buffers each in the kernel.
  EXPECT_EQ(m.slot.at("KV") + L::kBufs * m.slot.at("Ring") + 2 * (m.slot.at("PT") + m.slot.at("DsT")), L::kBytes - kSlack);
}

}  // namespace
