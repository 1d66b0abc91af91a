// mla_bench inside strata_bench_kit (kit_main.cc says why): its source with main renamed.
#define main strata_kit_mla_bench_main
#include "cuda/mla_bench.cc"
