// The sm90 forward against the float64 reference, through the public API.
//
// Criterion (DESIGN.md §3): max|out - ref64| <= 2 max|plain16 - ref64| + 1e-3, where plain16 is a
// plain attention in the same 16-bit type, and ||out - ref64|| / ||ref64|| <= 1e-2. Outputs are
// poisoned (NaN) before every run, so an element the kernel never writes fails the check.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "common/validate.h"
#include "convert.h"
#include "device_tensor.h"
#include "fa4/attention.h"
#include "gpu_guard.h"
#include "lagged_kernels.h"
#include "test_support.h"
#include "reference.h"
#include "sm90/decode_plan.h"
#include "sm90/fwd_launch.cuh"

namespace {

using fa4_test::DeviceTensor;
using fa4_test::Layout;

struct Case {
  fa4::DType dtype;
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  bool causal;
  int64_t left = -1, right = -1;
  Layout layout = Layout::kBSHD;
  // Key j scaled by 1 + key_ramp * (seqlen_k - 1 - j) / seqlen_k: scores grow toward the first keys,
  // which the kernel visits last, so a row's max keeps rising past the rescale threshold.
  double key_ramp = 0.0;
  // Every key times key_scale: scores spread by tens of log2 units within a row of one block.
  double key_scale = 1.0;
  // 0: through the public API; 1 or 2: the sm90 launch with FwdParams::cluster set (1: one CTA a
  // tile, 2: clusters of two sharing K/V wherever the tiles allow).
  int cluster = 0;
  // With either set, also through the sm90 launch: FwdParams::split (1 never, 2 whenever the last
  // round is partial) and FwdParams::max_ctas (a small grid, so small problems take rounds).
  int split = 0;
  int max_ctas = 0;
  // Also through the sm90 launch where set: FwdParams::diagonal_last (1 never, 2 the last round, 3
  // every round).
  int diagonal_last = 0;
  // Problem::softcap (0: off).
  float softcap = 0.0f;
  // Through the sm90 launch where set: FwdParams::decode (1: the tile kernels, 2: the decoding
  // kernel wherever it runs). With cluster, split, max_ctas or diagonal_last set (the tile
  // kernels' knobs) and decode 0, the tile kernels (1).
  int decode = 0;
  // Set: the launch in its place (through FwdParams, with cluster, split, max_ctas and
  // diagonal_last applied).
  fa4::Status (*launch)(const fa4::detail::FwdParams&, cudaStream_t) = nullptr;
  // Attention sinks (ForwardArgs::sink): with sink_scale > 0 each query head's sink is drawn from
  // N(sink_shift, sink_scale) (the scores' units), with -inf for head 1 (no sink) where heads_q > 1.
  double sink_scale = 0.0, sink_shift = 0.0;
  // Through the public API with the workspace forward_workspace_size asks for (poisoned first):
  // at a head dim without a kernel, the zero-padded copies there instead of from cudaMallocAsync.
  bool workspace = false;
  // Fail when a padding slot around O (Layout::kPadded) lost its poison.
  bool check_padding = false;
  // Problem::head_dim_v: v's and o's head dim (0: head_dim's).
  int64_t head_dim_v = 0;

  std::string name() const {
    static const char* kLayouts[] = {"bshd", "bhsd", "padded"};
    return std::string(fa4::to_string(dtype)) + " b" + std::to_string(batch) + " sq" + std::to_string(seqlen_q) +
           " sk" + std::to_string(seqlen_k) + " h" + std::to_string(heads_q) + "/" + std::to_string(heads_kv) +
           " d" + std::to_string(head_dim) + (causal ? " causal" : "") + " win(" + std::to_string(left) + "," +
           std::to_string(right) + ") " + kLayouts[int(layout)] +
           (key_ramp > 0 ? " key_ramp " + std::to_string(key_ramp) : "") +
           (key_scale != 1.0 ? " key_scale " + std::to_string(key_scale) : "") +
           (cluster > 0 ? " cluster " + std::to_string(cluster) : "") +
           (split > 0 ? " split " + std::to_string(split) : "") + (max_ctas > 0 ? " ctas " + std::to_string(max_ctas) : "") +
           (diagonal_last > 0 ? " diagonal_last " + std::to_string(diagonal_last) : "") +
           (softcap > 0 ? " softcap " + std::to_string(softcap) : "") +
           (decode > 0 ? " decode " + std::to_string(decode) : "") +
           (sink_scale > 0 ? " sink N(" + std::to_string(sink_shift) + ", " + std::to_string(sink_scale) + ")" : "") +
           (workspace ? " workspace" : "") + (head_dim_v > 0 ? " dv" + std::to_string(head_dim_v) : "");
  }
};

// Runs case c and checks O and LSE against the float64 reference; O and LSE land in *o_out and
// *lse_out when given.
// Case c's problem.
fa4::Problem problem_of(const Case& c) {
  fa4::Problem p = fa4::test::make_problem(c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, c.head_dim, c.dtype);
  p.causal = c.causal;
  p.window_left = c.left;
  p.window_right = c.right;
  p.softcap = c.softcap;
  p.head_dim_v = c.head_dim_v;
  return p;
}

void run_case(const Case& c, uint32_t seed, std::vector<double>* o_out = nullptr, std::vector<float>* lse_out = nullptr) {
  SCOPED_TRACE(c.name() + " seed " + std::to_string(seed));
  const fa4::Problem p = problem_of(c);

  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto random = [&](int64_t n) {
    std::vector<double> x(n);
    for (double& v : x) v = fa4::ref::round_to(c.dtype, float(normal(rng)));
    return x;
  };
  const std::vector<double> q = random(fa4::ref::q_elems(p));
  std::vector<double> k = random(fa4::ref::kv_elems(p));
  const std::vector<double> v = random(fa4::ref::v_elems(p));
  if (c.key_scale != 1.0)
    for (double& e : k) e = fa4::ref::round_to(c.dtype, float(e * c.key_scale));
  if (c.key_ramp > 0)
    for (int64_t i = 0; i < c.batch; ++i)
      for (int64_t j = 0; j < c.seqlen_k; ++j)
        for (int64_t h = 0; h < c.heads_kv; ++h)
          for (int64_t x = 0; x < c.head_dim; ++x) {
            double& e = k[((i * c.seqlen_k + j) * c.heads_kv + h) * c.head_dim + x];
            e = fa4::ref::round_to(c.dtype, float(e * (1.0 + c.key_ramp * double(c.seqlen_k - 1 - j) / c.seqlen_k)));
          }

  DeviceTensor dq, dk, dv, dout;
  ASSERT_NO_FATAL_FAILURE(dq.make(c.layout, c.batch, c.seqlen_q, c.heads_q, c.head_dim));
  ASSERT_NO_FATAL_FAILURE(dk.make(c.layout, c.batch, c.seqlen_k, c.heads_kv, c.head_dim));
  ASSERT_NO_FATAL_FAILURE(dv.make(c.layout, c.batch, c.seqlen_k, c.heads_kv, p.value_dim()));
  ASSERT_NO_FATAL_FAILURE(dout.make(c.layout, c.batch, c.seqlen_q, c.heads_q, p.value_dim()));
  ASSERT_NO_FATAL_FAILURE(dq.upload(c.dtype, q));
  ASSERT_NO_FATAL_FAILURE(dk.upload(c.dtype, k));
  ASSERT_NO_FATAL_FAILURE(dv.upload(c.dtype, v));
  ASSERT_NO_FATAL_FAILURE(dout.poison());  // NaN in both 16-bit types
  std::vector<double> sink;
  float* d_sink = nullptr;
  if (c.sink_scale > 0) {
    std::vector<float> s32(size_t(c.heads_q));
    for (int64_t h = 0; h < c.heads_q; ++h) {
      s32[size_t(h)] = h == 1 ? -INFINITY : float(c.sink_shift + c.sink_scale * normal(rng));
      sink.push_back(s32[size_t(h)]);
    }
    CUDA_OK(cudaMalloc(&d_sink, s32.size() * 4));
    CUDA_OK(cudaMemcpy(d_sink, s32.data(), s32.size() * 4, cudaMemcpyHostToDevice));
  }
  float* lse = nullptr;
  const int64_t n_lse = fa4::ref::lse_elems(p);
  CUDA_OK(cudaMalloc(&lse, n_lse * 4));
  CUDA_OK(cudaMemset(lse, 0xFF, n_lse * 4));

  fa4::ForwardArgs args;
  args.problem = p;
  args.q = dq.ref;
  args.k = dk.ref;
  args.v = dv.ref;
  args.o = dout.ref;
  args.lse = lse;
  args.sink = d_sink;
  fa4::Status st;
  fa4_test::DeviceBuffer workspace;
  if (c.workspace) {
    ASSERT_TRUE((st = fa4::forward_workspace_size(args, &args.workspace_bytes)).ok()) << st.message;
    if (args.workspace_bytes > 0) {
      CUDA_OK(cudaMalloc(&workspace.ptr, args.workspace_bytes));
      CUDA_OK(cudaMemset(workspace.ptr, 0xFF, args.workspace_bytes));
    }
    args.workspace = workspace.ptr;
  }
  if (c.cluster == 0 && c.split == 0 && c.max_ctas == 0 && c.diagonal_last == 0 && c.decode == 0 && c.launch == nullptr) {
    st = fa4::forward(args, nullptr);
  } else {
    st = fa4::validate(args);
    ASSERT_TRUE(st.ok()) << st.message;
    fa4::detail::FwdParams fp = fa4::detail::make_fwd_params(args);
    fp.cluster = c.cluster;
    fp.split = c.split;
    fp.max_ctas = c.max_ctas;
    fp.diagonal_last = c.diagonal_last;
    fp.decode = c.decode != 0 ? c.decode : 1;
    st = c.launch ? c.launch(fp, nullptr) : fa4::detail::sm90_forward(fp, nullptr);
  }
  ASSERT_TRUE(st.ok()) << st.message;
  fa4_test::finish_or_exit(c.name());
  CUDA_OK(cudaDeviceSynchronize());

  std::vector<double> out;
  int64_t padding_written = 0;  // checked where the case asks for it
  ASSERT_NO_FATAL_FAILURE(dout.download(c.dtype, &out, &padding_written));
  if (c.check_padding) EXPECT_EQ(padding_written, 0) << "o: padding slots written";
  std::vector<float> lse_f(n_lse);
  CUDA_OK(cudaMemcpy(lse_f.data(), lse, n_lse * 4, cudaMemcpyDeviceToHost));
  cudaFree(lse);
  cudaFree(d_sink);

  const fa4::ref::Forward64 ref = fa4::test::expect_forward_matches(p, q, k, v, out, sink);

  fa4::test::LseCompare lse_cmp;
  for (int64_t i = 0; i < n_lse; ++i) lse_cmp.add(ref.lse[i], lse_f[i]);
  EXPECT_EQ(lse_cmp.mismatch, 0) << "rows whose LSE is -inf in one and finite (or NaN) in the other";
  EXPECT_LE(lse_cmp.max_err, 1e-3);
  if (o_out != nullptr) *o_out = out;
  if (lse_out != nullptr) *lse_out = lse_f;
}

using fa4::DType;
constexpr auto BF16 = DType::kBF16;
constexpr auto FP16 = DType::kFP16;

TEST(ForwardGpu, OddSizesEveryHeadDim) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 1;
  for (int64_t d : {64, 128, 192, 256})
    for (int64_t s : {1, 17, 128, 239, 1000}) run_case({BF16, 2, s, s, 2, 2, d, false}, seed++);
}

// Head dims without a kernel of their own, on the next one's over zero-padded copies
// (common/pad.h): 8 and 40 on d64's kernels, 72 and 96 on d128's, 136 to 248 on d256's; tails,
// causal both ways of a length mismatch, O between a spare head and spare rows (Layout::kPadded:
// the copy back writes only the head_dim columns of each row), BHSD, fp16, GQA and MQA, windows,
// decoding (folded query groups, the decoding kernel), sinks and a soft cap; the copies in the
// workspace and from cudaMallocAsync. The scale is the caller's head dim's, 1/sqrt(head_dim): the
// kernel head dim's would fail the float64 check.
TEST(ForwardGpu, PaddedHeadDims) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 5000;
  for (int64_t d : {8, 40, 72, 96, 136, 184, 200, 248})  // (136, 184 on d192's kernels)
    for (bool causal : {false, true}) {
      Case c{BF16, 2, 239, 300, 4, 2, d, causal};
      c.layout = Layout::kPadded, c.check_padding = true;
      c.workspace = causal;
      run_case(c, seed++);
    }
  run_case({FP16, 1, 300, 120, 2, 1, 96, true}, seed++);  // causal rows without keys
  Case bhsd{FP16, 2, 128, 1000, 8, 1, 80, false};
  bhsd.layout = Layout::kBHSD;
  run_case(bhsd, seed++);
  run_case({BF16, 1, 700, 700, 2, 2, 160, false, 100, 0}, seed++);
  for (int64_t d : {96, 160, 224}) {
    run_case({BF16, 3, 1, 1000, 8, 2, d, false}, seed++);   // one query row: the group folded
    run_case({BF16, 2, 4, 2000, 16, 2, d, true}, seed++);   // a few rows: the rows folded
    Case sinks{BF16, 2, 200, 333, 4, 2, d, true};
    sinks.sink_scale = 1.0;
    run_case(sinks, seed++);
    Case capped{FP16, 1, 257, 257, 2, 2, d, false};
    capped.key_scale = 6.0, capped.softcap = 7.5f;
    run_case(capped, seed++);
  }
  // Two head dims (Problem::head_dim_v): DeepSeek's 192 / 128 on d192's kernels, a wider value side
  // (64 / 128 on d128's), both without a kernel of their own (40 / 72), decoding and causal rows.
  const std::array<std::pair<int64_t, int64_t>, 4> two = {{{192, 128}, {64, 128}, {40, 72}, {128, 256}}};
  for (auto [d, dv] : two) {
    for (bool causal : {false, true}) {
      Case c{BF16, 2, 239, 300, 4, 2, d, causal};
      c.head_dim_v = dv, c.layout = Layout::kPadded, c.check_padding = true, c.workspace = causal;
      run_case(c, seed++);
    }
    Case decode{FP16, 3, 1, 1000, 8, 2, d, false};
    decode.head_dim_v = dv;
    run_case(decode, seed++);
  }
}

// Soft-capped scores (Problem::softcap) on every head dim, dtype and bound, keys scaled so that many
// scores reach the cap's bend; decoding's folded query groups too. The reference applies the cap
// in float64, so a kernel that skipped it, or capped after the mask, fails.
TEST(ForwardGpu, SoftcapEveryHeadDimBoundAndDtype) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 700;
  for (int64_t d : {64, 128, 192, 256})
    for (auto dt : {BF16, FP16}) {
      for (auto [sq, sk] : {std::pair<int64_t, int64_t>{17, 239}, {300, 300}, {1000, 128}})
        for (bool causal : {false, true}) {
          Case c{dt, 2, sq, sk, 4, 2, d, causal};
          c.key_scale = 6.0, c.softcap = 7.5f;
          run_case(c, seed++);
        }
      Case window{dt, 1, 333, 400, 2, 1, d, false, 100, 20};
      window.key_scale = 6.0, window.softcap = 30.0f;
      run_case(window, seed++);
      Case decode{dt, 3, 1, 1000, 8, 2, d, false};
      decode.key_scale = 6.0, decode.softcap = 5.0f;
      run_case(decode, seed++);
    }
  // Decoding over long keys in few folded tiles (four), which the launch cuts into stream-K pieces
  // across the SMs: the capped pieces and their merge.
  for (int64_t d : {64, 128, 192, 256}) {
    Case longkeys{BF16, 1, 1, 16384, 16, 4, d, false};
    longkeys.key_scale = 6.0, longkeys.softcap = 30.0f;
    run_case(longkeys, seed++);
  }
}

TEST(ForwardGpu, CausalBothDirectionsOfSeqlenMismatch) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 100;
  for (int64_t d : {64, 128, 192, 256})
    for (auto [sq, sk] : {std::pair<int64_t, int64_t>{17, 239}, {239, 17}, {128, 1000}, {1000, 128}, {300, 300}})
      for (bool causal : {false, true}) run_case({BF16, 1, sq, sk, 2, 1, d, causal}, seed++);
}

// d256 under a causal bound runs on 64-key blocks where the key ranges are short and on 80-key
// blocks where they are long (sm90::d256_narrow_blocks; which of these shapes takes which is
// pinned by TileOrder.D256KeyBlockWidthFollowsTheComputedScores): both widths, both dtypes, tails.
TEST(ForwardGpu, D256CausalBothKeyBlockWidths) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 150;
  for (fa4::DType t : {BF16, FP16}) {
    run_case({t, 2, 300, 300, 2, 1, 256, true}, seed++);   // 64-key blocks
    run_case({t, 1, 250, 4000, 2, 2, 256, true}, seed++);  // 80-key blocks
  }
}

// d256 under a bound: a consumer whose rows see no key of a tile's first block passes it over,
// S, softmax and P V (fwd_kernel's kSkipFirstWhole): consumer 0 of every causal tile on 64-key
// blocks. Beside a consumer 1 with one row (65), an idle consumer 1 (130), rows that see more keys
// (200 x 400) or none (500 x 200: consumer 0 of the first tiles sees nothing at all), windows that
// skip (100, 0) and do not (-1, 30), GQA and 80-key blocks (250 x 4000).
TEST(ForwardGpu, D256FirstBlockPassedOver) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 160;
  run_case({BF16, 2, 65, 65, 2, 1, 256, true}, seed++);
  run_case({FP16, 1, 130, 130, 2, 2, 256, true}, seed++);
  run_case({BF16, 1, 200, 400, 4, 2, 256, true}, seed++);
  run_case({BF16, 1, 500, 200, 2, 2, 256, true}, seed++);
  run_case({FP16, 1, 700, 700, 2, 2, 256, false, 100, 0}, seed++);
  run_case({BF16, 1, 300, 300, 2, 2, 256, false, -1, 30}, seed++);
  run_case({BF16, 1, 250, 4000, 4, 1, 256, true}, seed++);
}

// d256 causal tiles in pairs (tile_order.cuh, "Paired causal tiles"; an even query-block count):
// rounds of pairs on small grids (the last round partial), a partial last query block (1000),
// bottom-right with every tile seeing most keys (256 x 4000, one pair a head), GQA, fp16, BHSD, and
// more pairs than SMs through the public API (192 pairs: on 132 SMs a second, partial round; kept
// that small because the float64 reference on the CPU is what this test's time goes to). With four
// or more query blocks a head (512; 420, the last block's second consumer idle; 1000; 1024) the
// longest tile walks its diagonal block last (TileOrder::diagonal_last_from): in every round, the
// last round only (on 5 CTAs: rounds, the last partial with an odd head count) and never, each set
// through FwdParams::diagonal_last, and as the device picks.
TEST(ForwardGpu, D256CausalPairs) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 170;
  for (int ctas : {5, 0}) {
    Case c{BF16, 4, 512, 512, 8, 8, 256, true};
    c.max_ctas = ctas;
    run_case(c, seed++);
  }
  for (int diagonal_last : {1, 2, 3}) {  // each walk, whichever the device takes by default
    Case c{BF16, 2, 512, 512, 9, 3, 256, true};
    c.max_ctas = 5;
    c.diagonal_last = diagonal_last;
    run_case(c, seed++);
    Case six{BF16, 1, 768, 768, 5, 5, 256, true};  // six blocks: 4, 3, 2, 1, 0 and then 5
    six.max_ctas = 4;
    six.diagonal_last = diagonal_last;
    run_case(six, seed++);
  }
  run_case({FP16, 3, 1000, 1000, 4, 2, 256, true}, seed++);
  run_case({BF16, 2, 256, 4000, 2, 1, 256, true}, seed++);
  Case bhsd{BF16, 1, 1024, 1024, 3, 3, 256, true};
  bhsd.layout = Layout::kBHSD;
  bhsd.max_ctas = 7;
  run_case(bhsd, seed++);
  run_case({BF16, 6, 512, 512, 16, 16, 256, true}, seed++);
  Case idle{BF16, 2, 420, 420, 6, 3, 256, true};
  idle.max_ctas = 3;
  run_case(idle, seed++);
}

// d256's short causal rows on 128-key blocks with one K and one V slot and the serial step
// (sm90::d256_serial_step; TileOrder.D256SerialStepOnTheShortCausalRows pins that these shapes take
// it): pairs on a small grid and more pairs than SMs; fp16 with GQA and key and query tails (500);
// consumer 0 idle in each head's first tile, of one block, and passing over the second tile's
// first block (192: a causal launch starts the first tile 64 rows before row 0; with one V slot
// the passed-over block's V is refilled as soon as it is freed); both tiles' first blocks passed
// over, with a key tail (256 x 300); consumer 0 idle over two blocks in the first tile and one row
// for consumer 1 in the second (129 x 230); BHSD. Every square shape's consumer 0 sees only the
// lower half of its diagonal block: S and P V over that half.
TEST(ForwardGpu, D256SerialStep) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 180;
  for (int ctas : {5, 0}) {
    Case c{BF16, 4, 512, 512, 8, 8, 256, true};
    c.max_ctas = ctas;
    run_case(c, seed++);
  }
  run_case({FP16, 3, 500, 500, 4, 2, 256, true}, seed++);
  run_case({BF16, 2, 192, 192, 2, 1, 256, true}, seed++);
  run_case({BF16, 3, 256, 300, 6, 2, 256, true}, seed++);
  run_case({FP16, 2, 129, 230, 4, 4, 256, true}, seed++);
  Case bhsd{BF16, 2, 512, 512, 3, 1, 256, true};
  bhsd.layout = Layout::kBHSD;
  bhsd.max_ctas = 3;
  run_case(bhsd, seed++);
}

TEST(ForwardGpu, Fp16) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 200;
  for (int64_t d : {64, 128, 192, 256})
    for (bool causal : {false, true}) run_case({FP16, 2, 239, 333, 4, 2, d, causal}, seed++);
}

TEST(ForwardGpu, GqaAndMqa) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 300;
  for (int64_t ratio : {1, 4, 8})
    for (bool causal : {false, true}) run_case({BF16, 2, 200, 257, 8, 8 / ratio, 128, causal}, seed++);
  run_case({BF16, 1, 129, 300, 6, 1, 64, true}, seed++);  // MQA
  run_case({FP16, 1, 129, 300, 4, 1, 256, false}, seed++);
}

// One query row a head under GQA/MQA, as a decoder runs: each KV head's query heads folded into
// the rows of one tile (detail::fold_query_groups), in every layout, and the cases left unfolded
// beside them (a left bound that drops keys, MHA).
TEST(ForwardGpu, DecodingQueryGroupsFolded) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 350;
  for (int64_t d : {64, 128, 192, 256}) {
    run_case({BF16, 3, 1, 1000, 32, 8, d, false}, seed++);
    run_case({BF16, 2, 1, 4097, 16, 1, d, true}, seed++);  // MQA, causal (the one query sees every key)
    run_case({FP16, 2, 1, 17, 8, 2, d, false, -1, -1, Layout::kBHSD}, seed++);
    run_case({BF16, 2, 1, 300, 12, 4, d, false, -1, -1, Layout::kPadded}, seed++);
    run_case({BF16, 1, 1, 300, 64, 8, d, false, 299, 0}, seed++);  // left = seqlen_k - 1: folded
    run_case({BF16, 1, 1, 300, 8, 2, d, false, 50, 3}, seed++);    // keys dropped: not folded
    run_case({BF16, 2, 1, 333, 4, 4, d, true}, seed++);            // MHA: nothing to fold
  }
}

// The decoding kernel alone (sm90/decode_kernel.cuh), its rows unfolded as sm90_forward unfolds
// them: a launch it does not take fails the case instead of running elsewhere.
fa4::Status decoding_kernel(const fa4::detail::FwdParams& f, cudaStream_t stream) {
  fa4::detail::FwdParams g = f;
  fa4::sm90::unfold_query_rows(&g);
  g.decode = 2;
  return fa4::detail::sm90_forward_decode(g, stream);
}

// A KV head's rows (seqlen_q x the group, 1 to 16) on the decoding kernel against float64: one key
// to thousands (a split, many splits), key counts off its 64-key blocks, causal rows without keys
// (seqlen_q > seqlen_k), windows on either side, a group of 5, scores spread tens of log2 units (the
// online rescale), BHSD and padded strides, both dtypes; and the same decoding calls on the tile
// kernels (decode 1), which the launch's rule no longer gives them.
TEST(ForwardGpu, DecodingKernelRowsSplitsAndBounds) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 900;
  for (int64_t d : {64, 128}) {
    std::vector<Case> cases = {
        {BF16, 2, 1, 1, 8, 2, d, false},            // one key
        {BF16, 2, 1, 17, 8, 8, d, false},           // MHA: a row a KV head
        {FP16, 3, 1, 1000, 32, 8, d, false},        // a group of 4
        {BF16, 2, 1, 4097, 16, 1, d, true},         // MQA, 16 rows
        {BF16, 1, 2, 300, 16, 2, d, true},          // two queries of a group of 8, each its own keys
        {FP16, 2, 3, 333, 15, 3, d, true},          // a group of 5: 15 rows
        {BF16, 1, 4, 65, 8, 2, d, true},            // one key past a block
        {BF16, 1, 8, 5, 4, 2, d, true},             // seqlen_q > seqlen_k: rows without keys
        {BF16, 1, 1, 300, 8, 2, d, false, 50, 3},   // a window on both sides
        {FP16, 2, 2, 1000, 8, 4, d, false, 100, 0}, // causal with a left bound
        {BF16, 1, 1, 20000, 8, 1, d, false},        // many splits
        {BF16, 2, 1, 300, 12, 4, d, false, -1, -1, Layout::kBHSD},
        {FP16, 2, 1, 300, 12, 4, d, false, -1, -1, Layout::kPadded},
    };
    Case spread{BF16, 2, 1, 2000, 8, 2, d, false};
    spread.key_scale = 6.0, spread.key_ramp = 2.0;
    cases.push_back(spread);
    for (Case c : cases) {
      c.launch = decoding_kernel;
      ASSERT_NO_FATAL_FAILURE(run_case(c, seed++));
      c.launch = nullptr;
      c.decode = 1;
      ASSERT_NO_FATAL_FAILURE(run_case(c, seed++));
    }
  }
}

// A few query rows a head under GQA/MQA (speculative decoding, short prefill chunks): each KV
// head's group of query heads folded into a tile's rows (detail::fold_query_rows), each row
// masked by its own query (causal, windows on either side, rows without keys where seqlen_q >
// seqlen_k), in every layout and head dim, whole and cut into stream-K pieces, soft-capped, and
// the largest folds (128 rows, a group of 64). Each case first checks that it folds, and runs on
// a grid of 4 CTAs, where the launch keeps the fold (fwd_launch.cuh, fold_pays); the last cases run
// on the whole device, folded, and unfolded without the stream-K tail.
TEST(ForwardGpu, QueryRowsOfAGroupFolded) {
  FA4_REQUIRE_GPU();
  auto fold_of = [](const Case& c) {
    return fa4::detail::make_fwd_params(fa4::test::fake_forward(problem_of(c))).fold;
  };
  uint32_t seed = 370;
  for (int64_t d : {64, 128, 192, 256}) {
    std::vector<Case> cases = {
        {BF16, 2, 4, 1000, 32, 8, d, true},                            // speculative decoding: 4 x 4 rows
        {BF16, 3, 3, 777, 16, 2, d, false},                            // 3 x 8 rows, no bound
        {FP16, 2, 5, 300, 8, 2, d, true, -1, -1, Layout::kBHSD},       // 5 x 4
        {BF16, 2, 7, 513, 12, 3, d, true, -1, -1, Layout::kPadded},    // 7 x 4
        {BF16, 1, 16, 2000, 64, 8, d, true},                           // 16 x 8 = 128 rows
        {BF16, 1, 2, 999, 64, 1, d, true},                             // MQA, a group of 64
        {BF16, 2, 6, 5, 16, 4, d, true},                               // seqlen_q > seqlen_k: rows without keys
        {FP16, 1, 8, 700, 16, 2, d, false, 100, 0},                    // a window on both sides
        {BF16, 1, 5, 600, 8, 1, d, false, -1, 3},                      // a right bound past the diagonal
        {BF16, 1, 6, 4097, 32, 4, d, true},                            // few tiles, long keys: cut tails
    };
    Case split = {BF16, 2, 4, 3000, 16, 4, d, true};  // every tile cut into stream-K pieces
    split.split = 2;
    cases.push_back(split);
    Case capped = {BF16, 2, 3, 900, 16, 4, d, true};
    capped.softcap = 15.0f;
    cases.push_back(capped);
    for (Case c : cases) {
      ASSERT_GT(fold_of(c), 0) << c.name();
      c.max_ctas = 4;
      ASSERT_NO_FATAL_FAILURE(run_case(c, seed++));
    }
    // 32 query heads, one round unfolded: folded and cut into pieces by default, unfolded whole
    // tiles without the tail (fold_pays).
    ASSERT_NO_FATAL_FAILURE(run_case({BF16, 1, 4, 3000, 32, 8, d, true}, seed++));
    Case whole = {BF16, 1, 4, 3000, 32, 8, d, true};
    whole.split = 1;
    ASSERT_NO_FATAL_FAILURE(run_case(whole, seed++));
  }
}

// Attention sinks (ForwardArgs::sink) on the tile kernels: whole tiles of every head dim, causal
// and not, GQA, fp16, BHSD; rows without keys (causal seqlen_q > seqlen_k: O 0, LSE the sink); a
// sink far above every score (O near 0; and in fp16, P taken against the sink partly subnormal) and
// far below (O as without); soft-capped scores; a sliding window; a
// few query rows a head and decoding calls, their query groups folded into rows (each row its own
// head's sink); stream-K pieces merged (split 2 on a small grid); a head with no sink
// (-inf) beside the others. LSE against float64 too (run_case).
TEST(ForwardGpu, SinksOnTheTileKernels) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 2600;
  for (int64_t d : {64, 128, 192, 256}) {
    std::vector<Case> cases = {
        {BF16, 2, 333, 333, 4, 2, d, false},
        {FP16, 1, 300, 1000, 6, 3, d, true, -1, -1, Layout::kBHSD},
        {BF16, 1, 40, 17, 4, 4, d, true},            // seqlen_q > seqlen_k: rows without keys
        {BF16, 2, 4, 1000, 32, 8, d, true},          // few rows a head (folded: fold_query_rows)
        {BF16, 1, 1, 3000, 16, 2, d, false},         // decoding (at d256 on the tile kernels)
        {BF16, 2, 1, 700, 12, 2, d, false},          // a group of 6 folded (fold_query_groups)
        {BF16, 1, 3, 500, 16, 1, d, true},           // 16 heads folded: a thread's two rows' heads differ
    };
    cases[3].max_ctas = 4;
    cases[5].decode = 1;  // (on the tile kernels at every head dim)
    Case high{BF16, 1, 200, 300, 4, 2, d, false};
    high.sink_shift = 30.0;  // above every score: O near 0, LSE the sink's
    cases.push_back(high);
    Case fp16_high{FP16, 1, 200, 300, 4, 2, d, false};
    fp16_high.sink_shift = 12.0;  // fp16 P against the sink: small, some subnormal
    cases.push_back(fp16_high);
    Case low{BF16, 1, 200, 300, 4, 2, d, false};
    low.sink_shift = -30.0;
    cases.push_back(low);
    Case capped{BF16, 2, 129, 500, 4, 2, d, true};
    capped.softcap = 10.0f;
    cases.push_back(capped);
    cases.push_back({BF16, 2, 300, 300, 16, 2, d, true, 127, 0});  // a sliding window (gpt-oss's local layers)
    cases.push_back({BF16, 2, 1, 200, 16, 2, d, false});  // decoding over short keys (d256: not the serial step)
    cases.back().decode = 1;
    Case capped_decoding{BF16, 1, 1, 700, 16, 2, d, false};  // folded at d64/d128 only
    capped_decoding.softcap = 10.0f;
    cases.push_back(capped_decoding);
    Case cut{BF16, 2, 500, 900, 6, 3, d, false};  // every tile of the last round cut into pieces
    cut.split = 2, cut.max_ctas = 5;
    cases.push_back(cut);
    for (Case c : cases) {
      c.sink_scale = 1.0;
      ASSERT_NO_FATAL_FAILURE(run_case(c, seed++));
    }
  }
}

// The same on the decoding kernel: one CTA a row (512 KV heads, one split each), the sink folded
// in by that CTA; splits merged, the sink folded in by the merge; rows without keys.
TEST(ForwardGpu, SinksOnTheDecodingKernel) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 2700;
  for (int64_t d : {64, 128}) {
    Case one{BF16, 64, 1, 300, 16, 8, d, false};
    one.sink_scale = 1.0;
    one.launch = decoding_kernel;
    ASSERT_EQ(fa4::sm90::decode_plan(64 * 8, 300, 132 * 2).splits, 1);
    ASSERT_NO_FATAL_FAILURE(run_case(one, seed++));
    for (int64_t sk : {300, 20000}) {
      Case c{BF16, 2, 1, sk, 8, 2, d, false};
      c.sink_scale = 1.0, c.sink_shift = 2.0;
      c.launch = decoding_kernel;
      ASSERT_NO_FATAL_FAILURE(run_case(c, seed++));
      Case rows{FP16, 1, 8, 5, 4, 2, d, true};  // rows without keys
      rows.sink_scale = 1.0;
      rows.launch = decoding_kernel;
      ASSERT_NO_FATAL_FAILURE(run_case(rows, seed++));
    }
    Case slide{BF16, 4, 1, 2000, 16, 2, d, true, 127, 0};  // a sliding window: rows left unfolded
    slide.sink_scale = 1.0;
    slide.launch = decoding_kernel;
    ASSERT_NO_FATAL_FAILURE(run_case(slide, seed++));
    Case six{BF16, 3, 1, 900, 12, 2, d, false};  // a group of 6 folded by strides: row g, head 6 hk + g
    six.sink_scale = 1.0, six.sink_shift = 1.0;
    six.launch = decoding_kernel;
    ASSERT_NO_FATAL_FAILURE(run_case(six, seed++));
  }
}

TEST(ForwardGpu, StridedLayouts) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 400;
  for (Layout l : {Layout::kBHSD, Layout::kPadded})
    for (int64_t d : {64, 128, 192, 256}) run_case({BF16, 2, 190, 260, 4, 2, d, d == 128, -1, -1, l}, seed++);
}

TEST(ForwardGpu, LocalWindow) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 500;
  run_case({BF16, 1, 513, 700, 2, 2, 128, false, 100, 20}, seed++);
  run_case({BF16, 1, 700, 513, 2, 1, 64, false, 0, 0}, seed++);
  run_case({FP16, 1, 300, 300, 2, 2, 256, true, 64, -1}, seed++);
  // Rows near the top see no key at all: O = 0 and LSE = -inf there.
  run_case({BF16, 1, 400, 100, 2, 2, 64, false, 10, 0}, seed++);
  // The window (-1, 0) asked for as a window: the causal kernel, as causal is.
  for (int64_t d : {64, 128, 192, 256}) run_case({BF16, 1, 333, 555, 2, 2, d, false, -1, 0}, seed++);
}

TEST(ForwardGpu, DiagonalBlocksCutToEachConsumersRows) {
  FA4_REQUIRE_GPU();
  // With a right bound each consumer decides masking on its own 64 rows and takes a tile's first
  // block on what its rows see: none of it (skipped), its lower half, or all. Causal d64 384 on
  // three consumers: a 192-row tile from row 0 against keys 128..255 leaves consumers 0 and 1
  // without a key there and consumer 2 with the lower half; causal d128 512: consumer 0 sees the
  // diagonal block's lower half. Windows open on the left (the one-compare mask) and with both
  // bounds, right bounds past the diagonal, seqlen_q against seqlen_k both ways.
  uint32_t seed = 550;
  run_case({BF16, 2, 384, 384, 3, 3, 64, true}, seed++);
  run_case({BF16, 2, 512, 512, 2, 2, 128, true}, seed++);
  run_case({FP16, 1, 640, 640, 2, 1, 64, true}, seed++);
  run_case({BF16, 1, 600, 900, 2, 2, 64, false, -1, 70}, seed++);
  run_case({BF16, 1, 700, 500, 2, 2, 128, false, -1, 40}, seed++);
  run_case({BF16, 1, 777, 777, 2, 2, 64, false, 150, 30}, seed++);
  run_case({FP16, 1, 500, 800, 2, 2, 128, false, 90, 0}, seed++);
  run_case({BF16, 1, 256, 256, 4, 2, 64, true}, seed++);  // four consumers: one tile, 1 + 2 + 3 + 4 blocks
}

// d64 runs on three tile heights (sm90::d64_consumers; which of these shapes takes which is pinned
// by TileOrder.D64TileHeightFollowsTheComputedScores): 128 rows on two consumers, 192 on three and
// 256 on four (64-key blocks, eight K/V stages). Each with key tails and a last tile whose last
// consumer is idle or has a few rows; both dtypes, GQA, MQA, BHSD, one key; four consumers also
// with the running max rising block after block and scores far apart in a block. Then with a
// bound, where four consumers walk only the blocks their rows see (fwd_kernel's kSkipLeading):
// causal, windows with either edge or both, rows before row 0 and rows without keys.
TEST(ForwardGpu, D64EveryTileHeight) {
  FA4_REQUIRE_GPU();
  const Case cases[] = {
      {BF16, 2, 100, 333, 4, 2, 64, false},                           // two
      {FP16, 1, 17, 1000, 2, 1, 64, false},                           // two
      {BF16, 2, 1050, 239, 4, 1, 64, false},                          // three, the last consumer idle
      {FP16, 1, 700, 1000, 2, 2, 64, false, -1, -1, Layout::kBHSD},   // three
      {BF16, 2, 450, 333, 4, 2, 64, false},                           // four, the last consumer idle
      {FP16, 2, 512, 512, 8, 1, 64, false},                           // four, MQA
      {BF16, 1, 200, 1111, 4, 4, 64, false, -1, -1, Layout::kBHSD},   // four, one tile: 8 rows for the last
      {BF16, 1, 1000, 1, 2, 2, 64, false},                            // four, one key
      {FP16, 1, 420, 700, 2, 1, 64, false, -1, -1, Layout::kPadded},  // four, the last consumer idle
  };
  uint32_t seed = 2100;
  for (const Case& c : cases) ASSERT_NO_FATAL_FAILURE(run_case(c, seed++));
  for (DType t : {BF16, FP16}) {
    Case ramp{t, 1, 450, 1111, 2, 1, 64, false};
    ramp.key_ramp = 60.0;
    run_case(ramp, seed++);
    Case spread{t, 2, 512, 1111, 2, 1, 64, false};
    spread.key_scale = 6.0;
    run_case(spread, seed++);
  }
  const Case bounded[] = {
      {FP16, 2, 512, 512, 4, 2, 64, true},                          // four
      {BF16, 2, 1000, 300, 4, 2, 64, true},                         // four: the first rows see no key
      {BF16, 1, 384, 384, 3, 3, 64, true, -1, -1, Layout::kBHSD},   // four: two consumers before row 0
      {BF16, 1, 250, 4000, 4, 4, 64, true},                         // four
      {BF16, 1, 600, 900, 2, 2, 64, false, -1, 70},                 // four, a window's right bound
      {FP16, 1, 333, 500, 2, 1, 64, true},                          // three
      {BF16, 1, 2048, 128, 2, 2, 64, true},                         // two
      {BF16, 1, 777, 777, 2, 2, 64, false, 150, 30},                // four, both edges cut
      {FP16, 2, 513, 700, 4, 2, 64, false, 64, -1},                 // four, a left bound alone
      {BF16, 1, 400, 100, 2, 2, 64, false, 10, 0},                  // four: the first rows see no key
      {BF16, 1, 384, 384, 2, 2, 64, false, 500, 1000},              // three
  };
  for (const Case& c : bounded) ASSERT_NO_FATAL_FAILURE(run_case(c, seed++));
}

TEST(ForwardGpu, RunningMaxRisesPastTheRescaleThreshold) {
  FA4_REQUIRE_GPU();
  // Steady-state steps on unmasked blocks take their exponentials against the running max without
  // the block's max (d64, d128); a score far above it must send the warpgroup back for S and the
  // exact step. Scores here grow block after block (key_ramp), for every head dim, both dtypes,
  // masked and not: by a few log2 units a block (6), so the running max falls behind by steps, and
  // by tens (60), so every block goes back.
  uint32_t seed = 800;
  for (double ramp : {6.0, 60.0})
    for (int64_t d : {64, 128, 192, 256})
      for (DType t : {BF16, FP16})
        for (bool causal : {false, true}) {
          Case c{t, 1, 333, 1111, 2, 1, d, causal};
          c.key_ramp = ramp;
          run_case(c, seed++);
        }
}

TEST(ForwardGpu, ScoresFarApartWithinABlock) {
  FA4_REQUIRE_GPU();
  // Keys scaled up so that one row's scores within one block lie tens of log2 units apart, from
  // the tile's first block on (RunningMaxRisesPastTheRescaleThreshold ramps them block after block
  // instead). The steady steps take their exponentials against the running max without the
  // block's own (d64, d128). A score more than 2^15 above that max must send the warpgroup back for
  // S and the exact step. seqlen_k 1024 leaves every block whole; 1111 leaves the first block
  // (the last keys) partial and masked. Both dtypes, every head dim.
  uint32_t seed = 850;
  for (double scale : {2.0, 6.0})
    for (int64_t d : {64, 128, 192, 256})
      for (DType t : {BF16, FP16})
        for (int64_t sk : {1024, 1111}) {
          Case c{t, 2, 400, sk, 2, 1, d, false};
          c.key_scale = scale;
          run_case(c, seed++);
        }
}

// Case c through a test-only build's launch (tests/lagged_kernels.cu) on `ctas` CTAs of one each,
// without a stream-K tail, so each CTA walks many tiles.
void run_lagged(Case c, fa4::Status (*launch)(const fa4::detail::FwdParams&, cudaStream_t), int ctas,
                uint32_t seed) {
  c.cluster = 1;
  c.split = 1;
  c.max_ctas = ctas;
  c.launch = launch;
  run_case(c, seed);
}

TEST(ForwardGpu, IdleConsumersWarpsLateToTheirFirstBlock) {
  FA4_REQUIRE_GPU();
  // An idle consumer (its 64 rows past the last query) frees each K/V slot once it has landed.
  // Here its warps 1-3 start the walk ~20 us after warp 0: the tile's first K slot must not be
  // freed, refilled and landed again before they have seen it land, or they wait on a parity the
  // barrier has passed twice and the CTA hangs. 512 rows on 192-row tiles leave the third tile's
  // last consumer idle, 3900 rows the 21st tile's last two. Five key blocks on four stages: the
  // tile's fifth K refills its first K's slot. Four CTAs walk every tile.
  uint32_t seed = 1900;
  for (int64_t sq : {512, 3900})
    run_lagged({BF16, 2, sq, 640, 3, 1, 64, false}, fa4::test::forward_idle_warps_late, 4, seed++);
  // Four consumers: 450 rows on 256-row tiles leave the second tile's last consumer idle; ten
  // 64-key blocks on eight stages.
  run_lagged({BF16, 2, 450, 640, 3, 1, 64, false}, fa4::test::forward_idle_warps_late_four, 4, seed++);
}

TEST(ForwardGpu, IdleConsumersWarpsLateOnTwoConsumers) {
  FA4_REQUIRE_GPU();
  // The same at d128 on two consumers, causal (the bounded kernel): 300 rows start each head's
  // first tile 64 rows before row 0, so its consumer 0 is idle; that tile sees six key blocks on
  // two K/V stages.
  run_lagged({BF16, 2, 300, 1000, 4, 2, 128, true}, fa4::test::forward_idle_warps_late_d128, 4, 1950);
  // d256's serial step (one K and one V slot, two turns a block): 129 rows start each head's first
  // tile 64 rows before row 0, so its consumer 0 is idle, and its walk of two blocks (101 keys more
  // than queries) reuses each slot at every block.
  run_lagged({BF16, 2, 129, 230, 4, 2, 256, true}, fa4::test::forward_idle_warps_late_d256_serial, 4, 1951);
}

TEST(ForwardGpu, WarpsSkewedEveryTile) {
  FA4_REQUIRE_GPU();
  // Every tile, one warp of each consumer (another each tile) is held ~3 us after its Q lands, so
  // within a consumer one warp trails the others and the consumers trail each other in turn; each
  // loader thread (K, V, Q) is held as it takes every third tile, the CTAs of a cluster apart. The
  // protocol must not care: each slot is freed only once every warp that reads it has seen it
  // land. Each head dim's kernels (d64 on four consumers without a bound and on three, d128, d256
  // with O staged in K/V slots), non-causal with partial tiles (idle consumers) and causal (the
  // bounded kernels), on four CTAs, in clusters of two, and with a stream-K tail; then tiles
  // without keys among tiles with keys.
  uint32_t seed = 1960;
  for (int64_t d : {64, 128, 192, 256})
    for (int64_t sq : {700, 1000, 1050})
      for (auto [cluster, split, ctas] : {std::array<int, 3>{1, 1, 4}, {2, 1, 4}, {1, 2, 0}}) {
        // Causal 700, non-causal 1000 (four consumers at d64) and, at d64, non-causal 1050 (three,
        // the last tile's third consumer idle).
        const bool causal = sq == 700;
        if (sq == 1050 && d != 64) continue;
        if (causal && cluster == 2) continue;  // causal tiles vary: no clusters, no stream-K tail
        Case c{BF16, 2, sq, causal ? 900 : 650, 4, 2, d, causal};
        c.cluster = cluster;
        c.split = split;
        c.max_ctas = ctas;
        c.launch = fa4::test::forward_tile_warp_late;
        run_case(c, seed++);
      }
  // Tiles without keys among tiles with keys (causal with seqlen_q > seqlen_k: the first query
  // blocks see no key; at d256 neither consumer takes the kv_read hand-over there).
  for (int64_t d : {64, 128, 192, 256})
    run_lagged({BF16, 2, 1000, 300, 3, 3, d, true}, fa4::test::forward_tile_warp_late, 3, seed++);
  // d64 causal on three consumers (the shapes above take four).
  run_lagged({BF16, 2, 333, 1111, 4, 2, 64, true}, fa4::test::forward_tile_warp_late, 3, seed++);
  // d256's serial step: consumer 0 idle in each head's first tile and passing over the second
  // tile's first block (192), and passing over both tiles' first blocks (256 x 300).
  run_lagged({BF16, 2, 192, 192, 4, 2, 256, true}, fa4::test::forward_tile_warp_late, 3, seed++);
  run_lagged({BF16, 2, 256, 300, 4, 2, 256, true}, fa4::test::forward_tile_warp_late, 3, seed++);
}

TEST(ForwardGpu, WarpLateToTheStepsIssue) {
  FA4_REQUIRE_GPU();
  // In every steady step warp 1 or 2 of each consumer is held ~10 us between its turn and its
  // GEMM issue, while thread 0 frees K_j's slot after its own wait for S_j. The slot would be
  // refilled within that time; the answer stays exact only because a warpgroup's wgmma completes
  // for one warp once all four have issued it, which this test holds the kernel to.
  run_lagged({BF16, 1, 1000, 2000, 4, 2, 128, false}, fa4::test::forward_step_warp_late, 4, 1990);
}

TEST(ForwardGpu, LongSequences) {
  FA4_REQUIRE_GPU();
  run_case({BF16, 1, 4097, 4097, 1, 1, 64, true}, 600);
  run_case({BF16, 1, 1000, 4097, 1, 1, 128, false}, 601);
}

TEST(ForwardGpu, ManyTilesPersistentGrid) {
  FA4_REQUIRE_GPU();
  // More tiles than SMs, so each CTA of the persistent grid walks several: from the tile counter
  // on single CTAs (d64, causal, windows, d256 with an odd query-block count), in static rounds in
  // clusters (d128 non-causal).
  run_case({BF16, 4, 600, 600, 16, 4, 64, false}, 700);
  run_case({BF16, 3, 700, 500, 12, 12, 128, false}, 701);
  run_case({BF16, 4, 600, 600, 16, 4, 64, true}, 702);
  run_case({BF16, 3, 700, 500, 12, 12, 128, true}, 703);
  run_case({FP16, 2, 600, 650, 16, 8, 256, true}, 704);
  run_case({BF16, 4, 600, 600, 16, 4, 128, false, 200, 0}, 705);
  // Tiles of one length from the counter with a partial last query block: d64 on 256-row tiles
  // (1000 rows: the fourth tile's last consumer has 40) and on 192-row ones (1050 rows: the sixth
  // tile's last consumer idle), d256 with O staged in the last K/V slots.
  run_case({BF16, 8, 1000, 300, 16, 16, 64, false}, 706);
  run_case({BF16, 4, 333, 256, 16, 8, 256, false}, 707);
  run_case({BF16, 4, 1050, 256, 16, 8, 64, false}, 708);
}

TEST(ForwardGpu, TilesWithoutKeysAmongTilesWithKeys) {
  FA4_REQUIRE_GPU();
  // Tiles that see no key (causal bottom-right with seqlen_q > seqlen_k, or a window: O = 0, LSE =
  // -inf, no K/V block) between tiles that do, so the rings and the turn barriers must carry over
  // such a tile. A small grid makes each CTA walk many tiles of both kinds, in clusters and one CTA
  // a tile, at the head dims with two consumers and two Q buffers (d128, d64 on 128-row tiles),
  // and at d256, whose tiles with keys stage O in their last K/V slots and those without store
  // zeros from registers.
  const Case cases[] = {
      {BF16, 2, 1000, 128, 3, 3, 128, true},  // 8 query blocks, the first 6 see no key
      {BF16, 2, 500, 200, 4, 2, 64, true},  // d64 on 256-row tiles (four consumers)
      {FP16, 1, 900, 333, 4, 4, 128, false, 40, 0},  // window: the top rows see no key
      {BF16, 3, 500, 200, 2, 1, 128, false},  // every tile has keys: one key block, many tiles
      {BF16, 2, 1000, 128, 2, 2, 256, true},  // d256: 8 query blocks, the first 6 see no key
      {FP16, 1, 900, 333, 2, 1, 256, false, 40, 0},  // d256, window
  };
  uint32_t seed = 1500;
  for (Case c : cases)
    for (auto [cluster, ctas] : {std::pair<int, int>{1, 3}, {2, 4}, {2, 0}}) {
      c.cluster = cluster;
      c.max_ctas = ctas;
      c.split = 1;
      ASSERT_NO_FATAL_FAILURE(run_case(c, seed++));
    }
}

TEST(ForwardGpu, NoRoomForLaunchScratchFallsBackToWholeTiles) {
  FA4_REQUIRE_GPU();
  // A launch's stream-ordered scratch (the stream-K tail's partials; its counters and the tile
  // counter where the stream has none of its own) comes from the device's current memory pool.
  // With that pool full the launch runs whole tiles in static rounds instead, and its answer
  // passes the same check.
  int dev = 0;
  CUDA_OK(cudaGetDevice(&dev));
  cudaMemPool_t original;
  CUDA_OK(cudaDeviceGetMemPool(&original, dev));
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = dev;
  props.maxSize = size_t(8) << 20;
  cudaMemPool_t small;
  if (cudaMemPoolCreate(&small, &props) != cudaSuccess) {
    cudaGetLastError();
    GTEST_SKIP() << "cudaMemPoolCreate with maxSize is not available here";
  }
  struct Restore {  // the device's own pool back, whatever happens below
    int dev;
    cudaMemPool_t original, small;
    std::vector<void*> held;
    ~Restore() {
      for (void* ptr : held) cudaFreeAsync(ptr, nullptr);
      cudaStreamSynchronize(nullptr);
      cudaDeviceSetMemPool(dev, original);
      cudaMemPoolDestroy(small);
    }
  } restore{dev, original, small, {}};
  CUDA_OK(cudaDeviceSetMemPool(dev, small));
  // Fill the pool, down to its smallest fragments.
  for (size_t bytes : {size_t(1) << 20, size_t(1) << 14, size_t(1) << 8, size_t(1)})
    for (int i = 0; i < 100000; ++i) {
      void* ptr = nullptr;
      if (cudaMallocAsync(&ptr, bytes, nullptr) != cudaSuccess) break;
      restore.held.push_back(ptr);
    }
  cudaGetLastError();
  void* probe = nullptr;
  const cudaError_t room = cudaMallocAsync(&probe, sizeof(int), nullptr);
  if (room == cudaSuccess) restore.held.push_back(probe);
  ASSERT_NE(room, cudaSuccess) << "the pool still has room";
  cudaGetLastError();
  run_case({BF16, 1, 256, 8192, 16, 16, 128, false}, 1600);  // 32 tiles: every tile would be cut
  run_case({BF16, 2, 150, 8000, 2, 1, 64, false}, 1601);
  run_case({BF16, 4, 600, 600, 16, 4, 64, true}, 1602);  // causal, more tiles than SMs: the counter
  run_case({BF16, 3, 700, 500, 12, 12, 128, true}, 1603);
}

// Case c on single CTAs and on clusters of two, whole tiles (a stream-K tail cuts pairs and single
// tiles differently): both pass the reference check and agree bit for bit, O and LSE.
void expect_clusters_alike(Case c, uint32_t seed) {
  std::vector<double> o1, o2;
  std::vector<float> l1, l2;
  c.split = 1;
  c.cluster = 1;
  ASSERT_NO_FATAL_FAILURE(run_case(c, seed, &o1, &l1));
  c.cluster = 2;
  ASSERT_NO_FATAL_FAILURE(run_case(c, seed, &o2, &l2));
  SCOPED_TRACE(c.name());
  ASSERT_EQ(o1.size(), o2.size());
  EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(double)), 0) << "O differs";
  ASSERT_EQ(l1.size(), l2.size());
  EXPECT_EQ(std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)), 0) << "LSE differs";
}

TEST(ForwardGpu, ClusterPairsMatchOneCtaBitForBit) {
  FA4_REQUIRE_GPU();
  // Two CTAs of a cluster share each K/V block (each loads half, multicast to both). Same inputs
  // with and without clusters: both pass the reference check and agree bit for bit, O and LSE.
  // Odd query-block counts (the last pair's second CTA past seqlen_q), tails, GQA, every head dim,
  // both dtypes, BHSD, and more pairs than fit at once (CTAs walking several).
  const Case cases[] = {
      {BF16, 2, 300, 333, 3, 3, 128, false},  // 3 query blocks: one padding block a head
      {BF16, 1, 500, 1000, 4, 2, 64, false},  // 256-row tiles (four consumers): one pair
      {BF16, 1, 1050, 700, 4, 2, 64, false},  // 192-row tiles: 6 blocks
      {BF16, 2, 200, 333, 4, 2, 64, false},   // d64 on 128-row tiles (two consumers): one pair
      {FP16, 1, 257, 100, 2, 1, 256, false},
      {BF16, 2, 190, 260, 4, 2, 128, false, -1, -1, Layout::kBHSD},
      {BF16, 4, 512, 512, 16, 4, 128, false},  // 128 pairs
      {BF16, 4, 1000, 700, 16, 16, 64, false},
      {FP16, 2, 600, 650, 16, 8, 256, false},
      {BF16, 2, 300, 1000, 4, 2, 192, false},  // d192: three-chunk K/V halves (112-key blocks)
      {FP16, 1, 700, 333, 8, 8, 192, false},
  };
  uint32_t seed = 900;
  for (const Case& c : cases) ASSERT_NO_FATAL_FAILURE(expect_clusters_alike(c, seed++));
}

// Case c cut into stream-K pieces wherever the last round is partial (split 2), twice for the same
// bits (the merge goes in piece order, whoever finishes last), then with whole tiles (split 1);
// each against the float64 reference.
void expect_cut_alike_and_whole(Case c, uint32_t seed) {
  c.split = 2;
  std::vector<double> o1, o2;
  std::vector<float> l1, l2;
  ASSERT_NO_FATAL_FAILURE(run_case(c, seed, &o1, &l1));
  ASSERT_NO_FATAL_FAILURE(run_case(c, seed, &o2, &l2));
  SCOPED_TRACE(c.name());
  EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(double)), 0) << "O differs between runs";
  EXPECT_EQ(std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)), 0) << "LSE differs between runs";
  c.split = 1;
  ASSERT_NO_FATAL_FAILURE(run_case(c, seed));
}

TEST(ForwardGpu, StreamKTailMatchesTheReference) {
  FA4_REQUIRE_GPU();
  // The last partial round's tiles cut into equal runs of key blocks, pieces merged by the last to
  // finish. A small grid (max_ctas) makes small problems take rounds; split 2 cuts whenever the
  // last round is partial. Every head dim and tile height, clusters, GQA, key tails inside a piece,
  // fp16, BHSD; the same inputs with whole tiles must pass too, and a second run must give the
  // same bits (the merge is in piece order, whoever finishes last).
  const Case cases[] = {
      {BF16, 2, 1000, 1000, 3, 3, 128, false},             // 8 blocks a tile
      {BF16, 1, 700, 2049, 4, 2, 64, false},               // 192-row tiles, 17 blocks (last 1 key)
      {BF16, 2, 100, 1500, 4, 1, 64, false},               // d64 on 128-row tiles, MQA
      {BF16, 1, 450, 2049, 4, 2, 64, false},               // 256-row tiles, 33 blocks
      {FP16, 1, 300, 777, 4, 2, 256, false},               // 80-wide blocks
      {BF16, 2, 500, 900, 6, 3, 128, false, -1, -1, Layout::kBHSD},
      {FP16, 1, 333, 4097, 2, 2, 128, false},
      {BF16, 1, 64, 3000, 8, 8, 128, false},               // fewer tiles than CTAs: every tile cut
  };
  uint32_t seed = 1300;
  for (Case c : cases)
    for (auto [cluster, ctas] : {std::pair<int, int>{1, 5}, {2, 14}}) {
      c.cluster = cluster;
      c.max_ctas = ctas;
      ASSERT_NO_FATAL_FAILURE(expect_cut_alike_and_whole(c, seed++));
    }
  // Through the public API: a short query against many keys takes every SM with the keys cut.
  run_case({BF16, 1, 100, 16384, 4, 4, 128, false}, 1400);
  run_case({BF16, 2, 150, 8000, 2, 1, 64, false}, 1401);
}

// The forward's 192 / 128 kernels (detail::set_forward_v128, on for this test only;
// fwd_configs.cuh, D192V128Config): v and o of 128 columns read and written where they are, P V
// over 128 columns. Odd lengths, seqlen_q past seqlen_k, GQA and MQA, fp16, BHSD and padded views
// (o's padding slots must keep their poison), a window, sinks, decoding rows and few rows (folded:
// no decoding kernel at 192), many query blocks; through the workspace query (nothing to copy:
// 0 bytes, where the switch off asks for the copies); clusters bit for bit against one CTA;
// stream-K pieces merged (twice the same bits) and whole tiles; a soft-capped call, over copies.
TEST(ForwardGpu, D192V128Kernels) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 3900;
  Case padded{BF16, 2, 239, 300, 4, 2, 192, true};
  padded.layout = Layout::kPadded, padded.check_padding = true, padded.workspace = true;
  padded.head_dim_v = 128;
  {
    const fa4::test::ForwardV128 off(false);  // the copies' workspace, for the query below
    run_case(padded, seed++);
  }
  const fa4::test::ForwardV128 on(true);
  {  // nothing copied: no workspace
    fa4::ForwardArgs a = fa4::test::fake_forward(problem_of(padded));
    size_t bytes = 1;
    ASSERT_TRUE(fa4::forward_workspace_size(a, &bytes).ok());
    EXPECT_EQ(bytes, 0u);
    fa4::test::ForwardV128 off(false);
    ASSERT_TRUE(fa4::forward_workspace_size(a, &bytes).ok());
    EXPECT_GT(bytes, 0u) << "with the switch off, v and o go through padded copies";
  }
  std::vector<Case> cases = {
      padded,
      {BF16, 2, 239, 300, 4, 2, 192, false},
      {FP16, 1, 300, 239, 6, 1, 192, true},  // rows without keys, MQA
      {BF16, 1, 1000, 1000, 8, 8, 192, false, -1, -1, Layout::kBHSD},
      {BF16, 1, 333, 400, 2, 1, 192, false, 100, 20},  // a window
      {BF16, 3, 1, 1000, 8, 2, 192, false},            // decoding: the group folded
      {BF16, 2, 4, 2000, 16, 2, 192, true},            // a few rows folded
      {FP16, 1, 4097, 129, 2, 2, 192, false},          // many query blocks, few keys
  };
  Case sinks{BF16, 2, 200, 333, 4, 2, 192, true};
  sinks.sink_scale = 1.0;
  cases.push_back(sinks);
  Case capped{FP16, 1, 257, 257, 2, 2, 192, false};
  capped.key_scale = 6.0, capped.softcap = 7.5f;
  cases.push_back(capped);
  for (Case c : cases) {
    c.head_dim_v = 128;
    ASSERT_NO_FATAL_FAILURE(run_case(c, seed++));
  }
  for (Case c : {Case{BF16, 2, 300, 1000, 4, 2, 192, false}, Case{FP16, 1, 700, 333, 8, 8, 192, false}}) {
    c.head_dim_v = 128;
    ASSERT_NO_FATAL_FAILURE(expect_clusters_alike(c, seed++));
  }
  for (auto [cluster, ctas] : {std::pair<int, int>{1, 5}, {2, 14}}) {
    Case c{BF16, 1, 333, 2049, 4, 2, 192, false};
    c.head_dim_v = 128, c.cluster = cluster, c.max_ctas = ctas;
    ASSERT_NO_FATAL_FAILURE(expect_cut_alike_and_whole(c, seed++));
  }
  Case longkeys{BF16, 1, 1, 16384, 16, 4, 192, false};  // decoding over long keys: stream-K pieces
  longkeys.head_dim_v = 128;
  run_case(longkeys, seed++);
}

// The 192 / 128 kernels against d192's over the padded copies of v and o (the switch off): the
// same inputs give the same bits, seed after seed (P·V's columns accumulate alike at n128 and
// n192), each within the criterion. Causal and not, padded views, GQA and MQA.
TEST(ForwardGpu, D192V128AgreesWithTheCopies) {
  FA4_REQUIRE_GPU();
  for (uint32_t seed = 3900; seed < 3912; ++seed)
    for (Case c : {Case{BF16, 2, 239, 300, 4, 2, 192, true}, Case{FP16, 1, 300, 239, 6, 1, 192, seed % 2 == 0}}) {
      c.layout = Layout::kPadded, c.check_padding = true, c.workspace = true, c.head_dim_v = 128;
      std::vector<double> copies, own;
      {
        const fa4::test::ForwardV128 off(false);
        ASSERT_NO_FATAL_FAILURE(run_case(c, seed, &copies));
      }
      {
        const fa4::test::ForwardV128 on(true);
        ASSERT_NO_FATAL_FAILURE(run_case(c, seed, &own));
      }
      ASSERT_EQ(copies.size(), own.size());
      size_t differ = 0;
      for (size_t n = 0; n < own.size(); ++n) differ += !(own[n] == copies[n] || (std::isnan(own[n]) && std::isnan(copies[n])));
      EXPECT_EQ(differ, 0u) << c.name() << " seed " << seed << ": elements unlike the copies' path";
    }
}

// A small 192 / 128 case for the sanitizers: batched, causal, a stream-K cut on a small grid and
// clusters.
TEST(ForwardGpu, D192V128KernelsSmall) {
  FA4_REQUIRE_GPU();
  const fa4::test::ForwardV128 on(true);
  Case c{BF16, 1, 200, 333, 2, 1, 192, true};
  c.head_dim_v = 128;
  run_case(c, 3990);
  Case cut{BF16, 1, 129, 700, 2, 2, 192, false};
  cut.head_dim_v = 128, cut.split = 2, cut.max_ctas = 3;
  run_case(cut, 3991);
  Case pairs{FP16, 1, 300, 200, 2, 2, 192, false};
  pairs.head_dim_v = 128, pairs.split = 1, pairs.cluster = 2;
  run_case(pairs, 3992);
}

// The stream-K tail under a bound: tiles of one query block a head (a few query rows, folded or
// not) see alike key ranges, so their key blocks are cut into pieces as tiles of one length are
// (fwd_launch.cuh, tiles_alike), and the pieces mask by the launch's bound and fold at run time
// (fwd_kernel's kSplitBound). Causal with the rows at the keys' end, windows open and closed on
// the left, a right bound past the diagonal, a last block of one key (a piece whose first rows
// may see none of its keys), an idle consumer (rows placed after the tile's first 64 by the row
// shift), a group too large to fold, whole rounds on the bounded kernels before the pieces,
// every head dim, fp16, BHSD. Cut always (split 2) on a small grid and on the whole device, twice
// for the same bits, then whole (split 1).
TEST(ForwardGpu, BoundedTilesOfOneQueryBlockCutIntoPieces) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 1500;
  for (int64_t d : {64, 128, 192, 256}) {
    const Case cases[] = {
        {BF16, 1, 4, 2049, 8, 8, d, true},                         // MHA, 4 rows a tile, unfolded
        {BF16, 1, 4, 2049, 32, 8, d, true},                        // GQA folded: 16 rows; a 1-key last block
        {BF16, 3, 8, 1500, 6, 6, d, true},                         // 18 tiles: whole rounds, then pieces
        {FP16, 1, 50, 3001, 4, 4, d, false, 700, 0},               // a window closed on the left
        {BF16, 1, 30, 1000, 4, 2, d, false, -1, 5, Layout::kBHSD}, // right bound past the diagonal, folded
        {BF16, 2, 24, 700, 8, 1, d, true},                         // MQA, 24 x 8 rows: 192, unfolded
        {BF16, 1, 64, 4097, 2, 1, d, false, 1000, 1000},           // both sides bounded, MQA folded
    };
    for (Case c : cases)
      for (int ctas : {5, 0}) {
        c.max_ctas = ctas;
        ASSERT_NO_FATAL_FAILURE(expect_cut_alike_and_whole(c, seed++));
      }
  }
  // Through the public API: speculative decoding's shape at batch 1, cut where the launch decides.
  run_case({BF16, 1, 4, 20000, 32, 8, 128, true}, 1600);
  run_case({BF16, 1, 4, 20000, 32, 8, 128, false}, 1601);
  run_case({BF16, 1, 3, 9000, 16, 16, 64, true}, 1602);
}

// n bf16 values drawn from N(0, 1) by rng, in a new device buffer (the caller frees it).
void upload_normal_bf16(std::mt19937& rng, size_t n, uint16_t** dst) {
  std::normal_distribution<float> normal;
  std::vector<uint16_t> host(n);
  for (auto& x : host) x = fa4::ref::float_to_bf16_bits(normal(rng));
  CUDA_OK(cudaMalloc(dst, n * 2));
  CUDA_OK(cudaMemcpy(*dst, host.data(), n * 2, cudaMemcpyHostToDevice));
}

// The output of one forward call on `st`, O poisoned (NaN) before it.
void run_and_download(const fa4::ForwardArgs& a, cudaStream_t st, uint16_t* o, std::vector<uint16_t>& host) {
  CUDA_OK(cudaMemsetAsync(o, 0xFF, host.size() * 2, st));
  const fa4::Status status = fa4::forward(a, st);
  ASSERT_TRUE(status.ok()) << status.message;
  CUDA_OK(cudaStreamSynchronize(st));
  CUDA_OK(cudaMemcpy(host.data(), o, host.size() * 2, cudaMemcpyDeviceToHost));
}

TEST(ForwardGpu, RepeatedRunsAreBitIdentical) {
  FA4_REQUIRE_GPU();
  // A race shows as results that move between runs on the same inputs. Causal (the tile counter)
  // and non-causal (clusters of two sharing K/V: 1000 rows are eight query blocks).
  for (auto [s, causal] : {std::pair<int64_t, bool>{777, true}, {1000, false}}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    const int64_t b = 2, h = 4, d = 128;
    const size_t n = size_t(b * s * h * d);
    std::mt19937 rng(9);
    uint16_t *q, *o;
    ASSERT_NO_FATAL_FAILURE(upload_normal_bf16(rng, n, &q));
    CUDA_OK(cudaMalloc(&o, n * 2));
    fa4::ForwardArgs a;
    a.problem = fa4::test::make_problem(b, s, s, h, h, d, BF16);
    a.problem.causal = causal;
    a.q = a.k = a.v = fa4::bshd(q, s, h, d);
    a.o = fa4::bshd(o, s, h, d);
    std::vector<uint16_t> first(n), again(n);
    for (int run = 0; run < 5; ++run) {
      ASSERT_NO_FATAL_FAILURE(run_and_download(a, nullptr, o, run == 0 ? first : again));
      if (run > 0) ASSERT_EQ(std::memcmp(first.data(), again.data(), n * 2), 0) << "run " << run;
    }
    cudaFree(q);
    cudaFree(o);
  }
}

// A BSHD bf16 problem with K = V, drawn from `seed` (Q, then K/V); the outputs are the caller's.
struct SharedKvCase {
  int64_t b, sq, sk, h, hkv, d;
  bool causal;
  uint16_t *q = nullptr, *kv = nullptr;
  size_t nq() const { return size_t(b * sq * h * d); }
  size_t nkv() const { return size_t(b * sk * hkv * d); }
  void upload(uint32_t seed) {
    std::mt19937 rng(seed);
    ASSERT_NO_FATAL_FAILURE(upload_normal_bf16(rng, nq(), &q));
    ASSERT_NO_FATAL_FAILURE(upload_normal_bf16(rng, nkv(), &kv));
  }
  fa4::ForwardArgs args(uint16_t* out) const {
    fa4::ForwardArgs a;
    a.problem = fa4::test::make_problem(b, sq, sk, h, hkv, d, BF16);
    a.problem.causal = causal;
    a.q = fa4::bshd(q, sq, h, d);
    a.k = a.v = fa4::bshd(kv, sk, hkv, d);
    a.o = fa4::bshd(out, sq, h, d);
    return a;
  }
  ~SharedKvCase() {
    cudaFree(q);
    cudaFree(kv);
  }
};

// Causal GQA with more tiles than SMs, so a launch takes the tile counter: 4 x 600, 16 query heads
// on 4 KV heads, d 64.
SharedKvCase counter_case() { return {4, 600, 600, 16, 4, 64, true}; }
// 100 queries against 16384 keys, 4 heads of d 128: four query tiles, each cut into stream-K
// pieces over every SM, whose last piece merges them at its tile's piece counter.
SharedKvCase tail_case() { return {1, 100, 16384, 4, 4, 128, false}; }

TEST(ForwardGpu, WithoutLseTheSameOutput) {
  FA4_REQUIRE_GPU();
  // An inference call (lse = nullptr) writes no LSE; its O must be the bits of the call that
  // writes one, on each kernel these shapes reach through the public API: d256 causal pairs of
  // four query blocks and the serial step, the tile counter, clusters sharing K/V, stream-K pieces
  // (short queries over many keys), d64, MQA, a seqlen tail. The LSE call's LSE is poisoned first
  // and must come back finite: that call is not the one skipping it.
  const SharedKvCase shapes[] = {
      {2, 512, 512, 8, 8, 256, true},  {1, 1000, 1000, 4, 2, 256, true}, {2, 777, 777, 4, 4, 128, true},
      {2, 1000, 1000, 4, 4, 128, false}, {1, 100, 16384, 4, 4, 128, false}, {2, 150, 8000, 2, 1, 64, false},
      {1, 300, 300, 2, 2, 64, true},
  };
  uint32_t seed = 31;
  for (SharedKvCase cc : shapes) {  // a copy without buffers; it uploads and frees its own
    SCOPED_TRACE("b" + std::to_string(cc.b) + " sq" + std::to_string(cc.sq) + " sk" + std::to_string(cc.sk) +
                 " h" + std::to_string(cc.h) + "/" + std::to_string(cc.hkv) + " d" + std::to_string(cc.d) +
                 (cc.causal ? " causal" : ""));
    ASSERT_NO_FATAL_FAILURE(cc.upload(seed++));
    const size_t nq = cc.nq(), nlse = size_t(cc.b * cc.h * cc.sq);
    uint16_t* o;
    float* lse;
    CUDA_OK(cudaMalloc(&o, nq * 2));
    CUDA_OK(cudaMalloc(&lse, nlse * 4));
    fa4::ForwardArgs a = cc.args(o);
    std::vector<uint16_t> without(nq), with(nq);
    ASSERT_NO_FATAL_FAILURE(run_and_download(a, nullptr, o, without));
    a.lse = lse;
    CUDA_OK(cudaMemset(lse, 0xFF, nlse * 4));
    ASSERT_NO_FATAL_FAILURE(run_and_download(a, nullptr, o, with));
    EXPECT_EQ(std::memcmp(without.data(), with.data(), nq * 2), 0) << "O differs without the LSE";
    std::vector<float> lse_host(nlse);
    CUDA_OK(cudaMemcpy(lse_host.data(), lse, nlse * 4, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(std::all_of(lse_host.begin(), lse_host.end(), [](float x) { return std::isfinite(x); }))
        << "the call with an LSE left some of it unwritten";
    int64_t nan_out = 0;
    for (uint16_t x : without) nan_out += std::isnan(fa4::ref::bf16_bits_to_float(x));
    EXPECT_EQ(nan_out, 0) << "the call without an LSE left O unwritten (NaN poison)";
    cudaFree(o);
    cudaFree(lse);
  }
}

// Launches outside graph capture take their stream's own counters, which each launch leaves zero
// for the next (detail::stream_counters). Two streams at once, launch after launch, and the
// per-thread default stream of two threads at once: every output bit for bit the first direct
// call's. (A counter shared between concurrent launches, or left non-zero, hands out tiles twice
// or not at all, or merges pieces too soon or never: outputs left at their poison or computed
// twice differ.)
void expect_each_streams_counters_stay_right(SharedKvCase& cc, uint32_t seed) {
  ASSERT_NO_FATAL_FAILURE(cc.upload(seed));
  const size_t nq = cc.nq();
  std::array<uint16_t*, 3> o{};
  for (auto& x : o) CUDA_OK(cudaMalloc(&x, nq * 2));
  std::vector<uint16_t> ref(nq), got(nq);
  ASSERT_NO_FATAL_FAILURE(run_and_download(cc.args(o[0]), nullptr, o[0], ref));
  std::array<cudaStream_t, 2> st{};
  for (auto& x : st) CUDA_OK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  for (int round = 0; round < 6; ++round) {
    for (int i = 0; i < 2; ++i) {  // both queued before either is waited for
      CUDA_OK(cudaMemsetAsync(o[1 + i], 0xFF, nq * 2, st[i]));
      const fa4::Status status = fa4::forward(cc.args(o[1 + i]), st[i]);
      ASSERT_TRUE(status.ok()) << status.message;
    }
    for (int i = 0; i < 2; ++i) {
      CUDA_OK(cudaStreamSynchronize(st[i]));
      CUDA_OK(cudaMemcpy(got.data(), o[1 + i], nq * 2, cudaMemcpyDeviceToHost));
      ASSERT_EQ(std::memcmp(ref.data(), got.data(), nq * 2), 0) << "round " << round << ", stream " << i;
    }
  }
  for (auto& x : st) CUDA_OK(cudaStreamDestroy(x));
  std::array<std::string, 2> failure;
  std::array<std::thread, 2> threads;
  for (int i = 0; i < 2; ++i)
    threads[size_t(i)] = std::thread([&, i] {
      std::vector<uint16_t> mine(nq);
      for (int round = 0; round < 4 && failure[size_t(i)].empty(); ++round) {
        if (cudaMemsetAsync(o[1 + i], 0xFF, nq * 2, cudaStreamPerThread) != cudaSuccess ||
            !fa4::forward(cc.args(o[1 + i]), cudaStreamPerThread).ok() ||
            cudaStreamSynchronize(cudaStreamPerThread) != cudaSuccess ||
            cudaMemcpy(mine.data(), o[1 + i], nq * 2, cudaMemcpyDeviceToHost) != cudaSuccess)
          failure[size_t(i)] = "a CUDA call or the launch failed in round " + std::to_string(round);
        else if (std::memcmp(ref.data(), mine.data(), nq * 2) != 0)
          failure[size_t(i)] = "output differs in round " + std::to_string(round);
      }
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(failure[size_t(i)].empty()) << "thread " << i << ": " << failure[size_t(i)];
  for (auto& x : o) cudaFree(x);
}

TEST(ForwardGpu, TileCounterOfEachStreamStaysRight) {
  FA4_REQUIRE_GPU();
  SharedKvCase cc = counter_case();
  expect_each_streams_counters_stay_right(cc, 12);
}

TEST(ForwardGpu, PieceCountersOfEachStreamStayRight) {
  FA4_REQUIRE_GPU();
  SharedKvCase cc = tail_case();
  expect_each_streams_counters_stay_right(cc, 13);
}

TEST(ForwardGpu, RunsAfterADeviceReset) {
  FA4_REQUIRE_GPU();
  // A device reset (cudaDeviceReset) ends the context in which fa4 raised its kernels' shared-memory
  // limits and made its stream counters; both belong to a context (PerDevice and stream_counters
  // key them by current_context_id), so the next context sets and makes its own. A launch on the
  // tile counter and one with a stream-K tail, before and after a reset, on the default stream:
  // the launches succeed and give the same bits. (This test resets the device; ctest runs each
  // test in a process of its own.)
  auto run = [](SharedKvCase&& cc, uint32_t seed, std::vector<uint16_t>& out) {
    ASSERT_NO_FATAL_FAILURE(cc.upload(seed));
    uint16_t* o;
    CUDA_OK(cudaMalloc(&o, cc.nq() * 2));
    out.resize(cc.nq());
    ASSERT_NO_FATAL_FAILURE(run_and_download(cc.args(o), nullptr, o, out));
    cudaFree(o);
  };
  std::array<std::vector<uint16_t>, 2> before, after;
  ASSERT_NO_FATAL_FAILURE(run(counter_case(), 21, before[0]));
  ASSERT_NO_FATAL_FAILURE(run(tail_case(), 22, before[1]));
  CUDA_OK(cudaDeviceReset());
  ASSERT_NO_FATAL_FAILURE(run(counter_case(), 21, after[0]));
  ASSERT_NO_FATAL_FAILURE(run(tail_case(), 22, after[1]));
  EXPECT_TRUE(before[0] == after[0]) << "the tile counter's launch differs after the reset";
  EXPECT_TRUE(before[1] == after[1]) << "the stream-K launch differs after the reset";
}

// Under capture the counters are stream-ordered scratch, allocated and zeroed in the graph (the
// stream's own are not used there): the call must capture and replay, twice, bit for bit the
// direct call's output.
void expect_graph_replays_match_a_direct_call(SharedKvCase& cc, uint32_t seed) {
  ASSERT_NO_FATAL_FAILURE(cc.upload(seed));
  const size_t nq = cc.nq();
  uint16_t* o;
  CUDA_OK(cudaMalloc(&o, nq * 2));
  const fa4::ForwardArgs a = cc.args(o);
  cudaStream_t st;
  CUDA_OK(cudaStreamCreate(&st));
  std::vector<uint16_t> direct(nq), replay(nq);
  ASSERT_NO_FATAL_FAILURE(run_and_download(a, st, o, direct));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  const fa4::Status captured = fa4::forward(a, st);
  CUDA_OK(cudaStreamEndCapture(st, &graph));
  ASSERT_TRUE(captured.ok()) << captured.message;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int run = 0; run < 2; ++run) {  // twice: the counters must start from zero each replay
    CUDA_OK(cudaMemsetAsync(o, 0xFF, nq * 2, st));
    CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    CUDA_OK(cudaMemcpy(replay.data(), o, nq * 2, cudaMemcpyDeviceToHost));
    ASSERT_EQ(std::memcmp(direct.data(), replay.data(), nq * 2), 0) << "replay " << run;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  cudaFree(o);
}

TEST(ForwardGpu, CapturedInACudaGraphMatchesADirectCall) {
  FA4_REQUIRE_GPU();
  {
    SCOPED_TRACE("the tile counter");
    SharedKvCase cc = counter_case();
    expect_graph_replays_match_a_direct_call(cc, 11);
  }
  {
    SCOPED_TRACE("stream-K pieces");
    SharedKvCase cc = tail_case();
    expect_graph_replays_match_a_direct_call(cc, 14);
  }
  // The decoding kernel's splits: their partials in scratch allocated inside the graph, their merge
  // (decode_combine_kernel) a programmatic dependent launch in it.
  for (int64_t d : {64, 128}) {
    SCOPED_TRACE("decoding splits, d " + std::to_string(d));
    SharedKvCase cc{2, 1, 9000, 16, 4, d, false};
    expect_graph_replays_match_a_direct_call(cc, 15);
  }
}

}  // namespace
