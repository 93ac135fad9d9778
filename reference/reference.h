// Float64 CPU reference for fa4's exact semantics (scale, bottom-right causal, window, GQA, empty
// rows), and a plain CUDA oracle (fp32 accumulation) for shapes too large for the CPU.
#pragma once

#include <cstdint>
#include <vector>

#include "fa4/attention.h"

namespace fa4::ref {

// Tensors are contiguous BSHD: [batch][seq][heads][dim]. LSE is [batch][heads_q][seqlen_q].
struct Forward64 {
  std::vector<double> o;    // [batch][seqlen_q][heads_q][head_dim]
  std::vector<double> lse;  // natural log; -inf for a row with no visible key (its O row is 0)
};

struct Backward64 {
  std::vector<double> dq, dk, dv;  // shaped like q, k, v
};

// Whether query i may attend key j under p's causal/window rules (bottom-right aligned).
bool visible(const Problem& p, int64_t i, int64_t j);

Forward64 forward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                  const std::vector<double>& v);

Backward64 backward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const std::vector<double>& dout);

}  // namespace fa4::ref
