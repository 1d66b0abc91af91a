#include "tokenizer/decoder.h"

#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace strata::tok {

namespace {

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>* tokens) const override {
    for (const auto& s : steps_) s->decode_chain(tokens);
  }
  bool joins_byte_runs() const override {
    for (const auto& s : steps_) {
      if (s->joins_byte_runs()) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

// Joins all tokens, maps each byte-level character back to its byte (characters outside the
// alphabet, e.g. in added tokens, keep their UTF-8 bytes), then decodes the bytes lossily.
class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const std::string& t : *tokens) {
      const size_t mark = bytes.size();
      bool all_mapped = true;
      for (size_t pos = 0; pos < t.size();) {
        const int b = unicode_to_byte(next_code_point(t, &pos));
        if (b < 0) {
          all_mapped = false;
          break;
        }
        bytes.push_back(char(b));
      }
      if (!all_mapped) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens->assign(1, to_valid_utf8(bytes));
  }
};

// "<0xNN>" tokens -> bytes; a run of them that is not valid UTF-8 becomes one U+FFFD per byte.
class ByteFallbackDecoder final : public Decoder {
 public:
  bool joins_byte_runs() const override { return true; }
  void decode_chain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string run;
    auto flush = [&] {
      if (run.empty()) return;
      if (is_valid_utf8(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run.size(); ++i) out.emplace_back(kReplacementChar);
      }
      run.clear();
    };
    for (std::string& t : *tokens) {
      int byte = -1;
      if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>') byte = parse_hex(t[3], t[4]);
      if (byte >= 0) {
        run.push_back(char(byte));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens->swap(out);
  }

 private:
  static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int parse_hex(char hi, char lo) {
    const int h = hex_digit(hi), l = hex_digit(lo);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>* tokens) const override {
    std::string all;
    for (const auto& t : *tokens) all += t;
    tokens->assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing copies of `content` from every token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>* tokens) const override {
    const size_t n = content_.size();
    for (std::string& t : *tokens) {
      size_t begin = 0;
      for (size_t i = 0; i < start_ && t.compare(begin, n, content_) == 0; ++i) begin += n;
      size_t end = t.size();
      for (size_t i = 0; i < stop_ && end >= begin + n && t.compare(end - n, n, content_) == 0;
           ++i) {
        end -= n;
      }
      t = t.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>* tokens) const override {
    for (std::string& t : *tokens) t = replace_all(pattern_, t, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// "▁" -> " ", except that (as in Hugging Face) every "▁" of the first token is dropped unless
// the prepend scheme is "never".
class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool drop_first)
      : replacement_(std::move(replacement)), drop_first_(drop_first) {}
  void decode_chain(std::vector<std::string>* tokens) const override {
    const Pattern rep = Pattern::literal(replacement_);
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& t = (*tokens)[i];
      t = replace_all(rep, t, i == 0 && drop_first_ ? "" : " ");
    }
  }

 private:
  std::string replacement_;
  bool drop_first_;
};

StatusOr<std::unique_ptr<Decoder>> make_metaspace_decoder(const Json& j, std::string_view where) {
  STRATA_ASSIGN_OR_RETURN(std::string replacement, json_char(j, "replacement", where));
  bool drop_first = true;
  if (auto it = j.find("prepend_scheme"); it != j.end() && !it->is_null()) {
    STRATA_ASSIGN_OR_RETURN(std::string s, json_string(j, "prepend_scheme", where));
    drop_first = s != "never";
  } else {
    STRATA_ASSIGN_OR_RETURN(drop_first, json_bool_or(j, "add_prefix_space", true, where));
  }
  return std::unique_ptr<Decoder>(new MetaspaceDecoder(replacement, drop_first));
}

}  // namespace

StatusOr<std::unique_ptr<Decoder>> make_decoder(const Json& j, std::string_view where) {
  using Ptr = std::unique_ptr<Decoder>;
  if (j.is_null()) return Ptr();
  if (!j.is_object()) return invalid_argument("{} must be an object or null", where);
  STRATA_ASSIGN_OR_RETURN(std::string type, json_string(j, "type", where));
  if (type == "Sequence") {
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) {
      return invalid_argument("{}.decoders must be an array", where);
    }
    std::vector<Ptr> steps;
    for (size_t i = 0; i < it->size(); ++i) {
      STRATA_ASSIGN_OR_RETURN(Ptr step,
                              make_decoder((*it)[i], fmt::format("{}.decoders[{}]", where, i)));
      if (step) steps.push_back(std::move(step));
    }
    return Ptr(new SequenceDecoder(std::move(steps)));
  }
  if (type == "ByteLevel") return Ptr(new ByteLevelDecoder());
  if (type == "ByteFallback") return Ptr(new ByteFallbackDecoder());
  if (type == "Fuse") return Ptr(new FuseDecoder());
  if (type == "Strip") {
    STRATA_ASSIGN_OR_RETURN(std::string content, json_char(j, "content", where));
    STRATA_ASSIGN_OR_RETURN(int64_t start, json_int_or(j, "start", 0, where));
    STRATA_ASSIGN_OR_RETURN(int64_t stop, json_int_or(j, "stop", 0, where));
    if (start < 0 || stop < 0) return invalid_argument("{}: start/stop must be >= 0", where);
    return Ptr(new StripDecoder(content, size_t(start), size_t(stop)));
  }
  if (type == "Replace") {
    STRATA_ASSIGN_OR_RETURN(Pattern pattern, json_pattern(j, where));
    STRATA_ASSIGN_OR_RETURN(std::string content, json_string(j, "content", where));
    return Ptr(new ReplaceDecoder(std::move(pattern), content));
  }
  if (type == "Metaspace") return make_metaspace_decoder(j, where);
  return unimplemented("{}: decoder type '{}' is not supported", where, type);
}

}  // namespace strata::tok
