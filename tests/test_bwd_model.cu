// The scheduler's graphs of the backward's dK/dV kernels (scheduler/graphs/sm90_bwd_d*.graph)
// describe the kernels' shared memory as it is: each buffer's slot is the bytes the kernel's
// layout (WgSmem, WgSmemSplit in src/sm90/bwd_dkdv_wgmma.cuh, shipped configuration) gives it, the capacity is what a
// block may use less the base's alignment slack, and the buffers at the kernel's own depths add up
// to the kernel's allocation. A change to either that the other does not follow fails here.
// Also on the host: the dK/dV kernels' stmatrix stores of dS^T (and d256's P^T) put every pair
// where the per-pair stores did (BackwardLayout).
#include <cstdint>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "graph_model.h"
#include "sm90/bwd_dkdv_wgmma.cuh"

namespace {

namespace bwd = fa4::sm90::bwd;
using fa4_test::read_model;
using fa4_test::SmemModel;

constexpr int64_t kSlack = 1024;                        // the base moved up to 1024 bytes
constexpr int64_t kStepRows = 2 * bwd::kBlock * 4 + 16;  // LSE and D rows, the two mbarriers

template <int kD>
void expect_wg_model(const std::string& graph) {
  using Cfg = bwd::BwdConfig<kD, true>;  // the shipped configuration
  using L = bwd::WgSmem<Cfg>;
  const SmemModel m = read_model(graph);
  EXPECT_EQ(m.capacity, 227 * 1024 - kSlack);
  EXPECT_EQ(m.slot.at("KV"), 2 * L::kKVBytes + (Cfg::kKvTma ? 8 : 0));  // (+ the mbarrier K and V land on)
  EXPECT_EQ(m.slot.at("Ring"), 2 * L::kQBytes + kStepRows);
  // dQ a step behind (d64, d128): each dS^T buffer has its full and empty mbarriers.
  EXPECT_EQ(m.slot.at("DsT"), L::kDsBytes + (Cfg::kDqLag ? 16 : 0));
  if constexpr (Cfg::kDqPairSum) {  // (d64 before dQ by alternate warpgroups)
    // d64: one stage of two buffers (a step's parity each) holding the two warpgroups' summed dQ,
    // each with its half and free mbarriers.
    EXPECT_EQ(m.slot.at("Stage"), bwd::kBlock * 64 * 4 + 16);
    EXPECT_EQ(m.slot.at("KV") + L::kBufs * m.slot.at("Ring") + L::kDsBufs * m.slot.at("DsT") + 2 * m.slot.at("Stage"),
              L::kBytes - kSlack);
  } else if constexpr (Cfg::kDqAtomics) {
    // d64: dQ added from the registers, no stage.
    EXPECT_EQ(m.slot.count("Stage"), 0u);
    EXPECT_EQ(L::kStageBytes, 0);
    EXPECT_EQ(m.slot.at("KV") + L::kBufs * m.slot.at("Ring") + L::kDsBufs * m.slot.at("DsT"), L::kBytes - kSlack);
  } else {
    EXPECT_EQ(m.slot.at("Stage0"), bwd::kBlock * 64 * 4);
    EXPECT_EQ(m.slot.at("Stage1"), bwd::kBlock * 64 * 4);
    EXPECT_EQ(m.slot.at("KV") + L::kBufs * m.slot.at("Ring") + L::kDsBufs * m.slot.at("DsT") + 2 * m.slot.at("Stage0"),
              L::kBytes - kSlack);
  }
}

TEST(BackwardModel, D64GraphHoldsTheKernelsSharedMemory) { expect_wg_model<64>("sm90_bwd_d64"); }
TEST(BackwardModel, D128GraphHoldsTheKernelsSharedMemory) { expect_wg_model<128>("sm90_bwd_d128"); }

TEST(BackwardModel, D256GraphHoldsTheKernelsSharedMemory) {
  using Cfg = bwd::BwdConfig<256, true>;
  using L = bwd::WgSmemSplit<Cfg>;
  const SmemModel m = read_model("sm90_bwd_d256");
  EXPECT_EQ(m.capacity, 227 * 1024 - kSlack);
  EXPECT_EQ(m.slot.at("KV"), 2 * L::kTile + (Cfg::kKvTma ? 8 : 0));
  EXPECT_EQ(m.slot.at("Ring"), 2 * L::kQBytes + kStepRows);
  EXPECT_EQ(m.slot.at("PT"), L::kPBytes);
  EXPECT_EQ(m.slot.at("DsT"), L::kPBytes);
  // P^T and dS^T have two buffers each in the kernel.
  EXPECT_EQ(m.slot.at("KV") + L::kBufs * m.slot.at("Ring") + 2 * (m.slot.at("PT") + m.slot.at("DsT")), L::kBytes - kSlack);
}

// d192 (the split kernel's by-operand form): K and V of 64 keys, two step buffers, P^T and dS^T
// two buffers each, and each warpgroup's 16 KB stage for dQ's bulk reductions; with dq_atomics no
// stage.
template <class Cfg>
void expect_split_model(const std::string& graph) {
  using L = bwd::WgSmemSplit<Cfg>;
  static_assert(L::kDqStage, "the shipped d192 configuration stages dQ");
  const SmemModel m = read_model(graph);
  EXPECT_EQ(m.capacity, 227 * 1024 - kSlack);
  EXPECT_EQ(m.slot.at("KV"), L::kTile + L::kTileV + (Cfg::kKvTma ? 8 : 0));
  EXPECT_EQ(m.slot.at("Ring"), L::kQBytes + L::kDoBytes + kStepRows);
  EXPECT_EQ(m.slot.at("PT"), L::kPBytes);
  EXPECT_EQ(m.slot.at("DsT"), L::kPBytes);
  EXPECT_EQ(m.slot.at("Stage0"), bwd::kBlock * 64 * 4);
  EXPECT_EQ(m.slot.at("Stage1"), bwd::kBlock * 64 * 4);
  EXPECT_EQ(m.slot.at("KV") + L::kBufs * m.slot.at("Ring") + 2 * (m.slot.at("PT") + m.slot.at("DsT")) +
                m.slot.at("Stage0") + m.slot.at("Stage1"),
            L::kBytes - kSlack);
  using Atomics = bwd::BwdConfig<192, true, bwd::bwd_knobs(192, [](bwd::BwdKnobs& k) { k.dq_atomics = true; }), Cfg::kDv>;
  EXPECT_EQ(bwd::WgSmemSplit<Atomics>::kStageBytes, 0);
  EXPECT_EQ(bwd::WgSmemSplit<Atomics>::kBytes, L::kBytes - 2 * bwd::kBlock * 64 * 4);
}
TEST(BackwardModel, D192GraphHoldsTheKernelsSharedMemory) { expect_split_model<bwd::BwdConfig<192, true>>("sm90_bwd_d192"); }
TEST(BackwardModel, D192V128GraphHoldsTheKernelsSharedMemory) {
  expect_split_model<bwd::BwdConfig<192, true, bwd::bwd_knobs(192), 128>>("sm90_bwd_d192_v128");
}

// Every dK/dV configuration the probe runs (shipped and candidates) lays out its shared memory
// soundly: the swizzled tiles on 1024-byte boundaries (the 128-byte swizzle's atom), the row
// statistics on 16 bytes (bulk copies), the mbarriers on 8, the regions in order without overlap,
// and the whole within 227 KB with the base's alignment slack.
template <class L>
constexpr int v_tile_bytes() {  // V's tile: K's but in the split kernel at 192 / 128
  if constexpr (requires { L::kTileV; }) return L::kTileV;
  else return L::kV - L::kK;
}
template <class L>
void expect_sound_layout(const char* name) {
  const int tiles[] = {L::kK, L::kV, L::kQ, L::kDo};
  for (int off : tiles) EXPECT_EQ(off % 1024, 0) << name << " offset " << off;
  EXPECT_EQ(L::kLse % 16, 0) << name;
  EXPECT_EQ(L::kDelta % 16, 0) << name;
  EXPECT_EQ(L::kBars % 8, 0) << name;
  EXPECT_LT(L::kK, L::kV) << name;
  EXPECT_LE(L::kV + v_tile_bytes<L>(), L::kQ) << name;
  EXPECT_LE(L::kQ + L::kBufs * L::kQBytes, L::kDo) << name;
  EXPECT_LE(L::kLse + L::kBufs * bwd::kBlock * 4, L::kDelta) << name;
  EXPECT_LE(L::kDelta + L::kBufs * bwd::kBlock * 4, L::kBars) << name;
  EXPECT_LE(L::kBytes, 227 * 1024) << name;
}

template <class Cfg>
void expect_sound_wg(const char* name) {
  using L = bwd::WgSmem<Cfg>;
  expect_sound_layout<L>(name);
  EXPECT_EQ(L::kDs % 1024, 0) << name;
  EXPECT_EQ(L::kStage % 16, 0) << name;
  EXPECT_LE(L::kDo + L::kBufs * L::kQBytes, L::kDs) << name;
  EXPECT_LE(L::kDs + L::kDsBufs * L::kDsBytes, L::kStage) << name;
  EXPECT_LE(L::kStage + (Cfg::kDqAtomics ? 0 : 2 * L::kDqPieces * bwd::kBlock * 64 * 4), L::kLse) << name;
  EXPECT_EQ(L::kDsBars, L::kBars + 2 * L::kBufs * 8) << name;  // dS^T's mbarriers after the ring's
  EXPECT_EQ(L::kPairBars, L::kDsBars + (Cfg::kDqLag ? 2 * L::kDsBufs * 8 : 0)) << name;
  EXPECT_EQ(L::kKvBar, L::kPairBars + (Cfg::kDqPairSum ? 32 : 0)) << name;  // then K and V's (kv_tma)
  EXPECT_EQ(L::kBytes, L::kKvBar + (Cfg::kKvTma ? 8 : 0) + 1024) << name;
}

template <class Cfg>
void expect_sound_split(const char* name) {
  using L = bwd::WgSmemSplit<Cfg>;
  expect_sound_layout<L>(name);
  EXPECT_EQ(L::kPt % 1024, 0) << name;  // P^T and dS^T are SS wgmma operands too
  EXPECT_EQ(L::kDst % 1024, 0) << name;
  EXPECT_LE(L::kDo + L::kBufs * L::kDoBytes, L::kPt) << name;
  EXPECT_EQ(L::kDoBytes, bwd::kBlock * Cfg::kDv * 2) << name;
  EXPECT_LE(L::kPt + 2 * L::kPBytes, L::kDst) << name;
  EXPECT_LE(L::kDst + 2 * L::kPBytes, L::kStage) << name;
  EXPECT_EQ(L::kStage % 16, 0) << name;  // (bulk reductions read the stage)
  EXPECT_LE(L::kStage + L::kStageBytes, L::kLse) << name;
  EXPECT_EQ(L::kKvBar, L::kBars + 2 * L::kBufs * 8) << name;  // K and V's mbarrier after the ring's
  EXPECT_EQ(L::kBytes, L::kKvBar + (Cfg::kKvTma ? 8 : 0) + 1024) << name;
}

// The configurations the probe has measured (docs/perf-notes.md), as knobs edited from the shipped.
using bwd::bwd_knobs;
using bwd::BwdKnobs;
// d64 before dQ by alternate warpgroups: dQ by keys, partials summed, in lockstep.
constexpr void pair_sum_form(BwdKnobs& k) {
  k.dq_alternate = k.dq_atomics = false;
  k.dq_by_keys = k.dq_pair_sum = true;
  k.dq_lag_bufs = k.skew = k.load_issue = 0;
  k.step_cursor = false;
}
constexpr BwdKnobs kD64PairSum = bwd_knobs(64, pair_sum_form);
constexpr BwdKnobs kD64TwoBufs = bwd_knobs(64, [](BwdKnobs& k) { pair_sum_form(k), k.step_bufs = 2; });
constexpr BwdKnobs kD64Paired = bwd_knobs(64, [](BwdKnobs& k) { pair_sum_form(k), k.paired_stats = true; });
constexpr BwdKnobs kD64TwoReductions = bwd_knobs(64, [](BwdKnobs& k) { pair_sum_form(k), k.dq_pair_sum = false; });
constexpr BwdKnobs kD64LoadingWarp = bwd_knobs(64, [](BwdKnobs& k) { k.load_issue = 2; });
constexpr BwdKnobs kD64AlternateTwoDs = bwd_knobs(64, [](BwdKnobs& k) { k.dq_lag_bufs = 2; });
constexpr BwdKnobs kD64AlternateStaged = bwd_knobs(64, [](BwdKnobs& k) { k.dq_atomics = false; });
constexpr BwdKnobs kD128Lockstep = bwd_knobs(128, [](BwdKnobs& k) { k.step_bufs = 2, k.dq_lag_bufs = 0, k.skew = 0; });
constexpr BwdKnobs kD128LagTogether = bwd_knobs(128, [](BwdKnobs& k) { k.skew = 0; });
constexpr BwdKnobs kD128ThreeDs = bwd_knobs(128, [](BwdKnobs& k) { k.step_bufs = 2, k.dq_lag_bufs = 3; });
constexpr BwdKnobs kD128Unfolded = bwd_knobs(128, [](BwdKnobs& k) { k.folded_boxes = false; });
constexpr BwdKnobs kD128ByKeys = bwd_knobs(128, [](BwdKnobs& k) {
  k.step_bufs = 2, k.dq_by_keys = true, k.dq_lag_bufs = 0, k.skew = 0, k.kv_tma = false;
});
constexpr BwdKnobs kD128Paired = bwd_knobs(128, [](BwdKnobs& k) { k.paired_stats = true; });
constexpr BwdKnobs kD256Unfolded = bwd_knobs(256, [](BwdKnobs& k) { k.folded_boxes = false; });
constexpr BwdKnobs kD256Paired = bwd_knobs(256, [](BwdKnobs& k) { k.paired_stats = true; });
constexpr BwdKnobs kD192Atomics = bwd_knobs(192, [](BwdKnobs& k) { k.dq_atomics = true; });
constexpr BwdKnobs kD192StShared = bwd_knobs(192, [](BwdKnobs& k) { k.stmatrix = false; });

TEST(BackwardModel, EveryProbeConfigurationHasASoundLayout) {
  using bwd::BwdConfig;
  expect_sound_wg<BwdConfig<64, true>>("d64 shipped");
  expect_sound_wg<BwdConfig<64, true, kD64PairSum>>("d64 partials summed");
  expect_sound_wg<BwdConfig<64, true, kD64AlternateTwoDs>>("d64 alternate, two dS^T buffers");
  expect_sound_wg<BwdConfig<64, true, kD64AlternateStaged>>("d64 alternate, staged and reduced");
  expect_sound_wg<BwdConfig<64, true, kD64TwoBufs>>("d64 two step buffers");
  expect_sound_wg<BwdConfig<64, true, kD64Paired>>("d64 paired");
  expect_sound_wg<BwdConfig<64, true, kD64TwoReductions>>("d64 a reduction of each partial");
  expect_sound_wg<BwdConfig<64, true, kD64LoadingWarp>>("d64 a loading warpgroup");
  expect_sound_wg<BwdConfig<128, true>>("d128 shipped");
  expect_sound_wg<BwdConfig<128, true, kD128Lockstep>>("d128 lockstep (dQ in its step)");
  expect_sound_wg<BwdConfig<128, true, kD128LagTogether>>("d128 dQ a step behind, together");
  expect_sound_wg<BwdConfig<128, true, kD128ThreeDs>>("d128 three dS^T buffers");
  expect_sound_wg<BwdConfig<128, true, kD128Unfolded>>("d128 unfolded");
  expect_sound_wg<BwdConfig<128, true, kD128ByKeys>>("d128 dQ by keys");
  expect_sound_wg<BwdConfig<128, true, kD128Paired>>("d128 folded paired");
  expect_sound_split<BwdConfig<192, true>>("d192 (staged dQ)");
  expect_sound_split<BwdConfig<192, true, kD192Atomics>>("d192 dQ by atomics");
  expect_sound_split<BwdConfig<192, true, kD192StShared>>("d192 st.shared");
  expect_sound_split<BwdConfig<192, true, bwd_knobs(192), 128>>("192 / 128");
  expect_sound_split<BwdConfig<192, true, kD192Atomics, 128>>("192 / 128 dQ by atomics");
  // 192 / 128: V and two dO buffers of 128 columns, 24 KB less than d192's.
  using Square = bwd::WgSmemSplit<BwdConfig<192, true>>;
  using Narrow = bwd::WgSmemSplit<BwdConfig<192, true, bwd_knobs(192), 128>>;
  EXPECT_EQ(Square::kBytes - Narrow::kBytes, 3 * bwd::kBlock * 64 * 2);
  expect_sound_split<BwdConfig<256, true>>("d256 shipped");
  expect_sound_split<BwdConfig<256, true, kD256Unfolded>>("d256 unfolded");
  expect_sound_split<BwdConfig<256, true, kD256Paired>>("d256 folded paired");
  // dQ by keys at d128: two 64 x 64 pieces a warpgroup, one dS^T buffer.
  using ByKeys = bwd::WgSmem<BwdConfig<128, true, kD128ByKeys>>;
  EXPECT_EQ(ByKeys::kDqPieces, 2);
  EXPECT_EQ(ByKeys::kDsBufs, 1);
  EXPECT_EQ(ByKeys::kBytes, 215072);  // docs/perf-notes.md: "215,072 bytes"
  // dQ by alternate warpgroups at d64, added by atomics: four dS^T buffers and no stage.
  using Alternate = bwd::WgSmem<BwdConfig<64, true>>;
  EXPECT_EQ(Alternate::kDsBufs, 4);
  EXPECT_EQ(Alternate::kStageBytes, 0);
  using Staged = bwd::WgSmem<BwdConfig<64, true, kD64AlternateStaged>>;
  EXPECT_EQ(Staged::kStageBytes, 2 * bwd::kBlock * 64 * 4);
}

// stsm_rows puts each of a warp's accumulator-layout pairs where a 32-bit store of the pair did:
// stmatrix's lane 8i + r gives row r of block i's address, and thread t's register i lands in that
// block's row t / 4 at bytes 4 (t % 4); the pair v[2jj + h] of thread t is row row0 + t / 4 + 8h,
// columns col0 + 8jj + 2 (t % 4) (the wgmma accumulator's layout). Every pair lands once.
template <int kRows, int kChunks>
void expect_stsm_rows_layout(int row0, int col0) {
  std::set<uint32_t> seen;
  for (int j = 0; j < kChunks; j += 2)
    for (int i = 0; i < 4; ++i)
      for (int t = 0; t < 32; ++t) {
        const uint32_t at = bwd::stsm_row_addr<kRows>(j, row0, col0, 8 * i + t / 4) + 4 * (t % 4);
        const int jj = j + i / 2, h = i % 2;  // the pair v[2j + i] = v[2jj + h]
        EXPECT_EQ(at, bwd::sw128<kRows>(row0 + t / 4 + 8 * h, col0 + 8 * jj + 2 * (t % 4)))
            << "instruction " << j << " block " << i << " thread " << t;
        EXPECT_TRUE(seen.insert(at).second) << "two pairs at byte " << at;
      }
  EXPECT_EQ(seen.size(), size_t(2 * kChunks * 32));
}

TEST(BackwardLayout, StmatrixPairsLandWhereTheirStoresDid) {
  // d64/d128: a warp's 16 keys of warpgroup 1's dS^T, all 64 queries; d256: 32 queries from 32.
  for (int warp = 0; warp < 4; ++warp) {
    expect_stsm_rows_layout<bwd::kWgKeys, 8>(64 + 16 * warp, 0);
    expect_stsm_rows_layout<bwd::kBlock, 4>(16 * warp, 32);
  }
}

// d192's index arithmetic (bwd_dkdv_split_kernel, D's kernel), on the host:
// - the final dK or dV tile of 64 keys x 192 columns, stored by stmatrix (24 chunks a warp) and
//   read back 16 bytes a thread (store_rows_staged), covers the three 64-column blocks of the
//   24 KB buffer it goes through, every 16-byte piece once;
// - dQ's three pieces of a step go one to each of (s + c) % 2's warpgroups: each piece once,
//   two and one, swapped every step;
// - D's kernel takes a row a warp at 192 (its last eight lanes idle), eight rows a CTA.
TEST(BackwardLayout, D192TilesPiecesAndRows) {
  constexpr int kCols = 192;
  for (int warp = 0; warp < 4; ++warp) expect_stsm_rows_layout<bwd::kBlock, kCols / 8>(16 * warp, 0);
  std::set<uint32_t> read;
  constexpr int kRowChunks = kCols / 8;
  for (int i = 0; i < 64 * kRowChunks / 128; ++i)
    for (int tid = 0; tid < 128; ++tid) {
      const int idx = i * 128 + tid, r = idx / kRowChunks, c = idx % kRowChunks * 8;
      const uint32_t at = bwd::sw128<bwd::kBlock>(r, c);
      EXPECT_LT(at, uint32_t(bwd::kBlock * kCols * 2));
      EXPECT_EQ(at % 16, 0u);
      EXPECT_TRUE(read.insert(at).second) << "row " << r << " column " << c;
    }
  EXPECT_EQ(read.size(), size_t(bwd::kBlock * kCols * 2 / 16));
  for (int s = 0; s < 4; ++s) {
    int pieces[2] = {0, 0};
    for (int c = 0; c < kCols / 64; ++c) ++pieces[(s + c) & 1];
    EXPECT_EQ(pieces[s & 1], 2) << "step " << s;
    EXPECT_EQ(pieces[(s + 1) & 1], 1) << "step " << s;
  }
  static_assert(bwd::kDeltaLanes<192> == 32 && bwd::kDeltaRowsPerCta<192> == 8);
  static_assert(bwd::kDeltaLanes<64> == 8 && bwd::kDeltaLanes<128> == 16 && bwd::kDeltaLanes<256> == 32);
  static_assert(128 % bwd::kDeltaRowsPerCta<192> == 0, "a CTA's rows divide the workspace's row padding");
  std::set<int> cols;
  for (int lane = 0; lane < 32; ++lane) {
    const int c = (lane % bwd::kDeltaLanes<192>) * 8;
    if (c < 192) EXPECT_TRUE(cols.insert(c).second) << "lane " << lane;
  }
  EXPECT_EQ(cols.size(), 24u);
}

// The dK/dV kernels' walks over their query heads and blocks: stepped by a cursor (first, next) or
// found from the step's index (at), they agree, and take every (head, block) step of the group's
// heads over the blocks [lo, lo + count) once, in order.
struct Cursor {  // walk_step's configuration: the cursor's step
  static constexpr bool kStepCursor = true;
};
struct Index {  // the step found from its index
  static constexpr bool kStepCursor = false;
};
TEST(BackwardWalk, CursorAndIndexTakeEveryStepOnce) {
  for (int group : {1, 3})
    for (int lo : {0, 2})
      for (int count = 1; count <= 9; ++count) {
        const bwd::Walk w{0, 1, group, lo, count};
        ASSERT_EQ(w.steps(), group * count);
        std::set<std::pair<int, int>> seen;
        bwd::StepAt c = w.first();
        for (int s = 0; s < w.steps(); ++s, c = w.next(c)) {
          const bwd::StepAt i = bwd::walk_step<Index>(w, s, c), k = bwd::walk_step<Cursor>(w, s, c);
          EXPECT_EQ(k.h, i.h) << group << " " << lo << " " << count << " " << s;
          EXPECT_EQ(k.q0, i.q0) << group << " " << lo << " " << count << " " << s;
          EXPECT_EQ(c.h, group + s / count);  // KV head 1's query heads, one after another
          EXPECT_EQ(c.q0, (lo + s % count) * bwd::kBlock);
          EXPECT_EQ(c.left, count - 1 - s % count);
          EXPECT_TRUE(seen.insert({c.h, c.q0}).second) << "step " << s << " repeats";
        }
        EXPECT_EQ(int(seen.size()), w.steps());
      }
}

}  // namespace
