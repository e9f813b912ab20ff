// sim/train/hf_tokenizer.h: the tokenizer files of a Hugging Face model directory (`tpusim
// export-hf`), for the tokenizer a model was trained with (text_tokenizer.h).
//
// SentencePiece model: tokenizer.model (the model file itself, which the sentencepiece library
// loads), tokenizer.json (the same tokenizer in the `tokenizers` format that
// PreTrainedTokenizerFast and transformers.js read: a Unigram model with its pieces and scores
// behind a Metaspace pre-tokenizer, as transformers' SpmConverter writes it; a BPE model with
// merges recovered from its pieces, as its LlamaConverter does), tokenizer_config.json and
// special_tokens_map.json. No BOS or EOS is added on encoding: tpusim trains on the plain
// encoding. Byte-level tokenizer (token id = byte value): tokenizer.json is a BPE over GPT-2's 256
// byte characters with no merges, behind a ByteLevel pre-tokenizer without regex, so every byte
// is one token whose id is its value; it has no special tokens.
//
// Example:
//   const TextTokenizer tokenizer("runs/text.model");
//   for (const auto& [name, text] : hf_tokenizer_files(tokenizer)) { ...write name... }
//   hf_special_token_ids(tokenizer);  // {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id":
//                                     //  null}
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "sim/train/text_tokenizer.h"

namespace tpusim {

// File name -> content.
std::map<std::string, std::string> hf_tokenizer_files(const TextTokenizer& tokenizer);

// bos_token_id, eos_token_id and pad_token_id of config.json and generation_config.json (null
// where the tokenizer has none).
nlohmann::json hf_special_token_ids(const TextTokenizer& tokenizer);

}  // namespace tpusim
