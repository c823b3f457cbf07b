// test/gpt2_suite.cu — the tests that include train_gpt2.cu, built as one binary for the CPU backend
// (test/harness.h, TH_SUITE): the trainer's kernels are compiled once instead of once per test.
// `make test` links each test's name (build/cpu/test_gpt2, ...) to it; it runs the one it is started as.
#define TH_SUITE
#include "test_gpt2.cu"
#include "test_checkpoint.cu"
#include "test_generate.cu"
#include "test_gpt2_moe.cu"
#include "test_hf_gpt2.cu"
#ifdef USE_MPI  // the multi-rank tests (Makefile's MPI_TESTS)
#include "test_data_parallel.cu"
#include "test_train_gpt2_ranks.cu"
#endif

int main(int argc, char** argv) {
    return th::suite_main(argc, argv,
                          {{"test_gpt2", test_gpt2::main},
                           {"test_checkpoint", test_checkpoint::main},
                           {"test_generate", test_generate::main},
                           {"test_gpt2_moe", test_gpt2_moe::main},
                           {"test_hf_gpt2", test_hf_gpt2::main},
#ifdef USE_MPI
                           {"test_data_parallel", test_data_parallel::main},
                           {"test_train_gpt2_ranks", test_train_gpt2_ranks::main},
#endif
                          });
}
