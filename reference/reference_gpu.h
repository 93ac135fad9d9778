// A plain CUDA attention forward: the oracle for shapes too large for the float64 CPU reference.
// One thread block per (batch, query head, query row); scores, softmax and O in fp32, computed in
// two passes (the row max first, then exp(s - max) and the sums), so no rescaling is involved.
#pragma once

#include <cuda_runtime_api.h>

#include "fa4/attention.h"

namespace fa4::ref {

// Reads args.q, args.k, args.v (args.problem.dtype, TensorRef strides in elements) and follows
// args.problem's semantics exactly as the CPU reference does (scale, bottom-right causal, window,
// GQA; args.sink's scores of no value where given; a row with no visible key gives O = 0 and LSE =
// -inf, or its head's sink with one). args.o, args.lse and the workspace
// are ignored. Writes o32 as contiguous fp32 [batch][seqlen_q][heads_q][head_dim] and, when
// lse32 is not null, fp32 [batch][heads_q][seqlen_q] in natural log. Asynchronous on `stream`;
// checks only what it needs to run (positive sizes, head divisibility, non-null pointers).
Status gpu_forward(const ForwardArgs& args, float* o32, float* lse32, cudaStream_t stream);

}  // namespace fa4::ref
