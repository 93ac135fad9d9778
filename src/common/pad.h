// Head dims without a kernel of their own (fa4/attention.h, kMaxHeadDim), and calls with two head
// dims (Problem::head_dim_v): a call runs on the next kernel head dim's kernels (validate.h,
// kernel_head_dim), on copies of its tensors zero-padded to that head dim. Zero columns add
// nothing to any q.k and make only columns of o, dq, dk and dv that are dropped, so the result is
// the unpadded problem's, with its scale (1/sqrt(head_dim) by default, not the kernel head dim's).
//
// The plan (which tensors, their copies' shapes and places) is host code, testable without a GPU;
// the copies and the run are in pad.cu.
#pragma once

#include <array>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "fa4/attention.h"

namespace fa4::detail {

// Each copy starts at a multiple of this many bytes of the base (TMA needs 16).
inline constexpr int64_t kPadAlign = 256;

// One tensor of the call and its zero-padded copy.
struct PadCopy {
  const char* name;  // the argument's, for messages ("q", "dout", ...)
  TensorRef user;    // the caller's: rows of `cols` elements
  int64_t cols;      // head_dim, or on the value side (v, o, dout, dv) Problem::value_dim()
  void* padded;      // the copy: contiguous [rows[0], rows[1], rows[2], kernel head dim]
  int64_t rows[3];   // [batch, seq, heads], or [1, total, heads] packed, or [pages, page_size, heads]
  int elem_size;     // bytes
  bool in;           // filled from the caller's before the kernels, zero past cols
  bool out;          // its first cols columns copied back to the caller's after them
  // Where set (int32 [rows[0]] on the device: Varlen::leftpad_k and seqused_k of batched k and v),
  // the rows s of entry b copied in are only those in [seq_begin[b], seq_end[b]): the kernels
  // read no other key row, so a KV cache's unfilled rows are not copied.
  const int32_t* seq_begin = nullptr;
  const int32_t* seq_end = nullptr;
  // A paged cache's pool gathered (where pages is set: PagedKV::block_table): the copy is a dense
  // pool of rows[0] = batch * entry_pages pages, its page b * entry_pages + j the caller's page
  // pages[b * table_stride + j] (clamped to [0, pool_pages)), so that the copy holds only the
  // pages the entries' tables name (and with seq_end only their key rows: j * page_size + s).
  const int32_t* pages = nullptr;
  int64_t table_stride = 0, entry_pages = 0, pool_pages = 0;
};

// A call's copies and the arguments its kernels take instead of the caller's: the kernel head dim
// (that of the larger of head_dim and head_dim_v) for both, the scale resolved from the caller's
// head_dim, the tensors the copies (others as they were).
template <class Args>
struct PaddedCall {
  Args args;
  std::array<PadCopy, 8> copies{};
  int count = 0;
  int64_t bytes = 0;  // the copies' bytes, each rounded up to kPadAlign; -1 when past int64
  // A gathered paged cache's block table (args.paged.block_table), int32 [table_entries]: entry
  // n is n, written before the kernels run.
  int32_t* table = nullptr;
  int64_t table_entries = 0;
  // The 16-bit forward on the kernels of head dim 64 and 128 reads q, k and v and writes o where
  // they are (FwdParams::qk_cols, v_cols: TMA fills the columns past a map's extent with zeros and
  // clips its stores there, the decoding kernel's copies of those pieces take zero bytes, and
  // stores from registers skip them), and so does the backward on every kernel with every tensor
  // (BwdParams::qk_cols, v_cols: its loads by TMA in 64-column boxes, D's kernel's reads of o and
  // dout and every store bounded), so nothing is copied: the caller's columns of q and k (dq, dk),
  // and of v and o (dout, dv). 0: the tensors are copies (or already of the kernel head dim).
  int64_t qk_cols = 0, v_cols = 0;
};

// The copies of a forward or backward call at a head dim without a kernel (none of a tensor
// already of the kernel head dim: with head_dim_v, one side may be; a paged cache's k and v both or
// neither, its pages gathered into a dense pool of their own table; in the 16-bit forward on the
// kernels of 64 and 128, and in the backward, none at all: PaddedCall::qk_cols), placed from `base`
// (null: sized only, its tensors' pointers null). Reads the problem, the varlen totals (with
// cu_seqlens) and the paged cache's geometry (with a block table); for placing, args must have
// passed validate(). The forward's o is copied in too with cu_seqlens (its rows outside every sequence
// are left as they were); the backward keeps args.workspace (the kernels' dQ accumulator).
PaddedCall<ForwardArgs> pad_forward(const ForwardArgs& args, void* base);
PaddedCall<BackwardArgs> pad_backward(const BackwardArgs& args, void* base);

// Where the backward's copies start in its workspace: after the kernels' need (dq_accum_bytes),
// rounded up to kPadAlign.
int64_t backward_pad_offset(const Problem& p);

// Runs a validated call whose head dim has no kernel: the forward's copies from the workspace
// (16-byte aligned) where it holds them, else from cudaMallocAsync on `stream` (freed in stream
// order after the kernels); the copies in, `run` on the padded call's arguments with
// PaddedCall::qk_cols and v_cols, the copies out. The backward copies nothing: `run` on
// pad_backward's arguments and columns.
Status forward_padded(const ForwardArgs& args, cudaStream_t stream,
                      Status (*run)(const ForwardArgs&, int qk_cols, int v_cols, cudaStream_t));
Status backward_padded(const BackwardArgs& args, cudaStream_t stream,
                       Status (*run)(const BackwardArgs&, int qk_cols, int v_cols, cudaStream_t));

}  // namespace fa4::detail
