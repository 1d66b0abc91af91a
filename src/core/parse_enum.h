// Parses a user's text (a flag, a config field) into an enum through its name table
// (core/enum_names.h), with an error that names what was parsed and every accepted name.
#pragma once

#include <string_view>

#include "core/enum_names.h"
#include "core/status.h"

namespace strata {

// InvalidArgument "--device must be cpu | cuda, got 'tpu'" when `text` names no value.
template <typename E>
StatusOr<E> parse_enum(std::string_view text, std::string_view what) {
  if (std::optional<E> v = enum_from_name<E>(text)) return *v;
  return invalid_argument("{} must be {}, got '{}'", what, enum_name_list<E>(), text);
}

}  // namespace strata
