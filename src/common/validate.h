// Host-side rules the API enforces before any launch, and the resolution of defaults that turns
// valid arguments into kernel parameters: pure functions, testable without a GPU (except
// check_current_device). validate(ForwardArgs) / validate(BackwardArgs) themselves are public
// (fa4/attention.h); everything here is defined in validate.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/bwd_params.h"
#include "common/fwd_params.h"
#include "fa4/attention.h"

namespace fa4::detail {

// Bytes per element of `dtype` (0 for a value outside the enum).
int element_size(DType dtype);
// The dtype of o for inputs of `dtype`: the same, but bf16 for fp8 (e4m3).
inline DType output_dtype(DType dtype) { return dtype == DType::kE4M3 ? DType::kBF16 : dtype; }

// kOk when a device of compute capability major.minor can run fa4's kernels, else kNoDevice:
// below kMinComputeCapability "compute capability X.Y found, fa4 needs 9.0 (Hopper, sm_90a)";
// a later major architecture is refused too, since sm_90a code runs on 9.x only.
Status check_compute_capability(int major, int minor);

// Asks the runtime for the current device and applies check_compute_capability; kNoDevice when
// there is no usable device at all.
Status check_current_device();

// kCudaError "<what>: <error name> (<error string>)".
Status cuda_failure(const std::string& what, cudaError_t e);

// Checks args.problem alone (sizes, dtype, head_dim, scale, window); the tensors are not read.
Status validate_problem(const Problem& p);

// The passes whose kernels exist at different head dims.
enum class Pass { kForward, kBackward };

// The head dim whose kernels run the call: the smallest at or above the larger of p.head_dim and
// p.value_dim() of kForwardKernelHeadDims (the 16-bit forward; the backward with
// backward_d192(), and 192 / 128's with backward_v128()) or kKernelHeadDims (the backward, the
// e4m3 forward); 0 past the largest. Other
// than the call's head dims, the tensors run as zero-padded copies (common/pad.h).
int64_t kernel_head_dim(const Problem& p, Pass pass);

// Whether the backward runs head dims 136-192 on kernels of head dim 192 (sm90/bwd_dkdv_wgmma.cuh,
// bwd_dkdv_split_kernel) instead of on d256's over zero-padded copies: off by default until those
// kernels have run on a GPU (docs/perf-notes.md, "A backward kernel of its own at d192"); the GPU
// tests turn it on around their d192 cases. Process-wide; kernel_head_dim, padded and the
// workspace's size follow it, so a call's size query and the call must see the same setting.
// Until set, it is what the environment variable FA4_BACKWARD_D192 says when first asked
// (kernel_switch_from_env: "1" on, "0" off, else the default).
void set_backward_d192(bool on);
bool backward_d192();
// A kernel switch's setting from its environment variable's value: "1" on, "0" off, anything
// else (unset, empty, other words) `by_default`.
bool kernel_switch_from_env(const char* value, bool by_default);

// Whether the 16-bit forward runs 192 / 128 on kernels of a 128-column value side (fwd_configs.cuh,
// D192V128Config) instead of over copies of v and o padded to 192: off by default until those
// kernels have run on a GPU (docs/perf-notes.md, "The forward at 192 / 128 without copies"); the
// GPU tests turn it on around their cases. As set_backward_d192: process-wide, FA4_FORWARD_V128
// ("1" on, "0" off) sets it when first asked.
void set_forward_v128(bool on);
bool forward_v128();
// Whether the backward runs 192 / 128 (DeepSeek's) on the d192 kernels with a 128-column value side
// (BwdConfig<192, ..., 128>) instead of on d256's over copies padded to 256 (or, with
// set_backward_d192 alone, on d192's with v, o, dout and dv padded to 192): on by default since
// those kernels ran 1.00-1.45 x the copies on an H200, never below (docs/perf-notes.md, "The d192
// backward, the 192 / 128 forward and the in-place o, first GPU run"). As the others:
// process-wide, FA4_BACKWARD_V128 ("1" on, "0" off) sets it when first asked.
void set_backward_v128(bool on);
bool backward_v128();
// Their defaults where the environment says nothing.
inline constexpr bool kBackwardD192ByDefault = false;
inline constexpr bool kForwardV128ByDefault = false;
inline constexpr bool kBackwardV128ByDefault = true;

// Whether p's two head dims (p.value_dim() beside p.head_dim) run on kernels of their own in that
// pass: one head dim always; 192 / 128 (DeepSeek's) in the backward with backward_v128(), in the
// forward with forward_v128() where neither soft-capped nor from a paged cache (those
// configurations' kernels have one head dim) nor e4m3.
bool native_value_dim(const Problem& p, Pass pass, bool paged = false);

// Whether the call runs over zero-padded copies: a head dim without a kernel of its own in that
// pass, or two head dims without one (native_value_dim). paged: the forward's keys and values from
// a paged cache (ForwardArgs::paged).
bool padded(const Problem& p, Pass pass, bool paged = false);

// Bytes of workspace that backward's kernels need: the fp32 dQ accumulator and two fp32 a row, for
// D = rowsum(dO * O) and the LSE in log2 units:
// batch * round_up(seqlen_q, kDqAccumRowAlign) * heads_q * (kernel_head_dim(p, Pass::kBackward) + 2) * 4.
// false when the product overflows int64. `p` must pass validate_problem.
bool dq_accum_bytes(const Problem& p, int64_t* bytes);

// The visible-key window after folding `causal` in (right = min(right, 0), or 0 if unbounded)
// and mapping a bound that can never bind to -1: left >= seqlen_k or right >= seqlen_q
// (both exact: such a bound excludes no key of any row). Results fit in int.
void resolve_window(const Problem& p, int64_t* left, int64_t* right);

// A single query row a head (decoding) under GQA/MQA: each KV head's group of query heads, which
// all see the same keys, folded into that many query rows of one head, by strides alone (row g of
// KV head hk is query head hk * group + g; the LSE's [batch, heads_q, 1] layout is the folded
// [batch, heads_kv, group] one). A tile then holds a group's rows instead of one, and K and V are
// read once a KV head. Applies where every folded row sees every key: seqlen_q = 1 and no left
// bound that excludes a key (a right bound never does for the one bottom-right query). Returns
// whether it folded.
bool fold_query_groups(FwdParams* f);

// A few query rows a head under GQA/MQA (speculative decoding, short prefill chunks): each KV head's
// group of query heads folded into rows (s, m) = s * group + m of one head, where the group is a
// power of two from 2 to 64 and seqlen_q * group <= kFoldRowsMax. Unlike fold_query_groups the rows'
// queries differ, so the kernel reads each row's query and query head from FwdParams::fold (its
// masks, its Q and O maps and the LSE's index). Returns whether it folded.
inline constexpr int kFoldRowsMax = 128;
bool fold_query_rows(FwdParams* f);

// Kernel parameters for arguments that passed validate(): scale defaulted, window resolved, query
// groups folded where they can be (fold_query_groups, else fold_query_rows).
FwdParams make_fwd_params(const ForwardArgs& args);
BwdParams make_bwd_params(const BackwardArgs& args);

// "0x..." for a pointer, "null" for nullptr, as the error messages print them.
std::string format_pointer(const void* p);

}  // namespace fa4::detail
