// A tokenizer.json small enough to write in a test: a byte-level BPE over GPT-2's
// alphabet, ids 0..255 the bytes, three merges (256..258: "Ġt", "he", "Ġthe"), and
// <|eos|> (259) as an added special token: 260 ids.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace mtnlg::test {

inline nlohmann::json tiny_byte_level() {
  nlohmann::json vocab = nlohmann::json::object();
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int cp = printable ? b : 256 + n++;
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    vocab[s] = b;
  }
  vocab["\xC4\xA0t"] = 256;  // "Ġt"
  vocab["he"] = 257;
  vocab["\xC4\xA0the"] = 258;
  nlohmann::json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens",
           {{{"id", 259},
             {"content", "<|eos|>"},
             {"single_word", false},
             {"lstrip", false},
             {"rstrip", false},
             {"normalized", false},
             {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", bl},
          {"post_processor", bl},
          {"decoder", bl},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"byte_fallback", false},
            {"vocab", vocab},
            {"merges", {"\xC4\xA0 t", "h e", "\xC4\xA0t he"}}}}};
}

}  // namespace mtnlg::test
