// test/gpt2_trainer.h — train_gpt2.cu as its tests include it: with TESTING (the program's main is
// train_gpt2_main) and its cudaMalloc calls counted (counted_malloc.h). Once per binary, so that the
// GPT-2 tests can also be built together as one (test/gpt2_suite.cu).
#pragma once
#define TESTING
#include "counted_malloc.h"
#include "../train_gpt2.cu"
#undef cudaMalloc
