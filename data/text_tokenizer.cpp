// The end-of-document token of a tokenizer.json (text_tokenizer.hpp).
#include "data/text_tokenizer.hpp"

#include "core/error.hpp"

namespace mtnlg::data {

int32_t hf_eod_id(const HfTokenizer& t, const std::string& eod_token) {
  std::string eod = eod_token, from = "--eod-token";
  if (eod.empty()) {
    if (auto e = hf_config_eos_token(t.path())) {
      eod = *e;
      from = "eos_token of the tokenizer_config.json beside it";
    }
  }
  if (eod.empty())
    throw_input(
        "{}: no end-of-document token: pass --eod-token TEXT or put a tokenizer_config.json with eos_token "
        "beside the tokenizer.json",
        t.path());
  auto id = t.token_to_id(eod);
  if (!id) throw_input("{}: end-of-document token '{}' ({}) is not a token of the file", t.path(), eod, from);
  return *id;
}

}  // namespace mtnlg::data
