// Subcommand registry: each tools/<name>_main.cc registers `strata <name>` with
//   static const CommandRegistrar reg("plan", "capacity before launch", plan_main);
// main.cc dispatches on argv[1].
#pragma once

#include <map>
#include <string>

namespace strata::tools {

using CommandFn = int (*)(int argc, char** argv);  // argv[0] is "strata <name>"

struct Command {
  std::string help;
  CommandFn fn;
};

std::map<std::string, Command>& commands();

struct CommandRegistrar {
  CommandRegistrar(const char* name, const char* help, CommandFn fn) {
    commands()[name] = Command{help, fn};
  }
};

}  // namespace strata::tools
