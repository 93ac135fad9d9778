// The shipped sm90 forward configurations, and which one a launch takes (with_shipped_config:
// d64_consumers and d256_block_keys in fwd_launch.cuh). sm90_fwd.cu launches
// through it; tests that check a shipped kernel's protocol or shared memory name the
// configurations from here.
#pragma once

#include <string>
#include <type_traits>

#include "sm90/fwd_kernel.cuh"
#include "sm90/fwd_launch.cuh"
#include "sm90_fwd_d192_schedule.h"
#include "sm90_fwd_d256_schedule.h"
#include "sm90_fwd_d256_serial_schedule.h"
#include "sm90_fwd_schedule.h"

namespace fa4::sm90 {

// d64 is exp-bound: 128-key blocks, a deep ring, and three consumers (192-row tiles) so that two
// softmaxes hide under one GEMM, or two where 192-row tiles would compute too many scores. Four
// (256-row tiles) where 192-row ones would compute too much padding or, under a causal bound, too
// much of the diagonal: their 112 registers a thread hold S of 64 keys, so 64-key blocks in a ring
// of the same 512 keys.
template <bool kBF16, int kConsumers>
using D64Config = std::conditional_t<kConsumers == 4, FwdConfig<64, 64, 8, kBF16, 0, 4>,
                                     FwdConfig<64, 128, 4, kBF16, 0, kConsumers>>;

// d128: the K/V ring depth the solver's (scheduler/generated/sm90_fwd_schedule.h).
template <bool kBF16>
using D128Config = FwdConfig<128, 128, sched::sm90_fwd::kKVStages, kBF16, 0>;

// d192 as d256 (exact softmax steps, one P buffer, O staged in each tile's last K/V slots) on
// 112-key blocks, the widest that the solver's two K/V stages leave room for beside one Q buffer
// (scheduler/generated/sm90_fwd_d192_schedule.h: 48 + 4 x 42 KB): O 96 + S 56 + P 28 registers a
// thread, no spills. Under causal and window bounds too. A paged cache's on 64-key blocks (a
// power of two: a block on one page or on whole pages) in three stages, 48 + 6 x 24 KB (at two
// the bounded page-lane kernels spill 16-20 bytes).
template <bool kBF16, int kBlockN = 112>
using D192Config = FwdConfig<192, kBlockN, kBlockN == 112 ? sched::sm90_fwd_d192::kKVStages : 3, kBF16, 0, 2, true,
                             true, false, false, false, true>;

// A configuration of Base with a narrower value side, kDv columns of V and O (DeepSeek's 192 / 128):
// P V's GEMM N = kDv, O's registers kDv / 2 a thread, V blocks of kDv / 64 chunks in slots of
// Base's size (the shared layout stays Base's), O stored by maps of kDv columns. Only where
// FwdParams::v_cols says so (launch_forward refuses other widths).
template <class Base, int kDv>
struct ValueDimConfig : Base {
  static_assert(kDv % Base::kAtomCols == 0 && kDv < Base::kHeadDim, "a value side of whole chunks, narrower");
  static constexpr int kHeadDimV = kDv;
  static constexpr int kVChunks = kDv / Base::kAtomCols;
  static constexpr int kVBytes = Base::kBlockN * kDv * 2;
};

// 192 / 128 on d192's tiles (detail::native_value_dim, with set_forward_v128): O 64 registers a
// thread where d192's holds 96.
template <bool kBF16>
using D192V128Config = ValueDimConfig<D192Config<kBF16>, 128>;

// d256 keeps O (128 fp32 registers a thread) beside a narrow S: 80-key blocks, or 64 under a causal
// or window bound where the key ranges are short. O is staged in each tile's last K/V slots (no
// other shared memory is left for it); the K/V ring depth the solver's
// (scheduler/generated/sm90_fwd_d256_schedule.h).
template <int kBlockN, bool kBF16>
using D256Config =
    FwdConfig<256, kBlockN, sched::sm90_fwd_d256::kKVStages, kBF16, 0, 2, true, true, false, false, false, true>;

// d256 on 128-key blocks with the serial step (FwdConfig::kSerialStep): the short causal rows and
// short keys without a bound (d256_block_keys). Q 64 KB, consumer 0's O 32 KB, and K and V rings
// of the solver's depths (scheduler/generated/sm90_fwd_d256_serial_schedule.h: one slot each,
// 64 KB a slot, keeps the tensor core's II; FwdConfig takes one depth for both). A K or V block
// loads as one TMA box (folded_kv; in clusters each CTA's half of the column chunks): with Q and O
// folded too (FwdConfig::kFoldedQO), H100 d256 causal 512 +0.5 / +0.6 %, 512 +0.7 %, H200 causal 512
// +0.7 / +0.8 %, the other d256 rows within +-0.3 % (docs/perf-notes.md, "Folded boxes at d256").
static_assert(sched::sm90_fwd_d256_serial::kKStages == sched::sm90_fwd_d256_serial::kVStages,
              "FwdConfig has one ring depth for K and V");
template <bool kBF16>
struct D256SerialConfig : FwdConfig<256, 128, sched::sm90_fwd_d256_serial::kKStages, kBF16, 0, 2, true, true, false,
                                    false, false, true, 0, false, true> {
  static constexpr bool kFoldedKV = true;
};

// f.template operator()<Cfg>() with the configuration the launch `a` takes at its head dim (16-bit
// type kBF16 or fp16): the one dispatch, for the library and for tests that wrap the shipped
// configurations (tests/lagged_kernels.cu).
template <bool kBF16, class F>
Status with_shipped_config(const detail::FwdParams& a, F&& f) {
  switch (a.head_dim) {
    case 64:
      switch (d64_consumers(a)) {
        case 2: return f.template operator()<D64Config<kBF16, 2>>();
        case 4: return f.template operator()<D64Config<kBF16, 4>>();
        default: return f.template operator()<D64Config<kBF16, 3>>();
      }
    case 128: return f.template operator()<D128Config<kBF16>>();
    case 192:
      if (a.v_cols == 128) return f.template operator()<D192V128Config<kBF16>>();
      return f.template operator()<D192Config<kBF16>>();
    case 256:
      switch (d256_block_keys(a)) {
        case 128: return f.template operator()<D256SerialConfig<kBF16>>();
        case 64: return f.template operator()<D256Config<64, kBF16>>();
        default: return f.template operator()<D256Config<80, kBF16>>();
      }
    default:
      return {StatusCode::kNotSupported, "head_dim = " + std::to_string(a.head_dim) + " has no sm90 kernel"};
  }
}

// The configurations of variable-length batches (fwd_launch.cuh, launch_forward<Cfg, true>): whole
// tiles on single CTAs with a Window::shift of 0. A subset, to keep the kernels built few: d64
// takes 128- or 192-row tiles by d64_consumers (on the longest sequence; its 256-row tiles go to
// 192), d128 its own, d256 80-key blocks without a bound and 64 under one (D256Config's choice on
// long rows; the serial step, for short ones, is left out).
template <bool kBF16, class F>
Status with_varlen_config(const detail::FwdParams& a, F&& f) {
  switch (a.head_dim) {
    case 64:
      if (d64_consumers(a) == 2) return f.template operator()<D64Config<kBF16, 2>>();
      return f.template operator()<D64Config<kBF16, 3>>();
    case 128: return f.template operator()<D128Config<kBF16>>();
    case 192:
      if (a.v_cols == 128) return f.template operator()<D192V128Config<kBF16>>();
      return f.template operator()<D192Config<kBF16>>();
    case 256:
      if (tiles_of_one_length(a)) return f.template operator()<D256Config<80, kBF16>>();
      return f.template operator()<D256Config<64, kBF16>>();
    default:
      return {StatusCode::kNotSupported, "head_dim = " + std::to_string(a.head_dim) + " has no sm90 kernel"};
  }
}

// A configuration with soft-capped scores (fwd_kernel.cuh, softcapped): the same tiles, launched on
// single CTAs (launch_forward builds no cluster kernel for it), with a stream-K tail where tiles of
// one length leave the grid idle (decoding over long keys).
template <class Base>
struct SoftcapConfig : Base {
  static_assert(Base::kHeadDimV == Base::kHeadDim, "soft-capped kernels of one head dim (detail::native_value_dim)");
  static constexpr bool kSoftcap = true;
  // The cap's reciprocal on the FMA pipe (softcap_score: a MUFU op less a score) in the kernels
  // that gain by it (fwd_kernel.cuh, cap_recip_on_fma), but at d256, where its registers in flight
  // spill (24-52 bytes).
  static constexpr bool kCapFmaRecip = Base::kHeadDim <= 128;
};

// A paged KV cache's configurations (sm90_fwd_paged.cu): the same tiles, their loaders looking
// each key block's pages up in the entry's table row (fwd_kernel.cuh, paged_config). Launched on
// single CTAs, only the kernels that read entries' keys (a paged cache's launch takes them as
// seqused_k's: fwd_launch.cuh, entry_keys).
// kLanes: the loaders hand each block to page lanes (pages smaller than a key block, and packed
// queries); otherwise a block lies on one page and the loaders load it themselves.
template <class Base, bool kLanes>
struct PagedConfig : Base {
  static constexpr bool kPagedKV = true;
  static constexpr bool kPageLanes = kLanes;
  static_assert(Base::kConsumers == 2, "a paged cache's kernels run on two consumers");
  static_assert(Base::kHeadDimV == Base::kHeadDim, "a paged cache's kernels of one head dim (detail::native_value_dim)");
  // The page lanes' hand-over (fwd_kernel.cuh, PagedLoads), after the barriers.
  static constexpr int kPagedOffset = Base::kBarOffset + Base::kBarBytes;
  static constexpr int kSmemBytes = Base::kSmemBytes + 128;
  static_assert(kSmemBytes <= Base::kSmemLimit, "shared memory over the sm90 limit");
};

// The paged configurations, soft-capped or not: d64 on two consumers (d64_consumers), d128 its
// own, d192 and d256 on 64-key blocks (a power of two: a block on one page or on whole pages).
template <bool kBF16, bool kLanes, class F>
Status with_paged_config(const detail::FwdParams& a, F&& f) {
  const bool cap = a.softcap > 0.0f;
  switch (a.head_dim) {
    case 64:
      if (cap) return f.template operator()<SoftcapConfig<PagedConfig<D64Config<kBF16, 2>, kLanes>>>();
      return f.template operator()<PagedConfig<D64Config<kBF16, 2>, kLanes>>();
    case 128:
      if (cap) return f.template operator()<SoftcapConfig<PagedConfig<D128Config<kBF16>, kLanes>>>();
      return f.template operator()<PagedConfig<D128Config<kBF16>, kLanes>>();
    case 192:
      if (cap) return f.template operator()<SoftcapConfig<PagedConfig<D192Config<kBF16, 64>, kLanes>>>();
      return f.template operator()<PagedConfig<D192Config<kBF16, 64>, kLanes>>();
    case 256:
      if (cap) return f.template operator()<SoftcapConfig<PagedConfig<D256Config<64, kBF16>, kLanes>>>();
      return f.template operator()<PagedConfig<D256Config<64, kBF16>, kLanes>>();
    default:
      return {StatusCode::kNotSupported, "head_dim = " + std::to_string(a.head_dim) + " has no sm90 kernel"};
  }
}

// The soft-capped configurations (sm90_fwd_softcap.cu), few to keep the kernels built few: d64 on
// two consumers (128-row tiles; on three ptxas spills 68-76 bytes with the cap), d128 its own,
// d256 80-key blocks without a bound and 64 under one.
template <bool kBF16, class F>
Status with_softcap_config(const detail::FwdParams& a, F&& f) {
  switch (a.head_dim) {
    case 64: return f.template operator()<SoftcapConfig<D64Config<kBF16, 2>>>();
    case 128: return f.template operator()<SoftcapConfig<D128Config<kBF16>>>();
    case 192: return f.template operator()<SoftcapConfig<D192Config<kBF16>>>();
    case 256:
      if (tiles_of_one_length(a)) return f.template operator()<SoftcapConfig<D256Config<80, kBF16>>>();
      return f.template operator()<SoftcapConfig<D256Config<64, kBF16>>>();
    default:
      return {StatusCode::kNotSupported, "head_dim = " + std::to_string(a.head_dim) + " has no sm90 kernel"};
  }
}

}  // namespace fa4::sm90
