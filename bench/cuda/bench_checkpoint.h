// Random-weight checkpoints of a real Llama shape for the CUDA benchmarks: the safetensors file
// is written as a sparse (zero) file, loaded through the normal loader, and the device copies are
// then filled with random values (CudaBackend::fill_all_random): timings never see zeros.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

namespace strata {

// A checkpoint's tensors in file order: name and shape.
using CheckpointTensors = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// Every tensor of a Llama checkpoint shaped by `c` (a config.json; num_hidden_layers layers).
inline CheckpointTensors llama_tensors(const nlohmann::json& c) {
  const int64_t hidden = c["hidden_size"], inter = c["intermediate_size"];
  const int64_t layers = c["num_hidden_layers"], heads = c["num_attention_heads"];
  const int64_t kv_heads = c.value("num_key_value_heads", heads);
  const int64_t hd = c.value("head_dim", hidden / heads), vocab = c["vocab_size"];
  CheckpointTensors t = {{"model.embed_tokens.weight", {vocab, hidden}}, {"model.norm.weight", {hidden}}};
  if (!c.value("tie_word_embeddings", false)) t.push_back({"lm_head.weight", {vocab, hidden}});
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back({p + "input_layernorm.weight", {hidden}});
    t.push_back({p + "post_attention_layernorm.weight", {hidden}});
    t.push_back({p + "self_attn.q_proj.weight", {heads * hd, hidden}});
    t.push_back({p + "self_attn.k_proj.weight", {kv_heads * hd, hidden}});
    t.push_back({p + "self_attn.v_proj.weight", {kv_heads * hd, hidden}});
    t.push_back({p + "self_attn.o_proj.weight", {hidden, heads * hd}});
    t.push_back({p + "mlp.gate_proj.weight", {inter, hidden}});
    t.push_back({p + "mlp.up_proj.weight", {inter, hidden}});
    t.push_back({p + "mlp.down_proj.weight", {hidden, inter}});
  }
  return t;
}

// Writes the safetensors header for `tensors` (bf16, packed in order) to `f`. Returns the bytes
// of tensor data that must follow it.
inline int64_t write_bf16_safetensors_header(std::ofstream& f, const CheckpointTensors& tensors) {
  nlohmann::json header = nlohmann::json::object();
  int64_t off = 0;
  for (const auto& [name, shape] : tensors) {
    const int64_t bytes = 2 * std::accumulate(shape.begin(), shape.end(), int64_t(1), std::multiplies<>());
    header[name] = {{"dtype", "BF16"}, {"shape", shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string h = header.dump();
  while (h.size() % 8) h.push_back(' ');
  const uint64_t n = h.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(h.data(), std::streamsize(h.size()));
  return off;
}

// Writes `dir`/model.safetensors with every Llama tensor of `config` as zero bf16 (a sparse
// file: instant, no disk) and copies the config. Returns the bytes of weights.
inline int64_t write_zero_checkpoint(const std::string& config_path, const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(config_path, dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  const std::string path = dir + "/model.safetensors";
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const int64_t data = write_bf16_safetensors_header(f, llama_tensors(nlohmann::json::parse(std::ifstream(config_path))));
  const uint64_t header_end = uint64_t(f.tellp());
  f.close();
  std::filesystem::resize_file(path, header_end + uint64_t(data));
  return data;
}

}  // namespace strata
