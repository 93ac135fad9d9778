/* fa4's C ABI from a C program (fa4/attention_c.h): argument checks and the backward's workspace
 * size, which need no GPU. Prints what fa4 said; exit status 0 when each answer is as documented. */
#include <stdio.h>
#include <string.h>

#include "fa4/attention_c.h"

int main(void) {
  char msg[200];
  fa4_problem p;
  memset(&p, 0, sizeof p);
  p.dtype = 0; /* bf16 */
  p.batch = 2, p.seqlen_q = 100, p.seqlen_k = 300, p.heads_q = 8, p.heads_kv = 2, p.head_dim = 64;
  p.window_left = -1, p.window_right = -1;

  size_t bytes = 0;
  const int ok = fa4_backward_workspace_size(&p, &bytes, msg, sizeof msg);
  printf("fa4_backward_workspace_size: %d, %zu bytes\n", ok, bytes);
  /* batch x round_up(seqlen_q, 128) x heads_q x (head_dim + 2) x 4 */
  const size_t expect = (size_t)2 * 128 * 8 * (64 + 2) * 4;

  /* A head dim without a kernel (96, on 128's): the dQ accumulator at 128 columns alone (the
   * backward reads and writes the tensors in place). */
  p.head_dim = 96;
  size_t padded = 0;
  const int ok96 = fa4_backward_workspace_size(&p, &padded, msg, sizeof msg);
  printf("head_dim 96: %d, %zu bytes\n", ok96, padded);
  const size_t expect96 = (size_t)2 * 128 * 8 * (128 + 2) * 4;

  /* The forward's at 96: none (on 128's kernels the tensors are read and written in place); at 200
   * (on 256's): q, o (1600 rows) and k, v (1200 rows) of 256 bf16. */
  size_t fwd96 = 1;
  const int okf = fa4_forward_workspace_size(&p, &fwd96, msg, sizeof msg);
  printf("fa4_forward_workspace_size, head_dim 96: %d, %zu bytes\n", okf, fwd96);
  const size_t expect_fwd96 = 0;
  p.head_dim = 200;
  size_t fwd200 = 1;
  const int okf200 = fa4_forward_workspace_size(&p, &fwd200, msg, sizeof msg);
  printf("fa4_forward_workspace_size, head_dim 200: %d, %zu bytes\n", okf200, fwd200);
  const size_t expect_fwd200 = ((size_t)2 * 1600 + 2 * 1200) * 256 * 2;
  p.head_dim = 64;
  size_t fwd64 = 1;
  const int ok64 = fa4_forward_workspace_size(&p, &fwd64, msg, sizeof msg);

  p.head_dim = 100;
  size_t unused = 0;
  const int bad = fa4_backward_workspace_size(&p, &unused, msg, sizeof msg);
  printf("head_dim 100: %d, %s\n", bad, msg);

  fa4_tensor t;
  memset(&t, 0, sizeof t);
  const int null_problem = fa4_forward(NULL, t, t, t, t, NULL, NULL, 0, NULL, msg, sizeof msg);
  printf("fa4_forward(NULL problem): %d, %s\n", null_problem, msg);

  const int null_ok = null_problem == 1 && strstr(msg, "problem = null") != NULL;

  /* A variable-length batch without cu_seqlens_k is refused, naming it. */
  p.head_dim = 64;
  fa4_tensor packed;
  memset(&packed, 0, sizeof packed);
  packed.data = (void*)(size_t)0x7f0000000000ull;
  packed.seq_stride = 8 * 64, packed.head_stride = 64;
  const int32_t* cu_q = (const int32_t*)(size_t)0x7f0010000000ull;
  const int no_cu_k = fa4_forward_varlen(&p, packed, packed, packed, packed, cu_q, NULL, 150, 400, NULL, NULL, msg,
                                         sizeof msg);
  printf("fa4_forward_varlen(cu_seqlens_k NULL): %d, %s\n", no_cu_k, msg);

  const int varlen_ok = no_cu_k == 1 && strstr(msg, "varlen.cu_seqlens_k = null") != NULL;

  /* A misaligned seqused_k is refused, naming it. */
  const int32_t* cu_k = (const int32_t*)(size_t)0x7f0020000000ull;
  const int32_t* used = (const int32_t*)(size_t)0x7f0030000002ull;
  const int bad_used = fa4_forward_varlen_seqused(&p, packed, packed, packed, packed, cu_q, cu_k, used, 150, 400,
                                                  NULL, NULL, msg, sizeof msg);
  printf("fa4_forward_varlen_seqused(misaligned seqused_k): %d, %s\n", bad_used, msg);
  const int used_ok = bad_used == 1 && strstr(msg, "varlen.seqused_k = 0x7f0030000002") != NULL;
  /* The same for batched tensors' per-entry key lengths. */
  const int bad_entry = fa4_forward_seqused(&p, packed, packed, packed, packed, used, NULL, NULL, msg, sizeof msg);
  printf("fa4_forward_seqused(misaligned seqused_k): %d, %s\n", bad_entry, msg);
  const int entry_ok = bad_entry == 1 && strstr(msg, "varlen.seqused_k = 0x7f0030000002") != NULL;
  /* A misaligned left pad likewise. */
  const int bad_pad = fa4_forward_leftpad(&p, packed, packed, packed, packed, used, NULL, NULL, NULL, msg, sizeof msg);
  printf("fa4_forward_leftpad(misaligned leftpad_k): %d, %s\n", bad_pad, msg);
  const int pad_ok = bad_pad == 1 && strstr(msg, "varlen.leftpad_k = 0x7f0030000002") != NULL;

  /* Misaligned sinks, and a sinks' gradient without the sinks, are refused, naming them. */
  const float* sink = (const float*)(size_t)0x7f0070000001ull;
  const int bad_sink = fa4_forward_sink(&p, packed, packed, packed, packed, sink, NULL, NULL, msg, sizeof msg);
  printf("fa4_forward_sink(misaligned sink): %d, %s\n", bad_sink, msg);
  const int sink_ok = bad_sink == 1 && strstr(msg, "sink = 0x7f0070000001") != NULL;
  /* fp8: a misaligned descale is refused, naming it; descales with bf16 too. */
  fa4_problem p8 = p;
  p8.dtype = 2;
  const float* descale = (const float*)(size_t)0x7f00a0000002ull;
  const int bad_descale = fa4_forward_fp8(&p8, packed, packed, packed, packed, NULL, descale, NULL, NULL, NULL, msg,
                                          sizeof msg);
  printf("fa4_forward_fp8(misaligned k_descale): %d, %s\n", bad_descale, msg);
  const int fp8_ok = bad_descale == 1 && strstr(msg, "k_descale = 0x7f00a0000002") != NULL;
  const int bf16_descale = fa4_forward_fp8(&p, packed, packed, packed, packed, descale, NULL, NULL, NULL, NULL, msg,
                                           sizeof msg);
  printf("fa4_forward_fp8(bf16 with q_descale): %d, %s\n", bf16_descale, msg);
  const int fp8_bf16_ok = bf16_descale == 1 && strstr(msg, "dtype = 2 (e4m3)") != NULL;
  float* dsink = (float*)(size_t)0x7f0080000000ull;
  const int bad_dsink = fa4_backward_sink(&p, packed, packed, packed, packed, packed, packed, packed, packed,
                                          (const float*)(size_t)0x7f0090000000ull, NULL, dsink, 0, NULL, 0, NULL, msg,
                                          sizeof msg);
  printf("fa4_backward_sink(dsink without sink): %d, %s\n", bad_dsink, msg);
  const int dsink_ok = bad_dsink == 1 && strstr(msg, "dsink = 0x7f0080000000") != NULL;

  /* A paged cache's page size that is not a power of two is refused, naming it. */
  const int32_t* table = (const int32_t*)(size_t)0x7f0040000000ull;
  const int bad_page = fa4_forward_paged(&p, packed, packed, packed, packed, table, 4, 300, 10, NULL, NULL, NULL, msg,
                                         sizeof msg);
  printf("fa4_forward_paged(page_size 300): %d, %s\n", bad_page, msg);
  const int paged_ok = bad_page == 1 && strstr(msg, "paged.page_size = 300") != NULL;
  /* With packed queries: cu_seqlens_q is required (cu_seqlens_k alone names it). */
  const int bad_packed = fa4_forward_paged_varlen(&p, packed, packed, packed, packed, NULL, 150, cu_k, table, 4, 256,
                                                  10, NULL, NULL, NULL, msg, sizeof msg);
  printf("fa4_forward_paged_varlen(cu_seqlens_q NULL): %d, %s\n", bad_packed, msg);
  const int packed_ok = bad_packed == 1 && strstr(msg, "varlen.cu_seqlens_q = null") != NULL;

  /* The soft cap is the problem's last field: a negative one is refused, naming it. */
  p.softcap = -1.0f;
  const int bad_cap = fa4_backward_workspace_size(&p, &unused, msg, sizeof msg);
  printf("softcap -1: %d, %s\n", bad_cap, msg);
  const int cap_ok = bad_cap == 1 && strstr(msg, "softcap = -1") != NULL;

  /* Appending to a KV cache: a rotary_dim that is not a multiple of 16 is refused, naming it. */
  p.softcap = 0.0f;
  fa4_rotary ro;
  memset(&ro, 0, sizeof ro);
  ro.cos = (const void*)(size_t)0x7f0050000000ull;
  ro.sin = (const void*)(size_t)0x7f0060000000ull;
  ro.seqlen_ro = 300, ro.rotary_dim = 24;
  const int bad_rotary = fa4_append_kv(&p, 1, packed, packed, packed, packed, NULL, 0, 0, 0, cu_k, 0, NULL, &ro,
                                       packed, packed, NULL, msg, sizeof msg);
  printf("fa4_append_kv(rotary_dim 24): %d, %s\n", bad_rotary, msg);
  const int rotary_ok = bad_rotary == 1 && strstr(msg, "rotary.rotary_dim = 24") != NULL;

  const int as_documented =
      ok == 0 && bytes == expect && ok96 == 0 && padded == expect96 && okf == 0 && fwd96 == expect_fwd96 && okf200 == 0 &&
      fwd200 == expect_fwd200 &&
      ok64 == 0 && fwd64 == 0 && bad == 1 && null_ok && varlen_ok && used_ok && entry_ok && pad_ok && paged_ok && packed_ok &&
      cap_ok && rotary_ok && sink_ok && dsink_ok && fp8_ok && fp8_bf16_ok;
  return as_documented ? 0 : 1;
}
