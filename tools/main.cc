// strata: one binary, several subcommands (serve, generate, plan, eval-kv, ...).
#include <cstdio>
#include <cstring>
#include <string>

#include "command.h"
#include "core/log.h"

namespace strata::tools {
std::map<std::string, Command>& commands() {
  static std::map<std::string, Command> m;
  return m;
}
}  // namespace strata::tools

static void usage() {
  std::fprintf(stderr, "usage: strata <command> [flags]\n\ncommands:\n");
  for (const auto& [name, cmd] : strata::tools::commands())
    std::fprintf(stderr, "  %-10s %s\n", name.c_str(), cmd.help.c_str());
  std::fprintf(stderr, "\n'strata <command> --help' lists a command's flags.\n");
}

int main(int argc, char** argv) {
  strata::init_logging();
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  auto& cmds = strata::tools::commands();
  auto it = cmds.find(argv[1]);
  if (it == cmds.end()) {
    std::fprintf(stderr, "strata: unknown command '%s'\n", argv[1]);
    usage();
    return 2;
  }
  std::string name = std::string("strata ") + argv[1];
  argv[1] = name.data();
  return it->second.fn(argc - 1, argv + 1);
}
