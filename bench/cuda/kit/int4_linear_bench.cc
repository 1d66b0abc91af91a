// int4_linear_bench inside strata_bench_kit (kit_main.cc says why): its source with main renamed.
#define main strata_kit_int4_linear_bench_main
#include "cuda/int4_linear_bench.cc"
