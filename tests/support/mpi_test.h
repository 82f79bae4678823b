#pragma once
// Shared by the gtest binaries that run under mpirun (comm_test,
// parallel_mpi_test, tp_model_test): MPI set-up around RUN_ALL_TESTS, with
// rank 0 printing gtest's usual output and every other rank printing only
// its failures, prefixed with the rank.

#include <gtest/gtest.h>

#include <cstdio>

#include "comm/communicator.h"

namespace mt::test {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.message());
  }

 private:
  int rank_;
};

// init_mpi() (a no-op outside mpirun), quiet non-zero ranks, RUN_ALL_TESTS,
// finalize. Call after ::testing::InitGoogleTest.
inline int run_all_tests_with_mpi(const char* program) {
  Status st = comm::init_mpi();
  if (!st.is_ok()) {
    std::fprintf(stderr, "%s: %s\n", program, st.message().c_str());
    return 1;
  }
  const int rank = comm::world_rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int rc = RUN_ALL_TESTS();
  comm::finalize_mpi();
  return rc;
}

}  // namespace mt::test
