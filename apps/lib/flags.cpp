#include "apps/lib/flags.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "build_info.h"  // TT_VERSION, TT_GIT_COMMIT: written by apps/build_info.cmake at every build

namespace tt::app {

std::string version_line() {
  std::string line = std::string("tinytrain ") + TT_VERSION;
  const std::string commit = TT_GIT_COMMIT;
  if (!commit.empty()) {
    line += " (git ";
    line += commit;
    line += ')';
  }
  return line;
}

void Flags::add(const std::string& name, const std::string& default_value, const std::string& help,
                const std::vector<std::string>& choices) {
  order_.push_back(name);
  specs_[name] = {default_value, help, false, choices, group_, {}};
}

const std::vector<std::string>& Flags::choices(const std::string& name) const {
  const auto found = specs_.find(canonical(name));
  TT_ASSERT(found != specs_.end(), "choices of undeclared flag --" + name);
  return found->second.choices;
}

const std::string& Flags::default_value(const std::string& name) const {
  const auto found = specs_.find(canonical(name));
  TT_ASSERT(found != specs_.end(), "default of undeclared flag --" + name);
  return found->second.default_value;
}

void Flags::add_switch(const std::string& name, const std::string& help, bool on_by_default) {
  order_.push_back(name);
  specs_[name] = {on_by_default ? "true" : "false", help, true, {}, group_, {}};
}

void Flags::alias(const std::string& other_name, const std::string& name) {
  TT_ASSERT(specs_.count(name) > 0, "alias of undeclared flag --" + name);
  TT_ASSERT(!specs_.count(other_name) && !aliases_.count(other_name), "--" + other_name + " is taken");
  aliases_[other_name] = name;
  specs_[name].aliases.push_back(other_name);
}

std::string Flags::canonical(const std::string& name) const {
  auto it = aliases_.find(name);
  return it == aliases_.end() ? name : it->second;
}

namespace {
// A switch's value: on (true, 1, on, yes) or off (false, 0, off, no); anything else is an error. Used for
// explicit values as they are given (--name=VALUE, or "name VALUE" in a config file) and when read back.
bool is_on(const std::string& text) {
  return text == "true" || text == "1" || text == "on" || text == "yes";
}
bool is_off(const std::string& text) {
  return text == "false" || text == "0" || text == "off" || text == "no";
}
bool switch_value(const std::string& name, const std::string& text) {
  if (is_on(text)) return true;
  if (is_off(text)) return false;
  throw Error("flag --" + name + " expects on/off, got '" + text + "'");
}

// `text` as lines of at most `width` columns, each but the first indented by `indent` spaces (the first
// starts at column `first_column`); words longer than a line stay whole. Newlines in `text` are kept.
std::string wrap(const std::string& text, size_t first_column, size_t indent, size_t width) {
  std::string out;
  size_t column = first_column;
  bool line_empty = true;
  std::istringstream lines(text);
  std::string line;
  bool first_line = true;
  while (std::getline(lines, line)) {
    if (!first_line) {
      out += '\n';
      out.append(indent, ' ');
      column = indent;
      line_empty = true;
    }
    first_line = false;
    std::istringstream words(line);
    std::string word;
    while (words >> word) {
      if (!line_empty && column + 1 + word.size() > width) {
        out += '\n';
        out.append(indent, ' ');
        column = indent;
        line_empty = true;
      }
      if (!line_empty) {
        out += ' ';
        ++column;
      }
      out += word;
      column += word.size();
      line_empty = false;
    }
  }
  return out;
}
}  // namespace

void Flags::set(const std::string& given_name, const std::string& value, const std::string& origin) {
  const std::string name = canonical(given_name);
  if (!specs_.count(name)) throw Error("unknown flag --" + given_name + origin + " (see --help)");
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
    if (number == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // a UTF-8 byte order mark
    // A comment: '#' at the start of the line or after a space or tab, outside quotes (so "C#" and
    // "issue #5" stay in a value).
    char quote = 0;
    for (size_t i = 0; i < line.size(); ++i) {
      const char c = line[i];
      if (quote != 0) {
        if (c == quote) quote = 0;
      } else if (c == '"' || c == '\'') {
        quote = c;
      } else if (c == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) {
        line.resize(i);
        break;
      }
    }
    // "name = value", "name=value" or "name value"; the value is the rest of the line, trimmed, so it may
    // contain spaces (a prompt, say); quotes around it (" or ') are taken off.
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
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') && value.back() == value.front())
      value = value.substr(1, value.size() - 2);
    if (name.rfind("--", 0) == 0) name = name.substr(2);
    name = canonical(name);
    if (!specs_.count(name) && name.rfind("no-", 0) == 0 && value.empty()) {
      const std::string positive = canonical(name.substr(3));
      if (specs_.count(positive) && specs_[positive].is_switch) name = positive, value = "false";
    }
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
    if (specs_[name].is_switch) value = value.empty() || switch_value(name, value) ? "true" : "false";
    // Command-line values were parsed first and win.
    if (!values_.count(name)) values_[name] = value;
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
    if (arg == "--version") {
      std::printf("%s\n", version_line().c_str());
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
    const std::string given_name = arg;
    arg = canonical(arg);
    if (!specs_.count(arg) && !has_inline && arg.rfind("no-", 0) == 0) {
      // --no-NAME turns the switch NAME off.
      const std::string positive = canonical(arg.substr(3));
      if (specs_.count(positive) && specs_[positive].is_switch) {
        set(positive, "false", "");
        continue;
      }
      if (specs_.count(positive)) {
        const std::vector<std::string>& choices = specs_[positive].choices;
        const bool has_off = std::find(choices.begin(), choices.end(), "off") != choices.end();
        throw Error("unknown flag --" + given_name + ": --" + arg.substr(3) + " takes a value" +
                    (has_off ? " (--" + arg.substr(3) + " off)" : "") + " (see --help)");
      }
    }
    if (!specs_.count(arg)) throw Error("unknown flag --" + given_name + " (see --help)");
    if (specs_[arg].is_switch) {
      // `--name on|off`: a following word that is not a flag is the switch's value, checked (no app takes
      // positional arguments).
      if (!has_inline && i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        value = argv[++i];
      } else if (!has_inline) {
        value = "true";
      }
      set(arg, switch_value(given_name, value) ? "true" : "false", "");
      continue;
    }
    if (!has_inline) {
      if (i + 1 >= argc) throw Error("flag --" + given_name + " needs a value");
      // A value starting with "--" is given inline: the next word is a flag, and this one was given none.
      if (std::string(argv[i + 1]).rfind("--", 0) == 0)
        throw Error("flag --" + given_name + " needs a value (next on the command line is " + argv[i + 1] +
                    "; a value starting with -- goes as --" + given_name + "=VALUE)");
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
  if (spec == specs_.end())
    throw_internal_error("flag --" + name + " was never declared", __FILE__, __LINE__);
  return spec->second.default_value;
}

int64_t Flags::integer(const std::string& name) const {
  const std::string text = str(name);
  try {
    size_t used = 0;
    const long long value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::out_of_range&) {
    throw Error("flag --" + name + " is out of range: '" + text + "' is not within -2^63..2^63-1");
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
  for (size_t i = 0; i < out.size(); ++i) {
    TT_CHECK(!out[i].empty(), "flag --" + name + " has an empty item in '" + text + "'");
    // A value given twice would only repeat a row of the table.
    for (size_t j = 0; j < i; ++j)
      TT_CHECK(out[j] != out[i], "flag --" + name + " lists '" + out[i] + "' twice in '" + text + "'");
  }
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
    TT_CHECK(std::find(out.begin(), out.end() - 1, out.back()) == out.end() - 1,
             "flag --" + name + " lists " + std::to_string(out.back()) + " twice in '" + str(name) + "'");
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
    TT_CHECK(std::find(out.begin(), out.end() - 1, out.back()) == out.end() - 1,
             "flag --" + name + " lists " + item + " twice in '" + str(name) + "'");
  }
  return out;
}

std::string Flags::help() const {
  constexpr size_t kWidth = 100, kHelpColumn = 30;
  std::ostringstream out;
  out << "usage: " << program_ << " [flags]\n" << wrap(summary_, 0, 0, kWidth) << "\n";
  auto print = [&](std::string left, const std::string& text) {
    if (left.size() + 1 > kHelpColumn) {
      out << left << "\n";
      left.clear();
    }
    left.resize(kHelpColumn, ' ');
    out << left << wrap(text, kHelpColumn, kHelpColumn, kWidth) << "\n";
  };
  std::vector<std::string> groups;  // in order of first appearance; "" (no heading) first
  groups.emplace_back();
  for (const std::string& name : order_) {
    const std::string& g = specs_.at(name).group;
    if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
  }
  for (const std::string& g : groups) {
    bool heading_printed = false;
    for (const std::string& name : order_) {
      const Spec& spec = specs_.at(name);
      if (spec.group != g) continue;
      if (!heading_printed) out << "\n" << (g.empty() ? "flags" : g) << ":\n";
      heading_printed = true;
      const bool on_by_default = spec.is_switch && spec.default_value == "true";
      std::string left = "  --";
      if (on_by_default) left += "[no-]";
      left += name;
      if (!spec.is_switch) {
        std::string choices;
        for (const std::string& c : spec.choices) {
          if (!choices.empty()) choices += '|';
          choices += c;
        }
        left += ' ';
        left += choices.empty() ? std::string("VALUE") : choices;
      }
      std::string text = spec.help;
      if (!spec.is_switch && !spec.default_value.empty()) text += " (default: " + spec.default_value + ")";
      if (on_by_default) text += " (default: on)";
      for (const std::string& a : spec.aliases) {
        text += " (also --";
        text += a;
        text += ')';
      }
      print(left, text);
    }
  }
  out << "\nevery app:\n";
  print("  --config FILE",
        "read flags from FILE (\"name = value\" or \"name value\" lines, # comments); flags on the command "
        "line take precedence");
  print("  --help", "print this help and exit");
  print("  --version", "print \"tinytrain <version>\" and exit");
  out << "Switches take --name or --no-name (or --name=on|off). On the command line a flag given twice "
         "keeps\n"
         "its last value.\n";
  return out.str();
}

std::vector<std::pair<std::string, std::string>> Flags::values() const {
  std::vector<std::pair<std::string, std::string>> all;
  for (const std::string& name : order_) all.emplace_back("--" + name, str(name));
  return all;
}

}  // namespace tt::app
