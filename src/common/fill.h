// Small fills for the cases no attention kernel runs for: a row that sees no key (seqlen_k = 0)
// has O = 0 and LSE = -inf (its head's sink with sinks); a gradient of nothing is 0.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace fa4::detail {

// Zeroes a strided [batch, seq, heads, dim] tensor of `elem_size`-byte elements, dim contiguous;
// `stride` holds the element strides of batch, seq and head. Leaves every byte outside the tensor
// (padding between rows or heads) alone. Needs the base address and dim * elem_size, stride[i] *
// elem_size to be multiples of 16 (validate() guarantees it); else cudaErrorInvalidValue.
cudaError_t zero_tensor(void* data, int elem_size, const int64_t stride[3], int64_t batch,
                        int64_t seq, int64_t heads, int64_t dim, cudaStream_t stream);

// Zeroes the rows of a packed variable-length [total, heads, dim] tensor outside every sequence:
// [0, cu_seqlens[0]) and [cu_seqlens[batch], total), the entries read on the device (clamped to
// [0, total]). stride: the element strides of rows (stride[1]) and heads (stride[2]); stride[0]
// is not read. The same 16-byte rules as zero_tensor.
cudaError_t zero_rows_outside(void* data, int elem_size, const int64_t stride[3], const int* cu_seqlens, int64_t batch,
                              int64_t total, int64_t heads, int64_t dim, cudaStream_t stream);

// The LSE of rows that see no key, [outer, heads, inner] floats: each head's sink (per_head, fp32
// [heads] on the device: ForwardArgs::sink), or -inf where per_head is null.
cudaError_t fill_lse_by_head(float* lse, int64_t outer, int64_t heads, int64_t inner, const float* per_head,
                             cudaStream_t stream);

}  // namespace fa4::detail
