#include "ptx/tma.h"

#include <mutex>

#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

namespace fa4::ptx {

namespace {
// The driver entry point, fetched through the runtime so fa4 needs no -lcuda.
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  });
  return fn;
}

// Encodes a tiled map of elements of `type` with the given swizzle; out-of-range elements read as zero.
int encode_tiled(CUtensorMap* map, CUtensorMapDataType type, CUtensorMapSwizzle swizzle, const void* base, int rank,
                 const uint64_t* dims, const uint64_t* strides_bytes, const uint32_t* box) {
  auto fn = encode_fn();
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  if (rank < 2 || rank > 5) return CUDA_ERROR_INVALID_VALUE;
  cuuint64_t gdim[5], gstride[4];
  cuuint32_t boxes[5], estride[5];
  for (int i = 0; i < rank; ++i) {
    gdim[i] = dims[i];
    boxes[i] = box[i];
    estride[i] = 1;
    if (i > 0) gstride[i - 1] = strides_bytes[i - 1];
  }
  return fn(map, type, cuuint32_t(rank), const_cast<void*>(base), gdim, gstride, boxes, estride,
            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace

int make_tensor_map_16bit_sw128(CUtensorMap* map, const void* base, int rank, const uint64_t* dims,
                                const uint64_t* strides_bytes, const uint32_t* box) {
  return encode_tiled(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, CU_TENSOR_MAP_SWIZZLE_128B, base, rank, dims,
                      strides_bytes, box);
}

int make_tensor_map_8bit(CUtensorMap* map, const void* base, int rank, const uint64_t* dims,
                         const uint64_t* strides_bytes, const uint32_t* box, int swizzle_bytes) {
  if (swizzle_bytes != 64 && swizzle_bytes != 128) return CUDA_ERROR_INVALID_VALUE;
  return encode_tiled(map, CU_TENSOR_MAP_DATA_TYPE_UINT8,
                      swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B, base, rank,
                      dims, strides_bytes, box);
}

}  // namespace fa4::ptx
