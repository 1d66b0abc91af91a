// The enum name tables (core/enum_names.h): every enumerator of every table-backed enum has a
// name, every name parses back to its value, canonical names are unique, and a bad name is refused
// naming the flag and listing the accepted names.
#include "core/enum_names.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <typeinfo>

#include "backend/kv_host_io.h"
#include "core/parse_enum.h"
#include "core/weight_format.h"
#include "engine/kv_config.h"
#include "engine/request.h"
#include "kv/hicache.h"
#include "model/inventory.h"
#include "model/sharding.h"

namespace strata {
namespace {

// `last`: the enum's last enumerator (the values run 0..last).
template <typename E>
void expect_complete_table(E last) {
  SCOPED_TRACE(std::string(typeid(E).name()));
  std::set<std::string_view> canonical;
  for (int v = 0; v <= int(last); ++v) {
    const E e = static_cast<E>(v);
    const std::string_view name = enum_name(e);
    EXPECT_NE(name, "?") << "value " << v << " has no name";
    EXPECT_EQ(enum_from_name<E>(name), e) << name;
    EXPECT_TRUE(canonical.insert(name).second) << name << " names two values";
  }
  for (const auto& entry : enum_names(E{}))
    EXPECT_EQ(enum_from_name<E>(entry.name), entry.value) << entry.name;
  EXPECT_FALSE(enum_from_name<E>("no such name"));
}

TEST(EnumNames, EveryTableIsCompleteAndRoundTrips) {
  expect_complete_table(DType::kInt4Packed);
  expect_complete_table(StatusCode::kDataLoss);
  expect_complete_table(Device::kCuda);
  expect_complete_table(WeightFormat::kInt4Group);
  expect_complete_table(QuantMethod::kFp8Block);
  expect_complete_table(Sharding::kKvHeads);
  expect_complete_table(WeightRole::kRoutedExpert);
  expect_complete_table(ShardKind::kVocab);
  expect_complete_table(HiCacheWritePolicy::kWriteBack);
  expect_complete_table(KvIoBackend::kKernel);
  expect_complete_table(KvCacheDtype::kFp8FlashMla);
  expect_complete_table(RequestState::kAborted);
  expect_complete_table(FinishReason::kAbort);
}

TEST(EnumNames, NamesAndAliasesAsUsersWriteThem) {
  EXPECT_EQ(std::string(dtype_name(DType::kFP8E4M3)), "fp8_e4m3");
  EXPECT_EQ(dtype_from_safetensors("F8_E4M3"), DType::kFP8E4M3);
  EXPECT_FALSE(dtype_from_safetensors("fp8_e4m3"));  // the file format's table, not the flags'
  EXPECT_EQ(enum_from_name<KvCacheDtype>("bfloat16"), KvCacheDtype::kBF16);  // an alias parses...
  EXPECT_EQ(enum_name(KvCacheDtype::kBF16), "bf16");                         // ...but never prints
  EXPECT_EQ(enum_name_list<KvCacheDtype>(),
            "auto | bf16 | f32 | fp8_e4m3 | fp8_e5m2 | fp8_flashmla");
  EXPECT_EQ(enum_from_name<KvIoBackend>(""), KvIoBackend::kAuto);  // an unset --hicache-io-backend
  EXPECT_EQ(enum_name_list<KvIoBackend>(", "), "auto, memcpy, direct, kernel");
  EXPECT_EQ(std::string(finish_reason_name(FinishReason::kLength)), "length");
}

TEST(EnumNames, ABadNameIsRefusedNamingTheFlagAndTheChoices) {
  auto d = parse_enum<Device>("tpu", "--device");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().message(), "--device must be cpu | cuda, got 'tpu'");
  EXPECT_EQ(*parse_enum<Device>("cuda", "--device"), Device::kCuda);
  auto p = parse_hicache_write_policy("write_around");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find(
                "--hicache-write-policy must be write_through | write_through_selective | "
                "write_back"),
            std::string::npos)
      << p.status().message();
}

}  // namespace
}  // namespace strata
