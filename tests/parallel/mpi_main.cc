// main() of parallel_mpi_test (grad buckets, distributed optimizer): runs
// under mpirun with 1, 2 and 4 ranks, each rank running every test over
// MPI_COMM_WORLD as its data-parallel group. Rank 0 prints the usual gtest
// output; other ranks print only their failures, prefixed with the rank.

#include <gtest/gtest.h>

#include <cstdio>

#include "comm/communicator.h"

namespace {

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

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  mt::Status st = mt::comm::init_mpi();
  if (!st.is_ok()) {
    std::fprintf(stderr, "parallel_mpi_test: %s\n", st.message().c_str());
    return 1;
  }
  const int rank = mt::comm::world_rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int rc = RUN_ALL_TESTS();
  mt::comm::finalize_mpi();
  return rc;
}
