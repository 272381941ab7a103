#include "ptrain/datasets/prepare_tokens.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ptrain/core/error.h"
#include "ptrain/core/text.h"
#include "ptrain/datasets/indexed_writer.h"

// SentencePiece's own log threshold. Train() logs its "Running command"
// line before it reads the --minloglevel it is given; 0.1.97 exports this
// setter from the library without declaring it in an installed header.
namespace sentencepiece::logging {
void SetMinLogLevel(int v);
}  // namespace sentencepiece::logging

namespace fs = std::filesystem;
using nlohmann::json;

namespace ptrain::datasets {

namespace {

bool isJsonLines(const std::string& path) {
  const std::string ext = fs::path(path).extension().string();
  return ext == ".jsonl" || ext == ".json";
}

// Calls `take(document)` for every document of every input, in order.
void forEachDocument(const PrepareTokensOptions& o, uint64_t totalBytes, const std::function<void(std::string)>& take) {
  uint64_t done = 0;
  int64_t documents = 0;
  for (const auto& path : o.inputs) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ConfigError(path + ": cannot be read; give text or JSONL files that exist");
    std::string line, paragraph;
    int64_t number = 0;
    const bool jsonl = isJsonLines(path);
    auto emit = [&](std::string doc) {
      if (doc.empty()) return;
      take(std::move(doc));
      if (o.progress && ++documents % 256 == 0) o.progress(done, totalBytes, documents);
    };
    uint64_t offset = 0;  // of the line in this file
    for (; std::getline(in, line); offset += line.size() + 1) {
      ++number;
      done += line.size() + 1;
      if (jsonl) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const json j = text::parseJsonLine(line, path, number, offset,
                                           "one JSON object a line, e.g. {\"" + o.json_key + "\": \"...\"}");
        if (!j.is_object() || !j.contains(o.json_key) || !j.at(o.json_key).is_string()) {
          throw ConfigError(path + ":" + std::to_string(number) + ": no string field \"" + o.json_key +
                            "\"; give it, or name the field with --json-key");
        }
        emit(j.at(o.json_key).get<std::string>());
      } else if (line.find_first_not_of(" \t\r") == std::string::npos) {
        emit(std::move(paragraph));
        paragraph.clear();
      } else {
        if (!paragraph.empty()) paragraph += '\n';
        paragraph += line;
      }
    }
    emit(std::move(paragraph));
  }
  if (o.progress) o.progress(totalBytes, totalBytes, documents);
}

}  // namespace

PrepareTokensResult prepareTokens(const PrepareTokensOptions& o) {
  if (o.inputs.empty()) throw ConfigError("ptrain data prepare: give at least one input file");
  if (o.tokenizer.empty() == (o.vocab_size <= 0)) {
    throw ConfigError("ptrain data prepare: give either --tokenizer MODEL (a SentencePiece .model) or --vocab-size N "
                      "(train one on the inputs)");
  }
  uint64_t totalBytes = 0;
  for (const auto& path : o.inputs) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) throw ConfigError(path + ": not found; give text or JSONL files that exist");
    totalBytes += fs::file_size(path, ec);
  }
  const std::string parent = fs::path(o.output).parent_path().string();
  if (!parent.empty()) fs::create_directories(parent);

  PrepareTokensResult result;
  result.tokenizer = o.tokenizer;
  if (o.tokenizer.empty()) {
    // SentencePiece trains from plain lines: the documents, one a line.
    const std::string corpus = o.output + ".corpus.tmp";
    {
      std::ofstream out(corpus, std::ios::binary);
      forEachDocument(PrepareTokensOptions{o.inputs, o.output, "", 0, o.json_key, nullptr}, totalBytes,
                      [&](std::string doc) {
                        for (char& c : doc)
                          if (c == '\n') c = ' ';
                        out << doc << '\n';
                      });
      if (!out) throw ConfigError(corpus + ": cannot write; is the disk full?");
    }
    const std::string args = "--input=" + corpus + " --model_prefix=" + o.output + " --vocab_size=" +
                             std::to_string(o.vocab_size) +
                             " --model_type=unigram --character_coverage=1.0 --input_sentence_size=2000000 "
                             "--shuffle_input_sentence=true --minloglevel=2 --num_threads=2";
    sentencepiece::logging::SetMinLogLevel(2);  // warnings and errors only, as --minloglevel=2 says
    const auto status = sentencepiece::SentencePieceTrainer::Train(args);
    std::remove(corpus.c_str());
    if (!status.ok()) {
      throw ConfigError("ptrain data prepare: SentencePiece could not train a " + std::to_string(o.vocab_size) +
                        "-piece vocabulary (" + status.ToString() + "); give a smaller --vocab-size or more text");
    }
    result.tokenizer = o.output + ".model";
  }
  sentencepiece::SentencePieceProcessor sp;
  if (const auto status = sp.Load(result.tokenizer); !status.ok()) {
    throw ConfigError(result.tokenizer + ": not a SentencePiece model (" + status.ToString() + ")");
  }
  result.vocab_size = sp.GetPieceSize();
  const int eod = sp.eos_id() >= 0 ? sp.eos_id() : sp.unk_id();
  IndexedWriter writer(o.output, indexedDTypeForVocab(result.vocab_size));
  std::vector<int> ids;
  forEachDocument(o, totalBytes, [&](std::string doc) {
    ids.clear();
    sp.Encode(doc, &ids);
    std::vector<int64_t> tokens(ids.begin(), ids.end());
    tokens.push_back(eod);
    writer.addDocument(tokens);
  });
  if (writer.documents() == 0) throw ConfigError(o.inputs.front() + ": holds no document (no text)");
  writer.finish();
  result.documents = writer.documents();
  result.tokens = writer.tokens();
  json meta = {{"format", "ptrain.tokens"},
               {"vocab_size", result.vocab_size},
               {"eod", eod},
               {"tokenizer", fs::absolute(result.tokenizer).string()},
               {"documents", result.documents},
               {"tokens", result.tokens}};
  std::ofstream(o.output + ".json") << meta.dump(2) << '\n';
  return result;
}

}  // namespace ptrain::datasets
