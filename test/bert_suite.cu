// test/bert_suite.cu — the tests that include train_bert.cu, built as one binary for the CPU backend
// (test/harness.h, TH_SUITE): the trainer's kernels are compiled once instead of once per test.
// `make test` links each test's name (build/cpu/test_bert, ...) to it; it runs the one it is started as.
#define TH_SUITE
#include "test_bert.cu"
#include "test_train_bert.cu"
#ifdef USE_MPI  // the multi-rank test (Makefile's MPI_TESTS)
#include "test_train_bert_ranks.cu"
#endif

int main(int argc, char** argv) {
    return th::suite_main(argc, argv,
                          {{"test_bert", test_bert::main},
                           {"test_train_bert", test_train_bert::main},
#ifdef USE_MPI
                           {"test_train_bert_ranks", test_train_bert_ranks::main},
#endif
                          });
}
