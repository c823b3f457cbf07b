// test/bert_trainer.h — train_bert.cu as its tests include it: with TESTING (the program's main is
// train_bert_main) and its cudaMalloc calls counted (counted_malloc.h). Once per binary, so that the
// BERT tests can also be built together as one (test/bert_suite.cu).
#pragma once
#define TESTING
#include "counted_malloc.h"
#include "../train_bert.cu"
#undef cudaMalloc
