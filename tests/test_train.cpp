// The train loop end to end on the CPU: checkpoint round trip and bit-identical resume.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "apps/lib/checkpoint.h"
#include "apps/lib/data.h"
#include "apps/lib/trainer.h"
#include "core/io/h5.h"
#include "core/rng.h"

using namespace tt;
namespace fs = std::filesystem;

namespace {

// A small corpus of made-up words, prepared like real text.
std::string make_data_dir() {
  const std::string dir = (fs::temp_directory_path() / "tt_test_train_data").string();
  if (fs::exists(dir + "/train.bin")) return dir;
  fs::create_directories(dir);
  const std::string text_path = dir + "/corpus.txt";
  {
    std::ofstream text(text_path);
    CounterRng rng{11, 0};
    const char* words[] = {"the", "cat", "sat", "on",  "a",    "mat",
                           "and", "dog", "ran", "far", "away", "today"};
    for (int doc = 0; doc < 400; ++doc) {
      for (int w = 0; w < 40; ++w) text << words[rng.next_below(12)] << (w % 10 == 9 ? ".\n" : " ");
      text << "%\n";
    }
  }
  app::prepare_text(text_path, dir, "%");
  return dir;
}

int train(const std::vector<std::string>& args) {
  std::vector<std::string> all = {"train"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  app::Flags flags("train", "");
  app::declare_train_flags(flags);
  REQUIRE(flags.parse(static_cast<int>(argv.size()), argv.data()));
  return app::run_training(flags, Device::cpu(), flags.str("data"), nullptr);
}

std::vector<double> losses(const std::string& metrics) {
  std::ifstream in(metrics);
  std::vector<double> out;
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find("\"loss\": ");
    out.push_back(std::stod(line.substr(at + 8)));
  }
  return out;
}

}  // namespace

TEST_CASE("checkpoint round trip restores parameters, optimizer state and train state") {
  nn::ModelConfig config = nn::preset("tiny");
  config.vocab_size = 40;
  nn::TransformerLM a(config), b(config);
  nn::FlatParameters pa(a, Device::cpu(), 1), pb(b, Device::cpu(), 2);
  optim::AdamW oa({pa.flat_params()}), ob({pb.flat_params()});
  pa.flat_grads().fill_(0.01);
  oa.step();
  oa.step();
  app::TrainState state;
  state.step = 2;
  state.rng_seed = 77;
  state.rng_counter = 123456789012345ULL;
  state.tokens_seen = 99;
  const std::string path = (fs::temp_directory_path() / "tt_roundtrip.h5").string();
  app::save_checkpoint(path, config, pa, app::optimizer_state(oa).get(), state);
  app::TrainState loaded;
  app::load_checkpoint(path, pb, app::optimizer_state(ob).get(), &loaded);
  CHECK(pb.flat_params().to_floats() == pa.flat_params().to_floats());
  CHECK(ob.exp_avg()[0].to_floats() == oa.exp_avg()[0].to_floats());
  CHECK(ob.exp_avg_sq()[0].to_floats() == oa.exp_avg_sq()[0].to_floats());
  CHECK(ob.step_count() == 2);
  CHECK(loaded.step == 2);
  CHECK(loaded.rng_seed == 77);
  CHECK(loaded.rng_counter == 123456789012345ULL);
  CHECK(loaded.tokens_seen == 99);
  const nn::ModelConfig read = app::read_checkpoint_config(path);
  CHECK(read.d_model == config.d_model);
  CHECK(read.vocab_size == 40);
  // PyTorch names and shapes in /model.
  const io::H5File file = io::H5File::open_read(path);
  CHECK(file.dataset_shape("/model/layers.1.ffn.w2.weight") == Shape{config.d_model, config.d_ff});
  CHECK(file.dataset_shape("/model/lm_head.weight") == Shape{40, config.d_model});

  // Another shape is refused, naming the first mismatched dataset, and leaves the model untouched.
  nn::ModelConfig other = config;
  other.d_model = 32;
  nn::TransformerLM c(other);
  nn::FlatParameters pc(c, Device::cpu(), 3);
  const std::vector<float> before = pc.flat_params().to_floats();
  CHECK_THROWS_WITH_AS(app::load_checkpoint(path, pc, nullptr, nullptr),
                       doctest::Contains("dataset /model/token_embeddings.weight has shape [40, 64]"), Error);
  CHECK(pc.flat_params().to_floats() == before);
}

TEST_CASE("resume is bit-identical to an uninterrupted run (random and sequential sampling)") {
  const std::string data = make_data_dir();
  for (const char* sampling : {"random", "sequential"}) {
    CAPTURE(sampling);
    const std::string base = (fs::temp_directory_path() / (std::string("tt_resume_") + sampling)).string();
    fs::remove_all(base);
    const std::vector<std::string> common = {
        "--data",         data, "--ctx",           "32", "--batch",  "4", "--eval-every", "3",
        "--eval-batches", "2",  "--sample-tokens", "0",  "--warmup", "2", "--sampling",   sampling,
        "--grad-accum",   "2",  "--ckpt-every",    "3"};
    auto with = [&](std::vector<std::string> extra) {
      std::vector<std::string> args = common;
      args.insert(args.end(), extra.begin(), extra.end());
      return args;
    };
    REQUIRE(train(with({"--out", base + "/full", "--steps", "6"})) == 0);
    REQUIRE(train(with({"--out", base + "/split", "--steps", "3"})) == 0);
    REQUIRE(train(with({"--out", base + "/split", "--steps", "6", "--resume",
                        base + "/split/checkpoints/step_3.h5"})) == 0);
    const std::vector<double> full = losses(base + "/full/metrics.jsonl");
    const std::vector<double> split = losses(base + "/split/metrics.jsonl");
    REQUIRE(full.size() == 6);
    CHECK(split == full);  // exact equality, every step
    const io::H5File a = io::H5File::open_read(base + "/full/checkpoints/step_6.h5");
    const io::H5File b = io::H5File::open_read(base + "/split/checkpoints/step_6.h5");
    for (const std::string& name : a.children("/model")) {
      CAPTURE(name);
      CHECK(a.read_floats("/model/" + name) == b.read_floats("/model/" + name));
      CHECK(a.read_floats("/optimizer/" + name + "/exp_avg_sq") ==
            b.read_floats("/optimizer/" + name + "/exp_avg_sq"));
    }
  }
}
