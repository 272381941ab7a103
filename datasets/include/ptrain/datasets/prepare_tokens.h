// prepareTokens: text in, a Megatron indexed data set out (`ptrain data
// prepare`). Documents are the "text" field of each JSONL line (a .jsonl or
// .json file) or the paragraphs of a plain text file (runs of non-blank
// lines). They are tokenised with SentencePiece: a model given with
// `tokenizer`, or one trained on the inputs themselves (`vocab_size`
// pieces, unigram, full character coverage) and written beside the output
// as PREFIX.model. Each document ends with the tokenizer's end-of-document
// id (Megatron's --append-eod). PREFIX.json records the vocabulary size,
// that id and the tokenizer, and the llm trainer takes its model.vocab_size
// from there.
//
// Thread-safety: one call at a time per output prefix.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ptrain::datasets {

struct PrepareTokensOptions {
  std::vector<std::string> inputs;  // .jsonl / .json (one object a line) or plain text
  std::string output;               // PREFIX: writes PREFIX.bin, .idx, .json (and .model)
  std::string tokenizer;            // a SentencePiece .model; empty: train one
  int64_t vocab_size = 0;           // with no tokenizer: pieces of the trained model
  std::string json_key = "text";
  // Called now and then with (bytes read, bytes in all inputs, documents).
  std::function<void(uint64_t, uint64_t, int64_t)> progress;
};

struct PrepareTokensResult {
  int64_t documents = 0;
  int64_t tokens = 0;
  int64_t vocab_size = 0;
  std::string tokenizer;  // the .model used (given or trained)
};

// Throws ConfigError, one line naming the file and line, for a missing input,
// a JSONL line that is not an object with a string `json_key`, neither a
// tokenizer nor a vocab_size (or both), a tokenizer that does not load, a
// vocabulary SentencePiece cannot train from so little text, or no document.
PrepareTokensResult prepareTokens(const PrepareTokensOptions& options);

}  // namespace ptrain::datasets
