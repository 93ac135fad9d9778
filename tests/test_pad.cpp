// Head dims without a kernel (common/pad.h): the plan of the zero-padded copies, on the CPU. The
// copies and the results are checked on a GPU in the forward, backward, varlen and fp8 suites
// (their PaddedHeadDims tests).
#include <algorithm>
#include <cmath>
#include <random>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "common/pad.h"
#include "common/pad_units.h"
#include "common/validate.h"
#include "convert.h"
#include "reference.h"
#include "fa4/attention.h"
#include "test_support.h"

namespace {

using fa4::BackwardArgs;
using fa4::DType;
using fa4::ForwardArgs;
using fa4::Problem;
using fa4::TensorRef;
using fa4::detail::PadCopy;
using fa4::test::fake;

constexpr int64_t kB = 3, kSq = 100, kSk = 70, kHq = 8, kHkv = 2;

ForwardArgs forward_at(int64_t d, DType t = DType::kBF16) {
  ForwardArgs a = fa4::test::fake_forward(fa4::test::make_problem(kB, kSq, kSk, kHq, kHkv, d, t));
  a.q = fa4::bhsd(fake(0), kSq, kHq, d);  // BHSD: the copies are BSHD whatever the caller's strides
  return a;
}

void expect_contiguous(const TensorRef& t, const int64_t (&rows)[3], int64_t d, const std::string& what) {
  EXPECT_EQ(t.head_stride, d) << what;
  EXPECT_EQ(t.seq_stride, rows[2] * d) << what;
  EXPECT_EQ(t.batch_stride, rows[1] * rows[2] * d) << what;
}

// Each copy at base + the rounded bytes of those before it, 16-byte aligned; returns the end.
int64_t expect_packed_from(const fa4::detail::PaddedCall<ForwardArgs>& c, uint8_t* base, int64_t d) {
  int64_t at = 0;
  for (int i = 0; i < c.count; ++i) {
    const PadCopy& x = c.copies[i];
    EXPECT_EQ(x.padded, base + at) << x.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(x.padded) % 16, 0u) << x.name;
    const int64_t bytes = x.rows[0] * x.rows[1] * x.rows[2] * d * x.elem_size;
    at += (bytes + 255) / 256 * 256;
  }
  EXPECT_EQ(at, c.bytes);
  return at;
}

TEST(PadPlan, ForwardCopiesQKVInAndOOut) {
  const ForwardArgs a = forward_at(200);  // on 256's kernels (64's and 128's read q, k, v in place)
  alignas(256) static uint8_t base_storage[1];
  uint8_t* base = base_storage;
  const auto c = fa4::detail::pad_forward(a, base);
  ASSERT_EQ(c.count, 4);
  EXPECT_EQ(c.args.problem.head_dim, 256);
  EXPECT_EQ(c.qk_cols, 0);
  EXPECT_FLOAT_EQ(c.args.problem.softmax_scale, float(1.0 / std::sqrt(200.0)));  // the caller's head dim's
  EXPECT_EQ(c.args.lse, a.lse);  // rows, not columns: written in place
  EXPECT_EQ(c.args.workspace, nullptr);
  const char* names[] = {"q", "k", "v", "o"};
  const TensorRef* user[] = {&a.q, &a.k, &a.v, &a.o};
  const TensorRef* kernel[] = {&c.args.q, &c.args.k, &c.args.v, &c.args.o};
  for (int i = 0; i < 4; ++i) {
    const PadCopy& x = c.copies[i];
    EXPECT_STREQ(x.name, names[i]);
    EXPECT_EQ(x.user.data, user[i]->data);
    EXPECT_EQ(x.user.seq_stride, user[i]->seq_stride);
    EXPECT_EQ(x.user.head_stride, user[i]->head_stride);
    EXPECT_EQ(x.elem_size, 2);
    EXPECT_EQ(x.in, i < 3) << x.name;  // o: batched, every row written
    EXPECT_EQ(x.out, i == 3) << x.name;
    EXPECT_EQ(kernel[i]->data, x.padded);
    expect_contiguous(*kernel[i], x.rows, 256, x.name);
    const int64_t rows[3] = {kB, i == 1 || i == 2 ? kSk : kSq, i == 1 || i == 2 ? kHkv : kHq};
    for (int j = 0; j < 3; ++j) EXPECT_EQ(x.rows[j], rows[j]) << x.name;
  }
  expect_packed_from(c, base, 256);
  EXPECT_EQ(c.bytes, (2 * kB * kSq * kHq + 2 * kB * kSk * kHkv) * 256 * 2);
  // Sized only: the same bytes, no pointers.
  const auto sized = fa4::detail::pad_forward(a, nullptr);
  EXPECT_EQ(sized.bytes, c.bytes);
  EXPECT_EQ(sized.args.q.data, nullptr);
  // A scale given stays the caller's.
  ForwardArgs s = a;
  s.problem.softmax_scale = 0.3f;
  EXPECT_EQ(fa4::detail::pad_forward(s, nullptr).args.problem.softmax_scale, 0.3f);
}

// The 16-bit forward on the kernels of 64 and 128: q, k, v and o where they are (their columns the
// maps' extents and the register stores' bound: PaddedCall::qk_cols, v_cols), nothing copied; a
// paged cache's pool and table as the caller's (nothing gathered). e4m3 and the kernels of 192 and
// 256 copy them.
TEST(PadPlan, ForwardOnTheKernelsOf64And128RunsInPlace) {
  ForwardArgs a = forward_at(96);
  auto c = fa4::detail::pad_forward(a, fake(9));
  EXPECT_EQ(c.args.problem.head_dim, 128);
  EXPECT_EQ(c.qk_cols, 96);
  EXPECT_EQ(c.v_cols, 96);
  EXPECT_EQ(c.count, 0);
  EXPECT_EQ(c.args.q.data, a.q.data);
  EXPECT_EQ(c.args.q.seq_stride, a.q.seq_stride);
  EXPECT_EQ(c.args.k.head_stride, a.k.head_stride);
  EXPECT_EQ(c.args.v.data, a.v.data);
  EXPECT_EQ(c.args.o.data, a.o.data);
  EXPECT_EQ(c.args.o.seq_stride, a.o.seq_stride);
  EXPECT_EQ(c.bytes, 0);
  // Two head dims, the value side the wider and a kernel head dim of its own: nothing to copy.
  a = forward_at(64);
  a.problem.head_dim_v = 128;
  a.v = fa4::bshd(fake(2), kSk, kHkv, 128);
  a.o = fa4::bshd(fake(3), kSq, kHq, 128);
  c = fa4::detail::pad_forward(a, fake(9));
  EXPECT_EQ(c.count, 0);
  EXPECT_EQ(c.qk_cols, 64);
  EXPECT_EQ(c.v_cols, 128);
  EXPECT_EQ(c.bytes, 0);
  // A paged cache: the caller's pool and table.
  a = forward_at(40);
  a.paged = {static_cast<const int32_t*>(fake(5)), 8, 16, 1000};
  a.k = a.v = fa4::bshd(fake(1), 16, kHkv, 40);
  c = fa4::detail::pad_forward(a, fake(9));
  EXPECT_EQ(c.count, 0);
  EXPECT_EQ(c.table, nullptr);
  EXPECT_EQ(c.args.paged.block_table, a.paged.block_table);
  EXPECT_EQ(c.args.paged.num_pages, 1000);
  EXPECT_EQ(c.args.k.data, a.k.data);
  // e4m3: copies (its kernel reads V through a transposed copy of whole rows).
  c = fa4::detail::pad_forward(forward_at(96, DType::kE4M3), fake(9));
  EXPECT_EQ(c.qk_cols, 0);
  EXPECT_EQ(c.count, 4);
}

TEST(PadPlan, KernelHeadDimsByHeadDim) {
  const fa4::test::BackwardD192 off(false);  // (the default routing)
  // (the forward's; 136-184 on 192's kernels, the backward's on 256's)
  for (const auto& [d, k] : {std::pair{8, 64}, {40, 64}, {80, 128}, {136, 192}, {184, 192}, {200, 256}, {248, 256}}) {
    EXPECT_EQ(fa4::detail::pad_forward(forward_at(d), nullptr).args.problem.head_dim, k) << d;
    EXPECT_EQ(fa4::detail::pad_forward(forward_at(d, DType::kE4M3), nullptr).args.problem.head_dim, d <= 128 ? k : 256)
        << "e4m3 " << d;
    BackwardArgs b;
    b.problem = fa4::test::make_problem(kB, kSq, kSk, kHq, kHkv, d);
    EXPECT_EQ(fa4::detail::pad_backward(b, nullptr).args.problem.head_dim, d <= 128 ? k : 256) << d;
  }
}

TEST(PadPlan, PackedOIsCopiedInToKeepItsOtherRows) {
  ForwardArgs a = forward_at(40);
  a.varlen.cu_seqlens_q = static_cast<const int32_t*>(fake(5));
  a.varlen.cu_seqlens_k = static_cast<const int32_t*>(fake(6));
  a.varlen.total_q = 250, a.varlen.total_k = 33;
  auto c = fa4::detail::pad_forward(a, fake(9));
  EXPECT_EQ(c.count, 0);  // (in place on 64's kernels: they write only the sequences' rows)
  EXPECT_EQ(c.args.varlen.cu_seqlens_q, a.varlen.cu_seqlens_q);
  EXPECT_EQ(c.args.problem.head_dim, 64);
  // On 256's kernels every tensor is copied: q, k, v of the packed rows.
  ForwardArgs wide = forward_at(200);
  wide.varlen = a.varlen;
  c = fa4::detail::pad_forward(wide, fake(9));
  ASSERT_EQ(c.count, 4);
  EXPECT_TRUE(c.copies[3].in);
  EXPECT_EQ(c.copies[0].rows[1], 250);
  EXPECT_EQ(c.copies[1].rows[1], 33);
  EXPECT_EQ(c.copies[1].rows[2], kHkv);
}

// Batch entries with keys of their own (a KV cache's filled rows, from a left pad): k and v copy in
// only the rows the kernels read; packed and paged keys copy every row.
TEST(PadPlan, EntriesOwnKeysBoundTheKeyCopies) {
  ForwardArgs a = forward_at(200);
  a.varlen.seqused_k = static_cast<const int32_t*>(fake(5));
  a.varlen.leftpad_k = static_cast<const int32_t*>(fake(6));
  auto c = fa4::detail::pad_forward(a, fake(9));
  for (int i = 0; i < 4; ++i) {
    const bool key_side = i == 1 || i == 2;
    EXPECT_EQ(c.copies[i].seq_end, key_side ? a.varlen.seqused_k : nullptr) << c.copies[i].name;
    EXPECT_EQ(c.copies[i].seq_begin, key_side ? a.varlen.leftpad_k : nullptr) << c.copies[i].name;
  }
  // A paged cache's keys: bounded by seqused_k too (leftpad_k does not go with pages).
  a.paged = {static_cast<const int32_t*>(fake(7)), 8, 16, 37};
  a.varlen.leftpad_k = nullptr;
  c = fa4::detail::pad_forward(a, fake(9));
  for (int i = 0; i < 4; ++i) {
    const bool key_side = i == 1 || i == 2;
    EXPECT_EQ(c.copies[i].seq_end, key_side ? a.varlen.seqused_k : nullptr) << c.copies[i].name;
    EXPECT_EQ(c.copies[i].seq_begin, nullptr) << c.copies[i].name;
  }
  // Packed keys: every row (their spans' ends are cu_seqlens_k's).
  ForwardArgs packed = forward_at(200);
  packed.varlen = {static_cast<const int32_t*>(fake(5)), static_cast<const int32_t*>(fake(6)), 300, 200,
                   static_cast<const int32_t*>(fake(7))};
  c = fa4::detail::pad_forward(packed, fake(9));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(c.copies[i].seq_end, nullptr) << c.copies[i].name;
}

// A paged cache: the pages each entry's table names (ceil(seqlen_k / page_size) of them) gathered
// into a dense pool of their own, whatever the caller's pool holds; k and v both, one table.
TEST(PadPlan, PagedPoolsGatherTheEntriesPages) {
  ForwardArgs a = forward_at(200);  // kSk = 70 keys an entry: 5 pages of 16
  a.paged = {static_cast<const int32_t*>(fake(5)), 8, 16, 1000};
  a.k = a.v = fa4::bshd(fake(1), 16, kHkv, 200);
  a.varlen.seqused_k = static_cast<const int32_t*>(fake(6));
  const auto c = fa4::detail::pad_forward(a, fake(9));
  for (int i : {1, 2}) {
    EXPECT_EQ(c.copies[i].rows[0], kB * 5);  // not the pool's 1000 pages
    EXPECT_EQ(c.copies[i].rows[1], 16);
    EXPECT_EQ(c.copies[i].rows[2], kHkv);
    EXPECT_EQ(c.copies[i].pages, a.paged.block_table);
    EXPECT_EQ(c.copies[i].table_stride, 8);
    EXPECT_EQ(c.copies[i].entry_pages, 5);
    EXPECT_EQ(c.copies[i].pool_pages, 1000);
    EXPECT_EQ(c.copies[i].seq_end, a.varlen.seqused_k);
  }
  EXPECT_EQ(c.args.k.batch_stride, 16 * kHkv * 256);  // a page of the copy
  EXPECT_EQ(c.table_entries, kB * 5);
  EXPECT_EQ(c.args.paged.block_table, c.table);
  EXPECT_EQ(c.args.paged.table_stride, 5);
  EXPECT_EQ(c.args.paged.num_pages, kB * 5);
  EXPECT_EQ(c.args.paged.page_size, 16);
  EXPECT_FALSE(c.copies[3].in);
  // The table between v's copy and o's, 256-byte aligned.
  const int64_t at = reinterpret_cast<uint8_t*>(c.table) - static_cast<uint8_t*>(fake(9));
  const int64_t v_end = static_cast<uint8_t*>(c.copies[2].padded) - static_cast<uint8_t*>(fake(9)) +
                        kB * 5 * 16 * kHkv * 256 * 2;
  EXPECT_EQ(at, v_end);
  EXPECT_EQ(at % 256, 0);
  EXPECT_EQ(static_cast<uint8_t*>(c.copies[3].padded) - static_cast<uint8_t*>(fake(9)), at + (kB * 5 * 4 + 255) / 256 * 256);
  // With head_dim_v = 256, v needs no copy; k does, and so v is copied too (one table for both).
  ForwardArgs two = a;
  two.problem.head_dim_v = 256;
  two.v = fa4::bshd(fake(2), 16, kHkv, 256);
  two.o = fa4::bshd(fake(3), kSq, kHq, 256);
  const auto t = fa4::detail::pad_forward(two, nullptr);
  ASSERT_EQ(t.count, 3);  // q, k, v (o is 256 wide: not copied)
  EXPECT_STREQ(t.copies[2].name, "v");
  EXPECT_EQ(t.copies[2].cols, 256);
  EXPECT_EQ(t.copies[2].pages, a.paged.block_table);
}

// The gather through the kernels' unit map, emulated: copy page b * 5 + j holds the caller's page
// table[b][j] (clamped to the pool), zero-padded, its rows past the entry's keys not copied.
TEST(PadUnits, GatheredPagesEmulated) {
  const int64_t B = 3, P = 5, PS = 16, H = 2, d = 40, D = 64, pool = 9, ts = 7;
  std::vector<uint16_t> user(size_t(pool * PS * H * d));
  for (size_t n = 0; n < user.size(); ++n) user[n] = uint16_t(n * 7 + 1);
  std::vector<int32_t> table(size_t(B * ts), -5);  // unread columns past P hold garbage
  const int32_t ids[B][P] = {{3, 0, 8, 1, 2}, {4, 4, 7, 5, 6}, {-2, 9, 100, 0, 1}};  // (clamped: 0, 8, 8)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < P; ++j) table[size_t(b * ts + j)] = ids[b][j];
  const std::vector<int32_t> used = {80, 33, 0};
  fa4::detail::PadCopy c{"k", {user.data(), PS * H * d, H * d, d}, d, nullptr, {B * P, PS, H}, 2, true, false};
  c.pages = table.data(), c.table_stride = ts, c.entry_pages = P, c.pool_pages = pool, c.seq_end = used.data();
  std::vector<uint16_t> copy(size_t(B * P * PS * H * D), 0xABAB);
  c.padded = copy.data();
  const auto map = fa4::detail::units_of<int64_t>(c, D);
  auto load = [](const int32_t* e) { return *e; };
  for (int64_t i = 0; i < fa4::detail::units_in(c, D); ++i) {
    const auto x = map.at(i, load);
    if (!map.row_copied(x, load)) continue;
    if (x.live) std::memcpy(reinterpret_cast<uint8_t*>(copy.data()) + i * 16, reinterpret_cast<uint8_t*>(user.data()) + x.user, 16);
    else std::memset(reinterpret_cast<uint8_t*>(copy.data()) + i * 16, 0, 16);
  }
  int64_t bad = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < P; ++j) {
      const int64_t page = std::clamp<int64_t>(ids[b][j], 0, pool - 1);
      for (int64_t s = 0; s < PS; ++s)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t x = 0; x < D; ++x) {
            const uint16_t got = copy[size_t((((b * P + j) * PS + s) * H + h) * D + x)];
            const bool copied = j * PS + s < used[size_t(b)];
            const uint16_t want = !copied ? 0xABAB : x < d ? user[size_t(((page * PS + s) * H + h) * d + x)] : 0;
            bad += got != want;
          }
    }
  EXPECT_EQ(bad, 0);
}

TEST(PadPlan, Fp8InputsOfOneByteAndABf16Output) {
  const auto c = fa4::detail::pad_forward(forward_at(80, DType::kE4M3), fake(9));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.copies[i].elem_size, 1) << c.copies[i].name;
  EXPECT_EQ(c.copies[3].elem_size, 2);
  EXPECT_EQ(c.args.problem.dtype, DType::kE4M3);
  EXPECT_EQ(c.bytes, (kB * kSq * kHq * 128 + 2 * ((kB * kSk * kHkv * 128 + 255) / 256 * 256)) +
                         kB * kSq * kHq * 128 * 2);
}

// On every backward kernel every tensor is read and written where it is: no copies, the caller's
// columns handed on (BwdParams::qk_cols, v_cols), the workspace the accumulator's at the kernel
// head dim alone.
TEST(PadPlan, BackwardInPlaceOnEveryKernel) {
  const fa4::test::BackwardD192 off(false);  // (the default routing)
  const fa4::test::BackwardV128 v128_off(false);  // (192 / 128 on 256's)
  for (const auto& [d, dv, k] : {std::tuple{72, 72, 128}, {40, 40, 64}, {8, 8, 64}, {64, 128, 128}, {128, 64, 128},
                                 {40, 72, 128}, {120, 120, 128}, {200, 200, 256}, {136, 136, 256}, {192, 128, 256},
                                 {64, 136, 256}, {248, 248, 256}}) {
    SCOPED_TRACE(std::to_string(d) + " / " + std::to_string(dv));
    BackwardArgs a;
    a.problem = fa4::test::make_problem(kB, kSq, kSk, kHq, kHkv, d);
    a.problem.head_dim_v = dv == d ? 0 : dv;
    a.q = a.dq = fa4::bshd(fake(0), kSq, kHq, d);
    a.o = a.dout = fa4::bshd(fake(2), kSq, kHq, dv);
    a.k = a.dk = fa4::bshd(fake(1), kSk, kHkv, d);
    a.v = a.dv = fa4::bshd(fake(3), kSk, kHkv, dv);
    a.workspace = fake(7);
    a.workspace_bytes = 12345;
    const auto c = fa4::detail::pad_backward(a, fake(8));
    EXPECT_EQ(c.count, 0);
    EXPECT_EQ(c.bytes, 0);
    EXPECT_EQ(c.qk_cols, d);
    EXPECT_EQ(c.v_cols, dv);
    EXPECT_EQ(c.args.problem.head_dim, k);
    EXPECT_EQ(c.args.problem.head_dim_v, 0);
    EXPECT_FLOAT_EQ(c.args.problem.softmax_scale, float(1.0 / std::sqrt(double(d))));
    EXPECT_EQ(c.args.q.data, a.q.data);
    EXPECT_EQ(c.args.dv.data, a.dv.data);
    EXPECT_EQ(c.args.dv.seq_stride, a.dv.seq_stride);
    EXPECT_EQ(c.args.workspace, a.workspace);
    int64_t accum = 0;
    ASSERT_TRUE(fa4::detail::dq_accum_bytes(a.problem, &accum));
    EXPECT_EQ(accum, kB * 128 * kHq * (k + 2) * 4);
    size_t bytes = 0;
    ASSERT_TRUE(fa4::backward_workspace_size(a, &bytes).ok());
    EXPECT_EQ(int64_t(bytes), fa4::detail::backward_pad_offset(a.problem)) << "the accumulator alone";
  }
}

// With the d192 kernels on, 136-184 (and two head dims within 192) on them, still in place.
TEST(PadPlan, BackwardInPlaceOnTheD192Kernels) {
  const fa4::test::BackwardD192 on(true);
  for (const auto& [d, dv] : {std::pair<int64_t, int64_t>{160, 160}, {136, 136}, {160, 128}, {192, 64}}) {
    BackwardArgs a;
    a.problem = fa4::test::make_problem(kB, kSq, kSk, kHq, kHkv, d);
    a.problem.head_dim_v = dv == d ? 0 : dv;
    const auto c = fa4::detail::pad_backward(a, fake(8));
    EXPECT_EQ(c.args.problem.head_dim, 192) << d << " / " << dv;
    EXPECT_EQ(c.count, 0) << d << " / " << dv;
    EXPECT_EQ(c.qk_cols, d);
    EXPECT_EQ(c.v_cols, dv);
  }
}

// Two head dims (DeepSeek's 192 / 128, its own kernels switched off): both sides on the kernel head
// dim of the larger (the forward's 192, the backward's 256), each copy of its own side's columns;
// the scale the qk head dim's.
TEST(PadPlan, TwoHeadDimsOnTheLargersKernel) {
  const fa4::test::BackwardD192 off(false);  // (the default routing)
  const fa4::test::BackwardV128 v128_off(false);  // (192 / 128's backward over copies, as before its kernels)
  ForwardArgs a = forward_at(192);
  a.problem.head_dim_v = 128;
  const auto c = fa4::detail::pad_forward(a, fake(9));
  EXPECT_EQ(c.args.problem.head_dim, 192);
  EXPECT_EQ(c.args.problem.head_dim_v, 0);
  EXPECT_FLOAT_EQ(c.args.problem.softmax_scale, float(1.0 / std::sqrt(192.0)));
  ASSERT_EQ(c.count, 2);  // q and k are already 192 wide: the value side alone is copied
  const char* value_side[] = {"v", "o"};
  for (int i = 0; i < 2; ++i) {
    EXPECT_STREQ(c.copies[i].name, value_side[i]);
    EXPECT_EQ(c.copies[i].cols, 128) << value_side[i];
  }
  EXPECT_EQ(c.args.q.data, a.q.data);
  BackwardArgs g0;
  g0.problem = a.problem;
  g0.q = g0.dq = a.q, g0.k = g0.dk = a.k, g0.v = g0.dv = a.v, g0.o = g0.dout = a.o;
  const auto gc = fa4::detail::pad_backward(g0, fake(8));
  EXPECT_EQ(gc.args.problem.head_dim, 256);
  EXPECT_EQ(gc.count, 0);  // (the backward copies nothing: each side's columns handed on)
  EXPECT_EQ(gc.qk_cols, 192);
  EXPECT_EQ(gc.v_cols, 128);
  a.problem.head_dim = 64, a.problem.head_dim_v = 160;  // the value side the wider
  EXPECT_EQ(fa4::detail::pad_forward(a, nullptr).args.problem.head_dim, 192);
  a.problem.head_dim_v = 200;
  EXPECT_EQ(fa4::detail::pad_forward(a, nullptr).args.problem.head_dim, 256);
  BackwardArgs b;
  b.problem = fa4::test::make_problem(kB, kSq, kSk, kHq, kHkv, 128);
  b.problem.head_dim_v = 64;
  b.q = b.dq = fa4::bshd(fake(0), kSq, kHq, 128);
  b.k = b.dk = fa4::bshd(fake(1), kSk, kHkv, 128);
  const auto g = fa4::detail::pad_backward(b, fake(8));
  EXPECT_EQ(g.args.problem.head_dim, 128);
  // On d128's kernels every tensor is taken as it is, the value side's 64 columns handed on.
  EXPECT_EQ(g.count, 0);
  EXPECT_EQ(g.qk_cols, 128);
  EXPECT_EQ(g.v_cols, 64);
  EXPECT_EQ(g.args.q.data, b.q.data);
  EXPECT_EQ(g.args.dk.seq_stride, b.dk.seq_stride);
  EXPECT_EQ(g.bytes, 0);
  // The dQ accumulator at the kernel head dim (128), not at either of the caller's.
  int64_t accum = 0;
  ASSERT_TRUE(fa4::detail::dq_accum_bytes(b.problem, &accum));
  EXPECT_EQ(accum, kB * 128 * kHq * (128 + 2) * 4);
}

// The copy kernels' unit map (pad_units.h) walked on the CPU, both copies emulated as the kernels do
// them: the copy holds each row's caller columns then zeros (rows outside an entry's keys left as
// the scratch held them), and the copy back writes exactly the caller's columns of every row (the
// bytes between rows and heads untouched). Strided layouts (BHSD; a spare head and spare rows),
// 1- and 2-byte elements, and both index types.
template <class Index>
void emulate_copies(int elem, int64_t d, int64_t padded_dim, bool bhsd, bool entries) {
  SCOPED_TRACE("elem " + std::to_string(elem) + " d " + std::to_string(d) + " on " + std::to_string(padded_dim) +
               (bhsd ? " bhsd" : " padded bshd") + (entries ? " entries' keys" : "") +
               (sizeof(Index) == 4 ? " uint32" : " int64"));
  const int64_t B = 3, S = 37, H = 2;
  int64_t st[3];  // elements
  if (bhsd) st[0] = H * S * d, st[1] = d, st[2] = S * d;
  else st[2] = d, st[1] = (H + 1) * d, st[0] = (S + 3) * st[1];
  const int64_t span = (B - 1) * st[0] + (S - 1) * st[1] + (H - 1) * st[2] + d + st[1];
  std::vector<uint8_t> user(size_t(span * elem)), back(user.size(), 0xCD);
  for (size_t n = 0; n < user.size(); ++n) user[n] = uint8_t(n * 131 + 7);
  const std::vector<int32_t> begin = {0, 5, 40}, end = {37, 20, -3};  // clamped by the comparison
  const fa4::detail::PadUnits<Index> map{Index(S),     Index(H),     int(padded_dim * elem / 16),
                                         int(d * elem / 16),      st[0] * elem, st[1] * elem,
                                         st[2] * elem,            entries ? begin.data() : nullptr,
                                         entries ? end.data() : nullptr, nullptr, 0, 0, 0};
  const int64_t row_bytes = padded_dim * elem, units = B * S * H * (row_bytes / 16);
  std::vector<uint8_t> padded(size_t(units * 16), 0xAB);
  auto load = [](const int32_t* e) { return *e; };
  for (Index i = 0; i < Index(units); ++i) {  // in
    const auto x = map.at(i, load);
    if (!map.row_copied(x, load)) continue;
    if (x.live) std::memcpy(&padded[size_t(i) * 16], &user[size_t(x.user)], 16);
    else std::memset(&padded[size_t(i) * 16], 0, 16);
  }
  int64_t bad = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h) {
        const uint8_t* row = &padded[size_t(((b * S + s) * H + h) * row_bytes)];
        const uint8_t* src = &user[size_t((b * st[0] + s * st[1] + h * st[2]) * elem)];
        const bool copied = !entries || (s >= begin[size_t(b)] && s < end[size_t(b)]);
        for (int64_t x = 0; x < row_bytes; ++x)
          bad += row[x] != (!copied ? 0xAB : x < d * elem ? src[x] : 0);
      }
  EXPECT_EQ(bad, 0) << "bytes of the copy wrong";
  for (Index i = 0; i < Index(units); ++i) {  // out
    const auto x = map.at(i, load);
    if (x.live) std::memcpy(&back[size_t(x.user)], &padded[size_t(i) * 16], 16);
  }
  int64_t wrong = 0, stray = 0;
  std::vector<char> inside(back.size(), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h) {
        const bool copied = !entries || (s >= begin[size_t(b)] && s < end[size_t(b)]);
        const size_t at = size_t((b * st[0] + s * st[1] + h * st[2]) * elem);
        for (int64_t x = 0; x < d * elem; ++x) {
          inside[at + size_t(x)] = 1;
          wrong += back[at + size_t(x)] != (copied ? user[at + size_t(x)] : 0xAB);
        }
      }
  for (size_t n = 0; n < back.size(); ++n) stray += !inside[n] && back[n] != 0xCD;
  EXPECT_EQ(wrong, 0) << "caller's columns not restored";
  EXPECT_EQ(stray, 0) << "bytes outside the caller's columns written";
}

TEST(PadUnits, EmulatedCopiesPadAndRestoreExactly) {
  for (bool bhsd : {false, true})
    for (bool entries : {false, true}) {
      emulate_copies<uint32_t>(2, 40, 64, bhsd, entries);
      emulate_copies<uint32_t>(2, 96, 128, bhsd, entries);
      emulate_copies<uint32_t>(2, 200, 256, bhsd, entries);
      emulate_copies<uint32_t>(2, 152, 192, bhsd, entries);  // 24 units a row: not a power of two
      emulate_copies<uint32_t>(1, 80, 128, bhsd, entries);
      emulate_copies<int64_t>(2, 136, 192, bhsd, entries);
      emulate_copies<int64_t>(1, 16, 64, bhsd, entries);
    }
}

// ---- the padded call emulated on the CPU ------------------------------------------------------

// What forward_padded and backward_padded do, with host memory in the device's place: the plan
// placed in a host scratch, the copies in through the kernels' unit maps (units_of), the float64
// reference of the padded problem (the kernels' problem: kernel head dim, explicit scale) in the
// kernels' place, the copies out; against the reference of the caller's problem, each element
// within one bf16 step. The caller's tensors sit between spare heads (BHSD or BSHD strides) that
// must keep their poison.

// bf16 [b, s, h, cols] with a spare head: BSHD rows of h + 1 heads, or BHSD of h + 1 heads.
struct HostTensor {
  std::vector<uint16_t> bits;
  TensorRef ref;
  int64_t b, s, h, cols;
  static constexpr uint16_t kPoison = 0xFFFF;
  HostTensor(int64_t b_, int64_t s_, int64_t h_, int64_t cols_, bool bhsd) : b(b_), s(s_), h(h_), cols(cols_) {
    const int64_t hh = h + 1;
    bits.assign(size_t(b * s * hh * cols), kPoison);
    ref = bhsd ? TensorRef{bits.data(), hh * s * cols, cols, s * cols} : TensorRef{bits.data(), s * hh * cols, hh * cols, cols};
  }
  uint16_t& at(int64_t i, int64_t j, int64_t k, int64_t x) {
    return bits[size_t(i * ref.batch_stride + j * ref.seq_stride + k * ref.head_stride + x)];
  }
  void fill(std::mt19937& rng) {
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < s; ++j)
        for (int64_t k = 0; k < h; ++k)
          for (int64_t x = 0; x < cols; ++x) at(i, j, k, x) = fa4::ref::float_to_bits(DType::kBF16, n(rng));
  }
  std::vector<double> values() {  // contiguous BSHD
    std::vector<double> v;
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < s; ++j)
        for (int64_t k = 0; k < h; ++k)
          for (int64_t x = 0; x < cols; ++x) v.push_back(fa4::ref::bits_to_float(DType::kBF16, at(i, j, k, x)));
    return v;
  }
  int64_t spare_written() {
    int64_t n = 0;
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < s; ++j)
        for (int64_t x = 0; x < cols; ++x) n += at(i, j, h, x) != kPoison;
    return n;
  }
};

// A strided bf16 tensor [b, s, h, cols] (a TensorRef over host memory) as contiguous BSHD doubles,
// and back, rounded.
std::vector<double> read(const TensorRef& t, int64_t b, int64_t s, int64_t h, int64_t cols) {
  std::vector<double> v;
  const auto* p = static_cast<const uint16_t*>(t.data);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < s; ++j)
      for (int64_t k = 0; k < h; ++k)
        for (int64_t x = 0; x < cols; ++x)
          v.push_back(fa4::ref::bits_to_float(DType::kBF16, p[i * t.batch_stride + j * t.seq_stride + k * t.head_stride + x]));
  return v;
}
// What the kernels read of t at the kernel head dim D: its first `cols` columns (D where t is a
// copy), zeros past them (TMA's fill past a map's extent).
std::vector<double> kernel_read(const TensorRef& t, int64_t b, int64_t s, int64_t h, int64_t cols, int64_t D) {
  const std::vector<double> got = read(t, b, s, h, cols);
  std::vector<double> v;
  for (size_t r = 0; r < got.size() / size_t(cols); ++r)
    for (int64_t x = 0; x < D; ++x) v.push_back(x < cols ? got[r * size_t(cols) + size_t(x)] : 0.0);
  return v;
}
void write(const TensorRef& t, int64_t b, int64_t s, int64_t h, int64_t cols, const std::vector<double>& v) {
  auto* p = static_cast<uint16_t*>(t.data);
  size_t n = 0;
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < s; ++j)
      for (int64_t k = 0; k < h; ++k)
        for (int64_t x = 0; x < cols; ++x)
          p[i * t.batch_stride + j * t.seq_stride + k * t.head_stride + x] =
              fa4::ref::float_to_bits(DType::kBF16, float(v[n++]));
}
// The kernels' store of v (rows of D) into t: its first `cols` columns of each row (D where t is a
// copy); the others are not written (TMA's clip at a map's extent, the bounded register stores).
void kernel_write(const TensorRef& t, int64_t b, int64_t s, int64_t h, int64_t cols, int64_t D,
                  const std::vector<double>& v) {
  std::vector<double> kept;
  for (size_t r = 0; r < v.size() / size_t(D); ++r)
    for (int64_t x = 0; x < cols; ++x) kept.push_back(v[r * size_t(D) + size_t(x)]);
  write(t, b, s, h, cols, kept);
}

// A call's copies in or out as copy_set's grid walks them (copy_set_of, copy_of, the unit maps).
template <class Call>
void emulate_set(const Call& call, bool in, int64_t padded_dim) {
  int64_t work = 0;
  const auto set = fa4::detail::copy_set_of<int64_t>(call, in, padded_dim, &work);
  auto load = [](const int32_t* e) { return *e; };
  for (int64_t i = 0; i < work; ++i) {
    if (i < set.end[set.count - 1]) {
      int64_t local = 0;
      const int j = fa4::detail::copy_of(set, i, &local);
      ASSERT_LT(j, set.count);
      const auto& map = set.map[j];
      auto* padded = static_cast<uint8_t*>(set.padded[j]);
      auto* user = static_cast<uint8_t*>(set.user[j]);
      const auto x = map.at(local, load);
      if (in) {
        if (map.row_copied(x, load)) {
          if (x.live) std::memcpy(padded + local * 16, user + x.user, 16);
          else std::memset(padded + local * 16, 0, 16);
        }
      } else if (x.live) {
        std::memcpy(user + x.user, padded + local * 16, 16);
      }
    }
    if (in && i < set.table_entries) set.table[i] = int32_t(i);
  }
}

// Each element of got within one bf16 step of want (both already bf16 values).
int64_t beyond_one_step(const std::vector<double>& got, const std::vector<double>& want) {
  int64_t n = got.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    n += !(std::fabs(got[i] - want[i]) <= std::ldexp(std::fabs(want[i]), -7) + 1e-30);
  return n;
}

void emulate_padded_call(int64_t d, int64_t dv, bool bhsd) {
  SCOPED_TRACE("head_dim " + std::to_string(d) + " head_dim_v " + std::to_string(dv) + (bhsd ? " bhsd" : " bshd"));
  const int64_t B = 2, SQ = 9, SK = 13, HQ = 4, HKV = 2;
  Problem p = fa4::test::make_problem(B, SQ, SK, HQ, HKV, d);
  p.head_dim_v = dv == d ? 0 : dv;
  p.causal = true;
  std::mt19937 rng(uint32_t(d * 7 + dv));
  HostTensor q(B, SQ, HQ, d, bhsd), k(B, SK, HKV, d, bhsd), v(B, SK, HKV, dv, bhsd), o(B, SQ, HQ, dv, bhsd),
      dout(B, SQ, HQ, dv, bhsd), dq(B, SQ, HQ, d, bhsd), dk(B, SK, HKV, d, bhsd), dv_t(B, SK, HKV, dv, bhsd);
  for (HostTensor* t : {&q, &k, &v, &dout}) t->fill(rng);

  // The forward.
  ForwardArgs f;
  f.problem = p;
  f.q = q.ref, f.k = k.ref, f.v = v.ref, f.o = o.ref;
  const int64_t D = fa4::detail::kernel_head_dim(p, fa4::detail::Pass::kForward);
  const auto sized = fa4::detail::pad_forward(f, nullptr);
  std::vector<uint8_t> scratch(size_t(sized.bytes) + 256);
  void* base = scratch.data() + (256 - reinterpret_cast<uintptr_t>(scratch.data()) % 256) % 256;
  const auto call = fa4::detail::pad_forward(f, base);
  emulate_set(call, true, D);
  const Problem& kp = call.args.problem;
  ASSERT_EQ(kp.head_dim, D);
  const int64_t qk_cols = call.qk_cols > 0 ? call.qk_cols : D, v_cols = call.v_cols > 0 ? call.v_cols : D;
  EXPECT_EQ(call.qk_cols > 0, D <= 128) << "q, k and v read in place on the kernels of 64 and 128";
  const auto kf = fa4::ref::forward(kp, kernel_read(call.args.q, B, SQ, HQ, qk_cols, D),
                                    kernel_read(call.args.k, B, SK, HKV, qk_cols, D),
                                    kernel_read(call.args.v, B, SK, HKV, v_cols, D));
  kernel_write(call.args.o, B, SQ, HQ, call.v_cols > 0 ? call.v_cols : D, D, kf.o);
  emulate_set(call, false, D);
  const auto want = fa4::ref::forward(p, q.values(), k.values(), v.values());
  EXPECT_EQ(beyond_one_step(o.values(), fa4::ref::rounded(DType::kBF16, want.o)), 0) << "o";
  EXPECT_EQ(o.spare_written(), 0) << "o's spare head";

  // The backward, on the forward's O.
  BackwardArgs g;
  g.problem = p;
  g.q = q.ref, g.k = k.ref, g.v = v.ref, g.o = o.ref, g.dout = dout.ref;
  g.dq = dq.ref, g.dk = dk.ref, g.dv = dv_t.ref;
  const auto gsized = fa4::detail::pad_backward(g, nullptr);
  std::vector<uint8_t> gscratch(size_t(gsized.bytes) + 256);
  void* gbase = gscratch.data() + (256 - reinterpret_cast<uintptr_t>(gscratch.data()) % 256) % 256;
  const auto gcall = fa4::detail::pad_backward(g, gbase);
  const int64_t G = fa4::detail::kernel_head_dim(p, fa4::detail::Pass::kBackward);  // (192: 256's, or 192's with set_backward_d192)
  ASSERT_EQ(gcall.args.problem.head_dim, G);
  emulate_set(gcall, true, G);
  // The caller's tensors, read and written at their own columns, on every kernel.
  EXPECT_EQ(gcall.count, 0) << "every tensor in place";
  EXPECT_GT(gcall.qk_cols, 0);
  const int64_t gqk = gcall.qk_cols > 0 ? gcall.qk_cols : G, gv = gcall.v_cols > 0 ? gcall.v_cols : G;
  const auto kg = fa4::ref::backward(gcall.args.problem, kernel_read(gcall.args.q, B, SQ, HQ, gqk, G),
                                     kernel_read(gcall.args.k, B, SK, HKV, gqk, G),
                                     kernel_read(gcall.args.v, B, SK, HKV, gv, G),
                                     kernel_read(gcall.args.dout, B, SQ, HQ, gv, G));
  kernel_write(gcall.args.dq, B, SQ, HQ, gqk, G, kg.dq);
  kernel_write(gcall.args.dk, B, SK, HKV, gqk, G, kg.dk);
  kernel_write(gcall.args.dv, B, SK, HKV, gv, G, kg.dv);
  emulate_set(gcall, false, G);
  const auto gw = fa4::ref::backward(p, q.values(), k.values(), v.values(), dout.values());
  EXPECT_EQ(beyond_one_step(dq.values(), fa4::ref::rounded(DType::kBF16, gw.dq)), 0) << "dq";
  EXPECT_EQ(beyond_one_step(dk.values(), fa4::ref::rounded(DType::kBF16, gw.dk)), 0) << "dk";
  EXPECT_EQ(beyond_one_step(dv_t.values(), fa4::ref::rounded(DType::kBF16, gw.dv)), 0) << "dv";
  for (HostTensor* t : {&dq, &dk, &dv_t}) EXPECT_EQ(t->spare_written(), 0) << "a gradient's spare head";
}

TEST(PadEmulated, ForwardAndBackwardEqualTheCallersProblem) {
  const fa4::test::BackwardV128 v128_off(false);  // (192 / 128's backward on 256's, in place)
  for (bool bhsd : {false, true}) {
    emulate_padded_call(40, 40, bhsd);    // on 64's kernels
    emulate_padded_call(96, 96, bhsd);    // on 128's
    emulate_padded_call(192, 128, bhsd);  // DeepSeek's: the forward on 192's, the backward on 256's
    emulate_padded_call(152, 152, bhsd);  // the same split
    emulate_padded_call(128, 64, bhsd);   // q and k taken as they are
    emulate_padded_call(64, 136, bhsd);   // the value side the wider
  }
}

// With the backward's d192 kernels on (detail::set_backward_d192): 136-184, and two head dims other
// than DeepSeek's 192 / 128 (which has kernels of its own there), on 192's in both passes, the
// copies' units rows of 24 (192 columns).
TEST(PadEmulated, BackwardOnTheD192Kernels) {
  const fa4::test::BackwardD192 on(true);
  ASSERT_EQ(fa4::detail::kernel_head_dim(fa4::test::make_problem(1, 9, 13, 4, 2, 152), fa4::detail::Pass::kBackward),
            192);
  for (bool bhsd : {false, true}) {
    emulate_padded_call(160, 128, bhsd);
    emulate_padded_call(152, 152, bhsd);
    emulate_padded_call(136, 184, bhsd);
  }
}

// One launch a direction: the set of the copies in (with a gathered pool's table) and of those out,
// each copy's units a range of the set's, copy_of finding a unit's copy at the ranges' edges.
TEST(PadUnits, CopySetsCoverEachDirectionsCopies) {
  // (the forward at 200 on 256's kernels: q, k and v in, o out)
  const auto call = fa4::detail::pad_forward(forward_at(200), fake(8));
  int64_t work = 0;
  const auto in = fa4::detail::copy_set_of<uint32_t>(call, true, 256, &work);
  ASSERT_EQ(in.count, 3);  // q, k, v
  const uint32_t q_units = kB * kSq * kHq * 32, kv_units = kB * kSk * kHkv * 32;
  const uint32_t ends[] = {q_units, q_units + kv_units, q_units + 2 * kv_units};
  for (int j = 0; j < 3; ++j) EXPECT_EQ(in.end[j], ends[j]) << j;
  EXPECT_EQ(work, int64_t{ends[2]});
  EXPECT_EQ(in.padded[1], call.copies[1].padded);
  uint32_t local = 0;
  EXPECT_EQ(fa4::detail::copy_of(in, q_units - 1, &local), 0);
  EXPECT_EQ(local, q_units - 1);
  EXPECT_EQ(fa4::detail::copy_of(in, q_units, &local), 1);
  EXPECT_EQ(local, 0u);
  EXPECT_EQ(fa4::detail::copy_of(in, ends[2], &local), 3);  // past every copy
  const auto out = fa4::detail::copy_set_of<uint32_t>(call, false, 256, &work);
  ASSERT_EQ(out.count, 1);  // o
  EXPECT_EQ(out.user[0], call.copies[3].user.data);
  EXPECT_EQ(out.table, nullptr);
  // A gathered pool's table rides with the copies in; the launch covers it where it is longer.
  ForwardArgs a = forward_at(200);
  a.paged = {static_cast<const int32_t*>(fake(5)), 8, 16, 1000};
  a.k = a.v = fa4::bshd(fake(1), 16, kHkv, 200);
  const auto pc = fa4::detail::pad_forward(a, fake(9));
  const auto pin = fa4::detail::copy_set_of<uint32_t>(pc, true, 256, &work);
  EXPECT_EQ(pin.table, pc.table);
  EXPECT_EQ(int64_t{pin.table_entries}, kB * 5);
  EXPECT_GE(work, int64_t{pin.end[pin.count - 1]});
}

// Packed sequences (cu_seqlens): the kernels write only the rows inside sequences, so where o is a
// copy it is copied in too and its other rows go back as they came (on 256's kernels); in place
// (64's, 128's) they are never written. Emulated with each sequence's float64 forward in the
// kernels' place (written into o's rows of that sequence alone, clipped at its columns).
void emulate_packed(int64_t d, int64_t dv, int64_t D) {
  SCOPED_TRACE("head_dim " + std::to_string(d) + " head_dim_v " + std::to_string(dv) + " on " + std::to_string(D));
  const int64_t HQ = 4, HKV = 2;
  const std::vector<int32_t> cu_q = {2, 7, 7, 20}, cu_k = {0, 11, 15, 30};  // rows 0-1, 20-22 outside
  const int64_t total_q = 23, total_k = 33, batch = 3;
  std::mt19937 rng(5);
  HostTensor q(1, total_q, HQ, d, false), k(1, total_k, HKV, d, false), v(1, total_k, HKV, dv, false),
      o(1, total_q, HQ, dv, true);
  for (HostTensor* t : {&q, &k, &v}) t->fill(rng);
  o.fill(rng);  // what the rows outside every sequence hold before the call
  const std::vector<uint16_t> o_before = o.bits;
  ForwardArgs f;
  f.problem = fa4::test::make_problem(batch, 13, 15, HQ, HKV, d);
  f.problem.head_dim_v = dv;
  f.problem.causal = true;
  f.q = q.ref, f.k = k.ref, f.v = v.ref, f.o = o.ref;
  f.q.batch_stride = f.k.batch_stride = f.v.batch_stride = f.o.batch_stride = 0;  // (not read)
  f.varlen = {cu_q.data(), cu_k.data(), total_q, total_k};
  const auto sized = fa4::detail::pad_forward(f, nullptr);
  std::vector<uint8_t> scratch(size_t(sized.bytes) + 256);
  void* base = scratch.data() + (256 - reinterpret_cast<uintptr_t>(scratch.data()) % 256) % 256;
  const auto call = fa4::detail::pad_forward(f, base);
  ASSERT_EQ(call.args.problem.head_dim, D);
  const bool in_place = D <= 128;
  ASSERT_EQ(call.count, in_place ? 0 : 4);  // in place, or q, k, v and o (in and out)
  if (!in_place) ASSERT_TRUE(call.copies[3].in && call.copies[3].out);
  const int64_t qk_cols = in_place ? d : D, v_cols = in_place ? dv : D;
  ASSERT_EQ(call.qk_cols, in_place ? d : 0);
  ASSERT_EQ(call.v_cols, in_place ? dv : 0);
  emulate_set(call, true, D);
  for (int64_t b = 0; b < batch; ++b) {  // the kernels: each sequence's rows of the copy
    const int64_t q0 = cu_q[size_t(b)], sq = cu_q[size_t(b) + 1] - q0, k0 = cu_k[size_t(b)],
                  sk = cu_k[size_t(b) + 1] - k0;
    if (sq == 0) continue;
    Problem one = call.args.problem;
    one.batch = 1, one.seqlen_q = sq, one.seqlen_k = sk;
    auto rows = [](TensorRef t, int64_t first) {
      t.data = static_cast<uint16_t*>(t.data) + first * t.seq_stride;
      return t;
    };
    const auto r = fa4::ref::forward(one, kernel_read(rows(call.args.q, q0), 1, sq, HQ, qk_cols, D),
                                     kernel_read(rows(call.args.k, k0), 1, sk, HKV, qk_cols, D),
                                     kernel_read(rows(call.args.v, k0), 1, sk, HKV, v_cols, D));
    kernel_write(rows(call.args.o, q0), 1, sq, HQ, v_cols, D, r.o);
  }
  emulate_set(call, false, D);
  int64_t outside_changed = 0, inside_wrong = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t q0 = cu_q[size_t(b)], sq = cu_q[size_t(b) + 1] - q0, k0 = cu_k[size_t(b)],
                  sk = cu_k[size_t(b) + 1] - k0;
    if (sq == 0) continue;
    Problem one = f.problem;
    one.batch = 1, one.seqlen_q = sq, one.seqlen_k = sk;
    auto slice = [](HostTensor& t, int64_t first, int64_t n) {
      std::vector<double> x;
      for (int64_t j = first; j < first + n; ++j)
        for (int64_t h = 0; h < t.h; ++h)
          for (int64_t c = 0; c < t.cols; ++c) x.push_back(fa4::ref::bits_to_float(DType::kBF16, t.at(0, j, h, c)));
      return x;
    };
    const auto want = fa4::ref::forward(one, slice(q, q0, sq), slice(k, k0, sk), slice(v, k0, sk));
    inside_wrong += beyond_one_step(slice(o, q0, sq), fa4::ref::rounded(DType::kBF16, want.o));
  }
  for (int64_t j : {0, 1, 20, 21, 22})
    for (int64_t h = 0; h <= HQ; ++h)  // (the spare head too)
      for (int64_t c = 0; c < dv; ++c) {
        const size_t at = size_t(j * o.ref.seq_stride + h * o.ref.head_stride + c);
        outside_changed += o.bits[at] != o_before[at];
      }
  EXPECT_EQ(inside_wrong, 0) << "o of the sequences' rows";
  EXPECT_EQ(outside_changed, 0) << "o's rows outside every sequence";
}

TEST(PadEmulated, PackedRowsOutsideEverySequenceKeepTheirBytes) {
  emulate_packed(72, 40, 128);   // in place
  emulate_packed(200, 136, 256); // copies
}

TEST(PadPlan, BytesPastInt64AreMarked) {
  ForwardArgs a = forward_at(200);  // 2^30 x 2^30 x 2^20 rows of q: past int64 in bytes
  a.problem.batch = a.problem.seqlen_q = int64_t{1} << 30;
  a.problem.heads_q = a.problem.heads_kv = int64_t{1} << 20;
  EXPECT_EQ(fa4::detail::pad_forward(a, nullptr).bytes, -1);
  size_t bytes = 0;
  const fa4::Status s = fa4::forward_workspace_size(a, &bytes);
  EXPECT_EQ(s.code, fa4::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message.find("head_dim = 200"), std::string::npos) << s.message;
}

}  // namespace
