// main() of parallel_mpi_test (grad buckets, distributed optimizer): runs
// under mpirun with 1, 2 and 4 ranks, each rank running every test over
// MPI_COMM_WORLD as its data-parallel group (tests/support/mpi_test.h).

#include "../support/mpi_test.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return mt::test::run_all_tests_with_mpi("parallel_mpi_test");
}
