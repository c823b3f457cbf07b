# Makefile — builds the trainers and tests for a GPU (nvcc) or for the CPU backend (g++), and runs
# the test suite. `make help` lists the targets and variables.

CUDA_HOME  ?= /usr/local/cuda
NVCC       ?= $(CUDA_HOME)/bin/nvcc
CXX        ?= g++
BUILD      ?= build

# ----------------------------------------------------------------------------
# What this machine has

comma      := ,
HAVE_NVCC  := $(shell command -v $(NVCC) >/dev/null 2>&1 && echo 1)
# (A driver older than the compute_cap field prints a complaint instead, which is no GPU to build for.)
GPU_INFO   := $(shell nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -1 | \
                grep -E ', [0-9]+\.[0-9]+$$')
# With a GPU, build for its architecture (compute capability 8.9 -> 89); else for A100 and H100.
GPU_ARCH   := $(subst .,,$(lastword $(subst $(comma), ,$(GPU_INFO))))
CUDA_ARCHS ?= $(or $(GPU_ARCH),80 90)
# Compute capability 9.0 is built as sm_90a, the target with Hopper's wgmma (llmc/wgmma.cuh): its code
# runs on 9.0 devices only, so the PTX for newer ones stays plain compute_90.
SM_TARGET   = $(if $(filter 90,$(1)),90a,$(1))

ifeq ($(GPU),1)
  TARGET := gpu
else ifeq ($(CPU),1)
  TARGET := cpu
else ifneq ($(GPU_INFO),)
  TARGET := gpu
else
  TARGET := cpu
endif

# What the CPU backend's build and the test suite need is installed first when missing
# (scripts/install_deps.sh prints one line per install, or the one command to run): `make test` and
# `make test-asan` always (the suite runs on the CPU backend), other goals when building for it.
# GPU builds, gpu-check and the compile checks install nothing.
ifeq ($(MAKELEVEL),0)
  GOALS     := $(or $(MAKECMDGOALS),all)
  DEPS_MODE := $(if $(filter test test-asan,$(GOALS)),test,$(if $(and $(filter cpu,$(TARGET)),$(filter-out \
                 clean help gpu-check test-nvcc test-gpu tokenize bert_data fuzz-% $(BUILD)/gpu/%,$(GOALS))),build))
  ifneq ($(DEPS_MODE),)
    $(shell scripts/install_deps.sh $(DEPS_MODE) >&2)
    ifneq ($(.SHELLSTATUS),0)
      $(error the dependencies above are missing)
    endif
  endif
endif

HAVE_MPI   := $(shell command -v mpicxx >/dev/null 2>&1 && echo 1)
# NCCL's header: NCCL_HOME (e.g. a pip nvidia-nccl-cu12 install's nvidia/nccl folder), the toolkit's,
# or the system's. Several ranks need MPI and NCCL (the CPU backend's NCCL compiles against the header).
NCCL_HOME  ?=
NCCL_INC   := $(firstword $(foreach d,$(if $(NCCL_HOME),$(NCCL_HOME)/include) $(CUDA_HOME)/include /usr/include \
                /usr/local/include,$(if $(wildcard $(d)/nccl.h),$(d))))
HAVE_NCCL  := $(if $(NCCL_INC),1)
MULTI      := $(and $(HAVE_MPI),$(HAVE_NCCL))
HAVE_BOOST := $(shell test -f /usr/include/boost/context/detail/fcontext.hpp && \
                test -e /usr/lib/x86_64-linux-gnu/libboost_context.so && echo 1)
# OpenBLAS's own headers: Debian's libopenblas-dev brings the pthread or the OpenMP build (whichever
# apt picks, e.g. the one python3-torch already pulled in).
BLAS_DIR   := $(firstword $(wildcard /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h \
                /usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h))
HAVE_BLAS  := $(if $(BLAS_DIR),1)

ifeq ($(MAKELEVEL),0)
  ifneq ($(filter-out clean help,$(or $(MAKECMDGOALS),all)),)
    $(info $(if $(HAVE_NVCC),✓ nvcc: $(NVCC),✗ nvcc: not found (GPU builds and compile checks need the CUDA toolkit)))
    $(info $(if $(GPU_INFO),✓ GPU: $(GPU_INFO),✗ GPU: none found (nvidia-smi)))
    $(info $(if $(HAVE_MPI),✓ MPI: mpicxx,✗ MPI: not found (multi-GPU and NCCL tests disabled; apt-get install libopenmpi-dev)))
    $(info $(if $(HAVE_NCCL),✓ NCCL: $(NCCL_INC)/nccl.h,✗ NCCL: not found (multi-GPU disabled; apt-get install libnccl-dev from NVIDIA's CUDA repository, or pip install nvidia-nccl-cu12 and NCCL_HOME=<its nvidia/nccl folder>)))
    $(info $(if $(HAVE_BOOST),✓ Boost.Context,✗ Boost.Context: not found (CPU backend needs it; apt-get install libboost-context-dev)))
    $(info $(if $(HAVE_BLAS),✓ OpenBLAS,✗ OpenBLAS: not found (CPU backend needs it; apt-get install libopenblas-dev)))
    $(info → building for the $(if $(filter gpu,$(TARGET)),GPU (nvcc, sm_$(subst $() $(),/sm_,$(foreach a,$(CUDA_ARCHS),$(call SM_TARGET,$(a))))),CPU backend (g++)))
  endif
endif

# ----------------------------------------------------------------------------
# Flags

# The MPI wrapper's flags: Open MPI's --showme:compile/link, else MPICH's -compile_info/-link_info (its
# whole command line, of which the flags that matter are kept).
MPI_CFLAGS := $(if $(MULTI),$(or $(shell mpicxx --showme:compile 2>/dev/null),$(filter -I% -D% -pthread,\
                $(shell mpicxx -compile_info 2>/dev/null))) -DUSE_MPI $(if $(NCCL_HOME),-I$(NCCL_INC)))
MPI_LIBS   := $(if $(MULTI),$(or $(shell mpicxx --showme:link 2>/dev/null),$(filter -L% -l% -Wl$(comma)% -pthread,\
                $(shell mpicxx -link_info 2>/dev/null))))
# The same for nvcc, which takes -I, -D, -L and -l itself but not the g++ options some MPI installs
# print (-pthread, -Wl,-rpath,DIR): a -Wl,... goes on through -Xlinker, anything else through -Xcompiler.
nvcc_flags = $(foreach f,$(1),$(if $(filter -I% -D% -L% -l%,$(f)),$(f),$(if $(filter -Wl$(comma)%,$(f)),\
               -Xlinker $(patsubst -Wl$(comma)%,%,$(f)),-Xcompiler $(f))))
BLAS_CFLAGS := -I$(or $(dir $(BLAS_DIR)),/usr/include/x86_64-linux-gnu/openblas-pthread/)

# CPU backend: the shadow headers in llmc/simt/include come before the toolkit's.
# DEBUG_INFO: -g1 keeps the line tables that backtraces, ASan reports and gdb's `bt` need and
# compiles the test suite about 30% faster than -g; `make DEBUG_INFO=-g` adds the variables for gdb.
DEBUG_INFO   ?= -g1
CPU_CXXFLAGS := -std=c++17 -O2 $(DEBUG_INFO) -fno-strict-aliasing -ftls-model=initial-exec -Wall -Wextra \
                -Wno-unused-parameter -Wno-attributes -Wno-unknown-pragmas -MMD -MP \
                -Illmc/simt/include -Illmc/simt -I$(CUDA_HOME)/include $(BLAS_CFLAGS) $(MPI_CFLAGS)
# OpenBLAS is not linked: the backend loads it itself, choosing its kernels first (llmc/simt/cublaslt.cpp).
CPU_LDLIBS   := -rdynamic -lboost_context -ldl -lpthread $(MPI_LIBS)
# AddressSanitizer + UBSan build of the same sources (make test-asan).
ASAN_CXXFLAGS := $(filter-out -O2,$(CPU_CXXFLAGS)) -O1 -fsanitize=address,undefined -fno-omit-frame-pointer \
                 -fno-sanitize-recover=undefined
ASAN_LDLIBS   := -fsanitize=address,undefined $(CPU_LDLIBS)

# Machine code for each architecture, plus PTX of the newest, which the driver compiles at start-up on
# a newer GPU (instead of failing with "no kernel image is available"); 9.0 as sm_90a (SM_TARGET).
GENCODE      := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(call SM_TARGET,$(a)),code=sm_$(call SM_TARGET,$(a))) \
                -gencode arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS))
NVCC_FLAGS   := -std=c++17 -O3 --use_fast_math -Xcompiler -Wall $(GENCODE) $(call nvcc_flags,$(MPI_CFLAGS))
# A pip wheel's lib/ holds only libnccl.so.2, so NCCL_HOME's library is named by path.
NCCL_LIB     := $(if $(NCCL_HOME),$(firstword $(wildcard $(NCCL_HOME)/lib/libnccl.so $(NCCL_HOME)/lib/libnccl.so.2)) \
                  -Xlinker -rpath=$(NCCL_HOME)/lib,-lnccl)
NVCC_LDLIBS  := -lcublasLt -lcublas $(if $(MULTI),$(NCCL_LIB)) $(call nvcc_flags,$(MPI_LIBS))
# Compile-only check of every .cu for each architecture with the shipped flags: warnings are errors,
# spills are warned.
NVCC_CHECK_FLAGS := -std=c++17 -O3 --use_fast_math --Werror all-warnings -Xptxas -warn-spills \
                    $(call nvcc_flags,$(MPI_CFLAGS))

# ----------------------------------------------------------------------------
# Sources

SIMT_SRCS := llmc/simt/scheduler.cpp llmc/simt/runtime.cpp llmc/simt/streams.cpp llmc/simt/cublaslt.cpp \
             $(if $(MULTI),llmc/simt/nccl.cpp)
CPU_SIMT_OBJS  := $(SIMT_SRCS:llmc/simt/%.cpp=$(BUILD)/cpu/simt/%.o)
ASAN_SIMT_OBJS := $(SIMT_SRCS:llmc/simt/%.cpp=$(BUILD)/asan/simt/%.o)

# Every test/simt/test_<name>.cu tests the CPU backend itself (the CUDA, cuBLASLt and NCCL subsets it
# implements), every test/test_<name>.cu the project's code; both build to test_<name>, the backend's
# first so that the suite checks it before what runs on it. The multi-rank ones need MPI and NCCL.
vpath test_%.cu test/simt test
MPI_TESTS  := nccl distributed data_parallel train_gpt2_ranks train_bert_ranks
TESTS      := $(filter-out $(if $(MULTI),,$(MPI_TESTS)),\
                $(patsubst test/simt/test_%.cu,%,$(wildcard test/simt/test_*.cu))\
                $(patsubst test/test_%.cu,%,$(wildcard test/test_*.cu)))
CU_SOURCES := $(wildcard test/*.cu test/simt/*.cu dev/cuda/*.cu *.cu)

.PHONY: all help test test-asan test-nvcc test-gpu gpu-check bench clean

all: $(BUILD)/cpu/test_simt

help:
	@echo "make train_gpt2     build the GPT-2 trainer (GPU if one is found or GPU=1, else CPU backend; CPU=1 forces it)"
	@echo "make train_bert     build the BERT trainer (classification fine-tuning, MLM pretraining; same targets)"
	@echo "make test           build and run the whole CPU-backend suite + nvcc compile checks for CUDA_ARCHS"
	@echo "make test-asan      the CPU suite under AddressSanitizer + UBSan"
	@echo "make gpu-check      on a machine with an NVIDIA GPU: the acceptance run (tests, sanitizers, training in every precision, PyTorch beside it);"
	@echo "                    GPU_CHECK_ARGS='--budget 480 --json FILE' passes options (scripts/gpu_check.sh --help)"
	@echo "make test-nvcc      only the nvcc compile checks (CUDA_ARCHS='$(CUDA_ARCHS)')"
	@echo "make bench          CPU-backend cost per kernel vs plain C++, then training throughput (scripts/bench_gpt2.sh)"
	@echo "make tokenize       build the text -> token shards tool, $(BUILD)/tokenize (dev/data/README.md)"
	@echo "make bert_data      build the text -> BERT shards tool (MLM, classification), $(BUILD)/bert_data"
	@echo "make fuzz-NAME      build and run the libFuzzer target test/fuzz/fuzz_NAME.cpp for FUZZ_SECONDS (test/fuzz/README.md)"
	@echo "make test-gpu       the kernel tests on this machine's GPU (make test runs them too where it finds one)"
	@echo "make clean          remove $(BUILD)/ (the trainers in the root stay)"
	@echo "make $(BUILD)/cpu/test_NAME, $(BUILD)/cpu/dev_NAME, $(BUILD)/gpu/...   one test (test/test_NAME.cu) or kernel"
	@echo "                    benchmark (dev/cuda/NAME.cu) for the CPU backend or the GPU"
	@echo "variables: GPU=1 CPU=1 CUDA_ARCHS='80 90' NCCL_HOME=dir CUDA_HOME=$(CUDA_HOME) BUILD=$(BUILD)"
	@echo "  DEBUG_INFO=-g1 (-g: gdb sees variables) REQUIRE_ORACLE=1 (make test fails without the Python oracle)"
	@echo "  FUZZ_SECONDS=60 FUZZ_SEEDS=dir FUZZ_ARGS='libFuzzer options' (test/fuzz/README.md)"
	@echo "CPU backend (environment): SIMT_THREADS=n SIMT_ORDER=forward|reverse|random[:seed] SIMT_DEVICE=h100|a100|rtx3090|l4"
	@echo "  SIMT_STREAMS=inorder|adversarial SIMT_FRAGMENT_ORDER=identity|seed SIMT_DEVICE_MEMORY=80G SIMT_STACK_KB=256"
	@echo "  SIMT_FP8_ACCUMULATION_BITS=n SIMT_COVERAGE_DIR=dir (llmc/simt/README.md)"

# ----------------------------------------------------------------------------
# CPU backend builds

$(BUILD)/cpu/simt/%.o: llmc/simt/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CPU_CXXFLAGS) -c $< -o $@
$(BUILD)/asan/simt/%.o: llmc/simt/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(ASAN_CXXFLAGS) -c $< -o $@
# Named only by pattern rules, the backend's objects would be intermediate files, which make deletes
# once the build is done (then `make test-asan` after `make test` compiled them again): keep them.
.SECONDARY: $(CPU_SIMT_OBJS) $(ASAN_SIMT_OBJS)

$(BUILD)/cpu/test_%: test_%.cu $(CPU_SIMT_OBJS)
	@mkdir -p $(dir $@)
	$(CXX) $(CPU_CXXFLAGS) -x c++ $< -x none $(CPU_SIMT_OBJS) $(CPU_LDLIBS) -o $@
$(BUILD)/asan/test_%: test_%.cu $(ASAN_SIMT_OBJS)
	@mkdir -p $(dir $@)
	$(CXX) $(ASAN_CXXFLAGS) -x c++ $< -x none $(ASAN_SIMT_OBJS) $(ASAN_LDLIBS) -o $@

# The tests that include a trainer are built into one binary per trainer, test/<model>_suite.cu
# (test/harness.h, TH_SUITE): the trainer's kernels, most of such a test's build time, are compiled
# once. Each test is a link to its suite, which runs the test it is started as.
SUITE_gpt2 := gpt2 checkpoint generate gpt2_moe hf_gpt2 data_parallel train_gpt2_ranks
SUITE_bert := bert train_bert train_bert_ranks
$(BUILD)/cpu/%_suite: test/%_suite.cu $(CPU_SIMT_OBJS)
	@mkdir -p $(dir $@)
	$(CXX) $(CPU_CXXFLAGS) -x c++ $< -x none $(CPU_SIMT_OBJS) $(CPU_LDLIBS) -o $@
$(BUILD)/asan/%_suite: test/%_suite.cu $(ASAN_SIMT_OBJS)
	@mkdir -p $(dir $@)
	$(CXX) $(ASAN_CXXFLAGS) -x c++ $< -x none $(ASAN_SIMT_OBJS) $(ASAN_LDLIBS) -o $@
$(SUITE_gpt2:%=$(BUILD)/cpu/test_%): $(BUILD)/cpu/gpt2_suite
$(SUITE_gpt2:%=$(BUILD)/asan/test_%): $(BUILD)/asan/gpt2_suite
$(SUITE_bert:%=$(BUILD)/cpu/test_%): $(BUILD)/cpu/bert_suite
$(SUITE_bert:%=$(BUILD)/asan/test_%): $(BUILD)/asan/bert_suite
# A GPU build compiles each of these tests alone (nvcc, one binary per test), so each must include
# what it uses rather than lean on a test before it in its suite: make test compiles each alone too,
# syntax only (seconds each).
SUITE_TESTS := $(filter $(SUITE_gpt2) $(SUITE_bert),$(TESTS))
$(BUILD)/cpu/alone/test_%.ok: test/test_%.cu
	@mkdir -p $(dir $@)
	$(CXX) $(CPU_CXXFLAGS) -MT $@ -MF $(@:.ok=.d) -fsyntax-only -x c++ $< && touch $@
$(foreach m,gpt2 bert,$(foreach b,cpu asan,$(SUITE_$(m):%=$(BUILD)/$(b)/test_%))):
	ln -sf $(notdir $<) $@

# What the GPU binaries and the trainers in the root were built for: stamp files whose content is the
# architectures (and the root trainers' target, GPU or CPU backend), rewritten only when that changes,
# so that make rebuilds what was built for another GPU, or a trainer built for the CPU backend now on a
# GPU machine, instead of calling it up to date.
GPU_STAMP     := $(BUILD)/gpu/.built-for
TRAINER_STAMP := $(BUILD)/.trainers-built-for
TRAINERS_FOR  := $(if $(filter gpu,$(TARGET)),gpu $(GENCODE),cpu)
$(GPU_STAMP): FORCE
	@mkdir -p $(dir $@)
	@[ "$$(cat $@ 2>/dev/null)" = "$(GENCODE)" ] || echo "$(GENCODE)" > $@
$(TRAINER_STAMP): FORCE
	@mkdir -p $(dir $@)
	@[ "$$(cat $@ 2>/dev/null)" = "$(TRAINERS_FOR)" ] || echo "$(TRAINERS_FOR)" > $@
.PHONY: FORCE
FORCE:

# GPU builds of the tests (run by `make test` when a GPU is present).
$(BUILD)/gpu/test_%: test_%.cu $(GPU_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -MMD -MP $< $(NVCC_LDLIBS) -o $@

$(BUILD)/gpu/dev_%: dev/cuda/%.cu $(GPU_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -MMD -MP $< $(NVCC_LDLIBS) -o $@

# dev/cuda/<op>.cu: validation of every kernel variant runs in `make test` (then a CPU-figure bench).
$(BUILD)/cpu/dev_%: dev/cuda/%.cu $(CPU_SIMT_OBJS)
	@mkdir -p $(dir $@)
	$(CXX) $(CPU_CXXFLAGS) -x c++ $< -x none $(CPU_SIMT_OBJS) $(CPU_LDLIBS) -o $@

$(BUILD)/cpu/bench_simt: dev/cuda/bench_simt.cu $(CPU_SIMT_OBJS)
	@mkdir -p $(dir $@)
	$(CXX) $(CPU_CXXFLAGS) -x c++ $< -x none $(CPU_SIMT_OBJS) $(CPU_LDLIBS) -o $@

# ----------------------------------------------------------------------------
# Trainers

TRAINER_DEPS := $(wildcard llmc/*.cuh llmc/*.h)

# The trainers built for the GPU whatever the machine (make gpu-check runs these).
$(BUILD)/gpu/train_%: train_%.cu $(TRAINER_DEPS) $(GPU_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) $< $(NVCC_LDLIBS) -o $@

ifeq ($(TARGET),gpu)
train_gpt2: train_gpt2.cu $(TRAINER_DEPS) $(TRAINER_STAMP)
	$(NVCC) $(NVCC_FLAGS) $< $(NVCC_LDLIBS) -o $@
train_bert: train_bert.cu $(TRAINER_DEPS) $(TRAINER_STAMP)
	$(NVCC) $(NVCC_FLAGS) $< $(NVCC_LDLIBS) -o $@
else
train_gpt2: train_gpt2.cu $(TRAINER_DEPS) $(CPU_SIMT_OBJS) $(TRAINER_STAMP)
	$(CXX) $(filter-out -MMD -MP,$(CPU_CXXFLAGS)) -x c++ $< -x none $(CPU_SIMT_OBJS) $(CPU_LDLIBS) -o $@
train_bert: train_bert.cu $(TRAINER_DEPS) $(CPU_SIMT_OBJS) $(TRAINER_STAMP)
	$(CXX) $(filter-out -MMD -MP,$(CPU_CXXFLAGS)) -x c++ $< -x none $(CPU_SIMT_OBJS) $(CPU_LDLIBS) -o $@
endif

# ----------------------------------------------------------------------------
# Tests

DEVS           := $(filter-out bench_simt,$(patsubst dev/cuda/%.cu,%,$(wildcard dev/cuda/*.cu)))
CPU_TEST_BINS  := $(TESTS:%=$(BUILD)/cpu/test_%) $(BUILD)/asan/test_simt $(DEVS:%=$(BUILD)/cpu/dev_%) \
                  $(SUITE_TESTS:%=$(BUILD)/cpu/alone/test_%.ok)
ASAN_TEST_BINS := $(TESTS:%=$(BUILD)/asan/test_%)

NPROC := $(shell nproc 2>/dev/null || echo 2)

# The whole suite: CPU-backend tests, the NCCL test under mpirun, the kernel tests again on the L4
# profile, nvcc compile checks, and last the kernel coverage. The binaries are built by a parallel
# sub-make, so a plain `make test` uses every core.
test:
	@$(MAKE) --no-print-directory -j$(NPROC) $(CPU_TEST_BINS)
	@BUILD_DIR=$(BUILD)/cpu ASAN_DIR=$(BUILD)/asan TESTS="$(TESTS)" DEVS="$(DEVS)" NVCC="$(if $(HAVE_NVCC),$(NVCC))" \
	  CUDA_ARCHS="$(CUDA_ARCHS)" NVCC_CHECK_FLAGS="$(NVCC_CHECK_FLAGS)" CU_SOURCES="$(CU_SOURCES)" \
	  KERNEL_COVERAGE=1 SMALL_DEVICE=l4 scripts/run_tests.sh
	@$(if $(GPU_INFO),$(MAKE) --no-print-directory test-gpu)

# Under ASan, every process mpirun starts (from run_tests.sh or from a test itself) gets these
# LeakSanitizer options: Open MPI keeps its own allocations until exit, so the suppressions name its
# libraries (only them: a leak of the project's is still reported), which only the slow unwinder
# finds in its dlopen'ed plugins.
MPI_LSAN_OPTIONS := suppressions=$(CURDIR)/test/lsan-openmpi.supp:fast_unwind_on_malloc=0
test-asan:
	@$(MAKE) --no-print-directory -j$(NPROC) $(ASAN_TEST_BINS)
	@MPI_LSAN_OPTIONS="$(MPI_LSAN_OPTIONS)" BUILD_DIR=$(BUILD)/asan ASAN_DIR=$(BUILD)/asan TESTS="$(TESTS)" NVCC= \
	  CU_SOURCES= scripts/run_tests.sh

# The kernel tests on a real GPU (needs nvidia-smi to find one), one at a time (they share the GPU);
# the multi-rank ones need MPI and one GPU per rank.
GPU_COUNT := $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU')
GPU_RANKS := $(and $(MULTI),$(filter-out 0 1,$(GPU_COUNT)))
GPU_TESTS := $(filter-out simt $(if $(GPU_RANKS),,$(MPI_TESTS)),$(TESTS))
test-gpu:
	@$(if $(GPU_RANKS),,echo "SKIP multi-rank GPU tests ($(MPI_TESTS)): they need MPI and 2+ GPUs ($(GPU_COUNT) found$(if $(HAVE_MPI),,, no MPI)$(if $(HAVE_NCCL),,, no NCCL))")
	@$(MAKE) --no-print-directory -j$(NPROC) $(GPU_TESTS:%=$(BUILD)/gpu/test_%)
	@BUILD_DIR=$(BUILD)/gpu TESTS="$(GPU_TESTS)" TEST_JOBS=1 NVCC= CU_SOURCES= scripts/run_tests.sh

gpu-check:
	@scripts/gpu_check.sh $(GPU_CHECK_ARGS)

test-nvcc:
	@BUILD_DIR= TESTS= NVCC="$(NVCC)" CUDA_ARCHS="$(CUDA_ARCHS)" NVCC_CHECK_FLAGS="$(NVCC_CHECK_FLAGS)" \
	  CU_SOURCES="$(CU_SOURCES)" scripts/run_tests.sh

bench: $(BUILD)/cpu/bench_simt
	$(BUILD)/cpu/bench_simt
	scripts/bench_gpt2.sh

# ----------------------------------------------------------------------------
# Data tools and fuzzing

# Text -> token shards (dev/data/README.md): a plain host program, $(BUILD)/tokenize.
.PHONY: tokenize
tokenize: $(BUILD)/tokenize
$(BUILD)/tokenize: dev/data/tokenize.cpp
	@mkdir -p $(dir $@)
	$(CXX) -O2 -std=c++17 -Wall -Wextra -MMD -MP $< -o $@

# Text -> BERT shards for MLM and classification (dev/data/README.md): $(BUILD)/bert_data.
.PHONY: bert_data
bert_data: $(BUILD)/bert_data
$(BUILD)/bert_data: dev/data/bert_data.cpp
	@mkdir -p $(dir $@)
	$(CXX) -O2 -std=c++17 -Wall -Wextra -MMD -MP $< -o $@

# libFuzzer targets test/fuzz/fuzz_<name>.cpp (test/fuzz/README.md): `make fuzz-<name>` builds one
# with clang and runs it for FUZZ_SECONDS on its corpus $(BUILD)/fuzz/corpus_<name>, seeded from
# test/fuzz/seeds_<name>/ (if any) and FUZZ_SEEDS; FUZZ_ARGS go to libFuzzer.
FUZZ_CXX     ?= clang++
FUZZ_SECONDS ?= 60
# Targets are compiled against the CPU backend's headers and linked with its objects (built by g++,
# not instrumented), so parsers living next to CUDA code (llmc/gpt2_io.h's) can be fuzzed too.
$(BUILD)/fuzz/fuzz_%: test/fuzz/fuzz_%.cpp $(CPU_SIMT_OBJS)
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -MMD -MP \
	  -Illmc/simt/include -Illmc/simt -I$(CUDA_HOME)/include $(BLAS_CFLAGS) -x c++ $< -x none $(CPU_SIMT_OBJS) \
	  $(CPU_LDLIBS) -o $@
.PRECIOUS: $(BUILD)/fuzz/fuzz_%
fuzz-%: $(BUILD)/fuzz/fuzz_%
	@mkdir -p $(BUILD)/fuzz/corpus_$*
	$< -max_total_time=$(FUZZ_SECONDS) $(FUZZ_ARGS) $(BUILD)/fuzz/corpus_$* $(wildcard test/fuzz/seeds_$*) $(FUZZ_SEEDS)

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
# A dependency file names the source it was built from; -MP covers the headers only. When a test
# moves (e.g. into test/simt/), a build folder's older .d still names the old path: a source there
# that no longer exists makes its binary out of date instead of stopping make.
test/test_%.cu: ;
