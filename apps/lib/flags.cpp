#include "apps/lib/flags.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kernels/common.h"

namespace tt::app {

void Flags::add(const std::string& name, const std::string& default_value, const std::string& help) {
  order_.push_back(name);
  specs_[name] = {default_value, help, false};
}

void Flags::add_switch(const std::string& name, const std::string& help) {
  order_.push_back(name);
  specs_[name] = {"false", help, true};
}

namespace {
// A switch's value: on (true, 1, on, yes) or off (false, 0, off, no); anything else is an error. Used for
// explicit values as they are given (--name=VALUE, or "name VALUE" in a config file) and when read back.
bool switch_value(const std::string& name, const std::string& text) {
  if (text == "true" || text == "1" || text == "on" || text == "yes") return true;
  if (text == "false" || text == "0" || text == "off" || text == "no") return false;
  throw Error("flag --" + name + " expects on/off, got '" + text + "'");
}
}  // namespace

void Flags::set(const std::string& name, const std::string& value, const std::string& origin) {
  if (!specs_.count(name)) throw Error("unknown flag --" + name + origin + " (see --help)");
  values_[name] = value;
}

void Flags::read_config(const std::string& path) {
  TT_CHECK(!std::filesystem::is_directory(path), "config file '" + path + "' is a folder");
  std::ifstream in(path);
  if (!in) throw Error("cannot read config file '" + path + "'");
  std::string line;
  int number = 0;
  std::map<std::string, int> line_of;  // each name's line: a name given twice is an error
  while (std::getline(in, line)) {
    ++number;
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    // "name = value", "name=value" or "name value"; the value is the rest of the line, trimmed, so it may
    // contain spaces (a prompt, say).
    auto trim = [](const std::string& t) {
      const size_t b = t.find_first_not_of(" \t\r"), e = t.find_last_not_of(" \t\r");
      return b == std::string::npos ? std::string() : t.substr(b, e - b + 1);
    };
    const std::string stripped = trim(line);
    if (stripped.empty()) continue;
    std::string name, value;
    const size_t eq_pos = stripped.find('=');
    const size_t space_pos = stripped.find_first_of(" \t");
    const bool equals_form =
        eq_pos != std::string::npos && (space_pos == std::string::npos || eq_pos < space_pos ||
                                        trim(stripped.substr(space_pos, eq_pos - space_pos)).empty());
    if (equals_form) {
      name = trim(stripped.substr(0, eq_pos));
      value = trim(stripped.substr(eq_pos + 1));
    } else {
      name = stripped.substr(0, space_pos);
      value = space_pos == std::string::npos ? "" : trim(stripped.substr(space_pos));
    }
    if (name.rfind("--", 0) == 0) name = name.substr(2);
    if (!specs_.count(name)) {
      throw Error("unknown flag '" + name + "' in " + path + ":" + std::to_string(number) + " (see --help)");
    }
    if (value.empty() && !specs_[name].is_switch) {
      throw Error("flag '" + name + "' in " + path + ":" + std::to_string(number) + " has no value");
    }
    if (line_of.count(name)) {
      throw Error("flag '" + name + "' is set twice in " + path + " (lines " + std::to_string(line_of[name]) +
                  " and " + std::to_string(number) + ")");
    }
    line_of[name] = number;
    if (specs_[name].is_switch && !value.empty()) switch_value(name, value);
    // Command-line values were parsed first and win.
    if (!values_.count(name)) values_[name] = value.empty() ? "true" : value;
  }
}

bool Flags::parse(int argc, char** argv) {
  std::string config_path;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    if (arg.rfind("--", 0) != 0)
      throw Error("unexpected argument '" + arg + "' (flags start with --; see --help)");
    arg = arg.substr(2);
    std::string value;
    const size_t eq = arg.find('=');
    const bool has_inline = eq != std::string::npos;
    if (has_inline) {
      value = arg.substr(eq + 1);
      arg.resize(eq);
    }
    if (arg == "config") {
      if (!has_inline) {
        if (i + 1 >= argc) throw Error("flag --config needs a file name");
        value = argv[++i];
      }
      TT_CHECK(config_path.empty(), "--config is given twice ('" + config_path + "' and '" + value + "')");
      TT_CHECK(!value.empty(), "flag --config needs a file name");
      config_path = value;
      continue;
    }
    if (!specs_.count(arg)) throw Error("unknown flag --" + arg + " (see --help)");
    if (specs_[arg].is_switch) {
      if (has_inline) switch_value(arg, value);
      set(arg, has_inline ? value : "true", "");
      continue;
    }
    if (!has_inline) {
      if (i + 1 >= argc) throw Error("flag --" + arg + " needs a value");
      value = argv[++i];
    }
    set(arg, value, "");
  }
  if (!config_path.empty()) read_config(config_path);
  return true;
}

bool Flags::given(const std::string& name) const {
  return values_.count(name) > 0;
}

std::string Flags::str(const std::string& name) const {
  auto it = values_.find(name);
  if (it != values_.end()) return it->second;
  auto spec = specs_.find(name);
  if (spec == specs_.end()) throw Error("internal: flag --" + name + " was never declared");
  return spec->second.default_value;
}

int64_t Flags::integer(const std::string& name) const {
  const std::string text = str(name);
  try {
    size_t used = 0;
    const long long value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw Error("flag --" + name + " expects an integer, got '" + text + "'");
}

double Flags::number(const std::string& name) const {
  const std::string text = str(name);
  try {
    size_t used = 0;
    const double value = std::stod(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw Error("flag --" + name + " expects a number, got '" + text + "'");
}

bool Flags::boolean(const std::string& name) const {
  return switch_value(name, str(name));
}

std::vector<std::string> Flags::list(const std::string& name) const {
  const std::string text = str(name);
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(item);
  if (!text.empty() && text.back() == ',') out.emplace_back();
  TT_CHECK(!out.empty(), "flag --" + name + " needs at least one value");
  for (const std::string& i : out)
    TT_CHECK(!i.empty(), "flag --" + name + " has an empty item in '" + text + "'");
  return out;
}

std::vector<int64_t> Flags::int_list(const std::string& name) const {
  std::vector<int64_t> out;
  for (const std::string& item : list(name)) {
    try {
      size_t used = 0;
      out.push_back(std::stoll(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw Error("flag --" + name + " expects comma-separated integers, got '" + str(name) + "'");
    }
  }
  return out;
}

std::vector<double> Flags::number_list(const std::string& name) const {
  std::vector<double> out;
  for (const std::string& item : list(name)) {
    try {
      size_t used = 0;
      out.push_back(std::stod(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw Error("flag --" + name + " expects comma-separated numbers, got '" + str(name) + "'");
    }
  }
  return out;
}

std::string Flags::help() const {
  std::ostringstream out;
  out << "usage: " << program_ << " [flags]\n" << summary_ << "\n\nflags:\n";
  for (const std::string& name : order_) {
    const Spec& spec = specs_.at(name);
    std::string left = "  --" + name + (spec.is_switch ? "" : " VALUE");
    if (left.size() < 28) left.resize(28, ' ');
    out << left << " " << spec.help;
    if (!spec.is_switch && !spec.default_value.empty()) out << " (default: " << spec.default_value << ")";
    out << "\n";
  }
  out << "  --config FILE                read flags from FILE (\"name = value\" lines, # comments);\n"
         "                               flags on the command line take precedence\n"
         "  --help                       print this help and exit\n";
  return out.str();
}

std::vector<std::pair<std::string, std::string>> Flags::values() const {
  std::vector<std::pair<std::string, std::string>> all;
  for (const std::string& name : order_) all.emplace_back("--" + name, str(name));
  return all;
}

std::string Flags::summary_line() const {
  std::ostringstream out;
  for (const std::string& name : order_) out << "--" << name << " " << str(name) << " ";
  return out.str();
}

}  // namespace tt::app
