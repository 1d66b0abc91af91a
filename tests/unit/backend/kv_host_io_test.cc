// The CPU host copy path (backend/kv_host_io.h): whole pages round-trip device -> host -> other
// device pages byte for byte, for every KV row format (plain f32/bf16/fp8, mixed layers, split
// MLA rows, FlashMLA fp8), and the io-backend flag is parsed and refused where it does not apply.
#include "backend/kv_host_io.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

namespace strata {
namespace {

void fill_random(const KvStorage& kv, std::mt19937& rng) {
  for (int l = 0; l < kv.layout().num_layers; ++l)
    for (const Tensor& t : {kv.k(l), kv.v(l)}) {
      if (t.empty()) continue;
      auto* b = static_cast<uint8_t*>(t.data);
      for (int64_t i = 0; i < t.nbytes(); ++i) b[i] = uint8_t(rng());
    }
}

// Bytes of device page p, layer l, K or V.
std::vector<uint8_t> device_part(const KvStorage& kv, int l, bool value, int32_t p) {
  const Tensor t = value ? kv.v(l) : kv.k(l);
  if (t.empty()) return {};
  const int64_t page = t.nbytes() / kv.layout().num_pages;
  const auto* b = static_cast<const uint8_t*>(t.data) + int64_t(p) * page;
  return {b, b + page};
}

void round_trip(const KvLayout& layout) {
  auto backend = make_cpu_backend();
  auto kv = backend->alloc_kv(layout);
  std::mt19937 rng(3);
  fill_random(*kv, rng);
  auto io = make_kv_host_io(*backend, *kv, /*num_host_pages=*/6, KvIoBackend::kAuto);
  ASSERT_TRUE(io.ok()) << io.status().message();
  KvHostIo& h = **io;
  EXPECT_EQ(h.page_bytes(), layout.bytes_per_token() * layout.page_size);
  // Device pages 1,2,3 (one run) and 6 onto host 0,1,2 and 5.
  const std::vector<KvPageCopy> out = {{1, 0}, {2, 1}, {3, 2}, {6, 5}};
  const uint64_t t = h.device_to_host(out);
  h.wait(t);
  EXPECT_TRUE(h.done(t));
  for (const KvPageCopy& c : out)
    for (int l = 0; l < layout.num_layers; ++l)
      for (bool value : {false, true}) {
        auto want = device_part(*kv, l, value, c.device_page);
        ASSERT_EQ(h.page_part_bytes(l, value), int64_t(want.size()));
        if (want.empty()) continue;
        EXPECT_EQ(std::memcmp(h.host_page_part(c.host_page, l, value), want.data(), want.size()),
                  0);
      }
  // Back to other device pages: their bytes equal the originals'.
  std::vector<std::vector<uint8_t>> before;
  for (const KvPageCopy& c : out)
    for (int l = 0; l < layout.num_layers; ++l)
      for (bool value : {false, true}) before.push_back(device_part(*kv, l, value, c.device_page));
  const std::vector<KvPageCopy> back = {{7, 0}, {0, 1}, {4, 2}, {5, 5}};
  h.wait(h.host_to_device(back));
  size_t i = 0;
  for (const KvPageCopy& c : back)
    for (int l = 0; l < layout.num_layers; ++l)
      for (bool value : {false, true})
        EXPECT_EQ(device_part(*kv, l, value, c.device_page), before[i++]);
  EXPECT_GE(h.copy_seconds(), 0.0);
}

KvLayout gqa(DType dtype) {
  return KvLayout{
      .num_layers = 3, .num_pages = 8, .page_size = 4, .k_dim = 16, .v_dim = 16, .dtype = dtype};
}

TEST(KvHostIoTest, RoundTripsPlainRows) {
  round_trip(gqa(DType::kF32));
  round_trip(gqa(DType::kBF16));
  round_trip(gqa(DType::kFP8E4M3));
}

TEST(KvHostIoTest, RoundTripsMixedLayers) {
  KvLayout l = gqa(DType::kFP8E4M3);
  l.layer_dtypes = {DType::kBF16, DType::kFP8E4M3, DType::kBF16};
  round_trip(l);
}

TEST(KvHostIoTest, RoundTripsMlaRows) {
  KvLayout mla{.num_layers = 2,
               .num_pages = 8,
               .page_size = 2,
               .k_dim = 160,
               .v_dim = 0,
               .dtype = DType::kFP8E4M3,
               .rope_dim = 32,
               .rope_dtype = DType::kBF16};
  round_trip(mla);
  mla.format = KvFormat::kFlashMlaFp8;
  mla.rope_dtype.reset();
  round_trip(mla);
}

TEST(KvHostIoTest, IoBackendFlag) {
  EXPECT_EQ(*parse_kv_io_backend(""), KvIoBackend::kAuto);
  EXPECT_EQ(*parse_kv_io_backend("direct"), KvIoBackend::kDirect);
  EXPECT_EQ(*parse_kv_io_backend("kernel"), KvIoBackend::kKernel);
  EXPECT_FALSE(parse_kv_io_backend("dma").ok());
  auto backend = make_cpu_backend();
  auto kv = backend->alloc_kv(gqa(DType::kF32));
  auto io = make_kv_host_io(*backend, *kv, 4, KvIoBackend::kKernel);
  ASSERT_FALSE(io.ok());
  EXPECT_NE(io.status().message().find("cpu"), std::string::npos);
  EXPECT_FALSE(make_kv_host_io(*backend, *kv, 0, KvIoBackend::kAuto).ok());
}

}  // namespace
}  // namespace strata
