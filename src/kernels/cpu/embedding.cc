#include "kernels/embedding.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/common.h"

namespace mt::kernels::cpu {
namespace {

inline int64_t tok(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kI32 ? t.ptr<int32_t>()[i] : t.ptr<int64_t>()[i];
}

}  // namespace

void embedding_forward(const Tensor& tokens, const Tensor& weight, int64_t v0, const Tensor& out) {
  const int64_t C = weight.dim(-1), Vs = weight.numel() / C, N = tokens.numel();
  MT_CHECK(out.numel() == N * C, "embedding_forward: out must be [N, C]");
  float_types(weight.dtype(), [&](auto tag_) { using T = decltype(tag_);
    out_types<T>(out.dtype(), "embedding_forward", [&](auto ytag_) { using Y = decltype(ytag_);
      const T* w = weight.ptr<T>();
      Y* o = out.ptr<Y>();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < N; ++i) {
        int64_t t = tok(tokens, i) - v0;
        if (t >= 0 && t < Vs) {
          if constexpr (std::is_same_v<Y, T>) std::memcpy(o + i * C, w + t * C, sizeof(T) * C);
          else
            for (int64_t c = 0; c < C; ++c) o[i * C + c] = to_out<Y>(w[t * C + c]);
        } else {
          std::fill(o + i * C, o + (i + 1) * C, to_out<Y>(T(0)));
        }
      }
    });
  });
}

void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t v0, const Tensor& dweight) {
  const int64_t C = dweight.dim(-1), Vs = dweight.numel() / C, N = tokens.numel();
  MT_CHECK(dout.numel() == N * C, "embedding_backward: dout must be [N, C]");
  float_types(dweight.dtype(), [&](auto tag_) { using T = decltype(tag_);
    x_types<T>(dout.dtype(), "embedding_backward", "dout", [&](auto stag_) { using S = decltype(stag_);
      const S* d = dout.ptr<S>();
      T* dw = dweight.ptr<T>();
      constexpr int64_t kChunk = 64;
#pragma omp parallel for schedule(static)
      for (int64_t c0 = 0; c0 < C; c0 += kChunk) {
        const int64_t c1 = std::min(C, c0 + kChunk);
        for (int64_t i = 0; i < N; ++i) {
          int64_t t = tok(tokens, i) - v0;
          if (t < 0 || t >= Vs) continue;
          for (int64_t c = c0; c < c1; ++c) dw[t * C + c] += ld<T>(d[i * C + c]);
        }
      }
    });
  });
}

void position_add_forward(const Tensor& pos, int64_t B, const Tensor& out) {
  const int64_t C = out.dim(-1), N = out.numel() / C;
  MT_CHECK(pos.numel() >= (N / B) * C, "position_add_forward: too few positions");
  float_types(pos.dtype(), [&](auto tag_) { using T = decltype(tag_);
    x_types<T>(out.dtype(), "position_add_forward", "out", [&](auto stag_) { using S = decltype(stag_);
      const T* p = pos.ptr<T>();
      S* o = out.ptr<S>();
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < N; ++r)
        for (int64_t c = 0; c < C; ++c) o[r * C + c] = to_out<S>(ld<T>(o[r * C + c]) + p[(r / B) * C + c]);
    });
  });
}

void position_add_backward(const Tensor& dout, int64_t B, const Tensor& dpos) {
  const int64_t C = dout.dim(-1), N = dout.numel() / C;
  float_types(dpos.dtype(), [&](auto tag_) { using T = decltype(tag_);
    x_types<T>(dout.dtype(), "position_add_backward", "dout", [&](auto stag_) { using S = decltype(stag_);
      const S* d = dout.ptr<S>();
      T* dp = dpos.ptr<T>();
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < N / B; ++t)
        for (int64_t b = 0; b < B; ++b)
          for (int64_t c = 0; c < C; ++c) dp[t * C + c] += ld<T>(d[(t * B + b) * C + c]);
    });
  });
}

}  // namespace mt::kernels::cpu
