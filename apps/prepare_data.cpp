// prepare_data: text (a file or a folder of files) -> DIR/train.bin, DIR/val.bin (uint16 byte-level tokens,
// vocab 257 with 256 = end of text) and DIR/meta.json.
#include <cstdio>

#include "apps/lib/data.h"
#include "apps/lib/flags.h"
#include "kernels/common.h"

int main(int argc, char** argv) {
  try {
    tt::app::Flags flags(
        "prepare_data",
        "Tokenise text into train/validation token files (byte-level, every 10th document to validation).");
    flags.add("input", "", "a text file or a folder of text files (required)");
    flags.add("out", "", "output folder for train.bin, val.bin, meta.json (required)");
    flags.add("separator", "", "a line that separates documents inside a file (e.g. % for fortune files)");
    if (!flags.parse(argc, argv)) return 0;
    if (flags.str("input").empty() || flags.str("out").empty())
      throw tt::Error("--input and --out are required");
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
