// Test support: read Hugging Face reference tensors and run a model on one sequence through the
// paged KV path (pages handed out in a scrambled order, so page tables really matter).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "arch/model.h"
#include "model/safetensors.h"

namespace strata::testing {

inline std::string shared_dir() { return STRATA_SHARED_DIR; }

class Reference {
 public:
  explicit Reference(const std::string& path) {
    auto f = SafetensorsFile::open(path);
    EXPECT_TRUE(f.ok()) << f.status().to_string();
    if (f.ok()) file_ = std::move(f).value();
  }
  bool ok() const { return file_ != nullptr; }
  bool has(const std::string& name) const { return find(name) != nullptr; }
  std::vector<int32_t> i32(const std::string& name) const {
    const TensorInfo* t = find(name);
    EXPECT_TRUE(t && t->dtype == DType::kI32) << name;
    if (!t) return {};
    std::vector<int32_t> v(size_t(t->numel()));
    std::memcpy(v.data(), t->data, v.size() * 4);
    return v;
  }
  std::vector<float> f32(const std::string& name) const {
    const TensorInfo* t = find(name);
    EXPECT_TRUE(t && t->dtype == DType::kF32) << name;
    if (!t) return {};
    std::vector<float> v(size_t(t->numel()));
    std::memcpy(v.data(), t->data, v.size() * 4);
    return v;
  }

 private:
  const TensorInfo* find(const std::string& name) const {
    if (!file_) return nullptr;
    for (const auto& t : file_->tensors())
      if (t.name == name) return &t;
    return nullptr;
  }
  std::unique_ptr<SafetensorsFile> file_;
};

// max |a - b| / max |b|
inline double rel_max_error(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return den > 0 ? num / den : num;
}

// A reference's scored sequences seq0, seq1, ...: their input ids and the logits of every
// position ([len, vocab] each).
struct ReferenceSequences {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<float>> logits;
};
inline ReferenceSequences reference_sequences(const Reference& ref) {
  ReferenceSequences out;
  for (int s = 0; ref.has("seq" + std::to_string(s) + ".input_ids"); ++s) {
    out.ids.push_back(ref.i32("seq" + std::to_string(s) + ".input_ids"));
    out.logits.push_back(ref.f32("seq" + std::to_string(s) + ".logits"));
  }
  return out;
}

// log_softmax of one reference logits row, in double (a token's logprob given the row's position:
// what prompt logprobs are checked against).
inline std::vector<double> log_softmax(const float* row, int64_t vocab) {
  const double mx = *std::max_element(row, row + vocab);
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - mx);
  const double log_z = mx + std::log(sum);
  std::vector<double> out(static_cast<size_t>(vocab));
  for (int64_t v = 0; v < vocab; ++v) out[size_t(v)] = double(row[v]) - log_z;
  return out;
}

// ‖a − b‖² / ‖b‖² (infinite when a holds a non-finite value; ‖a − b‖² itself against an all-zero
// b, so that zeros match zeros and a bound still limits the error).
inline double nmse(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? num / den : num;
}

// Fraction of rows whose argmax agrees; `worst_gap` receives, over the rows that disagree, the
// largest shortfall of the reference logit at our argmax below the reference maximum, relative
// to that row's largest |logit| (0 when all agree): disagreements must be near-ties.
inline double argmax_agreement(const std::vector<float>& a, const std::vector<float>& b,
                               int64_t vocab, double* worst_gap) {
  const int64_t rows = int64_t(b.size()) / vocab;
  int64_t same = 0;
  *worst_gap = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const auto row_a = a.begin() + r * vocab, row_b = b.begin() + r * vocab;
    const auto ai = std::max_element(row_a, row_a + vocab) - row_a;
    const auto bi = std::max_element(row_b, row_b + vocab) - row_b;
    same += ai == bi;
    if (ai != bi) {
      float scale = 0;
      for (int64_t i = 0; i < vocab; ++i) scale = std::max(scale, std::fabs(row_b[i]));
      *worst_gap = std::max(*worst_gap, double(row_b[bi] - row_b[ai]) / scale);
    }
  }
  return double(same) / double(rows);
}

// Runs one sequence: prefill in chunks of `chunk` tokens, then greedy decode. Pages are
// assigned in reverse order to exercise the page table.
class SingleSequence {
 public:
  // dcp_size > 1: a decode-context-parallel model (arch/dcp.h): its pool pages hold page_size
  // tokens and the step's pages page_size x dcp_size.
  SingleSequence(Model& model, int page_size, int max_tokens, DType kv_dtype = DType::kF32,
                 int dcp_size = 1)
      : model_(model), page_size_(page_size * dcp_size) {
    KvLayout layout = model.kv_layout();
    layout.page_size = page_size;
    layout.num_pages = (max_tokens + page_size_ - 1) / page_size_;
    layout.dtype = kv_dtype;
    kv_ = model.backend().alloc_kv(layout);
    pages_.resize(size_t(layout.num_pages));
    std::iota(pages_.rbegin(), pages_.rend(), 0);
  }

  // Appends `ids`, returning logits of every new token ([n, vocab]) when all_logits, else of the
  // last one. With `sample` the step runs forward_sample instead (ids and kept rows go to its
  // buffers) and returns nothing.
  std::vector<float> step(const std::vector<int32_t>& ids, bool all_logits,
                          const SampleArgs* sample = nullptr) {
    const int n = int(ids.size());
    const int32_t start = len_;
    len_ += n;
    std::vector<int32_t> positions(static_cast<size_t>(n)), slots(static_cast<size_t>(n)), rows;
    for (int i = 0; i < n; ++i) {
      positions[size_t(i)] = start + i;
      slots[size_t(i)] =
          pages_[size_t((start + i) / page_size_)] * page_size_ + (start + i) % page_size_;
    }
    const int32_t used_pages = (len_ + page_size_ - 1) / page_size_;
    int32_t q_indptr[2] = {0, n}, kv_lens[1] = {len_}, page_indptr[2] = {0, used_pages};
    if (all_logits) {
      rows.resize(size_t(n));
      std::iota(rows.begin(), rows.end(), 0);
    } else {
      rows = {n - 1};
    }
    ForwardBatch b;
    b.token_ids = ids.data();
    b.attn.num_seqs = 1;
    b.attn.num_tokens = n;
    b.attn.page_size = page_size_;
    b.attn.q_indptr = q_indptr;
    b.attn.kv_lens = kv_lens;
    b.attn.page_indptr = page_indptr;
    b.attn.page_indices = pages_.data();
    b.attn.positions = positions.data();
    b.attn.slot_mapping = slots.data();
    b.logit_rows = rows.data();
    b.num_logit_rows = int(rows.size());
    if (capture_width_ > 0) {  // the model runner's capture (Model::set_capture), raw bytes
      captured_raw_.resize(size_t(n) * size_t(capture_width_) * 4);
      b.captured = captured_raw_.data();
    }
    std::vector<float> logits;
    if (sample != nullptr) {
      model_.forward_sample(b, *kv_, *sample);
    } else {
      logits.resize(rows.size() * size_t(model_.spec().vocab_size));
      model_.forward(b, *kv_, logits.data());
    }
    if (capture_width_ > 0) {  // as float32, whatever the activations' dtype
      captured_.resize(size_t(n) * size_t(capture_width_));
      to_f32(model_.capture_dtype(), captured_raw_.data(), captured_.data(),
             int64_t(captured_.size()));
    }
    return logits;
  }

  std::vector<int32_t> greedy(const std::vector<int32_t>& prompt, int new_tokens, int chunk) {
    std::vector<float> logits;
    for (size_t i = 0; i < prompt.size(); i += size_t(chunk)) {
      std::vector<int32_t> part(prompt.begin() + long(i),
                                prompt.begin() + long(std::min(prompt.size(), i + size_t(chunk))));
      logits = step(part, false);
    }
    std::vector<int32_t> out;
    for (int i = 0; i < new_tokens; ++i) {
      const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.push_back(next);
      if (i + 1 < new_tokens) logits = step({next}, false);
    }
    return out;
  }

  KvStorage& kv() { return *kv_; }
  // Steps download the model's captured states when width > 0: captured() is the last step's
  // [n, width] as float32.
  void capture(int64_t width) { capture_width_ = width; }
  const std::vector<float>& captured() const { return captured_; }

 private:
  int64_t capture_width_ = 0;
  std::vector<uint8_t> captured_raw_;
  std::vector<float> captured_;
  Model& model_;
  int page_size_;
  int32_t len_ = 0;
  std::vector<int32_t> pages_;
  std::unique_ptr<KvStorage> kv_;
};

// A long-context reference (reference-long.safetensors): the argmax at every position of
// `long0` (near-ties may flip under float32 reordering: at most 2 disagree), the logits at its
// sampled positions within `max_rel_error`, and the `longgreedy0` greedy continuation exactly.
inline void check_long_reference(Model& model, const std::string& reference_path, const char* name,
                                 double max_rel_error) {
  Reference ref(reference_path);
  auto ids = ref.i32("long0.input_ids");
  auto argmax = ref.i32("long0.argmax");
  auto positions = ref.i32("long0.sample_positions");
  auto sample = ref.f32("long0.sample_logits");
  SingleSequence run(model, 16, int(ids.size()));
  auto logits = run.step(ids, true);
  const int64_t vocab = model.spec().vocab_size;
  int agree = 0;
  for (size_t p = 0; p < ids.size(); ++p) {
    auto row = logits.begin() + long(p * size_t(vocab));
    agree += int(std::max_element(row, row + vocab) - row) == argmax[p];
  }
  EXPECT_GE(agree, int(ids.size()) - 2) << name;
  std::vector<float> picked;
  for (int32_t p : positions)
    picked.insert(picked.end(), logits.begin() + long(p * vocab),
                  logits.begin() + long((p + 1) * vocab));
  const double err = rel_max_error(picked, sample);
  std::printf("%s long: argmax agreement %d/%zu, sampled rel max error %.3g\n", name, agree,
              ids.size(), err);
  EXPECT_LT(err, max_rel_error) << name;

  auto prompt = ref.i32("longgreedy0.prompt_ids");
  auto expected = ref.i32("longgreedy0.output_ids");
  SingleSequence run2(model, 16, int(prompt.size() + expected.size()));
  EXPECT_EQ(run2.greedy(prompt, int(expected.size()), 128), expected) << name;
}

}  // namespace strata::testing
