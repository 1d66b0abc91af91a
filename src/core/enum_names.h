// Enum names: one table per enum gives both directions, name -> value (flags, config files,
// JSON) and value -> name (logs, JSON, help), so no enum has a hand-written switch of its names
// and a parser that can drift from it. An enum declares its table next to itself:
//
//   enum class Color : uint8_t { kRed, kDarkBlue };
//   inline constexpr EnumName<Color> kColorNames[] = {{Color::kRed, "red"}, {Color::kDarkBlue,
//   "dark_blue"},
//                                                     {Color::kDarkBlue, "navy"}};  // an alias
//   constexpr const auto& enum_names(Color) { return kColorNames; }  // found by ADL
//
// The first entry of a value is its name; later entries of the same value are aliases that parse
// but never print. A value without an entry prints as "?". Tables with other spellings of the
// same enum (a file format's) use the *_in functions directly. Parsing a user's text with an
// error that lists the names: core/parse_enum.h. Header-only, constexpr, no dependencies, C++17
// (the CUDA sources include enums that have tables).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace strata {

template <typename E>
struct EnumName {
  E value;
  std::string_view name;
};

// The name of `v` in `table` ("?" when absent).
template <typename E, size_t N>
constexpr std::string_view enum_name_in(const EnumName<E> (&table)[N], E v) {
  for (const EnumName<E>& n : table)
    if (n.value == v) return n.name;
  return "?";
}

// The value named `name` in `table` (aliases included); nullopt when none is.
template <typename E, size_t N>
constexpr std::optional<E> enum_from_name_in(const EnumName<E> (&table)[N], std::string_view name) {
  for (const EnumName<E>& n : table)
    if (n.name == name) return n.value;
  return std::nullopt;
}

// "a | b | c": the names of `table`, aliases left out (help texts, errors).
template <typename E, size_t N>
std::string enum_name_list_in(const EnumName<E> (&table)[N], std::string_view separator = " | ") {
  std::string out;
  for (size_t i = 0; i < N; ++i) {
    bool alias = false;
    for (size_t j = 0; j < i; ++j) alias |= table[j].value == table[i].value;
    if (alias) continue;
    if (!out.empty()) out += separator;
    out += table[i].name;
  }
  return out;
}

// The same through the enum's own table (enum_names(E), found by argument-dependent lookup).
template <typename E>
constexpr std::string_view enum_name(E v) {
  return enum_name_in(enum_names(E{}), v);
}
template <typename E>
constexpr std::optional<E> enum_from_name(std::string_view name) {
  return enum_from_name_in(enum_names(E{}), name);
}
template <typename E>
std::string enum_name_list(std::string_view separator = " | ") {
  return enum_name_list_in(enum_names(E{}), separator);
}

}  // namespace strata
