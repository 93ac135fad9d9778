// Device counters that stay zero between launches, one set a stream: the forward's tile counter
// without a memset before each launch.
#pragma once

#include <cuda_runtime_api.h>

namespace fa4::detail {

// Two ints of device memory for launches on stream `s` of `device`, zero whenever no launch that
// uses them is running: a launch's kernel leaves them zero again when its last CTA is done
// (fwd_kernel.cuh), and launches on one stream run in turn. nullptr where the stream is being
// captured (a graph may run beside another graph made on the same stream, or beside the stream),
// where its id cannot be read, or once kMaxStreamCounters streams have one: the caller then takes
// stream-ordered scratch and zeroes it (fwd_launch.cuh, LaunchScratch). Zeroing scratch before
// every launch cost the launches that use the tile counter 0.7-2 % on an H100 at 512-1k keys
// (docs/perf-notes.md, "The tile counter without a memset a launch"). The first use on a stream
// zeroes its pair on that stream.
inline constexpr int kMaxStreamCounters = 4096;
int* stream_counters(int device, cudaStream_t s);

}  // namespace fa4::detail
