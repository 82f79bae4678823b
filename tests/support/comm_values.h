#pragma once
// Closed-form values for the communicator tests (comm_test.cc over MPI/self,
// nccl_test.cc over NCCL): element i of rank r is r*A + i (r*A + j*B + i in
// block j), small enough that bf16 keeps every value and sum exact.

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace mt::comm::test {

template <typename T>
T val(double x) {
  return static_cast<T>(x);
}
template <>
inline bf16 val<bf16>(double x) {
  return float_to_bf16(static_cast<float>(x));
}
template <typename T>
double num(T v) {
  return static_cast<double>(v);
}
template <>
inline double num<bf16>(bf16 v) {
  return bf16_to_float(v);
}

// bf16 keeps every value and sum a small integer (exact below 256).
struct Pattern {
  double A, B;
  int n;  // elements per block (odd for the wide types, so no block is a round size)
};
template <typename T>
Pattern pattern() {
  return {1000, 100, 37};
}
template <>
inline Pattern pattern<bf16>() {
  return {16, 4, 4};
}

// A 1-D host tensor over v.
template <typename T>
Tensor host_view(std::vector<T>& v) {
  return Tensor(v.data(), Shape{static_cast<int64_t>(v.size())}, dtype_of<T>());
}

inline const char* op_name(ReduceOp op) {
  return op == ReduceOp::kSum ? "sum" : op == ReduceOp::kMax ? "max" : "min";
}

// op over ranks 0..N-1 of r*A + c.
inline double reduce_closed_form(ReduceOp op, int N, double A, double c) {
  switch (op) {
    case ReduceOp::kSum: return A * N * (N - 1) / 2 + N * c;
    case ReduceOp::kMax: return (N - 1) * A + c;
    case ReduceOp::kMin: return c;
  }
  return 0;
}

// Typed-test names: the dtype's ("fp32", "bf16", ...).
struct TypeNames {
  template <typename T>
  static std::string GetName(int) {
    return dtype_name(dtype_of<T>());
  }
};

}  // namespace mt::comm::test
