// Logging through spdlog. All logs go to stderr so stdout stays clean for results (JSONL).
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace strata {

// Sets the global level from a name: trace, debug, info, warning, error, critical, off.
// Returns false for an unknown name. Thread-safe after startup.
bool set_log_level(const std::string& level);

// Called once at program start; idempotent.
void init_logging();

}  // namespace strata

#define LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define LOG_INFO(...) spdlog::info(__VA_ARGS__)
#define LOG_WARN(...) spdlog::warn(__VA_ARGS__)
#define LOG_ERROR(...) spdlog::error(__VA_ARGS__)
