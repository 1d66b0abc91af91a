// strata_bench_kit: the benchmarks a device call runs most (mla_bench, moe_bench, rank_step_bench,
// int4_linear_bench) as one program. Each benchmark links the whole CUDA backend, ~12 MB of xz a
// program, and a device call carries at most 64 MiB with the tracked tree (~24 MB): three
// benchmarks and the parity binary did not fit in one call, so each A/B paid a machine start
// (~250 s of the session's 1,800). One program holds the backend once.
// Run as `strata_bench_kit NAME args...`, or through a link named strata_bench_NAME (prebuilt.sh
// unpack makes them, so the scripts call the benchmarks by their own names).
#include <cstdio>
#include <cstring>
#include <string>

int strata_kit_mla_bench_main(int argc, char** argv);
int strata_kit_moe_bench_main(int argc, char** argv);
int strata_kit_rank_step_bench_main(int argc, char** argv);
int strata_kit_int4_linear_bench_main(int argc, char** argv);

namespace {

struct Entry {
  const char* name;
  int (*run)(int, char**);
};
constexpr Entry kBenches[] = {
    {"mla_bench", strata_kit_mla_bench_main},
    {"moe_bench", strata_kit_moe_bench_main},
    {"rank_step_bench", strata_kit_rank_step_bench_main},
    {"int4_linear_bench", strata_kit_int4_linear_bench_main},
};

const Entry* find(std::string name) {
  const auto slash = name.rfind('/');
  if (slash != std::string::npos) name = name.substr(slash + 1);
  if (name.rfind("strata_bench_", 0) == 0) name = name.substr(13);
  for (const Entry& e : kBenches)
    if (name == e.name) return &e;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  if (const Entry* e = find(argv[0])) return e->run(argc, argv);  // called through a link
  if (argc >= 2)
    if (const Entry* e = find(argv[1])) return e->run(argc - 1, argv + 1);
  std::fprintf(stderr,
               "usage: strata_bench_kit NAME [args...] (or a link named strata_bench_NAME);"
               " NAME one of:");
  for (const Entry& e : kBenches) std::fprintf(stderr, " %s", e.name);
  std::fprintf(stderr, "\n");
  return 2;
}
