// Prompt datasets: JSONL lines in the SpecForge/ShareGPT layout {"id", "conversations": [...]},
// the OpenAI layout {"messages": [...]}, or plain {"prompt": "..."}; conversations use
// {"role","content"} or ShareGPT's {"from","value"} (human/gpt/system).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace strata {

struct PromptRecord {
  std::string id;  // the line's "id", else "<dataset>-<line number>"
  // [{"role", "content"}...] normalized (an assistant turn's "tool_calls" and a tool turn's
  // "tool_call_id" kept, OpenAI's layout); null for a raw prompt.
  nlohmann::json messages;
  // The line's "tools" (OpenAI's function tools), key order kept: the chat template prints them
  // with tojson. Null: none.
  nlohmann::ordered_json tools;
  std::string prompt;       // raw text when there are no messages
  nlohmann::json original;  // the input line as read (output appends to it)
  int64_t line = 0;         // 1-based line number in the file
};

// The record's conversation (`messages`, its last assistant turns dropped or not) and context
// as the chat template reads them: calls' arguments parsed into objects (template_arguments),
// `tools` added to the template variables `kwargs` when the record has any.
nlohmann::ordered_json template_messages(const nlohmann::json& messages);
nlohmann::ordered_json template_context(const PromptRecord& record, const nlohmann::json& kwargs);
// The calls the conversation's assistant turns made (Kimi K2's call ids count them).
int count_tool_calls(const nlohmann::json& messages);

// Parses one JSONL line. Errors name the line and the problem.
StatusOr<PromptRecord> parse_prompt_line(const std::string& line_text, int64_t line_number,
                                         const std::string& dataset);

// Reads every record of a file; the first bad line is an error naming file and line.
// Blank lines are skipped. Duplicate ids are an error (outputs are keyed by id).
StatusOr<std::vector<PromptRecord>> read_prompt_file(const std::string& path,
                                                     const std::string& dataset);

// One input dataset: `--input NAME=FILE` (or `--input FILE`, named by the file's stem).
struct Dataset {
  std::string name{};
  std::string path{};                   // empty for prompts given on the command line
  std::vector<PromptRecord> records{};  // in file order
};

// Splits "NAME=FILE" (or "FILE": the name is the file's stem). Names must be non-empty and
// use only [A-Za-z0-9._-], since --output-dir makes a file from them.
StatusOr<Dataset> parse_dataset_spec(const std::string& spec);

// Reads the file of a parsed spec into `records`.
Status load_dataset(Dataset& dataset);

// The sampling seed of one prompt: a hash of the base seed and the prompt's id, not of its
// position, so a resumed run (or a reordered file) samples every prompt exactly as before.
uint64_t prompt_seed(uint64_t base_seed, const std::string& id);

// Trailing assistant turns are dropped so the model generates the assistant's answer (SpecForge
// regenerates the last assistant turn); the result ends with a user/system/tool turn.
nlohmann::json prompt_messages(const nlohmann::json& messages);

}  // namespace strata
