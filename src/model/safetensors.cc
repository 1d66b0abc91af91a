#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/json_limits.h"

namespace strata {
namespace {

using json = nlohmann::json;

// Headers beyond this are surely corrupt (the reference implementation caps at 100 MB).
constexpr int64_t kMaxHeaderBytes = int64_t(100) << 20;

// Reads a non-negative integer array field of a header entry.
Status read_int_array(const std::string& file, const std::string& tensor, const json& entry,
                      const char* field, std::vector<int64_t>* out) {
  auto it = entry.find(field);
  if (it == entry.end() || !it->is_array()) {
    return invalid_argument("{}: tensor '{}': field '{}' missing or not an array", file, tensor,
                            field);
  }
  for (const json& v : *it) {
    if (!v.is_number_integer() ||
        (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0)) {
      return invalid_argument("{}: tensor '{}': field '{}' must hold non-negative integers, got {}",
                              file, tensor, field, it->dump());
    }
    uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) {
      return invalid_argument("{}: tensor '{}': '{}' value {} is too large", file, tensor, field,
                              u);
    }
    out->push_back(int64_t(u));
  }
  return Status();
}

}  // namespace

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return not_found("{}: no such file", path);
    return invalid_argument("{}: cannot open: {}", path, std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return invalid_argument("{}: cannot stat: {}", path, std::strerror(err));
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->file_bytes_ = int64_t(st.st_size);
  if (f->file_bytes_ < 8) {
    ::close(fd);
    return data_loss("{}: file is {} bytes, too short for the 8-byte header length (truncated?)",
                     path, f->file_bytes_);
  }
  void* map = ::mmap(nullptr, size_t(f->file_bytes_), PROT_READ, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED)
    return invalid_argument("{}: mmap failed: {}", path, std::strerror(map_err));
  f->map_ = map;

  const auto* base = static_cast<const uint8_t*>(map);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];  // little-endian
  if (header_len > uint64_t(f->file_bytes_ - 8)) {
    return data_loss("{}: header length {} exceeds the file size ({} bytes; truncated?)", path,
                     header_len, f->file_bytes_);
  }
  if (int64_t(header_len) > kMaxHeaderBytes) {
    return data_loss("{}: header length {} is larger than the {} byte limit", path, header_len,
                     kMaxHeaderBytes);
  }
  std::string header(reinterpret_cast<const char*>(base + 8), size_t(header_len));
  STRATA_RETURN_IF_ERROR(f->parse_header(header, 8 + int64_t(header_len)));
  return f;
}

Status SafetensorsFile::parse_header(const std::string& header, int64_t data_begin) {
  const std::string& file = path_;
  // Metadata values are dumped back to text, which recurses once per nesting level.
  STRATA_RETURN_IF_ERROR(check_json_depth(header, file + ": header"));
  json h = json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded()) return data_loss("{}: header is not valid JSON", file);
  if (!h.is_object()) return data_loss("{}: header is not a JSON object", file);
  const int64_t data_bytes = file_bytes_ - data_begin;
  const auto* base = static_cast<const uint8_t*>(map_);

  for (const auto& [name, entry] : h.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return invalid_argument("{}: __metadata__ is not an object", file);
      for (const auto& [k, v] : entry.items()) {
        metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
      }
      continue;
    }
    if (!entry.is_object())
      return invalid_argument("{}: tensor '{}': entry is not an object", file, name);
    auto dt = entry.find("dtype");
    if (dt == entry.end() || !dt->is_string()) {
      return invalid_argument("{}: tensor '{}': field 'dtype' missing or not a string", file, name);
    }
    // BOOL (one byte each: an EAGLE-3 drafter's t2d mask) reads as U8.
    std::optional<DType> dtype = dt->get<std::string>() == "BOOL"
                                     ? std::optional<DType>(DType::kU8)
                                     : dtype_from_safetensors(dt->get<std::string>());
    if (!dtype) {
      return invalid_argument(
          "{}: tensor '{}': unsupported dtype '{}' (supported: F32, BF16, F16, F8_E4M3, F8_E5M2, "
          "I8, U8, BOOL, I32, I64)",
          file, name, dt->get<std::string>());
    }
    TensorInfo t{
        .name = name, .dtype = *dtype, .shape = {}, .data = nullptr, .nbytes = 0, .file = file};
    STRATA_RETURN_IF_ERROR(read_int_array(file, name, entry, "shape", &t.shape));
    std::vector<int64_t> offsets;
    STRATA_RETURN_IF_ERROR(read_int_array(file, name, entry, "data_offsets", &offsets));
    if (offsets.size() != 2 || offsets[0] > offsets[1]) {
      return invalid_argument(
          "{}: tensor '{}': data_offsets {} must be [begin, end] with begin <= end", file, name,
          entry["data_offsets"].dump());
    }
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      if (__builtin_mul_overflow(numel, d, &numel)) {
        return invalid_argument("{}: tensor '{}': shape {} overflows", file, name,
                                shape_str(t.shape));
      }
    }
    int64_t expect_bytes = 0;
    if (__builtin_mul_overflow(numel, int64_t(dtype_size(*dtype)), &expect_bytes) ||
        expect_bytes != offsets[1] - offsets[0]) {
      return data_loss(
          "{}: tensor '{}': shape {} of {} needs {} bytes but data_offsets [{}, {}] "
          "hold {}",
          file, name, shape_str(t.shape), dt->get<std::string>(), expect_bytes, offsets[0],
          offsets[1], offsets[1] - offsets[0]);
    }
    if (offsets[1] > data_bytes) {
      return data_loss(
          "{}: tensor '{}': data_offsets [{}, {}] exceed file size (data section is "
          "{} bytes; truncated?)",
          file, name, offsets[0], offsets[1], data_bytes);
    }
    t.data = base + data_begin + offsets[0];
    t.nbytes = expect_bytes;
    tensors_.push_back(std::move(t));
  }

  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.data != b.data ? a.data < b.data : a.nbytes < b.nbytes;
  });
  for (size_t i = 1; i < tensors_.size(); ++i) {
    const TensorInfo& prev = tensors_[i - 1];
    const TensorInfo& cur = tensors_[i];
    // Empty tensors occupy no bytes and cannot overlap anything.
    if (cur.nbytes > 0 && prev.nbytes > 0 && cur.data < prev.data + prev.nbytes) {
      return data_loss("{}: tensors '{}' and '{}' overlap (data_offsets [{}, {}] and [{}, {}])",
                       file, prev.name, cur.name, prev.data - base - data_begin,
                       prev.data - base - data_begin + prev.nbytes, cur.data - base - data_begin,
                       cur.data - base - data_begin + cur.nbytes);
    }
  }
  return Status();
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, size_t(file_bytes_));
}

Status write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries) {
  json h = json::object();
  int64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    const std::string_view dt = enum_name_in(kSafetensorsDTypeNames, e.dtype);
    if (dt == "?")
      return invalid_argument("write_safetensors: tensor '{}': dtype has no safetensors name",
                              e.name);
    int64_t want = dtype_bytes_for(e.dtype, shape_numel(e.shape));
    if (int64_t(e.bytes.size()) != want) {
      return invalid_argument("write_safetensors: tensor '{}': {} bytes given, shape {} needs {}",
                              e.name, e.bytes.size(), shape_str(e.shape), want);
    }
    h[e.name] = {
        {"dtype", std::string(dt)}, {"shape", e.shape}, {"data_offsets", {offset, offset + want}}};
    offset += want;
  }
  std::string header = h.dump();
  while (header.size() % 8 != 0) header.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return invalid_argument("{}: cannot open for writing", path);
  uint64_t n = header.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(header.data(), std::streamsize(header.size()));
  for (const SafetensorsEntry& e : entries) {
    out.write(reinterpret_cast<const char*>(e.bytes.data()), std::streamsize(e.bytes.size()));
  }
  if (!out) return data_loss("{}: write failed", path);
  return Status();
}

}  // namespace strata
