#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>

namespace strata {

void init_logging() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("strata");
    logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
    spdlog::set_default_logger(logger);
  });
}

bool set_log_level(const std::string& level) {
  init_logging();
  std::string name = level == "warn" ? "warning" : level;
  auto lvl = spdlog::level::from_str(name);
  if (lvl == spdlog::level::off && name != "off") return false;
  spdlog::set_level(lvl);
  return true;
}

}  // namespace strata
