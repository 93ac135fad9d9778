// The unit map of a zero-padded copy (pad.h): which 16-byte unit of the caller's tensor each unit
// of the copy stands for. Host and device: the copy kernels (pad.cu) walk it, and tests/test_pad.cpp
// walks the same map on the CPU to emulate both copies.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/pad.h"
#include "fa4/numerics/exp2.h"  // (FA4_HD)

namespace fa4::detail {

// A copy of [n0, n1, n2] rows: each padded row row_units 16-byte units (the kernel head dim's 64,
// 128, 192 or 256 elements of 1 or 2 bytes), the caller's its first `live` units at byte strides
// batch, seq and head. Index: uint32_t where the copy's units fit it (the divisions cost fewer
// instructions), else int64_t.
template <class Index>
struct PadUnits {
  Index n1, n2;
  int row_units, live;
  int64_t batch_stride, seq_stride, head_stride;
  const int32_t* seq_begin;  // optional (pad.h): the rows of entry b copied in, [begin[b], end[b])
  const int32_t* seq_end;
  const int32_t* pages;  // optional (pad.h): a paged pool gathered, copy page b * entry_pages + j
  int64_t table_stride;  // from the caller's page pages[b * table_stride + j]
  Index entry_pages;
  int64_t pool_pages;

  struct Unit {
    int64_t user;  // byte offset of the caller's unit (meaningful where live)
    Index b, s;    // its batch entry and row (gathered pages: the entry's key row)
    int u;         // its unit in the row
    bool live;     // inside the caller's columns
  };

  // Unit i of the copy: unit i % row_units of row r = i / row_units, row r being
  // (r / (n1 * n2), r / n2 % n1, r % n2) of the caller's tensor, or with pages row (r / n2 % n1,
  // r % n2) of the caller's page that copy page r / (n1 * n2) gathers. `load` reads an entry of
  // the device arrays (__ldg on the device).
  template <class Load>
  FA4_HD Unit at(Index i, Load load) const {
    const Index r = i / Index(row_units), h = r % n2, t = r / n2, s = t % n1, b = t / n1;
    const int u = int(i - r * Index(row_units));
    const int64_t row = int64_t(s) * seq_stride + int64_t(h) * head_stride + int64_t(u) * 16;
    if (pages == nullptr) return {int64_t(b) * batch_stride + row, b, s, u, u < live};
    const Index entry = b / entry_pages, j = b % entry_pages;
    int64_t page = load(pages + int64_t(entry) * table_stride + int64_t(j));
    page = page < 0 ? 0 : page >= pool_pages ? pool_pages - 1 : page;  // (the kernels' clamp)
    return {page * batch_stride + row, entry, Index(j * n1 + s), u, u < live};
  }

  // Whether a unit's row is copied in: inside its entry's [seq_begin, seq_end) where those are set.
  template <class Load>
  FA4_HD bool row_copied(const Unit& x, Load load) const {
    return !((seq_end != nullptr && int64_t(x.s) >= int64_t(load(seq_end + x.b))) ||
             (seq_begin != nullptr && int64_t(x.s) < int64_t(load(seq_begin + x.b))));
  }
};

// Several copies in one launch (pad.cu): copy j's units are [end[j - 1], end[j]) of the set's
// (end[-1] = 0). A gathered paged pool's table (PaddedCall::table) rides along with the copies in.
inline constexpr int kMaxCopySet = 5;  // the backward's q, k, v, o and dout
template <class Index>
struct CopySet {
  int count;
  PadUnits<Index> map[kMaxCopySet];
  void* padded[kMaxCopySet];
  void* user[kMaxCopySet];
  Index end[kMaxCopySet];
  int32_t* table;  // table[n] = n for n < table_entries (null: none)
  Index table_entries;
};

// The copy that unit i of a set belongs to (count where i is past every copy), and its unit there.
template <class Index>
FA4_HD int copy_of(const CopySet<Index>& set, Index i, Index* local) {
  Index start = 0;
  for (int j = 0; j < set.count; ++j) {
    if (i < set.end[j]) {
      *local = i - start;
      return j;
    }
    start = set.end[j];
  }
  return set.count;
}

// The unit map of copy c at the kernel head dim padded_dim.
template <class Index>
inline PadUnits<Index> units_of(const PadCopy& c, int64_t padded_dim) {
  return {Index(c.rows[1]), Index(c.rows[2]), int(padded_dim * c.elem_size / 16), int(c.cols * c.elem_size / 16),
          c.user.batch_stride * c.elem_size, c.user.seq_stride * c.elem_size, c.user.head_stride * c.elem_size,
          c.seq_begin, c.seq_end, c.pages, c.table_stride, Index(c.entry_pages), c.pool_pages};
}

// The units of copy c: its rows times the padded row's 16-byte units.
inline int64_t units_in(const PadCopy& c, int64_t padded_dim) {
  return c.rows[0] * c.rows[1] * c.rows[2] * (padded_dim * c.elem_size / 16);
}

// The set of a call's copies in (with its gathered pool's table) or out, and the work its launch
// walks (units, or the table's entries where more); *work 0: nothing to launch.
template <class Index, class Call>
inline CopySet<Index> copy_set_of(const Call& call, bool in, int64_t padded_dim, int64_t* work) {
  CopySet<Index> set{};
  int64_t total = 0;
  for (int i = 0; i < call.count; ++i) {
    const PadCopy& c = call.copies[i];
    if (in ? !c.in : !c.out) continue;
    total += units_in(c, padded_dim);
    set.map[set.count] = units_of<Index>(c, padded_dim);
    set.padded[set.count] = c.padded;
    set.user[set.count] = c.user.data;
    set.end[set.count] = Index(total);
    ++set.count;
  }
  if (in) set.table = call.table, set.table_entries = Index(call.table_entries);
  *work = set.count == 0 ? 0 : std::max(total, in ? call.table_entries : int64_t{0});
  return set;
}

}  // namespace fa4::detail
