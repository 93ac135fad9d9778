// Device counters that stay zero between launches, one set a stream: the forward's tile counter
// and the stream-K tail's piece counters without a memset before each launch.
#pragma once

#include <cuda_runtime_api.h>

namespace fa4::detail {

// kStreamCounterInts ints of device memory for launches on stream `s` of `device` in the current
// context (current_context_id, per_device.h), zero whenever no launch that uses them is running:
// the tile counter and its finish count (kStreamTileCounterInts), which a launch's last CTA zeroes
// (fwd_kernel.cuh), then the stream-K tail's kStreamPieceCounters piece counters, each zeroed by
// the last piece to arrive at it (epilogue.cuh, merge_pieces). Launches on one stream run in turn.
// nullptr where the stream is being captured (a graph may run beside another graph made on the
// same stream, or beside the stream), where its id cannot be read, or once kMaxStreamCounters
// streams have one: the caller then takes stream-ordered scratch and zeroes it (fwd_launch.cuh,
// LaunchScratch). Zeroing scratch before every launch cost the launches that use the tile counter
// 0.7-2 % on an H100 at 512-1k keys (docs/perf-notes.md, "The tile counter without a memset a
// launch"). The first use on a stream zeroes its set on that stream.
inline constexpr int kMaxStreamCounters = 4096;
// A tail of more counters (tail tiles x cluster x consumers) takes zeroed scratch instead.
inline constexpr int kStreamPieceCounters = 1024;  // 4 KB: a 132-SM H100 takes at most 524
inline constexpr int kStreamTileCounterInts = 2;
inline constexpr int kStreamCounterInts = kStreamTileCounterInts + kStreamPieceCounters;
int* stream_counters(int device, cudaStream_t s);

}  // namespace fa4::detail
