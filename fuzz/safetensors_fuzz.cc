// Fuzzes SafetensorsFile::open (the header parser and its validation) on hostile files.
// Input: a whole file when it does not start with '{'; otherwise the header JSON alone, which the
// target frames as a file (8-byte length, header, 4 KiB of data) so mutations stay in the JSON.
// Every tensor it accepts must lie inside the mapping: its first and last bytes are read.
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static strata::fuzz::MemFile file;
  std::string bytes;
  if (size > 0 && data[0] == '{') {
    uint64_t n = size;
    for (int i = 0; i < 8; ++i) bytes.push_back(char(uint8_t(n >> (8 * i))));
    bytes.append(reinterpret_cast<const char*>(data), size);
    bytes.append(4096, '\x5a');
  } else {
    bytes.assign(reinterpret_cast<const char*>(data), size);
  }
  auto f = strata::SafetensorsFile::open(file.write(bytes));
  if (!f.ok()) return 0;
  volatile uint8_t sink = 0;
  for (const strata::TensorInfo& t : (*f)->tensors()) {
    if (t.nbytes < 0 || t.nbytes != strata::dtype_bytes_for(t.dtype, t.numel())) __builtin_trap();
    if (t.nbytes > 0) sink = sink + t.data[0] + t.data[t.nbytes - 1];
  }
  return 0;
}
