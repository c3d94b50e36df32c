// prepare_data: text (a file or a folder of files) -> DIR/train.bin, DIR/val.bin (uint16 byte-level tokens,
// vocab 257 with 256 = end of text) and DIR/meta.json.
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "apps/lib/data.h"
#include "apps/lib/flags.h"
#include "kernels/common.h"

int main(int argc, char** argv) {
  std::signal(SIGXFSZ, SIG_IGN);  // a full disk (or file-size limit) is reported as a write error
  try {
    tt::app::Flags flags(
        "prepare_data",
        "Tokenise text into train/validation token files (byte-level, every 10th document to validation).");
    flags.add("input", "", "a text file or a folder of text files (required)");
    flags.add("out", "", "output folder for train.bin, val.bin, meta.json (required)");
    flags.add("separator", "", "a line that separates documents inside a file (e.g. % for fortune files)");
    flags.add_switch("overwrite", "replace a dataset already in --out (otherwise refused)");
    if (!flags.parse(argc, argv)) return 0;
    if (flags.str("input").empty() || flags.str("out").empty())
      throw tt::Error("--input and --out are required");
    const std::string out = flags.str("out");
    for (const char* name : {"/train.bin", "/val.bin", "/meta.json"}) {
      if (std::filesystem::exists(out + name) && !flags.boolean("overwrite"))
        throw tt::Error(out + " already holds a dataset (" + (out + name) +
                        "); pass another --out, or --overwrite to replace it");
    }
    const tt::app::PrepareStats s =
        tt::app::prepare_text(flags.str("input"), flags.str("out"), flags.str("separator"));
    std::printf("%lld documents -> %s/train.bin (%lld tokens), %s/val.bin (%lld tokens), vocab %lld\n",
                static_cast<long long>(s.documents), flags.str("out").c_str(),
                static_cast<long long>(s.train_tokens), flags.str("out").c_str(),
                static_cast<long long>(s.val_tokens), static_cast<long long>(tt::app::kByteVocab));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
